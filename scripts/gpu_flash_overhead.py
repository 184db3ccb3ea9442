"""How much of a short attention call is the host's (issue 17, target 2): the same calls timed three ways.

    python scripts/gpu_flash_overhead.py OUTDIR [--no-fp32-check]

For each case (fp16, D = 128, B·N = 16k tokens, 16 heads: causal and not at N = 1k, causal at 4k) and
implementation (the ladder's untuned "split" rung, the autotuned "autotuned" and "host_descriptors"
rungs, the "warp_specialized" rung (the Gluon kernel on sm_90), SDPA's cuDNN and flash backends):
- eager_ms: triton.testing.do_bench, calls issued back to back (what the ladder records);
- graph_ms: the same call replayed from a CUDA graph (no host work between kernels);
- host_us: the host's time to issue one call (50 calls without synchronising, divided by 50; the median
  of 7 such rounds).
When host_us exceeds graph_ms, back-to-back calls are bound by the host and eager_ms measures Python,
not the kernel. Rows go to OUTDIR/bench_flash_overhead.csv. First, a check that fp32 inputs at D = 128
run with every launcher's default configuration (they fall back to smaller tiles where shared memory
runs out) and match float64, forward and backward, both backward designs.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("ATTNKIT_AUTOTUNE", "1")

import gpu_flash_backward as fb  # noqa: E402
import torch  # noqa: E402

from attnkit.bench.recorder import time_ms, write_results  # noqa: E402
from attnkit.bench.streams import graph_ms  # noqa: E402
from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import forward as forward_launch  # noqa: E402

CASES = [(1024, True), (1024, False), (4096, True)]      # (n, causal)
IMPLS = ("split", "autotuned", "host_descriptors", "warp_specialized", "sdpa_cudnn", "sdpa_flash")


def host_us(fn, calls: int = 50, repeats: int = 7) -> float:
    """The median over ``repeats`` rounds of the host's time per call, issuing ``calls`` calls without
    synchronising (then draining the GPU between rounds: the queue never fills)."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def call(impl, q, k, v, causal):
    if impl.startswith("sdpa"):
        attend = fb.implementation(impl)
        return lambda: attend(q, k, v, causal)
    rung = flash.VARIANTS[impl]
    return lambda: forward_launch.forward_rung(q, k, v, causal, 1 / math.sqrt(q.shape[-1]), rung)


def check_fp32_defaults() -> list[str]:
    """fp32, D = 128, no autotuning: both passes against float64 (the fallback for shared memory)."""
    saved, os.environ["ATTNKIT_AUTOTUNE"] = os.environ["ATTNKIT_AUTOTUNE"], "0"
    failures = []
    try:
        for design in flash.BACKWARDS:
            q, k, v, do = (t.float() for t in fb.random_inputs(1, 2, 300, 128, seed=7))
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = flash.flash_attention(*leaves, causal=True, backward=design)
            got = [out.detach(), *torch.autograd.grad(out, leaves, do)]
            ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
            ref_out = fb.attention_plain(*ref_leaves, True)
            ref = [ref_out.detach(), *torch.autograd.grad(ref_out, ref_leaves, do.double())]
            for name, g, r in zip(("o", "dq", "dk", "dv"), got, ref):
                err = (g.double() - r).abs().max().item()
                fb.log(f"fp32 D=128 {design} {name}: max error {err:.2e} against float64")
                if not err < 1e-4:
                    failures.append(f"{design} {name}: {err:.2e}")
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
    finally:
        os.environ["ATTNKIT_AUTOTUNE"] = saved
    fb.log("fp32 defaults:", "pass" if not failures else failures)
    return failures


def main(argv) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    failures = [] if "--no-fp32-check" in argv else check_fp32_defaults()
    rows = []
    for n, causal in CASES:
        q, k, v, _ = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, 128)
        with torch.no_grad():
            for impl in IMPLS:
                fn = call(impl, q, k, v, causal)
                fn()                                   # autotune (and compile) outside every timing
                torch.cuda.synchronize()
                row = dict(impl=impl, n=n, causal=causal, batch=fb.TOKENS // n, heads=fb.HEADS, head_dim=128,
                           eager_ms=time_ms(fn), graph_ms=float("nan"), host_us=host_us(fn), reason="")
                try:
                    row["graph_ms"] = graph_ms(fn)
                except Exception as exc:
                    row["reason"] = f"graph: {type(exc).__name__}: {str(exc)[:120]}"
                rows.append(row)
                fb.log(f"N={n} causal={causal} {impl:>16}: eager {row['eager_ms']:.3f} ms, graph "
                       f"{row['graph_ms']:.3f} ms, host {row['host_us']:.0f} us/call {row['reason']}")
        write_results("flash_overhead", rows, out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
