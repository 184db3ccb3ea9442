"""The input checks of ``rope_append`` (each a ValueError naming the argument and the rule) and what one
update does once they pass (``UpdatePlan``, from ``plan_update``): the rows already in the cache, the rows
written, each new token's rotation position. ``check_scales`` checks an FP8 cache's scales.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .. import validation
from ..reference.rope import check_base, check_mode

FP8 = torch.float8_e4m3fn
SUPPORTED_DTYPES = validation.FLOAT_DTYPES      # the Triton kernel's
FALLBACK_DTYPES = SUPPORTED_DTYPES + (torch.float64,)                    # the PyTorch path's


@dataclass(frozen=True)
class UpdatePlan:
    """What one update does, after the inputs were checked."""

    batch: int
    new_len: int               # S
    q_heads: int
    kv_heads: int
    head_dim: int
    past_len: torch.Tensor     # int64 [B] on the CPU: rows already in the cache
    positions: torch.Tensor    # int64 [B, S] on the CPU: the rotation position of each new token
    present_len: int           # rows of the cache written to
    dtype: torch.dtype
    quantized: bool = False    # the cache is float8_e4m3fn, written through k_scale, v_scale


def plan_update(q, k, v, k_cache, v_cache, seqlens_k, position_ids, share_buffer, total_sequence_length,
                mode, base, cos_cache, sin_cache, k_scale=None, v_scale=None) -> UpdatePlan:
    """Check every input (ValueError naming the argument and the rule) and work out the update."""
    share_buffer = _check_tensors(q, k, v, k_cache, v_cache, share_buffer, mode, base)
    batch, new_len, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    quantized = check_scales(k_cache, k_scale, v_scale, kv_heads, q.device)
    cache_len = k_cache.shape[2]
    past_len = _past_len(seqlens_k, batch, new_len, q.device)
    present_len = _present_len(past_len, new_len, cache_len, share_buffer, total_sequence_length)
    positions = _positions(position_ids, past_len, batch, new_len, q.device)
    _check_rope_tables(cos_cache, sin_cache, head_dim, positions, q.device)
    return UpdatePlan(batch, new_len, q_heads, kv_heads, head_dim, past_len, positions, present_len, q.dtype, quantized)


def _check_tensors(q, k, v, k_cache, v_cache, share_buffer, mode, base) -> bool:
    """The tensors' ranks, dtypes, devices, overlaps and shapes, the mode and the base; returns
    ``share_buffer`` as a bool."""
    validation.tensor("q", q, 4, "[B, S, Hq, D] (BSNH)")
    validation.tensor("k", k, 4, "[B, S, Hkv, D] (BSNH)")
    validation.tensor("v", v, 4, "[B, S, Hkv, D] (BSNH)")
    validation.tensor("k_cache", k_cache, 4, "[B, Hkv, S_cache, D] (BNSH)")
    validation.tensor("v_cache", v_cache, 4, "[B, Hkv, S_cache, D] (BNSH)")
    check_mode(mode)
    check_base(base)
    share_buffer = validation.flag("share_buffer", share_buffer)
    validation.same("dtype", q=q, k=k, v=v)
    validation.same("dtype", k_cache=k_cache, v_cache=v_cache)
    if k_cache.dtype not in (q.dtype, FP8):
        raise ValueError(f"k_cache: dtype must be q's ({q.dtype}) or torch.float8_e4m3fn, got {k_cache.dtype}")
    if q.dtype not in FALLBACK_DTYPES:
        raise ValueError(f"q: dtype {q.dtype} is not supported; use float16, bfloat16, float32 or float64")
    validation.same("device", q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache)
    validation.disjoint(k_cache=k_cache, v_cache=v_cache)
    if share_buffer:   # the caches are written while q, k, v are read
        validation.writable("k_cache", k_cache)
        validation.writable("v_cache", v_cache)
        for name, t in (("q", q), ("k", k), ("v", v)):
            validation.disjoint(**{name: t, "k_cache": k_cache})
            validation.disjoint(**{name: t, "v_cache": v_cache})
    if k.shape != v.shape:
        raise ValueError(f"k, v: must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache, v_cache: must have the same shape, got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    batch, new_len, q_heads, head_dim = q.shape
    if k.shape[0] != batch or k.shape[1] != new_len or k.shape[3] != head_dim:
        raise ValueError(f"q, k: must agree on B, S and D, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    kv_heads = k.shape[2]
    if q_heads % kv_heads:
        raise ValueError(f"q, k: the query heads Hq={q_heads} must be a multiple of the key/value heads "
                         f"Hkv={kv_heads} (Hq % Hkv == 0)")
    validation.grid_axis("q", "batch B", batch)                         # the kernel's grid: (.., Hq + Hkv, B)
    validation.grid_axis("q, k", "heads Hq + Hkv", q_heads + kv_heads)
    if head_dim % 2:
        raise ValueError(f"q: RoPE rotates pairs, so the head dim must be even, got D={head_dim}")
    if k_cache.shape[0] != batch or k_cache.shape[1] != kv_heads or k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache: expected [B={batch}, Hkv={kv_heads}, S_cache, D={head_dim}] (BNSH), "
                         f"got {tuple(k_cache.shape)}")
    return share_buffer


def _past_len(seqlens_k, batch: int, new_len: int, device) -> torch.Tensor:
    """int64 [B] on the CPU: the rows already in the cache (``seqlens_k``: index of each sequence's last
    token after this update; None: an empty cache)."""
    if seqlens_k is None:
        return torch.zeros(batch, dtype=torch.int64)
    if not isinstance(seqlens_k, torch.Tensor) or seqlens_k.shape != (batch,) or seqlens_k.dtype not in (
            torch.int32, torch.int64):
        raise ValueError(f"seqlens_k: expected an int32 or int64 tensor of shape [B={batch}], got "
                         f"{getattr(seqlens_k, 'shape', type(seqlens_k).__name__)} "
                         f"{getattr(seqlens_k, 'dtype', '')}")
    if seqlens_k.device != device:
        raise ValueError(f"seqlens_k: must be on {device} like q, got {seqlens_k.device}")
    past_len = seqlens_k.to("cpu", torch.int64) + 1 - new_len
    if int(past_len.min()) < 0:
        b = int(past_len.argmin())
        raise ValueError(f"seqlens_k: seqlens_k[{b}] = {int(seqlens_k[b])} is the index of the last token, "
                         f"so it must be >= S - 1 = {new_len - 1} (past_len = seqlens_k + 1 - S >= 0)")
    return past_len


def _present_len(past_len, new_len: int, cache_len: int, share_buffer: bool, total_sequence_length) -> int:
    """Rows of the cache written to: the shared buffer's, or the new (present) buffer's."""
    total = past_len + new_len                                        # [B] tokens after the update
    if share_buffer:
        present_len = cache_len
        if int(total.max()) > cache_len:
            b = int(total.argmax())
            raise ValueError(f"k_cache: sequence {b} needs {int(total[b])} rows but the shared buffer holds "
                             f"S_cache = {cache_len} (seqlens_k[b] must be < S_cache)")
    else:
        if int(past_len.max()) > cache_len:
            b = int(past_len.argmax())
            raise ValueError(f"k_cache: sequence {b} has past_len {int(past_len[b])} but the past buffer "
                             f"holds only {cache_len} rows")
        present_len = cache_len + new_len if total_sequence_length is None else total_sequence_length
        if (isinstance(present_len, bool) or not isinstance(present_len, numbers.Integral)
                or present_len < int(total.max())):
            raise ValueError(f"total_sequence_length: expected an integer >= the longest sequence "
                             f"({int(total.max())}), got {total_sequence_length!r}")
        present_len = int(present_len)
    return present_len


def _positions(position_ids, past_len, batch: int, new_len: int, device) -> torch.Tensor:
    """int64 [B, S] on the CPU: the rotation position of each new token."""
    if position_ids is None:
        positions = past_len[:, None] + torch.arange(new_len)[None, :]
    else:
        if not isinstance(position_ids, torch.Tensor) or position_ids.shape != (batch, new_len) or \
                position_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"position_ids: expected an int32 or int64 tensor of shape [B={batch}, S={new_len}], "
                             f"got {getattr(position_ids, 'shape', type(position_ids).__name__)} "
                             f"{getattr(position_ids, 'dtype', '')}")
        if position_ids.device != device:
            raise ValueError(f"position_ids: must be on {device} like q, got {position_ids.device}")
        positions = position_ids.to("cpu", torch.int64)
        if int(positions.min()) < 0:
            raise ValueError(f"position_ids: must be >= 0, got minimum {int(positions.min())}")
    return positions


def _check_rope_tables(cos_cache, sin_cache, head_dim: int, positions, device) -> None:
    """The optional cos/sin tables: both or neither, [max_positions, D/2] on q's device, long enough."""
    if (cos_cache is None) != (sin_cache is None):
        raise ValueError("cos_cache, sin_cache: give both or neither")
    if cos_cache is not None:
        for name, t in (("cos_cache", cos_cache), ("sin_cache", sin_cache)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[1] != head_dim // 2:
                raise ValueError(f"{name}: expected [max_positions, D/2 = {head_dim // 2}], got "
                                 f"{getattr(t, 'shape', type(t).__name__)}")
            if t.device != device:
                raise ValueError(f"{name}: must be on {device} like q, got {t.device}")
        if cos_cache.shape != sin_cache.shape:
            raise ValueError(f"cos_cache, sin_cache: shapes differ ({tuple(cos_cache.shape)} vs "
                             f"{tuple(sin_cache.shape)})")
        if int(positions.max()) >= cos_cache.shape[0]:
            raise ValueError(f"cos_cache: position {int(positions.max())} needs row {int(positions.max())}, "
                             f"but the table has {cos_cache.shape[0]} rows")


def check_scales(k_cache, k_scale, v_scale, kv_heads: int, device) -> bool:
    """ValueError unless the scales fit the cache: fp32 [Hkv], finite and > 0, on q's device, for a
    float8_e4m3fn cache; none for any other. True when the cache is quantised. (The values are read
    on the host: a synchronisation for scales on a GPU, as for seqlens_k.)"""
    if k_cache.dtype != FP8:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale, v_scale: only for a float8_e4m3fn cache; this cache is {k_cache.dtype}")
        return False
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            raise ValueError(f"{name}: required for a float8_e4m3fn cache (float32 [Hkv={kv_heads}]: the cache "
                             f"holds K / k_scale and V / v_scale)")
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or tuple(scale.shape) != (kv_heads,):
            raise ValueError(f"{name}: expected a float32 tensor of shape [Hkv={kv_heads}] (one scale per KV head), "
                             f"got {getattr(scale, 'shape', type(scale).__name__)} {getattr(scale, 'dtype', '')}")
        if scale.device != device:
            raise ValueError(f"{name}: must be on {device} like q, got {scale.device}")
        values = scale.detach().to("cpu")
        if not bool(torch.all(torch.isfinite(values) & (values > 0))):
            raise ValueError(f"{name}: every scale must be finite and > 0, got {values.tolist()}")
    return True
