"""One GPU session for the FlashAttention kernels: check every variant, then time them.

    python scripts/gpu_flash.py [OUTDIR] [--check-only]

1. checks every ladder rung (forward) and the backward against float64 references on ragged shapes,
   GQA/MQA, causal with Nq < Nk and Nq > Nk, fp16/bf16/fp32, every head dim, with NaN-poisoned outputs,
   and CPU tensors on a machine with a GPU (computed on the GPU, attnkit.device.kernel_device);
2. measures the two ceilings (a large fp16 matrix product, a device-to-device copy);
3. records the suites flash_ladder and flash into OUTDIR with attnkit.bench.suites.record (what
   ``python -m attnkit.bench.suites --out OUTDIR flash_ladder flash`` does);
4. prints a short table of the ratios last.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import torch

from attnkit.bench.recorder import provenance, read_results, time_ms
from attnkit.bench.suites import record
from attnkit.kernels import flash
from attnkit.kernels.flash import layout, plans
from attnkit.reference.attention import attention_ref
from attnkit.tolerances import rel_error, tolerance


def log(*args):
    print(*args, flush=True)


def poison(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def check_shapes():
    """(B, Hq, Hkv, Nq, Nk, D, causal, dtype): ragged sizes, every head dim, GQA/MQA, both causal cases."""
    return [(2, 8, 2, 1000, 1031, 128, True, torch.float16), (1, 4, 4, 777, 777, 64, False, torch.float16),
            (1, 8, 1, 300, 129, 128, True, torch.bfloat16), (1, 4, 1, 301, 517, 64, True, torch.float32),
            (1, 2, 1, 200, 333, 16, False, torch.float16), (1, 2, 1, 200, 333, 32, True, torch.bfloat16),
            (1, 2, 1, 200, 333, 256, True, torch.float16)]


def check_all(device="cuda") -> list[str]:
    failures = []
    layout.new_buffer = poison          # every buffer starts as NaN: unwritten elements fail
    gen = torch.Generator(device=device).manual_seed(123)
    for b, hq, hkv, nq, nk, d, causal, dtype in check_shapes():
        q = torch.randn(b, hq, nq, d, device=device, dtype=dtype, generator=gen)
        k = torch.randn(b, hkv, nk, d, device=device, dtype=dtype, generator=gen)
        v = torch.randn(b, hkv, nk, d, device=device, dtype=dtype, generator=gen)
        do = torch.randn(b, hq, nq, d, device=device, dtype=dtype, generator=gen)
        ref = attention_ref(q, k, v, causal=causal)
        bound = tolerance(dtype, device)
        label = f"{(b, hq, hkv, nq, nk, d)} causal={causal} {str(dtype)[6:]}"
        for variant in flash.VARIANTS:
            o, _ = flash.flash_attention_forward(q, k, v, causal=causal, variant=variant)
            err = rel_error(o, ref)
            if not err <= bound:
                failures.append(f"fwd {variant} {label}: {err:.2e}")
        # gradients: float64 autograd of the whole problem (K/V heads get every group member's share)
        q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
        o = flash.flash_attention(q_, k_, v_, causal=causal)
        grads = torch.autograd.grad(o, (q_, k_, v_), do)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        g = hq // hkv
        s = q64 @ k64.repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(d)
        if causal:
            vis = torch.arange(nk, device=device)[None, :] <= torch.arange(nq, device=device)[:, None] + nk - nq
            s = s.masked_fill(~vis, -math.inf)
        o64 = torch.softmax(s, -1).nan_to_num(0.0) @ v64.repeat_interleave(g, 1)
        ref_grads = torch.autograd.grad(o64, (q64, k64, v64), do.double())
        for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
            err = rel_error(got, want)
            if not err <= bound:
                failures.append(f"{name} {label}: {err:.2e}")
        log(f"checked {label}")
    layout.new_buffer = lambda shape, dtype, device: torch.empty(shape, dtype=dtype, device=device)
    return failures


def check_cpu_path() -> list[str]:
    """CPU tensors on a GPU machine: computed on the GPU and copied back (attnkit.device.kernel_device)."""
    qc, kc, vc = (torch.randn(1, 2, 19, 16, requires_grad=True) for _ in range(3))
    o = flash.flash_attention(qc, kc, vc, causal=True)
    err = rel_error(o, attention_ref(qc, kc, vc, causal=True))
    o.sum().backward()
    ok = err <= tolerance(torch.float32, "cpu") and all(torch.isfinite(t.grad).all() for t in (qc, kc, vc))
    return [] if ok else [f"cpu tensors: {err:.2e}"]


def check_cpu_path_safely() -> list[str]:
    try:
        return check_cpu_path()
    except Exception as exc:
        return [f"cpu tensors: {type(exc).__name__}: {exc}"]


def ceilings() -> dict:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    ms = time_ms(lambda: a @ b)
    x = torch.randn(2 ** 30 // 2, device="cuda", dtype=torch.float16)   # 1 GiB
    y = torch.empty_like(x)
    copy_ms = time_ms(lambda: y.copy_(x))
    return {"matmul_fp16_tflops": 2 * 8192 ** 3 / ms / 1e9, "copy_tb_s": 2 * x.numel() * 2 / copy_ms / 1e9}


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else os.environ.get("OUT", "."))
    log(provenance())
    t0 = time.time()
    os.environ["ATTNKIT_AUTOTUNE"] = "0"     # the fixed configurations here; the benchmark checks the tuned ones
    failures = check_all()
    del os.environ["ATTNKIT_AUTOTUNE"]
    failures += check_cpu_path_safely()
    log(f"correctness: {len(failures)} failures in {time.time() - t0:.0f} s")
    for f in failures:
        log("  FAIL", f)
    if "--check-only" in sys.argv:
        return 0
    log("ceilings:", ceilings())

    from attnkit.bench import flash as bench_flash

    t0 = time.time()
    for path in record(["flash_ladder", "flash"], out):
        log(f"wrote {path} at {time.time() - t0:.0f} s")
    for r in read_results("flash_ladder", out):
        log(f"  {r['rung']:>16} N={r['N']:>5} causal={r['causal']!s:5} {(r['tflops'] or 0):7.1f} TFLOP/s {r['reason']}")
    for name, tuned in plans.TUNED.items():
        for key, config in list(tuned.cache.items())[:40]:
            log(f"  tuned {name} {key[:5]}: {config}")
    rows = read_results("flash", out)
    for r in rows:
        if r["reason"]:
            log(f"  no time: {r['suite']} {r['impl']} {r['pass']} N={r['N']} D={r['D']} causal={r['causal']} "
                f"{r['dtype']}: {r['reason']}")
    for suite, dtype, head_dim in (("mha", "float16", 128), ("gqa", "float16", 64), ("mha", "float16", 64),
                                   ("mha", "bfloat16", 128), ("mha", "bfloat16", 64)):
        log(bench_flash.summary(rows, dtype=dtype, head_dim=head_dim, suite=suite))
    log(f"correctness failures: {len(failures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
