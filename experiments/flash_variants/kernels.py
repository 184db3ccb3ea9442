"""The forward variants that lost on the H100, as they were in attnkit (commit 3863a76,
attnkit/kernels/flash/triton_kernels.py): tensor-descriptor kernels with two interleaved half query tiles
(HALVES), warp specialization (WARP_SPEC) and a hand-pipelined key loop (PIPELINE), on device-built
descriptors (_attn_fwd_desc) and host-built ones (_attn_fwd_host_desc). See README.md for what was
measured. Kept to read and to re-run, not imported by attnkit.
"""
from __future__ import annotations

import triton
import triton.language as tl


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
