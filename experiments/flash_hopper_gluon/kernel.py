"""A FlashAttention forward for the H100 written in Gluon, Triton's lower-level language, where the
program says itself when a warpgroup matrix product (wgmma) is issued and when it is waited for.

Why: in the Triton kernel every key block runs S = Q Kᵀ, waits for it, computes the softmax, then issues
O += P V; the tensor cores idle while the exponentials run (the compiler puts ``wgmma.wait_group 0``
right after S's product, even when the loop is rewritten to issue the next block's product early).
Here the loop is FlashAttention-3's intra-warpgroup overlap (Shah et al. 2024, §3.2): for block j

    issue S_j = Q K_jᵀ; issue O += P_{j-1} V_{j-1}; wait for S_j only (O's product still runs);
    softmax of S_j (meant to overlap O's product); wait for O; rescale O by exp(m_old - m_new)

(that is the PTX; in the SASS ptxas waits for O's product before the exponentials: README.md)

and K and V tiles arrive by TMA into rings of STAGES buffers, each slot with its own barrier: a slot is
refilled with the block STAGES ahead as soon as the product reading it has finished (K's after S_j,
V's after O's product).

Scope (an experiment, outside the package: ``launch`` checks nothing): sm_90, fp16/bf16, head dim 64
or 128 for q, k and v, contiguous [B, H, N, D] tensors, grouped-query heads, causal aligned to the end
with Nq <= Nk; no window, softcap or packed sequences. Gluon has no interpreter: on a CPU the kernel is
only compiled for sm_90a (tests/analysis/test_experiments.py reads its PTX). Written for Triton 3.6 (the H100
machine's), compiles with 3.9.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from attnkit.kernels.flash.hopper import LN2, descriptor, tma_load


@gluon.jit
def _load(desc, smem, bars, row0, block, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copy of key (or value) block ``block`` into ring slot block % STAGES (none past the
    last block)."""
    slot = block % STAGES
    wanted = block < n_blocks
    mbarrier.expect(bars.index(slot), desc.block_type.nbytes, pred=wanted)
    tma_load(desc, [row0 + block * BLOCK_N, 0], bars.index(slot), smem.index(slot), pred=wanted)


@gluon.jit
def _masked(s, rows, start_n, n_k, shift, CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr,
            s_layout: gl.constexpr):
    """s [BLOCK_M, BLOCK_N] with -inf where key start_n + c is past n_k or (CAUSAL) after row + shift."""
    cols = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    visible = gl.expand_dims(cols < n_k, 0)
    if CAUSAL:
        visible = visible & (gl.expand_dims(cols, 0) <= gl.expand_dims(rows + shift, 1))
    return gl.where(visible, s, float("-inf"))


@gluon.jit
def _attn_fwd_hopper(q_desc, k_desc, v_desc, O, LSE, qk_scale,
                     stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                     n_heads, group, n_q, n_k,
                     BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     CAUSAL: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    """O = softmax(Q Kᵀ · scale) V for BLOCK_M queries of one (batch, head); grid (cdiv(Nq, BLOCK_M), B · H).

    q_desc: [B·H·Nq, D] in [BLOCK_M, D] blocks; k_desc, v_desc: [B·Hkv·Nk, D] in [BLOCK_N, D] blocks.
    qk_scale = softmax scale · log2(e). Rows of Q past its head's end read the next head's rows: their
    results are never stored. Keys past Nk are masked, so the next head's rows they read weigh 0.
    LSE: fp32 natural log-sum-exp per row. Causal programs run longest (last query block) first.
    OVERLAP=False waits for O's product before the softmax: the same kernel without the overlap.
    """
    start_m = gl.program_id(0)
    if CAUSAL:
        start_m = gl.num_programs(0) - 1 - start_m
    off_bh = gl.program_id(1)
    off_b = off_bh // n_heads
    off_h = off_bh % n_heads
    kv_row0 = (off_b * (n_heads // group) + off_h // group) * n_k
    row0 = start_m * BLOCK_M
    shift = n_k - n_q

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    # keys this block reads: all of them, or (causal) up to the last row's diagonal
    hi = n_k
    if CAUSAL:
        hi = gl.minimum(n_k, row0 + BLOCK_M + shift)
    n_blocks = gl.cdiv(hi, BLOCK_N)
    # blocks from first_masked on need a mask (the ragged end; the causal diagonal)
    first_masked = n_k // BLOCK_N
    if CAUSAL:
        first_masked = gl.minimum(first_masked, (row0 + shift + 1) // BLOCK_N)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma_load(q_desc, [off_bh * n_q + row0, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load(k_desc, k_smem, k_bars, kv_row0, i, n_blocks, BLOCK_N, STAGES)
        _load(v_desc, v_smem, v_bars, kv_row0, i, n_blocks, BLOCK_N, STAGES)

    rows = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
    zeros_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

    # block 0: its scores, its softmax; nothing to overlap yet
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bars.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    _load(k_desc, k_smem, k_bars, kv_row0, STAGES, n_blocks, BLOCK_N, STAGES)   # K_0's slot is free
    if first_masked == 0:
        s = _masked(s, rows, 0, n_k, shift, CAUSAL, BLOCK_N, s_layout)
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, 1)
    p_prev = gl.convert_layout(p.to(q_desc.dtype), p_layout)

    for j in range(1, n_blocks):
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
        s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
        if OVERLAP:
            s = warpgroup_mma_wait(1, deps=(s, ))                # S_j is ready; O += P V still runs
        else:
            s, acc, p_prev = warpgroup_mma_wait(0, deps=(s, acc, p_prev))
        _load(k_desc, k_smem, k_bars, kv_row0, j + STAGES, n_blocks, BLOCK_N, STAGES)   # into K_j's slot
        if j >= first_masked:
            s = _masked(s, rows, j * BLOCK_N, n_k, shift, CAUSAL, BLOCK_N, s_layout)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc, p_prev = warpgroup_mma_wait(0, deps=(acc, p_prev))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_prev = gl.convert_layout(p.to(q_desc.dtype), p_layout)
        _load(v_desc, v_smem, v_bars, kv_row0, j - 1 + STAGES, n_blocks, BLOCK_N, STAGES)   # into V_{j-1}'s

    last = (n_blocks - 1) % STAGES
    mbarrier.wait(v_bars.index(last), ((n_blocks - 1) // STAGES) & 1)
    acc = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, ))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    o_rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (O + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
              + gl.expand_dims(o_rows.to(gl.int64) * stride_om, 1) + gl.expand_dims(o_cols, 0))
    gl.store(o_ptrs, o.to(O.dtype.element_ty), mask=gl.expand_dims(o_rows < n_q, 1))
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(LSE + off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh + rows, lse, mask=rows < n_q)


def launch(q, k, v, causal: bool, sm_scale: float, block_m: int = 128, block_n: int = 128, stages: int = 2,
           num_warps: int = 8, overlap: bool = True):
    """(o, lse) of contiguous [B, H, N, D] fp16/bf16 q, k, v on an sm_90 GPU, as the module's scope says
    (nothing is checked: this is an experiment, not a course kernel)."""
    import math

    import torch
    import triton

    batch, n_heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((batch, n_heads, n_q), device=q.device, dtype=torch.float32)
    q_desc = descriptor(q.view(-1, head_dim), block_m)
    k_desc = descriptor(k.view(-1, head_dim), block_n)
    v_desc = descriptor(v.view(-1, head_dim), block_n)
    grid = (triton.cdiv(n_q, block_m), batch * n_heads)
    _attn_fwd_hopper[grid](q_desc, k_desc, v_desc, o, lse, sm_scale / math.log(2),
                           o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1),
                           n_heads, n_heads // k.shape[1], n_q, n_k,
                           BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, CAUSAL=causal, STAGES=stages,
                           OVERLAP=overlap, num_warps=num_warps)
    return o, lse
