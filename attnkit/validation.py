"""Input checks shared by every public function: a ValueError that names the argument and the rule.

- ``tensor(name, t, dims, layout, dtypes=None)``: a non-empty torch.Tensor of ``dims`` dimensions
  (``layout`` names them in the message), of one of ``dtypes`` when given.
- ``positive_int(name, value)``: an int >= 1 (bool refused).
- ``softmax_scale(sm_scale, head_dim)``: 1/sqrt(head_dim) for None, else a positive finite real.
- ``flag(name, value)``: a bool.
- ``same(what, **tensors)``: the tensors share one dtype (``what="dtype"``) or one device.
- ``head_groups(names, n_heads, n_kv_heads)``: Hq % Hkv == 0; ``head_dim(name, d, allowed)``.
- ``kernel_device(name, t)``: ``t`` is on a device the Triton kernels run for (CUDA or the CPU).
- ``disjoint(**tensors)``: no two of the tensors share memory (an output written twice);
  ``writable(name, t)``: no two elements of ``t`` share memory (an expanded view cannot be written).
"""
from __future__ import annotations

import math
import numbers

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def tensor(name: str, t, dims: int, layout: str, dtypes=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dimensions {layout}, got shape {tuple(t.shape)}")
    if t.numel() == 0:
        raise ValueError(f"{name}: every size must be >= 1, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = [str(d).removeprefix("torch.") for d in dtypes]
        allowed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        raise ValueError(f"{name}: dtype {t.dtype} is not supported; use {allowed}")
    return t


def positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name}: must be positive (>= 1), got {value}")
    return int(value)


def softmax_scale(sm_scale, head_dim: int) -> float:
    """sm_scale as a float: 1/sqrt(head_dim) for None, else any positive finite real (NumPy's too)."""
    if sm_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if (isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real) or not math.isfinite(sm_scale)
            or sm_scale <= 0):
        raise ValueError(f"sm_scale: expected a positive finite number or None, got {sm_scale!r}")
    return float(sm_scale)


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


def same(what: str, **tensors) -> None:
    """The tensors share one ``what`` ("dtype" or "device")."""
    values = {name: getattr(t, what) for name, t in tensors.items()}
    if len(set(values.values())) > 1:
        rule = "share one dtype" if what == "dtype" else "be on one device"
        raise ValueError(f"{', '.join(values)}: must {rule}, got "
                         + ", ".join(f"{name}={value}" for name, value in values.items()))


def head_groups(names: str, n_heads: int, n_kv_heads: int) -> None:
    if n_heads % n_kv_heads:
        raise ValueError(f"{names}: the query heads Hq={n_heads} must be a multiple of the key/value heads "
                         f"Hkv={n_kv_heads} (Hq % Hkv == 0)")


MAX_GRID_AXIS = 65535       # the most programs a CUDA grid's second or third axis holds


def grid_axis(name: str, what: str, count: int) -> None:
    """Raise ValueError if ``count`` (the heads, or the sequences, a kernel's grid runs along one axis) is
    more than one axis of a CUDA grid holds."""
    if count > MAX_GRID_AXIS:
        raise ValueError(f"{name}: {what} = {count} is more than one launch runs ({MAX_GRID_AXIS}, a CUDA grid "
                         "axis); split the call")


def head_dim(name: str, d: int, allowed) -> None:
    if d not in allowed:
        raise ValueError(f"{name}: head dim D={d} is not supported; D must be one of {tuple(allowed)}")


def kernel_device(name: str, t: torch.Tensor) -> None:
    if t.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: device {t.device} is not supported; use a CUDA GPU or the CPU")


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte addresses that ``t``'s elements can occupy."""
    extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) + 1
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def _addresses(t: torch.Tensor) -> torch.Tensor:
    """The byte address of each element of ``t`` (int64, on the CPU)."""
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = offsets[..., None] + torch.arange(size, dtype=torch.int64) * stride
    return t.data_ptr() + offsets.flatten() * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when some element of ``a`` and some element of ``b`` share memory."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    if a1 <= b0 or b1 <= a0:
        return False            # disjoint address ranges
    if a.element_size() != b.element_size() or a.numel() + b.numel() > 2 ** 24:
        return True             # interleaved views this large are not told apart: treated as shared
    return bool(torch.isin(_addresses(a), _addresses(b)).any())


def writable(name: str, t: torch.Tensor) -> None:
    """``t`` is written: no two of its elements may share memory (an expanded view, stride 0)."""
    if any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride())):
        raise ValueError(f"{name}: is written, so no two of its elements may share memory; got an expanded "
                         f"view (strides {tuple(t.stride())}); pass a tensor of its own")


def disjoint(**tensors) -> None:
    """No two of the tensors share memory (one of them is written: the other would be overwritten)."""
    items = [(name, t) for name, t in tensors.items() if t is not None]
    for i, (name_a, a) in enumerate(items):
        for name_b, b in items[i + 1:]:
            if _overlap(a, b):
                raise ValueError(f"{name_a}, {name_b}: must not share memory (one is written while the "
                                 f"other is used: pass separate tensors)")
