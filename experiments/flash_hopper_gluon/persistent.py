"""The package's warp-specialised forward (attnkit.kernels.flash_hopper, two compute groups) made
persistent: one program per SM walks the tiles t = p, p + grid, ... in the package's order (head by head,
causal query blocks longest first); its producer warp loads the next tile's Q and K/V while the compute
groups finish the last one, so a tile's first and last steps overlap its neighbours'.

It differs from the package kernel only in that loop: the per-tile code (one key loop, the mask decided
per block, the package's waits) is the package's. ``scheduling.py``'s persistent switch runs on that
module's own loop (split in two, ping-pong plumbing), which spills 100-116 bytes a thread at causal
D = 128 where the package's spills none (``TRITON_INTERPRET=0 python
experiments/flash_hopper_gluon/persistent.py`` prints ptxas's counts for the three); this kernel is the measurement of persistence alone. Run on the H100 with
``scripts/gpu_flash_hopper.py --configs hopper,persistent`` (README.md).
"""
from __future__ import annotations

import math
import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from attnkit.device import on_device
from attnkit.kernels.flash_hopper import COMPUTE_REGISTERS, LN2, _descriptor, _masked_by, _tile_of, _tma_load


@gluon.jit
def _tile(tile, n_m, n_heads, group, n_q, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(batch, head, first query row, first K/V row, key blocks) of tile ``tile`` in the package's order
    (``flash_hopper._tile_of`` head by head)."""
    off_bh, start_m = _tile_of(tile, 0, n_m, 1, CAUSAL)
    off_b = off_bh // n_heads
    off_h = off_bh % n_heads
    row0 = start_m * BLOCK_M
    hi = n_k
    if CAUSAL:
        hi = gl.minimum(n_k, row0 + BLOCK_M + n_k - n_q)
    return off_b, off_h, row0, (off_b * (n_heads // group) + off_h // group) * n_k, gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty,
            n_tiles, n_heads, group, n_q, n_k, causal):
    """The producer warp, tile after tile: each group's query rows (once that group has released the last
    tile's), then the key/value blocks into the rings, which run on across tiles."""
    HALF_M: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    STAGES: gl.constexpr = k_smem.shape[0]
    CAUSAL: gl.constexpr = causal.shape[0] == 2
    n_m = gl.cdiv(n_q, 2 * HALF_M)
    it = 0                                          # key blocks loaded so far: the rings' position
    done = 0                                        # tiles loaded so far
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_b, off_h, row0, kv_row0, n_blocks = _tile(tile, n_m, n_heads, group, n_q, n_k, 2 * HALF_M,
                                                      BLOCK_N, CAUSAL)
        for half in gl.static_range(2):
            mbarrier.wait(q_empty.index(half), (done & 1) ^ 1)      # a fresh barrier counts as released
            mbarrier.expect(q_full.index(half), q_desc.block_type.nbytes)
            _tma_load(q_desc, [(off_b * n_heads + off_h) * n_q + row0 + half * HALF_M, 0], q_full.index(half),
                      q_smem.index(half))
        for j in range(n_blocks):
            slot = (it + j) % STAGES
            free_phase = (((it + j) // STAGES) & 1) ^ 1
            row = kv_row0 + j * BLOCK_N
            mbarrier.wait(k_empty.index(slot), free_phase)
            mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [row, 0], k_full.index(slot), k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), free_phase)
            mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [row, 0], v_full.index(slot), v_smem.index(slot))
        it += n_blocks
        done += 1


@gluon.jit
def _compute(half: gl.constexpr, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE,
             qk_scale, n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh,
             causal):
    """One compute warp group, tile after tile: the package kernel's ``_ws_compute`` for rows
    [row0 + half · HALF_M, + HALF_M) of each tile, its ring positions running on across tiles."""
    HALF_M: gl.constexpr = q_smem.shape[1]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_DIM: gl.constexpr = k_smem.shape[2]
    STAGES: gl.constexpr = k_smem.shape[0]
    CAUSAL: gl.constexpr = causal.shape[0] == 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    n_m = gl.cdiv(n_q, 2 * HALF_M)
    shift = n_k - n_q
    zeros_s = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    q = q_smem.index(half)
    it = 0                                          # key blocks consumed so far
    done = 0                                        # tiles finished so far
    for tile in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_b, off_h, row0, _, n_blocks = _tile(tile, n_m, n_heads, group, n_q, n_k, 2 * HALF_M, BLOCK_N, CAUSAL)
        first = row0 + half * HALF_M
        first_masked = n_k // BLOCK_N                  # the first key block that needs a mask
        last_key = gl.full([HALF_M], n_k, gl.int32, gl.SliceLayout(1, s_layout))   # the last key a row sees
        if CAUSAL:
            first_masked = gl.minimum(first_masked, (first + shift + 1) // BLOCK_N)
            last_key = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout)) + shift
        acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)

        mbarrier.wait(q_full.index(half), done & 1)
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
            s = warpgroup_mma_wait(1, deps=(s, ))
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
        mbarrier.arrive(q_empty.index(half), count=1)       # every product with Q has been waited for

        last = (it + n_blocks - 1) % STAGES
        mbarrier.wait(v_full.index(last), ((it + n_blocks - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(v_empty.index(last), count=1)

        rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))
        o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
        o_rows = first + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, o_layout))
        o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        o_ptrs = (O + off_b.to(gl.int64) * stride_ob + off_h.to(gl.int64) * stride_oh
                  + gl.expand_dims(o_rows.to(gl.int64) * stride_om, 1) + gl.expand_dims(o_cols, 0))
        gl.store(o_ptrs, o.to(O.dtype.element_ty), mask=gl.expand_dims(o_rows < n_q, 1))
        lse = (m_i + gl.log2(l_i)) * LN2
        gl.store(LSE + off_b.to(gl.int64) * stride_lb + off_h.to(gl.int64) * stride_lh + rows, lse, mask=rows < n_q)
        it += n_blocks
        done += 1


@gluon.jit
def _compute_0(q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, n_tiles,
               n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal):
    _compute(0, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, n_tiles,
             n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal)


@gluon.jit
def _compute_1(q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, n_tiles,
               n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal):
    _compute(1, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale, n_tiles,
             n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal)


@gluon.jit
def _attn_fwd_persistent(q_desc, k_desc, v_desc, O, LSE, qk_scale, stride_ob, stride_oh, stride_om, stride_lb,
                         stride_lh, n_heads, group, n_q, n_k, n_tiles,
                         HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, CAUSAL: gl.constexpr,
                         STAGES: gl.constexpr, COMPUTE_REGS: gl.constexpr):
    """The package kernel's ``_attn_fwd_ws`` (two compute groups) over tiles t = p, p + grid, ... of
    n_tiles = cdiv(Nq, 2 · HALF_M) · B · H; a grid of n_tiles is the package kernel's launch."""
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
    # partitions receive their arguments as values: CAUSAL travels as this token buffer's shape
    causal = gl.allocate_shared_memory(gl.int64, [2 if CAUSAL else 1, 1], mbarrier.MBarrierLayout())
    compute_args = (q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty, O, LSE, qk_scale,
                    n_tiles, n_heads, group, n_q, n_k, stride_ob, stride_oh, stride_om, stride_lb, stride_lh, causal)
    gl.warp_specialize([
        (_compute_0, compute_args),
        (_compute_1, compute_args),
        (_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_full, q_empty, k_full, k_empty, v_full, v_empty,
                   n_tiles, n_heads, group, n_q, n_k, causal)),
    ], [4, 1], [COMPUTE_REGS, 24])


def grid_size(n_tiles: int, n_m: int, causal: bool, n_sms: int) -> int:
    """One program per SM (at most one per tile); causal: the largest such count with no factor in common
    with n_m, so that each program steps through every query block's length in turn."""
    grid = min(n_sms, n_tiles)
    while causal and grid > 1 and math.gcd(grid, n_m) != 1:
        grid -= 1
    return grid


def launch(q, k, v, causal: bool, sm_scale: float, half_m: int = 64, block_n: int = 128, stages: int = 2,
           persistent: bool = True):
    """(o, lse) of checked inputs (as flash_hopper._launch takes them, two compute groups); ``persistent``
    False: one program a tile, the package kernel's launch through this loop."""
    batch, n_heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((batch, n_heads, n_q), device=q.device, dtype=torch.float32)
    n_m = triton.cdiv(n_q, 2 * half_m)
    n_tiles = n_m * batch * n_heads
    grid = n_tiles
    if persistent:
        grid = grid_size(n_tiles, n_m, causal, torch.cuda.get_device_properties(q.device).multi_processor_count)
    with on_device(q.device):
        _attn_fwd_persistent[(grid, )](
            _descriptor(q.view(-1, head_dim), half_m), _descriptor(k.view(-1, head_dim), block_n),
            _descriptor(v.view(-1, head_dim), block_n), o, lse, sm_scale / math.log(2),
            o.stride(0), o.stride(1), o.stride(2), lse.stride(0), lse.stride(1),
            n_heads, n_heads // k.shape[1], n_q, n_k, n_tiles,
            HALF_M=half_m, BLOCK_N=block_n, HEAD_DIM=head_dim, CAUSAL=causal, STAGES=stages,
            COMPUTE_REGS=COMPUTE_REGISTERS[2], num_warps=4)
    return o, lse


def spills() -> list[str]:
    """ptxas's registers and spills, sm_90a, fp16, HALF_M 64 × BLOCK_N 128, 2 stages: this kernel beside
    the package's and scheduling.py's persistent variant (compiled on any machine)."""
    import sys

    from attnkit.bench.compiled import compile_gluon_ptx, ptxas_report
    from attnkit.kernels import flash_hopper

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import scheduling

    lines = []
    blocks = dict(q_desc=64, k_desc=128, v_desc=128)
    for d, causal in ((128, True), (128, False), (64, True)):
        common = dict(HALF_M=64, BLOCK_N=128, HEAD_DIM=d, CAUSAL=causal, STAGES=2)
        kernels = (("package", flash_hopper._attn_fwd_ws, dict(COMPUTE_REGS=COMPUTE_REGISTERS[2]), ()),
                   ("persistent.py", _attn_fwd_persistent, dict(COMPUTE_REGS=COMPUTE_REGISTERS[2]), ("n_tiles",)),
                   ("scheduling.py, one loop", scheduling._attn_fwd_ws,
                    dict(COMPUTE_REGS=scheduling.COMPUTE_REGISTERS, ONE_LOOP=True),
                    ("n_tiles", "head_group", "scheduled")))
        for name, kernel, extra, any_size in kernels:
            report = ptxas_report(compile_gluon_ptx(kernel, {**common, **extra}, blocks, 4,
                                                    any_size=("n_heads", "group", "n_q", "n_k") + any_size))
            lines.append(f"D={d} causal={causal!s:5} {name:24} registers {report.registers} "
                         f"spills {report.spill_bytes} B")
    return lines


if __name__ == "__main__":      # TRITON_INTERPRET=0 PYTHONPATH=. python experiments/flash_hopper_gluon/persistent.py
    print("\n".join(spills()))
