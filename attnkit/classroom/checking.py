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
import os
import traceback
import tracemalloc
import types
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..tolerances import REL_TOL, _as_float64, componentwise_error, dtype_name, rel_error

PASSED, FAILED, NOT_IMPLEMENTED = "passed", "failed", "not implemented"


@dataclass(frozen=True)
class Case:
    """One input to an exercise: positional and keyword arguments plus a short description."""

    args: tuple
    kwargs: dict
    label: str
    max_bytes: int | None = None     # the most memory the student's function may allocate on this case


def case(*args, label: str, **kwargs) -> Case:
    return Case(args, kwargs, label)


def with_memory_limit(c: Case, max_bytes: int) -> Case:
    """``c`` where the student's function may allocate at most ``max_bytes`` at its peak (NumPy arrays
    included: NumPy reports its allocations to ``tracemalloc``)."""
    return Case(c.args, c.kwargs, c.label, int(max_bytes))


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


def _distinct_digits(expected: float, got: float) -> tuple[str, str]:
    """Two numbers written with 6 significant digits, or more until they read differently (up to 17)."""
    for digits in range(6, 18):
        want, have = f"{expected:.{digits}g}", f"{got:.{digits}g}"
        if want != have:
            break
    return want, have


def answer_error(got, expected) -> float:
    """The error a check bounds: ``componentwise_error`` when ``expected`` carries a ``magnitude`` (see
    ``attnkit.tolerances.with_magnitude``), else the relative error ‖got − expected‖/‖expected‖."""
    magnitude = getattr(expected, "magnitude", None)
    if magnitude is not None:
        return componentwise_error(got, expected, magnitude)
    return rel_error(got, expected)


def describe_difference(got, expected) -> str:
    """Lines that say how ``got`` differs from ``expected``: shape, error, the worst element."""
    got64, exp64 = _as_float64(got), _as_float64(expected)
    if got64.shape != exp64.shape:
        return f"   expected shape {exp64.shape}, got shape {got64.shape}"
    lines = []
    explain = getattr(expected, "explain", None)         # a check's own words for the part that failed
    note = explain(got) if callable(explain) else None
    if note:
        lines.append(note)
    magnitude = getattr(expected, "magnitude", None)
    if not np.all(np.isfinite(got64)):
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(got64))[0])
        lines.append(f"   got a non-finite value ({got64[where]}) at index {list(where)}")
    elif magnitude is not None:
        lines.append(f"   largest row error ‖got − expected‖/‖|terms|‖ = "
                     f"{componentwise_error(got64, exp64, magnitude):.3g} (each row against the size of the "
                     f"terms summed into it)")
    else:
        lines.append(f"   relative error ‖got − expected‖/‖expected‖ = {rel_error(got64, exp64):.3g}")
    if np.all(np.isfinite(got64)):
        where = np.unravel_index(int(np.argmax(np.abs(got64 - exp64))), exp64.shape)
        where = tuple(int(i) for i in where)
        want, have = _distinct_digits(exp64[where], got64[where])
        lines.append(f"   largest difference at index {list(where)}: expected {want}, got {have}")
    lines.append(f"   expected: {_preview(exp64)}")
    lines.append(f"   got:      {_preview(got64)}")
    coarse = str(getattr(got, "dtype", "")).replace("torch.", "")
    if coarse in ("float16", "bfloat16"):
        lines.append(f"   (your answer is {coarse}, too coarse for this check: compute in float64)")
    return "\n".join(lines)


def fresh_copy(value):
    """A deep copy of a case's arguments: a function that writes into its inputs changes only its copy."""
    return copy.deepcopy(value)


def _arrays_in(value, path: str):
    """(path, array) for each NumPy array or torch tensor in ``value`` and the tuples, lists and dicts
    holding it (other objects are not looked into)."""
    if isinstance(value, np.ndarray) or type(value).__name__ == "Tensor":
        yield path, value
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _arrays_in(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _arrays_in(item, f"{path}[{key!r}]")


def _host(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor (bfloat16 has no NumPy dtype)
        x = x.detach().to("cpu")
        return (x.float() if str(x.dtype) == "torch.bfloat16" else x).numpy()
    return np.asarray(x)


def changed_input(before: tuple, after: tuple, names: Sequence[str] = ()) -> str | None:
    """None when every array in ``after`` (the arguments as the student's function left them) holds
    what ``before`` (an untouched copy) holds, NaN for NaN; else which argument changed and where."""
    for index, (was, now) in enumerate(zip(before, after)):
        label = names[index] if index < len(names) else f"argument {index + 1}"
        for (path, a), (_, b) in zip(_arrays_in(was, label), _arrays_in(now, label)):
            a, b = _host(a), _host(b)
            if a.shape != b.shape:
                return f"{path} changed shape from {a.shape} to {b.shape}"
            same = a == b
            if np.issubdtype(a.dtype, np.inexact) and np.issubdtype(b.dtype, np.inexact):
                same |= np.isnan(a) & np.isnan(b)
            if not np.all(same):
                where = tuple(int(i) for i in np.argwhere(~same)[0]) if same.ndim else ()
                return (f"{path} changed: element {list(where)} was {a[where]:.6g}, is now "
                        f"{b[where]:.6g} ({int((~same).sum())} of {same.size} elements changed)")
    return None


# ------------------------------------------------------------------ what a lesson claims about structure
class OneShotStream:
    """A stream of 1-D blocks that can be read once, like a generator: ``for block in stream``.

    Each block arrives in the same buffer, which the stream overwrites with the next block: keeping the
    blocks (``list(stream)``) keeps views of one buffer, and a second pass finds the stream exhausted.
    ``blocks`` holds the data, for the reference.
    """

    def __init__(self, blocks: Sequence[np.ndarray]):
        self.blocks = [np.array(b, dtype=np.float64).ravel() for b in blocks]
        self._next = 0
        self._buffer = np.empty(max((len(b) for b in self.blocks), default=0))

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        if self._next >= len(self.blocks):
            raise StopIteration
        block = self.blocks[self._next]
        self._next += 1
        view = self._buffer[:len(block)]
        view[:] = block
        return view

    def __repr__(self) -> str:
        return f"<a one-pass stream of {len(self.blocks)} blocks>"


class ForbiddenCall(Exception):
    """Raised by a course function that a student's answer may not call (see ``forbidden_calls``)."""


_FORBIDDEN: list[str] = []       # the forbidden functions called while a guard is on, in order


def _forbidden_body(*args, **kwargs):
    # Runs as the body of a forbidden function, with that function's globals: only builtins here.
    import sys as _sys

    from attnkit.classroom import checking as _checking
    return _checking._refuse(_sys._getframe().f_code.co_name)


def _refuse(name: str):
    _FORBIDDEN.append(name)
    raise ForbiddenCall(f"{name} is the course's own implementation: write this exercise yourself")


def module_functions(*modules) -> tuple[Callable, ...]:
    """The plain functions defined at the top level of ``modules`` (what ``forbidden_calls`` can guard)."""
    found = []
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, types.FunctionType) and value.__module__ == module.__name__ \
                    and not value.__code__.co_freevars:
                found.append(value)
    return tuple(found)


@contextmanager
def forbidden_calls(functions: Iterable[Callable]):
    """While the block runs, each of ``functions`` raises ``ForbiddenCall`` when called, through any
    name a notebook imported it under; yields the list of the names called (also when the student's
    code caught the error)."""
    swapped, called = [], []
    start = len(_FORBIDDEN)
    try:
        for fn in dict.fromkeys(functions):          # each once, in order
            code = fn.__code__
            if code.co_freevars:
                raise ValueError(f"functions: {fn.__qualname__} is a closure; only module-level "
                                 f"functions can be forbidden")
            fn.__code__ = _forbidden_body.__code__.replace(co_name=fn.__name__, co_qualname=fn.__qualname__)
            swapped.append((fn, code))
        yield called
    finally:
        for fn, code in swapped:
            fn.__code__ = code
        called.extend(_FORBIDDEN[start:])
        del _FORBIDDEN[start:]


@contextmanager
def memory_peak():
    """Yields a one-item list that holds, after the block, the peak bytes allocated during it."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    peak = [0]
    try:
        yield peak
    finally:
        peak[0] = max(0, tracemalloc.get_traced_memory()[1] - base)
        if started:
            tracemalloc.stop()


def _megabytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


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


def fixed_and_random(fixed: int, drawn: int) -> str:
    """'5 fixed and 4 random inputs' (the words of a pass line)."""
    return f"{fixed} fixed and {drawn} random input{'' if drawn == 1 else 's'}"


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
    The first failing case is reported with what was expected, what came back, where they differ,
    and the hint.
    """
    if isolate:
        return isolated(name, lambda: run_check(name, student_fn, reference_fn, cases, tol=tol, hint=hint,
                                                compare=compare, forbidden=forbidden, fixed=fixed,
                                                kernel_guards=kernel_guards,
                                                inputs_unchanged=inputs_unchanged), hint=hint)
    def within_tolerance(got, expected) -> bool:
        err = answer_error(got, expected)
        return np.isfinite(err) and err <= tol

    compare = compare or within_tolerance
    forbidden = tuple(forbidden)
    for index, c in enumerate(cases, start=1):
        where = f"case {index} of {len(cases)}, {c.label}"
        expected = reference_fn(*fresh_copy(c.args), **fresh_copy(c.kwargs))
        args, kwargs = fresh_copy(c.args), fresh_copy(c.kwargs)
        called: list[str] = []
        peak = [0]
        damage = None
        progress(where)
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"), forbidden_calls(forbidden) as called:
                warnings.simplefilter("ignore")      # keep the report the only output
                if c.max_bytes is None and kernel_guards:
                    with poisoned_masked_loads(), guarded_allocations() as guard:
                        got = student_fn(*args, **kwargs)
                    damage = guard.damaged()
                elif c.max_bytes is None:
                    got = student_fn(*args, **kwargs)
                else:
                    with memory_peak() as peak:
                        got = student_fn(*args, **kwargs)
        except Exception as exc:  # a blank, or a student's bug: report it, never a traceback
            if is_not_implemented(exc):
                return not_implemented(name)
            exc = student_error(exc)
            if not called:
                last = traceback.extract_tb(exc.__traceback__)[-1]
                return CheckResult(name, FAILED,
                                   f"❌ {name}: {where}: your function raised {type(exc).__name__}: {exc}\n"
                                   f"   (line {last.lineno}: {last.line})\n   hint: {hint}")
        if called:
            return CheckResult(name, FAILED,
                               f"❌ {name}: {where}: your function called the course's own {called[0]}: "
                               f"write this exercise with NumPy (and your earlier functions) only.\n"
                               f"   hint: {hint}")
        if c.max_bytes is not None and peak[0] > c.max_bytes:
            return CheckResult(name, FAILED,
                               f"❌ {name}: {where}: your function allocated {_megabytes(peak[0])} at its "
                               f"peak; this case allows at most {_megabytes(c.max_bytes)}.\n"
                               f"   hint: {hint}")
        if damage:
            return CheckResult(name, FAILED, f"❌ {name}: {where}: {damage}: a tl.store without the mask "
                                             f"of its rows (or columns), or through the wrong strides.\n"
                                             f"   hint: {hint}")
        changed = inputs_unchanged and changed_input(c.args, args)
        if changed:
            return CheckResult(name, FAILED, f"❌ {name}: {where}: your function wrote into its input: "
                                             f"{changed}. Its caller still needs that data: compute into "
                                             f"new arrays.\n   hint: {hint}")
        if got is None:
            return CheckResult(name, FAILED, f"❌ {name}: {where}: your function returned None "
                                             f"(did you forget `return`?)\n   hint: {hint}")
        if not compare(got, expected):
            return CheckResult(name, FAILED, f"❌ {name}: {where}: differs from the float64 reference.\n"
                                             f"{describe_difference(got, expected)}\n   hint: {hint}")
    if fixed is None:
        inputs = f"{len(cases)} random inputs"
    else:
        inputs = fixed_and_random(fixed, len(cases) - fixed)
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


# ------------------------------------------------------------------ defences for kernel exercises
# What a kernel check varies so that mistakes nobody catalogued still fail (docs/authoring.md, "Checks
# vary what students get wrong"):
#   layouts   every tensor argument, in some case, with its own strides (``placed``)
#   poison    inputs inside NaN-filled buffers; masked loads without ``other=`` read NaN in the
#             interpreter, as on a GPU they read whatever is there (``poisoned_masked_loads``)
#   sentinels the tensors a student's function allocates sit inside buffers whose padding is checked
#             after every call: a store outside its tensor is named (``guarded_allocations``)
#   crashes   where kernels run in Triton's interpreter, a check runs in a forked child process, so a
#             store that corrupts the heap (SIGABRT, SIGSEGV) fails the check with the case it was on
#             (``isolated``)
POISON = float("nan")
GUARD_ELEMENTS = 4096          # padding before and after a guarded tensor (in elements), at least its size


def placed(values, *, order: Sequence[int] | None = None, gap: int = 0, step: int = 1, dtype=None,
           device=None, fill: float = POISON, lead: int = GUARD_ELEMENTS, trail: int | None = None):
    """A tensor equal to ``values`` whose storage has a chosen layout, inside a buffer of ``fill``.

    ``order``: the dimensions from outermost to innermost in memory (``(1, 0)`` stores a matrix column
    by column; default: the logical order). ``gap``: extra (``fill``) elements after each run of every
    dimension, so no stride equals the product of the sizes inside it. ``step``: the innermost stride
    (2 leaves one ``fill`` element between neighbours). ``lead`` and ``trail`` (default: the tensor's
    span, at least ``GUARD_ELEMENTS``): ``fill`` elements before and after it, so a read past either end
    returns ``fill`` (NaN: the answer becomes NaN) instead of another tensor's data.
    """
    import torch

    t = torch.as_tensor(values)
    dtype = dtype or t.dtype
    device = device or t.device
    ndim = t.dim()
    order = tuple(range(ndim)) if order is None else tuple(int(d) for d in order)
    if sorted(order) != list(range(ndim)):
        raise ValueError(f"order: must be a permutation of the {ndim} dimensions, got {order}")
    if gap < 0 or step < 1:
        raise ValueError(f"gap, step: need gap >= 0 and step >= 1, got gap={gap}, step={step}")
    strides = [0] * ndim
    stride = step
    for dim in reversed(order):                 # innermost first
        strides[dim] = stride
        stride = t.shape[dim] * stride + gap
    span = max(stride, 1)
    trail = max(span, GUARD_ELEMENTS) if trail is None else int(trail)
    if dtype.is_floating_point:
        buf = torch.full((lead + span + trail,), fill, dtype=dtype, device=device)
    else:
        buf = torch.full((lead + span + trail,), int(fill) if fill == fill else -(2**30), dtype=dtype,
                         device=device)
    view = buf.as_strided(tuple(t.shape), tuple(strides), lead)
    view.copy_(t.to(device=device, dtype=dtype))
    return view


def layout_name(t) -> str:
    """'strides (…)' of a tensor, for a case's label."""
    return "strides (" + ", ".join(str(s) for s in t.stride()) + ")"


@contextmanager
def poisoned_masked_loads():
    """While inside, Triton's interpreter fills the masked-off lanes of a floating-point ``tl.load``
    without ``other=`` with NaN (it fills them with 0 otherwise; a GPU leaves whatever the registers
    held): a kernel that needs ``other=`` and leaves it out gets NaN. Does nothing where kernels are
    compiled."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    try:
        from triton.runtime import interpreter
    except ImportError:                                   # no Triton: nothing to poison
        yield
        return
    builder = interpreter.InterpreterBuilder
    original = builder.create_masked_load

    def masked_load(self, ptrs, mask, other, *args):
        if other is None:
            dtype_tt = ptrs.get_element_ty()
            dtype_np = interpreter._get_np_dtype(dtype_tt)
            if np.issubdtype(dtype_np, np.floating):
                other = interpreter.TensorHandle(np.full(ptrs.data.shape, np.nan, dtype=dtype_np), dtype_tt)
        return original(self, ptrs, mask, other, *args)

    builder.create_masked_load = masked_load
    try:
        yield
    finally:
        builder.create_masked_load = original


class _Guarded:
    """The tensors allocated while ``guarded_allocations`` is on, each inside a padded buffer."""

    def __init__(self, sentinel: float):
        self.sentinel = sentinel
        self.buffers: list = []             # (buffer, lead, numel, what)

    def damaged(self) -> str | None:
        """Which allocation had its padding written, in words; None when every padding is intact."""
        import torch

        for buf, lead, numel, what in self.buffers:
            pads = torch.cat([buf[:lead], buf[lead + numel:]])     # (called after the guard is off)
            if buf.dtype.is_floating_point:
                same = pads == self.sentinel
            else:
                same = pads == int(self.sentinel)
            if not bool(same.all()):
                where = int((~same).nonzero()[0, 0])
                count = lead - where if where < lead else where - lead + 1     # (pads skip the tensor)
                side = (f"{count} element{'s' if count != 1 else ''} "
                        f"{'before its start' if where < lead else 'past its end'}")
                return f"a store landed outside the tensor {what} ({side})"
        return None


_ALLOCATORS = ("empty", "zeros", "full", "empty_like", "zeros_like", "full_like", "ones", "ones_like")


@contextmanager
def guarded_allocations(sentinel: float = -7777.0):
    """While inside, ``torch.empty``, ``torch.zeros``, ``torch.full``, ``torch.ones`` and their
    ``_like`` forms return tensors placed inside larger buffers of ``sentinel`` (an ``empty`` tensor is
    filled with NaN: an element the kernel never writes reads NaN). Yields a ``_Guarded`` whose
    ``damaged()`` names the first tensor whose padding changed: a kernel stored outside it (a store
    without its row or column mask)."""
    import torch

    guard = _Guarded(sentinel)
    saved = {name: getattr(torch, name) for name in _ALLOCATORS}

    def wrap(name):
        original = saved[name]

        def allocate(*args, **kwargs):
            t = original(*args, **kwargs)
            if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.layout != torch.strided or \
                    kwargs.get("out") is not None:
                return t
            numel = t.numel()
            pad = max(numel, GUARD_ELEMENTS)
            fill = sentinel if t.dtype.is_floating_point else int(sentinel)
            buf = saved["full"]((pad + numel + pad,), fill, dtype=t.dtype, device=t.device)
            view = buf[pad:pad + numel].view(t.shape)
            if name.startswith("empty") and t.dtype.is_floating_point:
                view.fill_(POISON)
            else:
                view.copy_(t)
            if t.requires_grad:
                view.requires_grad_(True)
            guard.buffers.append((buf, pad, numel, f"of shape {list(t.shape)} made by torch.{name}"))
            return view
        return allocate

    try:
        for name in _ALLOCATORS:
            setattr(torch, name, wrap(name))
        yield guard
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)


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
        code = 0
        try:
            os.close(read_end)
            import faulthandler

            faulthandler.disable()                               # a crash is reported by the parent
            os.dup2(errors.fileno(), 2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            import io

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
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
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
