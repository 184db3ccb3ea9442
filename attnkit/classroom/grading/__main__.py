"""The command line: ``python -m attnkit.classroom.grading --lab 01 a.ipynb b.ipynb ...``, and
``python -m attnkit.classroom.grading leaderboard ...`` for the kernel leaderboard (``leaderboard``).

A path that cannot be graded (a folder, a link, a FIFO, not .ipynb, too large) is skipped with a message
and a row in grades.csv; the others are graded. ``--require-sandbox`` (the default with ``--strict``)
refuses to grade anything where bubblewrap does not work.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .lab import GPU_LABS, find_lab
from .pipeline import (
    DEFAULT_GPU_MEMORY_MIB,
    DEFAULT_MEMORY_MIB,
    DEFAULT_NOTEBOOK_TIMEOUT,
    DEFAULT_TIMEOUT,
    MAX_NOTEBOOK_MIB,
    grade,
)
from .reports import one_line, write_reports
from .sandbox import Budgets, sandbox_problem


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m attnkit.classroom.grading",
                                description="Grade students' lab notebooks with the lab's checks.")
    p.add_argument("--lab", required=True, help="which lab: 01, lab01, or the lab's file name")
    p.add_argument("notebooks", nargs="+", help="the students' notebooks (.ipynb)")
    p.add_argument("--out", default="build/grades", help="report folder (default: build/grades)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per cell")
    p.add_argument("--notebook-timeout", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT,
                   help="seconds per notebook, for each of its steps")
    p.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MIB,
                   help="MiB of resident memory for a step's whole process tree")
    p.add_argument("--gpu-memory", type=int, default=None,
                   help="let the steps use the GPU, each CUDA process's allocator capped at this many MiB (they "
                        "then have no address-space cap, which CUDA cannot start under); 0: no GPU; default: "
                        f"{DEFAULT_GPU_MEMORY_MIB} for labs {', '.join(f'{n:02d}' for n in GPU_LABS)} where this "
                        "machine has a CUDA GPU, else 0")
    p.add_argument("--processes", type=int, default=Budgets.processes, help="processes in a step's tree")
    p.add_argument("--tmp", type=int, default=Budgets.tmp_mib, help="MiB of the sandbox's /tmp")
    p.add_argument("--staging", type=int, default=Budgets.staging_mib, help="MiB of a step's working folder")
    p.add_argument("--output-cap", type=int, default=Budgets.output_mib, help="MiB a step may send back")
    p.add_argument("--keep-executed", type=int, default=Budgets.keep_mib,
                   help="largest executed notebook kept in the reports, MiB")
    p.add_argument("--max-notebook", type=float, default=MAX_NOTEBOOK_MIB, help="largest submission read, MiB")
    p.add_argument("--seed", type=int, default=None, help="the hidden cases' seed (default: a secret one)")
    p.add_argument("--no-sandbox", action="store_true", help="run without bubblewrap even where it works")
    p.add_argument("--require-sandbox", action="store_true",
                   help="refuse to grade without bubblewrap (the default with --strict)")
    p.add_argument("--strict", action="store_true",
                   help="exit with status 1 unless every exercise of every notebook passes")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["leaderboard"]:
        from .leaderboard import main as leaderboard

        return leaderboard(argv[1:])
    p = parser()
    args = p.parse_args(argv)
    if args.no_sandbox and args.require_sandbox:
        p.error("--no-sandbox and --require-sandbox contradict each other")
    try:
        lesson = find_lab(args.lab)
        if args.gpu_memory is None:
            args.gpu_memory = DEFAULT_GPU_MEMORY_MIB if lesson.number in GPU_LABS and _has_gpu() else 0
        Budgets(args.timeout, args.notebook_timeout, args.memory, args.processes, args.tmp, args.staging,
                args.output_cap, args.keep_executed, args.gpu_memory)
    except ValueError as exc:
        p.error(str(exc))
    problem = sandbox_problem()
    if problem and (args.require_sandbox or (args.strict and not args.no_sandbox)):
        print(f"refusing to grade: no sandbox here ({problem}). Install bubblewrap (`make setup` as root), or "
              f"pass --no-sandbox to grade without one.", file=sys.stderr, flush=True)
        return 3
    if problem and not args.no_sandbox:
        print(f"⚠️ grading without a sandbox: {problem}", flush=True)
    grades, skipped = [], []
    for nb in args.notebooks:
        print(f"grading {one_line(nb)} ...", flush=True)
        try:
            grades.append(grade(nb, args.lab, timeout=args.timeout, notebook_timeout=args.notebook_timeout,
                                memory_mib=args.memory, sandbox=False if args.no_sandbox else None, seed=args.seed,
                                max_notebook_mib=args.max_notebook, processes=args.processes, tmp_mib=args.tmp,
                                staging_mib=args.staging, output_mib=args.output_cap, keep_mib=args.keep_executed,
                                gpu_memory_mib=args.gpu_memory))
        except ValueError as exc:
            skipped.append((nb, one_line(exc)))
            print(f"skipped {one_line(nb)}: {one_line(exc)}", flush=True)
    out = Path(args.out)
    write_reports(grades, out, skipped)
    for g in grades:
        print(g.summary())
        print(f"   reports: {out / (g.report_name + '.summary.txt')}, {out / (g.report_name + '.junit.xml')}")
    if skipped:
        print(f"skipped {len(skipped)} path(s): " + "; ".join(f"{one_line(p)} ({w})" for p, w in skipped))
    print(f"grades: {out / 'grades.csv'}")
    return 1 if args.strict and (skipped or not all(g.passed for g in grades)) else 0


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
