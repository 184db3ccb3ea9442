"""An FP8 (e4m3) cache: quantising K and V with one scale per KV head, and reading fp8 bytes in a kernel.

- ``FP8``: torch.float8_e4m3fn; ``FP8_MAX``: 448.0, its largest finite value.
- ``fp8_scales(x, name="x") -> scale``: one fp32 scale per KV head (dim −2 of x [..., Hkv, D]), amax / 448,
  so that x / scale fits e4m3; ValueError naming ``name`` if x holds a NaN or an infinity.
- ``quantize_fp8(x, scale) -> x8``: x / scale rounded to e4m3, saturating at ±448; x ≈ x8 · scale.
- ``fp8_read(t)``: ``t`` as a Triton kernel should read it (an exact fp16 copy where Triton's interpreter
  would misread an e4m3 NaN byte; unchanged everywhere else).

Used by the paged kernels (``paged_decode``, ``paged_extend``: the cache holds K / k_scale and V / v_scale,
and the kernels multiply the scale back in registers), by ``rope_append`` (which writes such a cache) and by
the FP8 forward of ``flash_fp8``.
"""
from __future__ import annotations

import torch

from ..device import triton_interprets

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0                        # the largest finite e4m3 value


def fp8_read(t):
    """``t`` as a kernel should read it. On Triton's interpreter an e4m3 NaN byte (0x7F / 0xFF) is read as
    ±480 (the interpreter's conversion has no NaN), so there an fp8 tensor holding a NaN byte is passed as
    its exact fp16 copy instead (every e4m3 value, NaN included, is exact in fp16): the output is NaN where
    it reads one, as on a GPU. Other tensors, and every tensor of a compiled kernel, pass unchanged."""
    if t is None or t.dtype != FP8 or t.device.type != "cpu" or not triton_interprets():
        return t
    if bool(((t.view(torch.uint8) & 0x7F) == 0x7F).any()):
        return t.to(torch.float16)
    return t


def fp8_scales(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """One fp32 scale per KV head (dim −2 of x [..., Hkv, D]): amax / 448, so K / scale fits e4m3.
    ValueError (naming ``name``) if x holds a NaN or an infinity: its scale would be NaN or infinite and
    every value of its head would be lost (a synchronisation on a GPU)."""
    amax = x.detach().abs().float().reshape(-1, x.shape[-2], x.shape[-1]).amax(dim=(0, 2))
    if not bool(torch.isfinite(amax).all()):
        raise ValueError(f"{name}: holds a NaN or an infinity, so it has no finite fp8 scale (amax / 448); "
                         "quantize finite values only")
    return (amax / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., Hkv, D] / scale [Hkv], rounded to float8_e4m3fn (saturating at ±448)."""
    return (x.float() / scale[:, None].to(x.device)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


__all__ = ["FP8", "FP8_MAX", "fp8_read", "fp8_scales", "quantize_fp8"]
