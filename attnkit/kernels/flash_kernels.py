"""The FlashAttention kernels in Triton: forward, and the three backward kernels.

This module holds only ``@triton.jit`` code; ``attnkit.kernels.flash`` checks inputs, picks block sizes and
launches these. Everything uses pointer arithmetic with explicit strides, so any strided
[B, H, N, D] view works without a copy.

Conventions shared by every kernel:
- one program handles one block of rows (queries, or keys in ``_bwd_dkdv``) of one head;
- query head h reads key/value head h // group (grouped-query attention, no K/V copies);
- causal attention is aligned to the end: query i sees key j when j <= i + SHIFT, SHIFT = Nk - Nq;
- scores are scaled once by ``qk_scale``; with ``USE_EXP2`` that scale includes log2(e), so the
  softmax uses exp2 (one instruction) and the saved log-sum-exp is converted back to natural log;
- ``DOT_PRECISION`` is "ieee" for fp32 inputs (tf32 products would put ~1e-3 of error into the
  exponentials) and "tf32" otherwise (ignored for fp16/bf16 operands);
- loops are split into blocks that need no masks (full blocks, fully visible) and the few that do
  (the diagonal of the causal mask and the ragged last block); ``SPLIT=False`` masks every block.
"""
from __future__ import annotations

from ..device import ensure_triton_backend

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634   # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = 0.6931471805599453     # ln(2): log(x) == log2(x) * LN2


# ------------------------------------------------------------------------------------------ forward
@triton.jit
def _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
               offs_m, lo, hi, n_k, shift, qk_scale,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               USE_EXP2: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key blocks [lo, hi) into the running (acc, l_i, m_i) of one query block.

    acc: [BLOCK_M, D] fp32, unnormalised output; l_i, m_i: [BLOCK_M] running sum and maximum;
    q: [BLOCK_M, D]; k_ptrs, v_ptrs: [BLOCK_N, D] pointers to key/value rows 0..BLOCK_N-1.
    """
    offs_n = tl.arange(0, BLOCK_N)
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n                                        # [BLOCK_N] key indices
        if MASKED:
            k = tl.load(k_ptrs, mask=cols[:, None] < n_k, other=0.0)   # [BLOCK_N, D]
            v = tl.load(v_ptrs, mask=cols[:, None] < n_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)                                    # [BLOCK_M, BLOCK_N]
        if MASKED:
            visible = cols[None, :] < n_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
            s = tl.where(visible, qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))                      # [BLOCK_M]
            # a row that has seen no key yet keeps m = -inf; subtract 0 instead of -inf
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s - m_sub[:, None]
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
            s = qk * qk_scale - m_new[:, None]                         # one fused multiply-add
        if USE_EXP2:
            p = tl.math.exp2(s)
            alpha = tl.math.exp2(m_i - m_sub)
        else:
            p = tl.exp(s)
            alpha = tl.exp(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, qk_scale,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              n_heads, group, n_q, n_k,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, USE_EXP2: tl.constexpr,
              SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr = "tf32"):
    """O = softmax(Q Kᵀ · scale) V for one block of BLOCK_M queries of one (batch, head).

    grid = (cdiv(Nq, BLOCK_M), B * Hq). LSE: contiguous fp32 [B, Hq, Nq], natural log, -inf for a
    row that sees no key (its output row is 0).
    """
    start_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks read the most keys: start them first
        start_m = tl.num_programs(0) - 1 - start_m
    off_bh = tl.program_id(1)
    off_b = (off_bh // n_heads).to(tl.int64)
    off_h = (off_bh % n_heads).to(tl.int64)
    off_hk = off_h // group                                            # the shared K/V head

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)                 # [BLOCK_M] query indices
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    k_ptrs = K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    q = tl.load(q_ptrs, mask=offs_m[:, None] < n_q, other=0.0)         # [BLOCK_M, D]

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Keys this query block reads: [0, hi). Keys [0, full) are visible to every row and in bounds.
    shift = n_k - n_q
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m * BLOCK_M + BLOCK_M + shift, 0), n_k)
        full = tl.minimum(tl.maximum(start_m * BLOCK_M + shift + 1, 0), n_k) // BLOCK_N * BLOCK_N
    else:
        hi = n_k
        full = n_k // BLOCK_N * BLOCK_N
    if SPLIT:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                   offs_m, 0, full, n_k, shift, qk_scale,
                                   BLOCK_N, False, CAUSAL, USE_EXP2, DOT_PRECISION)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                   offs_m, full, hi, n_k, shift, qk_scale,
                                   BLOCK_N, True, CAUSAL, USE_EXP2, DOT_PRECISION)
    else:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                                   offs_m, 0, hi, n_k, shift, qk_scale,
                                   BLOCK_N, True, CAUSAL, USE_EXP2, DOT_PRECISION)

    empty = l_i == 0.0                                                 # rows that saw no key
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    if USE_EXP2:
        lse = (m_i + tl.math.log2(l_safe)) * 0.6931471805599453
    else:
        lse = m_i + tl.log(l_safe)
    lse = tl.where(empty, float("-inf"), lse)

    o_ptrs = O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=offs_m[:, None] < n_q)
    tl.store(LSE + off_bh.to(tl.int64) * n_q + offs_m, lse, mask=offs_m < n_q)


# ----------------------------------------------------------------------------------------- backward
@triton.jit
def _bwd_preprocess(O, DO, DELTA,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    n_heads, n_q,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """DELTA[b, h, i] = Σ_d dO[b, h, i, d] · O[b, h, i, d] (fp32, contiguous [B, Hq, Nq])."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // n_heads).to(tl.int64)
    off_h = (off_bh % n_heads).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < n_q
    o = tl.load(O + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om
                + offs_d[None, :] * stride_od, mask=rows, other=0.0)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=rows, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)      # [BLOCK_M]
    tl.store(DELTA + off_bh.to(tl.int64) * n_q + offs_m, delta, mask=offs_m < n_q)


@triton.jit
def _lse2(lse):
    """The saved natural-log log-sum-exp in base 2, for the exp2 softmax. A row that saw no key
    (lse = -inf) gets +inf, like the padding rows (loaded as +inf), so that exp2(s - lse2) is 0 there."""
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, LSE, DELTA, stride_qm, stride_dom,
                    offs_n, lo, hi, n_q, shift, qk_scale,
                    BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key block over query blocks [lo, hi) of one query head.

    k, v: [BLOCK_N, D]; dk, dv: [BLOCK_N, D] fp32; q_ptrs, do_ptrs: [BLOCK_M, D] pointers to rows
    0..BLOCK_M-1; LSE, DELTA: this head's rows. Works on transposed scores sT = k qᵀ: [BLOCK_N, BLOCK_M].
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    q_ptrs += lo * stride_qm
    do_ptrs += lo * stride_dom
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m0                                       # [BLOCK_M] query indices
        if MASKED:
            q = tl.load(q_ptrs, mask=rows[:, None] < n_q, other=0.0)   # [BLOCK_M, D]
            do = tl.load(do_ptrs, mask=rows[:, None] < n_q, other=0.0)
            lse2 = _lse2(tl.load(LSE + rows, mask=rows < n_q, other=float("inf")))
            delta = tl.load(DELTA + rows, mask=rows < n_q, other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse2 = _lse2(tl.load(LSE + rows))
            delta = tl.load(DELTA + rows)
        s_t = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale                       # [BLOCK_N, BLOCK_M]
        p_t = tl.math.exp2(s_t - lse2[None, :])
        if MASKED:
            visible = rows[None, :] < n_q
            if CAUSAL:
                visible = visible & (offs_n[:, None] <= rows[None, :] + shift)
            p_t = tl.where(visible, p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)                             # [BLOCK_N, D]
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)                                 # [BLOCK_N, BLOCK_M]
        ds_t = p_t * (dp_t - delta[None, :])
        dk += tl.dot(ds_t.to(q.dtype), q, input_precision=DOT_PRECISION)
        q_ptrs += BLOCK_M * stride_qm
        do_ptrs += BLOCK_M * stride_dom
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, qk_scale,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_dob, stride_doh, stride_dom, stride_dod,
              n_heads, n_heads_kv, group, n_q, n_k,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr = "tf32"):
    """dK, dV for one block of BLOCK_N keys of one (batch, KV head), summed over its ``group`` query heads.

    grid = (cdiv(Nk, BLOCK_N), B * Hkv). DK, DV: contiguous [B, Hkv, Nk, D].
    """
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    off_b = (off_bhk // n_heads_kv).to(tl.int64)
    off_hk = (off_bhk % n_heads_kv).to(tl.int64)

    offs_n = start_n + tl.arange(0, BLOCK_N)                           # [BLOCK_N] key indices
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < n_k
    k = tl.load(K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn
                + offs_d[None, :] * stride_kd, mask=keys, other=0.0)   # [BLOCK_N, D]
    v = tl.load(V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn
                + offs_d[None, :] * stride_vd, mask=keys, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    # Query blocks: [lo, mid) masked (causal diagonal), [mid, full) unmasked, [full, Nq) masked (ragged end).
    shift = n_k - n_q
    if CAUSAL:
        lo = tl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M
        first_full = (tl.maximum(start_n + BLOCK_N - 1 - shift, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    else:
        lo = 0
        first_full = 0
    full_end = n_q // BLOCK_M * BLOCK_M
    mid = tl.maximum(lo, tl.minimum(first_full, full_end))
    full = tl.maximum(mid, full_end)

    for g in range(group):
        off_h = off_hk * group + g
        off_bh = off_b * n_heads + off_h
        q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
        do_ptrs = DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod
        lse_h = LSE + off_bh * n_q
        delta_h = DELTA + off_bh * n_q
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_h, delta_h, stride_qm, stride_dom,
                                 offs_n, lo, mid, n_q, shift, qk_scale, BLOCK_M, True, CAUSAL, DOT_PRECISION)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_h, delta_h, stride_qm, stride_dom,
                                 offs_n, mid, full, n_q, shift, qk_scale, BLOCK_M, False, CAUSAL, DOT_PRECISION)
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_ptrs, do_ptrs, lse_h, delta_h, stride_qm, stride_dom,
                                 offs_n, full, n_q, n_q, shift, qk_scale, BLOCK_M, True, CAUSAL, DOT_PRECISION)

    dk *= sm_scale
    out = off_bhk.to(tl.int64) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
                  offs_m, lo, hi, n_k, shift, qk_scale,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [lo, hi). dq, q, do: [BLOCK_M, D]."""
    offs_n = tl.arange(0, BLOCK_N)
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if MASKED:
            k = tl.load(k_ptrs, mask=cols[:, None] < n_k, other=0.0)   # [BLOCK_N, D]
            v = tl.load(v_ptrs, mask=cols[:, None] < n_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale                          # [BLOCK_M, BLOCK_N]
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            visible = cols[None, :] < n_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)                                   # [BLOCK_M, BLOCK_N]
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)                             # [BLOCK_M, D]
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return dq


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, qk_scale,
            stride_qb, stride_qh, stride_qm, stride_qd,
            stride_kb, stride_kh, stride_kn, stride_kd,
            stride_vb, stride_vh, stride_vn, stride_vd,
            stride_dob, stride_doh, stride_dom, stride_dod,
            n_heads, group, n_q, n_k,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr = "tf32"):
    """dQ for one block of BLOCK_M queries of one (batch, head). grid = (cdiv(Nq, BLOCK_M), B * Hq);
    DQ: contiguous [B, Hq, Nq, D]."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = (off_bh // n_heads).to(tl.int64)
    off_h = (off_bh % n_heads).to(tl.int64)
    off_hk = off_h // group

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < n_q
    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm
                + offs_d[None, :] * stride_qd, mask=rows, other=0.0)
    do = tl.load(DO + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom
                 + offs_d[None, :] * stride_dod, mask=rows, other=0.0)
    lse2 = _lse2(tl.load(LSE + off_bh.to(tl.int64) * n_q + offs_m, mask=offs_m < n_q, other=float("inf")))
    delta = tl.load(DELTA + off_bh.to(tl.int64) * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    k_ptrs = K + off_b * stride_kb + off_hk * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd
    v_ptrs = V + off_b * stride_vb + off_hk * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    shift = n_k - n_q
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m * BLOCK_M + BLOCK_M + shift, 0), n_k)
        full = tl.minimum(tl.maximum(start_m * BLOCK_M + shift + 1, 0), n_k) // BLOCK_N * BLOCK_N
    else:
        hi = n_k
        full = n_k // BLOCK_N * BLOCK_N
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
                       offs_m, 0, full, n_k, shift, qk_scale, BLOCK_N, False, CAUSAL, DOT_PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, k_ptrs, v_ptrs, stride_kn, stride_vn,
                       offs_m, full, hi, n_k, shift, qk_scale, BLOCK_N, True, CAUSAL, DOT_PRECISION)

    dq *= sm_scale
    out = off_bh.to(tl.int64) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


# ------------------------------------------------------------------- forward with tensor descriptors
# The top rungs of the forward's ladder on Hopper (and newer) GPUs. Same algorithm as ``_attn_fwd``;
# what changes is how tiles reach shared memory and how the work is scheduled:
# - Q, K, V tiles are read through tensor descriptors (``tl.make_tensor_descriptor``), which Triton
#   lowers to the TMA copy engine on sm_90+: one instruction per tile instead of per-thread address
#   arithmetic, and rows past the end of a head (the ragged last tile) arrive as zeros;
# - ``WARP_SPEC`` asks Triton to warp-specialize the key loop (producer warps issue the copies,
#   consumer warps do the products and the softmax), where the installed Triton supports it;
# - ``HALVES`` splits the query tile into two halves that share each K/V tile: the score product of
#   one half is issued before the softmax of the other, so the tensor cores have work while the
#   exponentials run (the "ping-pong" idea of FlashAttention-3, written inside one program);
# - ``PIPELINE`` issues the score product of the next K tile before the softmax of the current one
#   (FlashAttention-3's intra-warpgroup overlap, by software pipelining the key loop by hand).
# These kernels need CUDA capability >= 9 and a Triton with tensor descriptors (3.4+); attnkit.kernels.flash
# launches them only there (and only when strides and alignment allow TMA), else ``_attn_fwd``.
@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k, v, cols, offs_m, n_k, shift, qk_scale,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K/V tile folded into one query tile's running (acc, l_i, m_i); exp2 softmax."""
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    return _fwd_softmax_pv(acc, l_i, m_i, qk, v, cols, offs_m, n_k, shift, qk_scale,
                           MASKED, CAUSAL, DOT_PRECISION)


@triton.jit
def _fwd_softmax_pv(acc, l_i, m_i, qk, v, cols, offs_m, n_k, shift, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Given the raw scores qk of one tile: the online-softmax update and the P·V product."""
    if MASKED:
        visible = cols[None, :] < n_k
        if CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + shift)
        s = tl.where(visible, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s - m_sub[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_sub = m_new
        s = qk * qk_scale - m_new[:, None]
    p = tl.math.exp2(s)
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd_inner_desc(acc, l_i, m_i, q, desc_k, desc_v, offs_m, lo, hi, n_k, shift, qk_scale,
                    BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, WARP_SPEC: tl.constexpr):
    """``_fwd_inner`` with K/V tiles loaded through tensor descriptors."""
    offs_n = tl.arange(0, BLOCK_N)
    if WARP_SPEC:
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
            k = desc_k.load([start_n, 0])
            v = desc_v.load([start_n, 0])
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k, v, start_n + offs_n, offs_m, n_k, shift,
                                      qk_scale, MASKED, CAUSAL, DOT_PRECISION)
    else:
        for start_n in range(lo, hi, BLOCK_N):
            k = desc_k.load([start_n, 0])
            v = desc_v.load([start_n, 0])
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k, v, start_n + offs_n, offs_m, n_k, shift,
                                      qk_scale, MASKED, CAUSAL, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _fwd_inner_pipelined(acc, l_i, m_i, q, desc_k, desc_v, offs_m, lo, hi, n_k, shift, qk_scale,
                         BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``_fwd_inner_desc`` over unmasked tiles [lo, hi), software-pipelined by one tile: the score
    product of tile j+1 is issued before the softmax of tile j, so on Hopper the asynchronous
    tensor-core product runs while the exponentials of the tile before it are computed (the
    intra-warpgroup overlap of FlashAttention-3). hi - lo is a multiple of BLOCK_N."""
    offs_n = tl.arange(0, BLOCK_N)
    if hi > lo:
        qk = tl.dot(q, tl.trans(desc_k.load([lo, 0])), input_precision=DOT_PRECISION)
        for start_n in range(lo, hi - BLOCK_N, BLOCK_N):
            qk_next = tl.dot(q, tl.trans(desc_k.load([start_n + BLOCK_N, 0])), input_precision=DOT_PRECISION)
            v = desc_v.load([start_n, 0])
            acc, l_i, m_i = _fwd_softmax_pv(acc, l_i, m_i, qk, v, start_n + offs_n, offs_m, n_k, shift,
                                            qk_scale, False, CAUSAL, DOT_PRECISION)
            qk = qk_next
        v = desc_v.load([hi - BLOCK_N, 0])
        acc, l_i, m_i = _fwd_softmax_pv(acc, l_i, m_i, qk, v, hi - BLOCK_N + offs_n, offs_m, n_k, shift,
                                        qk_scale, False, CAUSAL, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _fwd_inner_halves(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v, offs_m0, offs_m1,
                      lo, hi, n_k, shift, qk_scale,
                      BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """Two half query tiles over the same K/V tiles, their steps interleaved: both score products
    are issued before either softmax, so one half's exponentials can overlap the other's product."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = desc_k.load([start_n, 0])
        kt = tl.trans(k)
        qk0 = tl.dot(q0, kt, input_precision=DOT_PRECISION)
        qk1 = tl.dot(q1, kt, input_precision=DOT_PRECISION)
        v = desc_v.load([start_n, 0])
        acc0, l0, m0 = _fwd_softmax_pv(acc0, l0, m0, qk0, v, cols, offs_m0, n_k, shift, qk_scale,
                                       MASKED, CAUSAL, DOT_PRECISION)
        acc1, l1, m1 = _fwd_softmax_pv(acc1, l1, m1, qk1, v, cols, offs_m1, n_k, shift, qk_scale,
                                       MASKED, CAUSAL, DOT_PRECISION)
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _fwd_finish(acc, l_i, m_i, offs_m, desc_o, row0, O, LSE, lse_base, n_q):
    """Normalise one query tile, store it through its descriptor and its log-sum-exp by pointer."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    desc_o.store([row0, 0], o.to(O.dtype.element_ty))
    tl.store(LSE + lse_base + offs_m, lse, mask=offs_m < n_q)


@triton.jit
def _attn_fwd_desc(Q, K, V, O, LSE, qk_scale,
                   stride_qb, stride_qh, stride_qm,
                   stride_kb, stride_kh, stride_kn,
                   stride_vb, stride_vh, stride_vn,
                   stride_ob, stride_oh, stride_om,
                   n_heads, group, n_q, n_k,
                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr, WARP_SPEC: tl.constexpr = False, HALVES: tl.constexpr = False,
                   DOT_PRECISION: tl.constexpr = "tf32", PIPELINE: tl.constexpr = False):
    """``_attn_fwd`` (exp2, split loops) with tensor-descriptor tiles. The head dim must be contiguous
    (stride 1); every other stride and each head's base address must be multiples of 16 bytes."""
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    off_bh = tl.program_id(1)
    off_b = (off_bh // n_heads).to(tl.int64)
    off_h = (off_bh % n_heads).to(tl.int64)
    off_hk = off_h // group
    # one 2-D descriptor per head: rows past n_q / n_k load as zeros and are not stored
    if HALVES:
        desc_q = tl.make_tensor_descriptor(Q + off_b * stride_qb + off_h * stride_qh, shape=[n_q, HEAD_DIM],
                                           strides=[stride_qm, 1], block_shape=[BLOCK_M // 2, HEAD_DIM])
        desc_o = tl.make_tensor_descriptor(O + off_b * stride_ob + off_h * stride_oh, shape=[n_q, HEAD_DIM],
                                           strides=[stride_om, 1], block_shape=[BLOCK_M // 2, HEAD_DIM])
    else:
        desc_q = tl.make_tensor_descriptor(Q + off_b * stride_qb + off_h * stride_qh, shape=[n_q, HEAD_DIM],
                                           strides=[stride_qm, 1], block_shape=[BLOCK_M, HEAD_DIM])
        desc_o = tl.make_tensor_descriptor(O + off_b * stride_ob + off_h * stride_oh, shape=[n_q, HEAD_DIM],
                                           strides=[stride_om, 1], block_shape=[BLOCK_M, HEAD_DIM])
    desc_k = tl.make_tensor_descriptor(K + off_b * stride_kb + off_hk * stride_kh, shape=[n_k, HEAD_DIM],
                                       strides=[stride_kn, 1], block_shape=[BLOCK_N, HEAD_DIM])
    desc_v = tl.make_tensor_descriptor(V + off_b * stride_vb + off_hk * stride_vh, shape=[n_k, HEAD_DIM],
                                       strides=[stride_vn, 1], block_shape=[BLOCK_N, HEAD_DIM])

    shift = n_k - n_q
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m * BLOCK_M + BLOCK_M + shift, 0), n_k)
        full = tl.minimum(tl.maximum(start_m * BLOCK_M + shift + 1, 0), n_k) // BLOCK_N * BLOCK_N
    else:
        hi = n_k
        full = n_k // BLOCK_N * BLOCK_N
    lse_base = off_bh.to(tl.int64) * n_q

    if HALVES:
        HALF: tl.constexpr = BLOCK_M // 2
        row0 = start_m * BLOCK_M
        offs_m0 = row0 + tl.arange(0, HALF)
        offs_m1 = row0 + HALF + tl.arange(0, HALF)
        q0 = desc_q.load([row0, 0])
        q1 = desc_q.load([row0 + HALF, 0])
        m0 = tl.full([HALF], float("-inf"), dtype=tl.float32)
        m1 = tl.full([HALF], float("-inf"), dtype=tl.float32)
        l0 = tl.zeros([HALF], dtype=tl.float32)
        l1 = tl.zeros([HALF], dtype=tl.float32)
        acc0 = tl.zeros([HALF, HEAD_DIM], dtype=tl.float32)
        acc1 = tl.zeros([HALF, HEAD_DIM], dtype=tl.float32)
        acc0, l0, m0, acc1, l1, m1 = _fwd_inner_halves(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v,
                                                       offs_m0, offs_m1, 0, full, n_k, shift, qk_scale,
                                                       BLOCK_N, False, CAUSAL, DOT_PRECISION)
        acc0, l0, m0, acc1, l1, m1 = _fwd_inner_halves(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v,
                                                       offs_m0, offs_m1, full, hi, n_k, shift, qk_scale,
                                                       BLOCK_N, True, CAUSAL, DOT_PRECISION)
        _fwd_finish(acc0, l0, m0, offs_m0, desc_o, row0, O, LSE, lse_base, n_q)
        _fwd_finish(acc1, l1, m1, offs_m1, desc_o, row0 + HALF, O, LSE, lse_base, n_q)
    else:
        row0 = start_m * BLOCK_M
        offs_m = row0 + tl.arange(0, BLOCK_M)
        q = desc_q.load([row0, 0])
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        if PIPELINE:
            acc, l_i, m_i = _fwd_inner_pipelined(acc, l_i, m_i, q, desc_k, desc_v, offs_m, 0, full, n_k, shift,
                                                 qk_scale, BLOCK_N, CAUSAL, DOT_PRECISION)
        else:
            acc, l_i, m_i = _fwd_inner_desc(acc, l_i, m_i, q, desc_k, desc_v, offs_m, 0, full, n_k, shift,
                                            qk_scale, BLOCK_N, False, CAUSAL, DOT_PRECISION, WARP_SPEC)
        acc, l_i, m_i = _fwd_inner_desc(acc, l_i, m_i, q, desc_k, desc_v, offs_m, full, hi, n_k, shift,
                                        qk_scale, BLOCK_N, True, CAUSAL, DOT_PRECISION, False)
        _fwd_finish(acc, l_i, m_i, offs_m, desc_o, row0, O, LSE, lse_base, n_q)


# ------------------------------------------------- forward with tensor descriptors built on the host
# ``_attn_fwd_desc`` builds its four descriptors on the device, in every program. Here the host builds
# them once per launch (triton.tools.tensor_descriptor.TensorDescriptor over the whole [B, H, N, D]
# tensors, one [1, 1, rows, D] block at a time) and passes them as kernel arguments.
@triton.jit
def _tile4(desc, b, h, row, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Rows [row, row + ROWS) of head h of batch b, as a [ROWS, D] tile (zeros past the end)."""
    return desc.load([b, h, row, 0]).reshape(ROWS, HEAD_DIM)


@triton.jit
def _fwd_inner_desc4(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hk, offs_m, lo, hi, n_k, shift, qk_scale,
                     BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    """``_fwd_inner_desc`` with tiles from host-built [B, H, N, D] descriptors."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        k = _tile4(desc_k, off_b, off_hk, start_n, BLOCK_N, HEAD_DIM)
        v = _tile4(desc_v, off_b, off_hk, start_n, BLOCK_N, HEAD_DIM)
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k, v, start_n + offs_n, offs_m, n_k, shift,
                                  qk_scale, MASKED, CAUSAL, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _fwd_inner_halves4(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v, off_b, off_hk, offs_m0, offs_m1,
                       lo, hi, n_k, shift, qk_scale, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                       MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``_fwd_inner_halves`` with tiles from host-built [B, H, N, D] descriptors."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kt = tl.trans(_tile4(desc_k, off_b, off_hk, start_n, BLOCK_N, HEAD_DIM))
        qk0 = tl.dot(q0, kt, input_precision=DOT_PRECISION)
        qk1 = tl.dot(q1, kt, input_precision=DOT_PRECISION)
        v = _tile4(desc_v, off_b, off_hk, start_n, BLOCK_N, HEAD_DIM)
        acc0, l0, m0 = _fwd_softmax_pv(acc0, l0, m0, qk0, v, cols, offs_m0, n_k, shift, qk_scale,
                                       MASKED, CAUSAL, DOT_PRECISION)
        acc1, l1, m1 = _fwd_softmax_pv(acc1, l1, m1, qk1, v, cols, offs_m1, n_k, shift, qk_scale,
                                       MASKED, CAUSAL, DOT_PRECISION)
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _fwd_finish4(acc, l_i, m_i, offs_m, desc_o, off_b, off_h, row0, LSE, lse_base, n_q,
                 ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """``_fwd_finish`` through a host-built [B, H, N, D] output descriptor."""
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    desc_o.store([off_b, off_h, row0, 0], o.to(desc_o.dtype).reshape(1, 1, ROWS, HEAD_DIM))
    tl.store(LSE + lse_base + offs_m, lse, mask=offs_m < n_q)


@triton.jit
def _attn_fwd_host_desc(desc_q, desc_k, desc_v, desc_o, LSE, qk_scale, n_heads, group, n_q, n_k,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        CAUSAL: tl.constexpr, HALVES: tl.constexpr = False, DOT_PRECISION: tl.constexpr = "tf32"):
    """``_attn_fwd_desc`` with its descriptors built on the host. desc_q, desc_o: blocks
    [1, 1, BLOCK_M (or BLOCK_M // 2 with HALVES), D]; desc_k, desc_v: blocks [1, 1, BLOCK_N, D]."""
    start_m = tl.program_id(0)
    if CAUSAL:
        start_m = tl.num_programs(0) - 1 - start_m
    off_bh = tl.program_id(1)
    off_b = off_bh // n_heads
    off_h = off_bh % n_heads
    off_hk = off_h // group
    shift = n_k - n_q
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m * BLOCK_M + BLOCK_M + shift, 0), n_k)
        full = tl.minimum(tl.maximum(start_m * BLOCK_M + shift + 1, 0), n_k) // BLOCK_N * BLOCK_N
    else:
        hi = n_k
        full = n_k // BLOCK_N * BLOCK_N
    lse_base = off_bh.to(tl.int64) * n_q
    row0 = start_m * BLOCK_M
    if HALVES:
        HALF: tl.constexpr = BLOCK_M // 2
        offs_m0 = row0 + tl.arange(0, HALF)
        offs_m1 = row0 + HALF + tl.arange(0, HALF)
        q0 = _tile4(desc_q, off_b, off_h, row0, HALF, HEAD_DIM)
        q1 = _tile4(desc_q, off_b, off_h, row0 + HALF, HALF, HEAD_DIM)
        m0 = tl.full([HALF], float("-inf"), dtype=tl.float32)
        m1 = tl.full([HALF], float("-inf"), dtype=tl.float32)
        l0 = tl.zeros([HALF], dtype=tl.float32)
        l1 = tl.zeros([HALF], dtype=tl.float32)
        acc0 = tl.zeros([HALF, HEAD_DIM], dtype=tl.float32)
        acc1 = tl.zeros([HALF, HEAD_DIM], dtype=tl.float32)
        acc0, l0, m0, acc1, l1, m1 = _fwd_inner_halves4(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v,
                                                        off_b, off_hk, offs_m0, offs_m1, 0, full, n_k, shift,
                                                        qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, DOT_PRECISION)
        acc0, l0, m0, acc1, l1, m1 = _fwd_inner_halves4(acc0, l0, m0, acc1, l1, m1, q0, q1, desc_k, desc_v,
                                                        off_b, off_hk, offs_m0, offs_m1, full, hi, n_k, shift,
                                                        qk_scale, BLOCK_N, HEAD_DIM, True, CAUSAL, DOT_PRECISION)
        _fwd_finish4(acc0, l0, m0, offs_m0, desc_o, off_b, off_h, row0, LSE, lse_base, n_q, HALF, HEAD_DIM)
        _fwd_finish4(acc1, l1, m1, offs_m1, desc_o, off_b, off_h, row0 + HALF, LSE, lse_base, n_q, HALF, HEAD_DIM)
    else:
        offs_m = row0 + tl.arange(0, BLOCK_M)
        q = _tile4(desc_q, off_b, off_h, row0, BLOCK_M, HEAD_DIM)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        acc, l_i, m_i = _fwd_inner_desc4(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hk, offs_m, 0, full, n_k,
                                         shift, qk_scale, BLOCK_N, HEAD_DIM, False, CAUSAL, DOT_PRECISION)
        acc, l_i, m_i = _fwd_inner_desc4(acc, l_i, m_i, q, desc_k, desc_v, off_b, off_hk, offs_m, full, hi, n_k,
                                         shift, qk_scale, BLOCK_N, HEAD_DIM, True, CAUSAL, DOT_PRECISION)
        _fwd_finish4(acc, l_i, m_i, offs_m, desc_o, off_b, off_h, row0, LSE, lse_base, n_q, BLOCK_M, HEAD_DIM)
