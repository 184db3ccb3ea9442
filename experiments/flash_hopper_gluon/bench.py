"""The Gluon forward (kernel.py here) on the H100: float64 checks, then its configurations timed beside
the course's Triton forward ("best", autotuned) and cuDNN, side by side in one process.

    PYTHONPATH=. python experiments/flash_hopper_gluon/bench.py [--out DIR] [--quick] [--configs ...]
"""
from __future__ import annotations

import argparse
import csv
import itertools
import math
import os
import sys

import torch

from attnkit.bench.recorder import provenance, time_ms
from attnkit.bench.flash import attention_flops, tflops, _sdpa
from attnkit.kernels import flash

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel as flash_hopper  # noqa: E402


def reference(q, k, v, causal, sm_scale):
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * sm_scale
    if causal:
        n_q, n_k = q.shape[2], k.shape[2]
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def checks(configs):
    failures = 0
    cases = [(1, 2, 2, 1000, 1000, 128, False), (1, 2, 2, 1000, 1000, 128, True), (2, 4, 2, 777, 777, 64, True),
             (1, 4, 1, 300, 1000, 128, True), (1, 2, 2, 129, 4097, 64, False), (1, 2, 2, 64, 64, 128, True),
             (1, 3, 3, 1, 333, 128, True), (2, 8, 2, 512, 512, 128, False)]
    for (b, hq, hk, nq, nk, d, causal), dtype, (bm, bn, stages, warps, overlap) in itertools.product(
            cases, (torch.float16, torch.bfloat16), configs):
        g = torch.Generator(device="cuda").manual_seed(nq * 7 + nk)
        q = torch.randn(b, hq, nq, d, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(b, hk, nk, d, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(b, hk, nk, d, device="cuda", dtype=dtype, generator=g)
        scale = 1 / math.sqrt(d)
        o, lse = flash_hopper.launch(q, k, v, causal, scale, bm, bn, stages, warps, overlap)
        ro, rlse = reference(q, k, v, causal, scale)
        err = ((o.double() - ro).norm() / ro.norm()).item()
        lse_err = (lse.double() - rlse).abs().max().item()
        bound = 1e-2 if dtype == torch.bfloat16 else 2e-3
        ok = err < bound and lse_err < 1e-3
        failures += not ok
        print(f"check {b},{hq},{hk},{nq},{nk},{d},causal={causal} {dtype} {bm}x{bn} s{stages} w{warps} overlap={overlap}: "
              f"rel {err:.2e} lse {lse_err:.1e} {'ok' if ok else 'FAIL'}", flush=True)
    return failures


def bench(configs, quick, out):
    cudnn = _sdpa("sdpa_cudnn")
    rows = []
    cases = [(128, n, c) for n in ((1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384))
             for c in (False, True)] + [(64, n, c) for n in (1024, 4096, 16384) for c in (False, True)]
    for d, n, causal in cases:
        heads = 2048 // d
        batch = 16384 // n
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        scale = 1 / math.sqrt(d)
        flops = attention_flops(batch, heads, n, n, d, causal)
        times = {"cudnn": time_ms(lambda: cudnn(q, k, v, causal)),
                 "triton_best": time_ms(lambda: flash.flash_attention_forward(q, k, v, causal=causal))}
        for bm, bn, stages, warps, overlap in configs:
            try:
                times[f"g{bm}x{bn}s{stages}w{warps}" + ("" if overlap else "_no_overlap")] = time_ms(
                    lambda: flash_hopper.launch(q, k, v, causal, scale, bm, bn, stages, warps, overlap))
            except Exception as e:  # a configuration that does not fit: say so
                print(f"  gluon {bm}x{bn} s{stages} w{warps}: {type(e).__name__}: {str(e)[:200]}")
        line = " ".join(f"{name} {tflops(flops, ms):.0f} ({times['cudnn'] / ms:.2f})" for name, ms in times.items())
        print(f"D={d} N={n} causal={causal}: {line}", flush=True)
        for name, ms in times.items():
            rows.append(dict(impl=name, B=batch, H=heads, N=n, D=d, causal=causal, ms=ms,
                             tflops=tflops(flops, ms), vs_cudnn=times["cudnn"] / ms, **provenance()))
    with open(os.path.join(out, "bench_flash_hopper.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--configs", default="128x128x2x8,64x64x3x4",
                        help="BLOCK_MxBLOCK_NxSTAGESxWARPS[x0 without the overlap],...")
    parser.add_argument("--check-configs", type=int, default=1, help="how many of --configs to check")
    args = parser.parse_args()
    configs = [tuple(int(x) for x in (c + "x1").split("x")[:5]) for c in args.configs.split(",")]
    failures = checks(configs[:args.check_configs])
    bench(configs, args.quick, args.out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
