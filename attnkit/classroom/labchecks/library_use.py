"""Which other array libraries a student's function uses, read from its code (``other_libraries_used``): lab
01 is NumPy only. ``student_function`` finds the student's own function behind the grader's wrappers."""
from __future__ import annotations

import os
import types

OTHER_LIBRARIES = ("torch", "scipy", "jax", "jaxlib", "tensorflow", "sklearn", "cupy", "numba", "mlx",
                   "triton")


def _library(value) -> str | None:
    """The top-level package of a module or of a function/class, when it is one of OTHER_LIBRARIES."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
    else:
        name = getattr(value, "__module__", None) or ""
        if not isinstance(name, str):
            name = ""
        owner = getattr(value, "__objclass__", None) or getattr(value, "__self__", None)
        if not name and owner is not None:
            name = getattr(owner, "__module__", "") if not isinstance(owner, types.ModuleType) else owner.__name__
    top = name.split(".")[0]
    return top if top in OTHER_LIBRARIES else None


def code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_objects(const)


def other_libraries_used(fn, _seen=None) -> list[str]:
    """Names of other array libraries that ``fn``, and every Python function it names, refers to:
    a global bound to such a module or function, an ``import`` of one, or its name as a string
    (``__import__("torch")``). The course's own functions are not followed (they raise while the
    student's function runs)."""
    seen = set() if _seen is None else _seen
    found: list[str] = []
    if id(fn) in seen or len(seen) > 200:
        return found
    seen.add(id(fn))
    module = getattr(fn, "__module__", "") or ""
    if module.split(".")[0] in OTHER_LIBRARIES + ("numpy",):
        return found
    fn = student_function(fn)                   # through the grader's wrappers; not the course's code
    if fn is None:
        return found
    code = fn.__code__
    namespace = getattr(fn, "__globals__", {}) or {}
    builtins_ = namespace.get("__builtins__", {})
    builtins_ = vars(builtins_) if isinstance(builtins_, types.ModuleType) else builtins_
    values = [cell.cell_contents for cell in (getattr(fn, "__closure__", None) or ())
              if cell_filled(cell)]
    for c in code_objects(code):
        for name in c.co_names:
            if name.split(".")[0] in OTHER_LIBRARIES and name not in namespace:
                found.append(f"`import {name}`")
            if name in namespace:
                values.append(namespace[name])
            elif name in builtins_:
                values.append(builtins_[name])
        for const in c.co_consts:
            if isinstance(const, str) and const.split(".")[0] in OTHER_LIBRARIES:
                found.append(f"the module name {const!r}")
    for value in values:
        library = _library(value)
        if library is not None:
            label = getattr(value, "__name__", type(value).__name__)
            found.append(f"{library}'s {label}" if not isinstance(value, types.ModuleType) else f"the module {label}")
        elif isinstance(value, (types.FunctionType, types.MethodType)):
            found += other_libraries_used(value, seen)
    return list(dict.fromkeys(found))


def cell_filled(cell) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:             # a closure variable not assigned yet
        return False
    return True


_COURSE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))    # attnkit/classroom


def student_function(fn, depth: int = 0):
    """The student's own function behind ``fn``: ``fn`` itself, or, when ``fn`` is a wrapper of the
    course's (the grader's timer, its call to another process), the function it closes over; None
    when there is none here (the student's code runs in another process)."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or depth > 5:
        return None
    if not os.path.abspath(code.co_filename).startswith(_COURSE_DIR + os.sep):
        return fn
    for cell in getattr(fn, "__closure__", None) or ():
        inner = cell.cell_contents if cell_filled(cell) else None
        if isinstance(inner, (types.FunctionType, types.MethodType)):
            found = student_function(inner, depth + 1)
            if found is not None:
                return found
    return None
