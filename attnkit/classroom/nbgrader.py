"""A lab's cells marked for nbgrader (the metadata its release, collect and autograde steps read, cell
metadata schema 3), and each lab's check module.

    check_module(9)                  -> attnkit.classroom.labchecks.lab09 (a static import: the graph shows it)
    add_nbgrader_metadata(nb, lab=9) -> cells marked: solutions, graded check cells, read-only cells
"""
from __future__ import annotations

import ast
import re

LAB_NUMBERS = tuple(range(1, 11))          # the labs that have a check module in attnkit/classroom/labchecks/


def check_module(lab: int):
    """The check module of lab ``lab`` (1 to 10); ValueError naming ``lab`` for any other number. Every
    module is imported by name here, so reading the imports shows where grading and labgen get them."""
    if isinstance(lab, bool) or not isinstance(lab, int) or lab not in LAB_NUMBERS:
        raise ValueError(f"lab: expected a lab number from 1 to 10 (a module of attnkit/classroom/labchecks), "
                         f"got {lab!r}")
    # Only the lab asked for is imported: a grading process of lab 01 must not load Triton for lab 04's checks
    # (a heavier process, and every forked child of the student's code counts it again in the memory budget).
    match lab:
        case 1:
            from .labchecks import lab01 as module
        case 2:
            from .labchecks import lab02 as module
        case 3:
            from .labchecks import lab03 as module
        case 4:
            from .labchecks import lab04 as module
        case 5:
            from .labchecks import lab05 as module
        case 6:
            from .labchecks import lab06 as module
        case 7:
            from .labchecks import lab07 as module
        case 8:
            from .labchecks import lab08 as module
        case 9:
            from .labchecks import lab09 as module
        case 10:
            from .labchecks import lab10 as module
    return module


NBGRADER_SCHEMA = 3


def nbgrader_metadata(cell, *, grade_id: str, points: float | None = None, locked: bool = False) -> dict | None:
    """The ``nbgrader`` metadata for one lab cell, or None for a cell nbgrader may leave alone.

    A code cell holding a solution region (``### BEGIN SOLUTION``) or its blank (``raise
    NotImplementedError``) is a *solution* cell; a code cell given ``points`` is an *autograded test*
    cell (locked, graded); one given ``locked=True`` is a *read-only* cell; every other cell is neither.
    """
    if not isinstance(grade_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", grade_id):
        raise ValueError(f"grade_id: must be a non-empty string of letters, digits, '_' and '-', got {grade_id!r}")
    if points is not None and (isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0):
        raise ValueError(f"points: must be a number >= 0, got {points!r}")
    if cell.cell_type != "code":
        return None
    meta = {"schema_version": NBGRADER_SCHEMA, "grade_id": grade_id, "locked": False,
            "solution": False, "grade": False, "task": False}
    if "### BEGIN SOLUTION" in cell.source or "raise NotImplementedError" in cell.source:
        meta["solution"] = True
        if points is not None:
            raise ValueError("points: a solution cell carries no points; give them to its check cell")
        return meta
    if points is not None:
        meta.update(grade=True, locked=True, points=points)
        return meta
    if locked:
        meta["locked"] = True
        return meta
    return None


def add_nbgrader_metadata(nb, exercises=None, *, lab: int | None = None) -> int:
    """Mark a lab's (or solution's) cells for nbgrader; return how many cells were marked.

    ``exercises`` are the lab's ``Exercise`` objects (by default ``attnkit.classroom.labchecks.lab<NN>.EXERCISES``
    for ``lab=NN``): a code cell that calls ``check_lab`` gets their points added up, one that calls an
    exercise's check gets that exercise's points, any other check cell (a call of ``check_...``) one point.
    Where a lab checks each exercise in its own cell, its closing ``check_lab`` cell is read-only instead
    (graded once, not twice).
    """
    if exercises is None and lab is not None:
        try:
            exercises = getattr(check_module(lab), "EXERCISES", ()) if lab in LAB_NUMBERS else ()
        except ImportError:                    # a check module that needs what this machine lacks
            exercises = ()
    if isinstance(exercises, dict):
        exercises = exercises.values()
    points_of = {}
    for e in exercises or ():
        name = getattr(getattr(e, "check", None), "__name__", "")
        if name:
            points_of[name] = points_of[name.lstrip("_")] = getattr(e, "points", 1)
    total = sum(getattr(e, "points", 1) for e in (exercises or ()) if hasattr(e, "check"))
    def calls_in(cell):
        return {n.func.id if isinstance(n.func, ast.Name) else n.func.attr
                for n in ast.walk(_parse(cell.source)) if isinstance(n, ast.Call)
                and isinstance(n.func, (ast.Name, ast.Attribute))}

    def is_solution(cell):
        return "### BEGIN SOLUTION" in cell.source or "raise NotImplementedError" in cell.source

    code = [(i, c, calls_in(c)) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    per_exercise = any(not is_solution(c) and "check_lab" not in calls
                       and any(n.startswith("check_") for n in calls) for _, c, calls in code)
    marked = 0
    for index, cell, calls in code:
        points, locked = None, False
        if not is_solution(cell) and "check_lab" in calls:
            if per_exercise:
                locked = True
            else:
                points = total or 1
        elif not is_solution(cell) and any(c.startswith("check_") for c in calls):
            points = sum(points_of.get(c, 1) for c in calls if c.startswith("check_"))
        kind = "exercise" if is_solution(cell) else "check"
        meta = nbgrader_metadata(cell, grade_id=f"{kind}-{index:02d}", points=points, locked=locked)
        if meta is None:
            cell.metadata.pop("nbgrader", None)
            continue
        cell.metadata["nbgrader"] = meta
        marked += 1
    return marked


def _parse(source: str):
    lines = [l for l in source.split("\n") if not l.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])
