"""Why one row of the SDPA suite moves between recordings: the course's causal call at N = 1024 (D = 128,
fp16, B = 16, 16 heads) measured 0.18 ms in the ladder and 0.31 ms in the suite of the same recording.

    PYTHONPATH=. python scripts/gpu_flash_suite_row.py OUTDIR

In one process, for causal N = 512, 1024 and 2048 and non-causal 1024, each three times, in this order:
- ``suite``: the suite's own ``attnkit.bench.flash.measure`` (check, then the forward through
  ``flash_attention`` under no_grad with inputs that require gradients, then the backward), and cuDNN's;
- ``ladder``: ``flash_attention_forward``, as the ladder times it;
- ``public``: ``flash_attention`` under no_grad with inputs that do not require gradients;
- ``host_us``: the host's microseconds a call of each, issued without synchronising;
- ``graph``: the forward replayed from a CUDA graph (no host at all).
Then the D = 128 fp16 suite shapes are run once (as the recording does before this row) and the three
timings repeated: whether a process's history changes the row. Rows go to OUTDIR/bench_flash_suite_row.csv
(with the GPU, date and versions), which lesson 5 prints.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("ATTNKIT_AUTOTUNE", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))     # gpu_flash_overhead beside it

import torch  # noqa: E402
from gpu_flash_overhead import host_us  # noqa: E402

from attnkit.bench import flash as suite  # noqa: E402
from attnkit.bench.recorder import time_ms, write_results  # noqa: E402
from attnkit.bench.streams import graph_ms  # noqa: E402
from attnkit.kernels.flash import flash_attention, flash_attention_forward  # noqa: E402

CASES = [(512, True), (1024, True), (2048, True), (1024, False)]
HEADS, HEAD_DIM, TOKENS = 16, 128, 16 * 1024


def inputs(n, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(TOKENS // n, HEADS, n, HEAD_DIM, generator=gen, device="cuda", dtype=torch.float16)
            for _ in range(4)]


def add(rows, **row):
    rows.append(row)
    print(f"{row['phase']:6s} N={row['n']:5d} causal={row['causal']!s:5s} #{row['repeat']} {row['what']:22s} "
          f"{row['ms']} {row.get('reason') or ''}", flush=True)


def timings(n, causal, phase, rows):
    q, k, v, do = inputs(n)
    expected = suite.reference_slice(q, k, v, do, causal)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    calls = {
        "ladder": lambda: flash_attention_forward(q, k, v, causal=causal),
        "public": lambda: flash_attention(q, k, v, causal=causal),
        "suite_style": lambda: flash_attention(qg, kg, vg, causal=causal),
    }
    for repeat in range(3):
        for impl in ("attnkit", "sdpa_cudnn"):
            result = suite.measure(impl, q, k, v, do, causal, expected)
            for pass_ in ("fwd", "bwd"):
                add(rows, phase=phase, n=n, causal=causal, repeat=repeat, what=f"suite:{impl}:{pass_}",
                    ms=result[f"{pass_}_ms"], reason=result["reason"])
        with torch.no_grad():
            for name, fn in calls.items():
                add(rows, phase=phase, n=n, causal=causal, repeat=repeat, what=name, ms=time_ms(fn))
                add(rows, phase=phase, n=n, causal=causal, repeat=repeat, what=f"{name}:host_us", ms=host_us(fn))
            add(rows, phase=phase, n=n, causal=causal, repeat=repeat, what="graph", ms=graph_ms(calls["ladder"]))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for n, causal in CASES:
        timings(n, causal, "fresh", rows)
    suite.run(impls=("attnkit", "sdpa_cudnn"), only=lambda s: s[0] == "mha" and s[5] == HEAD_DIM
              and s[7] == "float16")
    for n, causal in CASES:
        timings(n, causal, "after", rows)
    print(write_results("flash_suite_row", [{**row, "reason": row.get("reason", "")} for row in rows], out), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
