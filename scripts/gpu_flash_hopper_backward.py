"""The warp-specialised dK/dV kernel (attnkit.kernels.flash.hopper_backward) on the H100: checks, then the
whole backward timed beside cuDNN's and the Triton two-kernel design's in one process.

    python scripts/gpu_flash_hopper_backward.py OUTDIR [--n 1024,4096,16384] [--head-dims 128,64]
                                                        [--stages 2,3] [--check-only]

Checks (before any timing; outputs poisoned with NaN; the Gluon kernel must have run): FlashAttention-2's
criterion on [1, 16, 1008, D] (gpu_flash_backward.check_backward), and float64 references on ragged
grouped-query cases (Hq = 4, Hkv = 2; Nq = Nk = 200; causal Nq = 200 < Nk = 328). Timing: fp16, B·N = 16k
tokens, H = 16 (the backward script's shapes), fixed Triton block configurations (ATTNKIT_AUTOTUNE=0);
rows "two_kernels", "warp_specialized" (Gluon dK/dV + Triton dQ), "warp_specialized_atomic" (the one pass
with its dQ writer partition issuing TMA reductions), "ws_atomic_writer_atomic" (its writer adding by fp32
atomic adds instead), "ws_atomic_no_writer" (the one pass, the compute groups adding dQ themselves),
"ws_atomic_ascending" and "ws_ascending" (each program's query blocks walked from its first up, not from
the last down),
"ws_stages<S>" (warp_specialized with other ring stages), "ws_dkdv_kernel" and "ws_one_pass_kernel" (the
Gluon kernels alone, without the DELTA pass, the dQ kernel, the buffer's zeroing and conversion), SDPA's cuDNN;
vs_cudnn = cuDNN's ms / the row's ms.
Rows go to OUTDIR/bench_flash_hopper_backward.csv, rewritten after every case. The Gluon designs run their
kernel at every shape here (flash.warp_specialized_backward_choice forced on): these rows are what that
rule was drawn from.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_flash_backward as gb  # noqa: E402  (sets ATTNKIT_AUTOTUNE=0)
import torch  # noqa: E402

from attnkit.bench.recorder import write_results  # noqa: E402
from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import backward as backward_launch  # noqa: E402
from attnkit.kernels.flash import dispatch, hopper_backward  # noqa: E402
from attnkit.reference.attention import attention_grads_ref  # noqa: E402

DESIGNS = ("two_kernels", "warp_specialized", "warp_specialized_atomic")


class counted_dkdv:
    """Within it, calls of the Gluon dK/dV kernel are counted (``.calls``)."""

    def __enter__(self):
        self.calls, self.saved = 0, hopper_backward.dkdv

        def counting(*args, **kwargs):
            self.calls += 1
            return self.saved(*args, **kwargs)
        hopper_backward.dkdv = counting
        return self

    def __exit__(self, *exc):
        hopper_backward.dkdv = self.saved


def check_gqa(design, head_dim, causal, n_q, n_k) -> list[str]:
    """Failures of a warp-specialised design on a ragged grouped-query case against float64: each
    gradient within 2x the two-kernel design's error plus 1e-3."""
    gen = torch.Generator(device="cuda").manual_seed(head_dim + n_k)
    shapes = ((2, 4, n_q), (2, 2, n_k), (2, 2, n_k), (2, 4, n_q))
    q, k, v, do = (torch.randn(*s, head_dim, device="cuda", generator=gen).half() for s in shapes)
    scale = 1 / math.sqrt(head_dim)
    o, lse = flash.flash_attention_forward(q, k, v, causal=causal)
    exact = attention_grads_ref(q, k, v, do, causal=causal)
    with gb.poisoned_buffers(), counted_dkdv() as counter:
        got = backward_launch.backward(do, q, k, v, o, lse, causal, scale, design=design)
    base = backward_launch.backward(do, q, k, v, o, lse, causal, scale, design="two_kernels")
    failures = [] if counter.calls == 1 else [f"Gluon dK/dV ran {counter.calls} times"]
    for name, g, b, e in zip(("dq", "dk", "dv"), got, base, exact):
        err, base_err = ((t.cpu().double() - e).abs().max().item() for t in (g, b))
        if not err <= 2 * base_err + 1e-3:
            failures.append(f"{name}: {err:.3g} against two_kernels' {base_err:.3g}")
    return failures


def check_design(design, head_dim, causal) -> list[str]:
    with counted_dkdv() as counter:
        failures = gb.check_backward(design, head_dim, causal)
    if counter.calls != 1:
        failures.append(f"Gluon dK/dV ran {counter.calls} times")
    return failures + check_gqa(design, head_dim, causal, 200, 328 if causal else 200)


def kernel_alone(tensors, o, lse, causal, one_pass=False):
    """The Gluon kernel alone on DELTA computed once: dK/dV only, or the one pass (into a buffer zeroed once)."""
    q, k, v, do = tensors
    delta = (o.float() * do.float()).sum(-1)
    dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device) if one_pass else None
    scale = 1 / math.sqrt(q.shape[-1])
    return lambda: hopper_backward.dkdv(q, k, v, do, lse, delta, causal, scale, dq_acc=dq_acc,
                                        config=dispatch.gluon_backward_config(q.shape[-1]),
                                        dq_writer=dispatch.GLUON_DQ_WRITER, descending=dispatch.GLUON_DESCENDING)


def with_flags(design, tensors, o, lse, causal, **flags):
    """A backward function of ``design`` run with the dispatch module's Gluon backward rules (GLUON_DQ_WRITER,
    GLUON_DESCENDING, HEAD_DIMS) set to ``flags``, restored after each call."""
    run = gb.attnkit_backward(design, tensors, o, lse, causal)

    def call():
        saved = {name: getattr(dispatch, name) for name in flags}
        for name, value in flags.items():
            setattr(dispatch, name, value)
        try:
            return run()
        finally:
            for name, value in saved.items():
                setattr(dispatch, name, value)
    return call


def with_stages(stages, tensors, o, lse, causal):
    """The warp_specialized design with ``stages`` slots in its rings."""
    head_dim = tensors[0].shape[-1]
    block_m, part_n, _, groups = dispatch.gluon_backward_config(head_dim)
    rules = dataclasses.replace(dispatch.HEAD_DIMS[head_dim], gluon_backward=(block_m, part_n, stages, groups))
    return with_flags("warp_specialized", tensors, o, lse, causal, HEAD_DIMS={**dispatch.HEAD_DIMS, head_dim: rules})


def case(rows, head_dim, n, causal, extra_stages):
    batch = gb.TOKENS // n
    tensors = gb.random_inputs(batch, gb.HEADS, n, head_dim)
    o, lse = flash.flash_attention_forward(*tensors[:3], causal=causal)
    lse = lse.contiguous()
    timings = [("sdpa_cudnn", lambda: gb.sdpa_backward("sdpa_cudnn", tensors, causal))]
    timings += [(d, lambda d=d: gb.attnkit_backward(d, tensors, o, lse, causal)) for d in DESIGNS]
    timings += [(f"ws_stages{s}", lambda s=s: with_stages(s, tensors, o, lse, causal)) for s in extra_stages]
    timings += [("ws_atomic_no_writer",
                 lambda: with_flags("warp_specialized_atomic", tensors, o, lse, causal, GLUON_DQ_WRITER=None)),
                ("ws_atomic_writer_atomic",
                 lambda: with_flags("warp_specialized_atomic", tensors, o, lse, causal, GLUON_DQ_WRITER="atomic")),
                ("ws_atomic_ascending",
                 lambda: with_flags("warp_specialized_atomic", tensors, o, lse, causal, GLUON_DESCENDING=False)),
                ("ws_ascending",
                 lambda: with_flags("warp_specialized", tensors, o, lse, causal, GLUON_DESCENDING=False)),
                ("ws_dkdv_kernel", lambda: kernel_alone(tensors, o, lse, causal)),
                ("ws_one_pass_kernel", lambda: kernel_alone(tensors, o, lse, causal, one_pass=True))]
    new = []
    for impl, build in timings:
        ms, why = gb.timed(build)
        new.append(gb.row("hopper_backward", impl, "backward", n, head_dim, causal, ms, batch=batch, reason=why))
    rows += gb.with_cudnn_ratio(new)
    for r in new:
        gb.log(f"D={head_dim} N={n} causal={causal} {r['impl']:>17} {r['ms']:.3f} ms {r['tflops']:.0f} TFLOP/s "
               f"{r['vs_cudnn']:.2f}x cuDNN {r['reason']}")


def main():
    dispatch.warp_specialized_backward_choice = lambda *args: True     # measure the kernel everywhere
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", default="1024,4096,16384")
    parser.add_argument("--head-dims", default="128,64")
    parser.add_argument("--stages", default="", help="stages timed besides the head dim's gluon_backward configuration")
    parser.add_argument("--check-only", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    head_dims = [int(d) for d in args.head_dims.split(",")]
    failed = False
    for design in DESIGNS[1:]:
        for head_dim in head_dims:
            for causal in (False, True):
                try:
                    failures = check_design(design, head_dim, causal)
                except Exception as exc:
                    failures = [f"{type(exc).__name__}: {str(exc)[:300]}"]
                failed |= bool(failures)
                verdict = "pass" if not failures else "FAIL " + "; ".join(failures)
                gb.log(f"check {design} D={head_dim} causal={causal}: {verdict}")
    if failed or args.check_only:
        sys.exit(1 if failed else 0)
    rows = []
    extra = [int(s) for s in args.stages.split(",") if s]
    for head_dim in head_dims:
        for n in (int(x) for x in args.n.split(",")):
            for causal in (False, True):
                case(rows, head_dim, n, causal, extra)
                write_results("flash_hopper_backward", rows, args.out)


if __name__ == "__main__":
    main()
