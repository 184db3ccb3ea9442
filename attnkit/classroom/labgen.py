"""Make the student labs from the solved notebooks.

In a solution's code cells, everything between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is
replaced by ``raise NotImplementedError`` at the same indentation (nbgrader's convention); outputs
and execution counts are cleared; the Colab badge is pointed at the lab.

    python -m attnkit.classroom.labgen            # write labs/ (never over a lab a student has edited)
    python -m attnkit.classroom.labgen --force    # overwrite edited labs too, keeping each as a backup
    python -m attnkit.classroom.labgen --check    # exit 1 when labs/ differs from a fresh generation
                                                  # or a lab holds a line of its solution

A solution must never reach a lab. A line that looks like a marker but is not one exactly
(``## BEGIN SOLUTION``, ``### begin solution``, ``### END SOLUTION here``) is an error, as is an
unbalanced marker, and so is any line of a marked region found in the lab (unless the solution has the
same line outside its regions too). Errors name the notebook, the code cell and the line; the other
labs are still made, and the exit status is 1.

Each generated lab records a fingerprint of its own cells in its metadata; a lab whose cells no
longer match its fingerprint has been edited by someone and is left alone unless forced, and then it
is kept beside the new one as ``labNN_slug.ipynb.bak-YYYYmmdd-HHMMSS``.
"""
from __future__ import annotations

import argparse
import copy
import re
import shutil
import sys
import time
from pathlib import Path

from .course import LESSONS
from .notebooks import FINGERPRINT_KEY, ROOT, badge_line, fingerprint, normalize

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
PLACEHOLDER = "raise NotImplementedError"
# Anything a reader would take for a marker: any number of '#', any case, anything after it.
MARKER_LIKE = re.compile(r"^\s*#+\s*(BEGIN|END)[\s_-]*SOLUTIONS?\b", re.IGNORECASE)
SHORTEST_LEAK = 12      # shorter region lines (`return out`, `pass`) may well be written by a student


class LabError(ValueError):
    """A solution notebook that would leak its solution into its lab, or has unbalanced markers."""


def clear_solutions(source: str) -> str:
    """Replace each marked region (markers included) with one ``raise NotImplementedError``.

    Raises ``ValueError`` naming the line for an unbalanced marker, and for a line that looks like a
    marker without being one exactly (it would copy the solution into the lab)."""
    out, inside = [], False
    for number, line in enumerate(source.split("\n"), start=1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"source: line {number}: '{BEGIN}' inside a region already open (nested)")
            inside = True
            out.append(line[: len(line) - len(line.lstrip())] + PLACEHOLDER)
        elif stripped == END:
            if not inside:
                raise ValueError(f"source: line {number}: '{END}' without '{BEGIN}' before it")
            inside = False
        elif MARKER_LIKE.match(line):
            raise ValueError(f"source: line {number}: {stripped!r} looks like a solution marker but is not "
                             f"exactly '{BEGIN}' or '{END}': the solution would be copied into the lab")
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"source: '{BEGIN}' without '{END}' (the region opened is never closed)")
    return "\n".join(out)


def solution_lines(source: str) -> tuple[list[str], list[str]]:
    """(lines inside marked regions, lines outside them), stripped, of one cell's source."""
    inside_lines, outside_lines, inside = [], [], False
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped == BEGIN:
            inside = True
        elif stripped == END:
            inside = False
        elif stripped:
            (inside_lines if inside else outside_lines).append(stripped)
    return inside_lines, outside_lines


def leaked_lines(solution, lab) -> list[tuple[int, str]]:
    """(code cell number in the lab, line) of each line of a marked region of ``solution`` that is in
    ``lab``; lines the solution also has outside its regions, and short ones, are not counted."""
    regions, elsewhere = set(), set()
    for cell in solution.cells:
        if cell.cell_type == "code":
            inside, outside = solution_lines(cell.source)
            regions.update(l for l in inside if len(l) >= SHORTEST_LEAK)
            elsewhere.update(outside)
    secret = regions - elsewhere
    leaks = []
    code = [c for c in lab.cells if c.cell_type == "code"]
    for number, cell in enumerate(code, start=1):
        for line in cell.source.split("\n"):
            if line.strip() in secret:
                leaks.append((number, line.strip()))
    return leaks


def _where(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def make_lab(solution_path: Path, lab_relpath: str):
    """The lab notebook (nbformat object) generated from a solution notebook.

    Raises ``LabError`` naming the solution notebook, its code cell and line where a marker is
    unbalanced or misspelled, or where a line of the solution would reach the lab."""
    import nbformat

    solution = nbformat.read(solution_path, as_version=4)
    nb = copy.deepcopy(solution)
    problems = []
    number = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            number += 1
            try:
                cell.source = clear_solutions(cell.source)
            except ValueError as exc:
                problems.append(f"{_where(solution_path)}: code cell {number}: {str(exc).removeprefix('source: ')}")
            cell.outputs, cell.execution_count = [], None
    for cell_number, line in leaked_lines(solution, nb):
        problems.append(f"{_where(solution_path)}: code cell {cell_number}: the solution's line {line!r} would be "
                        f"in {lab_relpath}")
    if problems:
        raise LabError("\n".join(problems))
    first = nb.cells[0]
    solution_badge = badge_line(_where(solution_path))
    first.source = first.source.replace(solution_badge, badge_line(lab_relpath))
    normalize(nb)
    nb.metadata[FINGERPRINT_KEY] = fingerprint(nb)
    return nb


def lab_pairs():
    for lesson in LESSONS:
        if lesson.has_lab and (ROOT / lesson.solution).exists():
            yield ROOT / lesson.solution, lesson.lab


def was_edited(lab_path: Path) -> bool:
    import nbformat

    nb = nbformat.read(lab_path, as_version=4)
    recorded = nb.metadata.get(FINGERPRINT_KEY)
    return recorded is None or recorded != fingerprint(nb)


def backup(lab_path: Path) -> Path:
    """Copy ``lab_path`` to ``<name>.bak-YYYYmmdd-HHMMSS`` beside it (never over an earlier backup)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = lab_path.with_name(f"{lab_path.name}.bak-{stamp}")
    n = 1
    while target.exists():
        target = lab_path.with_name(f"{lab_path.name}.bak-{stamp}-{n}")
        n += 1
    shutil.copy2(lab_path, target)
    return target


def main(argv=None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.labgen")
    parser.add_argument("--force", action="store_true",
                        help="overwrite labs that were edited (each kept as <lab>.bak-<time>)")
    parser.add_argument("--check", action="store_true",
                        help="fail when labs/ is out of date or a lab holds a line of its solution")
    args = parser.parse_args(argv)
    stale = errors = 0
    for solution, lab_rel in lab_pairs():
        lab_path = ROOT / lab_rel
        current = lab_path.read_text() if lab_path.exists() else None
        if current is not None and args.check:
            try:
                leaks = leaked_lines(nbformat.read(solution, as_version=4), nbformat.reads(current, as_version=4))
            except Exception as exc:  # noqa: BLE001 - an unreadable lab is an error of its own
                leaks, errors = [], errors + 1
                print(f"error: {lab_rel}: cannot be read ({type(exc).__name__}: {exc})")
            for cell_number, line in leaks:
                print(f"error: {lab_rel}: code cell {cell_number}: holds the solution's line {line!r}")
                errors += 1
        try:
            fresh = nbformat.writes(make_lab(solution, lab_rel)) + "\n"
        except LabError as exc:
            for line in str(exc).splitlines():
                print(f"error: {line}")
            print(f"error: {lab_rel} was not written")
            errors += 1
            continue
        if current == fresh:
            continue
        if args.check:
            print(f"{lab_rel} is out of date: run `make labs`")
            stale += 1
        elif current is not None and was_edited(lab_path) and not args.force:
            print(f"{lab_rel} was edited after it was generated: left alone (use --force to overwrite; "
                  f"the edited lab is then kept as a backup)")
        else:
            if current is not None and was_edited(lab_path):
                print(f"kept the edited {lab_rel} as {_where(backup(lab_path))}")
            lab_path.parent.mkdir(parents=True, exist_ok=True)
            lab_path.write_text(fresh)
            print(f"wrote {lab_rel}")
    return 1 if stale or errors else 0


if __name__ == "__main__":
    sys.exit(main())
