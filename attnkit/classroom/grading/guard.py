"""In the student's process: the course's own implementations refuse calls from the notebook's code.

Installed before the notebook's code loads and never removed, so a copy of a course function made at
import is a copy of the refusal. A call is refused when the notebook's code is on the stack above it
with no tool of the lab's in between, so a course function that calls what it is handed is no way
round; the lab's own check (run here after the verdicts are final) and the tools' helpers may call.
This is a teaching guard in a process the student's code controls: it keeps an honest
answer honest and names the function; it is not what makes a grade trustworthy. That is the checker's
separate process, which judges only the values that come back (see ``calls``).

Internal API for tests: ``TOOL_CODES`` (the code objects of the lab's tools, read at every frame the guard
walks) and ``guard_compiled_kernel``.
"""
from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager, suppress

from ...device import triton_interprets
from .submission import CELL_PREFIX

# The course's own implementations: the student's code may not call them while it is graded.
COURSE_IMPLEMENTATIONS = ("attnkit.reference", "attnkit.kernels", "attnkit.serving.kv_cache",
                          "attnkit.serving.tinymodel", "attnkit.analysis.iomodel", "attnkit.bench.iomodel",
                          "attnkit.bench.naive")
TOOL_CODES: set = set()           # the code of the lab's tools: what they call is theirs to call
_PLACEHOLDER = -7310921            # in _guard_body's constants: replaced by the function's id
_ORIGINALS: dict = {}         # a guarded function's id (a kernel's: (id, method)) -> the original
_SWAPS: list = []             # (object, attribute, original value, guarded value) of every guard installed


class CourseImplementationCalled(Exception):
    """Raised when a student's function calls one of the course's own implementations."""


def _course_called(fn_id, name: str, args, kwargs):
    """The body of a guarded course function: refused when the notebook's code is on the stack above
    this call with no tool of the lab's between (a course function that calls what it is given is no
    way round); allowed otherwise (the lab's own check, a tool's own helpers)."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code in TOOL_CODES or code is _APPROVED:
            break                    # a tool, or a course call already allowed (the frames above it were read)
        if code.co_filename.startswith(CELL_PREFIX):
            raise CourseImplementationCalled(f"{name} is the course's own implementation: write this exercise "
                                             f"yourself")
        frame = frame.f_back
    return _ORIGINALS[fn_id](*args, **kwargs)


_APPROVED = _course_called.__code__   # on the stack only while the original it allowed runs


def _guard_body(*args, **kwargs):
    # Becomes the code of each guarded course function (run with that function's globals).
    import sys as _s

    _g = _s.modules["attnkit.classroom.grading.guard"]
    return _g._course_called(-7310921, _s._getframe(0).f_code.co_qualname, args, kwargs)


def _functions(modules, lab_module, kernels: dict | None = None) -> list:
    """The functions to guard; ``kernels`` (when given) gets, for each Triton kernel's Python function,
    the kernel object that owns it."""
    found = []
    for module in modules:
        name = module.__name__
        for value in list(vars(module).values()):
            candidates = [value]
            if isinstance(value, type) and value.__module__ == name:
                candidates = [v for k, v in vars(value).items() if isinstance(v, types.FunctionType)
                              and not k.startswith("__")]           # not __eq__, __repr__ and the like
            elif not isinstance(value, types.FunctionType) and isinstance(getattr(value, "fn", None),
                                                                          types.FunctionType):
                candidates = [value.fn]                    # a Triton kernel: its Python function
                if kernels is not None:
                    kernels.setdefault(value.fn, value)
            found += [fn for fn in candidates if isinstance(fn, types.FunctionType) and fn.__module__ == name]
    found += [v for k, v in vars(lab_module).items() if isinstance(v, types.FunctionType) and "ref" in k.lower()
              and v.__module__ == lab_module.__name__]      # the checks' own references
    return [fn for fn in dict.fromkeys(found) if not fn.__code__.co_freevars]


def tool_functions(tools) -> list:
    """The functions named by (module, name) pairs (and their classes' methods and their Triton kernels'
    Python functions): the lab's tools, never guarded.

    The pairs are the ``from attnkit... import name`` lines of the lab notebook (``lab.course_tools``), any
    module of the course a lab chooses to hand out, so each is loaded by its name here."""
    found_all = []
    for module_name, name in tools:
        try:
            value = getattr(importlib.import_module(module_name), name)
        except Exception:  # noqa: BLE001 - a name the lab imports that is not there: nothing to allow
            continue
        found = [value, getattr(value, "fn", None)]
        if isinstance(value, type):
            found += list(vars(value).values())
        found_all += [f for f in found if isinstance(f, types.FunctionType)]
    return found_all


def load_course_implementations() -> None:
    """Import each package or module of ``COURSE_IMPLEMENTATIONS`` (each by an import statement, the same
    names as the table); one that cannot load here cannot be called either."""
    with suppress(Exception):
        from ... import reference  # noqa: F401
    with suppress(Exception):
        from ... import kernels  # noqa: F401
    with suppress(Exception):
        from ...serving import kv_cache, tinymodel  # noqa: F401
    with suppress(Exception):
        from ...analysis import iomodel  # noqa: F401
    with suppress(Exception):
        from ...bench import iomodel as bench_iomodel  # noqa: F401
    with suppress(Exception):
        from ...bench import naive  # noqa: F401


def _rewrite_first(kernel) -> None:
    """Triton's interpreter (3.9 at least) rewrites a kernel from its Python function's source at its first
    launch, reading the function's signature and code then: after the guard has replaced that code, the
    rewrite fails ("JIT functions do not support **kwargs parameters") and the course's kernel cannot run.
    So an interpreted kernel is rewritten (and cached by Triton) before its code is replaced (older
    interpreters run the function itself); a compiled one keeps its code (``guard_compiled_kernel``)."""
    rewrite = getattr(kernel, "rewrite", None)
    if callable(rewrite) and hasattr(kernel, "rewritten_fn"):
        with suppress(Exception):
            rewrite()


def guard_compiled_kernel(kernel, name: str) -> None:
    """A compiled Triton function keeps its Python function: the compiler binds every call of it inside a
    kernel through that function's signature (``inspect.getcallargs``) at each compile, the course's own
    kernels' included, so replacing its code breaks them ("CompilationError" at the call). Its launches
    (``run``) and its compilation into a kernel (``parse``) are guarded instead: the notebook's code may
    neither launch it nor compile a kernel of its own that calls it."""
    for attr in ("run", "parse"):
        method = getattr(kernel, attr, None)
        if method is None:
            continue
        key = (id(kernel), attr)
        _ORIGINALS[key] = method

        def guarded(*args, _key=key, **kwargs):
            return _course_called(_key, name, args, kwargs)
        setattr(kernel, attr, guarded)
        _SWAPS.append((kernel, attr, method, guarded))


def install(lab_module, tools=()) -> int:
    """Guard every course implementation loaded now except the lab's tools; returns how many."""
    load_course_implementations()
    modules = [m for n, m in list(sys.modules.items()) if m is not None and
               any(n == p or n.startswith(p + ".") for p in COURSE_IMPLEMENTATIONS)]
    tool_list = tool_functions(tools)
    allowed = {id(f) for f in tool_list}
    TOOL_CODES.update(f.__code__ for f in tool_list)
    count = 0
    kernels: dict = {}
    compiled = not triton_interprets()
    for fn in _functions(modules, lab_module, kernels):
        if id(fn) in allowed:
            continue
        if compiled and fn in kernels:
            guard_compiled_kernel(kernels[fn], fn.__qualname__)
            count += 1
            continue
        _rewrite_first(kernels.get(fn))
        original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        original.__kwdefaults__ = fn.__kwdefaults__
        _ORIGINALS[id(fn)] = original
        template = _guard_body.__code__
        consts = tuple(id(fn) if c == _PLACEHOLDER else c for c in template.co_consts)
        code = fn.__code__
        fn.__code__ = template.replace(co_name=fn.__name__, co_qualname=fn.__qualname__, co_consts=consts)
        _SWAPS.append((fn, "__code__", code, fn.__code__))
        count += 1
    return count


@contextmanager
def lifted():
    """The course's own code as it runs unguarded, for the leaderboard's timing of the course's kernel in the
    student's process (no notebook code runs inside): every guard is put back on exit. Rule: the course's
    kernel is timed as a user calls it, without the guard's own host time (dozens of guarded calls in one
    attention call; docs/leaderboard.md, "What the course's time measures")."""
    for target, attr, original, _ in _SWAPS:
        setattr(target, attr, original)
    try:
        yield
    finally:
        for target, attr, _, guarded in _SWAPS:
            setattr(target, attr, guarded)
