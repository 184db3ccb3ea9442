"""Forward + backward with a broadcast output gradient (``o.sum().backward()``: dO expanded, every stride 0)
against a random contiguous dO, for attnkit and PyTorch's cuDNN attention side by side in one process.

    python scripts/gpu_flash_broadcast_do.py [OUTDIR] [--repeats 7] [--n 16384] [--heads 16] [--head-dim 64]

Defaults: the shape of Stanford CS336's 2025 leaderboard, bf16, causal, B = 1, H = 16, N = 16384, D = 64.
Checks first: attnkit's gradients through ``o.sum()`` equal those through a contiguous dO of ones (to the
dtype's tolerance; the default one-pass backward adds dQ in no fixed order), and, on an sm_90 GPU, that
both take the warp-specialised Gluon backward (its calls counted). Then each case is timed ``--repeats``
times, the cases alternating within a repeat (``triton.testing.do_bench`` medians): "sum" is
``torch.autograd.grad(o.sum(), (q, k, v))``, "random" is ``torch.autograd.grad(o, (q, k, v), do)`` with a
contiguous N(0, 1) dO, each with its forward. Prints the medians over the repeats and the ratios sum ÷
random for each implementation (the course's target: at most 1.05 for attnkit) and attnkit ÷ cuDNN for
each dO. With OUTDIR, writes OUTDIR/bench_flash_broadcast_do.csv (one row per case and repeat, with GPU,
date and versions).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from attnkit.bench.flash import implementation
from attnkit.bench.recorder import time_ms, write_results
from attnkit.kernels.flash import dispatch
from attnkit.tolerances import rel_error, tolerance

IMPLS = ("attnkit", "sdpa_cudnn")
DOS = ("sum", "random")


def inputs(batch, heads, n, head_dim, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype, generator=gen).requires_grad_()
               for _ in range(3))
    do = torch.randn(batch, heads, n, head_dim, device="cuda", dtype=dtype, generator=gen)
    return q, k, v, do


def step(impl: str, dO: str, q, k, v, do):
    """One forward + backward of ``impl`` with the output gradient ``dO`` ("sum" or "random")."""
    attend = implementation(impl)

    def run():
        o = attend(q, k, v, True)
        if dO == "sum":
            return torch.autograd.grad(o.sum(), (q, k, v))
        return torch.autograd.grad(o, (q, k, v), do)
    return run


def check(q, k, v) -> list[str]:
    """attnkit's gradients through o.sum() against a contiguous dO of ones; on sm_90, the Gluon kernel runs."""
    calls = []
    gluon = dispatch.gluon_module("hopper_backward")          # None with a Triton without Gluon's Hopper API
    if gluon is not None:
        real = gluon.dkdv
        gluon.dkdv = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    try:
        attend = implementation("attnkit")
        o = attend(q, k, v, True)
        summed = torch.autograd.grad(o.sum(), (q, k, v))
        o = attend(q, k, v, True)
        ones = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    finally:
        if gluon is not None:
            gluon.dkdv = real
    failures = []
    for name, a, b in zip(("dq", "dk", "dv"), summed, ones):
        err = rel_error(a, b)
        if not err <= tolerance(q.dtype, "cuda"):
            failures.append(f"{name}: relative error {err:.2e} between o.sum() and a contiguous dO of ones")
    if torch.cuda.get_device_capability()[0] == 9 and gluon is not None and len(calls) != 2:
        failures.append(f"the Gluon backward ran {len(calls)} times for the two calls, not 2")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args(argv)
    q, k, v, do = inputs(1, args.heads, args.n, args.head_dim, torch.bfloat16)
    failures = check(q, k, v)
    print("check:", "pass" if not failures else failures, flush=True)
    cases = [(impl, dO) for impl in IMPLS for dO in DOS]
    rows, times = [], {case: [] for case in cases}
    for repeat in range(args.repeats):
        for impl, dO in cases:
            ms = time_ms(step(impl, dO, q, k, v, do))
            times[impl, dO].append(ms)
            rows.append(dict(impl=impl, do=dO, repeat=repeat, ms=round(ms, 4), dtype="bfloat16", causal=True,
                             batch=1, heads=args.heads, n=args.n, head_dim=args.head_dim,
                             check="pass" if not failures else "fail"))
    median = {case: statistics.median(ms) for case, ms in times.items()}
    print(f"bf16, causal, B = 1, H = {args.heads}, N = {args.n}, D = {args.head_dim}; forward + backward, "
          f"medians of {args.repeats} repeats (ms)")
    for impl, dO in cases:
        print(f"  {impl:>10} dO {dO:>6}: {median[impl, dO]:.3f} ms")
    for impl in IMPLS:
        print(f"  {impl}: sum ÷ random = {median[impl, 'sum'] / median[impl, 'random']:.3f}")
    for dO in DOS:
        print(f"  dO {dO}: attnkit ÷ cuDNN time = {median['attnkit', dO] / median['sdpa_cudnn', dO]:.3f}")
    if args.out is not None:
        print("wrote", write_results("flash_broadcast_do", rows, args.out))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
