"""Grade students' lab notebooks: run each one, apply the lab's checks, write a summary and JUnit XML.

    python -m attnkit.classroom.grading --lab 01 submissions/*.ipynb [--out build/grades] [--strict]
    make grade LAB=01 NOTEBOOK=path/to/student_lab.ipynb

The exercises are the lab's check cells: each cell of ``labs/labNN_*.ipynb`` that calls one
``check_*`` function of ``attnkit.labs.labNN`` (``check_scores(scores)``) is one exercise. For each
student notebook the grader starts a fresh kernel in the notebook's folder and runs every cell top to
bottom (a cell that raises is recorded and the run goes on); then, in the same kernel, it makes each
of those calls again, with the check imported afresh from the package, on the notebook's own
definitions. So a notebook is graded on the code it contains, whatever its stored outputs say and
whether or not its check cells were run. Each exercise is graded in its own cell, so one that hangs
costs only itself (it is interrupted after ``--timeout`` seconds).

Written to the output folder, per notebook ``<name>``:
    <name>.summary.txt   the reports students see, the score, and the cells that raised
    <name>.junit.xml     one test case per exercise plus "notebook runs without errors"
    <name>.ipynb         the notebook as executed by the grader (outputs and errors included)
and ``grades.csv`` with one row per notebook graded in that run.

The grader runs the students' code with your permissions: grade in an account or container that
holds nothing a student should reach.
"""
from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import json
import re
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from .checking import FAILED, NOT_IMPLEMENTED, PASSED, CheckResult
from .course import LESSONS, Lesson

MARKER = "<<attnkit-grade>>"
DEFAULT_TIMEOUT = 600          # seconds per cell: the Triton interpreter is slow on a CPU
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class CellError:
    cell: int          # the code cell's number in the notebook, counting code cells from 1
    first_line: str    # the cell's first line of code, to find it by
    ename: str
    evalue: str
    traceback: str

    def line(self) -> str:
        return f"code cell {self.cell} ({self.first_line}) raised {self.ename}: {self.evalue}"


@dataclass
class Grade:
    """The result of grading one notebook."""

    notebook: Path
    lab: str                                   # e.g. "lab01_attention_by_hand"
    results: list[CheckResult] = field(default_factory=list)    # one per exercise, in order
    exercises: list[Exercise] = field(default_factory=list)
    errors: list[CellError] = field(default_factory=list)
    problem: str | None = None                 # why the notebook could not be run at all
    seconds: float = 0.0
    executed: object = field(default=None, repr=False)   # the notebook as the grader ran it
    report_name: str = ""                      # file name stem of its reports (set by write_reports)

    @property
    def score(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def total(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> bool:
        return self.problem is None and self.total > 0 and self.score == self.total

    def summary(self) -> str:
        lines = [f"{self.lab} · {self.notebook}"]
        if self.problem:
            lines.append(f"⚠️ {self.problem}")
        lines += [r.report for r in self.results]
        lines.append(f"Score: {self.score} of {self.total} exercises pass.")
        if self.errors:
            lines.append("Cells that raised while the notebook ran top to bottom:")
            lines += [f"   {e.line()}" for e in self.errors]
        elif not self.problem:
            lines.append("The notebook ran top to bottom without an error.")
        return "\n".join(lines)


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


@dataclass(frozen=True)
class Exercise:
    """One check cell of the lab, e.g. ``check_scores(scores)``: a check of ``attnkit.labs.labNN``
    called on names the student's notebook defines (and constant keyword arguments)."""

    check: str                                 # "check_scores"
    args: tuple[str, ...]                      # ("scores",)
    kwargs: tuple[tuple[str, object], ...] = ()

    @property
    def call(self) -> str:
        parts = list(self.args) + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"{self.check}({', '.join(parts)})"

    @property
    def name(self) -> str:
        """What the reports call it before the check has run: the student's first name in the call."""
        return self.args[0] if self.args else self.check


def _check_call(source: str, module):
    """The Exercise of a cell whose only statement calls a check of ``module``; None for other cells."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr) or not isinstance(tree.body[0].value, ast.Call):
        return None
    call = tree.body[0].value
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if not name or not name.startswith("check_") or not callable(getattr(module, name, None)):
        return None
    if not all(isinstance(a, ast.Name) for a in call.args) or \
            not all(k.arg and isinstance(k.value, ast.Constant) for k in call.keywords):
        return None
    return Exercise(name, tuple(a.id for a in call.args), tuple((k.arg, k.value.value) for k in call.keywords))


def lab_exercises(lesson: Lesson, root: Path | None = None) -> tuple[object, list[Exercise]]:
    """The lab's check module and its graded exercises, read from the lab notebook's check cells.

    Each code cell that is a single call of a ``check_*`` function of ``attnkit.labs.labNN`` on names
    is one exercise. A summary cell (a call on several names that re-checks all the others, such as
    ``check_lab(...)``) is not counted twice.
    """
    import nbformat

    from .notebooks import ROOT

    root = Path(root or ROOT)
    module_name = f"attnkit.labs.lab{lesson.number:02d}"
    if importlib.util.find_spec(module_name) is None:
        raise ValueError(f"lab: lab {lesson.number:02d} has no checks yet ({module_name} does not exist)")
    module = importlib.import_module(module_name)
    source = next((root / rel for rel in (lesson.lab, lesson.solution) if (root / rel).exists()), None)
    if source is None:
        raise ValueError(f"lab: lab {lesson.number:02d} has no notebook yet ({lesson.lab})")
    nb = nbformat.read(source, as_version=4)
    calls = [e for c in nb.cells if c.cell_type == "code" for e in [_check_call(c.source, module)] if e]
    exercises = []
    for e in calls:
        others = {a for o in calls if o is not e for a in o.args}
        if len(e.args) > 1 and others and others <= set(e.args):
            continue                                    # the summary of the other checks
        if e not in exercises:
            exercises.append(e)
    if not exercises:
        raise ValueError(f"lab: {source.relative_to(root)} has no check cell (a cell calling one "
                         f"check_* function of {module_name})")
    return module, exercises


def grader_source(module_name: str, exercise: Exercise, timeout: int = DEFAULT_TIMEOUT) -> str:
    """A cell run in the student's kernel after their notebook: one check, its result as a JSON line.

    The check is imported afresh from the package (a notebook that redefines ``check_…`` changes
    nothing) and called on the notebook's own definitions.
    """
    return f"""
import importlib as __ak_importlib, json as __ak_json
def __ak_grade():
    name, call, timeout = {exercise.name!r}, {exercise.call!r}, {timeout!r}
    check = getattr(__ak_importlib.import_module({module_name!r}), {exercise.check!r})
    missing = [a for a in {exercise.args!r} if a not in globals()]
    if missing:
        return dict(name=name, status={FAILED!r}, report=(
            f"❌ {{name}}: the notebook defines no `{{missing[0]}}` (was its cell run without an error, "
            f"and is it still called `{{missing[0]}}`?)"))
    try:
        result = check(*[globals()[a] for a in {exercise.args!r}], **dict({exercise.kwargs!r}))
    except KeyboardInterrupt:
        return dict(name=name, status={FAILED!r}, report=(
            f"❌ {{name}}: not graded: {{call}} ran past {{timeout}} s and was stopped"))
    except BaseException as exc:
        return dict(name=name, status={FAILED!r},
                    report=f"❌ {{name}}: {{call}} stopped: {{type(exc).__name__}}: {{exc}}")
    if not all(hasattr(result, a) for a in ("name", "status", "report")):
        return dict(name=name, status={FAILED!r}, report=f"❌ {{name}}: {{call}} returned no check result")
    return dict(name=result.name, status=result.status, report=result.report)
print({MARKER!r} + __ak_json.dumps(dict(__ak_grade(), call={exercise.call!r})))
""".strip()


def _text(output) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    return output.get("data", {}).get("text/plain", "")


def _cell_errors(cells) -> list[CellError]:
    errors = []
    code = [c for c in cells if c.cell_type == "code"]
    for number, cell in enumerate(code, start=1):
        lines = [l for l in cell.source.splitlines() if l.strip() and not l.lstrip().startswith("#")]
        first = lines[0].strip() if lines else ""
        first = first if len(first) <= 60 else first[:57] + "..."
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                tb = ANSI.sub("", "\n".join(out.get("traceback", [])))
                errors.append(CellError(number, first, out.get("ename", "Error"), out.get("evalue", ""), tb))
    return errors


def grade(notebook: str | Path, lab: str | int, *, timeout: int = DEFAULT_TIMEOUT,
          kernel_name: str = "python3") -> Grade:
    """Run ``notebook`` in a fresh kernel and apply lab ``lab``'s checks to the functions it defines.

    Never raises for what is inside the notebook (errors, hangs, a dead kernel, unreadable JSON): those
    are graded. Raises ``ValueError`` for a missing file or an unknown lab.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    lesson = find_lab(lab)
    module, exercises = lab_exercises(lesson)
    path = Path(notebook)
    if not path.is_file():
        raise ValueError(f"notebook: {str(notebook)!r} is not a file")
    if path.suffix != ".ipynb":
        raise ValueError(f"notebook: {str(notebook)!r} is not a Jupyter notebook (.ipynb)")
    lab_name = Path(lesson.lab).stem
    result = Grade(path, lab_name)
    started = time.monotonic()
    result.exercises = exercises

    def not_graded(reason: str) -> list[CheckResult]:
        return [CheckResult(e.name, FAILED, f"❌ {e.name}: not graded: {reason}") for e in exercises]

    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # not JSON, not a notebook: still a (zero) grade
        result.problem = f"the notebook could not be read: {type(exc).__name__}: {exc}"
        result.results = not_graded("the notebook could not be read")
        result.seconds = time.monotonic() - started
        return result
    student_cells = len(nb.cells)
    import nbformat.v4 as v4
    for exercise in exercises:
        nb.cells.append(v4.new_code_cell(grader_source(module.__name__, exercise, timeout)))
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True,
                            interrupt_on_timeout=True,
                            resources={"metadata": {"path": str(path.resolve().parent)}})
    try:
        client.execute()
    except DeadKernelError as exc:
        result.problem = f"the kernel died while the notebook ran ({exc}); the grade covers what ran before"
    except CellTimeoutError as exc:
        result.problem = f"a cell ran past {timeout} s and could not be interrupted ({exc})"
    except Exception as exc:  # the kernel could not start, or a message was malformed
        result.problem = f"the notebook could not be run: {type(exc).__name__}: {exc}"
    executed = client.nb
    for cell, exercise in zip(executed.cells[student_cells:], exercises):
        found = None
        for out in cell.get("outputs", []):
            for line in _text(out).splitlines():
                if line.startswith(MARKER):
                    data = json.loads(line[len(MARKER):])
                    found = CheckResult(data["name"], data["status"], data["report"])
        if found is None:
            timed_out = any(o.get("ename") == "KeyboardInterrupt" for o in cell.get("outputs", []))
            reason = (f"{exercise.call} ran past {timeout} s and was stopped" if timed_out
                      else result.problem or f"{exercise.call} produced no result")
            found = CheckResult(exercise.name, FAILED, f"❌ {exercise.name}: not graded: {reason}")
        result.results.append(found)
    result.errors = _cell_errors(executed.cells[:student_cells])
    del executed.cells[student_cells:]
    result.executed = executed
    result.seconds = time.monotonic() - started
    return result


def junit_xml(grades: list[Grade]) -> ET.ElementTree:
    """JUnit XML: a test suite per notebook, a test case per exercise (named by its check call) and
    one for running cleanly."""
    suites = ET.Element("testsuites", name="attnkit grading")
    for g in grades:
        classname = f"{g.lab}.{g.report_name or g.notebook.stem}"
        suite = ET.SubElement(suites, "testsuite", name=classname, time=f"{g.seconds:.2f}")
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="notebook", value=str(g.notebook))
        ET.SubElement(props, "property", name="score", value=f"{g.score}/{g.total}")
        failures = 0
        for exercise, r in zip(g.exercises, g.results):
            case = ET.SubElement(suite, "testcase", classname=classname, name=exercise.call)
            if r.status != PASSED:
                failures += 1
                message = "not implemented yet" if r.status == NOT_IMPLEMENTED else r.report.splitlines()[0]
                failure = ET.SubElement(case, "failure", type=r.status, message=message)
                failure.text = r.report
        case = ET.SubElement(suite, "testcase", classname=classname, name="notebook runs without errors")
        if g.errors or g.problem:
            failures += 1
            first = g.problem or g.errors[0].line()
            failure = ET.SubElement(case, "failure", type="error", message=first)
            failure.text = "\n\n".join(([g.problem] if g.problem else []) + [e.traceback or e.line()
                                                                            for e in g.errors])
        suite.set("tests", str(len(g.results) + 1))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
        suite.set("skipped", "0")
        ET.SubElement(suite, "system-out").text = g.summary()
    suites.set("tests", str(sum(int(s.get("tests")) for s in suites)))
    suites.set("failures", str(sum(int(s.get("failures")) for s in suites)))
    tree = ET.ElementTree(suites)
    ET.indent(tree)
    return tree


def report_names(paths: list[Path]) -> list[str]:
    """A distinct report name per notebook: its file name, with parent folders added where two clash
    (submissions/alice/lab01.ipynb and submissions/bob/lab01.ipynb -> alice__lab01, bob__lab01)."""
    parts = [Path(p).resolve().with_suffix("").parts for p in paths]
    depth = [1] * len(paths)
    while True:
        names = ["__".join(pp[-d:]) for pp, d in zip(parts, depth)]
        clashes = {n for n in names if names.count(n) > 1}
        if not clashes:
            return names
        grown = False
        for i, n in enumerate(names):
            if n in clashes and depth[i] < len(parts[i]):
                depth[i] += 1
                grown = True
        if not grown:           # the same file given twice
            return [f"{n}_{i}" if n in clashes else n for i, n in enumerate(names)]


def write_reports(grades: list[Grade], out: str | Path) -> Path:
    """Write each notebook's summary, JUnit XML and executed copy, and ``grades.csv``, into ``out``."""
    import nbformat

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for g, stem in zip(grades, report_names([g.notebook for g in grades])):
        g.report_name = stem
        (out / f"{stem}.summary.txt").write_text(g.summary() + "\n", encoding="utf-8")
        junit_xml([g]).write(out / f"{stem}.junit.xml", encoding="utf-8", xml_declaration=True)
        if g.executed is not None and g.notebook.resolve() != (out / f"{stem}.ipynb").resolve():
            nbformat.write(g.executed, out / f"{stem}.ipynb")
    names = [e.call for e in grades[0].exercises] if grades else []
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["notebook", "report", "lab", "score", "total", "cells_that_raised", *names])
        for g in grades:
            status = {e.call: r.status for e, r in zip(g.exercises, g.results)}
            writer.writerow([str(g.notebook), g.report_name, g.lab, g.score, g.total, len(g.errors),
                             *[status.get(n, "") for n in names]])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.grading",
                                     description="Grade students' lab notebooks with the lab's checks.")
    parser.add_argument("--lab", required=True, help="which lab: 01, lab01, or the lab's file name")
    parser.add_argument("notebooks", nargs="+", help="the students' notebooks (.ipynb)")
    parser.add_argument("--out", default="build/grades", help="report folder (default: build/grades)")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT, help="seconds per cell")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 unless every exercise of every notebook passes")
    args = parser.parse_args(argv)
    try:
        find_lab(args.lab)
        for nb in args.notebooks:
            if not Path(nb).is_file():
                raise ValueError(f"notebook: {nb!r} is not a file")
        out = Path(args.out)
        grades = []
        for nb in args.notebooks:
            print(f"grading {nb} ...", flush=True)
            grades.append(grade(nb, args.lab, timeout=args.timeout))
    except ValueError as exc:
        parser.error(str(exc))
    write_reports(grades, out)
    for g in grades:
        print(g.summary())
        print(f"   reports: {out / (g.report_name + '.summary.txt')}, {out / (g.report_name + '.junit.xml')}")
    print(f"grades: {out / 'grades.csv'}")
    return 1 if args.strict and not all(g.passed for g in grades) else 0


if __name__ == "__main__":
    sys.exit(main())
