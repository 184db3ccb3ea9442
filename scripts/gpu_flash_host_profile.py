"""Where the host's time goes in one short attention call (issue 17, target 2): the course's forward and
backward at N = 1024, causal, fp16, D = 64 and 128, B·N = 16k tokens, 16 heads, default tiles (no
autotuning), issued 200 times without synchronising, under cProfile.

    python scripts/gpu_flash_host_profile.py > host_profile.txt

Prints, per call: the host's microseconds with and without the profiler, then the 25 functions with the
most time of their own. When the host's time per call exceeds the kernels' (scripts/gpu_flash_overhead.py
measures both), back-to-back calls wait on Python, not on the GPU.
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


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for head_dim in (64, 128):
        n = 1024
        q, k, v, do = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, head_dim)
        scale = 1 / math.sqrt(head_dim)
        o, lse = flash.flash_attention_forward(q, k, v, causal=True)
        calls = {
            "forward (flash_attention_forward)": lambda: flash.flash_attention_forward(q, k, v, causal=True),
            "backward (flash._backward, two_kernels)": lambda: flash._backward(do, q, k, v, o, lse, True, scale),
            "backward (flash._backward, atomic_dq)": lambda: flash._backward(do, q, k, v, o, lse, True, scale,
                                                                             design="atomic_dq"),
        }
        for name, fn in calls.items():
            plain = host_us(fn, CALLS)
            print(f"\n===== D={head_dim} N={n} causal {name}: host {plain:.0f} us/call", flush=True)
            print(profiled(fn))


if __name__ == "__main__":
    main()
