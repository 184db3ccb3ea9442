"""The kernel leaderboard: correctness gates the timing, the timing runs in a worker of the grader, the
ratios and ranks come from the times, and the page and grades.csv say that a timing is never a grade.

On a CPU the whole pipeline runs with Triton's interpreter, tiny shapes and the ``ops`` clock (it counts
the interpreter's loads, stores and products: a deterministic stand-in for a time)."""
import csv
import importlib.util
import os
import subprocess

import nbformat
import pytest
import torch
from conftest import ROOT

from attnkit.classroom import grading, site
from attnkit.classroom.grading import leaderboard, timing

FIXTURES = ROOT / "tests" / "fixtures" / "leaderboard"
no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")

SCALED_ADD = '''import torch
from attnkit.device import ensure_triton_backend
ensure_triton_backend()
import triton
import triton.language as tl


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def scaled_add(x, y, alpha, out):
    n = x.numel()
    scaled_add_kernel[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out
'''
# Lab 04's puzzle 1 three ways: blocks of 16 lanes, blocks of 2 (slower), and a wrong answer (alpha dropped).
SUBMISSIONS = {"fast": SCALED_ADD,
               "slow": SCALED_ADD.replace("BLOCK=16", "BLOCK=2").replace("cdiv(n, 16)", "cdiv(n, 2)"),
               "wrong": SCALED_ADD.replace("alpha * x + y", "x + y")}


def write_notebooks(folder):
    paths = []
    for name, code in SUBMISSIONS.items():
        path = folder / f"{name}.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)]), path)
        paths.append(path)
    return paths


@pytest.mark.slow
def test_the_whole_pipeline_on_the_cpu_gates_times_ranks_and_writes_the_csvs_and_the_page(tmp_path):
    out = tmp_path / "out"
    # Without lab 04's solution beside them (it would add its grading to this test; test_leaderboard_refusals.py
    # checks that the command adds it and refuses a board it fails).
    board = leaderboard.run_leaderboard(write_notebooks(tmp_path), out, lab="04", clock="ops", repeats=2, jobs=6,
                                        seed=7, require_solution=False, say=lambda *a: None)
    assert board.problems == []
    # The wrong kernel fails its check and gets no row; the two right ones are timed and ranked.
    assert [(r["rank"], r["student"], r["kernel"]) for r in board.rows] == [(1, "fast", "scaled_add"),
                                                                             (2, "slow", "scaled_add")]
    # n = 100: 7 programs of 16 lanes or 50 of 2, each with two loads and a store (ops clock: 1e-3 per
    # operation, plus 1e-3); PyTorch's add runs no interpreted operation.
    fast, slow = board.rows
    assert fast["student_ms"] == pytest.approx(1e-3 * (7 * 3 + 1))
    assert slow["student_ms"] == pytest.approx(1e-3 * (50 * 3 + 1))
    assert fast["library_ms"] == pytest.approx(1e-3) and fast["course_ms"] is None
    assert (fast["vs_library"], slow["vs_library"]) == (pytest.approx(22), pytest.approx(151))
    assert fast["repeats"] == 2 and fast["note"] == "" and fast["sandboxed"] == ("yes" if grading.sandbox_problem()
                                                                                 is None else "no")

    # grades.csv: the grader's own columns and values first, unchanged; then the ratios, "not graded".
    plain = tmp_path / "plain"
    grading.write_reports([e.grade for e in board.entries], plain)
    with open(plain / "grades.csv") as f:
        own = list(csv.reader(f))
    with open(out / "grades" / "lab04_triton_primer" / "grades.csv") as f:
        table = list(csv.reader(f))
    assert [line[:len(own[0])] for line in table] == own
    added = table[0][len(own[0]):]
    assert added and all(name.endswith("(not graded)") for name in added)
    rows = {line[1]: dict(zip(table[0], line)) for line in table[1:]}
    column = "scaled_add: student time / torch.add on the CPU time (not graded)"
    assert (rows["fast"][column], rows["slow"][column], rows["wrong"][column]) == ("22", "151", "")
    assert "scaled_add: not timed (its checks did not all pass)" in rows["wrong"]["timing note (not graded)"]
    assert "scaled_add" not in rows["fast"]["timing note (not graded)"]

    # The leaderboard's CSV, with where it was measured; the page made from it.
    recorded = leaderboard.read_rows(out / leaderboard.CSV_NAME)
    assert [(r["rank"], r["student"], r["vs_library"]) for r in recorded] == [("1", "fast", "22"), ("2", "slow", "151")]
    assert {"gpu", "date", "torch", "triton"} <= set(recorded[0]) and recorded[0]["triton"]
    page = (out / leaderboard.PAGE_NAME).read_text()
    assert page == leaderboard.page_markdown(recorded)
    assert "never part of a grade" in page and "## Lab 04 · " in page
    assert "| 1 | fast | scaled\\_add | n=100 | 0.022 | – | 22.00× |" in page
    assert "| 2 | slow | scaled\\_add | n=100 | 0.151 | – | 151.00× |" in page
    assert "wrong" not in page


@no_gpu
def test_without_a_gpu_the_command_says_so_exits_non_zero_and_writes_nothing(tmp_path):
    out = tmp_path / "board"
    done = subprocess.run(["make", "-s", "leaderboard", f"NOTEBOOK={ROOT / 'solutions' / 'lab04_triton_primer.ipynb'}",
                           f"OUT={out}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "the leaderboard needs a CUDA GPU" in done.stderr and "Nothing was written" in done.stderr
    assert not out.exists()
    assert leaderboard.main([str(ROOT / "solutions" / "lab04_triton_primer.ipynb"), "--out", str(out)]) == 2
    assert not out.exists()


def test_bad_arguments_get_clear_errors(tmp_path):
    nb = tmp_path / "lab05_x.ipynb"
    with pytest.raises(ValueError, match="lab: lab 01 has no kernel on the leaderboard"):
        leaderboard.run_leaderboard([nb], tmp_path, lab="01", clock="ops")
    with pytest.raises(ValueError, match="clock: expected one of"):
        leaderboard.run_leaderboard([nb], tmp_path, clock="wall")
    with pytest.raises(ValueError, match="repeats: must be a positive integer"):
        leaderboard.run_leaderboard([nb], tmp_path, clock="ops", repeats=0)
    with pytest.raises(ValueError, match="jobs: must be a positive integer"):
        leaderboard.run_leaderboard([nb], tmp_path, clock="ops", jobs=0)
    with pytest.raises(ValueError, match="lab: .*alice.ipynb.* pass --lab"):
        leaderboard.run_leaderboard([tmp_path / "alice.ipynb"], tmp_path, clock="ops")
    with pytest.raises(ValueError, match="notebooks: give at least one"):
        leaderboard.run_leaderboard([], tmp_path, clock="ops")
    with pytest.raises(ValueError, match="gpu_memory_mib: the cuda clock needs a positive GPU memory cap"):
        leaderboard.run_leaderboard([nb], tmp_path, clock="cuda", gpu_memory_mib=0)
    assert list(tmp_path.iterdir()) == []                   # nothing graded, nothing written


def test_measure_takes_turns_rotating_the_order_and_reports_the_medians():
    order = []
    times = {"student": [3.0, 1.0, 2.0], "course": [5.0, 4.0, 6.0], "library": [1.0, 1.0, 9.0]}

    def clock(fn):
        order.append(fn())
        return times[order[-1]].pop(0)
    ms, samples = timing.measure({n: (lambda n=n: n) for n in times}, clock, 3)
    assert order == ["student", "course", "library", "course", "library", "student", "library", "student", "course"]
    assert ms == {"student": 2.0, "course": 5.0, "library": 1.0}
    assert samples == {"student": [3.0, 1.0, 2.0], "course": [5.0, 4.0, 6.0], "library": [1.0, 1.0, 9.0]}
    with pytest.raises(ValueError, match="repeats"):
        timing.measure({}, clock, 0)


def _entry(student, lab, kernel_names, ms_by_kernel):
    lesson = grading.find_lab(lab)
    kernels = {k.name: k for k in timing.timed_kernels()[lesson.number]}
    e = leaderboard.Entry(ROOT / f"{student}.ipynb", lesson, student=student)
    e.gated = [kernels[n] for n in kernel_names]
    e.timing = {n: {"kind": "timing", "item": n, "ms": ms, "samples": {"student": [ms.get("student")] * 3},
                    "notes": {}} for n, ms in ms_by_kernel.items()}
    return e


def test_ratios_ranks_and_the_rows_that_are_not_ranked():
    clean = {5: {"flash_forward": {"course": 1.0, "library": 0.8}}}
    entries = [
        _entry("ann", "05", ["flash_forward"], {"flash_forward": {"student": 3.0, "course": 1.0, "library": 0.8}}),
        _entry("bob", "05", ["flash_forward"], {"flash_forward": {"student": 2.0, "course": 1.1, "library": 0.8}}),
        # its process made the course's kernel twice as slow as in a clean process: listed, not ranked
        _entry("cat", "05", ["flash_forward"], {"flash_forward": {"student": 1.5, "course": 2.0, "library": 0.8}}),
        # faster than half the fastest clean baseline: not believed
        _entry("dan", "05", ["flash_forward"], {"flash_forward": {"student": 0.32, "course": 1.0, "library": 0.8}}),
        # passed its checks, but its kernel was wrong at the timed shape: no time, no row
        _entry("eve", "05", ["flash_forward"], {"flash_forward": {"course": 1.0, "library": 0.8}}),
        # a time that is not a positive finite number is not believed either
        _entry("fay", "05", ["flash_forward"], {"flash_forward": {"student": float("nan"), "course": 1.0}}),
    ]
    rows = leaderboard.build_rows(entries, clean, device="cuda", clock="test")
    assert [(r["rank"], r["student"]) for r in rows] == [(1, "bob"), (2, "ann"), (None, "dan"), (None, "cat")]
    bob, ann, dan, cat = rows
    assert bob["vs_course"] == pytest.approx(2.0 / 1.1) and bob["vs_library"] == pytest.approx(2.5)
    assert ann["vs_course"] == pytest.approx(3.0) and ann["shape"] == "B=8, H=16, N=4096, D=64"
    assert ann["library"] == "cuDNN SDPA" and ann["spread_pct"] == 0
    assert "course's time in this notebook's process is 2.00× its time in a clean process" in cat["note"]
    assert "0.40× the fastest clean baseline is not plausible" in dan["note"]
    page = leaderboard.page_markdown(rows)
    assert "| – | cat |" in page and "Notes:" in page and "- cat, flash\\_forward: not ranked: the course" in page


def test_lab_04_is_bounded_by_its_bytes_not_by_pytorchs_unfused_ops():
    """PyTorch's masked softmax is three passes over the scores: a fused kernel at a fifth of its time is
    plausible (the course's own solution measured 0.22× on an H200), while a time below half the kernel's
    floor (its bytes once at the copy bandwidth, measured by the clean worker) is not."""
    clean = {4: {"causal_softmax": {"course": None, "library": 0.176, "floor": 0.03}}}
    entries = [_entry("gus", "04", ["causal_softmax"], {"causal_softmax": {"student": 0.039, "library": 0.176}}),
               _entry("hal", "04", ["causal_softmax"], {"causal_softmax": {"student": 0.012, "library": 0.176}})]
    rows = leaderboard.build_rows(entries, clean, device="cuda", clock="test")
    assert [(r["rank"], r["student"]) for r in rows] == [(1, "gus"), (None, "hal")]
    assert rows[0]["note"] == "" and rows[0]["vs_library"] == pytest.approx(0.039 / 0.176)
    assert "0.40× the time to read its inputs and write its output once" in rows[1]["note"]
    fused = {5: {"flash_forward": {"course": 1.0, "library": 0.8, "floor": None}}}
    fast = [_entry("ivy", "05", ["flash_forward"], {"flash_forward": {"student": 0.35, "course": 1.0,
                                                                        "library": 0.8}})]
    row, = leaderboard.build_rows(fast, fused, device="cuda", clock="test")
    assert "0.44× the fastest clean baseline is not plausible" in row["note"]       # cuDNN's 0.8 bounds it


def test_the_floor_is_each_array_read_and_out_written_once():
    item = next(k for k in timing.timed_kernels()[4] if k.name == "matmul")
    x = item.inputs(item.shape("tiny"), "cpu")
    m, k, n = 20, 20, 20
    assert item.moved_bytes(x) == 2 * (m * k + k * n) + 4 * m * n       # fp16 a, b; fp32 out
    assert not item.fused_library and all(t.fused_library and t.moved_bytes is None
                                          for lab in (5, 6, 8) for t in timing.timed_kernels()[lab])


def test_the_copy_rate_counts_each_byte_read_and_written():
    copied = []

    def clock(fn):
        copied.append(fn())
        return 3.0                                   # ms
    assert timing.copy_time_per_byte(clock, "cpu", 1000) == pytest.approx(3.0 / 2000)
    assert copied[0].shape == (1000,) and int(copied[0].sum()) == 0


def test_the_page_shows_text_as_text_and_says_when_nothing_is_recorded():
    row = {"rank": "1", "student": "a|b <script>alert(1)</script> *x* $y$", "lab": "05", "kernel": "flash_forward",
           "shape": "B=1", "student_ms": "1.5", "vs_course": "2", "vs_library": "", "library": "cuDNN SDPA",
           "gpu": "NVIDIA H100", "date": "2026-11-28", "torch": "2.11", "triton": "3.6", "clock": "c", "note": ""}
    page = leaderboard.page_markdown([row])
    line = next(l for l in page.splitlines() if "flash" in l)
    assert line.count("|") - line.count("\\|") == 13              # 12 cells: the name's pipe is escaped
    assert "<script>" not in page and "\\<script\\>" in page and "\\*x\\* \\$y\\$" in page
    assert "| 2.00× | – |" in line and "recorded on nvidia h100" in page.lower()
    empty = leaderboard.page_markdown([])
    assert "No leaderboard has been recorded yet" in empty and "make leaderboard" in empty


def test_the_site_shows_the_recorded_leaderboard_linked_from_the_index(tmp_path):
    root, src = tmp_path / "course", tmp_path / "src"
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "00_setup.ipynb").write_text((ROOT / "notebooks" / "00_setup.ipynb").read_text())
    site.stage(src, root=root)
    assert "No leaderboard has been recorded yet" in (src / "leaderboard.md").read_text()
    index = (src / "index.md").read_text()
    assert ":caption: Recorded results\n\nleaderboard\n" in index
    recorded = root / site.LEADERBOARD_CSV
    recorded.parent.mkdir(parents=True)
    rows = leaderboard.build_rows([_entry("ann", "08", ["paged_decode"], {"paged_decode": {
        "student": 2.0, "course": 1.0, "library": 1.6}})], {}, device="cuda", clock="test")
    leaderboard.write_csv(rows, recorded, {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-28", "torch": "2.11",
                                           "triton": "3.6", "cuda": "12.8", "cudnn": "91002"})
    assert site.leaderboard_page(src, root) == "leaderboard.md"
    page = (src / "leaderboard.md").read_text()
    assert page == leaderboard.page_markdown(leaderboard.read_rows(recorded), source=site.LEADERBOARD_CSV)
    assert "| 1 | ann | paged\\_decode |" in page and "| 2.00× | 1.25× | cuDNN SDPA on the gathered" in page


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the ops clock counts the work of Triton's interpreter; this process compiles kernels")
def test_every_timed_kernel_runs_at_its_tiny_shape_with_the_solutions_and_a_wrong_one_is_not_timed():
    from attnkit.classroom.grading.submission import load_cells, submission_cells

    for lab, kernels in timing.timed_kernels().items():
        nb = nbformat.read(ROOT / grading.find_lab(lab).solution, as_version=4)
        ns, failures = load_cells(submission_cells(nb), 600, lambda text: None)
        assert failures == [], failures
        for k in kernels:
            calls, notes = timing.prepare(k, ns, "tiny", "cpu")
            assert notes == {} and set(calls) == {"student", "library"} | ({"course"} if k.course else set()), k.name
            ms, samples = timing.measure(calls, timing.OpCountClock(), 1)
            assert ms["library"] == pytest.approx(1e-3) and ms["student"] > 1e-3, k.name   # PyTorch: no interpreted op
            assert k.course is None or ms["course"] > 1e-3, k.name
        # Right on every check, wrong at the timed shape (a kernel that looks at the shape): not timed.
        name = kernels[0].functions[-1]
        real = ns[name]
        wrong = {4: lambda x, y, alpha, out: real(x, y, 2 * alpha, out),
                 5: lambda q, k, v, causal=False: (real(q, k, v, causal=causal)[0] * 1.1, real(q, k, v, causal)[1]),
                 6: lambda *args, **kwargs: real(*args, **kwargs) * 1.1,
                 8: lambda *args: real(*args) * 1.1}[lab]
        wrong.__code__ = wrong.__code__.replace(co_filename="<notebook cell 99>")     # as if the notebook's
        ns[name] = wrong
        calls, notes = timing.prepare(kernels[0], ns, "tiny", "cpu")
        assert calls is None and "wrong at the timed shape" in notes["student"], (lab, notes)


def test_gate_error_is_the_largest_difference_over_the_largest_value():
    want = (torch.tensor([1.0, -4.0]), torch.tensor([2.0]))
    assert timing.gate_error((torch.tensor([1.0, -4.02]), torch.tensor([2.0])), want) == pytest.approx(0.005)
    assert timing.gate_error((torch.tensor([1.0, float("nan")]), torch.tensor([2.0])), want) == float("inf")
    assert timing.gate_error((torch.tensor([1.0, -4.0, 0.0]), torch.tensor([2.0])), want) == float("inf")
    assert timing.gate_error(torch.tensor([1.0, -4.0]), want) == float("inf")


def test_every_lab_on_the_leaderboard_names_exercises_of_its_lab():
    for lab, kernels in timing.timed_kernels().items():
        names = {e.function for e in grading.lab_exercises(grading.find_lab(lab))[1]}
        for k in kernels:
            assert k.lab == lab and set(k.functions) <= names, k.name
            assert set(k.shapes) == {"gpu", "tiny"} and (k.course is None) == (lab == 4)


def _make_fixtures():
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_slower_fixtures_are_what_their_script_makes_from_the_solutions_now():
    make = _make_fixtures()
    assert sorted(make.VARIANTS) == sorted(p.stem for p in FIXTURES.glob("*.ipynb"))
    assert {int(name[3:5]) for name in make.VARIANTS} == set(timing.TIMED_LABS)
    for lab in timing.TIMED_LABS:
        assert sum(int(name[3:5]) == lab for name in make.VARIANTS) == 2
    for name in make.VARIANTS:
        committed = (FIXTURES / f"{name}.ipynb").read_text()
        assert committed == make.text(name), f"{name}: run python tests/fixtures/leaderboard/make_fixtures.py"
        solution = nbformat.read(ROOT / make.VARIANTS[name][0], as_version=4)
        code = [c.source for c in nbformat.reads(committed, as_version=4).cells if c.cell_type == "code"]
        assert code != [c.source for c in solution.cells if c.cell_type == "code"]
