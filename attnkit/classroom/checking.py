"""Friendly checks for lab exercises.

A check runs the student's function on several fresh random inputs, compares each result with a
float64 reference, and returns a ``CheckResult`` whose text is the report the notebook shows:

    ✅ softmax: matches the float64 reference on 6 random inputs.
    ⏳ softmax: not implemented yet (replace `raise NotImplementedError` with your code).
    ❌ softmax: case 2 of 6, scores of shape (3, 5): ... expected / got / where / hint

The report never includes random numbers when a check passes, so a solved notebook prints the same
text on every run and every device.
"""
from __future__ import annotations

import os
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..tolerances import REL_TOL, dtype_name, rel_error
from .call_rules import (  # noqa: F401  (re-exported: labs and tests import them from here)
    _FORBIDDEN,
    ForbiddenCall,
    OneShotStream,
    _forbidden_body,
    _megabytes,
    _refuse,
    forbidden_calls,
    memory_peak,
    module_functions,
)
from .cases import (  # noqa: F401  (re-exported: labs and tests import them from here)
    Case,
    again_with_other_values,
    case,
    fixed_and_random,
    with_memory_limit,
)
from .comparing import (  # noqa: F401  (re-exported: labs and tests import them from here)
    _arrays_in,
    _compared,
    _distinct_digits,
    _host,
    _kind_of,
    _preview,
    answer_error,
    changed_input,
    describe_difference,
    fresh_copy,
    not_an_array,
)
from .kernel_guards import (  # noqa: F401  (re-exported: labs and tests import them from here)
    _ALLOCATORS,
    GUARD_ELEMENTS,
    POISON,
    _Guarded,
    guarded_allocations,
    layout_name,
    placed,
    poisoned_masked_loads,
)

PASSED, FAILED, NOT_IMPLEMENTED = "passed", "failed", "not implemented"


def show_report(report: str) -> None:
    """Show a check's report in a notebook as displayed text, not as the cell's value.

    nbgrader's autograde reads a test cell's value (its ``execute_result``) as a partial score and
    warns when it is not a number (``nbgrader.utils.determine_grade``); a cell that only displays text
    gets full points, and one that raises gets none.
    """
    from IPython.display import display

    display({"text/plain": report}, raw=True)


@dataclass(frozen=True)
class CheckResult:
    """A check's verdict and the report a student sees.

    Under nbgrader's autograde and validate (which set NBGRADER_EXECUTION), a verdict other than
    "passed" raises AssertionError with its report as it is made, so that the autograded test cell
    holding the check loses its points; everywhere else it is a value to print.
    """

    name: str
    status: str
    report: str

    def __post_init__(self):
        if os.environ.get("NBGRADER_EXECUTION") and self.status != PASSED:
            raise AssertionError(self.report)

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __repr__(self) -> str:
        return self.report

    def _ipython_display_(self) -> None:
        show_report(self.report)

    def __bool__(self) -> bool:
        return self.passed


def not_implemented(name: str) -> CheckResult:
    return CheckResult(name, NOT_IMPLEMENTED,
                       f"⏳ {name}: not implemented yet (replace `raise NotImplementedError` with your code).")


class WrongResult(Exception):
    """A check's verdict that an answer breaks a rule the lab states: not the type, shape or dtype the lab
    promises, a count that is not an int, a rule of a protocol broken on the way to the right numbers.

    Raised by the check's own code (the wrapper it puts around the student's function), never by the
    student's: ``run_check`` reports its message alone as the case's verdict, not as an error the
    student's code raised and without the check's line that raised it. So the message names the rule and
    what came back; the report adds the case and the hint. Labs subclass it to name their rules
    (``lab07.NotAnInt``, ``lab10.RingRuleBroken``).
    """


def wrong_kind(what: str) -> str:
    """The message of a ``WrongResult`` for an answer of another type, shape or dtype than the lab
    promises; ``what`` names the rule and what came back."""
    return f"your function returned the wrong kind of result: {what}"


def is_not_implemented(exc: BaseException) -> bool:
    """Did a blank exercise (``raise NotImplementedError``) cause ``exc``, however it was wrapped?

    Plain Python raises it as is. In a Triton kernel, the interpreter (CPU) wraps it as
    InterpreterError('NotImplementedError()') caused by the original; the compiler (GPU) refuses the
    ``raise`` statement with a CompilationError that quotes the line.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NotImplementedError):
            return True
        if "CompilationError" in [t.__name__ for t in type(exc).__mro__] and \
                "raise NotImplementedError" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def student_error(exc: BaseException) -> BaseException:
    """The error to show a student: Triton's interpreter wraps the one raised in the kernel's line."""
    if type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def unwrapped(fn: Callable) -> Callable:
    """``fn`` with Triton's wrapping of errors taken off: a blank exercise raises NotImplementedError,
    a bug raises the error of the student's own line."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if is_not_implemented(exc):
                raise NotImplementedError from None
            raise student_error(exc) from None
    return call


def within_dtype_tolerance(tol: float, relaxed: Sequence[str] = ("float32",)) -> Callable[[Any, Any], bool]:
    """A comparison that allows ``tol`` (the float64 bound) and, for an answer in one of the ``relaxed``
    dtypes, that dtype's own bound: a float32 table computed in float32 passes, a float16 one does not."""
    def compare(got, expected) -> bool:
        err = rel_error(got, expected)
        bound = tol
        dtype = getattr(got, "dtype", None)
        if dtype is not None:
            try:
                name = dtype_name(dtype)
            except ValueError:
                name = ""
            if name in relaxed:
                bound = max(tol, REL_TOL[name])
        return bool(np.isfinite(err) and err <= bound)
    return compare


@dataclass
class _Call:
    """What one call of the student's function did."""

    got: Any = None
    called: list = field(default_factory=list)     # forbidden course functions it called
    peak: int = 0                                   # bytes at its peak (cases with ``max_bytes``)
    damage: str | None = None                       # a store outside a tensor it allocated
    error: BaseException | None = None              # what it raised, unwrapped


def _call_student(student_fn, c: Case, args, kwargs, forbidden, kernel_guards: bool) -> _Call:
    """Call ``student_fn`` on one case's copies ``args``, ``kwargs`` under the case's guards."""
    call = _Call()
    peak = [0]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"), forbidden_calls(forbidden) as call.called:
            warnings.simplefilter("ignore")      # keep the report the only output
            if c.max_bytes is None and kernel_guards:
                with poisoned_masked_loads(), guarded_allocations() as guard:
                    call.got = student_fn(*args, **kwargs)
                call.damage = guard.damaged()
            elif c.max_bytes is None:
                call.got = student_fn(*args, **kwargs)
            else:
                with memory_peak() as peak:
                    call.got = student_fn(*args, **kwargs)
    except Exception as exc:  # a blank, or a student's bug: report it, never a traceback
        call.error = exc if is_not_implemented(exc) else student_error(exc)
    call.peak = peak[0]
    return call


def _case_problem(call: _Call, c: Case, args, expected, compare, inputs_unchanged: bool) -> str | None:
    """What is wrong with one call, in words (the first problem found), or None."""
    if call.called:
        return (f"your function called the course's own {call.called[0]}: write this exercise with NumPy "
                f"(and your earlier functions) only.")
    if isinstance(call.error, WrongResult):                 # the check's verdict, not the student's error
        return str(call.error)
    if call.error is not None:
        last = traceback.extract_tb(call.error.__traceback__)[-1]
        return (f"your function raised {type(call.error).__name__}: {call.error}\n"
                f"   (line {last.lineno}: {last.line})")
    if c.max_bytes is not None and call.peak > c.max_bytes:
        return (f"your function allocated {_megabytes(call.peak)} at its peak; this case allows at most "
                f"{_megabytes(c.max_bytes)}.")
    if call.damage:
        return f"{call.damage}: a tl.store without the mask of its rows (or columns), or through the wrong strides."
    changed = inputs_unchanged and changed_input(c.args, args)
    if changed:
        return (f"your function wrote into its input: {changed}. Its caller still needs that data: compute "
                f"into new arrays.")
    if call.got is None:
        return "your function returned None (did you forget `return`?)"
    matches, why_not = _compared(compare, call.got, expected)
    if why_not:
        return why_not
    if not matches:
        try:
            described = describe_difference(call.got, expected)
        except Exception:  # an answer describe_difference cannot read as an array: name what came back
            described = f"   got {_kind_of(call.got)}"
        return f"differs from the float64 reference.\n{described}"
    return None


def run_check(
    name: str,
    student_fn: Callable,
    reference_fn: Callable,
    cases: Sequence[Case],
    *,
    tol: float,
    hint: str,
    compare: Callable[[Any, Any], bool] | None = None,
    forbidden: Iterable[Callable] = (),
    fixed: int | None = None,
    kernel_guards: bool = False,
    isolate: bool = False,
    inputs_unchanged: bool = True,
    again: bool | int = False,
) -> CheckResult:
    """Run ``student_fn`` on every case and compare with ``reference_fn``.

    For each case the reference runs first, then the student's function; each gets its own deep copy
    of the case's arguments (NumPy arrays, torch tensors, and the tuples, lists and dicts holding them),
    so neither can see what the other wrote into its inputs: an answer that modifies its arguments in
    place is judged on what it returns, against the reference on the untouched inputs.

    ``compare(got, expected)`` decides a match; by default the relative error must be at most ``tol``.
    ``forbidden``: course functions the student's function may not call (they raise while it runs).
    A case with ``max_bytes`` fails when the student's function allocates more at its peak.
    ``fixed``: how many of the cases (the first ones) are fixed; the pass line says so.
    ``kernel_guards``: the student's function runs with ``poisoned_masked_loads`` and
    ``guarded_allocations``: a store outside a tensor it allocated fails the case.
    ``isolate``: the cases run in a forked child (``isolated``) where kernels are interpreted, so a
    crash fails the check with the case it was on.
    ``inputs_unchanged``: a function that writes into its (array) arguments fails the case, since its
    caller's data is lost; pass False where an argument is an output the function fills.
    ``again``: after every case has run, each case (or, for an int, each of the first ``again`` cases,
    e.g. the fixed ones) that has floating-point inputs runs a second time,
    followed by ``again_with_other_values(case)``, the same shapes with other values (drawn from a
    generator of its own, the same on every run), so that state kept between calls (a result cached by
    the inputs' shapes, from the first call or the last, a mask built on the first call) fails.
    The first failing case is reported with what was expected, what came back, where they differ,
    and the hint.
    """
    if isolate:
        return isolated(name, lambda: run_check(name, student_fn, reference_fn, cases, tol=tol, hint=hint,
                                                compare=compare, forbidden=forbidden, fixed=fixed,
                                                kernel_guards=kernel_guards,
                                                inputs_unchanged=inputs_unchanged, again=again), hint=hint)
    def within_tolerance(got, expected) -> bool:
        err = answer_error(got, expected)
        return np.isfinite(err) and err <= tol

    compare = compare or within_tolerance
    forbidden = tuple(forbidden)
    given = len(cases)
    if again:
        # Every case first, as given (its own label names what it tests); then each case again, followed
        # by its twin of other values: a cache keyed by shape, kept from the first call or the last, fails.
        twins = np.random.default_rng(20260)                  # the same other values on every run
        pairs = [(Case(c.args, c.kwargs, f"{c.label}, called a second time", c.max_bytes),
                  again_with_other_values(c, twins))
                 for c in (cases if again is True else cases[:int(again)])]
        cases = list(cases) + [x for first, twin in pairs if twin is not None for x in (first, twin)]
    for index, c in enumerate(cases, start=1):
        where = f"case {index} of {len(cases)}, {c.label}"
        expected = reference_fn(*fresh_copy(c.args), **fresh_copy(c.kwargs))
        args, kwargs = fresh_copy(c.args), fresh_copy(c.kwargs)
        progress(where)
        call = _call_student(student_fn, c, args, kwargs, forbidden, kernel_guards)
        if call.error is not None and is_not_implemented(call.error):
            return not_implemented(name)
        problem = _case_problem(call, c, args, expected, compare, inputs_unchanged)
        if problem:
            return CheckResult(name, FAILED, f"❌ {name}: {where}: {problem}\n   hint: {hint}")
    if fixed is None:
        inputs = f"{given} random inputs"
    else:
        inputs = fixed_and_random(fixed, given - fixed)
    return CheckResult(name, PASSED, f"✅ {name}: matches the float64 reference on {inputs}.")


@dataclass(frozen=True)
class CheckSummary:
    """Several checks shown together, e.g. at the end of a lab."""

    results: tuple[CheckResult, ...]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def __repr__(self) -> str:
        done = sum(r.passed for r in self.results)
        lines = [r.report for r in self.results]
        lines.append(f"{done} of {len(self.results)} exercises pass.")
        return "\n".join(lines)

    def _ipython_display_(self) -> None:
        show_report(repr(self))


def summarize(results: Iterable[CheckResult]) -> CheckSummary:
    return CheckSummary(tuple(results))


# ------------------------------------------------------------------------------------ a lab's exercises
@dataclass(frozen=True)
class Exercise:
    """One exercise of a lab: the function the student writes and the check that judges it.

    ``check(student_fn, *, seed=None) -> CheckResult``: fixed adversarial cases first, then cases drawn
    from ``seed`` (fresh ones when None; the grader passes a seed the student never sees).
    ``depends`` names earlier exercises whose functions the student's function is expected to call.
    """

    function: str
    check: Callable
    depends: tuple[str, ...] = ()
    points: int = 1


def _dependency_note(exercises: Sequence[Exercise], exercise: Exercise, result: CheckResult,
                     passed: Callable[[str], bool]) -> CheckResult:
    """``result`` with a note after its first line when it failed and an exercise it uses fails too."""
    failed_before = [d for d in exercise.depends if not passed(d)]
    if result.passed or not failed_before:
        return result
    names = ", ".join(f"exercise {_number_of(exercises, d)} ({d})" for d in failed_before)
    verb = "does" if len(failed_before) == 1 else "do"
    note = f"   note: this uses your {names}, which {verb} not pass yet: fix that first."
    first, _, rest = result.report.partition("\n")
    return CheckResult(result.name, result.status, "\n".join(line for line in (first, note, rest) if line))


def check_exercises(exercises: Sequence[Exercise], functions: dict, *, seed: int | None = None) -> CheckSummary:
    """Run every exercise's check on ``functions[exercise.function]``, in order.

    A check whose exercise depends on one that did not pass says so first: its failure may be the
    earlier exercise's, not its own.
    """
    missing = [e.function for e in exercises if e.function not in functions]
    if missing:
        raise ValueError(f"functions: no function named {', '.join(missing)} (define every exercise's "
                         f"function, even if it still raises NotImplementedError)")
    results, passed = [], {}
    for exercise in exercises:
        result = exercise.check(functions[exercise.function], seed=seed)
        result = _dependency_note(exercises, exercise, result, lambda d: passed.get(d, False))
        passed[exercise.function] = result.passed
        results.append(result)
    return summarize(results)


def exercise_check(exercises: Sequence[Exercise], function: str) -> Callable:
    """The one-line check of one exercise, for its check cell: ``check(student_fn, *, seed=None)``.

    When it fails and the exercise depends on earlier ones, it looks up the student's earlier functions
    by name where ``student_fn`` was defined (the notebook), checks them with the same seed and names
    those that fail.
    """
    exercise = next(e for e in exercises if e.function == function)

    def check(student_fn: Callable, *, seed: int | None = None) -> CheckResult:
        result = exercise.check(student_fn, seed=seed)
        if result.passed or not exercise.depends:
            return result
        where = getattr(student_fn, "__globals__", {})

        def passed(dependency: str) -> bool:
            earlier = next(e for e in exercises if e.function == dependency)
            fn = where.get(dependency)
            if not callable(fn):
                return True                  # not found under its name: nothing to say about it
            return earlier.check(fn, seed=seed).passed

        return _dependency_note(exercises, exercise, result, passed)

    check.__name__ = check.__qualname__ = exercise.check.__name__.lstrip("_")
    check.__doc__ = exercise.check.__doc__
    return check


def _number_of(exercises: Sequence[Exercise], function: str) -> int:
    return next(i for i, e in enumerate(exercises, start=1) if e.function == function)


# --------------------------------------------------------------------------------- crash isolation
_PROGRESS: list = []        # in a checking child: the write end of the pipe that reports progress


def progress(where: str) -> None:
    """Say which case a check is on (read by the parent when the child dies; nothing otherwise)."""
    if _PROGRESS:
        os.write(_PROGRESS[0], ("\x1e" + where).encode("utf-8", "replace"))


ISOLATE = os.environ.get("ATTNKIT_CHECK_IN_PROCESS", "") != "1"   # tests switch it off to reuse cached work


def can_isolate() -> bool:
    """Whether a check can run in a forked child here: on a POSIX system, with Triton interpreted
    (a process that has started CUDA cannot fork a child that uses it)."""
    if not (ISOLATE and hasattr(os, "fork") and os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    import sys

    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized())


CRASH_CAUSE = ("the kernel most likely stored (or loaded) outside a tensor: a tl.store without the row "
               "mask (rows ≥ N of the last tile) or the column mask, or a pointer built with the wrong "
               "stride")


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _run_in_child(run: Callable[[], CheckResult], read_end: int, write_end: int, errors) -> None:
    """In the forked child: run the check with its output silenced, send the verdict (or the check's own
    error) through ``write_end``, and exit without returning."""
    import io
    import pickle
    import sys

    code = 0
    try:
        os.close(read_end)
        import faulthandler

        faulthandler.disable()                               # a crash is reported by the parent
        os.dup2(errors.fileno(), 2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        sys.stdout = sys.stderr = io.StringIO()
        os.environ.pop("NBGRADER_EXECUTION", None)           # the parent raises, not the child
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(1)
        _PROGRESS[:] = [write_end]
        result = run()
        payload = pickle.dumps((result.name, result.status, result.report))
        os.write(write_end, b"\x1f" + payload)
    except BaseException as exc:                             # the check itself failed: say so
        try:
            os.write(write_end, b"\x1d" + f"{type(exc).__name__}: {exc}".encode("utf-8", "replace"))
        except Exception:
            pass
        code = 1
    finally:
        os._exit(code)


def _read_child(pid: int, read_end: int) -> tuple[bytes, int]:
    """Everything the child wrote to the pipe, and its exit status once it ends."""
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return b"".join(chunks), status


def isolated(name: str, run: Callable[[], CheckResult], *, hint: str = "") -> CheckResult:
    """``run()`` in a forked child process when ``can_isolate()``, else here.

    The child reports each case it starts (``progress``) and sends back the verdict as plain text; if it
    dies (an abort from a corrupted heap, a segmentation fault) the check fails and names the case it
    was on and the likely cause. One fork per check, whatever the number of cases.
    """
    if not can_isolate():
        return run()
    import pickle
    import sys
    import tempfile

    read_end, write_end = os.pipe()
    errors = tempfile.TemporaryFile()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or odd stream: nothing to flush
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)     # "multi-threaded, use of fork()"
        pid = os.fork()
    if pid == 0:                                                 # the child: run, report, never return
        _run_in_child(run, read_end, write_end, errors)
    os.close(write_end)
    data, status = _read_child(pid, read_end)
    verdict_at = data.find(b"\x1f")
    if verdict_at >= 0:
        result_name, result_status, report = pickle.loads(data[verdict_at + 1:])
        errors.close()
        return CheckResult(result_name, result_status, report)
    errors.seek(0)
    said = errors.read().decode("utf-8", "replace").strip().splitlines()
    errors.close()
    failure_at = data.find(b"\x1d")
    if failure_at >= 0:
        raise RuntimeError(f"{name}: the check failed in its child process: "
                           f"{data[failure_at + 1:].decode('utf-8', 'replace')}")
    cases = data.split(b"\x1e")
    where = cases[-1].decode("utf-8", "replace") if len(cases) > 1 else "before its first case"
    if os.WIFSIGNALED(status):
        how = f"was killed by {_signal_name(os.WTERMSIG(status))}"
    else:
        how = f"exited with status {os.WEXITSTATUS(status)}"
    last = f" ({said[-1].strip()[:200]})" if said else ""
    return CheckResult(name, FAILED, f"❌ {name}: {where}: your kernel crashed the process that ran it: it "
                                     f"{how}{last}.\n   {CRASH_CAUSE}."
                                     + (f"\n   hint: {hint}" if hint else ""))
