"""One call of the package's Gluon forward with its tiles in groups of G (batch, head) pairs, inside a
profiler window, for Nsight Compute to read what the order does to the L2 cache (README.md, "The order
of a causal grid's tiles"). fp16, B · N = 16k tokens, 2048 / D heads.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,... --csv \
        python experiments/flash_hopper_gluon/tile_order.py GROUP CAUSAL [N] [D]
    python experiments/flash_hopper_gluon/tile_order.py --summary tile_order_ncu.csv

tile_order_ncu.csv holds ncu's CSV lines of each run after a "# causal=C head_group=G" line (recorded on
the H100 on 2026-11-27: see tile_order_run.log for the GPU and versions); ``--summary`` prints the table
the README quotes.
"""
from __future__ import annotations

import csv
import math
import sys

import torch

from attnkit.kernels import flash_hopper


def main(head_group: int, causal: bool, n: int = 1024, head_dim: int = 128) -> None:
    heads, batch = 2048 // head_dim, 16384 // n
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    config = flash_hopper.CONFIG[head_dim, causal]

    def call():
        return flash_hopper._launch(q, k, v, causal, 1 / math.sqrt(head_dim), *config, head_group)
    call()                                      # compiled and warm before the window
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


COLUMNS = {"gpu__time_duration.sum": ("µs", 1e-3), "dram__bytes_read.sum": ("DRAM read MB", 1e-6),
           "lts__t_sector_hit_rate.pct": ("L2 hit %", 1), "lts__t_sectors_srcunit_tex_op_read.sum": (
               "L2 read sectors M", 1e-6), "lts__t_sectors_srcunit_ltcfabric.sum": ("L2 fabric sectors M", 1e-6),
           "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("SM busy %", 1)}


def summary(path: str) -> None:
    """A row per run of the recorded ncu lines: each metric in the units of ``COLUMNS``."""
    runs, run = {}, None
    for line in open(path):
        if line.startswith("#"):
            run = runs.setdefault(line[1:].strip(), {})
        elif not line.startswith('"ID"'):
            fields = next(csv.reader([line]))
            run[fields[-3]] = float(fields[-1].replace(",", ""))
    print("| run | " + " | ".join(name for name, _ in COLUMNS.values()) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, metrics in runs.items():
        print(f"| {name} | " + " | ".join(f"{metrics[m] * scale:.1f}" for m, (_, scale) in COLUMNS.items()) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        summary(sys.argv[2])
    else:
        main(int(sys.argv[1]), sys.argv[2] == "1", *(int(x) for x in sys.argv[3:5]))
