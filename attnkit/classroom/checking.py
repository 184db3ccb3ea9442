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

import copy
import traceback
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..tolerances import _as_float64, rel_error

PASSED, FAILED, NOT_IMPLEMENTED = "passed", "failed", "not implemented"


@dataclass(frozen=True)
class Case:
    """One input to an exercise: positional and keyword arguments plus a short description."""

    args: tuple
    kwargs: dict
    label: str


def case(*args, label: str, **kwargs) -> Case:
    return Case(args, kwargs, label)


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str
    report: str

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def __repr__(self) -> str:
        return self.report

    def __bool__(self) -> bool:
        return self.passed


def not_implemented(name: str) -> CheckResult:
    return CheckResult(name, NOT_IMPLEMENTED,
                       f"⏳ {name}: not implemented yet (replace `raise NotImplementedError` with your code).")


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


def _preview(a: np.ndarray, limit: int = 6) -> str:
    flat = np.asarray(a, dtype=np.float64)
    with np.printoptions(precision=4, suppress=True, threshold=limit, edgeitems=2, linewidth=100):
        return np.array2string(flat, prefix="      ").replace("\n", "\n      ")


def describe_difference(got, expected) -> str:
    """Lines that say how ``got`` differs from ``expected``: shape, error, the worst element."""
    got64, exp64 = _as_float64(got), _as_float64(expected)
    if got64.shape != exp64.shape:
        return f"   expected shape {exp64.shape}, got shape {got64.shape}"
    lines = []
    if not np.all(np.isfinite(got64)):
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(got64))[0])
        lines.append(f"   got a non-finite value ({got64[where]}) at index {list(where)}")
    else:
        lines.append(f"   relative error ‖got − expected‖/‖expected‖ = {rel_error(got64, exp64):.3g}")
        where = np.unravel_index(int(np.argmax(np.abs(got64 - exp64))), exp64.shape)
        where = tuple(int(i) for i in where)
        lines.append(f"   largest difference at index {list(where)}: "
                     f"expected {exp64[where]:.6g}, got {got64[where]:.6g}")
    lines.append(f"   expected: {_preview(exp64)}")
    lines.append(f"   got:      {_preview(got64)}")
    return "\n".join(lines)


def fresh_copy(value):
    """A deep copy of a case's arguments: a function that writes into its inputs changes only its copy."""
    return copy.deepcopy(value)


def run_check(
    name: str,
    student_fn: Callable,
    reference_fn: Callable,
    cases: Sequence[Case],
    *,
    tol: float,
    hint: str,
    compare: Callable[[Any, Any], bool] | None = None,
) -> CheckResult:
    """Run ``student_fn`` on every case and compare with ``reference_fn``.

    For each case the reference runs first, then the student's function; each gets its own deep copy
    of the case's arguments (NumPy arrays, torch tensors, and the tuples, lists and dicts holding them),
    so neither can see what the other wrote into its inputs: an answer that modifies its arguments in
    place is judged on what it returns, against the reference on the untouched inputs.

    ``compare(got, expected)`` decides a match; by default the relative error must be at most ``tol``.
    The first failing case is reported with what was expected, what came back, where they differ,
    and the hint.
    """
    def within_tolerance(got, expected) -> bool:
        err = rel_error(got, expected)
        return np.isfinite(err) and err <= tol

    compare = compare or within_tolerance
    for index, c in enumerate(cases, start=1):
        where = f"case {index} of {len(cases)}, {c.label}"
        expected = reference_fn(*fresh_copy(c.args), **fresh_copy(c.kwargs))
        args, kwargs = fresh_copy(c.args), fresh_copy(c.kwargs)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")      # keep the report the only output
                got = student_fn(*args, **kwargs)
        except Exception as exc:  # a blank, or a student's bug: report it, never a traceback
            if is_not_implemented(exc):
                return not_implemented(name)
            exc = student_error(exc)
            last = traceback.extract_tb(exc.__traceback__)[-1]
            return CheckResult(name, FAILED,
                               f"❌ {name}: {where}: your function raised {type(exc).__name__}: {exc}\n"
                               f"   (line {last.lineno}: {last.line})\n   hint: {hint}")
        if got is None:
            return CheckResult(name, FAILED, f"❌ {name}: {where}: your function returned None "
                                             f"(did you forget `return`?)\n   hint: {hint}")
        if not compare(got, expected):
            return CheckResult(name, FAILED, f"❌ {name}: {where}: differs from the float64 reference.\n"
                                             f"{describe_difference(got, expected)}\n   hint: {hint}")
    return CheckResult(name, PASSED, f"✅ {name}: matches the float64 reference on {len(cases)} random inputs.")


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
        failed_before = [d for d in exercise.depends if not passed.get(d, False)]
        if not result.passed and failed_before:
            names = ", ".join(f"exercise {_number_of(exercises, d)} ({d})" for d in failed_before)
            result = CheckResult(result.name, result.status,
                                 f"{result.report}\n   note: this uses your {names}, which does not pass yet: "
                                 f"fix that one first.")
        passed[exercise.function] = result.passed
        results.append(result)
    return summarize(results)


def _number_of(exercises: Sequence[Exercise], function: str) -> int:
    return next(i for i, e in enumerate(exercises, start=1) if e.function == function)
