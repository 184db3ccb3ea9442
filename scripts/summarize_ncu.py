"""Summarise Nsight Compute's raw metrics (scripts/merge_ncu_csv.py's output) into the course's profile CSV:
one row per profiled kernel with the numbers deep dive 6 and docs/flash_notes.md discuss.

    python scripts/summarize_ncu.py NCU_RAW.csv PROVENANCE.csv OUTDIR   # writes OUTDIR/bench_flash_profile.csv

PROVENANCE.csv: a CSV recorded in the same session (its gpu, date and versions are copied; the profile
itself cannot carry them). Units are converted with each file's units row: time in µs, shared memory in
KiB. Stall columns: the average number of cycles a warp spent stalled for that reason per instruction
issued (ncu's smsp__average_warps_issue_stalled_<reason>_per_issue_active); "stalls" lists every reason
above 0.1, largest first.
"""
import csv
import sys
from pathlib import Path

STALL = "smsp__average_warps_issue_stalled_"
METRICS = {   # column: (metric, {unit: factor to the column's unit})
    "duration_us": ("gpu__time_duration.sum", {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}),
    "registers": ("launch__registers_per_thread", {}),
    "threads_per_block": ("launch__block_size", {}),
    "grid": ("launch__grid_size", {}),
    "shared_kib": ("launch__shared_mem_per_block_dynamic", {"byte/block": 1 / 1024, "Kbyte/block": 1000 / 1024}),
    "warps_active_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", {}),
    "sm_busy_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", {}),
    "tensor_active_pct": ("TPC.TriageCompute.sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed",
                          {}),
    "issue_active_pct": ("smsp__issue_active.avg.pct_of_peak_sustained_active", {}),
    "cycles_per_issue": ("smsp__average_warp_latency_per_inst_issued.ratio", {}),
    "instructions": ("smsp__inst_executed.sum", {}),
    "atomic_instructions": ("smsp__inst_executed_op_global_red.sum", {}),
    "spill_instructions": ("sass__inst_executed_register_spilling", {}),
}
STALLS = ("barrier", "long_scoreboard", "wait", "short_scoreboard", "mio_throttle", "lg_throttle", "membar",
          "math_pipe_throttle", "dispatch_stall", "selected", "not_selected")
PROVENANCE = ("gpu", "date", "torch", "triton", "cuda", "cudnn")


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def summarize(raw_rows, provenance: dict) -> list[dict]:
    units = {r["case"][: -len(" units")]: r for r in raw_rows if r["case"].endswith(" units")}
    out = []
    for r in raw_rows:
        if r["case"].endswith(" units"):
            continue
        row = {"case": r["case"], "kernel": r["Kernel Name"].split("(")[0].split("<")[0].replace("void ", "")}
        for column, (metric, factors) in METRICS.items():
            unit = units.get(r["case"], {}).get(metric, "")
            value = number(r.get(metric, ""))
            if factors and value == value:
                if unit not in factors:
                    raise ValueError(f"{metric}: unit {unit!r} not in {sorted(factors)}")
                value *= factors[unit]
            row[column] = value
        stalls = {name: number(r.get(f"{STALL}{name}_per_issue_active.ratio", "")) for name in STALLS}
        row.update({f"stall_{name}": value for name, value in stalls.items()})
        every = {k[len(STALL):-len("_per_issue_active.ratio")]: number(v) for k, v in r.items()
                 if k.startswith(STALL) and k.endswith("_per_issue_active.ratio")}
        row["stalls"] = " ".join(f"{k}={v:.2f}" for k, v in sorted(every.items(), key=lambda kv: -kv[1]) if v > 0.1)
        row.update(provenance)
        out.append(row)
    return out


def main(raw_path: str, provenance_path: str, out_dir: str) -> None:
    raw_rows = list(csv.DictReader(open(raw_path)))
    first = next(csv.DictReader(open(provenance_path)))
    rows = summarize(raw_rows, {k: first[k] for k in PROVENANCE})
    path = Path(out_dir) / "bench_flash_profile.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} kernels -> {path}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__)
        sys.exit(2)
    main(*sys.argv[1:])
