"""The host's time of one backward call (the public path: ``torch.autograd.grad`` of a kept forward), and
where it goes.

    PYTHONPATH=<package root> python experiments/host_profile/backward_call.py LABEL [--no-profile]

At causal N = 1024 (D = 128 and 64) and non-causal N = 1024 (D = 128), fp16, B·N = 16k tokens, H · D = 2048:
the host's microseconds a call for the course's default backward and for cuDNN's (the median of 7 rounds of
50 calls issued without synchronising, ``scripts/gpu_flash_overhead.host_us``), each call's ``do_bench``
time, then (unless --no-profile) the course's call under cProfile (300 calls): its 30 costliest functions
by their own time and its 25 by cumulative time. Run it alternately from two package roots on one machine
to compare two versions.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
from pathlib import Path

os.environ.setdefault("ATTNKIT_AUTOTUNE", "0")
sys.path.append(str(Path(__file__).resolve().parents[2] / "scripts"))

import torch  # noqa: E402
from gpu_flash_overhead import host_us  # noqa: E402

from attnkit.bench.flash import implementation  # noqa: E402
from attnkit.bench.recorder import provenance, time_ms  # noqa: E402
from attnkit.kernels import flash  # noqa: E402

label = sys.argv[1]
package = os.path.relpath(Path(flash.__file__).parent)      # which copy of the package this run imports
print(f"{label}: attnkit from {package}; {provenance()}", flush=True)
for n, causal, head_dim in ((1024, True, 128), (1024, True, 64), (1024, False, 128)):
    heads = 2048 // head_dim
    q, k, v = (torch.randn(16384 // n, heads, n, head_dim, device="cuda", dtype=torch.float16, requires_grad=True)
               for _ in range(3))
    calls = {}
    for impl in ("attnkit", "sdpa_cudnn"):
        o = implementation(impl)(q, k, v, causal)
        do = torch.randn_like(o)
        calls[impl] = lambda o=o, do=do: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    for impl, call in calls.items():
        print(f"{label} N={n} causal={causal} D={head_dim} {impl:>10}: host µs a call {host_us(call):.0f}, "
              f"do_bench {time_ms(call):.4f} ms", flush=True)
    if "--no-profile" in sys.argv:
        continue
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(300):
        calls["attnkit"]()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
    root = str(Path(__file__).resolve().parents[2])
    print(text.getvalue().replace(root + "/", "").replace(os.path.dirname(torch.__path__[0]) + "/", ""))
    stats = pstats.Stats(profile, stream=io.StringIO())
    stats.sort_stats("cumulative").print_stats(25)
    print(stats.stream.getvalue().replace(root + "/", "").replace(os.path.dirname(torch.__path__[0]) + "/", ""))
