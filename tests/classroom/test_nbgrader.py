"""nbgrader as a way to grade the course: generate → release → collect → autograde, as
docs/instructor_guide.md ("Grading with nbgrader") tells an instructor to run it, on lab 01.

Three students submit through nbgrader's exchange: one with the solution, one with the lab as released
(blank), one whose ``scores`` forgets the 1/√d (so ``attention``, which uses it, fails too). Autograde
must give 5, 0 and 3 of 5 points, cell by cell, without the warning nbgrader prints for a test cell
whose value is not a score, and without a deprecation warning. The notebook nbgrader releases is the
lab students get from ``labs/``, its Colab badge included.

The workflow needs nbgrader (the ``nbgrader`` extra, part of ``dev``: ``make test`` installs it) and
takes about 40 s on a 2-core machine; the last test checks, without nbgrader, that a check's result is
displayed rather than returned as the cell's value (what nbgrader would read as a score).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom import course

BIN = Path(sys.executable).parent             # the venv's bin: nbgrader, and alembic that nbgrader runs
LAB = next(lesson for lesson in course.LESSONS if lesson.number == 1)
ASSIGNMENT = "lab01"
NOTEBOOK = Path(LAB.lab).name
POINTS = {"check-06": 1, "check-09": 1, "check-12": 1, "check-15": 1, "check-18": 1}
STUDENTS = ("alice", "bob", "carol")
WRONG_SCORES = "def scores(Q, K):\n    return Q @ K.T\n"     # the 1/√d left out


def nbgrader_ready() -> str | None:
    """Why the workflow cannot run here, or None."""
    try:
        import nbgrader  # noqa: F401
    except ImportError:
        return 'nbgrader is not installed (pip install -e ".[nbgrader]"; `make test` installs it with "dev")'
    for tool in ("nbgrader", "alembic"):
        if not (BIN / tool).exists():
            return f"{tool} is not in {BIN}, beside this Python"
    return None


needs_nbgrader = pytest.mark.skipif(nbgrader_ready() is not None, reason=str(nbgrader_ready()))


def guide_config() -> str:
    """The nbgrader_config.py that docs/instructor_guide.md shows: the test runs exactly that."""
    guide = (ROOT / "docs" / "instructor_guide.md").read_text()
    blocks = re.findall(r"```python\n(# nbgrader_config\.py.*?)```", guide, re.S)
    assert len(blocks) == 1, "the guide shows one nbgrader_config.py"
    return blocks[0]


class Nbgrader:
    """nbgrader's command line run the way the guide says: the venv's bin first on PATH."""

    def __init__(self, home: Path):
        self.log: list[str] = []
        self.env = {**os.environ,
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "HOME": str(home),                          # no instructor's own nbgrader config
                    "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
                    "JUPYTER_DATA_DIR": str(home / ".local" / "share" / "jupyter"),
                    "PYTHONWARNINGS": "default::DeprecationWarning"}
        for name in ("NBGRADER_EXECUTION", "PYTHONPATH"):
            self.env.pop(name, None)

    def __call__(self, cwd: Path, *args: str) -> str:
        done = subprocess.run(["nbgrader", *args], cwd=cwd, env=self.env, capture_output=True, text=True,
                              timeout=600)
        out = done.stdout + done.stderr
        self.log.append(f"$ nbgrader {' '.join(args)}\n{out}")
        assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{out[-4000:]}"
        return out


def answer(released, solution, wrong: dict[str, str] | None = None):
    """The released notebook with every exercise cell taken from the solution (or from ``wrong``,
    by the first line of the solution's cell)."""
    solved = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solution.cells
              if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in released.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in solved:
            source = solved[grade_id]
            for head, replacement in (wrong or {}).items():
                if source.startswith(head):
                    source = replacement
            cell.source = source
    return released


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Run the whole workflow once; return the course folder and what nbgrader printed."""
    tmp = tmp_path_factory.mktemp("nbgrader")
    home, course_dir = tmp / "home", tmp / "course"
    home.mkdir()
    course_dir.mkdir()
    exchange = tmp / "exchange"
    exchange.mkdir()
    exchange.chmod(0o777)                    # as the guide says: every user writes there
    config = guide_config()
    assert config.count('"/srv/nbgrader/exchange"') == 1
    (course_dir / "nbgrader_config.py").write_text(config.replace("/srv/nbgrader/exchange", str(exchange)))
    nbgrader = Nbgrader(home)

    # The instructor: the lab's source, the students, the released notebook.
    subprocess.run([sys.executable, "-m", "attnkit.classroom.course", "nbgrader-source", "01", str(course_dir)],
                   check=True, capture_output=True, text=True)
    (tmp / "students.csv").write_text("id,first_name,last_name\n" + "".join(f"{s},{s.title()},\n" for s in STUDENTS))
    nbgrader(course_dir, "db", "student", "import", str(tmp / "students.csv"))
    nbgrader(course_dir, "generate_assignment", ASSIGNMENT)
    nbgrader(course_dir, "release_assignment", ASSIGNMENT)

    # The students fetch it from the exchange, answer, and submit.
    solution = nbformat.read(ROOT / LAB.solution, as_version=4)
    answers = {"alice": lambda nb: answer(nb, solution),
               "bob": lambda nb: nb,
               "carol": lambda nb: answer(nb, solution, {"def scores(": WRONG_SCORES})}
    desk = tmp / "desk"                      # one fetch; each student submits from it under their name
    desk.mkdir()
    shutil.copy(course_dir / "nbgrader_config.py", desk / "nbgrader_config.py")
    nbgrader(desk, "fetch_assignment", ASSIGNMENT)
    path = desk / ASSIGNMENT / NOTEBOOK
    fetched = path.read_text()
    for student, work in answers.items():
        nbformat.write(work(nbformat.reads(fetched, as_version=4)), path)
        nbgrader(desk, "submit", ASSIGNMENT, f"--student={student}")

    # The instructor collects and autogrades.
    # Here one account submits for all three: collect's check that a submission's owner is its student
    # (a warning, on a real server a sign of cheating) is off for this run only.
    nbgrader(course_dir, "collect", ASSIGNMENT, "--ExchangeCollect.check_owner=False")
    nbgrader(course_dir, "autograde", ASSIGNMENT)
    return course_dir, "\n".join(nbgrader.log)


@pytest.mark.slow
@needs_nbgrader
def test_the_released_notebook_is_the_lab_students_get(graded):
    course_dir, _ = graded
    released = nbformat.read(course_dir / "release" / ASSIGNMENT / NOTEBOOK, as_version=4)
    lab = nbformat.read(ROOT / LAB.lab, as_version=4)
    assert [(c.cell_type, c.source) for c in released.cells] == [(c.cell_type, c.source) for c in lab.cells]
    assert course.colab_url(LAB.lab) in released.cells[0].source
    assert "solutions/" not in released.cells[0].source


@pytest.mark.slow
@needs_nbgrader
def test_autograde_scores_each_check_cell_without_a_warning(graded):
    from nbgrader.api import Gradebook

    course_dir, log = graded
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gradebook:
        cells = {student: {grade.name: (grade.score, grade.max_score)
                           for grade in gradebook.find_submission_notebook(NOTEBOOK.removesuffix(".ipynb"),
                                                                           ASSIGNMENT, student).grades}
                 for student in STUDENTS}
    assert {name: best for name, (_, best) in cells["alice"].items()} == POINTS
    assert {name: score for name, (score, _) in cells["alice"].items()} == POINTS
    assert {name: score for name, (score, _) in cells["bob"].items()} == dict.fromkeys(POINTS, 0)
    assert {name: score for name, (score, _) in cells["carol"].items()} == \
        {**POINTS, "check-09": 0, "check-15": 0}          # scores, and attention that uses it

    # nbgrader warns when a test cell's value cannot be read as a score ("... future releases may treat
    # as error"); the checks display their report instead of returning it.
    assert "future releases" not in log and "cannot be converted" not in log
    assert not re.search(r"\| WARNING\]", log), [line for line in log.splitlines() if "| WARNING]" in line]
    assert "DeprecationWarning" not in log and "deprecated" not in log.lower()


@pytest.mark.slow
@needs_nbgrader
def test_a_passing_check_displays_its_report_and_a_failing_one_raises(graded):
    course_dir, _ = graded
    runs = {student: nbformat.read(course_dir / "autograded" / student / ASSIGNMENT / NOTEBOOK, as_version=4)
            for student in ("alice", "carol")}
    checks = {student: {c.metadata["nbgrader"]["grade_id"]: c.outputs for c in nb.cells
                        if c.metadata.get("nbgrader", {}).get("grade")}
              for student, nb in runs.items()}
    stored = {c.metadata["nbgrader"]["grade_id"]: c.outputs
              for c in nbformat.read(ROOT / LAB.solution, as_version=4).cells
              if c.metadata.get("nbgrader", {}).get("grade")}
    assert checks["alice"].keys() == stored.keys() == POINTS.keys()
    for grade_id, outputs in checks["alice"].items():
        assert [o.output_type for o in outputs] == ["display_data"], grade_id     # no value to score
        assert outputs[0].data["text/plain"] == stored[grade_id][0].data["text/plain"], grade_id
    failed = checks["carol"]["check-09"]
    assert [o.output_type for o in failed] == ["error"] and failed[0].ename == "AssertionError"
    assert "scores" in failed[0].evalue


def test_a_check_result_is_displayed_not_returned_as_the_cells_value():
    """What nbgrader scores, without nbgrader: IPython's display formatter finds nothing to put in an
    ``execute_result`` for a check's result (it displays itself), for one check and a lab's summary."""
    from IPython.core.formatters import DisplayFormatter
    from IPython.core.interactiveshell import InteractiveShell

    from attnkit.classroom.checking import FAILED, PASSED, CheckResult, summarize

    shown = []
    shell = InteractiveShell.instance()
    try:
        shell.display_pub.publish = lambda data, metadata=None, **kw: shown.append(data)
        formatter = DisplayFormatter(parent=shell)
        passed = CheckResult("softmax", PASSED, "softmax: right")
        for value, text in ((passed, "softmax: right"),
                            (summarize([passed]), "softmax: right\n1 of 1 exercises pass.")):
            assert formatter.format(value) == ({}, {})           # no value for an execute_result
            assert shown.pop() == {"text/plain": text}           # shown instead, as display_data
        assert repr(passed) == "softmax: right"
        assert CheckResult("softmax", FAILED, "softmax: wrong").passed is False
    finally:
        InteractiveShell.clear_instance()
