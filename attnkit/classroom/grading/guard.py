"""In the student's process: the course's own implementations refuse calls from the notebook's code.

Installed before the notebook's code loads and never removed, so a copy of a course function made at
import is a copy of the refusal. The course's own code (a check, a tool the lab hands out) may still
call them. This is a teaching guard in a process the student's code controls: it keeps an honest
answer honest and names the function; it is not what makes a grade trustworthy. That is the checker's
separate process, which judges only the values that come back (see ``calls``).
"""
from __future__ import annotations

import importlib
import sys
import types

from .submission import CELL_PREFIX

# The course's own implementations: the student's code may not call them while it is graded.
COURSE_IMPLEMENTATIONS = ("attnkit.reference", "attnkit.kernels", "attnkit.serving.kv_cache",
                          "attnkit.serving.tinymodel", "attnkit.bench.iomodel")
PACKAGE_DIR = __file__.rsplit("/classroom/", 1)[0]
# The grading's own frames between the check and the student's code: not course code for the guard.
_STUDENT_SIDE = tuple(__file__.rsplit("/", 1)[0] + f"/{name}.py" for name in ("guard", "calls", "runner"))
_PLACEHOLDER = -7310921            # in _guard_body's constants: replaced by the function's id
_ORIGINALS: dict[int, object] = {}


class CourseImplementationCalled(Exception):
    """Raised when a student's function calls one of the course's own implementations."""


def _course_called(fn_id: int, name: str, args, kwargs):
    """The body of a guarded course function: the course's own code may call it; the notebook's code,
    and code with no course frame between it and this call, may not."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(CELL_PREFIX) or filename in _STUDENT_SIDE:
            break
        if filename.startswith(PACKAGE_DIR):
            return _ORIGINALS[fn_id](*args, **kwargs)
        frame = frame.f_back
    raise CourseImplementationCalled(f"{name} is the course's own implementation: write this exercise yourself")


def _guard_body(*args, **kwargs):
    # Becomes the code of each guarded course function (run with that function's globals).
    import sys as _s

    _g = _s.modules["attnkit.classroom.grading.guard"]
    return _g._course_called(-7310921, _s._getframe(0).f_code.co_qualname, args, kwargs)


def _functions(modules, lab_module) -> list:
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
            found += [fn for fn in candidates if isinstance(fn, types.FunctionType) and fn.__module__ == name]
    found += [v for k, v in vars(lab_module).items() if isinstance(v, types.FunctionType) and "ref" in k.lower()
              and v.__module__ == lab_module.__name__]      # the checks' own references
    return [fn for fn in dict.fromkeys(found) if not fn.__code__.co_freevars]


def tool_ids(tools) -> frozenset:
    """The ids of the functions named by (module, name) pairs (and of their classes' methods and of
    their Triton kernels' Python functions): the lab's tools, never guarded."""
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


def install(lab_module, tools=()) -> int:
    """Guard every course implementation loaded now except the lab's tools; returns how many."""
    for prefix in COURSE_IMPLEMENTATIONS:
        try:
            importlib.import_module(prefix)
        except Exception:  # noqa: BLE001 - a part of the course that cannot load here cannot be called
            continue
    modules = [m for n, m in list(sys.modules.items()) if m is not None and
               any(n == p or n.startswith(p + ".") for p in COURSE_IMPLEMENTATIONS)]
    allowed = tool_ids(tools)
    count = 0
    for fn in _functions(modules, lab_module):
        if id(fn) in allowed:
            continue
        original = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        original.__kwdefaults__ = fn.__kwdefaults__
        _ORIGINALS[id(fn)] = original
        template = _guard_body.__code__
        consts = tuple(id(fn) if c == _PLACEHOLDER else c for c in template.co_consts)
        fn.__code__ = template.replace(co_name=fn.__name__, co_qualname=fn.__qualname__, co_consts=consts)
        count += 1
    return count
