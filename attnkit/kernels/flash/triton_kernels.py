"""The FlashAttention kernels in Triton: one forward kernel (every rung of the ladder), and the backward in
two designs (dK/dV then dQ in two kernels; or one pass with dQ accumulated by atomic adds).

This module holds only ``@triton.jit`` code; ``attnkit.kernels.flash`` checks inputs, its ``dispatch`` picks
the rung's constexprs and block sizes, and its ``forward`` and ``backward`` launch these. Internal API for
tests and scripts: the kernels as ``attn_fwd``, ``bwd_preprocess``, ``bwd_dkdv`` and ``bwd_dq`` (public
names of ``_attn_fwd``, ``_bwd_preprocess``, ``_bwd_dkdv`` and ``_bwd_dq``, whose names are the names
profilers record: bench_flash_profile.csv), the helpers ``load_tile`` (also the FP8
forward's loader), ``key_range`` and ``tanh``, and the constants ``LOG2E``, ``LN2`` and the values of
``DESC``.

Conventions shared by every kernel:
- one program handles one block of rows (queries, or keys in ``_bwd_dkdv``) of one head;
- query head h reads key/value head h // group (grouped-query attention, no K/V copies);
- causal attention is aligned to the end: query i sees key j when j <= i + SHIFT, SHIFT = Nk - Nq;
  a sliding window generalises it to a band, -left <= j - i - SHIFT <= right (``BAND``; causal is
  right = 0). One helper, ``key_range``, turns the band into the blocks a program visits (blocks
  wholly outside it are never loaded) and ``_visible`` is the one mask inside the blocks that need one;
- head dims need not be powers of two: a tile is HEAD_DIM (HEAD_DIM_V for v and o) wide, the next
  power of two, and ``load_tile``/``_store_tile`` mask the columns past the tensor's DIM_QK (DIM_V);
- ``SOFTCAP``: logits softcap · tanh(s / softcap), applied in ``_softmax_update`` (forward) and
  ``_probs`` (backward; the backward multiplies dS by 1 - tanh²);
- ``VARLEN``: packed sequences; program b reads rows [CU[b], CU[b + 1]) (``_sequence``), the batch
  stride is 0 and n_q, n_k are the longest lengths (a block past its sequence's end visits no key);
- scores are scaled once by ``qk_scale``; with ``USE_EXP2`` that scale includes log2(e), so the
  softmax uses exp2 (one instruction) and the saved log-sum-exp is converted back to natural log;
- ``DOT_PRECISION`` is "ieee" for fp32 inputs (tf32 products would put ~1e-3 of error into the
  exponentials) and "tf32" otherwise (ignored for fp16/bf16 operands);
- loops are split into blocks that need no masks (full blocks, fully visible) and the few that do
  (the diagonal of the causal mask and the ragged last block); ``SPLIT=False`` masks every block.
  ``_bwd_dkdv`` makes the same split with a branch inside one loop (``_bwd_dkdv_inner`` says why);
- ``DESC`` says how tiles move (the forward takes all three, the backward 0 and 2): 0 by pointers with
  explicit strides (any strided [B, H, N, D] view), 1 through tensor descriptors each program builds,
  2 through descriptors the host built once per launch (both lowered to the TMA copy engine on sm_90+;
  rows past the end of a head load as zeros and are not stored). Both descriptor kinds span the whole
  [B, H, N, D] tensor and move [1, 1, rows, D] blocks, so one tile loader serves them.
"""
from __future__ import annotations

from ...device import ensure_triton_backend

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = tl.constexpr(1.4426950408889634)   # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)     # ln(2): log(x) == log2(x) * LN2

POINTERS, DEVICE_DESCRIPTORS, HOST_DESCRIPTORS = 0, 1, 2   # the values of DESC


# ------------------------------------------------------------------------------------ shared pieces
@triton.jit
def load_tile(X, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d,
          ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, DESC: tl.constexpr,
          DIM: tl.constexpr):
    """Rows [row, row + ROWS) of head h of batch b as a [ROWS, HEAD_DIM] tile; rows past n_rows are zeros
    (read under a mask with MASKED, and by the descriptor's bounds with DESC). The tensor's head dim is
    DIM <= HEAD_DIM (a power of two): columns [DIM, HEAD_DIM) are read as zeros, under a mask."""
    if DESC:
        tile = X.load([b, h, row, 0]).reshape(ROWS, HEAD_DIM)
    else:
        rows = row + tl.arange(0, ROWS)
        cols = tl.arange(0, HEAD_DIM)
        ptrs = (X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_n
                + cols[None, :] * stride_d)
        if MASKED:
            if DIM < HEAD_DIM:
                tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < DIM), other=0.0)
            else:
                tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        elif DIM < HEAD_DIM:
            tile = tl.load(ptrs, mask=cols[None, :] < DIM, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_tile(X, tile, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d,
                ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DESC: tl.constexpr, DIM: tl.constexpr):
    """Store a [ROWS, HEAD_DIM] tile as rows [row, row + ROWS) of head h of batch b (rows past n_rows
    and columns past the tensor's head dim DIM dropped)."""
    if DESC:
        X.store([b, h, row, 0], tile.to(X.dtype).reshape(1, 1, ROWS, HEAD_DIM))
    else:
        rows = row + tl.arange(0, ROWS)
        cols = tl.arange(0, HEAD_DIM)
        ptrs = (X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_n
                + cols[None, :] * stride_d)
        tl.store(ptrs, tile.to(X.dtype.element_ty), mask=(rows[:, None] < n_rows) & (cols[None, :] < DIM))


@triton.jit
def _descriptor(X, n_batch, n_heads, n_rows, stride_b, stride_h, stride_n, ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A device-built descriptor over a whole [B, H, N, D] tensor (head dim contiguous) moving
    [1, 1, ROWS, D] blocks: the shape a host-built one has."""
    return tl.make_tensor_descriptor(X, shape=[n_batch, n_heads, n_rows, HEAD_DIM],
                                     strides=[stride_b, stride_h, stride_n, 1], block_shape=[1, 1, ROWS, HEAD_DIM])


@triton.jit
def key_range(row0, n_cols, shift, left, right, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """The columns that rows [row0, row0 + BLOCK_ROWS) read, as (lo, a, b, hi): row i sees column j when
    i + shift - left <= j <= i + shift + right and j < n_cols (the band; ``left``, ``right`` >= 0, a huge
    value when unbounded). [lo, a) and [b, hi) are blocks that need a mask, [a, b) whole blocks every row
    sees; blocks wholly outside the band are never visited, so a window of w keys costs O(w) per row.
    Queries reading keys: shift = Nk - Nq. Keys reading the queries that see them: shift = Nq - Nk,
    left and right swapped."""
    last = row0 + BLOCK_ROWS - 1
    lo = tl.maximum(row0 + shift - left, 0) // BLOCK_COLS * BLOCK_COLS
    hi = tl.maximum(tl.minimum(last + shift + right + 1, n_cols), lo)
    a = (tl.maximum(last + shift - left, 0) + BLOCK_COLS - 1) // BLOCK_COLS * BLOCK_COLS
    b = tl.maximum(tl.minimum(row0 + shift + right + 1, n_cols), 0) // BLOCK_COLS * BLOCK_COLS
    a = tl.minimum(tl.maximum(a, lo), hi)
    b = tl.maximum(tl.minimum(b, hi), a)
    return lo, a, b, hi


@triton.jit
def _visible(rows, cols, n_q, n_k, left, right, BAND: tl.constexpr):
    """[len(rows), len(cols)]: query row i sees key col j (in bounds, and with BAND
    -left <= j - i - (Nk - Nq) <= right: causal is right = 0, a sliding window bounds left too)."""
    visible = (rows[:, None] < n_q) & (cols[None, :] < n_k)
    if BAND:
        diagonal = cols[None, :] - rows[:, None] - (n_k - n_q)
        visible = visible & (diagonal <= right) & (diagonal >= -left)
    return visible


@triton.jit
def tanh(x):
    """tanh to fp32 rounding for every x (not every Triton backend has tanh; its interpreter has not).

    |x| >= 1/4: (1 - e) / (1 + e) with e = exp(-2|x|), where 1 - e >= 0.39 cancels little. |x| < 1/4:
    the odd Taylor series to x^11 (its first omitted term is below 3e-10 relative there), because 1 - e cancels
    to nothing as |x| -> 0: with a large softcap, s / softcap is tiny and (1 - e) / (1 + e) is off by
    about 6e-8 / |x| relative (docs/semantics.md)."""
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    x2 = a * a
    poly = 62.0 / 2835.0 + x2 * (-1382.0 / 155925.0)
    small = a * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * poly))))
    t = tl.where(a < 0.25, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def _softmax_update(acc, l_i, m_i, qk, v, rows, cols, n_q, n_k, left, right, qk_scale, cap_scale,
                    MASKED: tl.constexpr, BAND: tl.constexpr, SOFTCAP: tl.constexpr, USE_EXP2: tl.constexpr,
                    DOT_PRECISION: tl.constexpr):
    """Fold one tile of raw scores qk [BLOCK_M, BLOCK_N] and its values v [BLOCK_N, D] into the running
    state: acc [BLOCK_M, D] (unnormalised output), l_i and m_i [BLOCK_M] (sum and maximum). The logits
    are qk · qk_scale, or with SOFTCAP tanh(qk · cap_scale) · qk_scale (cap_scale = sm_scale / softcap,
    qk_scale = softcap, times log2 e with USE_EXP2)."""
    if SOFTCAP:
        qk = tanh(qk * cap_scale)
    if MASKED:
        s = tl.where(_visible(rows, cols, n_q, n_k, left, right, BAND), qk * qk_scale, float("-inf"))
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
def _sequence(CU_SEQLENS, b):
    """(first row, length) of sequence b of a packed batch: cu_seqlens[b], cu_seqlens[b + 1] - cu_seqlens[b]."""
    start = tl.load(CU_SEQLENS + b)
    return start, tl.load(CU_SEQLENS + b + 1) - start


@triton.jit
def _batch_and_head():
    """(sequence, head) of this program: the grid's second axis runs over heads, its third over sequences
    (each at most 65,535 long; one axis over B · heads would stop there)."""
    return tl.program_id(2), tl.program_id(1)


@triton.jit
def _backward_sequence(CU_Q, CU_K, off_b, Q, DO, LSE, DELTA, K, V, stride_qm, stride_dom, stride_kn, stride_vn):
    """The backward's shared inputs moved to sequence off_b of a packed batch; also its rows' and keys'
    (start, length) for the caller's own outputs."""
    q0, n_q = _sequence(CU_Q, off_b)
    k0, n_k = _sequence(CU_K, off_b)
    return (q0, n_q, k0, n_k, Q + q0.to(tl.int64) * stride_qm, DO + q0.to(tl.int64) * stride_dom, LSE + q0,
            DELTA + q0, K + k0.to(tl.int64) * stride_kn, V + k0.to(tl.int64) * stride_vn)


@triton.jit
def _fwd_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, lo, hi, n_q, n_k, left, right, qk_scale, cap_scale,
              stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
              HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, DIM_QK: tl.constexpr, DIM_V: tl.constexpr,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, BAND: tl.constexpr, SOFTCAP: tl.constexpr,
              USE_EXP2: tl.constexpr, DESC: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold key blocks [lo, hi) into the running (acc, l_i, m_i) of one query block q [BLOCK_M, D]."""
    for start_n in range(lo, hi, BLOCK_N):
        k = load_tile(K, off_b, off_hk, start_n, n_k, stride_kb, stride_kh, stride_kn, stride_kd,
                  BLOCK_N, HEAD_DIM, MASKED, DESC, DIM_QK)            # [BLOCK_N, D]
        v = load_tile(V, off_b, off_hk, start_n, n_k, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK_N, HEAD_DIM_V, MASKED, DESC, DIM_V)           # [BLOCK_N, Dv]
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)    # [BLOCK_M, BLOCK_N]
        acc, l_i, m_i = _softmax_update(acc, l_i, m_i, qk, v, rows, start_n + tl.arange(0, BLOCK_N),
                                        n_q, n_k, left, right, qk_scale, cap_scale, MASKED, BAND, SOFTCAP,
                                        USE_EXP2, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(Q, K, V, O, LSE, CU_Q, CU_K, qk_scale, cap_scale, left, right,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_ob, stride_oh, stride_om, stride_od,
              stride_lb, stride_lh,
              n_batch, n_heads, group, n_q, n_k,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
              USE_EXP2: tl.constexpr, SPLIT: tl.constexpr, DESC: tl.constexpr, DOT_PRECISION: tl.constexpr,
              HEAD_DIM_V: tl.constexpr, DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BAND: tl.constexpr,
              SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, LONGEST_FIRST: tl.constexpr):
    """O = softmax(Q Kᵀ · scale) V for one block of BLOCK_M queries of one (batch, head).

    grid = (cdiv(Nq, BLOCK_M), Hq, B). Q, K, V, O: tensors (DESC 0 and 1; DESC 1 needs a contiguous
    head dim and 16-byte strides) or host-built descriptors (DESC 2; the strides are then unused).
    LSE: fp32, row i of (b, h) at b · stride_lb + h · stride_lh + i, natural log, -inf for a row that
    sees no key (its output is 0). Head dims DIM_QK (q, k) and DIM_V (v, o), padded in registers to the
    powers of two HEAD_DIM, HEAD_DIM_V. BAND: keys outside [i + Nk - Nq - left, i + Nk - Nq + right]
    are not seen (causal: right = 0). VARLEN: sequence b is rows [CU_Q[b], CU_Q[b + 1]) of the queries
    and [CU_K[b], CU_K[b + 1]) of the keys (the batch stride is 0, n_q and n_k are the longest lengths).
    LONGEST_FIRST: program 0 takes the last query block, program 1 the one before it, and so on. With a
    band bounded on the right (causal) the last blocks read the most keys; started first, they do not
    leave the GPU waiting on a few long programs at the end. Only the order changes, not the results.
    """
    start_m = tl.program_id(0)
    if LONGEST_FIRST:
        start_m = tl.num_programs(0) - 1 - start_m
    off_b, off_h = _batch_and_head()
    off_hk = off_h // group                                            # the shared K/V head
    if VARLEN:
        q0, n_q = _sequence(CU_Q, off_b)
        k0, n_k = _sequence(CU_K, off_b)
        Q += q0.to(tl.int64) * stride_qm
        O += q0.to(tl.int64) * stride_om
        LSE += q0
        K += k0.to(tl.int64) * stride_kn
        V += k0.to(tl.int64) * stride_vn
    if DESC == 1:  # one descriptor per tensor, built by every program
        Q = _descriptor(Q, n_batch, n_heads, n_q, stride_qb, stride_qh, stride_qm, BLOCK_M, HEAD_DIM)
        O = _descriptor(O, n_batch, n_heads, n_q, stride_ob, stride_oh, stride_om, BLOCK_M, HEAD_DIM)
        K = _descriptor(K, n_batch, n_heads // group, n_k, stride_kb, stride_kh, stride_kn, BLOCK_N, HEAD_DIM)
        V = _descriptor(V, n_batch, n_heads // group, n_k, stride_vb, stride_vh, stride_vn, BLOCK_N, HEAD_DIM)

    row0 = start_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)                                # [BLOCK_M] query indices
    q = load_tile(Q, off_b, off_h, row0, n_q, stride_qb, stride_qh, stride_qm, stride_qd,
              BLOCK_M, HEAD_DIM, True, DESC, DIM_QK)                   # [BLOCK_M, D]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], dtype=tl.float32)

    # a block past the end of its sequence (VARLEN) reads no key
    lo, a, b, hi = key_range(row0, tl.where(row0 < n_q, n_k, 0), n_k - n_q, left, right, BLOCK_M, BLOCK_N)
    if SPLIT:   # masked blocks, whole blocks, masked blocks
        bounds = (lo, a, b, hi)
        for part in tl.static_range(3):
            acc, l_i, m_i = _fwd_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, bounds[part], bounds[part + 1],
                                      n_q, n_k, left, right, qk_scale, cap_scale,
                                      stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn,
                                      stride_vd, HEAD_DIM, HEAD_DIM_V, DIM_QK, DIM_V, BLOCK_N, part != 1, BAND,
                                      SOFTCAP, USE_EXP2, DESC, DOT_PRECISION)
    else:
        acc, l_i, m_i = _fwd_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, lo, hi, n_q, n_k, left, right,
                                  qk_scale, cap_scale, stride_kb, stride_kh, stride_kn, stride_kd, stride_vb,
                                  stride_vh, stride_vn, stride_vd, HEAD_DIM, HEAD_DIM_V, DIM_QK, DIM_V, BLOCK_N,
                                  True, BAND, SOFTCAP, USE_EXP2, DESC, DOT_PRECISION)

    empty = l_i == 0.0                                                 # rows that saw no key
    l_safe = tl.where(empty, 1.0, l_i)
    if USE_EXP2:
        lse = (m_i + tl.math.log2(l_safe)) * LN2
    else:
        lse = m_i + tl.log(l_safe)
    _store_tile(O, acc / l_safe[:, None], off_b, off_h, row0, n_q, stride_ob, stride_oh, stride_om, stride_od,
                BLOCK_M, HEAD_DIM_V, DESC, DIM_V)
    tl.store(LSE + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh + rows,
             tl.where(empty, float("-inf"), lse), mask=rows < n_q)


# ----------------------------------------------------------------------------------------- backward
@triton.jit
def _bwd_preprocess(O, DO, DELTA, CU_Q,
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    stride_lb, stride_lh, n_q,
                    HEAD_DIM_V: tl.constexpr, DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, VARLEN: tl.constexpr):
    """DELTA[b, h, i] = Σ_d dO[b, h, i, d] · O[b, h, i, d] (fp32, laid out as LSE)."""
    off_b, off_h = _batch_and_head()
    if VARLEN:
        q0, n_q = _sequence(CU_Q, off_b)
        O += q0.to(tl.int64) * stride_om
        DO += q0.to(tl.int64) * stride_dom
        DELTA += q0
    row0 = tl.program_id(0) * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    o = load_tile(O, off_b, off_h, row0, n_q, stride_ob, stride_oh, stride_om, stride_od,
              BLOCK_M, HEAD_DIM_V, True, 0, DIM_V)
    do = load_tile(DO, off_b, off_h, row0, n_q, stride_dob, stride_doh, stride_dom, stride_dod,
               BLOCK_M, HEAD_DIM_V, True, 0, DIM_V)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)      # [BLOCK_M]
    tl.store(DELTA + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh + rows, delta,
             mask=rows < n_q)


@triton.jit
def _row_stats(LSE, DELTA, rows, n_q):
    """The saved log-sum-exp in base 2 and DELTA of rows. A row that saw no key (lse = -inf) and a
    padding row get lse2 = +inf, so that exp2(s - lse2) is 0 there."""
    lse = tl.load(LSE + rows, mask=rows < n_q, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E)
    return lse2, tl.load(DELTA + rows, mask=rows < n_q, other=0.0)


@triton.jit
def _probs(qk, lse2, qk_scale, cap_scale, SOFTCAP: tl.constexpr):
    """Recomputed probabilities exp2(logit - lse2) of raw scores qk ([rows, cols], lse2 broadcast to it),
    and with SOFTCAP t = tanh(qk · cap_scale), whose 1 - t² is d logit / d(qk · sm_scale) (else qk)."""
    if SOFTCAP:
        qk = tanh(qk * cap_scale)
    return tl.math.exp2(qk * qk_scale - lse2), qk


@triton.jit
def _atomic_add_tile(X, tile, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d,
                     ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, DIM: tl.constexpr):
    """X[b, h, row:row + ROWS, :DIM] += tile [ROWS, HEAD_DIM] with fp32 atomic adds (X is fp32): many
    programs add into the same rows. Rows past n_rows and columns past DIM are dropped."""
    rows = row + tl.arange(0, ROWS)
    cols = tl.arange(0, HEAD_DIM)
    ptrs = (X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + rows[:, None].to(tl.int64) * stride_n
            + cols[None, :] * stride_d)
    tl.atomic_add(ptrs, tile, mask=(rows[:, None] < n_rows) & (cols[None, :] < DIM), sem="relaxed")


@triton.jit
def _bwd_dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQ_ACC, off_b, off_h, keys, bounds, n_q, n_k, left, right,
                    sm_scale, qk_scale, cap_scale,
                    stride_qb, stride_qh, stride_qm, stride_qd, stride_dob, stride_doh, stride_dom, stride_dod,
                    stride_ab, stride_ah, stride_am, stride_ad,
                    HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, DIM_QK: tl.constexpr, DIM_V: tl.constexpr,
                    BLOCK_M: tl.constexpr, BAND: tl.constexpr, SOFTCAP: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, ATOMIC_DQ: tl.constexpr, DESC: tl.constexpr):
    """Accumulate dK, dV of one key block (k [BLOCK_N, D], v [BLOCK_N, Dv]) over the query blocks of
    query head off_h that see it; LSE, DELTA: this head's rows. Works on transposed scores sT = k qᵀ:
    [BLOCK_N, BLOCK_M]. Products 1-4 per query block; with ATOMIC_DQ a fifth, the block's share of dQ,
    sm_scale · dS k [BLOCK_M, D], added atomically into DQ_ACC (fp32; scaled here, so that the caller only
    converts).

    ``bounds`` = (lo, a, b, hi) from ``key_range``: one loop over [lo, hi), masking only the blocks
    outside [a, b). Not three loops as in the forward and ``_bwd_dq``: with dK and dV (two accumulators
    of BLOCK_N x D) carried from one loop into the next, ptxas serialises every warpgroup matrix product
    of the kernel (its C7515 "wgmma ... serialized" note), which cost a quarter of the kernel's speed."""
    lo, a, b, hi = bounds
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)                         # [BLOCK_M] query indices
        q = load_tile(Q, off_b, off_h, start_m, n_q, stride_qb, stride_qh, stride_qm, stride_qd,
                  BLOCK_M, HEAD_DIM, True, DESC, DIM_QK)
        do = load_tile(DO, off_b, off_h, start_m, n_q, stride_dob, stride_doh, stride_dom, stride_dod,
                   BLOCK_M, HEAD_DIM_V, True, DESC, DIM_V)
        lse2, delta = _row_stats(LSE, DELTA, rows, n_q)
        p_t, t_t = _probs(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION), lse2[None, :], qk_scale,
                          cap_scale, SOFTCAP)                          # 1: S recomputed, [BLOCK_N, BLOCK_M]
        if (start_m < a) | (start_m >= b):                              # a block on the band's edge
            p_t = tl.where(tl.trans(_visible(rows, keys, n_q, n_k, left, right, BAND)), p_t, 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=DOT_PRECISION)                      # 2: [BLOCK_N, Dv]
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)                          # 3: [BLOCK_N, BLOCK_M]
        ds_t = p_t * (dp_t - delta[None, :])
        if SOFTCAP:
            ds_t = ds_t * (1.0 - t_t * t_t)
        ds_t = ds_t.to(q.dtype)
        dk += tl.dot(ds_t, q, input_precision=DOT_PRECISION)                                   # 4: [BLOCK_N, D]
        if ATOMIC_DQ:
            dq = tl.dot(tl.trans(ds_t), k, input_precision=DOT_PRECISION)                      # 5: [BLOCK_M, D]
            _atomic_add_tile(DQ_ACC, dq * sm_scale, off_b, off_h, start_m, n_q, stride_ab, stride_ah, stride_am,
                             stride_ad, BLOCK_M, HEAD_DIM, DIM_QK)
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV, DQ_ACC, CU_Q, CU_K, sm_scale, qk_scale, cap_scale, left, right,
              stride_qb, stride_qh, stride_qm, stride_qd,
              stride_kb, stride_kh, stride_kn, stride_kd,
              stride_vb, stride_vh, stride_vn, stride_vd,
              stride_dob, stride_doh, stride_dom, stride_dod,
              stride_dkb, stride_dkh, stride_dkn, stride_dkd,
              stride_dvb, stride_dvh, stride_dvn, stride_dvd,
              stride_ab, stride_ah, stride_am, stride_ad,
              stride_lb, stride_lh,
              group, n_q, n_k,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
              HEAD_DIM_V: tl.constexpr, DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BAND: tl.constexpr,
              SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, ATOMIC_DQ: tl.constexpr, DESC: tl.constexpr):
    """dK, dV for one block of BLOCK_N keys of one (batch, KV head), summed over its ``group`` query heads.

    grid = (cdiv(Nk, BLOCK_N), Hkv, B). DK [.., D], DV [.., Dv] laid out as K and V by their strides.
    Without ATOMIC_DQ (the two-kernel design) DQ_ACC is not touched and ``_bwd_dq`` computes dQ. With
    ATOMIC_DQ this is the whole backward in one pass, five matrix products per (query block, key block)
    pair, as FlashAttention-2 and -3 do: dQ added atomically into DQ_ACC (fp32 [B, Hq, Nq, D] by its
    strides, zeroed by the caller, who converts it to the inputs' dtype afterwards). The trade: two
    products fewer per pair (S and dP are not computed a second time), paid for with BLOCK_M · D fp32
    atomic adds per pair and an fp32 buffer the size of Q in global memory. DESC (0 or 2): Q, K, V, DO,
    DK, DV as pointers, or as host-built tensor descriptors (TMA; never with VARLEN; DQ_ACC stays a pointer).
    """
    start_n = tl.program_id(0) * BLOCK_N
    off_b, off_hk = _batch_and_head()
    if VARLEN:
        q0, n_q, k0, n_k, Q, DO, LSE, DELTA, K, V = _backward_sequence(
            CU_Q, CU_K, off_b, Q, DO, LSE, DELTA, K, V, stride_qm, stride_dom, stride_kn, stride_vn)
        DK += k0.to(tl.int64) * stride_dkn
        DV += k0.to(tl.int64) * stride_dvn
        if ATOMIC_DQ:
            DQ_ACC += q0.to(tl.int64) * stride_am
    keys = start_n + tl.arange(0, BLOCK_N)                             # [BLOCK_N] key indices
    k = load_tile(K, off_b, off_hk, start_n, n_k, stride_kb, stride_kh, stride_kn, stride_kd,
              BLOCK_N, HEAD_DIM, True, DESC, DIM_QK)
    v = load_tile(V, off_b, off_hk, start_n, n_k, stride_vb, stride_vh, stride_vn, stride_vd,
              BLOCK_N, HEAD_DIM_V, True, DESC, DIM_V)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V], dtype=tl.float32)

    # The queries that see these keys: the band seen from the keys' side (masked, whole, masked blocks).
    bounds = key_range(start_n, tl.where(start_n < n_k, n_q, 0), n_q - n_k, right, left, BLOCK_N, BLOCK_M)
    for g in range(group):
        off_h = off_hk * group + g
        base = off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh   # this head's LSE, DELTA rows
        dk, dv = _bwd_dkdv_inner(dk, dv, k, v, Q, DO, LSE + base, DELTA + base, DQ_ACC, off_b, off_h, keys,
                                 bounds, n_q, n_k, left, right, sm_scale, qk_scale, cap_scale,
                                 stride_qb, stride_qh, stride_qm, stride_qd, stride_dob, stride_doh,
                                 stride_dom, stride_dod, stride_ab, stride_ah, stride_am, stride_ad,
                                 HEAD_DIM, HEAD_DIM_V, DIM_QK, DIM_V, BLOCK_M, BAND,
                                 SOFTCAP, DOT_PRECISION, ATOMIC_DQ, DESC)
    _store_tile(DK, dk * sm_scale, off_b, off_hk, start_n, n_k, stride_dkb, stride_dkh, stride_dkn, stride_dkd,
                BLOCK_N, HEAD_DIM, DESC, DIM_QK)
    _store_tile(DV, dv, off_b, off_hk, start_n, n_k, stride_dvb, stride_dvh, stride_dvn, stride_dvd,
                BLOCK_N, HEAD_DIM_V, DESC, DIM_V)


@triton.jit
def _bwd_dq_inner(dq, q, do, lse2, delta, K, V, off_b, off_hk, rows, lo, hi, n_q, n_k, left, right,
                  qk_scale, cap_scale,
                  stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                  HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr, DIM_QK: tl.constexpr, DIM_V: tl.constexpr,
                  BLOCK_N: tl.constexpr, MASKED: tl.constexpr, BAND: tl.constexpr, SOFTCAP: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, DESC: tl.constexpr):
    """Accumulate dQ of one query block over key blocks [lo, hi). dq, q: [BLOCK_M, D]; do: [BLOCK_M, Dv]."""
    for start_n in range(lo, hi, BLOCK_N):
        k = load_tile(K, off_b, off_hk, start_n, n_k, stride_kb, stride_kh, stride_kn, stride_kd,
                  BLOCK_N, HEAD_DIM, MASKED, DESC, DIM_QK)
        v = load_tile(V, off_b, off_hk, start_n, n_k, stride_vb, stride_vh, stride_vn, stride_vd,
                  BLOCK_N, HEAD_DIM_V, MASKED, DESC, DIM_V)
        p, t = _probs(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION), lse2[:, None], qk_scale,
                      cap_scale, SOFTCAP)
        if MASKED:
            p = tl.where(_visible(rows, start_n + tl.arange(0, BLOCK_N), n_q, n_k, left, right, BAND), p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)                            # [BLOCK_M, BLOCK_N]
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K, sm_scale, qk_scale, cap_scale, left, right,
            stride_qb, stride_qh, stride_qm, stride_qd,
            stride_kb, stride_kh, stride_kn, stride_kd,
            stride_vb, stride_vh, stride_vn, stride_vd,
            stride_dob, stride_doh, stride_dom, stride_dod,
            stride_dqb, stride_dqh, stride_dqm, stride_dqd,
            stride_lb, stride_lh,
            group, n_q, n_k,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
            HEAD_DIM_V: tl.constexpr, DIM_QK: tl.constexpr, DIM_V: tl.constexpr, BAND: tl.constexpr,
            SOFTCAP: tl.constexpr, VARLEN: tl.constexpr, DESC: tl.constexpr):
    """dQ for one block of BLOCK_M queries of one (batch, head). grid = (cdiv(Nq, BLOCK_M), Hq, B);
    DQ laid out as Q by its strides. DESC as in ``_bwd_dkdv``."""
    start_m = tl.program_id(0)
    off_b, off_h = _batch_and_head()
    if VARLEN:
        q0, n_q, k0, n_k, Q, DO, LSE, DELTA, K, V = _backward_sequence(
            CU_Q, CU_K, off_b, Q, DO, LSE, DELTA, K, V, stride_qm, stride_dom, stride_kn, stride_vn)
        DQ += q0.to(tl.int64) * stride_dqm
    row0 = start_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    q = load_tile(Q, off_b, off_h, row0, n_q, stride_qb, stride_qh, stride_qm, stride_qd,
              BLOCK_M, HEAD_DIM, True, DESC, DIM_QK)
    do = load_tile(DO, off_b, off_h, row0, n_q, stride_dob, stride_doh, stride_dom, stride_dod,
               BLOCK_M, HEAD_DIM_V, True, DESC, DIM_V)
    base = off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh
    lse2, delta = _row_stats(LSE + base, DELTA + base, rows, n_q)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    bounds = key_range(row0, tl.where(row0 < n_q, n_k, 0), n_k - n_q, left, right, BLOCK_M, BLOCK_N)
    for part in tl.static_range(3):                                     # masked, whole, masked key blocks
        dq = _bwd_dq_inner(dq, q, do, lse2, delta, K, V, off_b, off_h // group, rows, bounds[part],
                           bounds[part + 1], n_q, n_k, left, right, qk_scale, cap_scale,
                           stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
                           HEAD_DIM, HEAD_DIM_V, DIM_QK, DIM_V, BLOCK_N, part != 1, BAND, SOFTCAP, DOT_PRECISION,
                           DESC)
    _store_tile(DQ, dq * sm_scale, off_b, off_h, row0, n_q, stride_dqb, stride_dqh, stride_dqm, stride_dqd,
                BLOCK_M, HEAD_DIM, DESC, DIM_QK)


# Public names of the kernels, which dispatch.LAUNCHERS, tests and scripts look up: the same objects; the
# kernels keep their underscore names, which profilers record (bench_flash_profile.csv).
attn_fwd = _attn_fwd
bwd_preprocess = _bwd_preprocess
bwd_dkdv = _bwd_dkdv
bwd_dq = _bwd_dq
