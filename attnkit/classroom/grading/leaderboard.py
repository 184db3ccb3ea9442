"""A kernel leaderboard for the GPU labs (04, 05, 06, 08): each student kernel that passes every check
of its exercise is timed beside the course's kernel and PyTorch's (cuDNN's attention where the
operation has one), on fixed shapes, and ranked by the ratio of the times. A timing is never part of a
grade: the grades are the checks' alone, and the leaderboard's columns say "not graded".

    python -m attnkit.classroom.grading leaderboard [--lab 05] [--out DIR] a.ipynb b.ipynb ...
    make leaderboard NOTEBOOK="solutions/lab05_flash_attention.ipynb subs/*/lab05*.ipynb" [OUT=DIR]

Steps (each notebook's lab is ``--lab`` or read from its file name, ``labNN_...``):

1. Every notebook is graded as ``make grade`` grades it (``pipeline.grade``: three processes, sandboxed
   where bubblewrap works, on budgets), several at a time.
2. A kernel is timed only when every exercise of each function it uses passed (``timing.Timed``).
   Its notebook's code is loaded again in a timing worker (``timing``), a process the grader starts in
   the same isolation and on the same budgets as its other workers, never in the grader's process. There
   the student's kernel is checked once more at the timed shape, then timed in turns with the course's
   kernel and the library's call (median of ``repeats`` medians). All workers of a batch prepare at once
   (load, compile, check) and then time one at a time, so that no other worker uses the GPU meanwhile.
3. One more worker per lab loads no notebook: the clean baselines. A row whose course or library time,
   measured in the student's process, differs from the clean one by more than ``DISTURBED`` times is
   not ranked (the notebook's process may have slowed its baselines down), nor is a student time below
   ``IMPLAUSIBLE`` times the fastest clean baseline that does the same work in one kernel (the course's,
   and cuDNN's; not PyTorch's unfused ops of lab 04), or below ``IMPLAUSIBLE`` times its floor: the bytes
   it must read and write once at the GPU's copy bandwidth (lab 04, measured by the clean worker).
4. Written to ``--out``: ``grades/<lab>/`` (the grader's reports; ``grades.csv`` with one more column
   per ratio, named "(not graded)", after its own columns), ``bench_leaderboard.csv`` (one row per timed
   kernel: rank within its lab and kernel, student, the times and ratios, the GPU, date and versions)
   and ``leaderboard.md`` (the page the course's site shows, ``page_markdown``).

The board is refused (``LeaderboardRefused``: nothing but the grades is written, and a board already in
``--out`` is removed) when it could not mean anything: with the cuda clock, when a process on the grading
steps' caps does not reach the GPU; and for each lab on the board, when the course's own solution (always
graded with the others: added when not given) does not pass every check, or its kernels, or the clean
baselines, are not timed. A step that uses the GPU has no address-space cap (CUDA cannot start under
one): its memory is held by the resident size of its process tree and a cap on each CUDA process's
allocator (``sandbox``).

The timing worker runs the student's code: that code can change anything in its own process,
including what it reports. That is why a timing is shown, never graded, and why the checks above exist.
"""
from __future__ import annotations

import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..course import Lesson
from .lab import find_lab
from .leaderboard_files import (  # noqa: F401  (the board's files: names used here and by tests)
    CSV_NAME,
    FIELDS,
    NOT_GRADED,
    PAGE_NAME,
    add_grade_columns,
    note_text,
    page_markdown,
    ratio_text,
    read_rows,
    write_csv,
)
from .pipeline import DEFAULT_GPU_MEMORY_MIB, DEFAULT_NOTEBOOK_TIMEOUT, DEFAULT_TIMEOUT, grade, protection_summary
from .reports import Grade, one_line, report_names, write_reports
from .sandbox import PACKAGE_DIR, Budgets, sandbox_problem
from .timing_runs import TimingJob, grading_reaches_gpu, run_timing_jobs

DEFAULT_MEMORY_MIB = 8192        # a process tree's resident memory: torch, CUDA and Triton in one process
DEFAULT_REPEATS = 5
DISTURBED = 1.5                  # in-process baseline / clean baseline (or its inverse) above this: not ranked
IMPLAUSIBLE = 0.5                # student time / fastest clean fused baseline (or floor) below this: not ranked


@dataclass
class Entry:
    """One notebook on the leaderboard: its grade and what was timed."""

    notebook: Path
    lesson: Lesson
    grade: Grade | None = None
    student: str = ""
    skipped: str | None = None                       # why it was not graded
    gated: list = field(default_factory=list)        # the timed kernels whose checks all passed
    timing: dict = field(default_factory=dict)       # kernel name -> the worker's frame
    problem: str | None = None                       # why its timing worker gave nothing
    solution: bool = False                           # the course's own solution of its lab


class LeaderboardRefused(RuntimeError):
    """The leaderboard would mean nothing (see the module's doc): no board was written."""


@dataclass
class Leaderboard:
    entries: list[Entry]
    rows: list[dict]
    out: Path
    clock: str
    problems: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- helpers
def course_solution(lesson: Lesson) -> Path | None:
    """The course's solution notebook of ``lesson``'s lab in this checkout, or None (an installed package
    has no solutions/)."""
    path = PACKAGE_DIR.parent / lesson.solution
    return path if path.is_file() else None


def _is_solution(path: Path, lesson: Lesson) -> bool:
    """Whether ``path`` is the course's solution of ``lesson``'s lab: that file, or a copy of it."""
    solution = course_solution(lesson)
    if solution is None:
        return False
    try:
        return Path(path).resolve() == solution.resolve() or Path(path).read_bytes() == solution.read_bytes()
    except OSError:
        return False


def _lab_of(path: Path, lab) -> Lesson:
    if lab is not None:
        return find_lab(lab)
    try:
        return find_lab(Path(path).name)
    except ValueError:
        raise ValueError(f"lab: {str(path)!r} does not say its lab in its file name (labNN_...): pass --lab") from None


def _gated(g: Grade, kernels) -> list:
    """The kernels of ``kernels`` whose every exercise, of every function they use, passed."""
    passed: dict[str, bool] = {}
    for e, r in zip(g.exercises, g.results):
        passed[e.function] = passed.get(e.function, True) and r.passed
    return [k for k in kernels if all(passed.get(f, False) for f in k.functions)]


def _ratio(a, b):
    return a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else None


def _number(value):
    """A finite positive float from a worker's frame, else None (nothing else is believed)."""
    if type(value) in (int, float) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def _samples(value) -> list[float]:
    if not isinstance(value, list):
        return []
    numbers = [_number(v) for v in value[:1000]]
    return [v for v in numbers if v is not None]


# ------------------------------------------------------------------------------------------- the rows
def _frames_by_item(frames) -> dict:
    return {f.get("item"): f for f in frames if f.get("kind") == "timing" and isinstance(f.get("item"), str)}


def build_rows(entries: list[Entry], baselines: dict, *, device: str, clock: str) -> list[dict]:
    """One row per timed kernel of a notebook (a kernel that was not timed gets none), ranked within its
    lab and kernel by its time over the course's (the library's where the course has no kernel)."""
    from .timing import timed_kernels

    kernels = timed_kernels()
    rows = []
    for e in entries:
        for kernel in e.gated:
            frame = e.timing.get(kernel.name)
            if not frame:
                continue
            ms = frame.get("ms") if isinstance(frame.get("ms"), dict) else {}
            student = _number(ms.get("student"))
            if student is None:
                continue                     # wrong at the timed shape, or its timing failed: no row
            course, library = _number(ms.get("course")), _number(ms.get("library"))
            clean = baselines.get(e.lesson.number, {}).get(kernel.name, {})
            failed = frame.get("notes") if isinstance(frame.get("notes"), dict) else {}
            info = [f"{role}: not timed ({one_line(failed[role], 200)})" for role in ("course", "library")
                    if isinstance(failed.get(role), str)]
            notes = []
            for role, inside in (("course", course), ("library", library)):
                outside = clean.get(role)
                if inside is not None and outside is not None and \
                        max(inside / outside, outside / inside) > DISTURBED:
                    notes.append(f"not ranked: the {role}'s time in this notebook's process is "
                                 f"{inside / outside:.2f}× its time in a clean process")
            notes += _implausible(student, clean, kernel)
            samples = _samples((frame.get("samples") or {}).get("student"))
            spread = 100 * (max(samples) - min(samples)) / student if samples else None
            lesson = e.lesson
            rows.append({
                "rank": None, "student": e.student, "lab": f"{lesson.number:02d}", "kernel": kernel.name,
                "shape": kernel.label("gpu" if device == "cuda" else "tiny"),
                "student_ms": student, "course_ms": course,
                "library": kernel.library_name(device), "library_ms": library,
                "vs_course": _ratio(student, course), "vs_library": _ratio(student, library),
                "spread_pct": spread, "repeats": len(samples), "note": "; ".join(notes + info), "_ranked": not notes,
                "sandboxed": "yes" if e.grade and e.grade.protection.startswith("bubblewrap") else "no",
                "clock": clock, "_order": [k.name for k in kernels[lesson.number]].index(kernel.name)})
    return rank(rows)


def _implausible(student: float, clean: dict, kernel) -> list[str]:
    """Why a student time cannot be believed, if it cannot: below ``IMPLAUSIBLE`` times the fastest clean
    baseline that does the same work in one kernel (the course's; the library's where it is fused), or
    below ``IMPLAUSIBLE`` times the kernel's floor (its bytes at the GPU's copy bandwidth)."""
    bounds = [clean.get("course")] + ([clean.get("library")] if kernel.fused_library else [])
    fastest = min([v for v in bounds if v is not None], default=None)
    if fastest is not None and student < IMPLAUSIBLE * fastest:
        return [f"not ranked: {student / fastest:.2f}× the fastest clean baseline is not plausible"]
    floor = clean.get("floor")
    if floor is not None and student < IMPLAUSIBLE * floor:
        return [f"not ranked: {student / floor:.2f}× the time to read its inputs and write its output once at "
                "the GPU's copy bandwidth is not plausible"]
    return []


def rank(rows: list[dict]) -> list[dict]:
    """``rows`` with ``rank`` set within each lab and kernel (1 = fastest), by the time over the course's
    kernel where every row of the group has that ratio, else over the library's, else by the time; a row
    marked not to be ranked (``_ranked`` False) is listed last, unranked. Sorted by lab, kernel, rank."""
    groups: dict = {}
    for row in rows:
        groups.setdefault((row["lab"], row.get("_order", 0), row["kernel"]), []).append(row)
    out = []
    for key in sorted(groups):
        group = groups[key]
        field_ = next((f for f in ("vs_course", "vs_library") if all(r[f] is not None for r in group)), "student_ms")

        def order(row, field_=field_):
            return (row[field_], row["student"])
        ranked = sorted((r for r in group if r.get("_ranked", True)), key=order)
        for i, row in enumerate(ranked, start=1):
            row["rank"] = i
        out += ranked + sorted((r for r in group if not r.get("_ranked", True)), key=order)
    for row in out:
        row.pop("_order", None)
        row.pop("_ranked", None)
    return out


# -------------------------------------------------------------------------------------------- the run
def run_leaderboard(notebooks, out, *, lab=None, clock: str = "cuda", size: str | None = None,
                    repeats: int = DEFAULT_REPEATS, jobs: int | None = None, sandbox: bool | None = None,
                    timeout: float = DEFAULT_TIMEOUT, notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT,
                    memory_mib: int = DEFAULT_MEMORY_MIB, gpu_memory_mib: int = DEFAULT_GPU_MEMORY_MIB,
                    seed: int | None = None, require_solution: bool = True, say=print) -> Leaderboard:
    """Grade ``notebooks``, time their passing kernels, write the leaderboard into ``out`` (see the
    module's doc). ``clock``: a name of ``timing.CLOCKS`` ("cuda" needs a CUDA GPU; "ops" counts the
    interpreter's operations, for tests). ``size``: the shapes, "gpu" or "tiny" (default: "gpu" for the
    cuda clock, "tiny" otherwise). ``jobs``: timing workers preparing at a time; half as many notebooks are
    graded at a time (default: the CPU count). ``gpu_memory_mib``: with the cuda clock, each CUDA process's
    allocator cap (the steps then have no address-space cap). ``require_solution``: grade the course's
    solution of each lab beside the notebooks (added when not given) and refuse the board unless it passes
    and is timed. Raises ``LeaderboardRefused`` (nothing but the grades written) when the board would mean
    nothing, ``ValueError`` for bad arguments."""
    from .timing import CLOCKS, timed_kernels

    entries, size, jobs = _checked(notebooks, lab, clock, size, repeats, jobs)
    uses_gpu = clock == "cuda"
    if uses_gpu and (not isinstance(gpu_memory_mib, int) or isinstance(gpu_memory_mib, bool) or gpu_memory_mib < 1):
        raise ValueError(f"gpu_memory_mib: the cuda clock needs a positive GPU memory cap in MiB, "
                         f"got {gpu_memory_mib!r}")
    if require_solution:
        _add_solutions(entries, say)
    if sandbox is None:
        sandbox = sandbox_problem() is None
    budgets = Budgets(cell_timeout=timeout, notebook_timeout=notebook_timeout, memory_mib=memory_mib,
                      gpu_memory_mib=gpu_memory_mib if uses_gpu else 0)
    device = "cuda" if uses_gpu else "cpu"
    kernels = timed_kernels()
    problems = []
    out = Path(out)
    if uses_gpu:
        reaches, why = grading_reaches_gpu(budgets, sandbox)
        if not reaches:
            _refuse(out, [], f"a process on the grading steps' caps does not reach the GPU "
                             f"({why or 'no CUDA device'}): the checks would run in Triton's interpreter, not "
                             f"on the GPU the kernels are timed on")
    _grade_entries(entries, kernels, max(1, jobs // 2), sandbox, say, timeout=timeout,
                   notebook_timeout=notebook_timeout, memory_mib=memory_mib, seed=seed,
                   gpu_memory_mib=budgets.gpu_memory_mib)
    failed = _failed_solutions(entries)
    if failed:
        _refuse(out, entries, "the course's own solution does not pass its checks, so the checks (or the "
                              "grader) are wrong here: " + "; ".join(failed))
    work = _timing_work(entries, kernels, dict(cell_timeout=timeout, clock=clock, size=size, repeats=repeats))
    if work:
        say(f"timing {len(work)} process(es), {jobs} preparing at a time, one timing at a time")
        run_timing_jobs(work, budgets, sandbox, jobs, {"TRITON_INTERPRET": "0" if uses_gpu else "1"}, say)
    baselines = _read_timings(work, entries, problems)
    rows = build_rows(entries, baselines, device=device, clock=CLOCKS[clock].describe)
    untimed = _untimed_solutions(entries, rows, work) if require_solution else []
    if untimed:
        _refuse(out, entries, "the course's own kernels were not all timed: " + "; ".join(untimed))
    _write_outputs(out, entries, rows, kernels, device)
    say(f"isolation of every step (grading and timing): {protection_summary(sandbox, budgets)}")
    return Leaderboard(entries, rows, out, clock, problems)


def _add_solutions(entries: list[Entry], say) -> None:
    """Mark the course's solutions among ``entries``, and add the solution of each lab that has none (a
    ``ValueError`` where this checkout has no solutions/ to add)."""
    for e in entries:
        e.solution = _is_solution(e.notebook, e.lesson)
    for lesson in sorted({e.lesson for e in entries}, key=lambda lesson: lesson.number):
        if any(e.solution for e in entries if e.lesson == lesson):
            continue
        solution = course_solution(lesson)
        if solution is None:
            raise ValueError(f"notebooks: the course's solution of lab {lesson.number:02d} ({lesson.solution}) is "
                             f"not here, and the leaderboard grades it beside the submissions (its checks must "
                             f"pass and its kernels be timed): pass its path")
        say(f"adding the course's solution {lesson.solution}: a board is published only if it passes and is timed")
        entries.append(Entry(solution, lesson, solution=True))


def _failed_solutions(entries: list[Entry]) -> list[str]:
    """For each course solution that did not pass every check: its name, score and why."""
    out = []
    for e in entries:
        if not e.solution:
            continue
        if e.grade is None:
            out.append(f"{e.notebook} was not graded ({e.skipped})")
            continue
        if e.grade.score == e.grade.total:
            continue
        why = [one_line(r.report, 300) for r in e.grade.results if not r.passed][:3]
        if e.grade.problem:
            why.insert(0, one_line(e.grade.problem, 300))
        out.append(f"{e.student or e.notebook}: {e.grade.score} of {e.grade.total} ({' / '.join(why)})")
    return out


def _untimed_solutions(entries: list[Entry], rows: list[dict], work: list[TimingJob]) -> list[str]:
    """What of the course's own timing is missing: a solution kernel with no time, a lab's clean baselines
    that failed."""
    out = []
    timed = {(r["student"], r["kernel"]) for r in rows}
    for e in entries:
        if not e.solution:
            continue
        for kernel in e.gated:
            if (e.student, kernel.name) not in timed:
                frame = e.timing.get(kernel.name) or {}
                out.append(f"{e.student}, {kernel.name}: "
                           f"{note_text(frame.get('notes')) or e.problem or 'no time came back'}")
    for job in work:
        if job.key[0] == "baseline" and job.problem:
            out.append(f"lab {job.key[1]:02d} baselines: {job.problem}")
    return out


def _refuse(out: Path, entries: list[Entry], reason: str):
    """Write the grades of ``entries`` (for the record), remove a board left in ``out`` by an earlier run,
    and raise ``LeaderboardRefused``."""
    for lesson_number in sorted({e.lesson.number for e in entries}):
        group = [e for e in entries if e.lesson.number == lesson_number]
        write_reports([e.grade for e in group if e.grade is not None], out / "grades" / Path(group[0].lesson.lab).stem,
                      [(str(e.notebook), e.skipped) for e in group if e.skipped])
    for name in (CSV_NAME, PAGE_NAME):
        try:
            (out / name).unlink()
        except FileNotFoundError:
            pass
    where = f" (the grades: {out / 'grades'})" if entries else ""
    raise LeaderboardRefused(f"no leaderboard was written: {reason}{where}")


def _checked(notebooks, lab, clock, size, repeats, jobs) -> tuple[list[Entry], str, int]:
    """Step 0: the arguments checked (a ValueError naming the argument), each notebook's entry, the shapes'
    size and the number of jobs."""
    from .timing import CLOCKS, TIMED_LABS

    if clock not in CLOCKS:
        raise ValueError(f"clock: expected one of {sorted(CLOCKS)}, got {clock!r}")
    size = size or ("gpu" if clock == "cuda" else "tiny")
    if size not in ("gpu", "tiny"):
        raise ValueError(f"size: expected 'gpu' or 'tiny', got {size!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats: must be a positive integer, got {repeats!r}")
    paths = [Path(p) for p in notebooks]
    if not paths:
        raise ValueError("notebooks: give at least one notebook")
    entries = [Entry(p, _lab_of(p, lab)) for p in paths]
    for e in entries:
        if e.lesson.number not in TIMED_LABS:
            raise ValueError(f"lab: lab {e.lesson.number:02d} has no kernel on the leaderboard (labs "
                             f"{', '.join(f'{n:02d}' for n in TIMED_LABS)} have)")
    if jobs is not None and (not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1):
        raise ValueError(f"jobs: must be a positive integer, got {jobs!r}")
    return entries, size, jobs or os.cpu_count() or 1


def _grade_entries(entries: list[Entry], kernels, grading_jobs: int, sandbox: bool, say, **limits) -> None:
    """Step 1: grade, ``grading_jobs`` notebooks at a time (a grading is three processes, mostly waiting on
    one another); each graded entry gets its report name and the kernels it may time."""
    say(f"grading {len(entries)} notebook(s), {grading_jobs} at a time; isolation: "
        f"{'bubblewrap' if sandbox else 'no sandbox (' + (sandbox_problem() or 'turned off') + ')'}")

    def graded(e: Entry):
        try:
            e.grade = grade(e.notebook, e.lesson.number, sandbox=sandbox, **limits)
        except ValueError as exc:
            e.skipped = one_line(exc)
        return e

    with ThreadPoolExecutor(grading_jobs) as pool:
        list(pool.map(graded, entries))
    done = [e for e in entries if e.grade is not None]
    for e, name in zip(done, report_names([e.notebook for e in done])):
        e.student = name
        e.gated = _gated(e.grade, kernels[e.lesson.number])
        say(f"   {name}: {e.grade.score} of {e.grade.total}; timed: {', '.join(k.name for k in e.gated) or 'none'}")


def _timing_work(entries: list[Entry], kernels, settings: dict) -> list[TimingJob]:
    """Step 2's jobs: one worker per notebook with a kernel to time, one clean worker per lab (no notebook:
    the baselines). ``settings``: the spec's cell_timeout, clock, size and repeats."""
    import base64

    from .lab import course_tools, lab_exercises
    from .sandbox import safe_read

    def spec(lesson, items, notebook=None, label=""):
        module, _ = lab_exercises(lesson)
        return {"notebook": None if notebook is None else base64.b64encode(notebook).decode(),
                "cell_timeout": settings["cell_timeout"], "module": module.__name__, "tools": course_tools(lesson),
                "lab": lesson.number, "items": items, "clock": settings["clock"], "size": settings["size"],
                "repeats": settings["repeats"], "label": label}

    work = []
    for i, e in enumerate(entries):
        if e.gated:
            data = safe_read(e.notebook, 20 * 2**20)
            work.append(TimingJob(("student", i), spec(e.lesson, [k.name for k in e.gated], data, e.student)))
    labs = {}
    for e in entries:
        if e.gated:
            labs.setdefault(e.lesson.number, (e.lesson, []))[1].extend(k.name for k in e.gated)
    for number, (lesson, names) in sorted(labs.items()):
        names = [k.name for k in kernels[number] if k.name in names]
        work.append(TimingJob(("baseline", number), spec(lesson, names, None, f"lab {number:02d} baselines")))
    return work


def _read_timings(work: list[TimingJob], entries: list[Entry], problems: list[str]) -> dict:
    """The jobs' frames: each entry's timing and problem; returns the clean baselines, {lab: {kernel:
    {"course": ms, "library": ms, "floor": ms or None}}}. A job's problem is added to ``problems``."""
    baselines: dict = {}
    for job in work:
        if job.key[0] == "baseline":
            baselines[job.key[1]] = {name: {r: _number((f.get("ms") or {}).get(r))
                                            for r in ("course", "library", "floor")}
                                     for name, f in _frames_by_item(job.frames).items()}
            if job.problem:
                problems.append(f"lab {job.key[1]:02d} baselines: {job.problem}")
        else:
            e = entries[job.key[1]]
            e.timing = _frames_by_item(job.frames)
            e.problem = job.problem
            if job.problem:
                problems.append(f"{e.student}: {job.problem}")
    return baselines


def _write_outputs(out: Path, entries: list[Entry], rows: list[dict], kernels, device: str) -> None:
    """Step 4: each lab's reports and grades.csv (with the ratios' columns), the CSV and the page."""
    from ...bench.recorder import provenance

    stamp = provenance()
    for lesson_number in sorted({e.lesson.number for e in entries}):
        group = [e for e in entries if e.lesson.number == lesson_number]
        graded_group = [e for e in group if e.grade is not None]
        folder = out / "grades" / Path(group[0].lesson.lab).stem
        write_reports([e.grade for e in graded_group], folder, [(str(e.notebook), e.skipped) for e in group
                                                                   if e.skipped])
        add_grade_columns(folder / "grades.csv", graded_group, rows, kernels[lesson_number], device)
    write_csv(rows, out / CSV_NAME, stamp)
    (out / PAGE_NAME).write_text(page_markdown(read_rows(out / CSV_NAME)), encoding="utf-8")


# ---------------------------------------------------------------------------------------- the command
def parser():
    import argparse

    p = argparse.ArgumentParser(prog="python -m attnkit.classroom.grading leaderboard",
                                description="Grade lab notebooks, then time the kernels that pass beside the "
                                            "course's and the library's (a CUDA GPU is needed). " + NOT_GRADED)
    p.add_argument("notebooks", nargs="+", help="the notebooks (.ipynb) of labs 04, 05, 06 or 08")
    p.add_argument("--lab", default=None, help="the lab of every notebook (default: read from each file name)")
    p.add_argument("--out", default=os.environ.get("OUT") or "build/leaderboard",
                   help="output folder (default: $OUT, else build/leaderboard)")
    p.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed turns of each call (median)")
    p.add_argument("--jobs", type=int, default=None,
                   help="timing workers preparing at a time; half as many notebooks are graded at a time "
                        "(default: the CPU count)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per cell, per step")
    p.add_argument("--notebook-timeout", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT, help="seconds per step")
    p.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MIB,
                   help="MiB of resident memory for a step's whole process tree")
    p.add_argument("--gpu-memory", type=int, default=DEFAULT_GPU_MEMORY_MIB,
                   help="MiB of GPU memory for each CUDA process of a step (its allocator's cap)")
    p.add_argument("--seed", type=int, default=None, help="the hidden cases' seed (default: a secret one)")
    p.add_argument("--no-sandbox", action="store_true", help="run without bubblewrap even where it works")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:
        print("the leaderboard needs a CUDA GPU: it times kernels, and there is none here. Nothing was written. "
              "(Grading alone runs anywhere: make grade.)", file=sys.stderr, flush=True)
        return 2
    problem = sandbox_problem()
    if problem and not args.no_sandbox:
        print(f"⚠️ grading and timing without a sandbox: {problem}", flush=True)
    started = time.monotonic()
    try:
        board = run_leaderboard(args.notebooks, args.out, lab=args.lab, repeats=args.repeats, jobs=args.jobs,
                                sandbox=False if args.no_sandbox else None, timeout=args.timeout,
                                notebook_timeout=args.notebook_timeout, memory_mib=args.memory,
                                gpu_memory_mib=args.gpu_memory, seed=args.seed,
                                say=lambda line: print(line, flush=True))
    except LeaderboardRefused as exc:
        print(f"❌ {exc}", file=sys.stderr, flush=True)
        return 1
    except ValueError as exc:
        p.error(str(exc))
    for row in board.rows:
        print(f"{row['rank'] or '–':>3} lab {row['lab']} {row['kernel']:24s} {row['student']:32s} "
              f"{row['student_ms']:9.4g} ms  ÷course {ratio_text(row['vs_course']):>7}  "
              f"÷library {ratio_text(row['vs_library']):>7}  {row['note']}")
    for line in board.problems:
        print(f"⚠️ {line}")
    print(f"leaderboard: {board.out / CSV_NAME}, {board.out / PAGE_NAME}; grades: {board.out / 'grades'} "
          f"({time.monotonic() - started:.0f} s)")
    return 0 if board.rows else 1


if __name__ == "__main__":
    sys.exit(main())
