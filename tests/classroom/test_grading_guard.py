"""The guard on the course's implementations (``grading.guard``) leaves the course's own Triton kernels
runnable by the course, and can be lifted while the leaderboard times the course's kernel: Triton's
interpreter (3.9 at least) rewrites a kernel from its Python function at the first launch, which failed
once the guard had replaced that function's code, so the leaderboard's timing worker could not run the
course's kernel beside the student's. The guard changes the process it runs in: each check runs in a
fresh interpreter (about 3 s)."""
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
calls = [0]
original = guard._course_called


def counting(*args, **kwargs):
    calls[0] += 1
    return original(*args, **kwargs)


guard._course_called = counting
with guard.lifted():                       # as the timing worker times the course's kernel
    item.course(x)()
lifted = calls[0]
out = item.course(x)()
print("calls lifted", lifted, "guarded", calls[0] - lifted)
o = out[0] if isinstance(out, tuple) else out
print("guarded", count, "course output", tuple(o.shape), bool(o.isfinite().all()))
"""


def test_the_courses_interpreted_kernel_still_runs_after_the_guard_is_installed():
    done = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1", "HOME": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    calls, line = done.stdout.strip().splitlines()[-2:]
    assert line.startswith("guarded ") and line.endswith("course output (1, 1, 20, 16) True"), line
    assert int(line.split()[1]) > 100             # the course's functions were guarded
    lifted, guarded = int(calls.split()[2]), int(calls.split()[4])
    assert lifted == 0 and guarded > 10, calls    # lifted: no guarded call at all; then the guard is back


def test_a_compiled_kernel_keeps_its_function_and_refuses_launches_and_compiles_from_the_notebook():
    """On a GPU the guard leaves a Triton function's Python code alone (the compiler binds calls of it through
    its signature at every compile, the course's own kernels' included) and guards its launch (``run``) and
    its compilation into a kernel (``parse``): refused with the notebook's code on the stack, allowed
    otherwise."""
    import pytest

    from attnkit.classroom.grading import guard
    from attnkit.classroom.grading.submission import CELL_PREFIX

    def helper(x, y):
        return x + y

    class FakeKernel:                      # what the guard sees of a JITFunction: fn, run, parse
        fn = staticmethod(helper)

        def run(self, *args, **kwargs):
            return ("ran", args)

        def parse(self):
            return "tree"

    kernel, code = FakeKernel(), helper.__code__
    guard.guard_compiled_kernel(kernel, "course.helper")
    assert helper.__code__ is code and kernel.run(1, grid=2) == ("ran", (1,)) and kernel.parse() == "tree"
    cell = compile("def student():\n    return kernel.run(1)\n", CELL_PREFIX + "1", "exec")
    namespace = {"kernel": kernel}
    exec(cell, namespace)
    with pytest.raises(guard.CourseImplementationCalled, match="course.helper is the course's own"):
        namespace["student"]()
    with guard.lifted():                   # the leaderboard's timing of the course's kernel
        assert namespace["student"]() == ("ran", (1,))
    with pytest.raises(guard.CourseImplementationCalled):
        namespace["student"]()
    compiling = compile("def student_kernel():\n    return kernel.parse()\n", CELL_PREFIX + "2", "exec")
    exec(compiling, namespace)
    with pytest.raises(guard.CourseImplementationCalled):
        namespace["student_kernel"]()


def test_a_course_call_inside_an_allowed_one_reads_only_the_frames_between_them(monkeypatch):
    """The course's own functions call each other (dozens of guarded calls in one attention call): a call
    inside one the guard has allowed reads the stack only up to that call, so the guard costs the course no
    more than one walk of the stack per call from outside; a notebook function in between is still refused."""
    import pytest

    from attnkit.classroom.grading import guard
    from attnkit.classroom.grading.submission import CELL_PREFIX

    class Kernel:                          # what the guard sees of a compiled Triton function
        fn = staticmethod(lambda: None)

        def __init__(self, inner=None):
            self.inner = inner

        def run(self, callback=None):
            if callback is not None:
                return callback()
            return self.inner.run() if self.inner else "done"

        def parse(self):
            return "tree"

    class CountingCodes(set):              # every frame the guard reads is looked up here once
        reads = 0

        def __contains__(self, code):
            CountingCodes.reads += 1
            return super().__contains__(code)

    inner, alone = Kernel(), Kernel()
    outer = Kernel(inner)
    for kernel, name in ((inner, "course.inner"), (alone, "course.alone"), (outer, "course.outer")):
        guard.guard_compiled_kernel(kernel, name)
    monkeypatch.setattr(guard, "TOOL_CODES", CountingCodes())

    def deep(n, kernel):
        return deep(n - 1, kernel) if n else kernel.run()

    deep(300, alone)
    one_walk, CountingCodes.reads = CountingCodes.reads, 0
    assert deep(300, outer) == "done"
    assert one_walk > 300 and CountingCodes.reads - one_walk <= 4, (one_walk, CountingCodes.reads)

    namespace = {"inner": inner}
    exec(compile("def student():\n    return inner.run()\n", CELL_PREFIX + "3", "exec"), namespace)
    with pytest.raises(guard.CourseImplementationCalled, match="course.inner"):
        outer.run(callback=namespace["student"])
