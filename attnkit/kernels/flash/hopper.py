"""The FlashAttention forward for the H100 laid out as FlashAttention-3 is, written in Gluon (Triton's
lower-level language, where a program says which warps do what and when a matrix product is waited for).

Why not Triton: in the Triton kernel every warp both issues the copies and computes, and each key block
runs S = Q Kᵀ, waits for it (``wgmma.wait_group 0``), computes the softmax, then issues O += P V, so the
tensor cores idle during the exponentials; the compiler would not keep a product in flight across them.

The layout here (Shah et al. 2024, FlashAttention-3, §3.1–3.2), per query block of GROUPS · HALF_M rows
(GROUPS = 2, or 3 for D = 64 non-causal, as FlashAttention-3 uses at that head dim):

    producer warp        Q parts, then K_j, V_j by TMA into rings of STAGES slots, each slot refilled as
                         soon as every compute group has released it (an "empty" barrier of count GROUPS)
    compute groups       (4 warps each, HALF_M rows each) for block j: issue S_j = Q K_jᵀ, issue
                         O += P_{j-1} V_{j-1}, wait for S_j alone (``wgmma.wait_group 1``), release K_j,
                         softmax, wait for O's product, release V_{j-1}, rescale O

The compute groups share nothing but the K/V slots and synchronise only through those barriers, so one
group's exponentials run beside the others' products. Inside a group the softmax does not overlap its own
O += P V: ptxas moves the wait for every product above the exponentials (read from the SASS by
``attnkit.bench.compiled.softmax_beside_product``). Measured on the H100 in ``bench_flash_hopper.csv``
(lesson 5 and docs/flash_notes.md read it).

Scope (``dispatch.hopper_unsupported`` says it; ``attnkit.kernels.flash.flash_attention_hopper`` checks it):
an sm_90 GPU with Triton's Gluon (Triton 3.6 and later), fp16/bf16, a head dim with a ``gluon_forward`` row
of ``dispatch.HEAD_DIMS`` (64 or 128) for q, k and v, contiguous [B, H, N, D] tensors, grouped-query heads,
causal aligned to the end with Nq <= Nk; no window, softcap or packed sequences; forward only (its
(o, lse) feed the course's backward unchanged). Gluon has no interpreter: on a CPU the kernel is only
compiled for sm_90a (tests/kernels/test_flash_hopper.py reads its PTX and SASS).

This module holds the kernels and their launch; ``dispatch`` decides where and how they run and imports
this module (Gluon may be missing from a Triton: ``dispatch.gluon_module``). Internal API for tests and
scripts: ``launch`` and ``launch_args`` (one launch with a given configuration), ``persistent_programs``, ``tile_of``,
``descriptor`` and ``tma_load``; the kernels as ``attn_fwd_ws`` and ``attn_fwd_persistent`` (public names of
``_attn_fwd_ws`` and ``_attn_fwd_persistent``, which keep the names profilers record:
bench_flash_tile_order_ncu.csv). ``launch`` reads the public names, so a test may put a stand-in there.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ... import validation
from ...device import on_device, sm_count
from .runners import RUNNERS

# Triton 3.6 names the TMA load async_copy_global_to_shared; later versions async_load
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
LN2 = gl.constexpr(0.6931471805599453)

DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
# registers a thread of each worker compute group may take, by number of compute groups (the producer
# warp keeps 24; all of them together fit the SM's 65,536)
COMPUTE_REGISTERS = {2: 232, 3: 160}


@gluon.jit
def _masked_by(s, last_key, start_n, n_k, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
    """s [M, BLOCK_N] with -inf where key start_n + c is past n_k or past its row's last_key [M]."""
    cols = gl.expand_dims(start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout)), 0)
    return gl.where((cols < n_k) & (cols <= gl.expand_dims(last_key, 1)), s, float("-inf"))


@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty,
               q_row, kv_row0, n_blocks):
    """The producer warp: each compute group's query rows, then every key/value block into the rings,
    each slot as soon as every compute group has released it (its empty barrier counts GROUPS arrivals).
    (Partitions receive their arguments as values: the sizes are read from the buffers' shapes.)"""
    HALF_M: gl.constexpr = q_smem.shape[1]
    GROUPS: gl.constexpr = q_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    for half in gl.static_range(GROUPS):
        mbarrier.expect(q_bars.index(half), q_desc.block_type.nbytes)
        tma_load(q_desc, [q_row + half * HALF_M, 0], q_bars.index(half), q_smem.index(half))
    for j in range(n_blocks):
        slot = j % STAGES
        free_phase = ((j // STAGES) & 1) ^ 1          # a fresh barrier counts as already released
        row = kv_row0 + j * BLOCK_N
        mbarrier.wait(k_empty.index(slot), free_phase)
        mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
        tma_load(k_desc, [row, 0], k_full.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), free_phase)
        mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
        tma_load(v_desc, [row, 0], v_full.index(slot), v_smem.index(slot))


@gluon.jit
def _attend(q, q_bar, q_phase, k_smem, v_smem, k_full, k_empty, v_full, v_empty, it, n_blocks, first, n_q, n_k,
            qk_scale, causal):
    """The key loop of one compute group, rows [first, first + HALF_M) of its query block (q: their Q in shared
    memory, there once q_bar reaches q_phase), over n_blocks key blocks taken from the rings at position it (the
    key blocks loaded before this loop): for block j, issue S_j = Q K_jᵀ, issue O += P_{j-1} V_{j-1}, wait for
    S_j alone, release K_j, softmax (masked where a key is past n_k or past the row's causal limit), wait for
    O's product, release V_{j-1}, rescale O. Returns (acc, p_prev, m_i, l_i): the last block's P V not yet added
    (``_last_product``). ``causal`` is a runtime flag (a partition's arguments arrive as values)."""
    HALF_M: gl.constexpr = q.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    STAGES: gl.constexpr = k_smem.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    shift = n_k - n_q
    first_masked = gl.where(causal, gl.minimum(n_k // BLOCK_N, (first + shift + 1) // BLOCK_N), n_k // BLOCK_N)
    rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
    last_key = gl.where(causal, rows + shift, n_k)          # the last key each row sees (or beyond all)
    zeros_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

    mbarrier.wait(q_bar, q_phase)
    mbarrier.wait(k_full.index(it % STAGES), (it // STAGES) & 1)
    s = warpgroup_mma(q, k_smem.index(it % STAGES).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(it % STAGES), count=1)
    if first_masked == 0:
        s = _masked_by(s, last_key, 0, n_k, BLOCK_N, s_layout)
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, 1)
    p_prev = gl.convert_layout(p.to(q.dtype), p_layout)

    for j in range(1, n_blocks):
        slot = (it + j) % STAGES
        prev = (it + j - 1) % STAGES
        mbarrier.wait(k_full.index(slot), ((it + j) // STAGES) & 1)
        s = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        mbarrier.wait(v_full.index(prev), ((it + j - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s, ))      # S_j is ready (ptxas waits for O += P V before the softmax)
        mbarrier.arrive(k_empty.index(slot), count=1)
        if j >= first_masked:
            s = _masked_by(s, last_key, j * BLOCK_N, n_k, BLOCK_N, s_layout)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc, p_prev = warpgroup_mma_wait(0, deps=(acc, p_prev))
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        p_prev = gl.convert_layout(p.to(q.dtype), p_layout)
    return acc, p_prev, m_i, l_i


@gluon.jit
def _last_product(acc, p_prev, v_smem, v_full, v_empty, position):
    """acc + P V of the key block at ring position ``position`` (the loop's last), V released after."""
    STAGES: gl.constexpr = v_smem.shape[0]
    mbarrier.wait(v_full.index(position % STAGES), (position // STAGES) & 1)
    acc = warpgroup_mma(p_prev, v_smem.index(position % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    mbarrier.arrive(v_empty.index(position % STAGES), count=1)
    return acc


@gluon.jit
def _store(acc, m_i, l_i, O, LSE, off_b, off_h, first, n_q, stride_ob, stride_oh, stride_om, stride_lb, stride_lh):
    """O rows [first, first + HALF_M) of (batch, head) = acc / l (those before n_q), and their natural
    log-sum-exp into LSE."""
    HALF_M: gl.constexpr = acc.shape[0]
    HEAD_DIM: gl.constexpr = acc.shape[1]
    o_layout: gl.constexpr = acc.type.layout
    row_layout: gl.constexpr = m_i.type.layout
    o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    o_rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = (O + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
              + gl.expand_dims(o_rows.to(gl.int64) * stride_om, 1) + gl.expand_dims(o_cols, 0))
    gl.store(o_ptrs, o.to(O.dtype.element_ty), mask=gl.expand_dims(o_rows < n_q, 1))
    rows = first + gl.arange(0, HALF_M, layout=row_layout)
    lse = (m_i + gl.log2(l_i)) * LN2
    gl.store(LSE + off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh + rows, lse, mask=rows < n_q)


@gluon.jit
def _ws_compute(half: gl.constexpr, q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty,
                O, LSE, qk_scale, off_b, off_h, row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om,
                stride_lb, stride_lh, causal):
    """One compute warp group (4 warps): rows [row0 + half · HALF_M, + HALF_M) of the program's query
    block, the loop described at the top of this module (``_attend``)."""
    HALF_M: gl.constexpr = q_smem.shape[1]
    first = row0 + half * HALF_M
    acc, p_prev, m_i, l_i = _attend(q_smem.index(half), q_bars.index(half), 0, k_smem, v_smem, k_full, k_empty,
                                    v_full, v_empty, 0, n_blocks, first, n_q, n_k, qk_scale, causal)
    acc = _last_product(acc, p_prev, v_smem, v_full, v_empty, n_blocks - 1)
    _store(acc, m_i, l_i, O, LSE, off_b, off_h, first, n_q, stride_ob, stride_oh, stride_om, stride_lb, stride_lh)


@gluon.jit
def _ws_compute_0(q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, off_b,
                  off_h, row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal):
    _ws_compute(0, q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, off_b,
                off_h, row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal)


@gluon.jit
def _ws_compute_1(q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, off_b,
                  off_h, row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal):
    _ws_compute(1, q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, off_b,
                off_h, row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal)


@gluon.jit
def _ws_compute_2(q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, off_b, off_h,
                  row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal):
    _ws_compute(2, q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, off_b,
                off_h, row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal)


@gluon.jit
def tile_of(program, n_programs, n_m, HEAD_GROUP: gl.constexpr, CAUSAL: gl.constexpr):
    """(batch · head, query block) of a program. The (batch, head) pairs go in groups of HEAD_GROUP;
    within a group, query blocks in turn (causal: the last, the longest, first), the group's heads
    fastest; HEAD_GROUP 1 is head by head. The GPU starts programs roughly in this order, so the order
    decides which tiles are left for the last wave (docs/flash_notes.md, "Rule: tile order")."""
    if HEAD_GROUP == 1:             # its own branch: the general one's divisions cost registers (spills)
        bh = program // n_m
        rank = program % n_m
    else:
        group_start = program // (HEAD_GROUP * n_m) * HEAD_GROUP
        heads_here = min(HEAD_GROUP, n_programs // n_m - group_start)     # the last group may hold fewer
        within = program - group_start * n_m
        bh = group_start + within % heads_here
        rank = within // heads_here
    if CAUSAL:
        rank = n_m - 1 - rank
    return bh, rank


@gluon.jit
def _attn_fwd_ws(q_desc, k_desc, v_desc, O, LSE, qk_scale,
                        stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                        n_heads, group, n_q, n_k,
                        HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                        CAUSAL: gl.constexpr, STAGES: gl.constexpr, COMPUTE_REGS: gl.constexpr,
                        GROUPS: gl.constexpr = 2, HEAD_GROUP: gl.constexpr = 1):
    """O = softmax(Q Kᵀ · scale) V for GROUPS · HALF_M queries of one (batch, head); grid (cdiv(Nq,
    GROUPS · HALF_M) · B · H,), 4 warps (the first compute group; the other groups and the producer warp are
    the worker partitions), programs in the order of ``tile_of``. q_desc: [B·H·Nq, D] in [HALF_M, D] blocks;
    k_desc, v_desc: [B·Hkv·Nk, D] in [BLOCK_N, D] blocks. qk_scale = softmax scale · log2(e). Rows of Q past
    its head's end read the next head's rows and are never stored; keys past Nk are masked, so the next
    head's rows they read weigh 0. LSE: fp32 natural log-sum-exp per row."""
    off_bh, start_m = tile_of(gl.program_id(0), gl.num_programs(0), gl.cdiv(n_q, GROUPS * HALF_M), HEAD_GROUP,
                               CAUSAL)
    off_b = off_bh // n_heads
    off_h = off_bh % n_heads
    kv_row0 = (off_b * (n_heads // group) + off_h // group) * n_k
    row0 = start_m * GROUPS * HALF_M
    hi = n_k
    if CAUSAL:
        hi = gl.minimum(n_k, row0 + GROUPS * HALF_M + n_k - n_q)
    n_blocks = gl.cdiv(hi, BLOCK_N)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, [GROUPS] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [GROUPS, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(GROUPS):
        mbarrier.init(q_bars.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=GROUPS)       # one arrival from each compute group
        mbarrier.init(v_empty.index(i), count=GROUPS)

    compute_args = (q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, off_b,
                    off_h, row0, n_q, n_k, n_blocks, stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
                    CAUSAL)
    loader_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bars, k_full, k_empty, v_full, v_empty,
                   off_bh * n_q + row0, kv_row0, n_blocks)
    if GROUPS == 3:
        gl.warp_specialize([(_ws_compute_0, compute_args), (_ws_compute_1, compute_args),
                            (_ws_compute_2, compute_args), (_ws_loader, loader_args)],
                           [4, 4, 1], [COMPUTE_REGS, COMPUTE_REGS, 24])
    else:
        gl.warp_specialize([(_ws_compute_0, compute_args), (_ws_compute_1, compute_args), (_ws_loader, loader_args)],
                           [4, 1], [COMPUTE_REGS, 24])


@gluon.jit
def _tile(tile, n_m, n_heads, group, n_q, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, causal):
    """(batch, head, first query row, first K/V row, key blocks) of tile ``tile``, head by head, causal
    query blocks longest first (``tile_of``'s order); ``causal`` is a runtime flag here."""
    off_bh = tile // n_m
    rank = tile % n_m
    off_b = off_bh // n_heads
    off_h = off_bh % n_heads
    row0 = gl.where(causal, n_m - 1 - rank, rank) * BLOCK_M
    hi = gl.where(causal, gl.minimum(n_k, row0 + BLOCK_M + n_k - n_q), n_k)
    return off_b, off_h, row0, (off_b * (n_heads // group) + off_h // group) * n_k, gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _persistent_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full,
                       v_empty, n_tiles, n_heads, group, n_q, n_k, causal):
    """The producer warp of a persistent program, tile after tile (t = program, program + grid, ...): each
    group's query rows once that group has released the last tile's, then the key/value blocks into the
    rings, whose positions run on from tile to tile."""
    HALF_M: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    n_m = gl.cdiv(n_q, 2 * HALF_M)
    it = 0                                          # key blocks loaded so far: the rings' position
    done = 0                                        # tiles loaded so far
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_b, off_h, row0, kv_row0, n_blocks = _tile(tile, n_m, n_heads, group, n_q, n_k, 2 * HALF_M, BLOCK_N,
                                                      causal)
        for half in gl.static_range(2):
            mbarrier.wait(q_empty.index(half), (done & 1) ^ 1)      # a fresh barrier counts as released
            mbarrier.expect(q_full.index(half), q_desc.block_type.nbytes)
            tma_load(q_desc, [(off_b * n_heads + off_h) * n_q + row0 + half * HALF_M, 0], q_full.index(half),
                      q_smem.index(half))
        for j in range(n_blocks):
            slot = (it + j) % STAGES
            free_phase = (((it + j) // STAGES) & 1) ^ 1
            row = kv_row0 + j * BLOCK_N
            mbarrier.wait(k_empty.index(slot), free_phase)
            mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
            tma_load(k_desc, [row, 0], k_full.index(slot), k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), free_phase)
            mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
            tma_load(v_desc, [row, 0], v_full.index(slot), v_smem.index(slot))
        it += n_blocks
        done += 1


@gluon.jit
def _persistent_compute(half: gl.constexpr, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full,
                        v_empty, O, LSE, qk_scale, n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh,
                        stride_om, stride_lb, stride_lh, causal):
    """One compute warp group of a persistent program: ``_ws_compute``'s work for each of its tiles, Q
    released as soon as its last product is waited for, so the producer loads the next tile's meanwhile."""
    HALF_M: gl.constexpr = q_smem.shape[1]
    n_m = gl.cdiv(n_q, 2 * HALF_M)
    it = 0                                          # key blocks consumed so far
    done = 0                                        # tiles finished so far
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_b, off_h, row0, _, n_blocks = _tile(tile, n_m, n_heads, group, n_q, n_k, 2 * HALF_M, k_smem.shape[1],
                                                causal)
        first = row0 + half * HALF_M
        acc, p_prev, m_i, l_i = _attend(q_smem.index(half), q_full.index(half), done & 1, k_smem, v_smem, k_full,
                                        k_empty, v_full, v_empty, it, n_blocks, first, n_q, n_k, qk_scale, causal)
        mbarrier.arrive(q_empty.index(half), count=1)       # every product with Q has been waited for
        acc = _last_product(acc, p_prev, v_smem, v_full, v_empty, it + n_blocks - 1)
        _store(acc, m_i, l_i, O, LSE, off_b, off_h, first, n_q, stride_ob, stride_oh, stride_om, stride_lb,
               stride_lh)
        it += n_blocks
        done += 1


@gluon.jit
def _persistent_compute_0(q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE,
                          qk_scale, n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb,
                          stride_lh, causal):
    _persistent_compute(0, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE,
                        qk_scale, n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb,
                        stride_lh, causal)


@gluon.jit
def _persistent_compute_1(q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE,
                          qk_scale, n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb,
                          stride_lh, causal):
    _persistent_compute(1, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE,
                        qk_scale, n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb,
                        stride_lh, causal)


@gluon.jit
def _attn_fwd_persistent(q_desc, k_desc, v_desc, O, LSE, qk_scale, stride_ob, stride_oh, stride_om, stride_lb,
                         stride_lh, n_heads, group, n_q, n_k, n_tiles,
                         HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr,
                         STAGES: gl.constexpr, COMPUTE_REGS: gl.constexpr):
    """``_attn_fwd_ws`` (two compute groups) as persistent programs: program p takes the tiles p, p + grid,
    ... of the n_tiles = cdiv(Nq, 2 · HALF_M) · B · H, in ``tile_of``'s order (head by head). Its producer
    loads a tile's Q and first key blocks while the compute groups finish the tile before, so a tile's
    first and last steps overlap its neighbours' instead of leaving the SM idle between programs."""
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_full.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)       # one arrival from each compute group
        mbarrier.init(v_empty.index(i), count=2)
    compute_args = (q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale,
                    n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, CAUSAL)
    loader_args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty,
                   n_tiles, n_heads, group, n_q, n_k, CAUSAL)
    gl.warp_specialize([(_persistent_compute_0, compute_args), (_persistent_compute_1, compute_args),
                        (_persistent_loader, loader_args)], [4, 1], [COMPUTE_REGS, 24])


# Public names of the kernels for tests and scripts: the same objects, which ``launch`` reads.
attn_fwd_ws = _attn_fwd_ws
attn_fwd_persistent = _attn_fwd_persistent


@functools.cache
def _shared_layout(rows: int, head_dim: int, dtype: torch.dtype):
    """The shared-memory layout of a [rows, head_dim] tile, built once per shape (built at every call it was
    a large part of ``launch``'s own host time: docs/flash_notes.md, "Rule: the Gluon forward's host path")."""
    return gl.NVMMASharedLayout.get_default_for([rows, head_dim], DTYPES[dtype])


def descriptor(t2d: torch.Tensor, rows: int):
    """A TMA descriptor over a [rows_total, D] view moving [rows, D] blocks."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    layout = _shared_layout(rows, t2d.shape[1], t2d.dtype)
    return TensorDescriptor(t2d, list(t2d.shape), list(t2d.stride()), [rows, t2d.shape[1]], layout)


def persistent_programs(n_tiles: int, n_m: int, causal: bool, n_sms: int) -> int:
    """The persistent grid: one program per SM (at most one per tile); causal, the largest such count with
    no factor in common with n_m (the query blocks of a head), so that program p's tiles p, p + grid, ...
    go through every block length in turn instead of always the same few."""
    grid = min(n_sms, n_tiles)
    while causal and grid > 1 and math.gcd(grid, n_m) != 1:
        grid -= 1
    return grid


def launch(q, k, v, causal: bool, sm_scale: float, half_m: int, block_n: int, stages: int, groups: int = 2,
           persistent: bool = False, head_group: int = 1):
    """(o, lse) of checked inputs with this configuration (groups · half_m query rows a tile, in ``groups``
    compute warp groups of half_m rows; one program a tile, tiles ordered by ``head_group`` (1: head by head;
    see ``tile_of``), or ``persistent`` programs, two groups, head by head). ``dispatch.hopper_plan`` picks
    the configuration and ``dispatch.HEAD_GROUP`` the order."""
    if persistent and groups != 2:
        raise ValueError(f"groups: persistent programs run two compute groups, got {groups}")
    if persistent and head_group != 1:
        raise ValueError(f"head_group: persistent programs take the tiles head by head (1), got {head_group}")
    head_group = validation.positive_int("head_group", head_group)
    grid, args, options = launch_args(q, k, v, causal, sm_scale, half_m, block_n, stages, groups, head_group,
                                       persistent)
    kernel = attn_fwd_persistent if persistent else attn_fwd_ws
    with on_device(q.device):
        RUNNERS.launch(kernel, grid, args, options, q.device)   # the JIT once per key (runners.py)
    o, lse = args[3:5]
    return o, lse


def launch_args(q, k, v, causal: bool, sm_scale: float, half_m: int, block_n: int, stages: int, groups: int,
                 head_group: int, persistent: bool = False):
    """(grid, arguments, keyword arguments) of ``attn_fwd_ws`` (or ``attn_fwd_persistent``) for
    ``launch``: the TMA descriptors and the new o, lse among the arguments."""
    batch, n_heads, n_q, head_dim = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((batch, n_heads, n_q), device=q.device, dtype=torch.float32)
    args = (descriptor(q.view(-1, head_dim), half_m), descriptor(k.view(-1, head_dim), block_n),
            descriptor(v.view(-1, head_dim), block_n), o, lse, sm_scale / math.log(2),
            o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1),
            n_heads, n_heads // k.shape[1], n_q, k.shape[2])
    options = dict(HALF_M=half_m, BLOCK_N=block_n, HEAD_DIM=head_dim, CAUSAL=causal, STAGES=stages,
                   COMPUTE_REGS=COMPUTE_REGISTERS[groups])
    n_m = triton.cdiv(n_q, groups * half_m)
    n_tiles = n_m * batch * n_heads
    if persistent:
        grid = persistent_programs(n_tiles, n_m, causal, sm_count(q.device) or n_tiles)
        return (grid,), args + (n_tiles,), dict(options, num_warps=4)
    return (n_tiles,), args, dict(options, GROUPS=groups, HEAD_GROUP=head_group, num_warps=4)
