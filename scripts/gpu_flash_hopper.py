"""The warp-specialised Gluon forward (attnkit.kernels.flash.hopper) on the H100: float64 checks, then
its configurations timed beside the course's Triton forward (BEST_TRITON, autotuned) and cuDNN, side by side
in one process; writes bench_flash_hopper.csv. "hopper" is the public function (its default
configuration); "ws:HxNxS[xG][:hT|:p]" a configuration of it, one program a tile (G compute warp groups; hT:
tiles in groups of T (batch, head) pairs, hopper.tile_of; HEAD_GROUP's if not given) or with :p
persistent programs (hopper._attn_fwd_persistent); from
experiments/flash_hopper_gluon, "MxNxSxW[x0]" the one-partition Gluon kernel (x0: without the overlap)
and "sched:HxNxS[:flags]" the scheduling
variants of the warp-specialised one (flags p: ping-pong, g: persistent grid, s: P in shared memory,
hG: causal tiles longest first within groups of G (batch, head) pairs, l / L: one persistent program per
SM walking a schedule built on the host, tiles dealt to the least-loaded program head by head / longest
first: scheduling.static_schedule; u: the key loop in one, as the package kernel's, not split in two).

    python scripts/gpu_flash_hopper.py [--out DIR] [--quick] [--configs hopper,ws:64x128x3,...]
                                       [--head-dims 128,64] [--lengths 1024,2048] [--name flash_hopper]
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import re
import sys
from pathlib import Path

import torch

from attnkit.bench.flash import attention_flops, implementation, tflops
from attnkit.bench.recorder import time_ms, write_results
from attnkit.kernels import flash
from attnkit.kernels.flash import dispatch, hopper
from attnkit.reference.attention import attention_ref, lse_ref
from attnkit.tolerances import rel_error

EXPERIMENT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                          "flash_hopper_gluon")


def kernel_config(text: str):
    """(name, run) of a configuration: "MxNxSxW" (x0 at the end: without the overlap) for the one-partition
    kernel, "ws:HxNxS[xG]" for the warp-specialised one (H rows per compute group, G compute groups, 2 if
    not given). run(q, k, v, causal, scale)."""
    if text == "hopper":
        return "hopper", lambda q, k, v, causal, scale: flash.flash_attention_hopper(
            q, k, v, causal=causal, sm_scale=scale)
    if text.startswith("ws:"):
        sizes, _, order = text[3:].partition(":")
        half_m, block_n, stages, groups = (int(x) for x in (sizes + "x2").split("x")[:4])
        persistent = order == "p"                           # p: persistent programs (_attn_fwd_persistent)
        head_group = int(order[1:]) if order.startswith("h") else None   # h32: in groups of 32 heads
        name = f"ws{half_m}x{block_n}s{stages}" + ("" if groups == 2 else f"g{groups}") + (f"_{order}" if order else "")
        return (name,
                lambda q, k, v, causal, scale: hopper.launch(
                    q, k, v, causal, scale, half_m, block_n, stages, groups, persistent,
                    dispatch.HEAD_GROUP[causal] if head_group is None else head_group))
    sys.path.insert(0, EXPERIMENT)
    if text.startswith("sched:"):
        import scheduling

        sizes, _, flags = text[6:].partition(":")
        half_m, block_n, stages = (int(x) for x in sizes.split("x"))
        group = re.search(r"h(\d+)", flags)                 # h32: longest first in groups of 32 heads
        options = dict(pingpong="p" in flags, persistent="g" in flags, p_smem="s" in flags,
                       head_group=int(group.group(1)) if group else 0,
                       order="lpt" if "L" in flags else "list" if "l" in flags else "", one_loop="u" in flags)
        return (f"sched{half_m}x{block_n}s{stages}" + (f"_{flags}" if flags else ""),
                lambda q, k, v, causal, scale: scheduling.launch(q, k, v, causal, scale, half_m, block_n, stages,
                                                                 **options))
    import kernel as one_partition

    bm, bn, stages, warps, overlap = (int(x) for x in (text + "x1").split("x")[:5])
    return (f"g{bm}x{bn}s{stages}w{warps}" + ("" if overlap else "_no_overlap"),
            lambda q, k, v, causal, scale: one_partition.launch(q, k, v, causal, scale, bm, bn, stages, warps, overlap))


def checks(configs):
    failures = 0
    cases = [(1, 2, 2, 1000, 1000, 128, False), (1, 2, 2, 1000, 1000, 128, True), (2, 4, 2, 777, 777, 64, True),
             (1, 4, 1, 300, 1000, 128, True), (1, 2, 2, 129, 4097, 64, False), (1, 2, 2, 64, 64, 128, True),
             (1, 3, 3, 1, 333, 128, True), (2, 8, 2, 512, 512, 128, False)]
    for (b, hq, hk, nq, nk, d, causal), dtype, (name, run) in itertools.product(
            cases, (torch.float16, torch.bfloat16), configs):
        g = torch.Generator(device="cuda").manual_seed(nq * 7 + nk)
        q = torch.randn(b, hq, nq, d, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(b, hk, nk, d, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(b, hk, nk, d, device="cuda", dtype=dtype, generator=g)
        scale = 1 / math.sqrt(d)
        o, lse = run(q, k, v, causal, scale)
        err = rel_error(o, attention_ref(q, k, v, causal=causal, sm_scale=scale))
        lse_err = (lse.cpu().double() - lse_ref(q, k, causal=causal, sm_scale=scale)).abs().max().item()
        bound = 1e-2 if dtype == torch.bfloat16 else 2e-3
        ok = err < bound and lse_err < 1e-3
        failures += not ok
        print(f"check {b},{hq},{hk},{nq},{nk},{d},causal={causal} {dtype} {name}: "
              f"rel {err:.2e} lse {lse_err:.1e} {'ok' if ok else 'FAIL'}", flush=True)
    return failures


def bench(configs, quick, out, head_dims=(128, 64), only_lengths=None, name="flash_hopper"):
    cudnn = implementation("sdpa_cudnn")
    rows = []
    lengths = {128: (1024, 4096, 16384) if quick else (1024, 2048, 4096, 8192, 16384), 64: (1024, 4096, 8192, 16384)}
    if only_lengths:
        lengths = {d: only_lengths for d in lengths}
    cases = [(d, n, c) for d in head_dims for n in lengths[d] for c in (False, True)]
    for d, n, causal in cases:
        heads = 2048 // d
        batch = 16384 // n
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(3))
        scale = 1 / math.sqrt(d)
        flops = attention_flops(batch, heads, n, n, d, causal)
        times = {"cudnn": time_ms(lambda: cudnn(q, k, v, causal)),
                 "triton_best": time_ms(lambda: flash.flash_attention_forward(q, k, v, causal=causal,
                                                                              variant=flash.BEST_TRITON))}
        for impl, run in configs:
            try:
                times[impl] = time_ms(lambda: run(q, k, v, causal, scale))
            except Exception as e:  # a configuration that does not fit: say so
                print(f"  {impl}: {type(e).__name__}: {str(e)[:200]}")
        line = " ".join(f"{impl} {tflops(flops, ms):.0f} ({times['cudnn'] / ms:.2f})" for impl, ms in times.items())
        print(f"D={d} N={n} causal={causal}: {line}", flush=True)
        for impl, ms in times.items():
            rows.append(dict(impl=impl, B=batch, H=heads, N=n, D=d, causal=causal, ms=ms,
                             tflops=tflops(flops, ms), vs_cudnn=times["cudnn"] / ms))
    write_results(name, rows, Path(out))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--configs", default="hopper",
                        help="hopper, ws:HALF_MxBLOCK_NxSTAGES[xGROUPS][:hT|:p], "
                             "BLOCK_MxBLOCK_NxSTAGESxWARPS[x0 without the overlap] "
                             "or sched:HALF_MxBLOCK_NxSTAGES[:pgslLu][hG],...")
    parser.add_argument("--check-configs", type=int, default=1, help="how many of --configs to check")
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--head-dims", default="128,64", help="head dims to time, of 128 and 64")
    parser.add_argument("--lengths", default="", help="sequence lengths to time (default: the recorded ones)")
    parser.add_argument("--name", default="flash_hopper", help="the results file: bench_NAME.csv")
    args = parser.parse_args()
    configs = [kernel_config(c) for c in args.configs.split(",")]
    failures = checks(configs[:args.check_configs])
    if not args.check_only:
        bench(configs, args.quick, args.out, tuple(int(d) for d in args.head_dims.split(",")),
              tuple(int(n) for n in args.lengths.split(",") if n), args.name)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
