"""Three more of FlashAttention-3's scheduling ideas on the course's warp-specialised forward
(attnkit.kernels.flash.hopper), measured on the H100 (2026-11-26): none was faster. Kept as measured.

Beside the package kernel's layout (one producer warp, two compute warp groups of 64 query rows), three
switches of ``launch``:

- ``pingpong``: the two compute groups take turns to issue their products (per tile: S_0, then S_j
  with P_{j-1} V_{j-1}, then the last P V), through a pair of mbarriers, so that one group's softmax
  runs while the other's products hold the tensor cores (FlashAttention-3 §3.1).
- ``persistent``: one program per SM walks tiles t = p, p + grid, ... (query block t mod n_m of head
  t div n_m, causal ones longest first); its producer loads the next tile's Q and K/V while the compute
  groups finish the last one. For causal attention the grid is the largest count coprime with n_m, so
  that each program steps through every block length in turn.
- ``p_smem``: P goes to shared memory for the P V product instead of staying in registers.
- ``head_group`` (measured on 2026-11-27): the order of the tiles, longest first within groups of that
  many (batch, head) pairs, which tail_model.py predicts fills the SMs more evenly than head by head;
  slower on the H100 (groups of 32: 0.71 of cuDNN at causal 1k against 0.74 head by head; README.md).
- ``order`` (measured on 2026-11-27): one persistent program per SM walking a schedule built on the host
  (``static_schedule``: "list" replays the hardware's scheduling, "lpt" deals the longest tiles first);
  slower than the round-robin ``persistent`` switch (README.md).
- ``one_loop``: the package kernel's key loop (one loop, the mask decided per block) instead of the split
  one; with ``persistent`` it showed that persistence gains at short sequences, which led to the package's
  ``hopper._attn_fwd_persistent`` (README.md).

It also splits each tile's key loop in two (blocks that need no mask, then those that do), so that no
branch sits between issuing a product and waiting for it. Partitions of ``gl.warp_specialize``
receive their arguments as values: a constexpr passed to one arrives as a runtime flag, so the switches
are read from buffer shapes (``turns`` has two barriers with ping-pong, ``p_smem`` two slots with P in
shared memory).

Measured (README.md, ``scheduling_run.csv``): slower than the package kernel in most cases; see the
README for the numbers and for what the SASS says about the overlap inside a warp group.

Internal API: ``_attn_fwd_ws`` (the Gluon kernel) is compiled by ``tests/analysis/test_experiments.py``.
"""
from __future__ import annotations

import functools
import heapq
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from attnkit.device import on_device
from attnkit.kernels.flash.hopper import descriptor, persistent_programs  # the package kernel's host side

# Triton 3.6 names the TMA load async_copy_global_to_shared; later versions async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
LN2 = gl.constexpr(0.6931471805599453)

COMPUTE_REGISTERS = 232          # per thread of the second compute group (the producer warp keeps 24)


@gluon.jit
def _masked_by(s, last_key, start_n, n_k, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """s [M, BLOCK_N] with -inf where key start_n + c is past n_k or past its row's last_key [M]."""
    cols = gl.expand_dims(start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
    return gl.where((cols < n_k) & (cols <= gl.expand_dims(last_key, 1)), s, float("-inf"))


@gluon.jit
def _tile(tile, n_m, n_tiles, head_group, n_heads, n_q, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          causal):
    """(batch, head, first query row, key blocks) of tile ``tile``: with head_group 0, tiles run head by
    head, query blocks in order, causal ones last block (the longest) first; with head_group g > 0, in
    groups of g (batch, head) pairs, each group's tiles by query block, causal ones longest first, the
    group's heads fastest (tail_model.py: the SMs fill more evenly)."""
    bh = tile // n_m
    rank = tile % n_m
    g = gl.maximum(head_group, 1)
    group_start = (tile // (g * n_m)) * g
    heads_here = gl.minimum(g, n_tiles // n_m - group_start)     # the last group may hold fewer
    within = tile - group_start * n_m
    bh = gl.where(head_group > 0, group_start + within % heads_here, bh)
    rank = gl.where(head_group > 0, within // heads_here, rank)
    start_m = gl.where(causal, n_m - 1 - rank, rank)
    row0 = start_m * BLOCK_M
    hi = gl.where(causal, gl.minimum(n_k, row0 + BLOCK_M + n_k - n_q), n_k)
    return bh // n_heads, bh % n_heads, row0, gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _tile_range(starts, n_tiles, scheduled):
    """The indices this program walks: program p takes p, p + grid, ... of n_tiles, or (scheduled) the
    positions starts[p] to starts[p + 1] of a host-built schedule."""
    first = gl.program_id(0)
    last = n_tiles
    if scheduled:
        first = gl.load(starts + gl.program_id(0))
        last = gl.load(starts + gl.program_id(0) + 1)
    return first, last, 1 + (1 - scheduled) * (gl.num_programs(0) - 1)


@gluon.jit
def _tile_at(schedule, i, scheduled):
    """The tile at index i: i itself, or (scheduled) schedule[i]."""
    tile = i
    if scheduled:
        tile = gl.load(schedule + i)
    return tile


@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty,
               n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, group, n_q, n_k, causal):
    """The producer warp, for each of this program's tiles: both query halves (each once its compute group
    has released the last tile's), then every key/value block into the rings, each slot as soon as both
    compute groups have released it (its empty barrier counts two arrivals). A fresh barrier counts as
    released. (Partitions receive their arguments as values: sizes are read from the buffers' shapes.)"""
    HALF_M: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    it = 0                                          # key blocks loaded so far: the rings' position
    done = 0                                        # tiles loaded so far
    first_i, last_i, step_i = _tile_range(starts, n_tiles, scheduled)
    for i in range(first_i, last_i, step_i):
        tile = _tile_at(schedule, i, scheduled)
        off_b, off_h, row0, n_blocks = _tile(tile, n_m, n_tiles, head_group, n_heads, n_q, n_k, 2 * HALF_M, BLOCK_N, causal)
        for half in gl.static_range(2):
            mbarrier.wait(q_empty.index(half), (done & 1) ^ 1)
            mbarrier.expect(q_full.index(half), q_desc.block_type.nbytes)
            _tma_load(q_desc, [(off_b * n_heads + off_h) * n_q + row0 + half * HALF_M, 0], q_full.index(half),
                      q_smem.index(half))
        kv_row0 = (off_b * (n_heads // group) + off_h // group) * n_k
        for j in range(n_blocks):
            slot = (it + j) % STAGES
            free_phase = (((it + j) // STAGES) & 1) ^ 1
            mbarrier.wait(k_empty.index(slot), free_phase)
            mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [kv_row0 + j * BLOCK_N, 0], k_full.index(slot), k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), free_phase)
            mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [kv_row0 + j * BLOCK_N, 0], v_full.index(slot), v_smem.index(slot))
        it += n_blocks
        done += 1


@gluon.jit
def _wait_turn(turns, half: gl.constexpr, step, PINGPONG: gl.constexpr):
    """Ping-pong: compute group ``half`` issues its products of ``step`` only after the other group has
    issued its own of the step before (group 0 of step 0 goes first: its barrier is released at start)."""
    if PINGPONG:
        mbarrier.wait(turns.index(half), step & 1)


@gluon.jit
def _pass_turn(turns, half: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turns.index(1 - half), count=1)


@gluon.jit
def _key_block(q, k_smem, v_smem, k_full, k_empty, v_full, v_empty, turns, half: gl.constexpr, idx, step, start_n,
               zeros_s, acc, p_prev, m_i, l_i, last_key, n_k, qk_scale, MASK, PINGPONG: gl.constexpr,
               P_SMEM: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr, p_layout: gl.constexpr):
    """One key block after the first, the ``idx``-th through the rings: issue S = Q K_blockᵀ and O += P V
    of the block before, wait for S alone, release K, softmax (masked if MASK: a constant in the split loops,
    a runtime flag in the single one), wait for O's product,
    release V, rescale O (the PTX's order; in the SASS ptxas waits for O's product before the softmax:
    README.md). Returns (acc, p for this block, m_i, l_i)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    slot = idx % STAGES
    prev = (idx - 1) % STAGES
    mbarrier.wait(k_full.index(slot), (idx // STAGES) & 1)
    mbarrier.wait(v_full.index(prev), ((idx - 1) // STAGES) & 1)
    _wait_turn(turns, half, step, PINGPONG)
    s = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
    acc = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
    _pass_turn(turns, half, PINGPONG)
    s = warpgroup_mma_wait(1, deps=(s, ))                # S is ready; O += P V still runs
    mbarrier.arrive(k_empty.index(slot), count=1)
    if MASK:
        s = _masked_by(s, last_key, start_n, n_k, BLOCK_N, s_layout)
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    l_i = l_i * alpha + gl.sum(p, 1)
    acc, p_prev = warpgroup_mma_wait(0, deps=(acc, p_prev))
    mbarrier.arrive(v_empty.index(prev), count=1)
    acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    return acc, _p_operand(p, p_prev, P_SMEM, p_layout), m_new, l_i


@gluon.jit
def _p_operand(p, p_prev, P_SMEM: gl.constexpr, p_layout: gl.constexpr):
    """P as the next P V product reads it: in registers, or (P_SMEM) written into the group's shared
    buffer p_prev, so that a product in flight reads no register the softmax could be given."""
    if P_SMEM:
        p_prev.store(p.to(p_prev.dtype))
        fence_async_shared()
        operand = p_prev
    else:
        operand = gl.convert_layout(p.to(p_prev.dtype), p_layout)
    return operand


@gluon.jit
def _ws_compute(half: gl.constexpr, q_smem, k_smem, v_smem, p_smem, q_full, q_empty, k_full, k_empty, v_full,
                v_empty, turns, loops, O, LSE, qk_scale, n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, n_q, n_k, stride_ob, stride_oh, stride_om,
                stride_lb, stride_lh, causal):
    """One compute warp group (4 warps): for each of this program's tiles, rows [row0 + half · HALF_M,
    + HALF_M) of its query block, the overlapped loop described at the top of this module. With PINGPONG
    the two groups take turns to issue their products (per tile: S_0; then S_j with P_{j-1} V_{j-1}; then
    the last P V), so that one group's softmax runs while the other's products hold the tensor cores."""
    HALF_M: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    STAGES: gl.constexpr = k_smem.shape[0]
    PINGPONG: gl.constexpr = turns.shape[0] == 2          # (flags arrive as values: read from the shapes)
    P_SMEM: gl.constexpr = p_smem.shape[0] == 2
    ONE_LOOP: gl.constexpr = loops.shape[0] == 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    zeros_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    q = q_smem.index(half)
    it = 0                                          # key blocks consumed so far: the rings' position
    done = 0                                        # tiles finished so far (turns taken: it + done)
    first_i, last_i, step_i = _tile_range(starts, n_tiles, scheduled)
    for i in range(first_i, last_i, step_i):
        tile = _tile_at(schedule, i, scheduled)
        _, _, row0, n_blocks = _tile(tile, n_m, n_tiles, head_group, n_heads, n_q, n_k, 2 * HALF_M, BLOCK_N, causal)
        step = it + done
        first = row0 + half * HALF_M
        rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
        first_masked = n_k // BLOCK_N               # the first key block that needs a mask
        last_key = gl.full([HALF_M], n_k, gl.int32, gl.SliceLayout(1, s_layout))   # the last key each row sees
        if causal:
            first_masked = gl.minimum(first_masked, (first + n_k - n_q + 1) // BLOCK_N)
            last_key = rows + n_k - n_q
        acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

        mbarrier.wait(q_full.index(half), done & 1)
        mbarrier.wait(k_full.index(it % STAGES), (it // STAGES) & 1)
        _wait_turn(turns, half, step, PINGPONG)
        s = warpgroup_mma(q, k_smem.index(it % STAGES).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        _pass_turn(turns, half, PINGPONG)
        s = warpgroup_mma_wait(0, deps=(s, ))
        mbarrier.arrive(k_empty.index(it % STAGES), count=1)
        if first_masked == 0:
            s = _masked_by(s, last_key, 0, n_k, BLOCK_N, s_layout)
        m_i = gl.max(s, 1) * qk_scale
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
        l_i = gl.sum(p, 1)
        p_prev = _p_operand(p, p_smem.index(half), P_SMEM, p_layout)

        if ONE_LOOP:   # the package kernel's loop: one, the mask decided per block
            for j in range(1, n_blocks):
                acc, p_prev, m_i, l_i = _key_block(q, k_smem, v_smem, k_full, k_empty, v_full, v_empty, turns, half,
                                                   it + j, step + j, j * BLOCK_N, zeros_s, acc, p_prev, m_i, l_i,
                                                   last_key, n_k, qk_scale, j >= first_masked, PINGPONG, P_SMEM,
                                                   s_layout, o_layout, p_layout)
        else:          # two loops, so that no branch sits between issuing P V and waiting for it (tried so
            #            that the softmax could run beside O's product; the SASS shows ptxas waits first: README.md)
            for j in range(1, first_masked):
                acc, p_prev, m_i, l_i = _key_block(q, k_smem, v_smem, k_full, k_empty, v_full, v_empty, turns, half,
                                                   it + j, step + j, j * BLOCK_N, zeros_s, acc, p_prev, m_i, l_i,
                                                   last_key, n_k, qk_scale, False, PINGPONG, P_SMEM, s_layout, o_layout, p_layout)
            for j in range(gl.maximum(first_masked, 1), n_blocks):
                acc, p_prev, m_i, l_i = _key_block(q, k_smem, v_smem, k_full, k_empty, v_full, v_empty, turns, half,
                                                   it + j, step + j, j * BLOCK_N, zeros_s, acc, p_prev, m_i, l_i,
                                                   last_key, n_k, qk_scale, True, PINGPONG, P_SMEM, s_layout, o_layout, p_layout)
        mbarrier.arrive(q_empty.index(half), count=1)           # every product with Q has been waited for

        last = (it + n_blocks - 1) % STAGES
        mbarrier.wait(v_full.index(last), ((it + n_blocks - 1) // STAGES) & 1)
        _wait_turn(turns, half, step + n_blocks, PINGPONG)
        acc = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
        _pass_turn(turns, half, PINGPONG)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(last), count=1)
        off_b, off_h, _, _ = _tile(tile, n_m, n_tiles, head_group, n_heads, n_q, n_k, 2 * HALF_M, BLOCK_N, causal)
        _store_rows(acc, l_i, m_i, O, LSE, off_b, off_h, first, n_q, stride_ob, stride_oh, stride_om,
                    stride_lb, stride_lh, o_layout, s_layout)
        it += n_blocks
        done += 1


@gluon.jit
def _store_rows(acc, l_i, m_i, O, LSE, off_b, off_h, first, n_q, stride_ob, stride_oh, stride_om, stride_lb,
                stride_lh, o_layout: gl.constexpr, s_layout: gl.constexpr):
    """O rows [first, first + HALF_M) = acc / l (those before n_q), and their natural log-sum-exp."""
    HALF_M: gl.constexpr = acc.shape[0]
    HEAD_DIM: gl.constexpr = acc.shape[1]
    o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    o_rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (O + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
              + gl.expand_dims(o_rows.to(gl.int64) * stride_om, 1) + gl.expand_dims(o_cols, 0))
    gl.store(o_ptrs, o.to(O.dtype.element_ty), mask=gl.expand_dims(o_rows < n_q, 1))
    rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(LSE + off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh + rows, lse, mask=rows < n_q)


@gluon.jit
def _ws_compute_0(q_smem, k_smem, v_smem, p_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, turns, loops, O, LSE,
                  qk_scale, n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                  causal):
    _ws_compute(0, q_smem, k_smem, v_smem, p_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, turns, loops, O, LSE,
                qk_scale, n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                causal)


@gluon.jit
def _ws_compute_1(q_smem, k_smem, v_smem, p_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, turns, loops, O, LSE,
                  qk_scale, n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                  causal):
    _ws_compute(1, q_smem, k_smem, v_smem, p_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, turns, loops, O, LSE,
                qk_scale, n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                causal)


@gluon.jit
def _attn_fwd_ws(q_desc, k_desc, v_desc, O, LSE, qk_scale,
                 stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                 n_heads, group, n_q, n_k, n_tiles, head_group, schedule, starts, scheduled,
                 HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 CAUSAL: gl.constexpr, STAGES: gl.constexpr, COMPUTE_REGS: gl.constexpr,
                 PINGPONG: gl.constexpr = False, P_SMEM: gl.constexpr = False, ONE_LOOP: gl.constexpr = False):
    """O = softmax(Q Kᵀ · scale) V by tiles of 2 · HALF_M queries of one (batch, head): n_tiles =
    cdiv(Nq, 2 · HALF_M) · B · H of them, tile t for programs t mod grid (a grid of n_tiles: one tile
    each; a smaller one: persistent programs). 4 warps (the first compute group; the second group and
    the producer warp are the worker partitions). q_desc: [B·H·Nq, D] in [HALF_M, D] blocks; k_desc,
    v_desc: [B·Hkv·Nk, D] in [BLOCK_N, D] blocks. qk_scale = softmax scale · log2(e). Rows of Q past its
    head's end read the next head's rows and are never stored; keys past Nk are masked, so the next
    head's rows they read weigh 0. LSE: fp32 natural log-sum-exp per row."""
    n_m = gl.cdiv(n_q, 2 * HALF_M)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    p_rows: gl.constexpr = HALF_M if P_SMEM else 16      # P's buffers (a token one without P_SMEM)
    p_cols: gl.constexpr = BLOCK_N if P_SMEM else 16
    p_smem = gl.allocate_shared_memory(q_desc.dtype, [2 if P_SMEM else 1, p_rows, p_cols],
                                       gl.NVMMASharedLayout.get_default_for([p_rows, p_cols], q_desc.dtype))
    q_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    TURNS: gl.constexpr = 2 if PINGPONG else 1           # (the partitions read PINGPONG from this shape)
    turns = gl.allocate_shared_memory(gl.int64, [TURNS, 1], mbarrier.MBarrierLayout())
    loops = gl.allocate_shared_memory(gl.int64, [2 if ONE_LOOP else 1, 1], mbarrier.MBarrierLayout())  # a flag
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_full.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(TURNS):
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)       # one arrival from each compute group
        mbarrier.init(v_empty.index(i), count=2)
    if PINGPONG:
        mbarrier.arrive(turns.index(0), count=1)       # group 0 issues first

    compute_args = (q_smem, k_smem, v_smem, p_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, turns, loops, O, LSE,
                    qk_scale, n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb,
                    stride_lh, CAUSAL)
    gl.warp_specialize([
        (_ws_compute_0, compute_args),
        (_ws_compute_1, compute_args),
        (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full,
                      v_empty, n_tiles, head_group, schedule, starts, scheduled, n_m, n_heads, group, n_q, n_k, CAUSAL)),
    ], [4, 1], [COMPUTE_REGS, 24])


def tile_blocks(tile: int, n_m: int, n_q: int, n_k: int, block_m: int, block_n: int, causal: bool) -> int:
    """Key blocks of tile ``tile`` in the head-by-head order (``_tile`` with head_group 0)."""
    rank = tile % n_m
    row0 = ((n_m - 1 - rank) if causal else rank) * block_m
    hi = min(n_k, row0 + block_m + n_k - n_q) if causal else n_k
    return -(-hi // block_n)


def static_schedule(order: str, n_tiles: int, n_m: int, n_q: int, n_k: int, block_m: int, block_n: int,
                    causal: bool, n_programs: int, overhead: float = 1.0) -> tuple[list[int], list[int]]:
    """(schedule, starts): program p runs tiles schedule[starts[p]:starts[p + 1]] in turn. Each tile costs
    its key blocks plus ``overhead`` (its first and last steps, in key blocks) and goes to the program
    with the least work so far (ties: the lowest index), taken in the head-by-head order ("list": the
    hardware's own scheduling of a full grid, replayed on the host) or longest first across all heads
    ("lpt": Graham's longest-processing-time rule, within 4/3 of the best makespan)."""
    tiles = list(range(n_tiles))
    cost = [tile_blocks(t, n_m, n_q, n_k, block_m, block_n, causal) + overhead for t in tiles]
    if order == "lpt":
        tiles.sort(key=lambda t: -cost[t])
    elif order != "list":
        raise ValueError(f"order must be 'list' or 'lpt', got {order!r}")
    loads = [(0.0, p) for p in range(n_programs)]
    runs = [[] for _ in range(n_programs)]
    for t in tiles:
        load, p = heapq.heappop(loads)
        runs[p].append(t)
        heapq.heappush(loads, (load + cost[t], p))
    starts = [0]
    for run in runs:
        starts.append(starts[-1] + len(run))
    return [t for run in runs for t in run], starts


@functools.lru_cache(maxsize=8)
def _no_schedule(device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int32, device=device)


@functools.lru_cache(maxsize=64)
def _schedule_tensors(order, n_tiles, n_m, n_q, n_k, block_m, block_n, causal, n_programs, device):
    schedule, starts = static_schedule(order, n_tiles, n_m, n_q, n_k, block_m, block_n, causal, n_programs)
    return (torch.tensor(schedule, dtype=torch.int32, device=device),
            torch.tensor(starts, dtype=torch.int32, device=device))


def launch(q, k, v, causal: bool, sm_scale: float, half_m: int, block_n: int, stages: int,
           pingpong: bool = False, persistent: bool = False, p_smem: bool = False, head_group: int = 0,
           order: str = "", one_loop: bool = False):
    """(o, lse) of checked inputs with this configuration (tiles of 2 · half_m query rows; one program a
    tile, or persistent programs; ``head_group``: the tiles' order, see ``_tile``; ``order`` "list" or
    "lpt": one persistent program per SM walking a schedule built on the host, ``static_schedule``)."""
    batch, n_heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((batch, n_heads, n_q), device=q.device, dtype=torch.float32)
    q_desc = descriptor(q.view(-1, head_dim), half_m)
    k_desc = descriptor(k.view(-1, head_dim), block_n)
    v_desc = descriptor(v.view(-1, head_dim), block_n)
    n_m = triton.cdiv(n_q, 2 * half_m)
    n_tiles = n_m * batch * n_heads
    grid = n_tiles
    n_sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    if persistent:
        grid = persistent_programs(n_tiles, n_m, causal, n_sms)   # the package's grid (README.md)
    schedule = starts = _no_schedule(q.device)          # (not read unless scheduled)
    if order:
        grid = min(n_sms, n_tiles)
        schedule, starts = _schedule_tensors(order, n_tiles, n_m, n_q, n_k, 2 * half_m, block_n, causal, grid,
                                             q.device)
    with on_device(q.device):
        _attn_fwd_ws[(grid, )](q_desc, k_desc, v_desc, o, lse, sm_scale / math.log(2),
                               o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1),
                               n_heads, n_heads // k.shape[1], n_q, n_k, n_tiles, head_group, schedule, starts,
                               int(bool(order)),
                               HALF_M=half_m, BLOCK_N=block_n, HEAD_DIM=head_dim, CAUSAL=causal, STAGES=stages,
                               COMPUTE_REGS=COMPUTE_REGISTERS, PINGPONG=pingpong, P_SMEM=p_smem, ONE_LOOP=one_loop,
                               num_warps=4)
    return o, lse
