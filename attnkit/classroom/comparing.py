"""How a check compares an answer with its reference and says how they differ: the error it bounds,
the lines that show the worst element, and whether the answer wrote into its inputs."""
from __future__ import annotations

import copy
from typing import Sequence

import numpy as np

from ..tolerances import _as_float64, componentwise_error, rel_error


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


def _kind_of(value) -> str:
    """What a returned value is, in a student's words: 'a tuple of 2 items', 'a list', 'a float'."""
    kind = type(value).__name__
    if isinstance(value, (tuple, list, dict)):
        return f"a {kind} of {len(value)} item{'' if len(value) == 1 else 's'}"
    return f"a {kind}"


def not_an_array(out, array: str = "array") -> str:
    """The words for a result that is not the ``array`` an exercise asks for: what came back and what
    belongs there (a tuple such as ``(O, P)``, a ``.tolist()``, a number)."""
    if isinstance(out, tuple):
        return (f"a tuple of {len(out)} items where one {array} belongs (return only the result, e.g. O "
                f"alone, not (O, P))")
    if isinstance(out, list):
        return f"a list where a {array} belongs (return the array itself, not .tolist())"
    return f"a {type(out).__name__} where a {array} belongs"


def _compared(compare, got, expected) -> tuple[bool, str | None]:
    """(whether ``got`` matches, None) or (False, why it cannot be compared): an answer of another kind
    than the reference (a tuple ``(o, p)`` where one array belongs, a ragged list) is reported in the
    student's terms, never raised from the check."""
    try:
        return bool(compare(got, expected)), None
    except Exception as exc:  # the answer's type or shape breaks the comparison: say what came back
        shape = getattr(expected, "shape", None)
        want = f"one array of shape {tuple(shape)}" if shape is not None else "the kind of result the exercise asks for"
        hint = (" (did you return something else with it? return only the result)"
                if isinstance(got, (tuple, list)) else "")
        return False, (f"your function returned {_kind_of(got)} where {want} belongs{hint}; it cannot be "
                       f"compared with the expected result ({type(exc).__name__}: {exc}).")
