"""FlashAttention's backward for the H100, warp-specialised in Gluon as FlashAttention-3 lays out its
backward (Shah et al. 2024, §3 and its backward kernel): dK and dV beside the course's Triton dQ kernel, or
the whole backward in one pass with dQ added by TMA's bulk reductions (or atomic adds).

One program owns GROUPS · PART_N keys of one (batch, KV head) and walks the query blocks that see them:

    producer warp        its K and V parts once, then Q_i and dO_i of every query block (of every query head
                         of the group) by TMA into rings of STAGES slots, with the block's rows of LSE and
                         δ = rowsum(dO ∘ O) beside them, each slot refilled as soon as every compute group
                         has released it (query blocks from the last down: DESCENDING)
    compute groups       (4 warps each, PART_N keys each) per query block i:
                           Sᵀ  = K Q_iᵀ            [PART_N, BLOCK_M]   issued
                           dPᵀ = V dO_iᵀ           [PART_N, BLOCK_M]   issued beside it
                           Pᵀ  = exp2(Sᵀ · scale · log2 e − lse_i · log2 e), masked on the diagonal
                           dV += Pᵀ dO_i           (Pᵀ from registers)  issued
                           dSᵀ = Pᵀ ∘ (dPᵀ − δ_i)
                           dK += dSᵀ Q_i           (dSᵀ from registers) issued, both waited for, slot released

Four matrix products per pair of blocks, as the Triton dK/dV kernel (``triton_kernels._bwd_dkdv``) does; the
difference is who waits for what: the loads never stall the products, and one group's exponentials run
beside the other group's products. dK is scaled by sm_scale at the end.

With ATOMIC_DQ the kernel is the whole backward in one pass (FlashAttention-2/3: five products), dQ added
into a zeroed fp32 buffer:

    compute groups       also store dSᵀ in shared memory, meet at a barrier, and each computes half of the
                         query block's dQ columns over all 128 keys: dQ_i[:, half] += dS_i K[:, half]
    writer partition     (DQ_WRITER) takes each group's half from shared memory and adds it into the buffer
                         while the compute groups go on multiplying: "tma", one warp issuing TMA's bulk
                         reduction (cp.reduce.async.bulk.tensor .add, FlashAttention-3's way), or "atomic",
                         4 warps of fp32 atomic adds, four floats an instruction

So every dQ element gets one addition per program (not one per group), and the additions leave the
compute warps' instruction stream (their measured effect: docs/flash_notes.md, "Rule: dQ by TMA reductions",
and lesson 6). With the TMA writer the one pass is the course's default backward on the H100
(``dispatch.DEFAULT_BACKWARD``).

Scope (``dispatch.gluon_backward_unsupported`` checks it): an sm_90 GPU with Triton's Gluon, fp16/bf16, a head
dim with a ``gluon_backward`` row of ``dispatch.HEAD_DIMS`` (64 or 128) for q, k and v, contiguous
[B, H, N, D] tensors, grouped-query heads, causal aligned to the end with Nq <= Nk; no window, softcap or
packed sequences. Gluon has no interpreter: on a CPU the kernel is only compiled for
sm_90a (tests/kernels/test_flash_hopper_backward.py reads its PTX).

This module holds the kernel and its launch; ``dispatch`` decides where and with which configuration it
runs. Internal API for tests and scripts: ``dkdv`` and ``dkdv_launch`` (one launch with a given
configuration), ``DQ_WRITERS``, ``COMPUTE_REGISTERS``; the kernel as ``attn_bwd_dkdv_ws`` (the public name of
``_attn_bwd_dkdv_ws``, which keeps the name profilers record). ``dkdv`` reads the public name, so a test may
put a stand-in there.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ...device import on_device
from .hopper import descriptor, tma_load
from .runners import RUNNERS

LOG2E = gl.constexpr(1.4426950408889634)
# how the one pass may add dQ: by a writer partition issuing TMA reductions ("tma") or fp32 atomic adds
# ("atomic"), or (None) by the compute groups themselves, with atomic adds (``dispatch.GLUON_DQ_WRITER`` picks)
DQ_WRITERS = (None, "atomic", "tma")
# registers a compute thread may take, by dQ writer: the producer warp and a writer partition (24 registers
# each; 4 warps atomic, 1 warp tma) pad to warp groups of 128 threads, all of them within the SM's 65,536
COMPUTE_REGISTERS = {None: 240, "atomic": 232, "tma": 240}


@builtin
def _tma_add_builder(tensor_desc, coord, src, _semantic=None):
    """``src`` (shared memory) added into the global block of ``tensor_desc`` at ``coord`` by one TMA bulk
    reduction, as Gluon's ``tma.async_atomic_add`` (Triton >= 3.9) does; Triton 3.6's Gluon has the
    builder's operation but no function for it."""
    from triton._C.libtriton import ir

    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


_tma_add = getattr(tma, "async_atomic_add", None) or _tma_add_builder


@gluon.jit
def _bwd_loader(k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                q_full, q_empty, do_full, do_empty, LSE, DELTA, kv_row, head0, n_q, tile0, tile_step, n_tiles,
                n_steps):
    """The producer warp: the program's K and V parts, then Q and dO of step s = (head s // n_tiles, query
    block tile0 + tile_step · (s % n_tiles)) into slot s % STAGES, by TMA, and the block's rows of LSE (in
    base 2; +inf past the head's end, so that those rows weigh 0) and DELTA, by plain loads into shared
    memory, so that the compute groups never wait on global memory. head0: the first query head in B · Hq."""
    GROUPS: gl.constexpr = k_smem.shape[0]
    PART_N: gl.constexpr = k_smem.shape[1]
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    stats_layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    mbarrier.expect(kv_bar, GROUPS * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for part in gl.static_range(GROUPS):
        tma_load(k_desc, [kv_row + part * PART_N, 0], kv_bar, k_smem.index(part))
        tma_load(v_desc, [kv_row + part * PART_N, 0], kv_bar, v_smem.index(part))
    for step in range(n_steps):
        slot = step % STAGES
        free_phase = ((step // STAGES) & 1) ^ 1        # a fresh barrier counts as already released
        row0 = (tile0 + tile_step * (step % n_tiles)) * BLOCK_M
        row = (head0 + step // n_tiles) * n_q + row0
        rows = row0 + gl.arange(0, BLOCK_M, layout=stats_layout)
        mbarrier.wait(q_empty.index(slot), free_phase)
        mbarrier.expect(q_full.index(slot), q_desc.block_type.nbytes)
        tma_load(q_desc, [row, 0], q_full.index(slot), q_smem.index(slot))
        lse = gl.load(LSE + (row.to(gl.int64) + rows - row0), mask=rows < n_q, other=float("inf"))
        lse_smem.index(slot).store(lse * LOG2E)
        mbarrier.arrive(q_full.index(slot), count=1)
        mbarrier.wait(do_empty.index(slot), free_phase)
        mbarrier.expect(do_full.index(slot), do_desc.block_type.nbytes)
        tma_load(do_desc, [row, 0], do_full.index(slot), do_smem.index(slot))
        delta = gl.load(DELTA + (row.to(gl.int64) + rows - row0), mask=rows < n_q, other=0.0)
        delta_smem.index(slot).store(delta)
        mbarrier.arrive(do_full.index(slot), count=1)


@gluon.jit
def _bwd_compute(part: gl.constexpr, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_full, q_empty, do_full,
                 do_empty, ds_ready, dq_smem, dq_full, dq_empty, lse_smem, delta_smem, DK, DV, DQ_ACC, sm_scale,
                 qk_scale, kv_row, start_n, head0, n_q, n_k, tile0, tile_step, n_tiles, n_steps, causal):
    """One compute warp group: keys [start_n + part · PART_N, + PART_N), the loop at the top of this module.
    ``causal`` is a runtime flag here (a partition's arguments arrive as values). lse_smem, delta_smem: the
    slots' rows of LSE (base 2) and DELTA, left by the producer; DK, DV: [B · Hkv · Nk, D] rows, kv_row the
    program's first. With ds_smem (one [PART_N, BLOCK_M] slot per group and step parity; [PART_N, 16]
    slots otherwise) a fifth product per step: the groups put their dSᵀ in shared memory, meet at
    ``ds_ready``, and each computes half of the query block's dQ columns over all the program's keys,
    sm_scale · dS K[:, half], added into DQ_ACC (fp32 [B · Hq · Nq, D] rows) atomically: each dQ element
    gets one addition per program, not one per group.
    With dq_smem (2 · GROUPS slots [BLOCK_M, D / GROUPS]; [16, 16] otherwise) the group leaves its share
    there for the writer partition (``_bwd_dq_writer``, ``_bwd_dq_tma_writer``) instead of adding it itself."""
    PART_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    STAGES: gl.constexpr = q_smem.shape[0]
    BLOCK_M: gl.constexpr = q_smem.shape[1]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(0, s_layout)          # a query block's rows, along Sᵀ's columns
    ATOMIC_DQ: gl.constexpr = ds_smem.shape[2] == BLOCK_M
    GROUPS: gl.constexpr = k_smem.shape[0]
    WRITER: gl.constexpr = dq_smem.shape[0] == 2 * GROUPS
    DQ_COLS: gl.constexpr = HEAD_DIM // GROUPS                     # dQ columns this group adds
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_COLS, 16])
    dq_rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols = part * DQ_COLS + gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, dq_layout))
    shift = n_k - n_q
    key0 = start_n + part * PART_N
    keys = key0 + gl.arange(0, PART_N, layout=gl.SliceLayout(1, s_layout))
    zeros_s = gl.zeros([PART_N, BLOCK_M], gl.float32, s_layout)
    dk = gl.zeros([PART_N, HEAD_DIM], gl.float32, acc_layout)
    dv = gl.zeros([PART_N, HEAD_DIM], gl.float32, acc_layout)
    k = k_smem.index(part)
    v = v_smem.index(part)
    mbarrier.wait(kv_bar, 0)

    for step in range(n_steps):
        slot = step % STAGES
        phase = (step // STAGES) & 1
        row0 = (tile0 + tile_step * (step % n_tiles)) * BLOCK_M
        rows = row0 + gl.arange(0, BLOCK_M, layout=row_layout)
        q = q_smem.index(slot)
        do = do_smem.index(slot)
        mbarrier.wait(q_full.index(slot), phase)
        s_t = warpgroup_mma(k, q.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        mbarrier.wait(do_full.index(slot), phase)
        dp_t = warpgroup_mma(v, do.permute((1, 0)), zeros_s, use_acc=False, is_async=True)
        lse2 = lse_smem.index(slot).load(row_layout)        # base 2; +inf on rows past the head's end
        delta = delta_smem.index(slot).load(row_layout)
        s_t, dp_t = warpgroup_mma_wait(0, deps=(s_t, dp_t))
        p_t = gl.exp2(s_t * qk_scale - gl.expand_dims(lse2, 0))
        if (causal & (row0 + shift < key0 + PART_N - 1)) | (key0 + PART_N > n_k):   # on the diagonal, or past Nk
            seen = (gl.expand_dims(keys, 1) <= gl.expand_dims(rows, 0) + shift) | (not causal)
            p_t = gl.where(seen & gl.expand_dims(keys < n_k, 1), p_t, 0.0)     # keys past Nk: the next head's
        ds_t = (p_t * (dp_t - gl.expand_dims(delta, 0))).to(q.dtype)
        ds16 = gl.convert_layout(ds_t, op_layout)
        p16 = gl.convert_layout(p_t.to(q.dtype), op_layout)
        dv = warpgroup_mma(p16, do, dv, is_async=True)
        dk = warpgroup_mma(ds16, q, dk, is_async=True)
        if ATOMIC_DQ:
            parity = step % 2                       # two sets of slots: a group may run one step ahead
            ds_smem.index(parity * GROUPS + part).store(ds_t)
            fence_async_shared()
            mbarrier.arrive(ds_ready.index(parity), count=1)
            mbarrier.wait(ds_ready.index(parity), (step // 2) & 1)             # every group's dSᵀ is in
            dq = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, dq_layout)
            for other in gl.static_range(GROUPS):                              # dQ[:, half] = Σ_g dS_g K_g[:, half]
                dq = warpgroup_mma(ds_smem.index(parity * GROUPS + other).permute((1, 0)),
                                   k_smem.index(other).slice(part * DQ_COLS, DQ_COLS, dim=1), dq, is_async=True)
            dk, dv, dq, p16, ds16 = warpgroup_mma_wait(0, deps=(dk, dv, dq, p16, ds16))
        else:
            dk, dv, p16, ds16 = warpgroup_mma_wait(0, deps=(dk, dv, p16, ds16))
        mbarrier.arrive(q_empty.index(slot), count=1)
        mbarrier.arrive(do_empty.index(slot), count=1)
        if ATOMIC_DQ and WRITER:
            mbarrier.wait(dq_empty.index(parity), ((step // 2) & 1) ^ 1)     # the writer took the last share
            dq_smem.index(parity * GROUPS + part).store(dq * sm_scale)
            fence_async_shared()                     # a TMA writer reads it through the async proxy
            mbarrier.arrive(dq_full.index(parity), count=1)
        elif ATOMIC_DQ:
            out_rows = row0 + dq_rows
            dq_at = (gl.expand_dims(((head0 + step // n_tiles).to(gl.int64) * n_q + out_rows) * HEAD_DIM, 1)
                     + gl.expand_dims(dq_cols, 0))
            gl.atomic_add(DQ_ACC + dq_at, dq * sm_scale, mask=gl.expand_dims(out_rows < n_q, 1), sem="relaxed")

    out_keys = key0 + gl.arange(0, PART_N, layout=gl.SliceLayout(1, acc_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, acc_layout))
    offsets = (gl.expand_dims((kv_row + part * PART_N + gl.arange(0, PART_N, layout=gl.SliceLayout(1, acc_layout)))
                              .to(gl.int64) * HEAD_DIM, 1) + gl.expand_dims(cols, 0))
    inside = gl.expand_dims(out_keys < n_k, 1)
    gl.store(DK + offsets, (dk * sm_scale).to(DK.dtype.element_ty), mask=inside)
    gl.store(DV + offsets, dv.to(DV.dtype.element_ty), mask=inside)


@gluon.jit
def _bwd_dq_writer(dq_smem, dq_full, dq_empty, DQ_ACC, head0, n_q, tile0, tile_step, n_tiles, n_steps):
    """The writer partition (4 warps): each step's dQ shares, left in dq_smem by the compute groups, added
    into DQ_ACC with fp32 atomic adds, 16 rows at a time, so that the compute groups go on multiplying."""
    SLOTS: gl.constexpr = dq_smem.shape[0]
    BLOCK_M: gl.constexpr = dq_smem.shape[1]
    DQ_COLS: gl.constexpr = dq_smem.shape[2]
    GROUPS: gl.constexpr = SLOTS // 2
    ROWS: gl.constexpr = 16
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 * 4 // DQ_COLS, DQ_COLS // 4], [4, 1], [1, 0])
    rows_in = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols_in = gl.arange(0, DQ_COLS, layout=gl.SliceLayout(0, layout))
    for step in range(n_steps):
        parity = step % 2
        mbarrier.wait(dq_full.index(parity), (step // 2) & 1)
        row0 = (tile0 + tile_step * (step % n_tiles)) * BLOCK_M
        head_rows = (head0 + step // n_tiles).to(gl.int64) * n_q
        for group in gl.static_range(GROUPS):
            for chunk in gl.static_range(BLOCK_M // ROWS):
                rows = row0 + chunk * ROWS + rows_in
                share = dq_smem.index(parity * GROUPS + group).slice(chunk * ROWS, ROWS, dim=0).load(layout)
                at = (gl.expand_dims((head_rows + rows) * (GROUPS * DQ_COLS), 1)
                      + gl.expand_dims(group * DQ_COLS + cols_in, 0))
                gl.atomic_add(DQ_ACC + at, share, mask=gl.expand_dims(rows < n_q, 1), sem="relaxed")
        mbarrier.arrive(dq_empty.index(parity), count=1)


@gluon.jit
def _bwd_dq_tma_writer(dq_desc, dq_smem, dq_full, dq_empty, head0, n_q, tile0, tile_step, n_tiles, n_steps):
    """The writer partition (1 warp) with TMA: each step's dQ shares, left in dq_smem by the compute groups,
    added into DQ_ACC (dq_desc: fp32 [B · Hq · Nq, D] in [BLOCK_M, D / GROUPS] blocks) by one bulk reduction
    each; the slots are released once the TMA has read them. A block's rows past its head's end land in
    the next head's rows (or past the tensor, where the TMA drops them): their dS is exactly 0 (lse = +inf
    gives P = 0), so they add zeros."""
    SLOTS: gl.constexpr = dq_smem.shape[0]
    BLOCK_M: gl.constexpr = dq_smem.shape[1]
    DQ_COLS: gl.constexpr = dq_smem.shape[2]
    GROUPS: gl.constexpr = SLOTS // 2
    for step in range(n_steps):
        parity = step % 2
        mbarrier.wait(dq_full.index(parity), (step // 2) & 1)
        row = (head0 + step // n_tiles) * n_q + (tile0 + tile_step * (step % n_tiles)) * BLOCK_M
        for group in gl.static_range(GROUPS):
            _tma_add(dq_desc, [row, group * DQ_COLS], dq_smem.index(parity * GROUPS + group))
        tma.store_wait(0)                            # the slots are read: the groups may refill them
        mbarrier.arrive(dq_empty.index(parity), count=1)


# one function per compute group: a partition's arguments arrive as values, so its group is fixed here
@gluon.jit
def _bwd_compute_0(k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_full, q_empty, do_full, do_empty, ds_ready,
                   dq_smem, dq_full, dq_empty, lse_smem, delta_smem, DK, DV, DQ_ACC, sm_scale, qk_scale, kv_row,
                   start_n, head0, n_q, n_k, tile0, tile_step, n_tiles, n_steps, causal):
    _bwd_compute(0, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_full, q_empty, do_full, do_empty, ds_ready,
                 dq_smem, dq_full, dq_empty, lse_smem, delta_smem, DK, DV, DQ_ACC, sm_scale, qk_scale, kv_row, start_n,
                 head0, n_q, n_k, tile0, tile_step, n_tiles, n_steps, causal)


@gluon.jit
def _bwd_compute_1(k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_full, q_empty, do_full, do_empty, ds_ready,
                   dq_smem, dq_full, dq_empty, lse_smem, delta_smem, DK, DV, DQ_ACC, sm_scale, qk_scale, kv_row,
                   start_n, head0, n_q, n_k, tile0, tile_step, n_tiles, n_steps, causal):
    _bwd_compute(1, k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_full, q_empty, do_full, do_empty, ds_ready,
                 dq_smem, dq_full, dq_empty, lse_smem, delta_smem, DK, DV, DQ_ACC, sm_scale, qk_scale, kv_row, start_n,
                 head0, n_q, n_k, tile0, tile_step, n_tiles, n_steps, causal)


@gluon.jit
def _attn_bwd_dkdv_ws(q_desc, k_desc, v_desc, do_desc, dq_desc, DK, DV, DQ_ACC, LSE, DELTA, sm_scale, qk_scale,
                      n_heads, group, n_q, n_k,
                      BLOCK_M: gl.constexpr, PART_N: gl.constexpr, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr,
                      STAGES: gl.constexpr, COMPUTE_REGS: gl.constexpr, ATOMIC_DQ: gl.constexpr,
                      DQ_WRITER: gl.constexpr = False, DESCENDING: gl.constexpr = False,
                      GROUPS: gl.constexpr = 2, DQ_TMA: gl.constexpr = False):
    """dK, dV of GROUPS · PART_N keys of one (batch, KV head), summed over its ``group`` query heads; grid
    (cdiv(Nk, GROUPS · PART_N), Hkv, B), 4 warps. q_desc, do_desc: [B·Hq·Nq, D] in [BLOCK_M, D] blocks;
    k_desc, v_desc: [B·Hkv·Nk, D] in [PART_N, D] blocks. Rows of Q and dO past a head's end belong to the
    next head (or are zeros past the tensor): their lse is read as +inf, so they weigh 0; keys past Nk are
    computed and never stored. qk_scale = sm_scale · log2(e). With ATOMIC_DQ the whole backward in one
    pass (five products per step): dQ added into DQ_ACC (fp32 [B·Hq·Nq, D], zeroed by the caller), else
    DQ_ACC is not touched. DQ_WRITER: the additions by a writer partition, of 4 warps with atomic adds, or
    (DQ_TMA) of 1 warp with TMA reductions through dq_desc (DQ_ACC in [BLOCK_M, D / GROUPS] fp32 blocks; any
    descriptor otherwise, unread)."""
    # key blocks vary fastest: programs running together share a head's Q and dO in L2 (the other order,
    # every head's first block first, was slower: docs/flash_notes.md, "Rule: the Gluon backward's grid")
    start_n = gl.program_id(0) * GROUPS * PART_N
    n_heads_kv = n_heads // group
    off_bhk = gl.program_id(2) * n_heads_kv + gl.program_id(1)
    head0 = (off_bhk // n_heads_kv) * n_heads + (off_bhk % n_heads_kv) * group
    first_tile = 0
    if CAUSAL:                                  # query row r sees key c when c <= r + Nk - Nq
        first_tile = gl.maximum(start_n - (n_k - n_q), 0) // BLOCK_M
    n_tiles = gl.cdiv(n_q, BLOCK_M) - first_tile
    tile0 = first_tile                          # the query blocks in order, or (DESCENDING) from the last down:
    tile_step = 1                               # then programs of a head running together visit the same block
    if DESCENDING:                              # at the same time, and share its Q, dO and dQ rows in L2
        tile0 = first_tile + n_tiles - 1
        tile_step = -1
    n_steps = group * n_tiles
    kv_row = off_bhk * n_k + start_n

    k_smem = gl.allocate_shared_memory(k_desc.dtype, [GROUPS] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [GROUPS] + v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    DS_COLS: gl.constexpr = BLOCK_M if ATOMIC_DQ else 16        # without ATOMIC_DQ a stub (4 KB) says so
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([PART_N, DS_COLS], q_desc.dtype)
    ds_smem = gl.allocate_shared_memory(q_desc.dtype, [2 * GROUPS, PART_N, DS_COLS], ds_layout)
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    stats_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], stats_layout)
    DQ_SLOTS: gl.constexpr = 2 * GROUPS if DQ_WRITER else 1      # without DQ_WRITER a stub (1 KB) says so
    DQ_ROWS: gl.constexpr = BLOCK_M if DQ_WRITER else 16
    DQ_COLS: gl.constexpr = HEAD_DIM // GROUPS if DQ_WRITER else 16
    if DQ_TMA:
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_SLOTS, DQ_ROWS, DQ_COLS], dq_desc.layout)
    else:
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_SLOTS, DQ_ROWS, DQ_COLS],
                                            gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    dq_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    dq_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(ds_ready.index(i), count=GROUPS)
        mbarrier.init(dq_full.index(i), count=GROUPS)
        mbarrier.init(dq_empty.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_full.index(i), count=2)             # the TMA's bytes, and the producer's LSE rows
        mbarrier.init(do_full.index(i), count=2)            # the TMA's bytes, and the producer's DELTA rows
        mbarrier.init(q_empty.index(i), count=GROUPS)       # one arrival from each compute group
        mbarrier.init(do_empty.index(i), count=GROUPS)

    compute_args = (k_smem, v_smem, q_smem, do_smem, ds_smem, kv_bar, q_full, q_empty, do_full, do_empty, ds_ready,
                    dq_smem, dq_full, dq_empty, lse_smem, delta_smem, DK, DV, DQ_ACC, sm_scale, qk_scale, kv_row,
                    start_n, head0, n_q, n_k, tile0, tile_step, n_tiles, n_steps, CAUSAL)
    loader_args = (k_desc, v_desc, q_desc, do_desc, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, kv_bar,
                   q_full, q_empty, do_full, do_empty, LSE, DELTA, kv_row, head0, n_q, tile0, tile_step, n_tiles,
                   n_steps)
    if DQ_WRITER and DQ_TMA:
        writer_args = (dq_desc, dq_smem, dq_full, dq_empty, head0, n_q, tile0, tile_step, n_tiles, n_steps)
        gl.warp_specialize([(_bwd_compute_0, compute_args), (_bwd_compute_1, compute_args),
                            (_bwd_loader, loader_args), (_bwd_dq_tma_writer, writer_args)],
                           [4, 1, 1], [COMPUTE_REGS, 24, 24])
    elif DQ_WRITER:
        writer_args = (dq_smem, dq_full, dq_empty, DQ_ACC, head0, n_q, tile0, tile_step, n_tiles, n_steps)
        gl.warp_specialize([(_bwd_compute_0, compute_args), (_bwd_compute_1, compute_args),
                            (_bwd_loader, loader_args), (_bwd_dq_writer, writer_args)],
                           [4, 1, 4], [COMPUTE_REGS, 24, 24])
    else:
        gl.warp_specialize([(_bwd_compute_0, compute_args), (_bwd_compute_1, compute_args),
                            (_bwd_loader, loader_args)], [4, 1], [COMPUTE_REGS, 24])


# The public name of the kernel for tests and scripts: the same object, which ``dkdv`` reads.
attn_bwd_dkdv_ws = _attn_bwd_dkdv_ws


@functools.cache
def _dq_layout(block_m: int, cols: int):
    """The shared-memory layout of a [block_m, cols] fp32 dQ share, built once per shape."""
    return gl.NVMMASharedLayout.get_default_for([block_m, cols], gl.float32)


def _dq_descriptor(dq_acc: torch.Tensor, block_m: int, cols: int):
    """A TMA descriptor over the fp32 dQ buffer as [B · Hq · Nq, D] rows, in [block_m, cols] blocks."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    rows2d = dq_acc.view(-1, dq_acc.shape[-1])
    return TensorDescriptor(rows2d, list(rows2d.shape), list(rows2d.stride()), [block_m, cols],
                            _dq_layout(block_m, cols))


def dkdv(q, k, v, do, lse, delta, causal: bool, sm_scale: float, *, config: tuple, dq_writer, descending: bool,
         dk=None, dv=None, dq_acc=None):
    """(dk, dv) of checked inputs (``dispatch.gluon_backward_unsupported`` gave None; ``do`` contiguous as q):
    lse and delta fp32 [B, Hq, Nq] contiguous (delta = Σ_d dO · O per row), written into dk, dv (k's and v's
    shapes) if given. ``config``: (BLOCK_M, PART_N, STAGES, groups) (``dispatch.gluon_backward_config``).
    With ``dq_acc`` (fp32, q's shape, contiguous, zeroed) dQ is added into it in the same pass, by a writer
    partition (``dq_writer``: "tma" or "atomic", one of ``DQ_WRITERS``) or, with None, by the compute groups.
    ``descending``: each program walks its query blocks from the last down (else from its first up).
    Launched through Triton's JIT once per kind of call, then through the compiled kernel's runner
    (``runners.RUNNERS``)."""
    grid, args, options = dkdv_launch(q, k, v, do, lse, delta, causal, sm_scale, dk, dv, config, dq_acc, dq_writer,
                                      descending)
    with on_device(q.device):
        RUNNERS.launch(attn_bwd_dkdv_ws, grid, args, options, q.device)
    return args[5], args[6]


def dkdv_launch(q, k, v, do, lse, delta, causal, sm_scale, dk, dv, config, dq_acc, dq_writer, descending):
    """(grid, the kernel's arguments in its order, its constexprs and num_warps) for ``dkdv``."""
    if dq_writer not in DQ_WRITERS:
        raise ValueError(f"dq_writer: must be one of {DQ_WRITERS}, got {dq_writer!r}")
    batch, n_heads, n_q, head_dim = q.shape
    n_heads_kv, n_k = k.shape[1], k.shape[2]
    block_m, part_n, stages, groups = config
    writer = dq_writer if dq_acc is not None else None
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    q_desc = descriptor(q.view(-1, head_dim), block_m)
    dq_desc = _dq_descriptor(dq_acc, block_m, head_dim // groups) if writer == "tma" else q_desc
    args = (q_desc, descriptor(k.view(-1, head_dim), part_n), descriptor(v.view(-1, head_dim), part_n),
            descriptor(do.view(-1, head_dim), block_m), dq_desc,
            dk, dv, dk if dq_acc is None else dq_acc, lse, delta, sm_scale, sm_scale / math.log(2), n_heads,
            n_heads // n_heads_kv, n_q, n_k)
    options = dict(BLOCK_M=block_m, PART_N=part_n, HEAD_DIM=head_dim, CAUSAL=causal, STAGES=stages,
                   COMPUTE_REGS=COMPUTE_REGISTERS[writer], ATOMIC_DQ=dq_acc is not None, DQ_WRITER=writer is not None,
                   DESCENDING=descending, GROUPS=groups, DQ_TMA=writer == "tma", num_warps=4)
    return (triton.cdiv(n_k, groups * part_n), n_heads_kv, batch), args, options
