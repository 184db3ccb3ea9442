"""Rotary position embeddings (RoPE) in the two layouts that models use.

RoPE splits a head vector x (length D, even) into D/2 pairs and turns pair j by the angle
pos · θ_j, with θ_j = base^(−2j/D). The two modes differ only in which coordinates form a pair:

- ``"half"`` (half-split, GPT-NeoX / Hugging Face Llama): pair j is (x[j], x[j + D/2]);
- ``"interleaved"`` (GPT-J / Meta's original Llama code): pair j is (x[2j], x[2j + 1]).

Each pair (a, b) becomes (a·cos − b·sin, b·cos + a·sin). Because a rotation by m followed by the
transpose of a rotation by n is a rotation by m − n, the score ⟨R(m)q, R(n)k⟩ depends on the
positions only through m − n: the relative-position property.

Public functions
- ``apply_rope(x, positions, *, mode="half", base=10000.0)``: rotate the last axis of ``x``;
  ``positions`` (integers ≥ 0) broadcast against ``x.shape[:-1]``. For x in BSNH [B, S, H, D] pass
  positions of shape [B, S, 1] or [S, 1]; for BNSH [B, H, S, D] pass [B, 1, S] or [S]. Computed in
  float64, returned in x's dtype on x's device.
- ``rope_cache(max_positions, head_dim, *, base, dtype, device)``: the (cos, sin) tables
  [max_positions, D/2] that kernels read (computed in float64, then cast).
- ``inv_frequencies(head_dim, base)``, ``rope_angles(positions, head_dim, base)``.
- ``pair_layout(head_dim, mode)``: for every coordinate d, its partner, the sign of the partner's
  term and the frequency index; exactly what a kernel needs to rotate one element.
- ``rotation_matrix(position, head_dim, *, mode, base)``: the D×D matrix R(pos), for pictures and proofs.
"""
from __future__ import annotations

import functools
import math
import numbers

import torch

MODES = ("half", "interleaved")


# ------------------------------------------------------------------------------------ input checks
def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    return mode


def check_head_dim(head_dim, name: str = "head_dim") -> int:
    """``head_dim`` as a Python int: an even integer >= 2 (Python's or NumPy's)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"{name}: RoPE rotates pairs, so the head dim must be an even integer >= 2, "
                         f"got {head_dim!r}")
    return int(head_dim)


def check_base(base) -> float:
    """``base`` as a Python float: a finite real number > 1 (Python's or NumPy's)."""
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not math.isfinite(base) or base <= 1:
        raise ValueError(f"base: expected a finite number > 1, got {base!r}")
    return float(base)


def _positions_tensor(positions, device) -> torch.Tensor:
    pos = positions if isinstance(positions, torch.Tensor) else torch.as_tensor(positions)
    if pos.dtype.is_floating_point or pos.dtype == torch.bool or pos.dtype.is_complex:
        raise ValueError(f"positions: expected integers, got dtype {pos.dtype}")
    if pos.numel() and int(pos.min()) < 0:
        raise ValueError(f"positions: must be >= 0, got minimum {int(pos.min())}")
    return pos.to(device)


# ------------------------------------------------------------------------------------- the tables
def inv_frequencies(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """θ_j = base^(−2j/D) for j = 0 .. D/2 − 1, float64 [D/2] on the CPU."""
    head_dim, base = check_head_dim(head_dim), check_base(base)
    j = torch.arange(head_dim // 2, dtype=torch.float64)
    return base ** (-2.0 * j / head_dim)


def rope_angles(positions, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """pos · θ_j in float64: shape positions.shape + [D/2], on the positions' device."""
    pos = _positions_tensor(positions, "cpu" if not isinstance(positions, torch.Tensor) else positions.device)
    theta = inv_frequencies(head_dim, base).to(pos.device)
    return pos.to(torch.float64)[..., None] * theta


@functools.lru_cache(maxsize=32)
def _cached_tables(max_positions: int, head_dim: int, base: float, dtype: torch.dtype, device: str):
    angles = rope_angles(torch.arange(max_positions), head_dim, base)          # [P, D/2] float64
    return (torch.cos(angles).to(device=device, dtype=dtype),
            torch.sin(angles).to(device=device, dtype=dtype))


def rope_cache(max_positions: int, head_dim: int, *, base: float = 10000.0, dtype=torch.float32,
               device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [max_positions, D/2]: row p holds cos(p·θ_j), sin(p·θ_j). Computed in float64.

    The tables are cached; treat them as read-only.
    """
    if isinstance(max_positions, bool) or not isinstance(max_positions, numbers.Integral) or max_positions < 1:
        raise ValueError(f"max_positions: expected an integer >= 1, got {max_positions!r}")
    return _cached_tables(int(max_positions), check_head_dim(head_dim), check_base(base), dtype,
                          str(torch.device(device)))


def pair_layout(head_dim: int, mode: str = "half") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partner, sign, freq) for d = 0 .. D−1: rope(x)[d] = x[d]·cos θ + sign[d]·x[partner[d]]·sin θ,
    with θ = pos · θ_freq[d]. Integer tensors [D] (sign is −1 or +1)."""
    check_head_dim(head_dim)
    check_mode(mode)
    d = torch.arange(head_dim)
    half = head_dim // 2
    if mode == "half":
        first = d < half
        partner = torch.where(first, d + half, d - half)
        freq = torch.where(first, d, d - half)
        sign = torch.where(first, -1, 1)
    else:
        partner = d ^ 1
        freq = d // 2
        sign = torch.where(d % 2 == 0, -1, 1)
    return partner, sign, freq


# ------------------------------------------------------------------------------------ the rotation
def apply_rope(x: torch.Tensor, positions, *, mode: str = "half", base: float = 10000.0) -> torch.Tensor:
    """Rotate the last axis of ``x`` by RoPE at ``positions`` (broadcast against x.shape[:-1]).

    Computed in float64; the result has x's shape, dtype and device.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x: expected at least one dimension (the head dim last)")
    if not x.dtype.is_floating_point:
        raise ValueError(f"x: expected a floating-point tensor, got dtype {x.dtype}")
    head_dim = check_head_dim(x.shape[-1], "x")
    check_mode(mode)
    pos = _positions_tensor(positions, x.device)
    try:
        torch.broadcast_shapes(pos.shape, x.shape[:-1])
    except RuntimeError:
        raise ValueError(f"positions: shape {tuple(pos.shape)} does not broadcast against x.shape[:-1] = "
                         f"{tuple(x.shape[:-1])}") from None
    angles = pos.to(torch.float64)[..., None] * inv_frequencies(head_dim, base).to(x.device)  # [..., D/2]
    cos, sin = torch.cos(angles), torch.sin(angles)
    x64 = x.to(torch.float64)
    half = head_dim // 2
    if mode == "half":
        a, b = x64[..., :half], x64[..., half:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = x64[..., 0::2], x64[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


def rotation_matrix(position: int, head_dim: int, *, mode: str = "half", base: float = 10000.0) -> torch.Tensor:
    """R(position), float64 [D, D], such that apply_rope(x, position) == R @ x."""
    eye = torch.eye(check_head_dim(head_dim), dtype=torch.float64)
    return apply_rope(eye, torch.tensor(position), mode=mode, base=base).T
