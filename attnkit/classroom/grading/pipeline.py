"""Grading one notebook: three processes, each sandboxed and on the budgets (``sandbox``):

1. the notebook runs top to bottom in a Jupyter kernel (the executed copy, the cells that raised);
2. at the same time, the student's process loads the notebook's code and answers calls of it
   (``runner``, ``calls``);
3. and the checker's process runs the lab's checks with the secret seed on its own references, each
   call of the student's code sent to the student's process over a connection the grader made
   (``checker``); only its verdicts can give a mark. Then the student's process runs the lab's check
   itself, for what the check watches where the code runs: an exercise whose check fails there (a
   forbidden call, a memory cap, a kernel that stores nothing) fails too.

The grader reads the submission once (``sandbox.safe_read``) and nothing else the student's code could
have written: everything comes back over its pipes, under caps.
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..checking import FAILED, NOT_IMPLEMENTED, PASSED, CheckResult
from .lab import course_tools, find_lab, lab_exercises
from .reports import Grade, cell_errors, one_line
from .sandbox import (
    Budgets,
    Run,
    UnsafeFile,
    cgroup_problem,
    drops_to_nobody,
    nproc_limit,
    run_budgeted,
    safe_read,
    sandbox_problem,
)

ROLE = "ATTNKIT_GRADING_ROLE"       # "student" or "checker": which process of a grading this is
DEFAULT_TIMEOUT = 600              # seconds per cell: the Triton interpreter is slow on a CPU
DEFAULT_NOTEBOOK_TIMEOUT = 1800    # seconds per notebook, for each step
DEFAULT_MEMORY_MIB = 4096          # the whole process tree of a step (importing torch maps about 1 GiB)
DEFAULT_GPU_MEMORY_MIB = 16384     # each CUDA process's allocator, in a step that uses the GPU
MAX_NOTEBOOK_MIB = 20              # the largest submission read


def worker_argv(kind: str) -> list[str]:
    # -I: no PYTHON* variables, no user site, and the working folder is not on sys.path (a file the
    # notebook writes there cannot stand in for a module).
    return [sys.executable, "-I", "-c", f"from attnkit.classroom.grading.runner import main; main({kind!r})"]


def protection_summary(sandbox: bool, budgets: Budgets) -> str:
    cgroup = cgroup_problem()
    per_process = (f"no RLIMIT_AS (the steps use the GPU, and CUDA cannot start under an address-space cap), "
                   f"PyTorch's CUDA allocator capped at {budgets.gpu_memory_mib} MiB per process"
                   if budgets.uses_gpu else "RLIMIT_AS per process")
    caps = ("a cgroup v2 memory.max and pids.max per step" + (f"; {per_process}" if budgets.uses_gpu else "")
            if cgroup is None else
            f"no cgroup ({cgroup}): the grader sums the tree's resident memory and counts its processes "
            f"four times a second, with {per_process}" +
            (" and RLIMIT_NPROC as user nobody" if sandbox and drops_to_nobody() else
             " and RLIMIT_NPROC" if nproc_limit(budgets, sandbox) else
             " (RLIMIT_NPROC never limits root, and user nobody cannot read the course here)"))
    budgets_text = (f"budgets of {budgets.cell_timeout:g} s per cell and {budgets.notebook_timeout:g} s per "
                    f"step, {budgets.memory_mib} MiB and {budgets.processes} processes per process tree ({caps}), "
                    f"{budgets.staging_mib} MiB of working folder, {budgets.output_mib} MiB of output; the checks "
                    f"in a separate process that runs none of the notebook's code, on hidden cases")
    if sandbox:
        return (f"bubblewrap sandbox (package read-only, repository and solutions absent, no network, "
                f"{budgets.tmp_mib} MiB /tmp and the working folder in memory, nothing else writable); "
                f"{budgets_text}.")
    why = sandbox_problem() or "turned off (--no-sandbox)"
    return (f"NO SANDBOX ({why}): the student's code could read solutions/ and write to the repository, "
            f"the package and the reports, and leave processes behind; what remains: {budgets_text}.")


def grade(notebook: str | Path, lab: str | int, *, timeout: float = DEFAULT_TIMEOUT,
          notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT, memory_mib: int = DEFAULT_MEMORY_MIB,
          sandbox: bool | None = None, seed: int | None = None, kernel_name: str = "python3",
          max_notebook_mib: float = MAX_NOTEBOOK_MIB, **limits) -> Grade:
    """Grade ``notebook`` for lab ``lab`` (see the module's doc). ``limits``: the other fields of
    ``sandbox.Budgets`` (processes, tmp_mib, staging_mib, output_mib, keep_mib; gpu_memory_mib above 0: the
    steps use the GPU, with no address-space cap and that cap on each CUDA process's allocator).

    ``sandbox``: None uses bubblewrap when it works here, True requires it, False turns it off.
    Never raises for what is inside the notebook (errors, hangs, a dead kernel, unreadable JSON): those
    are graded. Raises ``ValueError`` for a path that is not a regular .ipynb file (a link, a folder, a
    FIFO, too large), an unknown lab or bad budgets.
    """
    budgets = Budgets(cell_timeout=timeout, notebook_timeout=notebook_timeout, memory_mib=memory_mib, **limits)
    lesson = find_lab(lab)
    module, exercises = lab_exercises(lesson)
    path = Path(notebook)
    if path.suffix != ".ipynb":
        raise ValueError(f"notebook: {str(notebook)!r} is not a Jupyter notebook (.ipynb)")
    try:
        data = safe_read(path, int(max_notebook_mib * 2**20))
    except UnsafeFile as exc:
        raise UnsafeFile(f"notebook: {exc}") from None
    if sandbox is None:
        sandbox = sandbox_problem() is None
    elif sandbox and sandbox_problem():
        raise ValueError(f"sandbox: {sandbox_problem()}")
    result = Grade(path, Path(lesson.lab).stem, exercises=exercises, protection=protection_summary(sandbox, budgets),
                   seed=secrets.randbelow(2**31) if seed is None else int(seed))
    started = time.monotonic()
    try:
        json.loads(data)
    except (ValueError, RecursionError) as exc:          # not JSON: still a (zero) grade
        result.problem = f"the notebook could not be read: {type(exc).__name__}: {one_line(exc, 200)}"
        result.results = _not_graded(exercises, "the notebook could not be read")
        return result
    pairs = None if getattr(module, "EXERCISES", None) else [(e.check, e.function) for e in exercises]
    spec = {"notebook": base64.b64encode(data).decode(), "cell_timeout": timeout, "kernel": kernel_name,
            "module": module.__name__, "pairs": pairs, "tools": course_tools(lesson), "keep_mib": budgets.keep_mib}
    with tempfile.TemporaryDirectory(prefix=f"attnkit-grade-{os.getpid()}-") as tmp:
        folders = [Path(tmp) / name for name in ("run", "student", "check")]
        for folder in folders:
            folder.mkdir()
        student_end, checker_end = socket.socketpair()
        with student_end, checker_end, ThreadPoolExecutor(3) as pool:
            running = pool.submit(run_budgeted, worker_argv("notebook"), budgets, sandbox=sandbox, spec=spec,
                                  workdir=folders[0])
            student = pool.submit(run_budgeted, worker_argv("student"), budgets, sandbox=sandbox, spec=spec,
                                  workdir=folders[1], calls_fd=os.dup(student_end.fileno()), env={ROLE: "student"})
            checker = pool.submit(run_budgeted, worker_argv("checker"), budgets, sandbox=sandbox, workdir=folders[2],
                                  spec={"module": module.__name__, "pairs": pairs, "seed": result.seed},
                                  calls_fd=os.dup(checker_end.fileno()), env=checker_env())
            student_end.close()
            checker_end.close()
            run, student, checker = running.result(), student.result(), checker.result()
    _record_run(result, run, budgets.keep_mib)
    _record_checks(result, exercises, student, checker)
    result.seconds = time.monotonic() - started
    return result


def checker_env() -> dict:
    """The checker runs no kernel of the student's: it is told that kernels are compiled
    (TRITON_INTERPRET=0), so that a check watches an interpreted kernel's loads and stores where the
    kernel ran, in the student's process, and nowhere else (as it does where kernels are compiled)."""
    return {ROLE: "checker", "TRITON_INTERPRET": "0"}


def _not_graded(exercises, reason: str) -> list[CheckResult]:
    return [CheckResult(e.name, FAILED, f"❌ {e.name}: not graded: {reason}") for e in exercises]


def _record_run(result: Grade, run: Run, keep_mib: float) -> None:
    """Step 1's executed copy, cells that raised and problems into ``result``."""
    import nbformat

    executed = next((f for f in run.frames if f.get("kind") == "executed"), None)
    status = next((f for f in run.frames if f.get("kind") == "status"), None)
    if executed is not None and isinstance(executed.get("notebook"), str):
        try:
            result.executed = nbformat.reads(executed["notebook"], as_version=4)
            result.errors = cell_errors(result.executed.cells)
        except Exception:  # noqa: BLE001 - not a notebook: nothing kept
            result.executed = None
    elif executed is not None and isinstance(executed.get("too_large"), int):
        result.notes.append(f"the executed notebook ({executed['too_large'] / 2**20:.1f} MiB) is larger than the "
                            f"{keep_mib:g} MiB kept: it is not in the reports")
    if run.stopped:
        result.problem = f"the notebook {run.stopped}: it was killed; the checks still ran"
    elif status is None or run.returncode != 0:
        tail = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
        result.problem = f"the notebook could not be run to the end ({one_line(tail, 200)})"
    elif isinstance(status.get("problem"), str):
        result.problem = f"the notebook's run stopped: {one_line(status['problem'], 300)}"


def _record_checks(result: Grade, exercises, student: Run, checker: Run) -> None:
    """The checker's verdicts, each also failed where the student's process failed its check."""
    names = [e.name for e in exercises]
    verdicts = {f.get("name"): f for f in student.frames if f.get("kind") == "verdict"}
    problem = next((f.get("problem") for f in student.frames if f.get("kind") == "problem"), None)
    record, reason = read_record(checker, names)
    if reason:
        result.results = _not_graded(exercises, reason)
        result.problem = "; ".join(p for p in (result.problem, reason) if p)
        return
    if isinstance(problem, str):
        result.results = _not_graded(exercises, one_line(problem))
        result.problem = result.problem or one_line(problem)
        return
    why_stopped = f"the student's process {student.stopped}" if student.stopped else \
        "the student's process ended before this check finished"
    results = []
    for r in record:
        verdict = verdicts.get(r["name"])
        status, report = r["status"], r["report"]
        if status == PASSED:
            if verdict is None:
                status, report = FAILED, f"❌ {r['name']}: not graded: {why_stopped}."
            elif verdict.get("status") != PASSED:
                status = NOT_IMPLEMENTED if verdict.get("status") == NOT_IMPLEMENTED else FAILED
                report = (f"❌ {r['name']}: the check failed in the notebook's own process: "
                          f"{one_line(verdict.get('report'), 600)}")
        elif verdict is not None and verdict.get("status") == PASSED:
            result.notes.append(f"{r['name']} passed its check in the notebook's own process but not in the "
                                f"checker's: read the notebook")
        results.append(CheckResult(r["name"], status, report))
    result.results = results
    if student.stopped and not result.problem:
        result.problem = f"the checks stopped: the student's process {student.stopped}"


def read_record(checked: Run, names: list[str]) -> tuple[list | None, str | None]:
    """The checker's results, or why there are none: exactly one results frame, one result per
    exercise in order, each a passed/failed/not implemented status with a text report."""
    if checked.stopped:
        return None, f"the checks {checked.stopped}"
    frames = [f for f in checked.frames if f.get("kind") == "results"]
    results = frames[0].get("results") if len(frames) == 1 else None
    ok = isinstance(results, list) and [r.get("name") if isinstance(r, dict) else None for r in results] == names \
        and all(r.get("status") in (PASSED, FAILED, NOT_IMPLEMENTED) and isinstance(r.get("report"), str)
                for r in results)
    if not ok:
        tail = (checked.stderr.strip().splitlines() or [f"exit status {checked.returncode}"])[-1]
        return None, f"the checking process ended without a result ({one_line(tail, 200)})"
    return results, None
