"""A Triton kernel that rotates new keys and queries by RoPE and appends them to the KV cache.

Rotate and append (the update of ONNX Runtime's GroupQueryAttention operator, in Triton)
- ``rope_append(q, k, v, k_cache, v_cache, *, seqlens_k=None, position_ids=None, share_buffer=True,
  total_sequence_length=None, mode="half", base=10000.0, cos_cache=None, sin_cache=None,
  k_scale=None, v_scale=None, backend="auto")`` -> ``KVUpdate(q, k_cache, v_cache, backend)``.
  New tokens q [B, S, Hq, D], k, v [B, S, Hkv, D] come in BSNH (as a projection writes them); the
  cache is BNSH [B, Hkv, S_cache, D]. Query and key rows are rotated by RoPE; K and V rows are written
  to cache rows past_len[b] .. past_len[b] + S − 1, where, as in the operator,

      seqlens_k[b] = total_length[b] − 1 (the index of the last token),  past_len[b] = seqlens_k[b] + 1 − S

  and ``seqlens_k=None`` means a first prompt (past_len = 0). ``position_ids`` [B, S] give the rotation
  positions explicitly (chunked prefill); without them token s of sequence b sits at past_len[b] + s.
  ``share_buffer=True``: k_cache/v_cache are written in place. ``share_buffer=False``: they are the
  past, left untouched; a new present cache [B, Hkv, total_sequence_length, D] receives the first
  past_len[b] rows of the past and then the new rows (rows after a sequence's end are zero).
- An FP8 cache: k_cache, v_cache of dtype float8_e4m3fn with ``k_scale``, ``v_scale`` fp32 [Hkv], the
  scales of one layer's KV heads (a model keeps one pair per layer). The cache holds K / k_scale and
  V / v_scale, as ``paged_extend`` reads them: each new row is rotated in fp32, divided by its head's
  scale (correctly rounded), clamped to ±448 and rounded to the nearest e4m3 value (ties to even),
  which is what ``fp8_cache.quantize_fp8`` does. V's bytes equal quantize_fp8's exactly; K's
  rotation in fp32 may differ from a float64 rotation in its last bit, so a stored K byte is at most
  one e4m3 step from quantize_fp8 of the float64 rotation. A scale per KV head, not per page: a
  page's rows are written one decode step at a time, so a per-page scale would be fixed by its first
  rows; one scale per (layer, KV head), calibrated beforehand (``fp8_scales``: amax / 448), is what
  vLLM's FP8 KV cache uses. The Triton path needs a GPU of sm_89 or newer (the interpreter on a CPU);
  elsewhere the PyTorch path writes the same bytes up to the rotation's last bit.
- ``rope_append_reference(...)``: the same update from the definitions, in float64, for checks.
- ``rope_append_torch(...)``: the same update as separate PyTorch operations (the fallback path).
- ``choose_backend(q, *, capability=None, cache_dtype=None)``: which path runs and why (dtype, compute capability,
  head size, the ``ATTNKIT_DISABLE_TRITON_KVCACHE`` environment variable).

Every tensor argument may have any strides (views, expanded or offset tensors); k_cache and v_cache
must not share memory (both are written). Where it runs: as every kernel of the course, by
``attnkit.device.kernel_device`` (the interpreter for CPU tensors on a machine without a GPU, the GPU
otherwise; CPU tensors on a machine with a GPU are computed there and the results copied back). The
interpreter's bf16 arithmetic is not faithful, so there bf16 is computed in fp32 and rounded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..device import (
    TRITON_MIN_CAPABILITY,
    bf16_computed_in_fp32,
    ensure_triton_backend,
    launch_options,
    on_device,
    to_kernel_device,
    triton_interprets,
)
from ..reference.rope import rope_cache

# The input checks and the update's plan (their own module); _Plan and _plan are their names here, where
# bench.cache_append reaches the steps of an update (_plan, _tables, _present, _launch, _torch_update).
from .rope_append_checks import FALLBACK_DTYPES, FP8, SUPPORTED_DTYPES, check_scales  # noqa: F401
from .rope_append_checks import UpdatePlan as _Plan
from .rope_append_checks import plan_update as _plan

FP8_MAX = 448.0                                  # the largest finite e4m3 value
FP8_MIN_CAPABILITY = (8, 9)                      # Triton writes e4m3 on sm_89 and newer
DISABLE_ENV = "ATTNKIT_DISABLE_TRITON_KVCACHE"
MAX_HEAD_DIM = 256


# --------------------------------------------------------------------------- the update's tables, buffers
def quantize_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [..., Hkv, D] / scale [Hkv] in fp32, clamped to ±448, rounded to float8_e4m3fn (ties to even):
    the same bytes as ``fp8_cache.quantize_fp8``."""
    return (x.float() / scale[:, None].to(x.device)).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _tables(plan: _Plan, base, cos_cache, sin_cache, device):
    """The (cos, sin) tables the update reads: fp32 (float64 for float64 inputs)."""
    dtype = torch.float64 if plan.dtype == torch.float64 else torch.float32
    if cos_cache is not None:
        return cos_cache.to(dtype).contiguous(), sin_cache.to(dtype).contiguous()
    rows = max(int(plan.positions.max()) + 1, plan.present_len)
    rows = 1 << (rows - 1).bit_length()                         # round up: reuse tables as the cache grows
    return rope_cache(rows, plan.head_dim, base=float(base), dtype=dtype, device=device)


def _present(k_cache, v_cache, plan: _Plan, share_buffer: bool):
    if share_buffer:
        return k_cache, v_cache
    shape = (plan.batch, plan.kv_heads, plan.present_len, plan.head_dim)
    return (torch.zeros(shape, dtype=k_cache.dtype, device=k_cache.device),
            torch.zeros(shape, dtype=v_cache.dtype, device=v_cache.device))


# ------------------------------------------------------------------------------------- reference
def rope_append_reference(q, k, v, k_cache, v_cache, *, seqlens_k=None, position_ids=None,
                          share_buffer=True, total_sequence_length=None, mode="half", base=10000.0,
                          k_scale=None, v_scale=None):
    """The update from its definition, in float64 on the CPU: (q_rot, present_k, present_v).

    Nothing passed in is modified. present_* are [B, Hkv, S_present, D]; for ``share_buffer`` they are
    copies of the caches with the new rows written. For a float8_e4m3fn cache they are float8_e4m3fn:
    the past rows' bytes as they were, the new rows rotated in float64 and quantised by
    ``quantize_e4m3`` (the bytes of ``fp8_cache.quantize_fp8``).
    """
    from ..reference.rope import apply_rope

    plan = _plan(q, k, v, k_cache, v_cache, seqlens_k, position_ids, share_buffer, total_sequence_length,
                 mode, base, None, None, k_scale, v_scale)
    if plan.quantized:
        return _quantized_reference(q, k, v, k_cache, v_cache, plan, share_buffer, mode, base, k_scale, v_scale)
    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    pos = plan.positions[:, :, None]                                  # [B, S, 1]: broadcast over heads
    q_rot = apply_rope(q64, pos, mode=mode, base=base)
    k_rot = apply_rope(k64, pos, mode=mode, base=base)
    past_k, past_v = (t.detach().to("cpu", torch.float64) for t in (k_cache, v_cache))
    if share_buffer:
        present_k, present_v = past_k.clone(), past_v.clone()
    else:
        shape = (plan.batch, plan.kv_heads, plan.present_len, plan.head_dim)
        present_k, present_v = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.float64)
    for b in range(plan.batch):
        p = int(plan.past_len[b])
        if not share_buffer:
            present_k[b, :, :p] = past_k[b, :, :p]
            present_v[b, :, :p] = past_v[b, :, :p]
        for s in range(plan.new_len):
            present_k[b, :, p + s] = k_rot[b, s]
            present_v[b, :, p + s] = v64[b, s]
    return q_rot, present_k, present_v


def _quantized_reference(q, k, v, k_cache, v_cache, plan, share_buffer, mode, base, k_scale, v_scale):
    from ..reference.rope import apply_rope

    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    pos = plan.positions[:, :, None]                                  # [B, S, 1]: broadcast over heads
    q_rot = apply_rope(q64, pos, mode=mode, base=base)
    k_new = quantize_e4m3(apply_rope(k64, pos, mode=mode, base=base), k_scale.cpu())   # [B, S, Hkv, D] fp8
    v_new = quantize_e4m3(v64, v_scale.cpu())
    past_k, past_v = (t.detach().to("cpu").view(torch.uint8) for t in (k_cache, v_cache))
    shape = (plan.batch, plan.kv_heads, plan.present_len, plan.head_dim)
    present_k = past_k.clone() if share_buffer else torch.zeros(shape, dtype=torch.uint8)
    present_v = past_v.clone() if share_buffer else torch.zeros(shape, dtype=torch.uint8)
    for b in range(plan.batch):
        p = int(plan.past_len[b])
        if not share_buffer:
            present_k[b, :, :p] = past_k[b, :, :p]
            present_v[b, :, :p] = past_v[b, :, :p]
        present_k[b, :, p:p + plan.new_len] = k_new[b].view(torch.uint8).transpose(0, 1)   # [Hkv, S, D]
        present_v[b, :, p:p + plan.new_len] = v_new[b].view(torch.uint8).transpose(0, 1)
    return q_rot, present_k.view(FP8), present_v.view(FP8)


# ---------------------------------------------------------------------------------- PyTorch path
def _rotate_torch(x, cos, sin, mode, out_dtype=None):
    """x [B, S, H, D]; cos, sin [B, S, 1, D/2]. Computes in fp32 (float64 for float64), returns
    ``out_dtype`` (default x's dtype)."""
    x32 = x.to(cos.dtype)
    half = x.shape[-1] // 2
    if mode == "half":
        a, b = x32[..., :half], x32[..., half:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = x32[..., 0::2], x32[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return out.to(x.dtype if out_dtype is None else out_dtype)


def _torch_update(q, k, v, k_cache, v_cache, present_k, present_v, past_len, positions, cos, sin,
                  mode, share_buffer, full_past=False, k_scale=None, v_scale=None):
    """Separate PyTorch operations: gather cos/sin, rotate q, rotate k, (copy past), scatter k and v.

    past_len [B] and positions [B, S] are int64 tensors on the device of q. ``full_past``: every
    sequence's past fills the whole past buffer, so the past is copied with one plain copy. With
    ``k_scale``, ``v_scale`` (an fp8 cache) k is rotated in fp32 and k, v quantised by ``quantize_e4m3``;
    the fp8 caches are then moved as bytes (uint8 views).
    """
    batch, new_len = q.shape[:2]
    c = cos[positions][:, :, None, :]                                  # [B, S, 1, D/2]
    s = sin[positions][:, :, None, :]
    q_rot = _rotate_torch(q, c, s, mode)
    if k_scale is not None:
        k_rot = quantize_e4m3(_rotate_torch(k, c, s, mode, out_dtype=c.dtype), k_scale).view(torch.uint8)
        v = quantize_e4m3(v, v_scale).view(torch.uint8)
        k_cache, v_cache, present_k, present_v = (t.view(torch.uint8) for t in (k_cache, v_cache, present_k, present_v))
    else:
        k_rot = _rotate_torch(k, c, s, mode)
    if not share_buffer and full_past:                                 # copy the past rows
        present_k[:, :, :k_cache.shape[2]].copy_(k_cache)
        present_v[:, :, :v_cache.shape[2]].copy_(v_cache)
    elif not share_buffer:
        rows = torch.arange(k_cache.shape[2], device=q.device)
        keep = (rows[None, :] < past_len[:, None])[:, None, :, None]   # [B, 1, S_past, 1]
        width = k_cache.shape[2]
        present_k[:, :, :width] = torch.where(keep, k_cache, present_k[:, :, :width])
        present_v[:, :, :width] = torch.where(keep, v_cache, present_v[:, :, :width])
    b_idx = torch.arange(batch, device=q.device)[:, None].expand(batch, new_len)   # [B, S]
    t_idx = past_len[:, None] + torch.arange(new_len, device=q.device)[None, :]    # [B, S]
    present_k[b_idx, :, t_idx] = k_rot                                 # [B, S, Hkv, D] rows
    present_v[b_idx, :, t_idx] = v
    return q_rot


def rope_append_torch(q, k, v, k_cache, v_cache, *, seqlens_k=None, position_ids=None, share_buffer=True,
                      total_sequence_length=None, mode="half", base=10000.0, cos_cache=None, sin_cache=None,
                      k_scale=None, v_scale=None):
    """The update as separate PyTorch operations (the fallback path): (q_rot, present_k, present_v)."""
    plan = _plan(q, k, v, k_cache, v_cache, seqlens_k, position_ids, share_buffer, total_sequence_length,
                 mode, base, cos_cache, sin_cache, k_scale, v_scale)
    cos, sin = _tables(plan, base, cos_cache, sin_cache, q.device)
    present_k, present_v = _present(k_cache, v_cache, plan, share_buffer)
    q_rot = _torch_update(q, k, v, k_cache, v_cache, present_k, present_v, plan.past_len.to(q.device),
                          plan.positions.to(q.device), cos, sin, mode, share_buffer,
                          full_past=bool((plan.past_len == k_cache.shape[2]).all()),
                          k_scale=k_scale if plan.quantized else None, v_scale=v_scale)
    return q_rot, present_k, present_v


# ---------------------------------------------------------------------------------- Triton kernel
ensure_triton_backend()
try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch path still works
    triton = tl = None


def _round_to_e4m3(x):
    """fp32 x, |x| <= 448, rounded to the nearest e4m3 value (ties to even), still in fp32: three
    mantissa bits kept by integer rounding of the fp32 bits (the carry moves into the exponent), and a
    fixed step of 2^-9 below 2^-6, where e4m3 is subnormal. Converting the result to float8e4nv is then
    exact on every backend."""
    bits = x.to(tl.int32, bitcast=True)
    kept = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576         # clear the 20 low mantissa bits (RNE)
    normal = kept.to(tl.float32, bitcast=True)
    step = (tl.abs(x) + 24576.0) - 24576.0                           # 1.5 · 2^14: its fp32 step is 2^-9
    subnormal = step * tl.where(bits < 0, -1.0, 1.0)                 # the sign kept, −0 included (a product:
                                                                     # a compiler may write −step as 0 − step)
    return tl.where(tl.abs(x) < 0.015625, subnormal, normal)


def _quantize_e4m3(x, scale):
    """fp32 x / scale (correctly rounded) clamped to ±448 and rounded to e4m3: quantize_e4m3's bytes."""
    return _round_to_e4m3(tl.clamp(tl.math.div_rn(x, scale), -448.0, 448.0))


def _rope_append_kernel(
    q_ptr, k_ptr, v_ptr, qo_ptr,                 # new tokens, BSNH; rotated queries out
    kc_ptr, vc_ptr,                              # cache written: shared buffer or present, BNSH
    kp_ptr, vp_ptr,                              # past (read when COPY_PAST)
    cos_ptr, sin_ptr,                            # [P, D/2] fp32
    seqlens_ptr, pos_ptr,                        # int [B]; int [B, S]
    ks_ptr, vs_ptr, s_ks, s_vs,                  # fp32 [Hkv] scales of an fp8 cache (read when QUANT)
    S_new, HQ, HKV, D, n_new_blocks, s_seq,
    sqb, sqs, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd, sob, sos, soh, sod,
    scb, sch, scs, scd, sxb, sxh, sxs, sxd,      # k cache strides; v cache strides
    spb, sph, sps, spd, swb, swh, sws, swd,      # k past strides; v past strides
    s_cos, s_posb, s_poss,
    HAS_SEQLENS: tl.constexpr, HAS_POS: tl.constexpr, INTERLEAVED: tl.constexpr,
    COPY_PAST: tl.constexpr, BLOCK_NEW: tl.constexpr, BLOCK_PAST: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,
):
    """One program: one block of new tokens (or of past rows) of one head of one sequence.

    Grid: (n_new_blocks + n_past_blocks, Hq + Hkv, B). Heads hh < Hq are query heads (rotate);
    the others are KV heads (rotate K, copy V, both into the cache).
    """
    pid_s = tl.program_id(0)
    hh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if HAS_SEQLENS:
        past = tl.load(seqlens_ptr + b * s_seq).to(tl.int64) + 1 - S_new   # seqlens_k = index of last token
    else:
        past = 0                                                      # first prompt

    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    half = D // 2
    if INTERLEAVED:                                                   # pairs (2j, 2j+1)
        partner = offs_d ^ 1
        freq = offs_d // 2
        sign = tl.where(offs_d % 2 == 0, -1.0, 1.0)
    else:                                                             # pairs (j, j + D/2)
        partner = tl.where(offs_d < half, offs_d + half, offs_d - half)
        freq = tl.where(offs_d < half, offs_d, offs_d - half)
        sign = tl.where(offs_d < half, -1.0, 1.0)

    if pid_s < n_new_blocks:
        offs_s = pid_s * BLOCK_NEW + tl.arange(0, BLOCK_NEW)          # [BLOCK_NEW] new-token index s
        s_ok = offs_s < S_new
        mask = s_ok[:, None] & d_ok[None, :]
        if HAS_POS:
            pos = tl.load(pos_ptr + b * s_posb + offs_s * s_poss, mask=s_ok, other=0).to(tl.int64)
        else:
            pos = past + offs_s
        table = pos[:, None] * s_cos + freq[None, :]
        cos = tl.load(cos_ptr + table, mask=mask, other=0.0)          # [BLOCK_NEW, BLOCK_D]
        sin = tl.load(sin_ptr + table, mask=mask, other=0.0)
        if hh < HQ:
            base = q_ptr + b * sqb + offs_s[:, None] * sqs + hh * sqh
            x = tl.load(base + offs_d[None, :] * sqd, mask=mask, other=0.0).to(tl.float32)
            xp = tl.load(base + partner[None, :] * sqd, mask=mask, other=0.0).to(tl.float32)
            y = x * cos + sign[None, :] * xp * sin
            out = qo_ptr + b * sob + offs_s[:, None] * sos + hh * soh + offs_d[None, :] * sod
            tl.store(out, y.to(qo_ptr.dtype.element_ty), mask=mask)
        else:
            h = hh - HQ
            row = past + offs_s                                       # cache row of each new token
            base = k_ptr + b * skb + offs_s[:, None] * sks + h * skh
            x = tl.load(base + offs_d[None, :] * skd, mask=mask, other=0.0).to(tl.float32)
            xp = tl.load(base + partner[None, :] * skd, mask=mask, other=0.0).to(tl.float32)
            y = x * cos + sign[None, :] * xp * sin
            vals = tl.load(v_ptr + b * svb + offs_s[:, None] * svs + h * svh + offs_d[None, :] * svd,
                           mask=mask, other=0.0)
            if QUANT:                                                 # an fp8 cache holds K / k_scale
                y = _quantize_e4m3(y, tl.load(ks_ptr + h * s_ks))
                vals = _quantize_e4m3(vals.to(tl.float32), tl.load(vs_ptr + h * s_vs))
            kc = kc_ptr + b * scb + h * sch + row[:, None] * scs + offs_d[None, :] * scd
            tl.store(kc, y.to(kc_ptr.dtype.element_ty), mask=mask)
            vc = vc_ptr + b * sxb + h * sxh + row[:, None] * sxs + offs_d[None, :] * sxd
            tl.store(vc, vals.to(vc_ptr.dtype.element_ty), mask=mask)
    else:
        if COPY_PAST:                                                 # separate buffer: past -> present
            if hh >= HQ:
                h = hh - HQ
                rows = (pid_s - n_new_blocks) * BLOCK_PAST + tl.arange(0, BLOCK_PAST)
                mask = (rows < past)[:, None] & d_ok[None, :]
                kp = tl.load(kp_ptr + b * spb + h * sph + rows[:, None] * sps + offs_d[None, :] * spd,
                             mask=mask, other=0.0)
                tl.store(kc_ptr + b * scb + h * sch + rows[:, None] * scs + offs_d[None, :] * scd, kp, mask=mask)
                vp = tl.load(vp_ptr + b * swb + h * swh + rows[:, None] * sws + offs_d[None, :] * swd,
                             mask=mask, other=0.0)
                tl.store(vc_ptr + b * sxb + h * sxh + rows[:, None] * sxs + offs_d[None, :] * sxd, vp, mask=mask)


if triton is not None:
    _round_to_e4m3 = triton.jit(_round_to_e4m3)
    _quantize_e4m3 = triton.jit(_quantize_e4m3)
    _rope_append_kernel = triton.jit(_rope_append_kernel)


def _launch(q, k, v, q_out, present_k, present_v, past_k, past_v, cos, sin, seqlens_k, position_ids, *,
            mode, share_buffer, past_rows, num_warps=4, k_scale=None, v_scale=None):
    """Launch the kernel. ``past_rows`` bounds the past rows to copy (separate buffer only);
    ``k_scale``, ``v_scale``: the scales of an fp8 cache."""
    batch, new_len, q_heads, head_dim = q.shape
    kv_heads = k.shape[2]
    block_new = min(triton.next_power_of_2(new_len), 16)
    block_past = 16 if triton_interprets() else 64
    n_new = triton.cdiv(new_len, block_new)
    n_past = 0 if share_buffer else triton.cdiv(max(past_rows, 1), block_past)
    dummy = seqlens_k if seqlens_k is not None else q
    grid = (n_new + n_past, q_heads + kv_heads, batch)
    pos = position_ids if position_ids is not None else q
    pos_strides = (position_ids.stride(0), position_ids.stride(1)) if position_ids is not None else (0, 0)
    quant = k_scale is not None
    scales = (k_scale, v_scale, k_scale.stride(0), v_scale.stride(0)) if quant else (cos, cos, 0, 0)
    with on_device(q.device):
        _rope_append_kernel[grid](
            q, k, v, q_out, present_k, present_v, past_k, past_v, cos, sin,
            dummy, pos, *scales,
            new_len, q_heads, kv_heads, head_dim, n_new, seqlens_k.stride(0) if seqlens_k is not None else 0,
            *q.stride(), *k.stride(), *v.stride(), *q_out.stride(),
            *present_k.stride(), *present_v.stride(), *past_k.stride(), *past_v.stride(),
            cos.stride(0), *pos_strides,
            HAS_SEQLENS=seqlens_k is not None, HAS_POS=position_ids is not None,
            INTERLEAVED=mode == "interleaved", COPY_PAST=not share_buffer,
            BLOCK_NEW=block_new, BLOCK_PAST=block_past, BLOCK_D=triton.next_power_of_2(head_dim),
            QUANT=quant, **launch_options(num_warps=num_warps))


def rope_append_triton(q, k, v, k_cache, v_cache, *, seqlens_k=None, position_ids=None, share_buffer=True,
                       total_sequence_length=None, mode="half", base=10000.0, cos_cache=None, sin_cache=None,
                       k_scale=None, v_scale=None):
    """The update in one Triton kernel launch: (q_rot, present_k, present_v)."""
    if triton is None:
        raise ValueError("backend: Triton is not installed; use backend='torch'")
    if getattr(q, "dtype", None) not in SUPPORTED_DTYPES:
        raise ValueError(f"q: the Triton kernel takes float16, bfloat16 or float32, got {getattr(q, 'dtype', q)}")
    plan = _plan(q, k, v, k_cache, v_cache, seqlens_k, position_ids, share_buffer, total_sequence_length,
                 mode, base, cos_cache, sin_cache, k_scale, v_scale)
    if not plan.quantized:
        k_scale = v_scale = None
    cos, sin = _tables(plan, base, cos_cache, sin_cache, q.device)
    present_k, present_v = _present(k_cache, v_cache, plan, share_buffer)
    # where the kernel runs (CPU tensors on a GPU machine: copies on the GPU, results copied back)
    q_, k_, v_, pk, pv, kp, vp, cos, sin, seqlens_k, position_ids, k_scale, v_scale = to_kernel_device(
        q, k, v, present_k, present_v, k_cache, v_cache, cos, sin, seqlens_k, position_ids, k_scale, v_scale)
    if q.dtype == torch.bfloat16 and bf16_computed_in_fp32(q_.device):
        # the interpreter's bf16 is not faithful, sm < 80 has none: fp32, rounded at the end
        q_, k_, v_ = (t.float() for t in (q_, k_, v_))
        if not plan.quantized:                                        # an fp8 cache stays fp8
            pk, pv, kp, vp = (t.float() for t in (pk, pv, kp, vp))
    q_out = torch.empty(q_.shape, dtype=q_.dtype, device=q_.device)
    _launch(q_, k_, v_, q_out, pk, pv, kp, vp, cos, sin, seqlens_k, position_ids, mode=mode,
            share_buffer=share_buffer, past_rows=int(plan.past_len.max()), k_scale=k_scale, v_scale=v_scale)
    for written, result in ((present_k, pk), (present_v, pv)):
        if result is not written:
            written.copy_(result)
    return q_out.to(q.device, q.dtype), present_k, present_v


# ------------------------------------------------------------------------------- backend choice
@dataclass(frozen=True)
class BackendChoice:
    """Which implementation runs the update, and the checks that decided it."""

    name: str                                   # "triton" or "torch"
    reasons: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        what = "Triton kernel" if self.name == "triton" else "PyTorch fallback"
        return f"{what}: " + "; ".join(self.reasons)


def choose_backend(q, *, capability=None, cache_dtype=None) -> BackendChoice:
    """Pick the Triton kernel when all its conditions hold, else the PyTorch fallback, saying why.

    Conditions (as in ONNX Runtime's GroupQueryAttention): dtype float16, bfloat16 or float32; on a GPU
    compute capability >= 8.0 (``capability`` overrides the device's, to ask "what if"), and >= 8.9
    for a float8_e4m3fn cache (``cache_dtype``); head size a multiple of 8 and at most 256; Triton
    installed; the environment variable ATTNKIT_DISABLE_TRITON_KVCACHE not set to "1".
    """
    problems, passed = [], []
    if os.environ.get(DISABLE_ENV) == "1":
        problems.append(f"{DISABLE_ENV}=1 forces the fallback")
    dtype = str(q.dtype).replace("torch.", "")
    (passed if q.dtype in SUPPORTED_DTYPES else problems).append(
        f"dtype {dtype} {'is' if q.dtype in SUPPORTED_DTYPES else 'is not'} supported")
    head_dim = q.shape[-1]
    ok_head = head_dim % 8 == 0 and 8 <= head_dim <= MAX_HEAD_DIM
    (passed if ok_head else problems).append(
        f"head size {head_dim} " + ("is supported" if ok_head else f"is not a multiple of 8 in 8..{MAX_HEAD_DIM}"))
    if capability is None and q.device.type == "cuda":
        capability = torch.cuda.get_device_capability(q.device)
    if capability is not None and tuple(capability) < TRITON_MIN_CAPABILITY:
        problems.append(f"compute capability sm_{capability[0]}{capability[1]} is below sm_80")
    elif capability is not None and cache_dtype == FP8 and tuple(capability) < FP8_MIN_CAPABILITY:
        problems.append(f"compute capability sm_{capability[0]}{capability[1]} is below sm_89, "
                        f"where Triton writes float8_e4m3fn")
    else:  # a GPU of sm_80 or newer, or the CPU, where the kernel runs in Triton's interpreter
        passed.append("the device runs Triton")
    if triton is None:
        problems.append("Triton is not installed")
    if problems:
        return BackendChoice("torch", tuple(problems))
    return BackendChoice("triton", tuple(passed))


@dataclass(frozen=True)
class KVUpdate:
    """What ``rope_append`` returns: rotated queries, the present caches and the path that ran."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    backend: BackendChoice


def rope_append(q, k, v, k_cache, v_cache, *, seqlens_k=None, position_ids=None, share_buffer=True,
                total_sequence_length=None, mode="half", base=10000.0, cos_cache=None, sin_cache=None,
                k_scale=None, v_scale=None, backend="auto") -> KVUpdate:
    """Rotate q and k by RoPE and append k, v to the cache (see the module's docstring).

    ``k_scale``, ``v_scale``: fp32 [Hkv], exactly when the caches are float8_e4m3fn (an FP8 cache).
    ``backend``: "auto" (``choose_backend`` decides), "triton" or "torch".
    """
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend: expected 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "auto":
        choice = (choose_backend(q, cache_dtype=getattr(k_cache, "dtype", None)) if isinstance(q, torch.Tensor)
                  else BackendChoice("torch", ("q is not a tensor",)))
    else:
        choice = BackendChoice(backend, (f"backend={backend!r} was asked for",))
    run = rope_append_triton if choice.name == "triton" else rope_append_torch
    q_rot, present_k, present_v = run(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k, position_ids=position_ids,
                                      share_buffer=share_buffer, total_sequence_length=total_sequence_length,
                                      mode=mode, base=base, cos_cache=cos_cache, sin_cache=sin_cache,
                                      k_scale=k_scale, v_scale=v_scale)
    return KVUpdate(q_rot, present_k, present_v, choice)
