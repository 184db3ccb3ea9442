"""Every recorded benchmark suite of the course, by name: the CSV is ``bench_<name>.csv``.

A suite is a function of a module of ``attnkit/bench/`` that measures on this GPU and returns rows (one dict
per measurement); ``record`` runs the named suites and writes each one's rows with their provenance
(``recorder.write_results``). The command (what ``make bench`` runs):

    python -m attnkit.bench.suites [--out DIR] [SUITE ...]      # every suite when none is named

This module imports every suite's module, and each of them imports ``recorder`` (timing, writing and
reading results); ``recorder`` imports none of them.
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import cache_append, decode_profile, flash, flash_ladder, naive, paged, serving, streams
from .recorder import RESULTS, SUITE_NAMES, write_results

SUITES = {
    "naive_attention": naive.run_naive_scaling,
    "naive_profile": naive.run_naive_profile,
    "flash": flash.run,
    "flash_ladder": flash_ladder.run,
    "paged": paged.run,
    "kvcache": cache_append.run,
    "serving": serving.run,
    "serving_features": serving.run_features,
    "serving_steps": serving.step_breakdown,
    "softmax": streams.run_softmax,
    "bandwidth": streams.run_bandwidth,
    "decode_profile": decode_profile.run,
}


def record(names, directory: Path = RESULTS) -> list[Path]:
    """Run the named suites on this GPU and write each one's rows, with provenance, to ``directory``."""
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        raise ValueError(f"names: unknown suites {unknown}; the suites are {list(SUITES)}")
    return [write_results(name, SUITES[name](), directory) for name in names]


def main(argv=None) -> int:
    import argparse

    import torch

    parser = argparse.ArgumentParser(prog="python -m attnkit.bench.suites",
                                     description="Run benchmark suites on this GPU and write bench_<suite>.csv.")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="directory for the CSVs (default: the package's recorded results)")
    parser.add_argument("suites", nargs="*", metavar="SUITE", help=f"any of {list(SUITE_NAMES)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.suites if n not in SUITES]
    if unknown:
        parser.error(f"unknown suites {unknown}; the suites are {list(SUITES)}")
    if not torch.cuda.is_available():
        print("recording needs a CUDA GPU; the recorded results are in attnkit/bench/results/bench_*.csv")
        return 1
    for path in record(args.suites or list(SUITES), args.out):
        print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
