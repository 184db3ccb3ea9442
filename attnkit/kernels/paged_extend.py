"""Attention of several new tokens per sequence over a paged KV cache: chunked prefill, prefix-cache
hits and speculative verification, with decode as its one-token case.

- ``paged_extend(q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q, *, sm_scale=None,
  k_scale=None, v_scale=None) -> o``
  q [total_q, Hq, D]: the new tokens of B sequences packed one after another, sequence b's rows
  cu_seqlens_q[b] … cu_seqlens_q[b + 1] − 1 (int32 [B + 1], from 0 to total_q). k_pages [num_pages,
  page_size, Hkv, D], v_pages [num_pages, page_size, Hkv, Dv]: the cache, the new tokens' K and V already
  written in it (any D and Dv from 8 to 256, as ``paged_decode``; padded to powers of two in registers);
  block_table int32 [B, max_pages]; seq_lens int32 [B]: each sequence's cached tokens, new ones
  included. New token i of sequence b sits at position seq_lens[b] − q_len[b] + i and attends to keys
  0 … that position (causal, aligned to the end). Returns o [total_q, Hq, Dv] in q's dtype.
- An FP8 cache: k_pages, v_pages of dtype float8_e4m3fn with ``k_scale``, ``v_scale`` fp32 [Hkv]: the
  cache holds K / k_scale, and the kernel multiplies the scores by k_scale and the output by v_scale (once
  per score and per output row, not per element of K and V). ``quantize_fp8(x, scale)`` and
  ``fp8_scales(x)`` (one scale per KV head: amax / 448) of ``attnkit.kernels.fp8_cache`` make such a
  cache (also importable from here).
- ``paged_extend_ref(...)``: the same from the definitions, in float64.

One program computes BLOCK_M new tokens of one query head of one sequence: it walks the sequence's
pages BLOCK_N keys at a time through the page table, stopping at its last row's last visible key, with
the online softmax of lesson 5 (exp2, scores pre-scaled by log2 e).
"""
from __future__ import annotations

import math
import numbers

import torch

from .. import validation
from ..device import (
    bf16_computed_in_fp32,
    ensure_triton_backend,
    launch_options,
    on_device,
    to_kernel_device,
)
from . import value_checks
from .fp8_cache import FP8, FP8_MAX, fp8_read, fp8_scales, quantize_fp8  # noqa: F401  (re-exported here too)
from .paged_dispatch import row_alignment

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

CACHE_DTYPES = validation.FLOAT_DTYPES + (FP8,)
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256                  # D and Dv, as paged_decode and the dense kernel
LOG2E = 1.4426950408889634


@triton.jit
def _aligned(rows, ALIGN: tl.constexpr):
    """``rows`` (each a multiple of ALIGN, ``paged.row_alignment``) in a form that tells Triton so, for loads
    of up to 16 bytes; at 16 Triton knows it already from the strides (as ``paged._load_rows``)."""
    if ALIGN < 16:
        if ALIGN > 1:
            rows = (rows // ALIGN) * ALIGN
    return rows


@triton.jit
def _extend_rows(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, q_start, q_len, ctx, row0, kv_head, head, seq, num_pages,
                 k_scale, v_scale, sm_scale_log2,
                 s_qt, s_qh, s_qd, s_kp, s_ko, s_kh, s_kd, s_vp, s_vo, s_vh, s_vd, s_ot, s_oh, s_od, s_tb, s_tp,
                 PAGE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, DV: tl.constexpr,
                 BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K_ALIGN: tl.constexpr,
                 V_ALIGN: tl.constexpr, SCALED: tl.constexpr):
    """New tokens row0 .. row0 + BLOCK_M - 1 of one sequence's chunk, one query head."""
    rows = row0 + tl.arange(0, BLOCK_M)                       # new-token index within the chunk
    row_ok = rows < q_len
    pos = ctx - q_len + rows                                  # each row's position: it sees keys <= pos
    d = tl.arange(0, BLOCK_D)                                 # q and K columns, padded to a power of two
    d_ok = d < D
    dv = tl.arange(0, BLOCK_DV)                               # V and o columns
    dv_ok = dv < DV
    q = tl.load(q_ptr + (q_start + rows)[:, None] * s_qt + head * s_qh + d[None, :] * s_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    last = tl.maximum(tl.minimum(ctx - q_len + row0 + BLOCK_M, ctx), 0)   # keys this block of rows may see
    qk_scale = sm_scale_log2 * k_scale                        # K = stored K · k_scale: scaled once per score
    for start in range(0, last, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < last
        page = tl.load(table_ptr + seq * s_tb + (keys // PAGE) * s_tp, mask=key_ok, other=0)
        page = tl.where((page >= 0) & (page < num_pages), page, 0).to(tl.int64)   # a bad id reads page 0
        slot = keys % PAGE
        k_rows = _aligned(page * s_kp + slot * s_ko + kv_head * s_kh, K_ALIGN)
        v_rows = _aligned(page * s_vp + slot * s_vo + kv_head * s_vh, V_ALIGN)
        k = tl.load(k_ptr + k_rows[:, None] + d[None, :] * s_kd,
                    mask=key_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        v = tl.load(v_ptr + v_rows[:, None] + dv[None, :] * s_vd,
                    mask=key_ok[:, None] & dv_ok[None, :], other=0.0)
        if SCALED:   # the select (a no-op) keeps V's conversion in the loaded layout: an fp8 V is then not
            # read from shared memory byte by byte in p·v's operand layout (as in paged._paged_kernel)
            v = tl.where(key_ok[:, None], v.to(tl.float32), 0.0)
        else:
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * qk_scale                 # [BLOCK_M, BLOCK_N], log2 units
        visible = (keys[None, :] <= pos[:, None]) & key_ok[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no visible key yet
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m - m_safe)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    out = acc * (v_scale / tl.where(l == 0.0, 1.0, l))[:, None]     # V = stored V · v_scale, once per row
    tl.store(o_ptr + (q_start + rows)[:, None] * s_ot + head * s_oh + dv[None, :] * s_od,
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])


@triton.jit
def _extend_kernel(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, lens_ptr, cu_ptr, k_scale_ptr, v_scale_ptr,
                   sm_scale_log2, total_q, num_pages, capacity,
                   s_qt, s_qh, s_qd, s_kp, s_ko, s_kh, s_kd, s_vp, s_vo, s_vh, s_vd, s_ot, s_oh, s_od,
                   s_tb, s_tp, s_len, s_cu,
                   GROUP: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SCALED: tl.constexpr, K_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr):
    """Program (pid_m, seq, head) computes row blocks pid_m, pid_m + grid_m, ... of sequence seq's chunk, so
    every row is computed whatever the grid (max_q_len sizes the grid, not the result). What it reads is
    clamped: offsets to [0, total_q], the context to [0, capacity], page ids to [0, num_pages) -- bad
    values give a wrong answer (reported by the checks), never an access out of bounds."""
    pid_m, seq, head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kv_head = head // GROUP
    q_start = tl.minimum(tl.maximum(tl.load(cu_ptr + seq * s_cu), 0), total_q)
    q_end = tl.minimum(tl.maximum(tl.load(cu_ptr + (seq + 1) * s_cu), q_start), total_q)
    q_len = q_end - q_start
    ctx = tl.minimum(tl.maximum(tl.load(lens_ptr + seq * s_len), 0), capacity)   # cached tokens, new ones too
    k_scale = 1.0
    v_scale = 1.0
    if SCALED:
        k_scale = tl.load(k_scale_ptr + kv_head)
        v_scale = tl.load(v_scale_ptr + kv_head)
    for block in range(pid_m, tl.cdiv(q_len, BLOCK_M), tl.num_programs(0)):
        _extend_rows(q_ptr, k_ptr, v_ptr, o_ptr, table_ptr, q_start, q_len, ctx, block * BLOCK_M, kv_head, head, seq,
                     num_pages, k_scale, v_scale, sm_scale_log2,
                     s_qt, s_qh, s_qd, s_kp, s_ko, s_kh, s_kd, s_vp, s_vo, s_vh, s_vd, s_ot, s_oh, s_od, s_tb, s_tp,
                     PAGE, D, BLOCK_D, DV, BLOCK_DV, BLOCK_M, BLOCK_N, K_ALIGN, V_ALIGN, SCALED)


# ------------------------------------------------------------------------------------ input checks
def check_extend_inputs(q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q, k_scale, v_scale,
                        check_values="strict", max_q_len=None) -> None:
    """ValueError naming the argument and the rule. Shapes, dtypes and devices always; the contents of
    cu_seqlens_q, seq_lens, block_table, the scales and ``max_q_len`` (at least the longest chunk) by
    ``check_values``, as ``paged.check_paged_inputs`` takes it: "strict" (True) copies them to the host
    (a synchronisation on a GPU); "device" checks them on the device under the contract of
    ``attnkit.kernels.value_checks`` (``raise_pending_errors()`` reports a bad call); False: not checked."""
    validation.tensor("q", q, 3, "[total_q, Hq, D]", validation.FLOAT_DTYPES)
    validation.tensor("k_pages", k_pages, 4, "[num_pages, page_size, Hkv, D]", CACHE_DTYPES)
    validation.tensor("v_pages", v_pages, 4, "[num_pages, page_size, Hkv, Dv]", CACHE_DTYPES)
    validation.tensor("block_table", block_table, 2, "[B, max_pages]", (torch.int32,))
    validation.tensor("seq_lens", seq_lens, 1, "[B]", (torch.int32,))
    validation.tensor("cu_seqlens_q", cu_seqlens_q, 1, "[B + 1]", (torch.int32,))
    if k_pages.shape[:3] != v_pages.shape[:3] or k_pages.dtype != v_pages.dtype:
        raise ValueError(f"k_pages, v_pages: must share dtype and shape but for the head dim (Dv may differ from "
                         f"D), got {tuple(k_pages.shape)} {k_pages.dtype} and {tuple(v_pages.shape)} {v_pages.dtype}")
    hq, d, hkv = q.shape[1], q.shape[2], k_pages.shape[2]
    if k_pages.shape[3] != d:
        raise ValueError(f"q, k_pages: head dims differ ({d} vs {k_pages.shape[3]})")
    for name, letter, dim in (("q", "D", d), ("v_pages", "Dv", v_pages.shape[3])):
        if not MIN_HEAD_DIM <= dim <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: head dim {letter}={dim} is not supported; {letter} must be between "
                             f"{MIN_HEAD_DIM} and {MAX_HEAD_DIM}")
    if hq % hkv:
        raise ValueError(f"q, k_pages: Hq={hq} must be a multiple of Hkv={hkv} (Hq % Hkv == 0)")
    batch = block_table.shape[0]
    if seq_lens.shape[0] != batch or cu_seqlens_q.shape[0] != batch + 1:
        raise ValueError(f"seq_lens, cu_seqlens_q: expected [B] and [B + 1] with B = {batch} (block_table's rows), "
                         f"got {tuple(seq_lens.shape)} and {tuple(cu_seqlens_q.shape)}")
    devices = {t.device for t in (q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q)}
    if len(devices) > 1:
        raise ValueError(f"q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q: must be on one device, "
                         f"got {sorted(map(str, devices))}")
    validation.kernel_device("q", q)
    validation.grid_axis("block_table", "sequences B", batch)
    validation.grid_axis("q", "heads Hq", hq)
    if (k_pages.dtype == FP8) != (k_scale is not None) or (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale, v_scale: required (fp32 [Hkv]) exactly when the cache is float8_e4m3fn")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None:
            validation.tensor(name, scale, 1, "[Hkv]", (torch.float32,))
            if scale.shape[0] != hkv:
                raise ValueError(f"{name}: expected {hkv} scales (one per KV head), got {scale.shape[0]}")
            if scale.device != q.device:
                raise ValueError(f"{name}: must be on q's device {q.device}, got {scale.device}")
    max_q_len = check_max_q_len(max_q_len)
    if check_values is True:
        check_values = "strict"
    if check_values not in ("strict", "device", False):
        raise ValueError(f"check_values: expected 'strict', 'device', True or False, got {check_values!r}")
    if check_values == "device":
        if not value_checks.capturing(q):
            value_checks.flag("paged_extend", _bad_values(q.shape[0], k_pages.shape[0], k_pages.shape[1],
                                                          block_table, seq_lens, cu_seqlens_q, k_scale, v_scale,
                                                          max_q_len))
        return
    if not check_values:
        return
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None and not bool(torch.all(torch.isfinite(scale) & (scale > 0))):
            raise ValueError(f"{name}: every scale must be finite and > 0")
    cu = cu_seqlens_q.cpu().long()
    lens = seq_lens.cpu().long()
    q_lens = cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or bool(torch.any(q_lens < 0)) or int(cu[-1]) != q.shape[0]:
        raise ValueError(f"cu_seqlens_q: must start at 0, never decrease and end at total_q={q.shape[0]}, "
                         f"got {cu.tolist()}")
    longest = int(q_lens.max())
    if max_q_len is not None and max_q_len < longest:
        raise ValueError(f"max_q_len: must be at least the longest chunk of cu_seqlens_q ({longest}), got {max_q_len}")
    if bool(torch.any(lens < q_lens)):
        raise ValueError(f"seq_lens: each sequence must hold at least its new tokens (seq_lens >= q lengths), "
                         f"got {lens.tolist()} for {q_lens.tolist()} new tokens")
    capacity = block_table.shape[1] * k_pages.shape[1]
    if bool(torch.any(lens > capacity)):
        raise ValueError(f"seq_lens: at most max_pages · page_size = {capacity} tokens, got {lens.tolist()}")
    table = block_table.cpu()
    used = torch.arange(block_table.shape[1])[None, :] * k_pages.shape[1] < lens[:, None]
    if bool(torch.any(used & ((table < 0) | (table >= k_pages.shape[0])))):
        raise ValueError(f"block_table: the pages a sequence uses must be in [0, {k_pages.shape[0]})")


def check_max_q_len(max_q_len) -> int | None:
    """``max_q_len``: None or a positive integer (NumPy's too); checked against the chunks by the value checks."""
    if max_q_len is None:
        return None
    return validation.positive_int("max_q_len", max_q_len)


def check_blocks(block_m, block_n) -> tuple[int, int]:
    """``block_m``, ``block_n``: powers of two >= 16 (tl.dot's smallest tile), at most 256."""
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 16 <= value <= 256
                or value & (value - 1)):
            raise ValueError(f"{name}: expected a power of two from 16 to 256 (tl.dot's tiles), got {value!r}")
    return int(block_m), int(block_n)


def _bad_values(total_q: int, num_pages: int, page_size: int, block_table, seq_lens, cu_seqlens_q, k_scale, v_scale,
                max_q_len):
    """The ``value_checks.RULES`` bits that the contents break, a 0-d int64 tensor on their device."""
    cu = cu_seqlens_q.to(torch.int64)
    lens = seq_lens.to(torch.int64)
    q_lens = cu[1:] - cu[:-1]
    capacity = block_table.shape[1] * page_size
    rules = 1 * ((lens < q_lens) | (lens > capacity)).any().to(torch.int64)
    used = torch.arange(block_table.shape[1], device=lens.device)[None, :] * page_size < lens[:, None]
    table = block_table.to(torch.int64)
    rules = rules | 2 * (used & ((table < 0) | (table >= num_pages))).any().to(torch.int64)
    for scale in (k_scale, v_scale):
        if scale is not None:
            rules = rules | 4 * (~(torch.isfinite(scale) & (scale > 0)).all()).to(torch.int64)
    rules = rules | 8 * ((cu[0] != 0) | (q_lens < 0).any() | (cu[-1] != total_q)).to(torch.int64)
    if max_q_len is not None:
        rules = rules | 16 * (q_lens > max_q_len).any().to(torch.int64)
    return rules


# ------------------------------------------------------------------------------------ the kernel
def new_buffer(shape, dtype, device) -> torch.Tensor:
    """The output buffer the kernel writes (tests replace this function to hand out guarded or poisoned
    buffers instead)."""
    return torch.empty(shape, dtype=dtype, device=device)


def paged_extend(q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q, *, sm_scale: float | None = None,
                 k_scale=None, v_scale=None, max_q_len: int | None = None, check_values=None,
                 block_m: int = 16, block_n: int = 32):
    """See the module docstring. ``check_values``: how the contents of the index tensors are checked
    (``check_extend_inputs``); None: "strict" for CPU tensors, "device" for CUDA tensors (no host
    synchronisation, so a call can be captured in a CUDA graph). ``max_q_len``: the longest chunk, if
    known (else read from cu_seqlens_q: a synchronisation); it sizes the grid, and every row is computed
    whatever it is, but one smaller than the longest chunk is refused ("strict") or flagged ("device").
    ``block_m``, ``block_n``: the tile (powers of two from 16 to 256). The kernel clamps what it reads, so
    bad index values never read or write out of bounds (``attnkit.kernels.value_checks``)."""
    if check_values is None:
        check_values = "device" if getattr(q, "is_cuda", False) else "strict"
    check_extend_inputs(q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q, k_scale, v_scale, check_values,
                        max_q_len)
    sm_scale = validation.softmax_scale(sm_scale, q.shape[-1])
    block_m, block_n = check_blocks(block_m, block_n)
    dtype, device = q.dtype, q.device
    q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q, k_scale, v_scale = to_kernel_device(
        q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q, k_scale, v_scale)
    if dtype == torch.bfloat16 and bf16_computed_in_fp32(q.device):
        q = q.float()
        k_pages, v_pages = (t if t.dtype == FP8 else t.float() for t in (k_pages, v_pages))
    k_pages, v_pages = (fp8_read(t) for t in (k_pages, v_pages))
    total_q, hq, d = q.shape
    batch, hkv, page = block_table.shape[0], k_pages.shape[2], k_pages.shape[1]
    o = new_buffer((total_q, hq, v_pages.shape[3]), q.dtype, q.device)
    max_q = int(max_q_len) if max_q_len is not None else int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    scaled = k_scale is not None
    if scaled:                                       # [Hkv], read as scale_ptr + kv_head: made contiguous
        k_scale, v_scale = k_scale.contiguous(), v_scale.contiguous()
    dummy = torch.ones(1, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(max(max_q, 1), block_m), batch, hq)
    with on_device(q.device):
        _extend_kernel[grid](q, k_pages, v_pages, o, block_table, seq_lens, cu_seqlens_q,
                             k_scale if scaled else dummy, v_scale if scaled else dummy, sm_scale * LOG2E,
                             total_q, k_pages.shape[0], block_table.shape[1] * page,
                             *q.stride(), *k_pages.stride(), *v_pages.stride(), *o.stride(),
                             *block_table.stride(), seq_lens.stride(0), cu_seqlens_q.stride(0),
                             GROUP=hq // hkv, PAGE=page, D=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
                             DV=v_pages.shape[3], BLOCK_DV=max(16, triton.next_power_of_2(v_pages.shape[3])),
                             BLOCK_M=block_m, BLOCK_N=block_n, SCALED=scaled, K_ALIGN=row_alignment(k_pages),
                             V_ALIGN=row_alignment(v_pages), **launch_options(num_warps=4))
    return o.to(dtype).to(device)


def paged_extend_ref(q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q, *, sm_scale=None,
                     k_scale=None, v_scale=None):
    """paged_extend from the definitions, in float64 on the CPU, one sequence at a time."""
    q64 = q.detach().cpu().double()
    k64, v64 = (t.detach().cpu().double() for t in (k_pages, v_pages))
    if k_scale is not None:
        k64 = k64 * k_scale.cpu().double()[None, None, :, None]
        v64 = v64 * v_scale.cpu().double()[None, None, :, None]
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    page, group = k_pages.shape[1], q.shape[1] // k_pages.shape[2]
    out = torch.zeros((*q64.shape[:2], v_pages.shape[3]), dtype=torch.float64)
    cu, lens, table = cu_seqlens_q.cpu().tolist(), seq_lens.cpu().tolist(), block_table.cpu().long()
    for b in range(len(lens)):
        n_new, ctx = cu[b + 1] - cu[b], lens[b]
        if n_new == 0:
            continue
        positions = torch.arange(ctx)
        pages = table[b, positions // page]
        keys = k64[pages, positions % page].repeat_interleave(group, dim=1)       # [ctx, Hq, D]
        values = v64[pages, positions % page].repeat_interleave(group, dim=1)
        qb = q64[cu[b]:cu[b + 1]]                                                # [n_new, Hq, D]
        scores = torch.einsum("thd,khd->htk", qb, keys) * scale                  # [Hq, n_new, ctx]
        visible = positions[None, :] <= (ctx - n_new + torch.arange(n_new))[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[cu[b]:cu[b + 1]] = torch.einsum("htk,khd->thd", torch.softmax(scores, dim=-1), values)
    return out


__all__ = ["paged_extend", "paged_extend_ref", "check_extend_inputs", "fp8_scales", "quantize_fp8", "FP8", "new_buffer"]
