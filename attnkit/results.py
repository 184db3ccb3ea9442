"""Recorded results: where they live and how a row says where it was measured.

Every GPU number in the course is a row of ``bench_<name>.csv`` in ``attnkit/bench/results/`` (package data,
installed with the course). ``write_results`` adds the GPU's name, the date and the torch / triton / CUDA /
cuDNN versions to every row it writes; ``read_results`` reads a file back (numbers as floats) and
``describe_source`` names where rows were measured. This module sits on the package's lowest floor so that
every floor that records or shows results (``distributed``, ``bench``, ``classroom``) can use it;
``attnkit.bench.recorder`` re-exports it beside the timing helper and the table of recording commands.
"""
from __future__ import annotations

import csv
import datetime
from pathlib import Path

from .device import versions

RESULTS = Path(__file__).resolve().parent / "bench" / "results"     # package data: installed with the course
PROVENANCE = ("gpu", "date", "torch", "triton", "cuda", "cudnn")


def provenance() -> dict:
    """This machine's provenance columns: GPU name (``cpu`` without one), today's date, library versions."""
    info = versions()
    return {
        "gpu": info.get("gpu", "cpu"),
        "date": datetime.date.today().isoformat(),
        "torch": info["torch"],
        "triton": info["triton"],
        "cuda": info.get("cuda"),
        "cudnn": info.get("cudnn"),
    }


def write_results(name: str, rows: list[dict], directory: Path = RESULTS) -> Path:
    """Write ``rows`` to ``directory/bench_<name>.csv`` with the provenance columns added."""
    if not rows:
        raise ValueError("rows: nothing to write")
    stamp = provenance()
    rows = [{**row, **stamp} for row in rows]
    fields = list(dict.fromkeys(k for row in rows for k in row))
    path = Path(directory) / f"bench_{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_results(name: str, directory: Path = RESULTS) -> list[dict]:
    """The recorded rows of ``bench_<name>.csv``; numbers come back as floats where they parse."""
    path = Path(directory) / f"bench_{name}.csv"
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for key, value in row.items():
            if key in PROVENANCE:
                continue
            try:
                row[key] = float(value)
            except (TypeError, ValueError):
                pass
    return rows


def describe_source(rows: list[dict]) -> str:
    """One line naming where recorded rows were measured."""
    r = rows[0]
    return (f"recorded on {r['gpu']} on {r['date']} with torch {r['torch']}, triton {r['triton']}, "
            f"CUDA {r['cuda']}, cuDNN {r['cudnn']}")
