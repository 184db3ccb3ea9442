"""Where the host's time goes in one short attention call (issue 17, target 2): the course's forward and
backward at N = 1024, causal, fp16, D = 64 and 128, B·N = 16k tokens, 16 heads, default tiles (no
autotuning), issued 200 times without synchronising, under cProfile.

    python scripts/gpu_flash_host_profile.py > host_profile.txt
    python scripts/gpu_flash_host_profile.py --gluon-only     # the Gluon forward's layers alone

Prints, per call: the host's microseconds with and without the profiler, then the 25 functions with the
most time of their own; then the layers of one call timed apart (``layers``; ``gluon_layers`` for the
warp-specialised Gluon forward where its rule picks it, D = 128): the whole call, the
launches replayed through ``plans.launch`` with the arguments the call passed, the same launches
straight into Triton (``kernel[grid](...)``, the configuration given), and the pieces the wrapper adds
(tensor descriptors, output buffers, the device context). When the host's time per call exceeds the
kernels' (scripts/gpu_flash_overhead.py measures both), back-to-back calls wait on Python, not on the GPU.
"""
from __future__ import annotations

import cProfile
import io
import math
import os
import pstats

os.environ["ATTNKIT_AUTOTUNE"] = "0"

import gpu_flash_backward as fb  # noqa: E402  (scripts/ is sys.path[0])
import torch  # noqa: E402
from gpu_flash_overhead import host_us  # noqa: E402  (it leaves ATTNKIT_AUTOTUNE as set above)

from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import backward as backward_launch  # noqa: E402
from attnkit.kernels.flash import dispatch, layout, plans, triton_kernels  # noqa: E402
from attnkit.kernels.flash import forward as forward_launch  # noqa: E402

CALLS = 200


def profiled(fn, calls: int = CALLS) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def _timed_us(fn, calls: int = CALLS) -> float:
    """Host microseconds per call of ``fn`` (issued without synchronising, then drained)."""
    return host_us(fn, calls)


def captured_launches(fn) -> list:
    """The (args, kwargs) of every ``plans.launch`` that one call of ``fn`` makes."""
    real, calls = plans.launch, []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    plans.launch = spy
    try:
        fn()
    finally:
        plans.launch = real
    torch.cuda.synchronize()
    return calls


def direct_launch(args, kwargs, runners=None):
    """The launch ``plans.launch(*args, **kwargs)`` makes, straight into Triton's JIT (or, given
    ``runners`` (attnkit.kernels.flash.runners), the JIT for the first call of its key and the compiled
    kernel's runner after): the launcher's kernel, the configuration it would take, the grid computed once."""
    import triton

    name, device, tuned, fixed, grid_rows, grid_heads, *kernel_args = args
    constexprs = dict(kwargs)
    rows_block = constexprs.pop("rows_block", "BLOCK_M")
    kernel = getattr(triton_kernels, flash.LAUNCHERS[name][0])
    config = fixed or flash.default_config(name, max(constexprs["HEAD_DIM"], constexprs.get("HEAD_DIM_V", 0)))
    meta = config.meta()
    grid = (triton.cdiv(grid_rows, meta[rows_block]), *grid_heads)

    def launch():   # descriptors may serve several launches: their block shapes are set at each
        plans.set_block_shapes(dict(zip(kernel.arg_names, kernel_args), **constexprs, **meta))
        if runners is None:
            kernel[grid](*kernel_args, **constexprs, **meta)
        else:
            runners.launch(kernel, grid, kernel_args, {**constexprs, **meta}, device)
    return launch


def _enter_and_leave(device) -> None:
    with torch.device(device):
        pass


def _inside_device(device, launches) -> None:
    """The launches inside ``with torch.device``: every tensor method Triton calls then goes through
    PyTorch's function-mode dispatch (what plans.launch did before ``attnkit.device.on_device``)."""
    with torch.device(device):
        for launch in launches:
            launch()


def layers(fn, tensors) -> None:
    """One call's host time, layer by layer (microseconds per call)."""
    from attnkit.kernels.flash.runners import Runners

    launches = captured_launches(fn)
    direct = [direct_launch(a, k) for a, k in launches]
    runners = Runners()
    through_runners = [direct_launch(a, k, runners) for a, k in launches]
    device = tensors[0].device
    parts = {
        "whole call": fn,
        f"{len(launches)} launches through plans.launch": lambda: [plans.launch(*a, **k) for a, k in launches],
        f"{len(launches)} launches straight into Triton": lambda: [d() for d in direct],
        f"{len(launches)} launches through kept runners": lambda: [r() for r in through_runners],
        "4 host tensor descriptors": lambda: layout.host_descriptors(*tensors[:4]),
        "2 output buffers (torch.empty)": lambda: [torch.empty_like(tensors[0]) for _ in range(2)],
        "with torch.device(device)": lambda: _enter_and_leave(device),
        f"{len(launches)} launches straight into Triton in torch.device": lambda: _inside_device(device, direct),
        "descriptors_supported": lambda: flash.descriptors_supported(device),
    }
    print_parts(parts)


def print_parts(parts: dict) -> None:
    """Each part's host microseconds per call, one line each."""
    for label, part in parts.items():
        print(f"  {label:45s} {_timed_us(part):8.1f} us", flush=True)


def compiled_runner(grid, args, options):
    """The Gluon forward launched through its compiled kernel (``CompiledKernel[grid](...)``), skipping
    the JIT's argument binding, specialisation and cache lookup: what a launch path that keeps the
    compiled kernel would cost. Every parameter in the kernel's order, constexprs included."""
    from attnkit.kernels.flash import hopper

    kernel = hopper.attn_fwd_ws
    compiled = kernel[grid](*args, **options)
    params = dict(zip(kernel.arg_names, args), **{k: v for k, v in options.items() if k != "num_warps"})
    ordered = [params[name] for name in kernel.arg_names]
    runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]      # the runner reads grid[0], grid[1], grid[2]
    return lambda: runner(*ordered)


def _enter(context) -> None:
    with context:
        pass


def gluon_layers(q, k, v, causal: bool) -> None:
    """The warp-specialised Gluon forward's host time, layer by layer (microseconds per call): the public
    call, the dispatch, ``hopper.launch`` (through attnkit.kernels.flash.runners), the kernel straight into
    Triton's JIT and through its compiled kernel's bare runner with its arguments built once, and the pieces
    around it (the capability read is the one ``attnkit.device.sm_major`` now makes once per GPU)."""
    from attnkit.device import on_device
    from attnkit.kernels.flash import hopper

    scale = 1 / math.sqrt(q.shape[-1])
    config = dispatch.hopper_launch_config(q, k, causal)     # (half_m, block_n, stages, groups, persistent)
    *blocks, persistent = config
    kernel = hopper.attn_fwd_persistent if persistent else hopper.attn_fwd_ws
    grid, args, options = hopper.launch_args(q, k, v, causal, scale, *blocks, 1, persistent)
    parts = {
        "whole call (flash_attention_forward)": lambda: flash.flash_attention_forward(q, k, v, causal=causal),
        "dispatch (flash.forward.warp_specialized_forward)":
            lambda: forward_launch.warp_specialized_forward(q, k, v, causal, scale),
        "hopper.launch": lambda: hopper.launch(q, k, v, causal, scale, *config),
        "the kernel straight into Triton": lambda: kernel[grid](*args, **options),
        "the compiled kernel's own runner (no binder)": compiled_runner(grid, args, options),
        "its arguments (hopper.launch_args)": lambda: hopper.launch_args(q, k, v, causal, scale, *blocks,
                                                                         1, persistent),
        "3 descriptors (hopper.descriptor)": lambda: [hopper.descriptor(t.view(-1, t.shape[-1]), 128)
                                                      for t in (q, k, v)],
        "on_device(q.device)": lambda: _enter(on_device(q.device)),
        "torch.cuda.get_device_capability(q.device)": lambda: torch.cuda.get_device_capability(q.device),
        "input checks (check_inputs, check_options)": lambda: (flash.check_inputs(q, k, v),
                                                               flash.check_options(q, causal, None, (-1, -1), None)),
        "dispatch.hopper_unsupported": lambda: dispatch.hopper_unsupported(q, k, v, causal),
    }
    print_parts(parts)


def main(gluon_only: bool = False) -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for head_dim in (64, 128):
        n = 1024
        q, k, v, do = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, head_dim)
        scale = 1 / math.sqrt(head_dim)
        o, lse = flash.flash_attention_forward(q, k, v, causal=True)
        calls = {
            f"forward (flash_attention_forward, {flash.BEST_TRITON})":
                lambda: flash.flash_attention_forward(q, k, v, causal=True, variant=flash.BEST_TRITON),
            "backward (flash.backward.backward, two_kernels)":
                lambda: backward_launch.backward(do, q, k, v, o, lse, True, scale, design="two_kernels"),
            "backward (flash.backward.backward, atomic_dq)":
                lambda: backward_launch.backward(do, q, k, v, o, lse, True, scale, design="atomic_dq"),
        }
        for name, fn in ({} if gluon_only else calls).items():
            plain = host_us(fn, CALLS)
            print(f"\n===== D={head_dim} N={n} causal {name}: host {plain:.0f} us/call", flush=True)
            print(profiled(fn))
            layers(fn, (q, k, v, do))
        if flash.warp_specialized_choice(True, head_dim, n, n):
            print(f"\n===== D={head_dim} N={n} causal forward (the warp-specialised Gluon kernel)", flush=True)
            print(profiled(lambda: flash.flash_attention_forward(q, k, v, causal=True)))
            gluon_layers(q, k, v, True)


if __name__ == "__main__":
    import sys

    main(gluon_only="--gluon-only" in sys.argv[1:])
