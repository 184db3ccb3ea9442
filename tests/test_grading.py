"""`make grade`: the notebook runs sandboxed and on a budget, the checks run in a fresh process on hidden
cases, and every known way to earn marks without writing the answer earns nothing."""
import csv
import hashlib
import os
import subprocess
import time
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
LAB01_FILE = ROOT / "attnkit" / "labs" / "lab01.py"

needs_lab01 = pytest.mark.skipif(not (ROOT / LAB01.lab).exists() or not (ROOT / LAB01.solution).exists(),
                                 reason=f"{LAB01.lab} or {LAB01.solution} does not exist yet")
needs_bwrap = pytest.mark.skipif(grading.sandbox_problem() is not None,
                                 reason=f"no sandbox here: {grading.sandbox_problem()}")


def junit_cases(path):
    suite = ET.parse(path).getroot().find("testsuite")
    cases = {}
    for case in suite.findall("testcase"):
        failure = case.find("failure")
        cases[case.get("name")] = None if failure is None else failure
    return suite, cases


def statuses(grade):
    return {r.name: r.status for r in grade.results}


def reports(grade):
    return {r.name: r.report for r in grade.results}


def notebook(*cells):
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])


def outputs(grade):
    return "".join(o.get("text", "") for c in grade.executed.cells for o in c.get("outputs", []))


# ------------------------------------------------------------------------------ a hostile notebook
# Each exercise of lab 01 is answered by an exploit instead of the answer; other cells attack the
# package, the repository and the checks. Nothing here may earn a mark.
HOSTILE = [
    """import json, math, os, pathlib, sys, inspect
import numpy as np
import attnkit
import attnkit.labs.lab01 as lab01
from attnkit.classroom import checking
from attnkit.reference.attention import softmax_np
PACKAGE = pathlib.Path(attnkit.__file__).resolve().parent
REPO = PACKAGE.parent""",
    # (e) rewrite lab01.py on disk; (g) delete a file of the repository. Opening for append writes
    # nothing, so this cell is harmless even where it succeeds.
    """def attempt(action):
    try:
        action()
        return "done"
    except OSError as exc:
        return f"{type(exc).__name__} errno {exc.errno}"

print("rewrite lab01.py:", attempt(lambda: open(PACKAGE / "labs" / "lab01.py", "ab").close()))
print("delete a repository file:", attempt(lambda: os.remove(REPO / DECOY)))
print("solutions visible:", (REPO / "solutions").exists())""",
    # (c) replace the checks, and what they rely on, in the imported modules
    """passed = checking.CheckResult("x", checking.PASSED, "✅ patched")
for name in dir(lab01):
    if name.startswith(("check_", "_check_")):
        setattr(lab01, name, lambda fn, seed=None, **kw: passed)
checking.run_check = lambda name, *a, **k: checking.CheckResult(name, checking.PASSED, "✅ patched")
checking.rel_error = lambda *a, **k: 0.0
attnkit.tolerances.rel_error = lambda *a, **k: 0.0
checking.CheckResult.passed = property(lambda self: True)
np.linalg.norm = lambda *a, **k: 0.0
sys.modules["attnkit.labs.lab01"] = None""",
    # scores: wrong, and it patches the checks again while it is being checked
    """def scores(Q, K):
    checking.run_check = lambda name, *a, **k: checking.CheckResult(name, checking.PASSED, "✅ patched")
    return np.zeros((Q.shape[0], K.shape[0]))""",
    # (a) the course's own softmax, called from the student's function
    """def softmax_rows(S):
    return softmax_np(S)""",
    # (b) the solution's code, read from solutions/
    """def attention(Q, K, V, causal=False):
    cells = json.loads((REPO / "solutions" / "lab01_attention_by_hand.ipynb").read_text())["cells"]
    ns = {"np": np, "math": math}
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith("def "):
            exec(source, ns)
    return ns["attention"](Q, K, V, causal)""",
    # (d) the expected value out of the checker's frames (own stack, other threads, the collector)
    """def _checker_frame_value():
    import gc
    frames = [sys._getframe(1)] + list(sys._current_frames().values())
    frames += [o for o in gc.get_objects() if inspect.isframe(o)]
    for frame in frames:
        while frame is not None:
            for name in ("expected", "reference_fn"):
                if name in frame.f_locals:
                    return name, frame.f_locals[name]
            frame = frame.f_back
    return None, None

def sinusoidal_positions(n_positions, d_model):
    name, value = _checker_frame_value()
    if name == "expected":
        return value
    if name == "reference_fn":
        return value(n_positions, d_model)
    raise LookupError("no checker frame in reach")""",
    "check_scores = lab01.check_scores\ncheck_scores(scores)",
    # a thread left running, which could interfere with the checks: reported for review
    "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()",
]


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """The hostile notebook graded once, sandboxed; with the package file's hash before and after."""
    if grading.sandbox_problem() is not None:
        pytest.skip(f"no sandbox here: {grading.sandbox_problem()}")
    decoy = FIXTURES / "grading" / f"decoy-{os.getpid()}.txt"
    decoy.parent.mkdir(exist_ok=True)
    decoy.write_text("the hostile notebook tries to delete this file\n")
    try:
        cells = [c.replace("REPO / DECOY", f"REPO / {str(decoy.relative_to(ROOT))!r}") for c in HOSTILE]
        path = tmp_path_factory.mktemp("hostile") / "hostile.ipynb"
        nbformat.write(notebook(*cells), path)
        before = sha256(LAB01_FILE)
        g = grading.grade(path, "01", timeout=60, sandbox=True)
        survived = decoy.exists()
    finally:
        decoy.unlink(missing_ok=True)
        if not any(decoy.parent.iterdir()):
            decoy.parent.rmdir()
    return g, before, sha256(LAB01_FILE), survived


@pytest.mark.slow
def test_exploits_earn_nothing(hostile):
    g, *_ = hostile
    assert g.score == 0 and statuses(g) == {n: "failed" for n in NAMES}
    assert "✅" not in g.summary() and "patched" not in g.summary()
    assert g.protection.startswith("bubblewrap sandbox")


@pytest.mark.slow
def test_a_calling_the_courses_own_implementation_is_refused(hostile):
    g, *_ = hostile
    assert "called the course's own softmax_np" in reports(g)["softmax_rows"]


@pytest.mark.slow
def test_b_solutions_are_not_visible_to_the_students_code(hostile):
    g, *_ = hostile
    assert "FileNotFoundError" in reports(g)["attention"]
    assert "solutions visible: False" in outputs(g)


@pytest.mark.slow
def test_c_replaced_checks_are_put_back_and_reported(hostile):
    g, *_ = hostile
    assert "differs from the float64 reference" in reports(g)["scores"]     # judged by the real check
    notes = "\n".join(g.notes)
    for name in ("attnkit.labs.lab01.check_scores", "attnkit.classroom.checking.run_check",
                 "attnkit.classroom.checking.CheckResult.passed", "numpy.linalg.norm",
                 "sys.modules['attnkit.labs.lab01']"):
        assert name in notes, name
    assert "while scores was checked, the student's code changed attnkit.classroom.checking.run_check" in notes
    assert "left threads running" in notes


@pytest.mark.slow
def test_d_the_checkers_frames_are_out_of_reach(hostile):
    g, *_ = hostile
    assert "LookupError: no checker frame in reach" in reports(g)["sinusoidal_positions"]


@pytest.mark.slow
def test_e_g_the_package_and_repository_are_read_only(hostile):
    g, before, after, survived = hostile
    text = outputs(g)
    assert "rewrite lab01.py: OSError errno 30" in text                 # EROFS: read-only file system
    assert "delete a repository file: FileNotFoundError" in text        # the repository is not there
    assert before == after and survived


@pytest.mark.slow
@needs_lab01
def test_make_grade_passes_the_solved_lab(tmp_path):
    # Runs after the hostile notebook's tests above (pytest keeps a file's order): nothing it tried
    # carries over into this grading.
    student = tmp_path / "alice" / "lab01.ipynb"
    student.parent.mkdir()
    student.write_bytes((ROOT / LAB01.solution).read_bytes())
    before = student.read_bytes()
    out = tmp_path / "grades"
    done = subprocess.run(["make", "-s", "grade", "LAB=01", f"NOTEBOOK={student}", f"GRADES={out}", "STRICT=1",
                           "TIMEOUT=120"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Score: 4 of 4 exercises pass." in done.stdout
    assert student.read_bytes() == before                      # the student's file is left alone
    summary = (out / "lab01.summary.txt").read_text()
    assert summary.count("✅") == 4 and "ran top to bottom without an error" in summary
    assert "For review" not in summary
    suite, cases = junit_cases(out / "lab01.junit.xml")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "0")
    assert list(cases) == CALLS + ["notebook runs without errors"]
    rows = list(csv.DictReader(open(out / "grades.csv")))
    assert [(r["score"], r["total"], r["cells_that_raised"]) for r in rows] == [("4", "4", "0")]
    assert [rows[0][c] for c in CALLS] == ["passed"] * 4
    executed = nbformat.read(out / "lab01.ipynb", as_version=4)
    assert all(c.execution_count for c in executed.cells if c.cell_type == "code" and c.source.strip())


@pytest.mark.slow
def test_f_a_cell_that_ignores_sigint_and_loops_forever_is_killed_at_its_budget(tmp_path):
    student = tmp_path / "loops.ipynb"
    nbformat.write(notebook(
        "import math\ndef scores(Q, K):\n    return Q @ K.T / math.sqrt(Q.shape[1])",
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        "def softmax_rows(S):\n    while True:\n        pass",
        "import numpy as np\ndef attention(Q, K, V, causal=False):\n    return np.ones(2**31)",  # 16 GiB
    ), student)
    started = time.monotonic()
    # Without the sandbox, the harder case: the kernel runs in a session of its own (Jupyter starts it
    # so), outside the worker's process group; the grader kills it too. (In the sandbox, bubblewrap's
    # PID namespace ends with its first process.)
    g = grading.grade(student, "01", timeout=2, notebook_timeout=120, memory_mib=2048, sandbox=False)
    assert time.monotonic() - started < 120
    assert "ran past its budget of 2 s and ignored the interrupt" in g.problem and "killed" in g.problem
    assert grading._descendants(os.getpid()) == []              # nothing left running
    assert statuses(g)["scores"] == "passed"                    # the checks still ran
    assert "TimeoutError: softmax_rows ran past 2 s" in reports(g)["softmax_rows"]
    assert "MemoryError" in reports(g)["attention"]             # the memory cap


@pytest.mark.slow
def test_wrong_answers_blanks_and_aliases_are_graded_and_without_a_sandbox_the_summary_says_so(tmp_path):
    # The fixture: scores right; softmax without the max shift; attention ignoring `causal`;
    # sinusoidal_positions with a syntax error; and a scratch cell that raises. Added here: attention
    # as an alias of the course's own, and sinusoidal_positions left blank.
    nb = nbformat.read(FIXTURES / "lab01_wrong.ipynb", as_version=4)
    nb.cells += [nbformat.v4.new_code_cell("from attnkit.reference.attention import attention_np as attention"),
                 nbformat.v4.new_code_cell("def sinusoidal_positions(n_positions, d_model):\n"
                                           "    raise NotImplementedError")]
    student = tmp_path / "lab01_wrong.ipynb"
    nbformat.write(nb, student)
    g = grading.grade(student, "lab01", timeout=120, sandbox=False)
    assert statuses(g) == {"scores": "passed", "softmax_rows": "failed", "attention": "failed",
                           "sinusoidal_positions": "not implemented"}
    text = reports(g)
    assert "differs from the float64 reference" in text["softmax_rows"] and "hint:" in text["softmax_rows"]
    assert "`attention` is attnkit.reference.attention.attention_np" in text["attention"]
    assert [e.ename for e in g.errors][:2] == ["ValueError", "SyntaxError"]
    assert "np.ones((2, 3)) @ np.ones((2, 3))" in g.errors[0].line()
    assert "Isolation: NO SANDBOX" in g.summary() and "could read solutions/" in g.summary()
    grading.write_reports([g], tmp_path / "out")
    summary = (tmp_path / "out" / "lab01_wrong.summary.txt").read_text()
    assert "Score: 1 of 4 exercises pass." in summary and "raised ValueError" in summary
    suite, cases = junit_cases(tmp_path / "out" / "lab01_wrong.junit.xml")
    assert (suite.get("tests"), suite.get("failures")) == ("5", "4")
    assert [None if cases[c] is None else cases[c].get("type") for c in CALLS] == \
        [None, "failed", "failed", "not implemented"]
    run = cases["notebook runs without errors"]
    assert run is not None and "ValueError" in run.get("message") and "Traceback" not in run.get("message")
    assert list(csv.DictReader(open(tmp_path / "out" / "grades.csv")))[0]["sandboxed"] == "no"


# ------------------------------------------------------------------------------------- fast checks
def test_the_checker_loads_the_notebooks_code_without_its_check_calls():
    nb = notebook("import numpy as np\n%matplotlib inline\ndef f(x):\n    return check_f(x)",
                  "check_f(f)", "x = 1; check_f(f)", "print(summarize([check_f(f)]))\ny = 2",
                  "from attnkit.labs.lab01 import check_scores")
    cells = grading.submission_cells(nb)
    assert [c["cell"] for c in cells] == [1, 2, 3, 4, 5]
    assert "get_ipython().run_line_magic('matplotlib', 'inline')" in cells[0]["source"]
    assert "return check_f(x)" in cells[0]["source"]                # inside a definition: kept
    assert cells[1]["source"].strip() == "" and cells[2]["source"].strip() == "x = 1"
    assert cells[3]["source"].strip() == "y = 2"
    assert cells[4]["source"].strip() == "from attnkit.labs.lab01 import check_scores"


def test_a_function_that_is_the_courses_own_is_named():
    from attnkit.reference.attention import softmax_np
    from attnkit.serving.allocator import BlockAllocator

    assert "attnkit.reference.attention.softmax_np" in grading._origin_problem("softmax_rows", softmax_np)
    subclass = type("PagePool", (BlockAllocator,), {"__module__": "submission"})
    assert "builds on the course's own" in grading._origin_problem("PagePool", subclass)
    assert "object, not a function" in grading._origin_problem("f", print)
    code = compile("def f(x):\n    return x", f"{grading.CELL_PREFIX}3>", "exec")
    ns = {}
    exec(code, ns)
    assert grading._origin_problem("f", ns["f"]) is None


def test_only_one_well_formed_result_from_the_checking_process_counts():
    good = '{"results": [{"name": "f", "status": "passed", "report": "ok"}], "notes": []}'

    def read(stdout, stopped=None):
        return grading.read_record(grading.Run(0, stopped, stdout, "", 1.0), ["f"])

    assert read(good + "\n") == ({"results": [{"name": "f", "status": "passed", "report": "ok"}], "notes": []},
                                 None)
    assert "more than one result" in read(good + "\n" + good)[1]         # a forged line beside the real one
    for bad in ("", "not json", '{"results": [{"name": "g", "status": "passed", "report": "ok"}]}',
                '{"results": [{"name": "f", "status": "excellent", "report": "ok"}]}', '{"results": 3}', "[1]"):
        assert read(bad)[0] is None and "without a result" in read(bad)[1], bad
    assert read(good, stopped="ran past the notebook's budget of 9 s")[1] == \
        "the checks ran past the notebook's budget of 9 s"


def test_an_unreadable_notebook_gets_a_zero_with_the_reason(tmp_path):
    student = tmp_path / "broken.ipynb"
    student.write_text("{ this is not json")
    g = grading.grade(student, "01")
    assert g.score == 0 and g.total == len(NAMES)
    assert "could not be read" in g.problem and "could not be read" in g.summary()


def test_bad_arguments_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="lab: '11' names no lab of the course; the labs are 01"):
        grading.find_lab("11")
    with pytest.raises(ValueError, match="notebook: .* is not a file"):
        grading.grade(tmp_path / "missing.ipynb", "01")
    text = tmp_path / "answers.py"
    text.write_text("x = 1")
    with pytest.raises(ValueError, match="not a Jupyter notebook"):
        grading.grade(text, "01")
    with pytest.raises(ValueError, match="timeout: must be a positive number"):
        grading.grade(text, "01", timeout=0)
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


def test_every_lab_names_its_graded_exercises():
    for lesson in [l for l in LESSONS if l.has_lab and (ROOT / l.lab).exists()]:
        module, exercises = grading.lab_exercises(lesson)
        assert exercises, lesson.lab
        assert all(e.function and e.check.startswith("check") for e in exercises), lesson.lab
    assert [e.call for e in grading.lab_exercises(LAB01)[1]] == CALLS


def test_a_students_objects_reach_the_checker_as_proxies_and_return_to_the_student_as_themselves(monkeypatch):
    import attnkit.labs.lab01 as lab01

    student = grading._Student(lab01, timeout=10)
    monkeypatch.setattr(grading, "_STUDENT", student)
    ns = {}
    exec(compile("class Pool:\n    def __init__(self, n):\n        self.n = n\n"
                 "    def take(self, other=None):\n        assert other is None or type(other) is Pool\n"
                 "        self.n -= 1\n        return self.n\n"
                 "def use(pool):\n    return pool.take(pool)\n", f"{grading.CELL_PREFIX}1>", "exec"), ns)
    pool = student.wrap("Pool", ns["Pool"])(5)
    assert type(pool) is grading._Proxy                       # the checker never holds the object itself
    assert (pool.take(), student.wrap("use", ns["use"])(pool), pool.n) == (4, 3, 3)
    assert {pool: 1}[pool] == 1
    with pytest.raises(RuntimeError, match="out") as info:   # a student's exception keeps its base class
        student.wrap("f", lambda: (_ for _ in ()).throw(type("OutOfPages", (RuntimeError,), {})("out")))()
    assert type(info.value).__name__ == "OutOfPages"


def test_a_students_function_runs_under_the_checks_pytorch_modes(monkeypatch):
    # A check may forbid PyTorch's own compute while the student's function runs (a dispatch mode);
    # the grader's thread must be under the same mode, and under the same grad mode.
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import attnkit.labs.lab01 as lab01

    class NoMatmul(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "mm" in str(func):
                raise RuntimeError("matmul is not allowed here")
            return func(*args, **(kwargs or {}))

    student = grading._Student(lab01, timeout=10)
    monkeypatch.setattr(grading, "_STUDENT", student)
    a = torch.ones(2, 2)
    matmul = student.wrap("matmul", lambda x: x @ x)
    grad = student.wrap("grad", torch.is_grad_enabled)
    with NoMatmul(), pytest.raises(RuntimeError, match="matmul is not allowed here"):
        matmul(a)
    with torch.no_grad():
        assert grad() is False
    assert matmul(a).sum().item() == 8.0 and grad() is True


def test_a_course_object_made_by_the_student_reaches_the_check_as_its_class_with_plain_contents():
    from attnkit.classroom.checking import Case

    class Sneaky:                                      # the student's: it would run code when compared
        def __eq__(self, other):
            return True
    made = Case((1.5, [Sneaky()]), {"k": "v"}, "label")
    plain = grading._plain(made)
    assert type(plain) is Case and plain is not made and plain.label == "label" and plain.args[0] == 1.5
    assert type(plain.args[1][0]) is grading._Proxy
    handed = Case((), {}, "handed to the student")
    assert grading._plain([handed], known=grading._handed_over((handed,), {}))[0] is handed
