"""`make grade` runs a student's lab, applies the lab's checks and writes a summary and JUnit XML."""
import csv
import shutil
import subprocess
import xml.etree.ElementTree as ET

import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom import grading
from attnkit.classroom.course import LESSONS

LAB01 = next(l for l in LESSONS if l.number == 1)
FIXTURES = ROOT / "tests" / "fixtures"
NAMES = ["scores", "softmax_rows", "attention", "sinusoidal_positions"]
CALLS = ["check_scores(scores)", "check_softmax(softmax_rows)", "check_attention(attention)",
         "check_positions(sinusoidal_positions)"]

needs_lab01 = pytest.mark.skipif(not (ROOT / LAB01.lab).exists() or not (ROOT / LAB01.solution).exists(),
                                 reason=f"{LAB01.lab} or {LAB01.solution} does not exist yet")


def junit_cases(path):
    suite = ET.parse(path).getroot().find("testsuite")
    cases = {}
    for case in suite.findall("testcase"):
        failure = case.find("failure")
        cases[case.get("name")] = None if failure is None else failure
    return suite, cases


def statuses(grade):
    return {r.name: r.status for r in grade.results}


@pytest.mark.slow
@needs_lab01
def test_make_grade_passes_the_solved_lab(tmp_path):
    student = tmp_path / "alice" / "lab01.ipynb"
    student.parent.mkdir()
    shutil.copy(ROOT / LAB01.solution, student)
    before = student.read_bytes()
    out = tmp_path / "grades"
    done = subprocess.run(["make", "-s", "grade", "LAB=01", f"NOTEBOOK={student}", f"GRADES={out}", "STRICT=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Score: 4 of 4 exercises pass." in done.stdout
    assert student.read_bytes() == before                      # the student's file is left alone
    summary = (out / "lab01.summary.txt").read_text()
    assert summary.count("✅") == 4 and "ran top to bottom without an error" in summary
    suite, cases = junit_cases(out / "lab01.junit.xml")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "0")
    assert list(cases) == CALLS + ["notebook runs without errors"]
    assert all(f is None for f in cases.values())
    rows = list(csv.DictReader(open(out / "grades.csv")))
    assert [(r["score"], r["total"], r["cells_that_raised"]) for r in rows] == [("4", "4", "0")]
    assert [rows[0][c] for c in CALLS] == ["passed"] * 4
    executed = nbformat.read(out / "lab01.ipynb", as_version=4)
    assert all(c.execution_count for c in executed.cells if c.cell_type == "code" and c.source.strip())


@pytest.mark.slow
@needs_lab01
def test_blank_lab_is_graded_not_implemented(tmp_path):
    g = grading.grade(ROOT / LAB01.lab, "01")
    assert statuses(g) == {n: "not implemented" for n in NAMES}
    assert (g.score, g.total, g.errors, g.problem) == (0, 4, [], None)
    grading.write_reports([g], tmp_path)
    suite, cases = junit_cases(tmp_path / f"{g.report_name}.junit.xml")
    assert suite.get("failures") == "4"
    assert [cases[c].get("type") for c in CALLS] == ["not implemented"] * 4
    assert cases["notebook runs without errors"] is None


@pytest.mark.slow
def test_wrong_lab_is_graded_with_reports_and_the_cells_that_raised(tmp_path):
    # The fixture: scores right; softmax without the max shift; attention ignoring `causal`;
    # sinusoidal_positions with a syntax error; and a scratch cell that raises.
    g = grading.grade(FIXTURES / "lab01_wrong.ipynb", "lab01")
    assert statuses(g) == {"scores": "passed", "softmax_rows": "failed", "attention": "failed",
                           "sinusoidal_positions": "failed"}
    reports = {r.name: r.report for r in g.results}
    assert "non-finite" in reports["softmax_rows"] and "hint:" in reports["softmax_rows"]
    assert "causal" in reports["attention"] and "expected" in reports["attention"]
    assert "defines no `sinusoidal_positions`" in reports["sinusoidal_positions"]
    assert [e.ename for e in g.errors][:2] == ["ValueError", "SyntaxError"]
    assert "np.ones((2, 3)) @ np.ones((2, 3))" in g.errors[0].line()
    grading.write_reports([g], tmp_path)
    summary = (tmp_path / "lab01_wrong.summary.txt").read_text()
    assert "Score: 1 of 4 exercises pass." in summary and "raised ValueError" in summary
    suite, cases = junit_cases(tmp_path / "lab01_wrong.junit.xml")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "4")
    assert cases["check_scores(scores)"] is None
    assert "subtract the row's maximum" in cases["check_softmax(softmax_rows)"].text
    run = cases["notebook runs without errors"]
    assert run is not None and "ValueError" in run.get("message") and "Traceback" not in run.get("message")


@pytest.mark.slow
def test_a_hanging_function_costs_only_its_exercise_and_a_notebooks_own_checks_do_not_count(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def scores(Q, K):\n    return Q @ K.T"),             # forgets 1/√d
        nbformat.v4.new_code_cell("def check_scores(fn):\n    return '✅ scores: passes'"),  # its own check
        nbformat.v4.new_code_cell("def softmax_rows(S):\n    while True:\n        pass"),
    ])
    student = tmp_path / "hangs.ipynb"
    nbformat.write(nb, student)
    g = grading.grade(student, 1, timeout=15)
    assert statuses(g) == {"scores": "failed", "softmax_rows": "failed", "attention": "failed",
                           "sinusoidal_positions": "failed"}
    reports = {r.name: r.report for r in g.results}
    assert "differs from the float64 reference" in reports["scores"]
    assert "check_softmax(softmax_rows) ran past 15 s and was stopped" in reports["softmax_rows"]
    assert "defines no `attention`" in reports["attention"]


@pytest.mark.slow
@needs_lab01
def test_a_kernel_that_dies_is_still_graded(tmp_path):
    nb = nbformat.read(ROOT / LAB01.solution, as_version=4)
    nb.cells.insert(4, nbformat.v4.new_code_cell("import os\nos._exit(1)"))
    student = tmp_path / "dies.ipynb"
    nbformat.write(nb, student)
    g = grading.grade(student, "01", timeout=60)
    assert g.problem and "kernel died" in g.problem
    assert g.score == 0 and all("not graded" in r.report for r in g.results)
    grading.write_reports([g], tmp_path)
    _, cases = junit_cases(tmp_path / "dies.junit.xml")
    assert "kernel died" in cases["notebook runs without errors"].get("message")


def test_an_unreadable_notebook_gets_a_zero_with_the_reason(tmp_path):
    student = tmp_path / "broken.ipynb"
    student.write_text("{ this is not json")
    g = grading.grade(student, "01")
    assert g.score == 0 and g.total == len(NAMES)
    assert "could not be read" in g.problem
    assert "could not be read" in g.summary()


def test_bad_arguments_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="lab: '02' names no lab of the course; the labs are 01"):
        grading.find_lab("02")
    with pytest.raises(ValueError, match="notebook: .* is not a file"):
        grading.grade(tmp_path / "missing.ipynb", "01")
    text = tmp_path / "answers.py"
    text.write_text("x = 1")
    with pytest.raises(ValueError, match="not a Jupyter notebook"):
        grading.grade(text, "01")
    assert grading.find_lab("labs/lab03_online_softmax.ipynb").number == 3
    assert grading.find_lab("attention_by_hand").number == 1


def test_make_grade_without_arguments_prints_its_usage():
    done = subprocess.run(["make", "-s", "grade"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "usage: make grade LAB=01 NOTEBOOK=" in done.stdout


def test_report_names_stay_distinct_for_same_named_submissions(tmp_path):
    paths = [tmp_path / "alice" / "lab01.ipynb", tmp_path / "bob" / "lab01.ipynb", tmp_path / "carol.ipynb"]
    assert grading.report_names(paths) == ["alice__lab01", "bob__lab01", "carol"]
    twice = grading.report_names([paths[0], paths[0]])
    assert len(set(twice)) == 2 and all(n.endswith(("lab01_0", "lab01_1")) for n in twice)


def test_every_lab_is_graded_by_its_own_check_cells():
    # Each check cell of a lab is an exercise; a summary cell that re-checks all the others is not.
    labs = [l for l in LESSONS if l.has_lab and (ROOT / l.lab).exists()]
    for lesson in labs:
        module, exercises = grading.lab_exercises(lesson)
        assert exercises, lesson.lab
        for e in exercises:
            assert callable(getattr(module, e.check)) and e.args, (lesson.lab, e.call)
        assert len({e.call for e in exercises}) == len(exercises)
        assert not any(e.check in ("check_lab", "check_all") for e in exercises), lesson.lab
    if (ROOT / LAB01.lab).exists():
        assert [e.call for e in grading.lab_exercises(LAB01)[1]] == CALLS


def test_check_cells_are_recognised_by_their_form():
    module = __import__("attnkit.labs.lab01", fromlist=["check_scores"])
    assert grading._check_call("check_scores(scores)", module) == grading.Exercise("check_scores", ("scores",))
    assert grading._check_call("lab01.check_scores(scores, seed=3)", module) == \
        grading.Exercise("check_scores", ("scores",), (("seed", 3),))
    for not_a_check in ("x = check_scores(scores)", "check_scores(lambda Q, K: Q)", "print(scores)",
                        "check_nothing(scores)", "check_scores(scores)\ncheck_softmax(softmax_rows)"):
        assert grading._check_call(not_a_check, module) is None, not_a_check
