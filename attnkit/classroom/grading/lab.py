"""The lab a grading is for: its lesson, its graded exercises and checks, and the course tools its
notebook hands to students."""
from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

from ..course import LESSONS, Lesson
from ..nbgrader import LAB_NUMBERS, check_module

# The labs whose checks run on the course's device (``attnkit.device.runtime().device``): Triton kernels
# and the course's device tensors. On a machine with a CUDA GPU, `make grade` lets their steps use it.
GPU_LABS = (4, 5, 6, 7, 8)


@dataclass(frozen=True)
class GradedExercise:
    """One graded exercise: the function the student defines and the check that judges it."""

    function: str                 # "softmax_rows"
    check: str                    # "check_softmax"
    points: int = 1
    depends: tuple[str, ...] = ()

    @property
    def call(self) -> str:
        return f"{self.check}({self.function})"

    @property
    def name(self) -> str:
        return self.function


def find_lab(lab: str | int) -> Lesson:
    """The lesson whose lab is meant by ``lab``: 1, "01", "lab01", "attention_by_hand" or a lab's path."""
    text = str(lab).strip()
    name = Path(text).name.removesuffix(".ipynb")
    match = re.fullmatch(r"(?:lab)?(\d{1,2})(?:_\w+)?", name)
    with_labs = [l for l in LESSONS if l.has_lab]
    for lesson in with_labs:
        if (match and int(match.group(1)) == lesson.number) or name == lesson.slug:
            return lesson
    known = ", ".join(f"{l.number:02d} ({l.slug})" for l in with_labs)
    raise ValueError(f"lab: {lab!r} names no lab of the course; the labs are {known}")


# ---------------------------------------------------------------------------------- the lab's exercises
def _accepts_seed(check) -> bool:
    try:
        params = inspect.signature(check).parameters
    except (TypeError, ValueError):
        return False
    return "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _code_cell_trees(nb):
    """The parsed syntax tree of each code cell of ``nb`` that parses (magics and typos are passed over)."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            try:
                yield ast.parse(cell.source)
            except SyntaxError:
                continue


def _check_cell_calls(module, notebook: Path) -> list[tuple[str, str]]:
    """(check name, function name) of each cell of a lab notebook that is one ``check_x(name)`` call."""
    import nbformat

    found = []
    for tree in _code_cell_trees(nbformat.read(notebook, as_version=4)):
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr) or \
                not isinstance(tree.body[0].value, ast.Call):
            continue
        call = tree.body[0].value
        func = call.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name.startswith("check_") and name not in ("check_lab", "check_all") and len(call.args) == 1 \
                and isinstance(call.args[0], ast.Name) and callable(getattr(module, name, None)):
            if (name, call.args[0].id) not in found:
                found.append((name, call.args[0].id))
    return found


def lab_checks(module, lesson: Lesson | None = None, root: Path | None = None, pairs=None) -> list:
    """The lab's exercises as ``attnkit.classroom.checking.Exercise`` objects, each check taking
    ``(student_fn, *, seed=None)``.

    Read from the module's ``EXERCISES`` (a tuple of ``Exercise``, or a mapping function name ->
    check); a lab module without ``EXERCISES`` is read from ``pairs`` ((check name, function name)
    pairs) or else from its lab notebook's ``check_x(name)`` cells.
    """
    from ..checking import Exercise

    def seeded(check):
        if _accepts_seed(check):
            return check

        def call(fn, *, seed=None):
            return check(fn)
        call.__name__ = getattr(check, "__name__", "check")
        return call

    exercises = getattr(module, "EXERCISES", None)
    if isinstance(exercises, dict):
        return [Exercise(function=f, check=seeded(c)) for f, c in exercises.items()]
    if exercises:
        return [e if _accepts_seed(e.check) else Exercise(e.function, seeded(e.check), e.depends, e.points)
                for e in exercises]
    if pairs is not None:
        return [Exercise(function=fn, check=seeded(getattr(module, check))) for check, fn in pairs]
    if lesson is None:
        raise ValueError(f"lab: {module.__name__} defines no EXERCISES")
    from ..notebooks import ROOT

    root = Path(root or ROOT)
    source = next((root / rel for rel in (lesson.lab, lesson.solution) if (root / rel).exists()), None)
    if source is None:
        raise ValueError(f"lab: {module.__name__} defines no EXERCISES and lab {lesson.number:02d} has "
                         f"no notebook to read its check cells from")
    return [Exercise(function=fn, check=seeded(getattr(module, check))) for check, fn in
            _check_cell_calls(module, source)]


def course_tools(lesson: Lesson, root: Path | None = None) -> list[tuple[str, str]]:
    """(module, name) of each ``from attnkit... import name`` in the lab notebook (or its solution):
    the course's functions a lab hands to students as tools, which their code may call."""
    import nbformat

    from ..notebooks import ROOT

    root = Path(root or ROOT)
    source = next((root / rel for rel in (lesson.lab, lesson.solution) if (root / rel).exists()), None)
    if source is None:
        return []
    tools = []
    for tree in _code_cell_trees(nbformat.read(source, as_version=4)):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("attnkit"):
                tools += [(node.module, alias.name) for alias in node.names if alias.name != "*"]
    return list(dict.fromkeys(tools))


def lab_exercises(lesson: Lesson) -> tuple[object, list[GradedExercise]]:
    """The lab's check module and its graded exercises."""
    module_name = f"attnkit.classroom.labchecks.lab{lesson.number:02d}"
    if lesson.number not in LAB_NUMBERS:
        raise ValueError(f"lab: lab {lesson.number:02d} has no checks yet ({module_name} does not exist)")
    module = check_module(lesson.number)
    exercises = [GradedExercise(e.function, getattr(e.check, "__name__", "check").lstrip("_"), int(e.points),
                                tuple(e.depends)) for e in lab_checks(module, lesson)]
    if not exercises:
        raise ValueError(f"lab: {module_name} names no exercise (EXERCISES, or check cells in its lab)")
    return module, exercises


