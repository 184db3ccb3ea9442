"""What grading writes: the summary students see, JUnit XML, the executed copy and ``grades.csv``.

Every text that came from the notebook (exception messages, cell output, file names) is made plain
before it is written: control characters and terminal escapes shown as ``\\xNN`` (so the XML always
parses and a terminal shows what was there), the student's messages on one line (so nothing they print
can pose as a line of the report), CSV cells that a spreadsheet would read as a formula prefixed with
``'``.
"""
from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from ..checking import NOT_IMPLEMENTED, PASSED, CheckResult
from .lab import GradedExercise

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def plain(text, limit: int = 4000) -> str:
    """``text`` with terminal escapes removed, other control characters shown as ``\\xNN`` (newlines and
    tabs kept), cut to ``limit`` characters."""
    text = ANSI.sub("", str(text))
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else "\\ufffd", text)
    return text if len(text) <= limit else text[:limit] + " [...]"


def one_line(text, limit: int = 300) -> str:
    """``plain(text)`` on one line: what the notebook said, never a line of the report of its own."""
    return plain(text, limit).replace("\r", " ").replace("\n", " ⏎ ").replace("\t", " ")


def csv_cell(value):
    """A CSV cell a spreadsheet shows as text: a string that starts like a formula gets a ``'``."""
    if isinstance(value, str):
        value = one_line(value, 1000)
        return "'" + value if value.startswith(FORMULA_START) else value
    return value


@dataclass(frozen=True)
class CellError:
    cell: int          # the code cell's number in the notebook, counting code cells from 1
    first_line: str    # the cell's first line of code, to find it by
    ename: str
    evalue: str
    traceback: str

    def line(self) -> str:
        return f"code cell {self.cell} ({one_line(self.first_line, 60)}) raised {one_line(self.ename, 80)}: " \
               f"{one_line(self.evalue)}"


@dataclass
class Grade:
    """The result of grading one notebook."""

    notebook: Path
    lab: str                                   # e.g. "lab01_attention_by_hand"
    results: list[CheckResult] = field(default_factory=list)    # one per exercise, in order
    exercises: list[GradedExercise] = field(default_factory=list)
    errors: list[CellError] = field(default_factory=list)
    problem: str | None = None                 # why the notebook could not be run or checked fully
    notes: list[str] = field(default_factory=list)   # what the grader saw (for review)
    protection: str = ""                       # how the notebook was isolated
    seed: int | None = None                    # the secret seed of the hidden cases
    seconds: float = 0.0
    executed: object = field(default=None, repr=False)   # the notebook as step 1 ran it
    report_name: str = ""                      # file name stem of its reports (set by write_reports)

    @property
    def score(self) -> int:
        return sum(e.points for e, r in zip(self.exercises, self.results) if r.passed)

    @property
    def total(self) -> int:
        return sum(e.points for e in self.exercises)

    @property
    def passed(self) -> bool:
        return self.problem is None and self.total > 0 and self.score == self.total

    def summary(self) -> str:
        lines = [f"{self.lab} · {one_line(self.notebook)}"]
        if self.problem:
            lines.append(f"⚠️ {one_line(self.problem, 2000)}")
        lines += [plain(r.report) for r in self.results]
        points = not all(e.points == 1 for e in self.exercises)
        lines.append(f"Score: {self.score} of {self.total} points." if points
                     else f"Score: {self.score} of {self.total} exercises pass.")
        if self.errors:
            lines.append("Cells that raised while the notebook ran top to bottom:")
            lines += [f"   {e.line()}" for e in self.errors]
        elif not self.problem:
            lines.append("The notebook ran top to bottom without an error.")
        if self.notes:
            lines.append("For review:")
            lines += [f"   {one_line(n, 2000)}" for n in self.notes]
        if self.protection:
            lines.append(f"Isolation: {self.protection}")
        return "\n".join(lines)


def cell_errors(cells) -> list[CellError]:
    errors = []
    code = [c for c in cells if c.get("cell_type") == "code"]
    for number, cell in enumerate(code, start=1):
        source = cell.get("source", "")
        source = source if isinstance(source, str) else "".join(source)
        lines = [l for l in source.splitlines() if l.strip() and not l.lstrip().startswith("#")]
        first = lines[0].strip() if lines else ""
        first = first if len(first) <= 60 else first[:57] + "..."
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                tb = plain("\n".join(str(t) for t in out.get("traceback", [])), 20000)
                errors.append(CellError(number, first, str(out.get("ename", "Error")), str(out.get("evalue", "")), tb))
    return errors


def junit_xml(grades: list[Grade]) -> ET.ElementTree:
    """JUnit XML: a test suite per notebook, a test case per exercise (named by its check call) and
    one for running cleanly."""
    suites = ET.Element("testsuites", name="attnkit grading")
    for g in grades:
        classname = f"{g.lab}.{g.report_name or SAFE_NAME.sub('_', g.notebook.stem)}"
        suite = ET.SubElement(suites, "testsuite", name=classname, time=f"{g.seconds:.2f}")
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="notebook", value=one_line(g.notebook, 500))
        ET.SubElement(props, "property", name="score", value=f"{g.score}/{g.total}")
        ET.SubElement(props, "property", name="seed", value=str(g.seed))
        ET.SubElement(props, "property", name="isolation", value=plain(g.protection))
        failures = 0
        for exercise, r in zip(g.exercises, g.results):
            case = ET.SubElement(suite, "testcase", classname=classname, name=exercise.call)
            if r.status != PASSED:
                failures += 1
                message = "not implemented yet" if r.status == NOT_IMPLEMENTED else one_line(r.report.splitlines()[0])
                failure = ET.SubElement(case, "failure", type=r.status, message=message)
                failure.text = plain(r.report)
        case = ET.SubElement(suite, "testcase", classname=classname, name="notebook runs without errors")
        if g.errors or g.problem:
            failures += 1
            first = one_line(g.problem) if g.problem else g.errors[0].line()
            failure = ET.SubElement(case, "failure", type="error", message=first)
            failure.text = "\n\n".join(([plain(g.problem)] if g.problem else []) +
                                       [plain(e.traceback, 20000) or e.line() for e in g.errors])
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
    """A distinct report name per notebook: its file name (letters, digits, ``._-`` only), with parent
    folders added where two clash (submissions/alice/lab01.ipynb and submissions/bob/lab01.ipynb ->
    alice__lab01, bob__lab01)."""
    parts = [tuple(SAFE_NAME.sub("_", p) for p in Path(p).absolute().with_suffix("").parts) for p in paths]
    depth = [1] * len(paths)
    while True:
        names = ["__".join(pp[-d:]).lstrip(".-") or "notebook" for pp, d in zip(parts, depth)]
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


def write_reports(grades: list[Grade], out: str | Path, skipped: list[tuple[str, str]] = ()) -> Path:
    """Write each notebook's summary, JUnit XML and executed copy, and ``grades.csv`` (with a row for
    each skipped path and why), into ``out``."""
    import nbformat

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for g, stem in zip(grades, report_names([g.notebook for g in grades])):
        g.report_name = stem
        (out / f"{stem}.summary.txt").write_text(g.summary() + "\n", encoding="utf-8")
        junit_xml([g]).write(out / f"{stem}.junit.xml", encoding="utf-8", xml_declaration=True)
        if g.executed is not None:
            nbformat.write(g.executed, out / f"{stem}.ipynb")
    names = [e.call for e in grades[0].exercises] if grades else []
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["notebook", "report", "lab", "score", "total", "cells_that_raised", "sandboxed",
                         *names])
        for g in grades:
            status = {e.call: r.status for e, r in zip(g.exercises, g.results)}
            writer.writerow([csv_cell(str(g.notebook)), csv_cell(g.report_name), csv_cell(g.lab), g.score, g.total,
                             len(g.errors), "yes" if g.protection.startswith("bubblewrap") else "no",
                             *[status.get(n, "") for n in names]])
        for path, why in skipped:
            writer.writerow([csv_cell(str(path)), csv_cell(f"skipped: {why}"), "", 0, "", "", "",
                             *["skipped"] * len(names)])
    return out
