"""The rule of the kernel labs that an answer computes its result itself: while a student's function runs,
the course's kernels and references raise (``course_code_forbidden``), and in a Triton exercise PyTorch's own
attention, matrix products, softmax and exp too (``torch_compute_forbidden``); ``guarded_check`` is
``run_check`` under both. Labs 05, 06 and 08 and the leaderboard's timing worker use it."""
from __future__ import annotations

import contextlib
import importlib
import types
from typing import Callable

from ..checking import FAILED, CheckResult, isolated, run_check


def course_kernel_modules(package: str = "attnkit.kernels") -> tuple[str, ...]:
    """Every module of ``package`` and its sub-packages that loads here: the course's kernels, whichever
    file holds them (a guard that names files misses the next one the package grows)."""
    import pkgutil

    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        try:
            importlib.import_module(info.name)
        except Exception:  # a module that cannot load here (Gluon without a GPU build) cannot be called
            continue
        names.append(info.name)
    return tuple(names)


GUARDED_MODULES = course_kernel_modules() + ("attnkit.reference.attention", "attnkit.reference.tiled_numpy",
                                             "attnkit.reference.online_softmax")
_MARK = "course code called: "


# ------------------------------------------------------------------- no course code in the answer
_RAISING: dict = {}


def _raising_code(qualname: str, template: types.CodeType) -> types.CodeType:
    key = (qualname, template)
    if key not in _RAISING:
        _RAISING[key] = _make_raising_code(qualname, template)
    return _RAISING[key]


def _make_raising_code(qualname: str, template: types.CodeType) -> types.CodeType:
    message = f"{_MARK}{qualname}, the course's own implementation: this exercise asks you to write it"
    source = f"def f(*args, **kwargs):\n    raise RuntimeError({message!r})\n"
    code = next(c for c in compile(source, template.co_filename, "exec").co_consts
                if isinstance(c, types.CodeType))
    return code.replace(co_name=template.co_name, co_firstlineno=template.co_firstlineno)


def _is_triton_kernel(obj) -> bool:
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction", "Autotuner", "Heuristics") and \
        hasattr(obj, "run")


_TARGETS: dict = {}


def _targets(modules) -> list:
    """(object, attribute, raising value) for everything ``course_code_forbidden`` replaces; built once."""
    modules = tuple(modules)
    if modules in _TARGETS:
        return _TARGETS[modules]
    targets = []

    def add_function(fn, qualname):
        if isinstance(fn, types.FunctionType) and not fn.__code__.co_freevars:
            targets.append((fn, "__code__", _raising_code(qualname, fn.__code__)))

    kernels_seen = set()
    for name in modules:
        module = importlib.import_module(name)
        for attr, obj in list(vars(module).items()):
            if isinstance(obj, types.FunctionType) and obj.__module__ == name:
                add_function(obj, f"{name}.{attr}")
            elif isinstance(obj, type) and obj.__module__ == name:
                for key, member in vars(obj).items():
                    add_function(getattr(member, "__func__", member), f"{name}.{obj.__name__}.{key}")
            elif _is_triton_kernel(obj) and id(obj) not in kernels_seen:
                kernels_seen.add(id(obj))                 # one kernel, re-exported by several modules
                fn = getattr(obj, "fn", None)             # named after the module that defines it
                where = f"{getattr(fn, '__module__', name)}.{getattr(fn, '__name__', attr)}"
                message = (f"{_MARK}{where}, one of the course's own kernels: this exercise asks you "
                           "to write yours")

                def run(*args, _message=message, **kwargs):
                    raise RuntimeError(_message)
                targets.append((obj, "run", run))

    import torch.nn.functional as F

    def no_sdpa(*args, **kwargs):
        raise RuntimeError(f"{_MARK}torch.nn.functional.scaled_dot_product_attention, PyTorch's "
                           "attention: this exercise asks you to write yours")
    targets.append((F, "scaled_dot_product_attention", no_sdpa))
    _TARGETS[modules] = targets
    return targets


_MISSING = object()


@contextlib.contextmanager
def course_code_forbidden(modules=GUARDED_MODULES):
    """While inside, every function and Triton kernel defined in ``modules`` (and PyTorch's
    scaled_dot_product_attention) raises RuntimeError naming itself, however it was imported.

    Python functions get a raising code object (so a reference bound before the check also raises);
    Triton kernels get a raising ``run``. Everything is restored on exit.
    """
    undo = []
    try:
        for obj, attr, raising in _targets(modules):
            old = obj.__dict__.get(attr, _MISSING) if attr == "run" else getattr(obj, attr)
            undo.append((obj, attr, old))
            setattr(obj, attr, raising)
        yield
    finally:
        for obj, attr, old in reversed(undo):
            if old is _MISSING:
                del obj.__dict__[attr]
            else:
                setattr(obj, attr, old)


# PyTorch operations that compute attention, or a piece of it, on their own: a kernel exercise's
# function may allocate, copy and launch, but these must not run while it does.
TORCH_COMPUTE_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul", "dot", "vdot", "mv",
                               "einsum", "_softmax", "_safe_softmax", "softmax", "_log_softmax", "log_softmax",
                               "exp", "exp_", "exp2", "exp2_", "logsumexp"})


@contextlib.contextmanager
def torch_compute_forbidden():
    """While inside, PyTorch's matrix products, softmax and exp (``TORCH_COMPUTE_OPS``) and its fused
    attention raise RuntimeError naming themselves: the answer must come from the student's kernel.
    Allocations, copies and Triton launches run as usual."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:                                   # a PyTorch without dispatch modes: no guard
        yield
        return

    class NoTorchCompute(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in TORCH_COMPUTE_OPS or "scaled_dot_product" in name:
                raise RuntimeError(f"{_MARK}PyTorch's {name} (aten.{name}), a computation outside your "
                                   "kernel: this exercise asks your kernel to compute the result")
            return func(*args, **(kwargs or {}))

    with NoTorchCompute():
        yield


def used_course_code(exc: BaseException) -> str | None:
    """The message of a guard's RuntimeError in ``exc``'s chain, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _MARK in str(exc):
            text = str(exc)
            return text[text.index(_MARK) + len(_MARK):].split("\n")[0]
        exc = exc.__cause__ or exc.__context__
    return None


def guarded_check(name: str, student_fn: Callable, reference_fn: Callable, cases, *, tol: float,
                  hint: str, compare=None, fixed: int = 0, kernel: bool = False) -> CheckResult:
    """``run_check`` with the course's code forbidden while ``student_fn`` runs (the reference runs
    outside the guard); a call into it fails the check with a report that says which. ``fixed``: how
    many of ``cases`` are the fixed ones (the pass line counts fixed and random inputs). ``kernel``: the
    exercise is a Triton kernel, so PyTorch's own computations are forbidden too, masked loads without
    ``other=`` read NaN, the tensors it allocates are guarded by sentinels, and the cases run in a child
    process where kernels are interpreted (see ``attnkit.classroom.checking.run_check``)."""
    if kernel:
        return isolated(name, lambda: _guarded_check(name, student_fn, reference_fn, cases, tol=tol, hint=hint,
                                                     compare=compare, fixed=fixed, kernel=True), hint=hint)
    return _guarded_check(name, student_fn, reference_fn, cases, tol=tol, hint=hint, compare=compare, fixed=fixed,
                          kernel=False)


def _guarded_check(name, student_fn, reference_fn, cases, *, tol, hint, compare, fixed, kernel) -> CheckResult:
    caught: list[str] = []

    def student(*args, **kwargs):
        with course_code_forbidden(), (torch_compute_forbidden() if kernel else contextlib.nullcontext()):
            try:
                return student_fn(*args, **kwargs)
            except Exception as exc:
                what = used_course_code(exc)
                if what:
                    caught.append(what)
                raise

    result = run_check(name, student, reference_fn, cases, tol=tol, hint=hint, compare=compare, kernel_guards=kernel)
    if caught:
        return CheckResult(name, FAILED, f"❌ {name}: your function called {caught[0]}.\n   hint: {hint}")
    if result.passed:
        return CheckResult(name, result.status, f"✅ {name}: matches the float64 reference on {fixed} fixed "
                                                f"and {len(cases) - fixed} random inputs.")
    return result
