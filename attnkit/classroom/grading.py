"""Grade students' lab notebooks: run each one sandboxed and on a budget, then apply the lab's checks
on hidden cases in a fresh process; write a summary, JUnit XML and grades.csv.

    python -m attnkit.classroom.grading --lab 01 submissions/*.ipynb [--out build/grades] [--strict]
        [--timeout 600] [--notebook-timeout 1800] [--memory 4096] [--seed N] [--no-sandbox]
    make grade LAB=01 NOTEBOOK=path/to/student_lab.ipynb [TIMEOUT=600]

Each notebook is graded in two steps, each in its own process group, from a fresh staging folder that
holds only the submission:

1. **The notebook runs** top to bottom in a Jupyter kernel (a cell that raises is recorded and the run
   goes on). Each cell has ``--timeout`` seconds, the notebook ``--notebook-timeout``; a cell past its
   budget is interrupted, and if it ignores the interrupt the whole process group is killed. Every
   process has an address-space cap of ``--memory`` MiB. This run gives the executed copy and the list
   of cells that raised; it grades nothing.
2. **The checks run** in a fresh Python process: the notebook's code cells, without its check-cell
   calls, are loaded as a module (same budgets), the functions the lab's exercises name are taken
   from it, and the lab's ``check_lab`` is called on them with a secret random seed, so the cases are
   ones the notebook never saw. The package, the check functions and the checks' references are
   imported before the student's code runs; what that code changes in them is put back (and reported);
   each call of a student's function runs in its own thread, so the checker's frames are not on its
   stack, and while it runs the course's own implementations (``attnkit.reference``, ``.kernels``,
   ``.serving.kv_cache``, ``.bench.iomodel`` and the checks' ``reference`` functions, except those
   the lab notebook imports as tools) refuse to be called from the student's code. A function that
   *is* one of the course's (``softmax_rows = softmax_np``) earns nothing.

Both steps run inside bubblewrap (``bwrap``) where it works: a read-only view of the system and the
Python environment, the package read-only, the repository (``solutions/``, ``labs/``, other students'
files) absent, no network, a private ``/tmp``, and only the staging folder writable. Where bwrap is
missing the grading still runs, and the summary says which protections remain.

Written to the output folder, per notebook ``<name>``:
    <name>.summary.txt   the reports students see, the score, and the cells that raised
    <name>.junit.xml     one test case per exercise plus "notebook runs without errors"
    <name>.ipynb         the notebook as executed in step 1 (outputs and errors included)
and ``grades.csv`` with one row per notebook graded in that run.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import importlib
import importlib.util
import inspect
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .checking import FAILED, NOT_IMPLEMENTED, PASSED, CheckResult
from .course import LESSONS, Lesson

DEFAULT_TIMEOUT = 600              # seconds per cell: the Triton interpreter is slow on a CPU
DEFAULT_NOTEBOOK_TIMEOUT = 1800    # seconds per notebook, for each of the two steps
DEFAULT_MEMORY_MIB = 4096          # address space per process (importing torch maps about 1 GiB)
CELL_PREFIX = "<notebook cell "    # the file name of the student's code in the checking process
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
PACKAGE_DIR = Path(__file__).resolve().parents[1]          # attnkit/
# The course's own implementations: the student's code may not call them while it is being checked.
COURSE_IMPLEMENTATIONS = ("attnkit.reference", "attnkit.kernels", "attnkit.serving.kv_cache",
                          "attnkit.bench.iomodel")


# ------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class CellError:
    cell: int          # the code cell's number in the notebook, counting code cells from 1
    first_line: str    # the cell's first line of code, to find it by
    ename: str
    evalue: str
    traceback: str

    def line(self) -> str:
        return f"code cell {self.cell} ({self.first_line}) raised {self.ename}: {self.evalue}"


@dataclass(frozen=True)
class GradedExercise:
    """One graded exercise: the function the student defines and the check that judges it."""

    function: str                 # "softmax_rows"
    check: str                    # "check_softmax"
    points: int = 1
    depends: tuple[str, ...] = ()

    @property
    def call(self) -> str:
        return f"{self.check}({self.function})"

    @property
    def name(self) -> str:
        return self.function


@dataclass
class Grade:
    """The result of grading one notebook."""

    notebook: Path
    lab: str                                   # e.g. "lab01_attention_by_hand"
    results: list[CheckResult] = field(default_factory=list)    # one per exercise, in order
    exercises: list[GradedExercise] = field(default_factory=list)
    errors: list[CellError] = field(default_factory=list)
    problem: str | None = None                 # why the notebook could not be run or checked fully
    notes: list[str] = field(default_factory=list)   # what the grader saw and undid (for review)
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
        lines = [f"{self.lab} · {self.notebook}"]
        if self.problem:
            lines.append(f"⚠️ {self.problem}")
        lines += [r.report for r in self.results]
        unit = "exercises pass" if all(e.points == 1 for e in self.exercises) else "points"
        lines.append(f"Score: {self.score} of {self.total} {unit}." if unit == "points"
                     else f"Score: {self.score} of {self.total} exercises pass.")
        if self.errors:
            lines.append("Cells that raised while the notebook ran top to bottom:")
            lines += [f"   {e.line()}" for e in self.errors]
        elif not self.problem:
            lines.append("The notebook ran top to bottom without an error.")
        if self.notes:
            lines.append("For review:")
            lines += [f"   {n}" for n in self.notes]
        if self.protection:
            lines.append(f"Isolation: {self.protection}")
        return "\n".join(lines)


def find_lab(lab: str | int) -> Lesson:
    """The lesson whose lab is meant by ``lab``: 1, "01", "lab01", "attention_by_hand" or a lab's path."""
    text = str(lab).strip()
    name = Path(text).name.removesuffix(".ipynb")
    match = re.fullmatch(r"(?:lab)?(\d{1,2})(?:_\w+)?", name)
    with_labs = [l for l in LESSONS if l.has_lab]
    for lesson in with_labs:
        if (match and int(match.group(1)) == lesson.number) or name == lesson.slug:
            return lesson
    known = ", ".join(f"{l.number:02d} ({l.slug})" for l in with_labs)
    raise ValueError(f"lab: {lab!r} names no lab of the course; the labs are {known}")


# ---------------------------------------------------------------------------------- the lab's exercises
def _accepts_seed(check) -> bool:
    try:
        params = inspect.signature(check).parameters
    except (TypeError, ValueError):
        return False
    return "seed" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _code_cell_trees(nb):
    """The parsed syntax tree of each code cell of ``nb`` that parses (magics and typos are passed over)."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            try:
                yield ast.parse(cell.source)
            except SyntaxError:
                continue


def _check_cell_calls(module, notebook: Path) -> list[tuple[str, str]]:
    """(check name, function name) of each cell of a lab notebook that is one ``check_x(name)`` call."""
    import nbformat

    found = []
    for tree in _code_cell_trees(nbformat.read(notebook, as_version=4)):
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Expr) or \
                not isinstance(tree.body[0].value, ast.Call):
            continue
        call = tree.body[0].value
        func = call.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name.startswith("check_") and name not in ("check_lab", "check_all") and len(call.args) == 1 \
                and isinstance(call.args[0], ast.Name) and callable(getattr(module, name, None)):
            if (name, call.args[0].id) not in found:
                found.append((name, call.args[0].id))
    return found


def lab_checks(module, lesson: Lesson | None = None, root: Path | None = None, pairs=None) -> list:
    """The lab's exercises as ``attnkit.classroom.checking.Exercise`` objects, each check taking
    ``(student_fn, *, seed=None)``.

    Read from the module's ``EXERCISES`` (a tuple of ``Exercise``, or a mapping function name ->
    check); a lab module without ``EXERCISES`` is read from ``pairs`` ((check name, function name)
    pairs) or else from its lab notebook's ``check_x(name)`` cells.
    """
    from .checking import Exercise

    def seeded(check):
        if _accepts_seed(check):
            return check

        def call(fn, *, seed=None):
            return check(fn)
        call.__name__ = getattr(check, "__name__", "check")
        return call

    exercises = getattr(module, "EXERCISES", None)
    if isinstance(exercises, dict):
        return [Exercise(function=f, check=seeded(c)) for f, c in exercises.items()]
    if exercises:
        return [e if _accepts_seed(e.check) else Exercise(e.function, seeded(e.check), e.depends, e.points)
                for e in exercises]
    if pairs is not None:
        return [Exercise(function=fn, check=seeded(getattr(module, check))) for check, fn in pairs]
    if lesson is None:
        raise ValueError(f"lab: {module.__name__} defines no EXERCISES")
    from .notebooks import ROOT

    root = Path(root or ROOT)
    source = next((root / rel for rel in (lesson.lab, lesson.solution) if (root / rel).exists()), None)
    if source is None:
        raise ValueError(f"lab: {module.__name__} defines no EXERCISES and lab {lesson.number:02d} has "
                         f"no notebook to read its check cells from")
    return [Exercise(function=fn, check=seeded(getattr(module, check))) for check, fn in
            _check_cell_calls(module, source)]


def course_tools(lesson: Lesson, root: Path | None = None) -> list[tuple[str, str]]:
    """(module, name) of each ``from attnkit... import name`` in the lab notebook (or its solution):
    the course's functions a lab hands to students as tools, which their code may call."""
    import nbformat

    from .notebooks import ROOT

    root = Path(root or ROOT)
    source = next((root / rel for rel in (lesson.lab, lesson.solution) if (root / rel).exists()), None)
    if source is None:
        return []
    tools = []
    for tree in _code_cell_trees(nbformat.read(source, as_version=4)):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("attnkit"):
                tools += [(node.module, alias.name) for alias in node.names if alias.name != "*"]
    return list(dict.fromkeys(tools))


def lab_exercises(lesson: Lesson) -> tuple[object, list[GradedExercise]]:
    """The lab's check module and its graded exercises."""
    module_name = f"attnkit.labs.lab{lesson.number:02d}"
    if importlib.util.find_spec(module_name) is None:
        raise ValueError(f"lab: lab {lesson.number:02d} has no checks yet ({module_name} does not exist)")
    module = importlib.import_module(module_name)
    exercises = [GradedExercise(e.function, getattr(e.check, "__name__", "check").lstrip("_"), int(e.points),
                                tuple(e.depends)) for e in lab_checks(module, lesson)]
    if not exercises:
        raise ValueError(f"lab: {module_name} names no exercise (EXERCISES, or check cells in its lab)")
    return module, exercises


# ------------------------------------------------------------------ the submission, as the checker loads it
def _is_check_call(node) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name.startswith("check_") or name in ("summarize",):
                return True
    return False


def submission_cells(nb) -> list[dict]:
    """The notebook's code cells as the checking process runs them: IPython syntax (``%magic``,
    ``!shell``) turned into Python, and every top-level statement that calls a check removed (blank
    lines keep the line numbers). Definitions and imports are always kept."""
    from IPython.core.inputtransformer2 import TransformerManager

    cells = []
    transformer = TransformerManager()
    number = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        number += 1
        try:
            source = transformer.transform_cell(cell.source)
        except Exception:  # noqa: BLE001 - kept as is; it raises SyntaxError when run
            source = cell.source
        try:
            tree = ast.parse(source)
        except SyntaxError:
            cells.append({"cell": number, "source": source})
            continue
        lines = source.split("\n")
        for node in tree.body:
            keep = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)
            if not isinstance(node, keep) and _is_check_call(node):
                for i in range(node.lineno - 1, node.end_lineno):
                    lines[i] = ""
                if node.col_offset:          # `a = 1; check_x(f)`: keep the statement before it
                    lines[node.lineno - 1] = source.split("\n")[node.lineno - 1][:node.col_offset].rstrip("; ")
        cells.append({"cell": number, "source": "\n".join(lines)})
    return cells


# --------------------------------------------------------------------------------------- the sandbox
_BWRAP: dict = {}


def sandbox_problem() -> str | None:
    """None when bubblewrap runs here; otherwise why not, in a few words."""
    if "problem" not in _BWRAP:
        exe = shutil.which("bwrap")
        if exe is None:
            _BWRAP["problem"] = "bubblewrap (bwrap) is not installed (`make setup` installs it as root)"
        else:
            try:
                done = subprocess.run([exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent",
                                       "--proc", "/proc", "--dev", "/dev", "true"],
                                      capture_output=True, text=True, timeout=30)
                _BWRAP["problem"] = None if done.returncode == 0 else \
                    f"bwrap cannot create a sandbox here ({done.stderr.strip() or done.returncode})"
            except (OSError, subprocess.TimeoutExpired) as exc:
                _BWRAP["problem"] = f"bwrap cannot create a sandbox here ({exc})"
    return _BWRAP["problem"]


def _readable_roots() -> list[str]:
    """What the sandbox shows read-only: the system, the Python installation and environment, and the
    package itself (not the repository around it)."""
    roots = ["/usr", "/etc", "/opt", "/sys"]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        roots.append(os.path.realpath(prefix))
    roots.append(os.path.dirname(os.path.realpath(sys.executable)))
    roots.append(str(PACKAGE_DIR))
    for path in sys.path:          # site-packages and .pth-added folders outside the prefixes
        if path and os.path.isdir(path) and "site-packages" in path:
            roots.append(os.path.realpath(path))
    out = []
    for r in sorted(set(roots), key=len):
        if os.path.exists(r) and not any(r == o or r.startswith(o.rstrip("/") + "/") for o in out):
            out.append(r)
    return out


def sandbox_argv(argv: list[str], staging: Path) -> list[str]:
    """``argv`` wrapped in bwrap: the readable roots read-only, ``staging`` the one writable folder."""
    args = [shutil.which("bwrap")]
    for link in ("/bin", "/lib", "/lib32", "/lib64", "/sbin"):
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    args += ["--tmpfs", "/tmp"]               # first: a course installed under /tmp is bound on top of it
    for root in _readable_roots():
        args += ["--ro-bind", root, root]
    args += ["--dev", "/dev", "--proc", "/proc",
             "--bind", str(staging), str(staging), "--chdir", str(staging),
             "--unshare-all", "--die-with-parent", "--new-session", "--"]
    return args + argv


def _apply_limits(memory_mib: int) -> None:
    """The worker's first act: cap its address space (inherited by the kernel it starts), no core
    files, files of at most 1 GiB, and die with the grader."""
    import resource

    cap = int(memory_mib) * 2**20
    for limit, value in (("RLIMIT_AS", cap), ("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", 2**30)):
        try:
            resource.setrlimit(getattr(resource, limit), (value, value))
        except (AttributeError, ValueError, OSError):   # not on this system (macOS has no RLIMIT_AS cap)
            print(f"grading: {limit} could not be set here", file=sys.stderr)
    try:                              # PR_SET_PDEATHSIG = 1
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - not Linux: the process group kill remains
        pass


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process, its process group, and every process descended from it."""
    targets = _descendants(proc.pid)
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: proc.kill()):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    for pid in targets:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


@dataclass
class Run:
    returncode: int | None
    stopped: str | None           # why the grader killed it, or None
    stdout: str
    stderr: str
    seconds: float


def run_budgeted(argv: list[str], staging: Path, *, cell_timeout: float, notebook_timeout: float,
                 memory_mib: int, sandbox: bool, stdin: str = "") -> Run:
    """Run ``argv`` in ``staging`` in a new process group (sandboxed when ``sandbox``), with an
    address-space cap; kill the whole group when a step named in ``staging/progress`` runs longer than
    ``cell_timeout`` (plus a grace period for the step's own interrupt) or everything longer than
    ``notebook_timeout``."""
    progress = staging / "progress"
    progress.write_text("")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(staging / ".home"),
           "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1",
           "TRITON_CACHE_DIR": str(staging / ".triton"), "JUPYTER_PLATFORM_DIRS": "1",
           "ATTNKIT_GRADING": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for key in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES"):
        if key in os.environ:
            env[key] = os.environ[key]
    (staging / ".home").mkdir(exist_ok=True)
    full = sandbox_argv(argv, staging) if sandbox else argv
    stdin = json.dumps(dict(json.loads(stdin or "{}"), memory_mib=memory_mib))
    out_path, err_path = staging.parent / f"{staging.name}.out", staging.parent / f"{staging.name}.err"
    grace = max(5.0, 0.25 * cell_timeout)
    started = time.monotonic()
    stopped = None
    with open(out_path, "w+b") as out, open(err_path, "w+b") as err:
        proc = subprocess.Popen(full, cwd=staging, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except OSError:
            pass
        step, step_started = "", started
        while proc.poll() is None:
            time.sleep(0.05)
            now = time.monotonic()
            try:
                lines = progress.read_text(errors="replace").splitlines()
            except OSError:
                lines = []
            current = lines[-1] if lines else ""
            if current != step:
                step, step_started = current, now
            if now - started > notebook_timeout:
                stopped = f"ran past the notebook's budget of {notebook_timeout:g} s"
            elif step and now - step_started > cell_timeout + grace:
                stopped = f"{step} ran past its budget of {cell_timeout:g} s and ignored the interrupt"
            if stopped:
                kill_tree(proc)
                break
        else:
            for pid in _descendants(proc.pid):         # what it left running
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stdout = out.read(2**22).decode(errors="replace")
        stderr = err.read(2**20).decode(errors="replace")
    out_path.unlink(missing_ok=True)
    err_path.unlink(missing_ok=True)
    return Run(proc.returncode, stopped, stdout, stderr, seconds)


def _worker_argv(kind: str) -> list[str]:
    # -I: no PYTHON* variables, no user site, and the working folder is not on sys.path (a file the
    # notebook writes there cannot stand in for a module).
    return [sys.executable, "-I", "-c",
            f"from attnkit.classroom.grading import _worker; _worker({kind!r})"]


# ------------------------------------------------------------------------------- step 1: run the notebook
def _notebook_worker(spec: dict) -> None:
    import nbformat
    from nbclient import NotebookClient

    progress = open("progress", "a", buffering=1)
    nb = nbformat.read(spec["notebook"], as_version=4)
    client = NotebookClient(nb, timeout=spec["cell_timeout"], kernel_name=spec["kernel"], allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": os.getcwd()}})
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]

    def started(cell, cell_index, **_):
        progress.write(f"code cell {code.index(cell_index) + 1 if cell_index in code else cell_index}\n")

    def executed(cell, cell_index, **_):
        nbformat.write(client.nb, "executed.ipynb")

    client.on_cell_start = started
    client.on_cell_executed = executed
    status = {}
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        status["problem"] = f"{type(exc).__name__}: {exc}"
    nbformat.write(client.nb, "executed.ipynb")
    with open("status.json", "w") as f:
        json.dump(status, f)


def _cell_errors(cells) -> list[CellError]:
    errors = []
    code = [c for c in cells if c.cell_type == "code"]
    for number, cell in enumerate(code, start=1):
        lines = [l for l in cell.source.splitlines() if l.strip() and not l.lstrip().startswith("#")]
        first = lines[0].strip() if lines else ""
        first = first if len(first) <= 60 else first[:57] + "..."
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                tb = ANSI.sub("", "\n".join(out.get("traceback", [])))
                errors.append(CellError(number, first, out.get("ename", "Error"), out.get("evalue", ""), tb))
    return errors


# -------------------------------------------------------------------------- step 2: the checks (worker)
class CourseImplementationCalled(Exception):
    """Raised when a student's function calls one of the course's own implementations."""


_CALLED: list[str] = []            # the course functions the student's code called, in order
_ORIGINALS: dict[int, object] = {}  # id(function) -> a callable copy of it, for the course's own callers


def _course_called(fn_id: int, name: str, args, kwargs):
    """The body of a guarded course function: the course's own code may call it (a check's callback, a
    helper a check handed over); the student's code, and any thread without course code between it and
    this call, may not."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(CELL_PREFIX) or filename == __file__:
            break
        if filename.startswith(str(PACKAGE_DIR)):
            return _ORIGINALS[fn_id](*args, **kwargs)
        frame = frame.f_back
    _CALLED.append(name)
    raise CourseImplementationCalled(f"{name} is the course's own implementation: write this exercise yourself")


def _guard_body(*args, **kwargs):
    # Becomes the code of each guarded course function (run with that function's globals).
    import sys as _s

    _g = _s.modules["attnkit.classroom.grading"]
    return _g._course_called(-7310921, _s._getframe(0).f_code.co_qualname, args, kwargs)


_PLACEHOLDER = -7310921            # in _guard_body's constants: replaced by the function's id
_GUARDED_CODES: set = set()        # the guard code objects in place now


def _guarded_functions(modules) -> list:
    import types

    found = []
    for module in modules:
        name = module.__name__
        for value in list(vars(module).values()):
            candidates = [value]
            if isinstance(value, type) and value.__module__ == name:
                candidates = [v for v in vars(value).values() if isinstance(v, types.FunctionType)]
            elif not isinstance(value, types.FunctionType) and isinstance(getattr(value, "fn", None),
                                                                          types.FunctionType):
                candidates = [value.fn]                    # a Triton kernel: its Python function
            for fn in candidates:
                if isinstance(fn, types.FunctionType) and fn.__module__ == name and not fn.__code__.co_freevars:
                    found.append(fn)
    return found


def _tool_ids(tools) -> frozenset:
    """The ids of the functions (and of the methods of the classes, and of the Python function of
    the Triton kernels) named by (module, name) pairs: the course's tools, never guarded."""
    import types

    ids = set()
    for module_name, name in tools:
        try:
            value = getattr(importlib.import_module(module_name), name)
        except Exception:  # noqa: BLE001 - a name the lab imports that is not there: nothing to allow
            continue
        found = [value, getattr(value, "fn", None)]
        if isinstance(value, type):
            found += list(vars(value).values())
        ids.update(id(f) for f in found if isinstance(f, types.FunctionType))
    return frozenset(ids)


def _reference_helpers(module) -> list:
    """The checks' own reference functions in a lab module (their names say ``ref``)."""
    import types

    return [v for k, v in vars(module).items() if isinstance(v, types.FunctionType) and "ref" in k.lower()
            and v.__module__ == module.__name__ and not v.__code__.co_freevars]


class _CourseGuard:
    """While on, the course's own implementations refuse calls that come from the student's code."""

    def __init__(self, lab_module, tools=frozenset()):
        self.lab_module = lab_module
        self.tools = tools                    # ids of the functions the lab hands out as tools
        self.swapped: list = []

    def __enter__(self):
        import types

        modules = [m for n, m in list(sys.modules.items()) if m is not None and
                   any(n == p or n.startswith(p + ".") for p in COURSE_IMPLEMENTATIONS)]
        for fn in dict.fromkeys(_guarded_functions(modules) + _reference_helpers(self.lab_module)):
            if id(fn) in self.tools:
                continue
            code = fn.__code__
            original = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
            original.__kwdefaults__ = fn.__kwdefaults__
            _ORIGINALS[id(fn)] = original
            template = _guard_body.__code__
            consts = tuple(id(fn) if c == _PLACEHOLDER else c for c in template.co_consts)
            guard = template.replace(co_name=fn.__name__, co_qualname=fn.__qualname__, co_consts=consts)
            _GUARDED_CODES.add(guard)
            fn.__code__ = guard
            self.swapped.append((fn, code))
        return self

    def __exit__(self, *exc):
        for fn, code in reversed(self.swapped):
            _GUARDED_CODES.discard(fn.__code__)
            fn.__code__ = code
        self.swapped.clear()
        return False


# The modules outside the course that the checks use (a library may patch others, e.g. torch patches
# inspect.getfile when it is imported).
_WATCHED = ("builtins", "numpy", "numpy.linalg", "numpy.random", "math", "copy", "traceback", "warnings",
            "tracemalloc", "functools", "operator", "threading", "contextvars", "gc", "torch",
            "torch.nn.functional", "torch.testing")


_CODE_WATCHED = ("numpy", "numpy.linalg", "copy", "traceback", "warnings")   # functions' code kept too


class _Snapshot:
    """What the checks rely on: the course's modules, classes and functions, the standard modules
    they use, and the import system. ``restore()`` puts back what changed and names it."""

    def __init__(self):
        import types

        if "torch" in sys.modules and "torch._dynamo" not in sys.modules:
            try:                              # it wraps torch.manual_seed when first imported
                importlib.import_module("torch._dynamo")
            except Exception:  # noqa: BLE001 - a PyTorch without it
                pass
        self.modules = {}
        self.functions = {}
        self.classes = {}
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "attnkit" or name.startswith("attnkit.") or name in _WATCHED):
                continue
            contents = dict(vars(module))
            self.modules[name] = (module, contents)
            ours = name == "attnkit" or name.startswith("attnkit.")
            if not ours and name not in _CODE_WATCHED:
                continue
            for value in contents.values():
                if isinstance(value, types.FunctionType):
                    self.functions[id(value)] = (value, value.__code__, value.__defaults__, value.__kwdefaults__)
                elif isinstance(value, type) and getattr(value, "__module__", "").startswith("attnkit"):
                    self.classes[id(value)] = (value, dict(vars(value)))
                    for attr in vars(value).values():
                        if isinstance(attr, types.FunctionType):
                            self.functions[id(attr)] = (attr, attr.__code__, attr.__defaults__, attr.__kwdefaults__)
        self.sys_modules = {n: m for n, (m, _) in self.modules.items()}
        self.sys_functions = {n: getattr(sys, n) for n in _HIDDEN_SYS if hasattr(sys, n)}
        self.meta_path, self.path_hooks, self.path = list(sys.meta_path), list(sys.path_hooks), list(sys.path)
        self.gc_callbacks = list(__import__("gc").callbacks)

    def restore(self) -> list[str]:
        import gc
        import threading
        import types

        changed = []
        for name, (module, contents) in self.modules.items():
            current = vars(module)
            ours = name == "attnkit" or name.startswith("attnkit.")
            for key, value in contents.items():
                if current.get(key, _MISSING) is not value:
                    important = callable(value) or isinstance(value, types.ModuleType)
                    if not ours and not important:
                        continue              # a library's counters and caches
                    try:
                        current[key] = value
                    except TypeError:
                        continue
                    if important or not key.startswith("_"):
                        changed.append(f"{name}.{key}")
            if ours:
                for key in [k for k in current if k not in contents]:
                    if not isinstance(current[key], types.ModuleType) and not key.startswith("__"):
                        del current[key]
                        changed.append(f"{name}.{key}")
        for cls, contents in self.classes.values():
            for key, value in contents.items():
                if vars(cls).get(key, _MISSING) is not value and key not in ("__dict__", "__weakref__"):
                    try:
                        setattr(cls, key, value)
                        changed.append(f"{cls.__module__}.{cls.__qualname__}.{key}")
                    except (AttributeError, TypeError):
                        pass
            for key in [k for k in vars(cls) if k not in contents and not k.startswith(("_abc", "__"))]:
                try:
                    delattr(cls, key)
                    changed.append(f"{cls.__module__}.{cls.__qualname__}.{key}")
                except (AttributeError, TypeError):
                    pass
        for fn, code, defaults, kwdefaults in self.functions.values():
            if fn.__code__ is not code and fn.__code__ not in _GUARDED_CODES:
                fn.__code__ = code
                changed.append(f"{fn.__module__}.{fn.__qualname__}")
            if fn.__defaults__ is not defaults or fn.__kwdefaults__ is not kwdefaults:
                fn.__defaults__, fn.__kwdefaults__ = defaults, kwdefaults
                changed.append(f"{fn.__module__}.{fn.__qualname__} (defaults)")
        for name, module in self.sys_modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
                changed.append(f"sys.modules[{name!r}]")
        for attr, value in self.sys_functions.items():
            if getattr(sys, attr, None) is not value:
                setattr(sys, attr, value)
                changed.append(f"sys.{attr}")
        for attr in ("meta_path", "path_hooks", "path"):
            if getattr(sys, attr) != getattr(self, attr):
                getattr(sys, attr)[:] = getattr(self, attr)
                changed.append(f"sys.{attr}")
        if gc.callbacks != self.gc_callbacks:
            gc.callbacks[:] = self.gc_callbacks
            changed.append("gc.callbacks")
        if sys.gettrace() is not None or sys.getprofile() is not None:
            sys.settrace(None)
            sys.setprofile(None)
            changed.append("sys.settrace/sys.setprofile")
        threading.settrace(None)
        threading.setprofile(None)
        return changed


_MISSING = object()
_HIDDEN_SYS = ("_current_frames", "_current_exceptions")


def _hide_frames() -> None:
    """Take away the ways to another thread's frames (where the checker keeps its expected values):
    the student's function runs in a thread of its own, and these would reach the checker's."""
    import gc

    for name in _HIDDEN_SYS:
        if hasattr(sys, name):
            setattr(sys, name, lambda: {})
    gc.get_objects = lambda *args, **kwargs: []
    gc.get_referrers = lambda *args: []
    gc.get_referents = lambda *args: []


class StudentError(Exception):
    """An error the student's function raised, re-raised by the checker with its name and message."""


def _plain(value, depth: int = 0, known: frozenset = frozenset()):
    """``value`` as plain data the checker may handle without running the student's code again:
    NumPy arrays and torch tensors of their exact types, numbers, strings, and tuples, lists and dicts
    of them; an object of the course's class as a copy made plain in turn (or as itself where the
    check handed it to the student: ``known`` holds their ids); anything else (an object of the
    student's class, a generator) behind a guarded proxy."""
    import numpy as np

    kind = type(value)
    if value is None or kind in (bool, int, float, complex, str, bytes):
        return value
    if kind is np.ndarray:
        if value.dtype == object:
            return np.array([_plain(v, depth + 1, known) for v in value.ravel().tolist()] or [],
                            dtype=object).reshape(value.shape)
        return value
    if kind.__module__ == "numpy" and isinstance(value, np.generic):
        return value
    if kind.__module__ == "torch" and kind.__name__ in ("Tensor", "dtype", "device", "Size"):
        return value
    if depth < 20 and kind in (tuple, list):
        return kind(_plain(v, depth + 1, known) for v in value)
    if depth < 20 and kind is dict:
        return {_plain(k, depth + 1, known): _plain(v, depth + 1, known) for k, v in value.items()}
    if depth < 20 and str(getattr(kind, "__module__", "")).startswith("attnkit.") and not isinstance(value, type):
        return value if id(value) in known else _course_object(value, depth, known)
    return _Proxy(value)


def _handed_over(args, kwargs) -> frozenset:
    """The ids of the course's objects a check handed to the student's function (in its arguments and
    the lists, tuples and dicts among them)."""
    ids, todo = set(), [args, kwargs]
    while todo and len(ids) < 100_000:
        item = todo.pop()
        if type(item) in (tuple, list):
            todo.extend(item)
        elif type(item) is dict:
            todo.extend(item.values())
        elif str(getattr(type(item), "__module__", "")).startswith("attnkit."):
            ids.add(id(item))
    return frozenset(ids)


def _course_object(value, depth: int, known: frozenset):
    """An object of one of the course's classes (a lab's ``StepPlan``) made by the student's code: a
    shallow copy whose attributes are made plain in turn, so that the check gets the class it expects
    and nothing in it runs the student's code."""
    import copy as _copy

    try:
        clone = _copy.copy(value)
        names = list(vars(clone)) if hasattr(clone, "__dict__") else []
        for cls in type(clone).__mro__:
            slots = getattr(cls, "__slots__", ())
            names += [slots] if isinstance(slots, str) else list(slots)
        for name in dict.fromkeys(names):
            if name not in ("__dict__", "__weakref__") and hasattr(clone, name):
                object.__setattr__(clone, name, _plain(getattr(clone, name), depth + 1, known))
        return clone
    except Exception:  # noqa: BLE001 - not copyable: the student's code stays behind a proxy
        return _Proxy(value)


def _torch_state():
    """PyTorch's thread-local state the check set up around the call (grad mode, inference mode, its
    __torch_function__ and __torch_dispatch__ modes, e.g. one that makes matmul raise), or None."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                list(_get_current_function_mode_stack()), list(_get_current_dispatch_mode_stack()))
    except Exception:  # noqa: BLE001 - a PyTorch without these: the defaults apply
        return None


def _run_with_torch_state(state, fn, args, kwargs):
    """``fn(*args, **kwargs)`` in this thread with ``state`` (from ``_torch_state``) in force."""
    if state is None:
        return fn(*args, **kwargs)
    torch = sys.modules["torch"]
    grad, inference, function_modes, dispatch_modes = state
    pushed = []
    # inference_mode(False) would switch grad mode on: enter it only when on, then set grad mode.
    with torch.inference_mode(True) if inference else contextlib.nullcontext(), torch.set_grad_enabled(grad):
        try:
            for mode in function_modes:
                torch._C._push_on_torch_function_stack(mode)
                pushed.append("function")
            for mode in dispatch_modes:
                torch._C._push_on_torch_dispatch_stack(mode)
                pushed.append("dispatch")
            return fn(*args, **kwargs)
        finally:
            for kind in reversed(pushed):
                if kind == "dispatch":
                    torch._C._pop_torch_dispatch_stack(None)
                else:
                    torch._C._pop_torch_function_stack()


def _unwrap(value, depth: int = 0):
    """``value`` with each proxy of a student's object replaced by the object (for the student's code)."""
    if type(value) is _Proxy:
        return object.__getattribute__(value, "_target")
    if depth < 20 and type(value) in (tuple, list):
        return type(value)(_unwrap(v, depth + 1) for v in value)
    if depth < 20 and type(value) is dict:
        return {k: _unwrap(v, depth + 1) for k, v in value.items()}
    return value


class _Student:
    """Runs the student's code for the checker: each call in a thread of its own (the checker's frames
    are not on its stack) that inherits the checker's NumPy and PyTorch modes, with the course's
    implementations guarded, on a time budget, and with what it changed in the course put back
    afterwards."""

    def __init__(self, lab_module, timeout: float, progress=None, tools=frozenset()):
        self.lab_module = lab_module
        self.tools = tools
        self.timeout = timeout
        self.progress = progress              # each call is a step of the grader's watchdog
        self.calls = 0
        self.active = False                   # a student's call is running
        self.current: str | None = None       # the exercise whose check is running
        self.tampered: dict[str, list[str]] = {}
        self.called: dict[str, list[str]] = {}
        self.stuck = 0

    def call(self, name: str, fn, args, kwargs):
        import contextvars
        import threading

        if self.active:                       # from the student's own thread, already guarded
            return fn(*args, **kwargs)
        args, kwargs = _unwrap(args), _unwrap(kwargs)     # the student's objects, as the student made them
        box: dict = {}
        torch_state = _torch_state()

        def target():
            try:
                box["value"] = _run_with_torch_state(torch_state, fn, args, kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the checker below
                box["error"] = exc

        self.calls += 1
        if self.progress is not None:
            self.progress.write(f"call {self.calls} of {name}\n")
        snapshot = _Snapshot()
        before = len(_CALLED)
        thread = threading.Thread(target=contextvars.copy_context().run, args=(target,), daemon=True,
                                  name=f"student:{name}")
        self.active = True
        try:
            with _CourseGuard(self.lab_module, self.tools):
                thread.start()
                thread.join(self.timeout)
        finally:
            self.active = False
        changed = snapshot.restore()
        exercise = self.current or name
        if changed:
            self.tampered.setdefault(exercise, []).extend(changed)
        if len(_CALLED) > before:
            self.called.setdefault(exercise, []).extend(_CALLED[before:])
        if thread.is_alive():
            self.stuck += 1
            _stop_thread(thread)
            raise TimeoutError(f"{name} ran past {self.timeout:g} s and was stopped")
        if "error" in box:
            raise _sanitize_error(box["error"]) from None
        return _plain(box.get("value"), known=_handed_over(args, kwargs))

    def wrap(self, name: str, fn):
        student = self

        def call(*args, **kwargs):
            return student.call(name, fn, args, kwargs)
        call.__name__ = call.__qualname__ = name
        call.__doc__ = f"the student's {name} (run in its own thread)"
        return call


_STUDENT: _Student | None = None


class _Proxy:
    """An object of the student's: every attribute read and call runs the student's code through the
    same guarded thread as their functions."""

    __slots__ = ("_target",)

    def __init__(self, target):
        object.__setattr__(self, "_target", target)

    def _run(self, what: str, fn, *args, **kwargs):
        return _STUDENT.call(what, fn, args, kwargs)

    def __getattr__(self, name):
        return self._run(name, getattr, object.__getattribute__(self, "_target"), name)

    def __setattr__(self, name, value):
        self._run(name, setattr, self._target, name, value)

    def __call__(self, *args, **kwargs):
        return self._run(getattr(self._target, "__name__", "function"), self._target, *args, **kwargs)

    def __iter__(self):
        return self._run("__iter__", iter, self._target)

    def __next__(self):
        return self._run("__next__", next, self._target)

    def __len__(self):
        value = self._run("__len__", len, self._target)
        return int(value)

    def __getitem__(self, key):
        return self._run("__getitem__", lambda t, k: t[k], self._target, key)

    def __setitem__(self, key, value):
        self._run("__setitem__", lambda t, k, v: t.__setitem__(k, v), self._target, key, value)

    def __contains__(self, item):
        return bool(self._run("__contains__", lambda t, i: i in t, self._target, item) is True)

    def __bool__(self):
        return self._run("__bool__", lambda t: bool(t), self._target) is True

    def __repr__(self):
        text = self._run("__repr__", repr, self._target)
        return text if type(text) is str else "<object>"

    def __eq__(self, other):
        return self._run("__eq__", lambda t, o: t == o, self._target, other) is True

    def __hash__(self):
        value = self._run("__hash__", hash, self._target)
        return value if type(value) is int else id(self)


def _stop_thread(thread) -> None:
    """Ask a stuck thread to stop (it raises SystemExit at its next Python line; it may refuse)."""
    try:
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(SystemExit))
    except Exception:  # noqa: BLE001 - best effort; the notebook's budget kills it in the end
        pass


def _trusted_exception_class(kind: type) -> type:
    """The nearest class in ``kind``'s MRO defined by Python or by the course (never the student's)."""
    for base in kind.__mro__:
        module = getattr(base, "__module__", "")
        if module == "builtins" or module.startswith("attnkit."):
            return base if issubclass(base, Exception) else Exception
    return Exception


def _sanitize_error(exc: BaseException) -> BaseException:
    """The student's exception as one the checker can handle without running the student's code:
    a blank stays NotImplementedError; anything else becomes an exception of the nearest Python or
    course class it derives from (so ``except RuntimeError`` in a check still catches it), under the
    student's class name, with its message made plain text and its traceback kept (Triton's
    interpreter wrapping taken off). SystemExit and KeyboardInterrupt become plain exceptions."""
    from .checking import is_not_implemented, student_error

    try:
        if is_not_implemented(exc):
            return NotImplementedError()
        inner = student_error(exc)
        kind = type(inner)
        name = kind.__name__ if type(kind.__name__) is str and kind.__name__.isidentifier() else "Exception"
        base = _trusted_exception_class(kind)
        args = tuple(a if type(a) in (str, int, float, bool, type(None)) else f"<{type(a).__name__} object>"
                     for a in (inner.args if type(inner.args) is tuple else ()))
        cls = base if base.__name__ == name else type(name, (base,), {"__module__": "submission"})
        try:
            plain = cls(*args)
        except Exception:  # noqa: BLE001 - a course class that wants other arguments
            plain = type(name, (StudentError,), {})(*args)
        return plain.with_traceback(inner.__traceback__)
    except BaseException:  # noqa: BLE001 - a hostile exception object
        return StudentError("your function raised an error that could not be shown")


def _origin_problem(name: str, fn) -> str | None:
    """Why ``fn`` is not the student's own function (it is, or builds on, the course's), or None."""
    import types

    target = inspect.unwrap(fn) if callable(fn) else fn
    if isinstance(target, type):
        if target.__module__ != "submission":
            return f"`{name}` is {target.__module__}.{target.__qualname__}, not a class the notebook defines"
        for base in target.__mro__[1:]:
            if base.__module__.startswith("attnkit"):
                return (f"`{name}` builds on the course's own {base.__module__}.{base.__qualname__}: "
                        f"write it yourself")
        return None
    if isinstance(target, types.FunctionType):
        if not target.__code__.co_filename.startswith(CELL_PREFIX):
            return (f"`{name}` is {target.__module__}.{target.__qualname__}, not a function the notebook "
                    f"defines: write it yourself")
        return None
    where = getattr(type(target), "__module__", "?")
    return f"`{name}` is a {where}.{type(target).__qualname__} object, not a function the notebook defines"


def _run_cells(cells: list[dict], timeout: float, progress) -> tuple[dict, list[str]]:
    """Run the submission's cells as the module ``submission``; a cell that raises or runs past
    ``timeout`` is noted and the rest run."""
    import linecache
    import types

    module = types.ModuleType("submission")
    module.__file__ = None
    sys.modules["submission"] = module
    ns = module.__dict__

    class _NoIPython:                       # %magics and !shell lines do nothing when graded
        def __getattr__(self, name):
            return lambda *a, **k: None
    ns["get_ipython"] = lambda: _NoIPython()
    ns["display"] = lambda *a, **k: None

    def alarm(signum, frame):
        raise TimeoutError(f"the cell ran past {timeout:g} s")

    signal.signal(signal.SIGALRM, alarm)
    failures = []
    for cell in cells:
        filename = f"{CELL_PREFIX}{cell['cell']}>"
        source = cell["source"]
        linecache.cache[filename] = (len(source), None, [l + "\n" for l in source.split("\n")], filename)
        progress.write(f"loading code cell {cell['cell']}\n")
        try:
            code = compile(source, filename, "exec")
            signal.setitimer(signal.ITIMER_REAL, timeout)
            try:
                exec(code, ns)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:  # noqa: BLE001 - the notebook's own error, noted
            try:
                failures.append(f"code cell {cell['cell']}: {type(exc).__name__}: {exc}")
            except BaseException:  # noqa: BLE001
                failures.append(f"code cell {cell['cell']}: an error")
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    return ns, failures


def _checks_worker(spec: dict, results_fd: int) -> None:
    import _thread

    global _STUDENT
    progress = open("progress", "a", buffering=1)
    module = importlib.import_module(spec["module"])
    from . import checking

    exercises = lab_checks(module, pairs=spec.get("pairs"))
    check_exercises, Exercise = checking.check_exercises, checking.Exercise
    write, exit_now = os.write, os._exit
    student = _STUDENT = _Student(module, spec["cell_timeout"], progress, _tool_ids(spec.get("tools") or []))
    _hide_frames()
    snapshot = _Snapshot()
    threads_before = _thread._count()

    ns, failures = _run_cells(spec["cells"], spec["cell_timeout"], progress)
    notes = []
    changed = snapshot.restore()
    if changed:
        notes.append("the notebook's code changed the course's code or the import system; it was put back "
                     "before the checks ran: " + _names(changed))
    functions, refused = {}, {}
    for ex in exercises:
        fn = ns.get(ex.function, _MISSING)
        if fn is _MISSING:
            refused[ex.function] = (f"❌ {ex.function}: the notebook defines no `{ex.function}` (was its "
                                    f"cell run without an error, and is it still called `{ex.function}`?)")
        elif not callable(fn):                # a value the exercise asks for (a number, a table)
            functions[ex.function] = _plain(fn)
            continue
        elif (problem := _origin_problem(ex.function, fn)) is not None:
            refused[ex.function] = f"❌ {ex.function}: {problem}."
        if ex.function in refused:
            def stand_in(*args, _name=ex.function, **kwargs):
                raise StudentError(f"`{_name}` is not graded: see its report")
            functions[ex.function] = stand_in
        else:
            functions[ex.function] = student.wrap(ex.function, fn)

    results = []
    progress.write("checks\n")
    seed = spec["seed"]
    try:
        # check_lab's table, one exercise at a time, so that what each check saw is its own.
        tracked = tuple(Exercise(e.function, _tracking(student, e), e.depends, e.points) for e in exercises)
        summary = check_exercises(tracked, functions, seed=seed)
        for ex, r in zip(exercises, summary.results):
            status, report = r.status, r.report
            if ex.function in refused:
                status, report = FAILED, refused[ex.function]
            elif ex.function in student.called:
                status = FAILED
                report = (f"❌ {ex.function}: your function called the course's own "
                          f"{student.called[ex.function][0]}: write this exercise yourself.")
            results.append({"name": ex.function, "status": status, "report": report})
            if ex.function in student.tampered:
                notes.append(f"while {ex.function} was checked, the student's code changed "
                             f"{_names(student.tampered[ex.function])}; it was put back")
    except BaseException as exc:  # noqa: BLE001 - the checks themselves failed: nothing is graded
        results = [{"name": e.function, "status": FAILED,
                    "report": f"❌ {e.function}: not graded: the checks stopped ({type(exc).__name__}: {exc})"}
                   for e in exercises]
    if _thread._count() > threads_before + student.stuck:
        notes.append("the notebook's code left threads running while it was checked")
    record = {"results": results, "cell_failures": failures, "notes": list(dict.fromkeys(notes))}
    write(results_fd, (json.dumps(record) + "\n").encode())
    exit_now(0)


def _names(changed: list[str], limit: int = 24) -> str:
    names = sorted(set(changed))
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _tracking(student: _Student, exercise):
    def check(fn, *, seed=None):
        student.current = exercise.function
        try:
            return exercise.check(fn, seed=seed)
        finally:
            student.current = None
    check.__name__ = getattr(exercise.check, "__name__", "check")
    return check


def _worker(kind: str) -> None:
    """Entry point of the processes the grader starts (in the staging folder, usually sandboxed)."""
    spec = json.loads(sys.stdin.read())
    _apply_limits(spec["memory_mib"])
    if kind == "notebook":
        _notebook_worker(spec)
        return
    results_fd = os.dup(1)                       # the checker's channel; the student's output goes to a file
    log = os.open("checks_output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    _checks_worker(spec, results_fd)


# ------------------------------------------------------------------------------------------ grading
def protection_summary(sandbox: bool, memory_mib: int, cell_timeout: float, notebook_timeout: float) -> str:
    budgets = (f"budgets of {cell_timeout:g} s per cell and {notebook_timeout:g} s per notebook with the "
               f"whole process group killed, {memory_mib} MiB of address space per process, checks in a "
               f"fresh process on hidden cases, the course's code restored after the student's code ran "
               f"and its implementations refused to the student's code")
    if sandbox:
        return (f"bubblewrap sandbox (package read-only, repository and solutions absent, no network, only "
                f"the staging folder writable); {budgets}.")
    why = sandbox_problem() or "turned off (--no-sandbox)"
    return (f"NO SANDBOX ({why}): the student's code could read solutions/ and write to the repository "
            f"and the package; what remains: {budgets}.")


def grade(notebook: str | Path, lab: str | int, *, timeout: float = DEFAULT_TIMEOUT,
          notebook_timeout: float = DEFAULT_NOTEBOOK_TIMEOUT, memory_mib: int = DEFAULT_MEMORY_MIB,
          sandbox: bool | None = None, seed: int | None = None, kernel_name: str = "python3") -> Grade:
    """Run ``notebook`` (step 1), then lab ``lab``'s checks on the functions it defines (step 2).

    ``sandbox``: None uses bubblewrap when it works here, True requires it, False turns it off.
    Never raises for what is inside the notebook (errors, hangs, a dead kernel, unreadable JSON): those
    are graded. Raises ``ValueError`` for a missing file, an unknown lab or bad budgets.
    """
    import nbformat

    for arg, value in (("timeout", timeout), ("notebook_timeout", notebook_timeout), ("memory_mib", memory_mib)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
            raise ValueError(f"{arg}: must be a positive number, got {value!r}")
    lesson = find_lab(lab)
    module, exercises = lab_exercises(lesson)
    path = Path(notebook)
    if not path.is_file():
        raise ValueError(f"notebook: {str(notebook)!r} is not a file")
    if path.suffix != ".ipynb":
        raise ValueError(f"notebook: {str(notebook)!r} is not a Jupyter notebook (.ipynb)")
    if sandbox is None:
        sandbox = sandbox_problem() is None
    elif sandbox and sandbox_problem():
        raise ValueError(f"sandbox: {sandbox_problem()}")
    result = Grade(path, Path(lesson.lab).stem, exercises=exercises,
                   protection=protection_summary(sandbox, memory_mib, timeout, notebook_timeout),
                   seed=secrets.randbelow(2**31) if seed is None else int(seed))
    started = time.monotonic()

    def not_graded(reason: str) -> list[CheckResult]:
        return [CheckResult(e.name, FAILED, f"❌ {e.name}: not graded: {reason}") for e in exercises]

    try:
        nb = nbformat.read(path, as_version=4)
        cells = submission_cells(nb)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook: still a (zero) grade
        result.problem = f"the notebook could not be read: {type(exc).__name__}: {exc}"
        result.results = not_graded("the notebook could not be read")
        result.seconds = time.monotonic() - started
        return result
    budgets = dict(cell_timeout=timeout, notebook_timeout=notebook_timeout, memory_mib=memory_mib,
                   sandbox=sandbox)
    with tempfile.TemporaryDirectory(prefix="attnkit-grade-") as tmp:
        tmp = Path(tmp)
        # Step 1, the notebook as the student handed it in, and step 2, the checks in a fresh process,
        # run at the same time, each in a folder of its own (neither sees what the other writes).
        run_dir, check_dir = tmp / "run", tmp / "check"
        run_dir.mkdir()
        check_dir.mkdir()
        nbformat.write(nb, run_dir / "submission.ipynb")
        (check_dir / "submission.py").write_text(
            "\n\n".join(f"# ---- code cell {c['cell']}\n{c['source']}" for c in cells) + "\n")
        pairs = None if getattr(module, "EXERCISES", None) else [(e.check, e.function) for e in exercises]
        with ThreadPoolExecutor(2) as pool:
            running = pool.submit(run_budgeted, _worker_argv("notebook"), run_dir, **budgets, stdin=json.dumps(
                {"notebook": "submission.ipynb", "cell_timeout": timeout, "kernel": kernel_name}))
            checking = pool.submit(run_budgeted, _worker_argv("checks"), check_dir, **budgets, stdin=json.dumps(
                {"module": module.__name__, "cells": cells, "cell_timeout": timeout, "seed": result.seed,
                 "pairs": pairs, "tools": course_tools(lesson)}))
            run, checked = running.result(), checking.result()
        executed = None
        try:
            executed = nbformat.read(run_dir / "executed.ipynb", as_version=4)
        except Exception:  # noqa: BLE001 - killed before the first cell finished, or written by the student
            executed = None
        if run.stopped:
            result.problem = f"the notebook {run.stopped}: it was killed; the checks still ran"
        elif run.returncode != 0 or executed is None:
            tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
            result.problem = f"the notebook could not be run to the end ({tail})"
        else:
            try:
                status = json.loads((run_dir / "status.json").read_text())
            except (OSError, ValueError):
                status = {}
            if isinstance(status, dict) and status.get("problem"):
                result.problem = f"the notebook's run stopped: {str(status['problem'])[:300]}"
        result.executed = executed if executed is not None else nb
        result.errors = _cell_errors(executed.cells) if executed is not None else []
        record, reason = read_record(checked, [e.name for e in exercises])
        if reason:
            result.results = not_graded(reason)
            result.problem = "; ".join(p for p in (result.problem, reason) if p)
        else:
            result.results = [CheckResult(r["name"], r["status"], r["report"]) for r in record["results"]]
            result.notes = record["notes"]
    result.seconds = time.monotonic() - started
    return result


def read_record(checked: Run, names: list[str]) -> tuple[dict | None, str | None]:
    """The checking process's result, or why there is none: it must be exactly one line, one result
    per exercise in order, each a passed/failed/not implemented status with a text report. Anything
    else (the notebook's code wrote to the channel, the process died or was killed) grades nothing."""
    if checked.stopped:
        return None, f"the checks {checked.stopped}"
    lines = [l for l in checked.stdout.splitlines() if l.strip()]
    if len(lines) > 1:
        return None, "the checking process wrote more than one result (the notebook's code wrote to it)"
    try:
        record = json.loads(lines[0]) if lines else None
        results = record["results"]
        ok = isinstance(results, list) and [r["name"] for r in results] == names and all(
            r["status"] in (PASSED, FAILED, NOT_IMPLEMENTED) and isinstance(r["report"], str) for r in results)
        notes = [str(n) for n in record.get("notes", [])]
    except (ValueError, TypeError, KeyError, AttributeError):
        ok = False
    if not ok:
        tail = (checked.stderr.strip().splitlines() or [f"exit status {checked.returncode}"])[-1]
        return None, f"the checking process ended without a result ({tail[:200]})"
    return {"results": results, "notes": notes}, None


# ------------------------------------------------------------------------------------------- reports
def junit_xml(grades: list[Grade]) -> ET.ElementTree:
    """JUnit XML: a test suite per notebook, a test case per exercise (named by its check call) and
    one for running cleanly."""
    suites = ET.Element("testsuites", name="attnkit grading")
    for g in grades:
        classname = f"{g.lab}.{g.report_name or g.notebook.stem}"
        suite = ET.SubElement(suites, "testsuite", name=classname, time=f"{g.seconds:.2f}")
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="notebook", value=str(g.notebook))
        ET.SubElement(props, "property", name="score", value=f"{g.score}/{g.total}")
        ET.SubElement(props, "property", name="seed", value=str(g.seed))
        ET.SubElement(props, "property", name="isolation", value=g.protection)
        failures = 0
        for exercise, r in zip(g.exercises, g.results):
            case = ET.SubElement(suite, "testcase", classname=classname, name=exercise.call)
            if r.status != PASSED:
                failures += 1
                message = "not implemented yet" if r.status == NOT_IMPLEMENTED else r.report.splitlines()[0]
                failure = ET.SubElement(case, "failure", type=r.status, message=message)
                failure.text = r.report
        case = ET.SubElement(suite, "testcase", classname=classname, name="notebook runs without errors")
        if g.errors or g.problem:
            failures += 1
            first = g.problem or g.errors[0].line()
            failure = ET.SubElement(case, "failure", type="error", message=first)
            failure.text = "\n\n".join(([g.problem] if g.problem else []) + [e.traceback or e.line()
                                                                            for e in g.errors])
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
    """A distinct report name per notebook: its file name, with parent folders added where two clash
    (submissions/alice/lab01.ipynb and submissions/bob/lab01.ipynb -> alice__lab01, bob__lab01)."""
    parts = [Path(p).resolve().with_suffix("").parts for p in paths]
    depth = [1] * len(paths)
    while True:
        names = ["__".join(pp[-d:]) for pp, d in zip(parts, depth)]
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


def write_reports(grades: list[Grade], out: str | Path) -> Path:
    """Write each notebook's summary, JUnit XML and executed copy, and ``grades.csv``, into ``out``."""
    import nbformat

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for g, stem in zip(grades, report_names([g.notebook for g in grades])):
        g.report_name = stem
        (out / f"{stem}.summary.txt").write_text(g.summary() + "\n", encoding="utf-8")
        junit_xml([g]).write(out / f"{stem}.junit.xml", encoding="utf-8", xml_declaration=True)
        if g.executed is not None and g.notebook.resolve() != (out / f"{stem}.ipynb").resolve():
            nbformat.write(g.executed, out / f"{stem}.ipynb")
    names = [e.call for e in grades[0].exercises] if grades else []
    with open(out / "grades.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["notebook", "report", "lab", "score", "total", "cells_that_raised", "sandboxed",
                         *names])
        for g in grades:
            status = {e.call: r.status for e, r in zip(g.exercises, g.results)}
            writer.writerow([str(g.notebook), g.report_name, g.lab, g.score, g.total, len(g.errors),
                             "yes" if g.protection.startswith("bubblewrap") else "no",
                             *[status.get(n, "") for n in names]])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.grading",
                                     description="Grade students' lab notebooks with the lab's checks.")
    parser.add_argument("--lab", required=True, help="which lab: 01, lab01, or the lab's file name")
    parser.add_argument("notebooks", nargs="+", help="the students' notebooks (.ipynb)")
    parser.add_argument("--out", default="build/grades", help="report folder (default: build/grades)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds per cell")
    parser.add_argument("--notebook-timeout", type=float, default=DEFAULT_NOTEBOOK_TIMEOUT,
                        help="seconds per notebook (for the run, and again for the checks)")
    parser.add_argument("--memory", type=int, default=DEFAULT_MEMORY_MIB, help="MiB of address space per process")
    parser.add_argument("--seed", type=int, default=None, help="the hidden cases' seed (default: a secret one)")
    parser.add_argument("--no-sandbox", action="store_true", help="run without bubblewrap even where it works")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 unless every exercise of every notebook passes")
    args = parser.parse_args(argv)
    try:
        find_lab(args.lab)
        for nb in args.notebooks:
            if not Path(nb).is_file():
                raise ValueError(f"notebook: {nb!r} is not a file")
        out = Path(args.out)
        grades = []
        sandbox = False if args.no_sandbox else None
        if not args.no_sandbox and sandbox_problem():
            print(f"⚠️ grading without a sandbox: {sandbox_problem()}", flush=True)
        for nb in args.notebooks:
            print(f"grading {nb} ...", flush=True)
            grades.append(grade(nb, args.lab, timeout=args.timeout, notebook_timeout=args.notebook_timeout,
                                memory_mib=args.memory, sandbox=sandbox, seed=args.seed))
    except ValueError as exc:
        parser.error(str(exc))
    write_reports(grades, out)
    for g in grades:
        print(g.summary())
        print(f"   reports: {out / (g.report_name + '.summary.txt')}, {out / (g.report_name + '.junit.xml')}")
    print(f"grades: {out / 'grades.csv'}")
    return 1 if args.strict and not all(g.passed for g in grades) else 0


if __name__ == "__main__":
    sys.exit(main())
