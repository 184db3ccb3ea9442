"""The leaderboard publishes nothing that could not mean anything: where the grading steps do not reach the
GPU, where the course's own solution fails its checks, or where its kernels (or the clean baselines) are
not timed, it refuses loudly (``LeaderboardRefused``; the command exits 1 with the reason) and writes no
CSV and no page. The grading and the GPU probe are replaced here: no test needs a GPU or grades a
notebook."""
import nbformat
import pytest
import torch
from conftest import ROOT

from attnkit.classroom.checking import FAILED, PASSED, CheckResult
from attnkit.classroom.grading import Grade, find_lab, lab_exercises, leaderboard

LAB04 = find_lab("04")
SOLUTION = ROOT / LAB04.solution
needs_solution = pytest.mark.skipif(not SOLUTION.exists(), reason=f"{LAB04.solution} does not exist")


def student(tmp_path, name="alice"):
    path = tmp_path / f"lab04_{name}.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), path)
    return path


class FakeGrading:
    """Stands in for ``pipeline.grade``: every exercise passes, except those named in ``fail`` for the
    course's solution; records what it graded and with which budgets."""

    def __init__(self, fail=()):
        self.fail, self.calls = set(fail), []

    def __call__(self, notebook, lab, **limits):
        self.calls.append((notebook, limits))
        _, exercises = lab_exercises(find_lab(lab))
        solution = notebook.read_bytes() == SOLUTION.read_bytes()        # the file or a copy of it
        results = [CheckResult(e.name, FAILED, f"❌ {e.name}: relative error 0.0038 on case 5")
                   if solution and e.name in self.fail else CheckResult(e.name, PASSED, f"✅ {e.name}")
                   for e in exercises]
        return Grade(notebook, "lab04_triton_primer", results=results, exercises=exercises, protection="test")


def no_board(out):
    return not (out / leaderboard.CSV_NAME).exists() and not (out / leaderboard.PAGE_NAME).exists()


def stale_board(out):
    out.mkdir(parents=True, exist_ok=True)
    for name in (leaderboard.CSV_NAME, leaderboard.PAGE_NAME):
        (out / name).write_text("an earlier board\n")


@needs_solution
def test_where_the_grading_steps_do_not_reach_the_gpu_nothing_is_graded_and_no_board_is_written(tmp_path,
                                                                                               monkeypatch):
    grading = FakeGrading()
    probes = []
    monkeypatch.setattr(leaderboard, "grade", grading)
    monkeypatch.setattr(leaderboard, "grading_reaches_gpu", lambda budgets, sandbox: probes.append(budgets) or
                        (False, "torch.cuda.is_available() is False"))
    out = tmp_path / "out"
    stale_board(out)
    with pytest.raises(leaderboard.LeaderboardRefused,
                       match=r"no leaderboard was written: a process on the grading steps' caps does not reach the "
                             r"GPU \(torch.cuda.is_available\(\) is False\)"):
        leaderboard.run_leaderboard([student(tmp_path)], out, clock="cuda", gpu_memory_mib=4096, say=lambda *a: None)
    assert grading.calls == [] and no_board(out)          # refused before grading; the earlier board removed
    # The probe ran on the steps' GPU budgets: no address-space cap, the allocator's cap.
    assert [b.gpu_memory_mib for b in probes] == [4096]


@needs_solution
def test_the_courses_solution_is_added_and_a_board_it_fails_is_refused_with_the_reason(tmp_path, monkeypatch):
    grading = FakeGrading(fail={"scaled_add"})
    monkeypatch.setattr(leaderboard, "grade", grading)
    timed = []
    monkeypatch.setattr(leaderboard, "run_timing_jobs", lambda *a, **k: timed.append(a))
    out = tmp_path / "out"
    stale_board(out)
    said = []
    with pytest.raises(leaderboard.LeaderboardRefused) as refused:
        leaderboard.run_leaderboard([student(tmp_path)], out, clock="ops", say=said.append)
    message = str(refused.value)
    assert "the course's own solution does not pass its checks" in message
    assert "lab04_triton_primer" in message and "scaled_add: relative error 0.0038 on case 5" in message
    assert f"of {len(lab_exercises(LAB04)[1])}" in message
    # The solution was not given: it was added, graded beside the student's, and the run stopped before timing.
    assert [c[0] for c in grading.calls] == [tmp_path / "lab04_alice.ipynb", SOLUTION]
    assert any("adding the course's solution" in line for line in said)
    assert timed == [] and no_board(out)
    # The grades are kept for the record (they say why).
    assert (out / "grades" / "lab04_triton_primer" / "grades.csv").exists()


@needs_solution
def test_a_copy_of_the_solution_counts_as_the_solution(tmp_path, monkeypatch):
    grading = FakeGrading(fail={"scaled_add"})
    monkeypatch.setattr(leaderboard, "grade", grading)
    copy = tmp_path / "lab04_copy.ipynb"
    copy.write_bytes(SOLUTION.read_bytes())
    with pytest.raises(leaderboard.LeaderboardRefused):
        leaderboard.run_leaderboard([copy], tmp_path / "out", clock="ops", say=lambda *a: None)
    assert [c[0] for c in grading.calls] == [copy]            # judged as the solution, not added a second time


@needs_solution
def test_a_passing_solution_whose_kernels_are_not_timed_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(leaderboard, "grade", FakeGrading())
    jobs_seen = []

    def no_times(jobs, budgets, sandbox, parallel, env, say):
        jobs_seen.extend(jobs)
        for job in jobs:
            if job.key[0] == "baseline":
                job.problem = "the timing process ended without its results (Killed)"
    monkeypatch.setattr(leaderboard, "run_timing_jobs", no_times)
    out = tmp_path / "out"
    with pytest.raises(leaderboard.LeaderboardRefused) as refused:
        leaderboard.run_leaderboard([SOLUTION], out, clock="ops", say=lambda *a: None)
    message = str(refused.value)
    assert "the course's own kernels were not all timed" in message
    assert "lab04_triton_primer, scaled_add: no time came back" in message
    assert "lab 04 baselines: the timing process ended without its results (Killed)" in message
    assert {j.key[0] for j in jobs_seen} == {"student", "baseline"} and no_board(out)


@needs_solution
def test_the_command_exits_1_and_names_the_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)     # the grader's own check of a GPU
    monkeypatch.setattr(leaderboard, "grade", FakeGrading())
    monkeypatch.setattr(leaderboard, "grading_reaches_gpu", lambda budgets, sandbox: (False, "no CUDA device"))
    out = tmp_path / "out"
    assert leaderboard.main([str(student(tmp_path)), "--out", str(out), "--no-sandbox"]) == 1
    err = capsys.readouterr().err
    assert "❌ no leaderboard was written: a process on the grading steps' caps does not reach the GPU" in err
    assert no_board(out)


def test_without_the_solution_in_this_checkout_the_leaderboard_asks_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(leaderboard, "course_solution", lambda lesson: None)
    monkeypatch.setattr(leaderboard, "grade", FakeGrading())
    with pytest.raises(ValueError, match=r"notebooks: the course's solution of lab 04 \(solutions/lab04_triton_primer"
                                         r".ipynb\) is not here"):
        leaderboard.run_leaderboard([student(tmp_path)], tmp_path / "out", clock="ops", say=lambda *a: None)
