"""`make grade`: the notebook runs sandboxed and on a budget, the checks run in a fresh process on hidden
cases, and every known way to earn marks without writing the answer earns nothing."""
import csv
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom import grading
from attnkit.classroom.course import LESSONS

LAB01 = next(l for l in LESSONS if l.number == 1)
FIXTURES = ROOT / "tests" / "fixtures"
EXERCISES = grading.lab_exercises(LAB01)[1]
NAMES = [e.function for e in EXERCISES]
CALLS = [e.call for e in EXERCISES]
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


@pytest.mark.slow
@needs_lab01
def test_make_grade_passes_the_solved_lab(tmp_path):
    student = tmp_path / "alice" / "lab01.ipynb"
    student.parent.mkdir()
    student.write_bytes((ROOT / LAB01.solution).read_bytes())
    before = student.read_bytes()
    out = tmp_path / "grades"
    done = subprocess.run(["make", "-s", "grade", "LAB=01", f"NOTEBOOK={student}", f"GRADES={out}", "STRICT=1",
                           "TIMEOUT=120"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Score: {len(NAMES)} of {len(NAMES)} exercises pass." in done.stdout
    assert student.read_bytes() == before                      # the student's file is left alone
    summary = (out / "lab01.summary.txt").read_text()
    assert summary.count("✅") == len(NAMES) and "ran top to bottom without an error" in summary
    assert "For review" not in summary
    suite, cases = junit_cases(out / "lab01.junit.xml")
    assert (suite.get("tests"), suite.get("failures")) == (str(len(NAMES) + 1), "0")
    assert list(cases) == CALLS + ["notebook runs without errors"]
    rows = list(csv.DictReader(open(out / "grades.csv")))
    n = str(len(NAMES))
    assert [(r["score"], r["total"], r["cells_that_raised"], r["sandboxed"]) for r in rows] == [(n, n, "0", "yes")]
    assert [rows[0][c] for c in CALLS] == ["passed"] * len(NAMES)
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
    assert grading.descendants(os.getpid()) == []               # nothing left running
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
    assert {n: statuses(g)[n] for n in ("scores", "softmax_rows", "attention", "sinusoidal_positions")} == \
        {"scores": "passed", "softmax_rows": "failed", "attention": "failed", "sinusoidal_positions": "not implemented"}
    text = reports(g)
    assert "differs from the float64 reference" in text["softmax_rows"] and "hint:" in text["softmax_rows"]
    assert "`attention` is attnkit.reference.attention.attention_np" in text["attention"]
    assert [e.ename for e in g.errors][:2] == ["ValueError", "SyntaxError"]
    assert "np.ones((2, 3)) @ np.ones((2, 3))" in g.errors[0].line()
    assert "Isolation: NO SANDBOX" in g.summary() and "could read solutions/" in g.summary()
    grading.write_reports([g], tmp_path / "out")
    summary = (tmp_path / "out" / "lab01_wrong.summary.txt").read_text()
    assert f"Score: 1 of {len(NAMES)} exercises pass." in summary and "raised ValueError" in summary
    suite, cases = junit_cases(tmp_path / "out" / "lab01_wrong.junit.xml")
    assert (suite.get("tests"), suite.get("failures")) == (str(len(NAMES) + 1), str(len(NAMES)))
    four = [e.call for n in ("scores", "softmax_rows", "attention", "sinusoidal_positions")
            for e in EXERCISES if e.function == n]
    assert [None if cases[c] is None else cases[c].get("type") for c in four] == \
        [None, "failed", "failed", "not implemented"]
    run = cases["notebook runs without errors"]
    assert run is not None and "ValueError" in run.get("message") and "Traceback" not in run.get("message")
    assert list(csv.DictReader(open(tmp_path / "out" / "grades.csv")))[0]["sandboxed"] == "no"


# ------------------------------------------------------------------------------------- fast checks
def test_the_checker_loads_the_notebooks_code_without_its_check_calls():
    nb = notebook("import numpy as np\n%matplotlib inline\ndef f(x):\n    return check_f(x)",
                  "check_f(f)", "x = 1; check_f(f)", "print(summarize([check_f(f)]))\ny = 2",
                  "from attnkit.classroom.labchecks.lab01 import check_scores")
    cells = grading.submission_cells(nb)
    assert [c["cell"] for c in cells] == [1, 2, 3, 4, 5]
    assert "get_ipython().run_line_magic('matplotlib', 'inline')" in cells[0]["source"]
    assert "return check_f(x)" in cells[0]["source"]                # inside a definition: kept
    assert cells[1]["source"].strip() == "" and cells[2]["source"].strip() == "x = 1"
    assert cells[3]["source"].strip() == "y = 2"
    assert cells[4]["source"].strip() == "from attnkit.classroom.labchecks.lab01 import check_scores"


def test_a_function_that_is_the_courses_own_is_named():
    from attnkit.reference.attention import softmax_np
    from attnkit.serving.allocator import BlockAllocator

    assert "attnkit.reference.attention.softmax_np" in grading.origin_problem("softmax_rows", softmax_np)
    subclass = type("PagePool", (BlockAllocator,), {"__module__": "submission"})
    assert "builds on the course's own" in grading.origin_problem("PagePool", subclass)
    assert "object, not a function" in grading.origin_problem("f", print)
    code = compile("def f(x):\n    return x", f"{grading.CELL_PREFIX}3>", "exec")
    ns = {}
    exec(code, ns)
    assert grading.origin_problem("f", ns["f"]) is None


def test_only_one_well_formed_result_from_the_checker_counts():
    from attnkit.classroom.grading.pipeline import read_record

    good = {"kind": "results", "results": [{"name": "f", "status": "passed", "report": "ok"}]}

    def read(*frames, stopped=None):
        return read_record(grading.Run(0, stopped, list(frames), "", 1.0), ["f"])

    assert read(good) == (good["results"], None)
    assert "without a result" in read(good, good)[1]                   # a second results frame
    for bad in ({"kind": "results", "results": [{"name": "g", "status": "passed", "report": "ok"}]},
                {"kind": "results", "results": [{"name": "f", "status": "excellent", "report": "ok"}]},
                {"kind": "results", "results": 3}, {"kind": "garbled"}):
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
    with pytest.raises(ValueError, match="notebook: .* cannot be opened"):
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




# ------------------------------------------------------------------------ what crosses between processes
def test_arrays_and_tensors_cross_as_their_whole_buffers_with_offset_shape_and_strides():
    import numpy as np
    import torch

    from attnkit.classroom.grading import codec

    buffer = np.full((6, 8), -7.0)                       # a poisoned buffer with an output view inside
    view = buffer[1:5, 2:6].T
    storage = torch.full((40,), 9.0, dtype=torch.float16)
    k, v = storage[:20].view(2, 10)[:, ::2], storage[20:].view(4, 5)     # two views of one storage
    tree, blobs = codec.encode((view, k, v, np.float32(2.5), {"n": (1, 2.0, "x", None)}))
    got_view, got_k, got_v, scalar, rest = codec.decode(tree, blobs)
    assert got_view.strides == view.strides and np.array_equal(got_view, view)
    assert np.array_equal(got_view.base, buffer.reshape(-1).view(np.uint8))     # the whole buffer came
    assert (got_k.stride(), got_k.storage_offset(), got_v.storage_offset()) == ((10, 2), 0, 20)
    assert got_k.untyped_storage().data_ptr() == got_v.untyped_storage().data_ptr()
    assert torch.equal(got_k, k) and got_k.dtype == torch.float16
    assert type(scalar) is np.float32 and scalar == 2.5 and rest == {"n": (1, 2.0, "x", None)}
    for bad in ({"$": "a", "dt": "|O", "sh": [1], "st": [8], "off": 0, "i": 0},       # object arrays
                {"$": "a", "dt": "<f8", "sh": [100], "st": [8], "off": 0, "i": 0},    # past the buffer
                {"$": "p", "dt": "float16", "dev": "cpu", "sh": [9], "st": [9], "off": 0, "i": 0, "n": 8},
                {"$": "o", "c": "os:system", "k": [], "v": []},                        # not the course's
                {"$": "n", "q": "subprocess:run"}, {"$": "h", "i": 1}, {"$": "zzz"}):
        with pytest.raises(codec.CodecError):
            codec.decode(bad, [b"\0" * 8])


def test_a_call_made_in_the_students_process_gives_the_checkers_arguments_its_writes():
    import torch

    from attnkit.classroom.grading import calls

    ns = {}
    exec(compile("import torch\ndef fill(x, out):\n    out.copy_(2 * x)\n"
                 "    torch.empty(0, dtype=out.dtype).set_(out.untyped_storage())[0] = 99.0\n    return out\n"
                 "class Pool:\n    def __init__(self, n):\n        self.n = n\n"
                 "    def take(self):\n        self.n -= 1\n        return self.n\n",
                 f"{grading.CELL_PREFIX}1>", "exec"), ns)
    server = calls.Server({"fill": ns["fill"], "Pool": ns["Pool"]}, send=None)
    replies = []
    caller = calls.Caller(lambda request: replies.append(server.answer(request)), replies.pop)
    calls.use(caller)
    buffer = torch.full((16,), -1.0)                      # an output view inside a poisoned buffer
    out = buffer.as_strided((3,), (4,), 5)
    got = caller.wrap("fill")(torch.arange(3.0), out)
    assert got is out and buffer[0] == 99.0 and out.tolist() == [0.0, 2.0, 4.0]   # its writes, outside too
    assert buffer[15] == -1.0
    pool = caller.wrap("Pool")(5)                         # the student's object stays there: a handle
    assert type(pool) is calls.RemoteHandle and (pool.take(), pool.take(), pool.n) == (4, 3, 3)
    with pytest.raises(TypeError, match="not an exercise's function"):
        caller.wrap("solutions")()
    twice = caller.wrap("Pool").through("attnkit.classroom.checking:unwrapped")     # a course driver, run there
    assert type(twice(7)) is calls.RemoteHandle
    with pytest.raises(TypeError, match="cannot drive|not one of the course's names"):
        caller.wrap("Pool").through("os:system")(1)
    closed = calls.Caller(lambda request: None, lambda: None)
    with pytest.raises(calls.NoAnswer, match="stopped answering"):
        closed.wrap("fill")(1)


def test_a_students_exception_crosses_as_its_name_base_class_message_and_line():
    import linecache

    from attnkit.classroom.grading import codec

    source = "class OutOfPages(RuntimeError):\n    pass\n\ndef f():\n    raise OutOfPages('no page\\x1b[2J')\n"
    name = f"{grading.CELL_PREFIX}4>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)     # as the loader does
    ns = {"__name__": "submission"}
    exec(compile(source, name, "exec"), ns)
    try:
        ns["f"]()
    except Exception as exc:
        data = codec.encode_exception(exc)
    import json
    import traceback

    again = codec.decode_exception(json.loads(json.dumps(data)))
    assert isinstance(again, RuntimeError) and type(again).__name__ == "OutOfPages"
    assert type(again).__module__ == "submission" and str(again) == "no page"     # the escape taken out
    last = traceback.extract_tb(again.__traceback__)[-1]
    assert (last.filename, last.lineno) == (f"{grading.CELL_PREFIX}4>", 5)
    assert last.line == "raise OutOfPages('no page\\x1b[2J')"
    assert type(codec.decode_exception({"ni": True, "name": "X"})) is NotImplementedError


# ----------------------------------------------------------------------------------------- host side
def test_the_grader_reads_a_submission_only_if_it_is_a_small_regular_file(tmp_path):
    target = tmp_path / "real.ipynb"
    target.write_text("{}")
    (tmp_path / "link.ipynb").symlink_to(target)
    os.mkfifo(tmp_path / "fifo.ipynb")
    (tmp_path / "dir.ipynb").mkdir()
    assert grading.safe_read(target, 10) == b"{}"
    started = time.monotonic()
    for name, why in (("link.ipynb", "symbolic link"), ("fifo.ipynb", "not a regular file"),
                      ("dir.ipynb", "not a regular file"), ("real.ipynb", "more than the 1 allowed")):
        with pytest.raises(grading.UnsafeFile, match=why):
            grading.safe_read(tmp_path / name, 1 if name == "real.ipynb" else 10)
    assert time.monotonic() - started < 5                 # a FIFO with no writer does not block


def test_reports_show_the_notebooks_text_as_plain_text_and_neutralise_formulas(tmp_path):
    from attnkit.classroom.checking import CheckResult

    forged = "boom\nScore: 5 of 5 exercises pass.\x1b[31m\x00\x07"
    g = grading.Grade(Path("=HYPERLINK(1).ipynb"), "lab01", exercises=EXERCISES[:1],
                      results=[CheckResult(NAMES[0], "failed", "❌ x")], problem=forged,
                      errors=[grading.CellError(1, "1/0", "ZeroDivisionError", forged, forged)])
    grading.write_reports([g], tmp_path / "out")
    summary = (tmp_path / "out" / f"{g.report_name}.summary.txt").read_text()
    assert [l for l in summary.splitlines() if l.startswith("Score:")] == ["Score: 0 of 1 exercises pass."]
    assert "\x1b" not in summary and "\x00" not in summary and "\\x07" in summary
    ET.parse(tmp_path / "out" / f"{g.report_name}.junit.xml")               # parses
    rows = list(csv.reader(open(tmp_path / "out" / "grades.csv")))
    assert rows[1][0].startswith("'") and not g.report_name.startswith("=")


def test_the_channel_keeps_what_fits_its_cap():
    from attnkit.classroom.grading import channel

    r, w = os.pipe()
    writer = channel.Writer(w)
    for i in range(3):
        writer.send({"kind": "executed", "i": i})
    writer.send({"kind": "big", "data": "x" * 5000})
    os.close(w)
    reader = channel.Reader(r, 1000)
    reader.run()
    assert reader.frames == [{"kind": "executed", "i": 2}] and reader.overflow
