"""The inputs of a check: a case (arguments, label, memory limit), the words of a pass line, and a case
again with other values of the same shapes (so that a function that keeps a result between calls fails).
Every name is re-exported by ``checking``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


def fixed_and_random(fixed: int, drawn: int) -> str:
    """'5 fixed and 4 random inputs' (the words of a pass line)."""
    return f"{fixed} fixed and {drawn} random input{'' if drawn == 1 else 's'}"


def _other_values(value, rng):
    """``value`` with every floating-point NumPy array or torch tensor in it (in tuples, lists, dicts)
    holding other values of the same shape and dtype: a permutation of its own finite values, with the
    signs of about half of them flipped (a NumPy array of 2 or more axes stored in the other memory order,
    a tensor with its own strides). None when nothing in it could change (no such array,
    or one holding a non-finite value: a case built around ±inf keeps its meaning only as it is)."""
    changed = [False]

    def other(a):
        if isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating) and a.size > 1:
            if not np.all(np.isfinite(a)):
                changed.append(None)
                return a
            flat = a.ravel()[rng.permutation(a.size)] * rng.choice([-1.0, 1.0], a.size)
            # stored column by column where ``a`` is stored by rows (and the reverse): a function that
            # assumes one memory order of its inputs fails too
            b = np.empty_like(a, order="F" if a.flags.c_contiguous and a.ndim > 1 else "C")
            b[...] = flat.reshape(a.shape).astype(a.dtype)
            changed[0] = changed[0] or not np.array_equal(a, b)
            return b
        if type(a).__name__ == "Tensor" and a.dtype.is_floating_point and a.numel() > 1:
            import torch

            if not bool(torch.isfinite(a).all()):
                changed.append(None)
                return a
            flat = a.detach().reshape(-1)
            perm = torch.as_tensor(rng.permutation(a.numel()), device=a.device)
            signs = torch.as_tensor(rng.choice([-1.0, 1.0], a.numel()), device=a.device, dtype=a.dtype)
            b = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            b.copy_((flat[perm] * signs).reshape(a.shape))
            changed[0] = changed[0] or not torch.equal(a, b)
            return b
        if isinstance(a, tuple):
            return tuple(other(x) for x in a)
        if isinstance(a, list):
            return [other(x) for x in a]
        if isinstance(a, dict):
            return {k: other(x) for k, x in a.items()}
        return a

    out = other(value)
    return out if changed[0] and None not in changed else None


def again_with_other_values(c: Case, rng) -> Case | None:
    """``c`` with the same shapes (and dtypes) and other values (see ``_other_values``), labelled so
    that a report says why it runs: a function that keeps a result, a mask or a table from an earlier
    call (a cache keyed by the inputs' shapes) returns the earlier call's answer here. None when the case
    has no floating-point input to change."""
    args = _other_values(c.args, rng)
    kwargs = _other_values(c.kwargs, rng) if args is None else c.kwargs
    if args is None and kwargs is None:
        return None
    return Case(args if args is not None else c.args, kwargs if kwargs is not None else c.kwargs,
                f"{c.label}, called again with other values of the same shapes (a result kept from an earlier "
                f"call, e.g. cached by the inputs' shapes, shows here)", c.max_bytes)
