"""Short calls issued eagerly: attnkit's forward + backward against PyTorch's cuDNN attention, side by side
in one process, without CUDA graphs (what a training loop does).

    python scripts/gpu_flash_eager.py [OUTDIR] [--repeats 5]

Cases: fp16, N = 1024, causal and not, D = 64 and 128, B = 16 and H = 16 (B·N = 16k tokens, the course's
short-call shape) and B = 1, H = 16 (one sequence: the host's time dominates). Each repeat times every
(case, implementation) once with ``triton.testing.do_bench`` (median; calls back to back, the host's work
between kernels included), the implementations alternating; a row's time is the median over repeats.
Printed: attnkit ÷ cuDNN time per case (the course's target: at most 1.2 at N = 1k). With OUTDIR, writes
OUTDIR/bench_flash_eager.csv (one row per case, implementation and repeat, with GPU, date and versions).
A check first: attnkit's o and gradients against cuDNN's, within twice fp16's bound (each side carries its own
rounding).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

from attnkit.bench.flash import implementation
from attnkit.bench.recorder import time_ms, write_results
from attnkit.tolerances import rel_error, tolerance

IMPLS = ("attnkit", "sdpa_cudnn")
CASES = [dict(batch=b, heads=16, n=1024, head_dim=d, causal=c)
         for b, d, c in itertools.product((16, 1), (128, 64), (False, True))]


def inputs(case, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (case["batch"], case["heads"], case["n"], case["head_dim"])
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen).requires_grad_()
               for _ in range(3))
    return q, k, v, torch.randn(shape, device="cuda", dtype=torch.float16, generator=gen)


def step(impl: str, causal: bool, q, k, v, do):
    """One eager forward + backward of ``impl``: o, then dq, dk, dv through autograd."""
    attend = implementation(impl)

    def run():
        return torch.autograd.grad(attend(q, k, v, causal), (q, k, v), do)
    return run


def check(case) -> list[str]:
    q, k, v, do = inputs(case, seed=1)
    outs = {}
    for impl in IMPLS:
        o = implementation(impl)(q, k, v, case["causal"])
        outs[impl] = (o, *torch.autograd.grad(o, (q, k, v), do))
    bound = tolerance(torch.float16, "cuda")
    return [f"{name}: attnkit vs cuDNN relative error {err:.2e} > {bound:.1e}"
            for name, a, b in zip(("o", "dq", "dk", "dv"), outs["attnkit"], outs["sdpa_cudnn"])
            if not (err := rel_error(a.float(), b.float())) <= 2 * bound]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    failures = [f"{case}: {f}" for case in CASES for f in check(case)]
    print("check:", "pass" if not failures else failures, flush=True)
    prepared = [(case, inputs(case)) for case in CASES]
    rows, times = [], {}
    for repeat in range(args.repeats):
        for index, (case, tensors) in enumerate(prepared):
            for impl in IMPLS:
                ms = time_ms(step(impl, case["causal"], *tensors))
                times.setdefault((index, impl), []).append(ms)
                rows.append(dict(impl=impl, repeat=repeat, ms=round(ms, 4), dtype="float16", **case,
                                 check="pass" if not failures else "fail"))
    print("fp16, forward + backward, eager (medians of repeats; ratio: attnkit's time ÷ cuDNN's, target <= 1.2)")
    for index, (case, _) in enumerate(prepared):
        ours, theirs = (statistics.median(times[index, impl]) for impl in IMPLS)
        print(f"  B={case['batch']:>2} H={case['heads']} N={case['n']} D={case['head_dim']:>3} "
              f"causal={case['causal']!s:5}: attnkit {ours:.3f} ms, cuDNN {theirs:.3f} ms, ratio {ours / theirs:.2f}")
    if args.out is not None:
        print("wrote", write_results("flash_eager", rows, args.out))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
