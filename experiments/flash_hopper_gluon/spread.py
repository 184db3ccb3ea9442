"""How steady is one ratio? The course's forward and cuDNN's, timed alternately many times in one process,
with the GPU's clock and power read while each timing runs.

    PYTHONPATH=. python experiments/flash_hopper_gluon/spread.py OUTDIR [--repeats 12]

The same non-causal forward (fp16, D = 128, B·N = 16k tokens, 16 heads, N = 4096) measured 0.891 ms in the
SDPA suite and 0.974 ms in the ladder of one recording (cuDNN 0.914 and 0.900). Here each repeat
allocates fresh q, k, v and times the course's call (``flash_attention_forward``) and cuDNN's one after the
other with ``triton.testing.do_bench``, at causal N = 1024 and 2048 (target 2 of issue 17) and non-causal
4096, 8192 and 16384 (target 3). ``nvidia-smi`` samples the SM clock, the power draw and the active clock
event reasons every 100 ms; each row keeps the samples taken while its timing ran (median clock, highest
power, whether the power cap, reason 0x4, was active). Rows go to OUTDIR/bench_flash_spread.csv with the
GPU, date and versions; lesson 5 prints them.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torch

from attnkit.bench.flash import implementation
from attnkit.bench.recorder import time_ms, write_results
from attnkit.kernels.flash import flash_attention_forward

HEADS, HEAD_DIM, TOKENS = 16, 128, 16 * 1024
CASES = [(1024, True), (2048, True), (4096, False), (8192, False), (16384, False)]
SW_POWER_CAP = 0x4          # nvidia-smi's clocks_event_reasons: the clock lowered to hold the power limit
QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


def samples(path: Path) -> list[tuple[float, float, float, int]]:
    """(unix time, SM MHz, watts, reasons) of every line nvidia-smi wrote (its timestamps are local time)."""
    parsed = []
    for line in path.read_text().splitlines():
        fields = [f.strip() for f in line.split(",")]
        try:
            when = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            parsed.append((when, float(fields[1]), float(fields[2]), int(fields[3], 16)))
        except (ValueError, IndexError):
            continue                                   # a header or a partial last line
    return parsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=12)
    args = parser.parse_args(argv)
    cudnn = implementation("sdpa_cudnn")
    calls = {"attnkit": lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal)[0],
             "sdpa_cudnn": cudnn}
    log = Path(tempfile.mkstemp(suffix=".csv")[1])
    sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                "-lms", "100"], stdout=log.open("w"), stderr=subprocess.DEVNULL)
    timed = []                                         # (row, start, end)
    try:
        for repeat in range(args.repeats):
            for n, causal in CASES:
                q, k, v = (torch.randn(TOKENS // n, HEADS, n, HEAD_DIM, device="cuda", dtype=torch.float16)
                           for _ in range(3))
                for impl, call in calls.items():
                    with torch.no_grad():
                        call(q, k, v, causal)          # compiled and warm before the clock starts
                        torch.cuda.synchronize()
                        start = time.time()
                        ms = time_ms(lambda: call(q, k, v, causal))
                        end = time.time()
                    timed.append((dict(repeat=repeat, n=n, causal=causal, impl=impl, ms=ms), start, end))
                    print(f"#{repeat} N={n} causal={causal} {impl:>10} {ms:.4f} ms", flush=True)
                q = k = v = None
    finally:
        time.sleep(0.3)
        sampler.terminate()
        sampler.wait()
    read = samples(log)
    rows = []
    for row, start, end in timed:
        during = [s for s in read if start <= s[0] <= end]
        rows.append({**row, "samples": len(during),
                     "sm_mhz": statistics.median(s[1] for s in during) if during else None,
                     "max_watts": max(s[2] for s in during) if during else None,
                     "power_capped": any(s[3] & SW_POWER_CAP for s in during) if during else None})
    print(write_results("flash_spread", rows, args.out), file=sys.stderr)
    for n, causal in CASES:
        ratios = []
        for repeat in range(args.repeats):
            ms = {r["impl"]: r["ms"] for r in rows if (r["n"], r["causal"], r["repeat"]) == (n, causal, repeat)}
            ratios.append(ms["sdpa_cudnn"] / ms["attnkit"])
        print(f"N={n} causal={causal}: cuDNN's time ÷ the course's, median {statistics.median(ratios):.3f}, "
              f"{min(ratios):.3f} to {max(ratios):.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
