"""The student's notebook as code: its cells with IPython syntax made Python and the check calls taken
out, loaded as the module ``submission``; and whether a name it defines is the student's own.

Runs in the student's (sandboxed) process only: the IPython transforms are costly on hostile input, so
they run under the notebook's budget, never in the grader.
"""
from __future__ import annotations

import ast
import inspect
import signal
import sys

CELL_PREFIX = "<notebook cell "    # the file name of the student's code in the student's process


def _is_check_call(node) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name.startswith("check_") or name in ("summarize",):
                return True
    return False


class _TransformTimeout(Exception):
    pass


def _transformed(transformer, source: str, timeout: float | None) -> str:
    """``source`` with IPython syntax made Python; as it is when that fails or takes longer than
    ``timeout`` seconds (IPython's transformer is quadratic in a cell's lines: one hostile cell must
    not hold the others), so that it raises SyntaxError when run."""
    def alarm(signum, frame):
        raise _TransformTimeout

    previous = signal.signal(signal.SIGALRM, alarm) if timeout else None
    if timeout:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return transformer.transform_cell(source)
    except Exception:  # noqa: BLE001 - kept as is
        return source
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


def submission_cells(nb, timeout: float | None = None) -> list[dict]:
    """The notebook's code cells as the checking process runs them: IPython syntax (``%magic``,
    ``!shell``) turned into Python (within ``timeout`` seconds a cell), and every top-level statement
    that calls a check removed (blank lines keep the line numbers). Definitions and imports are always
    kept."""
    from IPython.core.inputtransformer2 import TransformerManager

    cells = []
    transformer = TransformerManager()
    number = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        number += 1
        source = _transformed(transformer, cell.source, timeout)
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



def origin_problem(name: str, fn) -> str | None:
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


def load_cells(cells: list[dict], timeout: float, progress) -> tuple[dict, list[str]]:
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
        progress(f"loading code cell {cell['cell']}")
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


