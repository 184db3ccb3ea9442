"""Defences of the kernel checks: tensors with chosen layouts inside poisoned buffers, masked loads
that read NaN, and allocations whose padding is checked after the call."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Sequence

import numpy as np

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
