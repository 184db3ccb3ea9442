"""Grade students' lab notebooks: each one runs sandboxed and on budgets; the lab's checks judge it in
a separate process that runs none of its code; a summary, JUnit XML and grades.csv are written.

    python -m attnkit.classroom.grading --lab 01 submissions/*.ipynb [--out build/grades] [--strict]
        [--require-sandbox] [--timeout 600] [--notebook-timeout 1800] [--memory 4096] [--seed N]
    make grade LAB=01 NOTEBOOK=path/to/student_lab.ipynb [TIMEOUT=600] [STRICT=1]
    make leaderboard NOTEBOOK="a.ipynb b.ipynb"     # GPU only: times the kernels that pass; never a grade

The rooms:
    lab.py          which lab, its graded exercises and checks, the tools its notebook hands out
    submission.py   the notebook as code (in the student's process): cells, check calls removed, loading
    sandbox.py      bubblewrap, budgets and caps for a whole process tree, safe reads, the watchdog
    channel.py      the pipes between grader and workers
    codec.py        the plain data that crosses between processes (never a pickle)
    calls.py        calls of the student's code recorded in its process, replayed in the checker's
    guard.py        the course's implementations refuse the notebook's code (in the student's process)
    runner.py       the workers: the notebook's run and the student's process
    checker.py      the checker's process
    pipeline.py     one notebook graded: the three processes and how their results combine
    reports.py      summary, JUnit XML, grades.csv, and how the notebook's text is made plain
    __main__.py     the command line (and its `leaderboard` command)
    leaderboard.py  the kernel leaderboard: grade, time the kernels that pass, rank, write the CSVs and page
    timing.py       the leaderboard's timing worker: a notebook's kernels timed beside the course's and cuDNN's
    timing_runs.py  the timing workers' batches and turns, and the probe: do the steps' caps reach the GPU
"""
from .lab import GradedExercise, course_tools, find_lab, lab_checks, lab_exercises
from .pipeline import DEFAULT_MEMORY_MIB, DEFAULT_NOTEBOOK_TIMEOUT, DEFAULT_TIMEOUT, grade, protection_summary
from .reports import CellError, Grade, junit_xml, report_names, write_reports
from .sandbox import Budgets, Run, UnsafeFile, descendants, safe_read, sandbox_problem
from .submission import CELL_PREFIX, origin_problem, submission_cells

__all__ = ["GradedExercise", "course_tools", "find_lab", "lab_checks", "lab_exercises", "DEFAULT_MEMORY_MIB",
           "DEFAULT_NOTEBOOK_TIMEOUT", "DEFAULT_TIMEOUT", "grade", "protection_summary", "CellError", "Grade",
           "junit_xml", "report_names", "write_reports", "Budgets", "Run", "UnsafeFile", "descendants",
           "safe_read", "sandbox_problem", "CELL_PREFIX", "origin_problem", "submission_cells"]
