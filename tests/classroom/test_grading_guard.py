"""The guard on the course's implementations (``grading.guard``) leaves the course's own Triton kernels
runnable by the course: Triton's interpreter (3.9 at least) rewrites a kernel from its Python function at
the first launch, which failed once the guard had replaced that function's code, so the leaderboard's
timing worker could not run the course's kernel beside the student's. The guard changes the process it
runs in: each check runs in a fresh interpreter (about 3 s)."""
import subprocess
import sys

from conftest import ROOT

CODE = """
from attnkit.device import ensure_triton_backend, triton_interprets
ensure_triton_backend()
from attnkit.classroom.grading import guard, timing
from attnkit.classroom.grading.checker import lab_module
from attnkit.classroom.grading.lab import course_tools, find_lab
assert triton_interprets()
lesson = find_lab("05")
count = guard.install(lab_module("attnkit.classroom.labchecks.lab05"), [tuple(t) for t in course_tools(lesson)])
item = timing.timed_kernels()[5][0]
x = item.inputs(item.shape("tiny"), "cpu")
out = item.course(x)()
o = out[0] if isinstance(out, tuple) else out
print("guarded", count, "course output", tuple(o.shape), bool(o.isfinite().all()))
"""


def test_the_courses_interpreted_kernel_still_runs_after_the_guard_is_installed():
    done = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1", "HOME": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("guarded ") and line.endswith("course output (1, 1, 20, 16) True"), line
    assert int(line.split()[1]) > 100             # the course's functions were guarded
