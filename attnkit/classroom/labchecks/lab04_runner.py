"""The machinery of lab 04's checks: inputs in padded, strided buffers, the output between sentinels,
the addresses a kernel loads and stores (in the interpreter), the calls it may not make, and
``run_puzzle``, which runs one puzzle's cases in a child process and reports the first that fails.
The puzzles themselves, their cases and references, are in ``lab04``."""
from __future__ import annotations

import contextlib
import os
import traceback
import types
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...device import runtime
from ...tolerances import check_tolerance, rel_error
from ..checking import (
    FAILED,
    PASSED,
    CheckResult,
    changed_input,
    describe_difference,
    is_not_implemented,
    isolated,
    not_implemented,
    poisoned_masked_loads,
    progress,
    student_error,
)

SENTINEL = -7777.0     # what `out` holds before the kernel runs, and what must stay around it
PAD_ROWS = 48          # guard rows above and below a 2-D tensor (more than any block of rows)
PAD = 256              # guard elements before and after a 1-D tensor (more than any block)
ROW_GAP = 7            # extra elements at the end of each row of a 2-D input: its stride is not its width
OUT_ROW_GAP = 3        # the same for a 2-D `out` where a case asks for it: a row stride unlike the inputs'


class ForbiddenCall(Exception):
    """Raised when the student's function calls a library routine that the puzzle asks to write."""


# ------------------------------------------------------------------------------------------ inputs
def _torch():
    import torch

    return torch


def vector(values):
    """A 1-D fp32 tensor holding ``values``, inside a buffer of NaN (PAD elements on each side)."""
    torch = _torch()
    values = torch.as_tensor(np.asarray(values, dtype=np.float32))
    buf = torch.full((len(values) + 2 * PAD,), float("nan"), device=_device())
    view = buf[PAD:PAD + len(values)]
    view.copy_(values)
    return view


def matrix(values, dtype=None, *, transposed: bool = False):
    """A 2-D tensor holding ``values`` inside a NaN buffer, with row stride = width + ROW_GAP.

    ``transposed``: stored column by column instead (strides (1, rows + ROW_GAP)).
    """
    torch = _torch()
    dtype = dtype or torch.float32
    values = np.asarray(values, dtype=np.float64)
    stored = values.T if transposed else values
    rows, cols = stored.shape
    buf = torch.full((rows + 2 * PAD_ROWS, cols + ROW_GAP), float("nan"), dtype=dtype, device=_device())
    view = buf[PAD_ROWS:PAD_ROWS + rows, :cols]
    view.copy_(torch.as_tensor(stored).to(dtype))
    return view.t() if transposed else view


def _out_pad(shape) -> int:
    """Guard elements on each side of ``out``: PAD, and PAD_ROWS of its rows for a 2-D one."""
    return PAD + (PAD_ROWS * int(shape[-1]) if len(shape) > 1 else 0)


def output(shape, row_gap: int = 0):
    """An fp32 ``out`` of ``shape``, filled with SENTINEL, inside a buffer of SENTINEL.

    ``row_gap``: for a 2-D ``out``, each row is followed by ``row_gap`` sentinels, so its row stride is
    width + row_gap (a kernel must address it with ``stride_om``); 0 gives a contiguous ``out``."""
    torch = _torch()
    if row_gap and len(shape) != 2:
        raise ValueError(f"row_gap: only a 2-D out has rows to pad, got shape {tuple(shape)}")
    rows, width = (int(shape[0]), int(shape[1])) if len(shape) == 2 else (1, int(np.prod(shape)))
    span, pad = rows * (width + row_gap), _out_pad(shape)
    buf = torch.full((span + 2 * pad,), SENTINEL, device=_device())
    if len(shape) != 2:
        return buf[pad:pad + span].view(*shape)
    return buf[pad:pad + span].view(rows, width + row_gap)[:, :width]


def _float64(t):
    if hasattr(t, "detach"):
        return t.detach().to("cpu").double().numpy()
    return t


def _element_addresses(t) -> np.ndarray:
    """The byte address of every element of tensor ``t`` (any strides), as uint64."""
    offsets = np.zeros(tuple(t.shape), dtype=np.int64)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = size
        offsets = offsets + (np.arange(size, dtype=np.int64) * stride).reshape(shape)
    return (np.uint64(t.data_ptr()) + (offsets * t.element_size()).astype(np.uint64)).ravel()


# ------------------------------------------------------------------------------------ values
# Sentinels: every puzzle with a running maximum, a mask or a masked lane's `other=` has a case whose
# real values all lie far below the finite sentinels a kernel might start from or fill with (−1e4,
# −1e6, −1e8). Puzzle 2 (no exp) goes down to −3.3·10³⁸, below every finite value but float32's lowest.
# Puzzles 6 to 8 (exp) stop at −10⁹: a compiled kernel that multiplies the scores by log2(e) before
# exp2 may fuse that product into the subtraction of the maximum (an FMA), leaving up to half a float32
# step of the product (64 at 1.4·10⁹, 10³¹ near 3·10³⁸) in the exponent; at −2.2·10³⁸ exp2 of it is
# +inf (tests/fresh_mutants/round6/README.md), at −10⁹ it is at most 2⁶⁴, the same for tied values,
# so it cancels in a softmax and moves a log-sum-exp by at most 45 in 10⁹. The values are a few float32
# steps (64 each) apart, so each weight is 0 (e⁻⁶⁴) or 1: a correct kernel started from −inf gives the
# answer to float32's precision, a finite start above them gives 0/0 and a finite `other=` or mask value
# above them takes the weight itself. A sentinel below −10⁹ (−1e30) cannot be told from −inf by values
# a compiled exp2 kernel survives; the labs ask for −inf.
FAR_BELOW = -1.0e9


def far_below(rng, shape, top=FAR_BELOW):
    """Values ``top`` − k·step, k in 0..3 (step: float32's spacing there), as float32 holds them exactly:
    rows of ties at the maximum and values whose exp relative to it is 0."""
    top = float(np.float32(top))
    step = float(np.spacing(np.float32(abs(top))))
    return top - step * rng.integers(0, 4, shape).astype(np.float64)


def falling_and_rising(rng, rows, cols):
    """Rows whose running maximum falls or rises by 200 or more from one tile of columns to the next, for
    any tile narrower than ``cols`` (the changes come early in the row and again later): row 0 falls
    from +100 to −100 after 20 columns, row 1 rises from −100 to +100, row 2 falls, rises and falls,
    and so on. A rescale by exp(m_old − m_new) from the tile's own maximum overflows on a fall; a
    maximum kept from the first tile overflows on a rise."""
    levels = ([100.0, -100.0], [-100.0, 100.0], [300.0, -150.0, 50.0, -200.0], [-200.0, 150.0, -100.0])
    cuts = ([20], [20], [20, cols // 3, 2 * cols // 3], [35, cols // 2])
    x = rng.standard_normal((rows, cols))
    for r in range(rows):
        level, cut = levels[r % len(levels)], cuts[r % len(cuts)]
        edges = [0, *cut, cols]
        for value, start, stop in zip(level, edges[:-1], edges[1:]):
            x[r, start:stop] += value
    return x


# ------------------------------------------------------------------------------- watching the kernel
def interpreting() -> bool:
    """Whether Triton kernels run in the interpreter here (switched on before triton is imported)."""
    from ...device import ensure_triton_backend

    ensure_triton_backend()
    return os.environ.get("TRITON_INTERPRET") == "1"


def _device() -> str:
    """Where the puzzles' tensors live: the CPU where kernels run in Triton's interpreter (also on a GPU
    machine with TRITON_INTERPRET=1, where the interpreter would run on host copies of CUDA tensors, at
    addresses that are not the tensors'), else the machine's device."""
    return "cpu" if interpreting() else runtime().device


class _Memory:
    """Every address that the interpreted kernel loads (with its lanes' mask) and stores."""

    def __init__(self):
        self.loads, self.stores = [], []

    @staticmethod
    def _lanes(ptrs, mask):
        data = np.asarray(ptrs.data)
        on = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
        return data[on].astype(np.uint64).ravel()

    @contextlib.contextmanager
    def watching(self, always: bool = False):
        """Record the interpreter's loads and stores (``always``: even where kernels are compiled, for a
        kernel run explicitly in the interpreter)."""
        if not (always or interpreting()):
            yield False                         # compiled on a GPU: nothing to watch
            return
        from triton.runtime import interpreter

        builder = interpreter.InterpreterBuilder
        load, store = builder.create_masked_load, builder.create_masked_store
        memory = self

        def watched_load(self, ptrs, mask, other, *args):
            memory.loads.append(memory._lanes(ptrs, mask))
            return load(self, ptrs, mask, other, *args)

        def watched_store(self, ptrs, value, mask, *args):
            memory.stores.append(memory._lanes(ptrs, mask))
            return store(self, ptrs, value, mask, *args)

        builder.create_masked_load, builder.create_masked_store = watched_load, watched_store
        try:
            yield True
        finally:
            builder.create_masked_load, builder.create_masked_store = load, store

    def loaded(self) -> np.ndarray:
        return np.concatenate(self.loads) if self.loads else np.zeros(0, np.uint64)

    def stored(self) -> np.ndarray:
        return np.concatenate(self.stores) if self.stores else np.zeros(0, np.uint64)


def _raiser(*args, **kwargs):
    # Runs as the code of a course function, with that function's module globals: reach the
    # exception through the builtins only.
    raise __import__("attnkit.classroom.labchecks.lab04_runner", fromlist=["ForbiddenCall"]).ForbiddenCall()


def _forbidden_torch():
    torch = _torch()
    import torch.nn.functional as F

    names = {
        torch: ("softmax", "log_softmax", "logsumexp", "matmul", "mm", "bmm", "einsum", "tensordot",
                "addmm", "baddbmm", "amax", "max", "cumsum", "inner", "outer", "mv", "dot"),
        torch.Tensor: ("softmax", "log_softmax", "logsumexp", "matmul", "mm", "bmm", "__matmul__",
                       "__rmatmul__", "amax", "max", "sum", "cumsum", "mv", "dot"),
        F: ("softmax", "log_softmax", "scaled_dot_product_attention", "linear"),
    }
    return [(owner, name) for owner, attrs in names.items() for name in attrs if hasattr(owner, name)]


# Lab 04's own functions that a student's kernel may not call (the prediction's measurement): lab04
# adds them when it defines them, so this module never imports the one above it.
ALSO_FORBIDDEN: list = []


def _forbidden_course():
    """attnkit's own kernels and references: functions whose code is swapped while the student runs."""
    import importlib

    from .course_code import course_kernel_modules

    found = []
    for module_name in course_kernel_modules() + ("attnkit.reference.attention", "attnkit.reference.online_softmax",
                                                  "attnkit.reference.tiled_numpy"):
        try:
            module = importlib.import_module(module_name)
        except Exception:  # a module that cannot load here cannot be called either
            continue
        for value in vars(module).values():
            if callable(value) and getattr(value, "__module__", None) == module_name and \
                    hasattr(value, "__code__") and not value.__code__.co_freevars:
                found.append(value)
    return found + ALSO_FORBIDDEN


@contextlib.contextmanager
def _forbidding():
    """PyTorch's softmax, reductions and matrix products, and attnkit's kernels, raise ForbiddenCall."""
    saved_attrs = [(owner, name, owner.__dict__.get(name, getattr(owner, name)))
                   for owner, name in _forbidden_torch()]
    saved_code = [(fn, fn.__code__) for fn in _forbidden_course()]
    try:
        for owner, name, _ in saved_attrs:
            raiser = _named_raiser(f"{'torch.Tensor' if owner is _torch().Tensor else owner.__name__}.{name}")
            setattr(owner, name, raiser)
        for fn, _ in saved_code:
            fn.__code__ = _raiser.__code__.replace(co_name=fn.__name__, co_qualname=f"{fn.__module__}.{fn.__name__}")
        yield
    finally:
        for owner, name, value in saved_attrs:
            setattr(owner, name, value)
        for fn, code in saved_code:
            fn.__code__ = code


def _named_raiser(name):
    def raiser(*args, **kwargs):
        raise ForbiddenCall(name)
    return raiser


def _forbidden_name(exc: ForbiddenCall) -> str:
    """The routine that raised: named in the exception, or the code name of the swapped function."""
    if exc.args:
        return str(exc.args[0])
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_qualname if tb is not None else "a course function"


# ---------------------------------------------------------------------------------------- the runner
@dataclass
class Puzzle:
    """One input of a puzzle: the arguments before ``out``, the output, and what the kernel may read."""

    args: tuple
    out_shape: tuple
    label: str
    stream: int | None = None              # index in args of the input that must be read in one pass
    out_row_gap: int = 0                   # sentinels after each row of a 2-D out (its stride is not its width)

    @property
    def where(self) -> str:
        """The case's label, with out's layout when its row stride is not its width."""
        if not self.out_row_gap:
            return self.label
        width = self.out_shape[-1]
        return f"{self.label}, out {' × '.join(map(str, self.out_shape))} with row stride {width + self.out_row_gap}"


def _find_forbidden(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ForbiddenCall):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _fail(name, where, text, hint):
    return CheckResult(name, FAILED, f"❌ {name}: {where}: {text}\n   hint: {hint}")


def run_puzzle(name: str, student_fn: Callable, reference: Callable, puzzles, *, hint: str,
               tol: float | None = None) -> CheckResult:
    """Run ``student_fn(*args, out)`` on each puzzle input and judge ``out`` (see the module's doc).

    ``tol``: the bound on the relative error, the same on a CPU and a GPU (default: float32's; a puzzle
    whose fp32 products go through tl.dot passes ``check_tolerance("float32", dot=True)``). Where kernels
    are interpreted, the cases run in a child process (a crash fails the check and names the case) and a
    masked load without ``other=`` reads NaN in its masked lanes."""
    if not callable(student_fn):
        raise ValueError(f"{name}: must be the puzzle's launch function, got {type(student_fn).__name__}")
    return isolated(name, lambda: _run_puzzle(name, student_fn, reference, puzzles, hint=hint, tol=tol), hint=hint)


def _whole_buffer(t):
    """The whole storage under tensor ``t`` (its padding and sentinels included), as a 1-D tensor of its dtype."""
    return _torch().tensor([], dtype=t.dtype, device=t.device).set_(t.untyped_storage())


def _stray_store(out, p: Puzzle) -> str | None:
    """What the kernel wrote outside ``out``'s elements (a sentinel changed), in words, or None: before
    or after ``out``, or into the gap after a row of a strided ``out`` (out's row stride ignored)."""
    whole = _whole_buffer(out).cpu().numpy()
    inside = np.zeros(whole.shape, dtype=bool)
    base, size = np.uint64(out.untyped_storage().data_ptr()), np.uint64(out.element_size())
    inside[(_element_addresses(out) - base) // size] = True
    changed = np.flatnonzero(~inside & (whole != SENTINEL))
    if not changed.size:
        return None
    start = out.storage_offset()
    end = start + (out.shape[0] - 1) * out.stride(0) + out.shape[-1] if out.dim() == 2 else start + out.numel()
    gaps = changed[(changed >= start) & (changed < end)]
    if gaps.size:
        row = int((gaps[0] - start) // out.stride(0))
        return (f"your kernel wrote {gaps.size} element(s) into the gaps between out's rows (first after row "
                f"{row}): out's row stride here is {out.stride(0)}, its width {out.shape[-1]}, so row i starts "
                f"at out_ptr + i·stride_om (not at i·{out.shape[-1]}, nor through an input's row stride)")
    side = "before" if changed[0] < start else "after"
    return f"your kernel wrote outside `out` ({side} it): a store without the right mask"


def _same_layout_other_values(t, rng):
    """A copy of input ``t`` in a copy of its whole buffer (the NaN padding, the strides and the offset
    kept) whose elements hold ``t``'s values permuted, about half of them with the sign flipped."""
    torch = _torch()
    whole = _whole_buffer(t).clone()
    copy = whole.as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    flat = t.detach().reshape(-1).cpu().double().numpy()
    values = flat[rng.permutation(flat.size)] * rng.choice([-1.0, 1.0], flat.size)
    if np.array_equal(values, flat):              # one element, or all alike: change them all
        values = 0.5 - 2.0 * flat
    copy.copy_(torch.as_tensor(values.reshape(tuple(t.shape))).to(t.dtype))
    return copy


def again_with_other_values(p: Puzzle, rng) -> Puzzle:
    """Puzzle ``p`` once more, after the others: the same shapes and layouts, other values. A launch
    function that keeps a result, a grid or a block size from an earlier call fails here (or on a later
    case whose grid is larger than the first case's, which every puzzle has)."""
    args = tuple(_same_layout_other_values(a, rng) if hasattr(a, "data_ptr") and a.dtype.is_floating_point
                 else a for a in p.args)
    return Puzzle(args, p.out_shape, f"{p.label}, called again with other values of the same shapes (a result, "
                                     f"grid or block size kept from an earlier call shows here)",
                  stream=p.stream, out_row_gap=p.out_row_gap)


INPUT_NAMES = ("the first input", "the second input", "the third input", "the fourth input")


def _is_out(got, out) -> bool:
    """``got`` is ``out`` itself, or a view of all of it (same storage, shape and strides): not ``out[0]``,
    a slice or another tensor."""
    return got is out or (hasattr(got, "data_ptr") and got.data_ptr() == out.data_ptr()
                          and tuple(got.shape) == tuple(out.shape) and tuple(got.stride()) == tuple(out.stride()))


def _run_puzzle(name, student_fn, reference, puzzles, *, hint, tol) -> CheckResult:
    tol = check_tolerance("float32") if tol is None else tol
    # The first case once more at the end with other values (see again_with_other_values); the same
    # values on every run.
    cases = list(puzzles) + [again_with_other_values(puzzles[0], np.random.default_rng(4))]
    result = _run_cases(name, student_fn, reference, cases, len(puzzles), hint=hint, tol=tol, note="")
    if result.status != PASSED or interpreting() or not _runs_here(student_fn):
        return result
    # Compiled, a kernel's loads and stores cannot be recorded: the same cases once more in the
    # interpreter, on CPU copies, where reading outside the inputs, leaving out unwritten and
    # reading a one-pass input twice all show. Only for a function of this process (the grader's
    # checker calls the student's functions in another process, where nothing can be swapped).
    with interpreted_kernels(student_fn):
        cpu_cases = [on_cpu(p) for p in cases]
        return _run_cases(name, student_fn, reference, cpu_cases, len(puzzles), hint=hint, tol=tol,
                          note=" (rerun in Triton's interpreter, where every load and store is recorded)")


def _wrapped_chain(student_fn) -> list:
    """``student_fn`` and every function it wraps (``__wrapped__``, as the grader's wrappers and
    functools.wraps set it), outermost first."""
    chain = [student_fn]
    while isinstance(getattr(chain[-1], "__wrapped__", None), types.FunctionType) and len(chain) < 16:
        chain.append(chain[-1].__wrapped__)
    return chain


def _runs_here(student_fn) -> bool:
    """Whether ``student_fn`` is a function of this process, whose kernels can be swapped: not the grader's
    stand-in for a function of the student's process (``grading.calls``: it has ``through``). Decided by
    the function the check was handed alone: what it wraps (``__wrapped__``, which a student may set to
    anything) only adds namespaces to swap, and is followed through functions only."""
    return isinstance(student_fn, types.FunctionType) and not hasattr(student_fn, "through")


def on_cpu(p: Puzzle) -> Puzzle:
    """Puzzle ``p`` with every tensor copied to the CPU in a copy of its whole buffer (padding, strides
    and offset kept)."""
    def copied(t):
        if not hasattr(t, "data_ptr") or t.device.type == "cpu":
            return t
        whole = _whole_buffer(t).cpu()
        return whole.as_strided(tuple(t.shape), tuple(t.stride()), t.storage_offset())
    return Puzzle(tuple(copied(a) for a in p.args), p.out_shape, p.label, stream=p.stream,
                  out_row_gap=p.out_row_gap)


@contextlib.contextmanager
def interpreted_kernels(student_fn):
    """Where kernels compile: Triton's interpreter for the duration, in this process. Every
    ``@triton.jit`` function of ``triton.language`` and of the student's globals (and of the globals of
    every function it wraps: ``__wrapped__``) is swapped for the interpreter's, and TRITON_INTERPRET=1
    set, so that ``interpreting()``, the poisoned masked loads and any kernel decorated inside are the
    interpreter's too; all restored after."""
    import sys

    import triton.experimental.gluon  # noqa: F401  (imported now: its import asserts compiled kernels)
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    namespaces = [vars(module) for name, module in list(sys.modules.items())
                  if name.startswith("triton.language") and module is not None]
    namespaces += [f.__globals__ for f in _wrapped_chain(student_fn) if hasattr(f, "__globals__")]
    swapped = []
    for namespace in namespaces:
        for key, value in list(namespace.items()):
            if isinstance(value, JITFunction):
                swapped.append((namespace, key, value))
                namespace[key] = InterpretedFunction(value.fn)
            elif isinstance(getattr(value, "fn", None), JITFunction):      # @triton.autotune, @heuristics
                swapped.append((vars(value), "fn", value.fn))
                value.fn = InterpretedFunction(value.fn.fn)
    saved_env = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        with _lang_patches_undone():
            yield
    finally:
        for namespace, key, value in swapped:
            namespace[key] = value
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env


@contextlib.contextmanager
def _lang_patches_undone():
    """Every attribute the interpreter patches in ``triton.language`` while inside set back, on leaving,
    to what it held on entering. The interpreter patches the language's builtins for each kernel and
    device function it runs; for a device function (``tl.max`` swapped for the interpreter's, say) it
    never undoes them, and kernels compiled afterwards in the process fail with a CompilationError
    (Triton 3.6 leaves them)."""
    from triton.runtime import interpreter

    scope = getattr(interpreter, "_LangPatchScope", None)
    set_attr = getattr(scope, "set_attr", None)
    if set_attr is None:                        # a Triton that patches otherwise: nothing to track
        yield
        return
    missing = object()
    first_seen: dict = {}                       # (id(obj), name) -> (obj, name, the value on entering)

    def recorded(self, obj, name, value):
        first_seen.setdefault((id(obj), name), (obj, name, vars(obj).get(name, missing)))   # its own, not inherited
        return set_attr(self, obj, name, value)

    scope.set_attr = recorded
    try:
        yield
    finally:
        scope.set_attr = set_attr
        for obj, name, value in first_seen.values():
            if value is missing:
                if name in vars(obj):
                    delattr(obj, name)
            else:
                setattr(obj, name, value)


def _run_cases(name, student_fn, reference, puzzles, given, *, hint, tol, note) -> CheckResult:
    for index, p in enumerate(puzzles, start=1):
        where = f"case {index} of {len(puzzles)}, {p.where}{note}"
        expected = np.asarray(reference(*[_float64(a) for a in p.args]), dtype=np.float64).reshape(p.out_shape)
        out = output(p.out_shape, p.out_row_gap)
        memory = _Memory()
        before = [a.detach().clone() if hasattr(a, "data_ptr") else None for a in p.args]
        progress(where)
        try:
            with memory.watching() as watched, poisoned_masked_loads(), _forbidding(), warnings.catch_warnings(), \
                    np.errstate(all="ignore"):
                warnings.simplefilter("ignore")          # keep the report the only output
                got = student_fn(*p.args, out)
        except Exception as exc:
            forbidden = _find_forbidden(exc)
            if forbidden is not None:
                return _fail(name, where, f"your function calls {_forbidden_name(forbidden)}; this puzzle is "
                                          f"to compute the result in your own Triton kernel", hint)
            if is_not_implemented(exc):
                return not_implemented(name)
            exc = student_error(exc)
            last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
            line = f"\n   (line {last.lineno}: {last.line})" if last else ""
            return _fail(name, where, f"your function raised {type(exc).__name__}: {exc}{line}", hint)
        stray = _stray_store(out, p)
        if stray:
            return _fail(name, where, stray, hint)
        changed = changed_input(before, p.args, INPUT_NAMES)     # a kernel or launch that scales or reuses an input
        if changed:
            return _fail(name, where, f"your function wrote into its input: {changed}. Its caller still needs that "
                                      f"data: store only into `out`", hint)
        if watched:
            tensors = [a for a in p.args if hasattr(a, "data_ptr")]
            allowed = np.concatenate([_element_addresses(t) for t in tensors + [out]])
            loaded = memory.loaded()
            outside = ~np.isin(loaded, allowed)
            if np.any(outside):
                return _fail(name, where, f"your kernel read {int(outside.sum())} element(s) outside its "
                                          f"inputs (past the end of a row or of the data: mask those loads)", hint)
            written = np.isin(_element_addresses(out), memory.stored())
            if not np.all(written):
                missing = np.unravel_index(int(np.flatnonzero(~written)[0]), tuple(out.shape))
                return _fail(name, where, f"out[{', '.join(str(int(i)) for i in missing)}] was not written by "
                                          f"your kernel's tl.store (the result must come from the kernel)", hint)
            if p.stream is not None:
                streamed = _element_addresses(p.args[p.stream])
                _, counts = np.unique(loaded[np.isin(loaded, streamed)], return_counts=True)
                if counts.size and counts.max() > 1:
                    return _fail(name, where, f"your kernel reads each input element {int(counts.max())} "
                                              f"times; this puzzle asks for ONE pass (keep a running maximum "
                                              f"and rescale the running sums when it grows)", hint)
        if got is not None and not _is_out(got, out):
            return _fail(name, where, "return `out` (the tensor your kernel wrote), not a new tensor, a part of it "
                                      "(out[0], a slice) or a view of another shape", hint)
        err = rel_error(out, expected)
        if not (np.isfinite(err) and err <= tol):
            return CheckResult(name, FAILED, f"❌ {name}: {where}: differs from the float64 reference "
                                             f"(bound {tol:g}).\n{describe_difference(out, expected)}\n"
                                             f"   hint: {hint}")
    return CheckResult(name, PASSED, f"✅ {name}: matches the float64 reference on {given} inputs "
                                     f"(fixed edge cases, then random ones).")
