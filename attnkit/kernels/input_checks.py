"""Checks of the options the attention kernels share (the dense FlashAttention and the paged kernels):
a sliding window, a logit softcap, the offsets of packed sequences. Each raises ValueError naming the
argument and the rule, and returns the value as the kernels take it."""
from __future__ import annotations

import math
import numbers

import torch

from .. import validation


def check_window(window) -> tuple[int, int]:
    """``window`` as (left, right): two integers >= -1, -1 meaning that side is unbounded."""
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or any(isinstance(w, bool) or not isinstance(w, numbers.Integral) for w in window)):
        raise ValueError(f"window: expected (left, right), two integers >= -1 (-1: unbounded), got {window!r}")
    if min(window) < -1:
        raise ValueError(f"window: each side must be >= -1 (-1: unbounded), got {tuple(window)}")
    return int(window[0]), int(window[1])


def check_softcap(softcap) -> float | None:
    """``softcap``: None (off) or a positive finite number."""
    if softcap is None:
        return None
    if (isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not math.isfinite(softcap)
            or softcap <= 0):
        raise ValueError(f"softcap: expected a positive finite number or None (off), got {softcap!r}")
    return float(softcap)


def check_cu_seqlens(name: str, cu_seqlens, total: int, device) -> int:
    """Raise ValueError unless ``cu_seqlens`` is a contiguous int32 [B + 1] tensor on ``device`` of offsets
    that start at 0, never decrease and end at ``total``; return the longest sequence. (Contiguous: the
    kernels read entry b at cu_seqlens + b; FlashAttention-2 refuses other strides too.)"""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D int32 tensor of B + 1 offsets (B >= 1), got "
                         f"{getattr(cu_seqlens, 'shape', type(cu_seqlens).__name__)}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"{name}: dtype {cu_seqlens.dtype} is not supported; use torch.int32")
    if cu_seqlens.device != device:
        raise ValueError(f"{name}: must be on q's device {device}, got {cu_seqlens.device}")
    if cu_seqlens.stride(0) != 1:
        # the kernels read entry b at cu_seqlens + b (as FlashAttention-2, which refuses them too)
        raise ValueError(f"{name}: must be contiguous (stride 1), got stride {cu_seqlens.stride(0)} (a strided "
                         f"view or a column of a larger tensor); pass {name}.contiguous()")
    offsets = cu_seqlens.cpu().long()
    if offsets[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {int(offsets[0])}")
    lengths = offsets[1:] - offsets[:-1]
    if (lengths < 0).any():
        raise ValueError(f"{name}: must not decrease (entry {int(torch.nonzero(lengths < 0)[0, 0]) + 1} is "
                         "smaller than the one before)")
    if offsets[-1] != total:
        raise ValueError(f"{name}: its last entry must be the total number of tokens {total}, got {int(offsets[-1])}")
    validation.grid_axis(name, "sequences B", len(lengths))
    return int(lengths.max())



__all__ = ["check_window", "check_softcap", "check_cu_seqlens"]
