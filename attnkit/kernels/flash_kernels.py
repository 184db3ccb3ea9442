"""The FlashAttention kernels in Triton: one forward kernel (every rung of the ladder), and the backward.

This module holds only ``@triton.jit`` code; ``attnkit.kernels.flash`` checks inputs, picks the rung's
constexprs and block sizes and launches these.

Conventions shared by every kernel:
- one program handles one block of rows (queries, or keys in ``_bwd_dkdv``) of one head;
- query head h reads key/value head h // group (grouped-query attention, no K/V copies);
- causal attention is aligned to the end: query i sees key j when j <= i + SHIFT, SHIFT = Nk - Nq;
- scores are scaled once by ``qk_scale``; with ``USE_EXP2`` that scale includes log2(e), so the
  softmax uses exp2 (one instruction) and the saved log-sum-exp is converted back to natural log;
- ``DOT_PRECISION`` is "ieee" for fp32 inputs (tf32 products would put ~1e-3 of error into the
  exponentials) and "tf32" otherwise (ignored for fp16/bf16 operands);
- loops are split into blocks that need no masks (full blocks, fully visible) and the few that do
  (the diagonal of the causal mask and the ragged last block); ``SPLIT=False`` masks every block;
- ``DESC`` says how the forward's tiles move: 0 by pointers with explicit strides (any strided
  [B, H, N, D] view), 1 through tensor descriptors each program builds, 2 through descriptors the host
  built once per launch (both lowered to the TMA copy engine on sm_90+; rows past the end of a head
  load as zeros and are not stored). Both descriptor kinds span the whole [B, H, N, D] tensor and move
  [1, 1, rows, D] blocks, so one tile loader serves them.
"""
from __future__ import annotations

from ..device import ensure_triton_backend

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)   # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)     # ln(2): log(x) == log2(x) * LN2

POINTERS, DEVICE_DESCRIPTORS, HOST_DESCRIPTORS = 0, 1, 2   # the values of DESC


# ------------------------------------------------------------------------------------ shared pieces
@triton.jit
def _tile(X, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d,
          ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, DESC: tl.constexpr):
    """Rows [row, row + ROWS) of head h of batch b as a [ROWS, D] tile; rows past n_rows are zeros
    (read under a mask with MASKED, and by the descriptor's bounds with DESC)."""
    if DESC:
        tile = X.load([b, h, row, 0]).reshape(ROWS, HEAD_DIM)
    else:
        rows = row + tl.arange(0, ROWS)
        ptrs = (X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_n
                + tl.arange(0, HEAD_DIM)[None, :] * stride_d)
        if MASKED:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_tile(X, tile, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d,
                ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DESC: tl.constexpr):
    """Store a [ROWS, D] tile as rows [row, row + ROWS) of head h of batch b (rows past n_rows dropped)."""
    if DESC:
        X.store([b, h, row, 0], tile.to(X.dtype).reshape(1, 1, ROWS, HEAD_DIM))
    else:
        rows = row + tl.arange(0, ROWS)
        ptrs = (X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_n
                + tl.arange(0, HEAD_DIM)[None, :] * stride_d)
        tl.store(ptrs, tile.to(X.dtype.element_ty), mask=rows[:, None] < n_rows)


@triton.jit
def _descriptor(X, n_batch, n_heads, n_rows, stride_b, stride_h, stride_n, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A device-built descriptor over a whole [B, H, N, D] tensor (head dim contiguous) moving
    [1, 1, ROWS, D] blocks: the shape a host-built one has."""
    return tl.make_tensor_descriptor(X, shape=[n_batch, n_heads, n_rows, HEAD_DIM],
                                     strides=[stride_b, stride_h, stride_n, 1], block_shape=[1, 1, ROWS, HEAD_DIM])


@triton.jit
def _key_range(start_m, n_q, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """(full, hi) for query block start_m: it reads keys [0, hi); keys [0, full) are whole key blocks
    that every one of its rows sees (no mask needed)."""
    if CAUSAL:
        shift = n_k - n_q
        hi = tl.minimum(tl.maximum(start_m * BLOCK_M + BLOCK_M + shift, 0), n_k)
        full = tl.minimum(tl.maximum(start_m * BLOCK_M + shift + 1, 0), n_k) // BLOCK_N * BLOCK_N
    else:
        hi = n_k
        full = n_k // BLOCK_N * BLOCK_N
    return full, hi


@triton.jit
def _visible(rows, cols, n_q, n_k, CAUSAL: tl.constexpr):
    """[len(rows), len(cols)]: query row i sees key col j (in bounds, and j <= i + Nk - Nq if causal)."""
    visible = (rows[:, None] < n_q) & (cols[None, :] < n_k)
    if CAUSAL:
        visible = visible & (cols[None, :] <= rows[:, None] + (n_k - n_q))
    return visible


@triton.jit
def _softmax_update(acc, l_i, m_i, qk, v, rows, cols, n_q, n_k, qk_scale,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, USE_EXP2: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Fold one tile of raw scores qk [BLOCK_M, BLOCK_N] and its values v [BLOCK_N, D] into the running
    state: acc [BLOCK_M, D] (unnormalised output), l_i and m_i [BLOCK_M] (sum and maximum)."""
    if MASKED:
        s = tl.where(_visible(rows, cols, n_q, n_k, CAUSAL), qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # a row that has seen no key yet keeps m = -inf; subtract 0 instead of -inf
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s - m_sub[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_sub = m_new
        s = qk * qk_scale - m_new[:, None]                            # one fused multiply-add
    if USE_EXP2:
        p = tl.math.exp2(s)
        alpha = tl.math.exp2(m_i - m_sub)
    else:
        p = tl.exp(s)
        alpha = tl.exp(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, l_i, m_new


# ------------------------------------------------------------------------------------------ forward
@triton.jit
def _fwd_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, lo, hi, n_q, n_k, qk_scale,
              stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              USE_EXP2: tl.constexpr, DESC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key blocks [lo, hi) into the running (acc, l_i, m_i) of one query block q [BLOCK_M, D]."""
    for start_n in range(lo, hi, BLOCK_N):
        k = _tile(K, off_b, off_hk, start_n, n_k, stride_kb, stride_kh, stride_kn, stride_kd,
                  BLOCK_N, HEAD_DIM, MASKED, DESC)                    # [BLOCK_N, D]
        v = _tile(V, off_b, off_hk, start_n, n_k, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK_N, HEAD_DIM, MASKED, DESC)
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)    # [BLOCK_M, BLOCK_N]
        acc, l_i, m_i = _softmax_update(acc, l_i, m_i, qk, v, rows, start_n + tl.arange(0, BLOCK_N),
                                        n_q, n_k, qk_scale, MASKED, CAUSAL, USE_EXP2, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, qk_scale,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              n_batch, n_heads, group, n_q, n_k,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              USE_EXP2: tl.constexpr, SPLIT: tl.constexpr, DESC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """O = softmax(Q Kᵀ · scale) V for one block of BLOCK_M queries of one (batch, head).

    grid = (cdiv(Nq, BLOCK_M), B * Hq). Q, K, V, O: tensors (DESC 0 and 1; DESC 1 needs a contiguous
    head dim and 16-byte strides) or host-built descriptors (DESC 2; the strides are then unused).
    LSE: contiguous fp32 [B, Hq, Nq], natural log, -inf for a row that sees no key (its output is 0).
    """
    start_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks read the most keys: start them first
        start_m = tl.num_programs(0) - 1 - start_m
    off_bh = tl.program_id(1)
    off_b = off_bh // n_heads
    off_h = off_bh % n_heads
    off_hk = off_h // group                                            # the shared K/V head
    if DESC == 1:  # one descriptor per tensor, built by every program
        Q = _descriptor(Q, n_batch, n_heads, n_q, stride_qb, stride_qh, stride_qm, BLOCK_M, HEAD_DIM)
        O = _descriptor(O, n_batch, n_heads, n_q, stride_ob, stride_oh, stride_om, BLOCK_M, HEAD_DIM)
        K = _descriptor(K, n_batch, n_heads // group, n_k, stride_kb, stride_kh, stride_kn, BLOCK_N, HEAD_DIM)
        V = _descriptor(V, n_batch, n_heads // group, n_k, stride_vb, stride_vh, stride_vn, BLOCK_N, HEAD_DIM)

    row0 = start_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)                                # [BLOCK_M] query indices
    q = _tile(Q, off_b, off_h, row0, n_q, stride_qb, stride_qh, stride_qm, stride_qd,
              BLOCK_M, HEAD_DIM, True, DESC)                           # [BLOCK_M, D]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    full, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    if SPLIT:
        acc, l_i, m_i = _fwd_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, 0, full, n_q, n_k, qk_scale,
                                  stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn,
                                  stride_vd, HEAD_DIM, BLOCK_N, False, CAUSAL, USE_EXP2, DESC, DOT_PRECISION)
        first_masked = full
    else:
        first_masked = 0
    acc, l_i, m_i = _fwd_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, first_masked, hi, n_q, n_k, qk_scale,
                              stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn,
                              stride_vd, HEAD_DIM, BLOCK_N, True, CAUSAL, USE_EXP2, DESC, DOT_PRECISION)

    empty = l_i == 0.0                                                 # rows that saw no key
    l_safe = tl.where(empty, 1.0, l_i)
    if USE_EXP2:
        lse = (m_i + tl.math.log2(l_safe)) * LN2
    else:
        lse = m_i + tl.log(l_safe)
    _store_tile(O, acc / l_safe[:, None], off_b, off_h, row0, n_q, stride_ob, stride_oh, stride_om, stride_od,
                BLOCK_M, HEAD_DIM, DESC)
    tl.store(LSE + off_bh.to(tl.int64) * n_q + rows, tl.where(empty, float("-inf"), lse), mask=rows < n_q)


# ----------------------------------------------------------------------------------------- backward
@triton.jit
def _bwd_preprocess(O, DO, DELTA,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    n_heads, n_q,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """DELTA[b, h, i] = Σ_d dO[b, h, i, d] · O[b, h, i, d] (fp32, contiguous [B, Hq, Nq])."""
    off_bh = tl.program_id(1)
    row0 = tl.program_id(0) * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    o = _tile(O, off_bh // n_heads, off_bh % n_heads, row0, n_q, stride_ob, stride_oh, stride_om, stride_od,
              BLOCK_M, HEAD_DIM, True, 0)
    do = _tile(DO, off_bh // n_heads, off_bh % n_heads, row0, n_q, stride_dob, stride_doh, stride_dom, stride_dod,
               BLOCK_M, HEAD_DIM, True, 0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)      # [BLOCK_M]
    tl.store(DELTA + off_bh.to(tl.int64) * n_q + rows, delta, mask=rows < n_q)


@triton.jit
def _row_stats(LSE, DELTA, rows, n_q):
    """The saved log-sum-exp in base 2 and DELTA of rows. A row that saw no key (lse = -inf) and a
    padding row get lse2 = +inf, so that exp2(s - lse2) is 0 there."""
    lse = tl.load(LSE + rows, mask=rows < n_q, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    return lse2, tl.load(DELTA + rows, mask=rows < n_q, other=0.0)


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, off_b, off_h, keys, lo, hi, n_q, n_k, qk_scale,
                    stride_qb, stride_qh, stride_qm, stride_qd, stride_dob, stride_doh, stride_dom, stride_dod,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Accumulate dK, dV of one key block (k, v [BLOCK_N, D]) over query blocks [lo, hi) of query head
    off_h; LSE, DELTA: this head's rows. Works on transposed scores sT = k qᵀ: [BLOCK_N, BLOCK_M]."""
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)                         # [BLOCK_M] query indices
        q = _tile(Q, off_b, off_h, start_m, n_q, stride_qb, stride_qh, stride_qm, stride_qd,
                  BLOCK_M, HEAD_DIM, MASKED, 0)
        do = _tile(DO, off_b, off_h, start_m, n_q, stride_dob, stride_doh, stride_dom, stride_dod,
                   BLOCK_M, HEAD_DIM, MASKED, 0)
        lse2, delta = _row_stats(LSE, DELTA, rows, n_q)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(tl.trans(_visible(rows, keys, n_q, n_k, CAUSAL)), p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)                      # [BLOCK_N, D]
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)                          # [BLOCK_N, BLOCK_M]
        dk += tl.dot((p_t * (dp_t - delta[None, :])).to(q.dtype), q, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, sm_scale, qk_scale,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_dob, stride_doh, stride_dom, stride_dod,
              n_heads, n_heads_kv, group, n_q, n_k,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dK, dV for one block of BLOCK_N keys of one (batch, KV head), summed over its ``group`` query heads.

    grid = (cdiv(Nk, BLOCK_N), B * Hkv). DK, DV: contiguous [B, Hkv, Nk, D].
    """
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    off_b = off_bhk // n_heads_kv
    off_hk = off_bhk % n_heads_kv
    keys = start_n + tl.arange(0, BLOCK_N)                             # [BLOCK_N] key indices
    k = _tile(K, off_b, off_hk, start_n, n_k, stride_kb, stride_kh, stride_kn, stride_kd, BLOCK_N, HEAD_DIM, True, 0)
    v = _tile(V, off_b, off_hk, start_n, n_k, stride_vb, stride_vh, stride_vn, stride_vd, BLOCK_N, HEAD_DIM, True, 0)
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
    bounds = (lo, mid, full, n_q)
    for g in range(group):
        off_h = off_hk * group + g
        base = (off_b * n_heads + off_h).to(tl.int64) * n_q            # this head's LSE and DELTA rows
        for part in tl.static_range(3):                                 # masked, unmasked, masked
            dk, dv = _bwd_dkdv_inner(dk, dv, k, v, Q, DO, LSE + base, DELTA + base, off_b, off_h, keys,
                                     bounds[part], bounds[part + 1], n_q, n_k, qk_scale,
                                     stride_qb, stride_qh, stride_qm, stride_qd, stride_dob, stride_doh, stride_dom,
                                     stride_dod, HEAD_DIM, BLOCK_M, part != 1, CAUSAL, DOT_PRECISION)
    out = off_bhk.to(tl.int64) * n_k * HEAD_DIM + keys[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(DK + out, (dk * sm_scale).to(DK.dtype.element_ty), mask=keys[:, None] < n_k)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys[:, None] < n_k)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, delta, K, V, off_b, off_hk, rows, lo, hi, n_q, n_k, qk_scale,
                  stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                  DOT_PRECISION: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [lo, hi). dq, q, do: [BLOCK_M, D]."""
    for start_n in range(lo, hi, BLOCK_N):
        k = _tile(K, off_b, off_hk, start_n, n_k, stride_kb, stride_kh, stride_kn, stride_kd,
                  BLOCK_N, HEAD_DIM, MASKED, 0)
        v = _tile(V, off_b, off_hk, start_n, n_k, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK_N, HEAD_DIM, MASKED, 0)
        p = tl.math.exp2(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale - lse2[:, None])
        if MASKED:
            p = tl.where(_visible(rows, start_n + tl.arange(0, BLOCK_N), n_q, n_k, CAUSAL), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)                            # [BLOCK_M, BLOCK_N]
        dq = tl.dot((p * (dp - delta[:, None])).to(k.dtype), k, dq, input_precision=DOT_PRECISION)  # [BLOCK_M, D]
    return dq


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, sm_scale, qk_scale,
            stride_qb, stride_qh, stride_qm, stride_qd,
            stride_kb, stride_kh, stride_kn, stride_kd,
            stride_vb, stride_vh, stride_vn, stride_vd,
            stride_dob, stride_doh, stride_dom, stride_dod,
            n_heads, group, n_q, n_k,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """dQ for one block of BLOCK_M queries of one (batch, head). grid = (cdiv(Nq, BLOCK_M), B * Hq);
    DQ: contiguous [B, Hq, Nq, D]."""
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // n_heads
    off_h = off_bh % n_heads
    row0 = start_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    q = _tile(Q, off_b, off_h, row0, n_q, stride_qb, stride_qh, stride_qm, stride_qd, BLOCK_M, HEAD_DIM, True, 0)
    do = _tile(DO, off_b, off_h, row0, n_q, stride_dob, stride_doh, stride_dom, stride_dod, BLOCK_M, HEAD_DIM, True, 0)
    lse2, delta = _row_stats(LSE + off_bh.to(tl.int64) * n_q, DELTA + off_bh.to(tl.int64) * n_q, rows, n_q)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    full, hi = _key_range(start_m, n_q, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, K, V, off_b, off_h // group, rows, 0, full, n_q, n_k, qk_scale,
                       stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                       HEAD_DIM, BLOCK_N, False, CAUSAL, DOT_PRECISION)
    dq = _bwd_dq_inner(dq, q, do, lse2, delta, K, V, off_b, off_h // group, rows, full, hi, n_q, n_k, qk_scale,
                       stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                       HEAD_DIM, BLOCK_N, True, CAUSAL, DOT_PRECISION)
    out = off_bh.to(tl.int64) * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(DQ + out, (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows[:, None] < n_q)
