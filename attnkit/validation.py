"""Input checks shared by every public function: a ValueError that names the argument and the rule.

- ``tensor(name, t, dims, layout, dtypes=None)``: a non-empty torch.Tensor of ``dims`` dimensions
  (``layout`` names them in the message), of one of ``dtypes`` when given.
- ``positive_int(name, value)``: an int >= 1 (bool refused).
- ``softmax_scale(sm_scale, head_dim)``: 1/sqrt(head_dim) for None, else a positive finite real.
- ``flag(name, value)``: a bool.
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
