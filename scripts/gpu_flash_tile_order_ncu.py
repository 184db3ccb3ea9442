"""One call of the package's Gluon forward with its tiles in groups of G (batch, head) pairs, inside a profiler
window, for Nsight Compute to read what the order does to the L2 cache
(experiments/flash_hopper_gluon/README.md, "The order of a causal grid's tiles"). fp16, B · N = 16k tokens,
2048 / D heads.


    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,... --csv \
        python scripts/gpu_flash_tile_order_ncu.py GROUP CAUSAL [N] [D]
    python scripts/gpu_flash_tile_order_ncu.py --csv RAW PROVENANCE.csv OUTDIR

experiments/flash_hopper_gluon/tile_order_ncu.csv holds ncu's CSV lines of each run after a "# causal=C
head_group=G" line (tile_order_run.log beside it has the GPU, date and versions); ``--csv`` turns them into
attnkit/bench/results/bench_flash_tile_order_ncu.csv, with the provenance of a CSV recorded in the same
session (bench_flash_tile_order.csv), for lesson 5.
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import torch

from attnkit.kernels.flash import dispatch, hopper


def main(head_group: int, causal: bool, n: int = 1024, head_dim: int = 128) -> None:
    heads, batch = 2048 // head_dim, 16384 // n
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    config = dispatch.HEAD_DIMS[head_dim].gluon_forward[causal]

    def call():
        return hopper.launch(q, k, v, causal, 1 / math.sqrt(head_dim), *config, head_group=head_group)
    call()                                      # compiled and warm before the window
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


COLUMNS = {  # column: (ncu metric, the unit ncu wrote, factor to the column's unit)
    "duration_us": ("gpu__time_duration.sum", "ns", 1e-3),
    "dram_read_mb": ("dram__bytes_read.sum", "byte", 1e-6),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct", "%", 1),
    "l2_read_sectors_m": ("lts__t_sectors_srcunit_tex_op_read.sum", "sector", 1e-6),
    "l2_fabric_sectors_m": ("lts__t_sectors_srcunit_ltcfabric.sum", "sector", 1e-6),
    "sm_busy_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", 1),
}
PROVENANCE = ("gpu", "date", "torch", "triton", "cuda", "cudnn")


def runs(raw_path: str) -> list[dict]:
    """A row per run of the recorded ncu lines (causal, head_group, then ``COLUMNS``); ValueError where ncu
    wrote a metric in another unit than the factor assumes."""
    found, run = [], None
    for line in open(raw_path):
        if line.startswith("#"):                      # "# causal=1 head_group=16"
            run = {key: int(value) for key, value in (word.split("=") for word in line[1:].split())}
            found.append(run)
        elif not line.startswith('"ID"'):
            fields = next(csv.reader([line]))
            metric, unit, value = fields[-3], fields[-2], float(fields[-1].replace(",", ""))
            for column, (name, expected_unit, factor) in COLUMNS.items():
                if name == metric:
                    if unit != expected_unit:
                        raise ValueError(f"{raw_path}: {metric} in {unit}, expected {expected_unit}")
                    run[column] = round(value * factor, 3)
    return found


def write_csv(raw_path: str, provenance_path: str, out_dir: str) -> Path:
    """bench_flash_tile_order_ncu.csv: ``runs`` with the gpu, date and versions of a CSV recorded in the
    same session (the profile itself carries none)."""
    first = next(csv.DictReader(open(provenance_path)))
    rows = [{**run, **{key: first[key] for key in PROVENANCE}} for run in runs(raw_path)]
    path = Path(out_dir) / "bench_flash_tile_order_ncu.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


if __name__ == "__main__":
    if sys.argv[1] == "--csv":
        print(write_csv(*sys.argv[2:5]))
    else:
        main(int(sys.argv[1]), sys.argv[2] == "1", *(int(x) for x in sys.argv[3:5]))
