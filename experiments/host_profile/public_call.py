"""The host's time of one public forward call, for comparing two versions of the package side by side.

    PYTHONPATH=<package root> python experiments/host_profile/public_call.py LABEL

Prints one line per case (fp16, D = 128, B·N = 16k tokens, 16 heads, causal N = 512 and 1024, non-causal
1024): the host's microseconds a call of ``flash_attention`` with inputs that need no gradient, and with
inputs that do under ``torch.no_grad`` (as the SDPA suite times it), each the median of 7 rounds of 50 calls
issued without synchronising (``scripts/gpu_flash_overhead.host_us``), then the call's ``do_bench`` time.
Run it alternately from two package roots on one machine: the machine's spread shows between the runs
of one version.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("ATTNKIT_AUTOTUNE", "0")
sys.path.append(str(Path(__file__).resolve().parents[2] / "scripts"))

import torch  # noqa: E402
from gpu_flash_overhead import host_us  # noqa: E402

from attnkit.bench.recorder import provenance, time_ms  # noqa: E402
from attnkit.kernels import flash  # noqa: E402

label = sys.argv[1]
package = os.path.relpath(Path(flash.__file__).parent)      # which copy of the package this run imports
print(f"{label}: attnkit from {package}; {provenance()}", flush=True)
for n, causal in ((512, True), (1024, True), (1024, False)):
    q, k, v = (torch.randn(16384 // n, 16, n, 128, device="cuda", dtype=torch.float16) for _ in range(3))
    tracked = [t.detach().requires_grad_() for t in (q, k, v)]
    plain = host_us(lambda: flash.flash_attention(q, k, v, causal=causal))
    with torch.no_grad():
        suite_style = host_us(lambda: flash.flash_attention(*tracked, causal=causal))
        ms = time_ms(lambda: flash.flash_attention(*tracked, causal=causal))
    print(f"{label} N={n} causal={causal}: host µs a call {plain:.0f} (no gradient needed), {suite_style:.0f} "
          f"(inputs needing gradients, under no_grad); do_bench {ms:.4f} ms", flush=True)
