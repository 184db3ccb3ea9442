"""Paged decode attention in Triton: one new query token per sequence, its K/V cache stored in pages.

Public functions
- ``paged_decode(q, k_pages, v_pages, block_table, seq_lens, *, sm_scale=None, num_splits=None,
  variant="grouped", window=(-1, -1)) -> o``: attention of each sequence's new token over its cached
  tokens (with ``window=(left, _)``, over its last left + 1 tokens only, as Mistral's and Gemma 2's
  local layers; pages wholly before the window are never read).
- ``merge_partials(m, l, z) -> o``: the (m, ℓ, z) merge rule of lesson 3 in PyTorch, over a split axis.
- ``gather_dense(k_pages, v_pages, block_table, seq_lens) -> (k, v)``: copy each sequence's pages into
  dense [B, Hkv, L, D] and [B, Hkv, L, Dv] tensors (the correctness checkpoint: gather, then ordinary
  attention).
- ``paged_decode_ref(q, k_pages, v_pages, block_table, seq_lens, sm_scale=None)``: the float64
  reference, token by token through the page table.
- ``check_paged_inputs(...)``: the ValueErrors; ``choose_num_splits(...)``: the split heuristic;
  ``launch(...)``: the kernels on inputs already checked (what the benchmarks time); ``new_buffer(shape,
  dtype, device)``: where every output and workspace buffer comes from (tests and scripts/gpu_paged.py
  replace it to hand out NaN-filled or guarded buffers).

Shapes
- q: [B, Hq, D], the one new token of each of B sequences;
- k_pages: [num_pages, page_size, Hkv, D] and v_pages: [num_pages, page_size, Hkv, Dv], any strides;
  Hq % Hkv == 0 and query head h reads KV head h // (Hq // Hkv);
- block_table: int32 [B, max_pages]; sequence b's token t lives in page block_table[b, t // page_size]
  at offset t % page_size; entries past a sequence's last page are never read (any value);
- seq_lens: int32 [B], 1 <= seq_lens[b] <= max_pages * page_size;
- o: [B, Hq, Dv] in q's dtype. fp16, bf16 and fp32; any D and Dv from 8 to 256, as the dense kernel
  takes them: the kernels hold each head dim in registers as one tile of a power of two (tl.arange's
  sizes are powers of two) or, where two cover it with fewer columns, as two (80 and 96: 64 + 32; 192:
  128 + 64; ``head_dim_tiles``), with loads and stores masked to the real D and Dv.
- An FP8 cache (as ``paged_extend``'s): k_pages, v_pages of dtype float8_e4m3fn holding K / k_scale and
  V / v_scale, with ``k_scale``, ``v_scale`` fp32 [Hkv] (one per KV head, ``fp8_cache.fp8_scales``).
  The kernel reads the fp8 bytes (half of fp16's), converts them to q's dtype in registers, multiplies
  the scores by k_scale and the output by v_scale (both constant over a KV head's tokens).

Variants (``variant=``)
- "grouped": one program per (sequence, KV head, split) holds the Hq/Hkv query heads that share the
  KV head as the rows of one tile, so each K/V row is read once and the scores are a matrix product
  (tensor cores at decode);
- "per_head": one program per (sequence, query head, split), a vector-times-matrix without tensor
  cores; each K/V row is read once per query head of its group (the simpler kernel, for comparison).

Split-KV (flash-decoding): with ``num_splits`` S > 1, each sequence's tokens are cut into S chunks
processed by separate programs; each writes its partial state (m, ℓ, z) (m the natural-log running
maximum, ℓ the sum of exponentials, z the unnormalised output) to one fp32 workspace, and a merge
kernel combines them with the rule of lesson 3. ``num_splits=None`` picks S with ``choose_num_splits``
(more programs when B·Hkv is too small to fill the GPU).

Every tensor argument may have any strides (a view, an expanded or offset tensor): the kernels read
each through its strides.

The host's work per call (an eager call at B = 1 is mostly host time): the first call of each kind
(shapes, strides, dtypes, devices and options: ``paged_plans.plan_key``) checks the shapes and decides the
launch (splits, block sizes, grid) into a plan (``paged_plans``); a later call of the same kind checks again
only the values (``check_values``), allocates the output (with splits, one workspace too) and launches through
``runners.RUNNERS`` (the kept compiled kernel, without Triton's JIT in between). With
``check_values="device"`` one program of the decode kernel checks the page table, the lengths and the
scales itself and updates the device's state of ``value_checks``: no PyTorch operation, no extra launch,
no synchronisation. So an eager call is one launch (two with splits) and one allocation (two).

Where it runs: as every kernel of the course, by ``attnkit.device.kernel_device``: CUDA tensors run
compiled kernels; on a machine without a GPU, CPU tensors run the same kernels in Triton's
interpreter, with bf16 computed in fp32 and rounded (the interpreter's bf16 is not faithful); CPU
tensors on a machine with a GPU are computed on the GPU and copied back.

The parts, each in its own module beside this one: the input checks (``paged_checks``), every rule that
picks a launch configuration (``paged_dispatch``) and the launch plans (``paged_plans``); this module holds
the Triton kernels, the launch and the public functions, and re-exports the names of the other three.

Internal API for tests and scripts: the kernels as ``paged_kernel`` (decode, with or without splits) and
``merge_splits_kernel`` (the splits' merge), public names of ``_paged_kernel`` and ``_merge_splits_kernel``
(the names profilers record), which ``_run`` launches.
"""
from __future__ import annotations

import torch

from .. import validation
from ..device import ensure_triton_backend, on_device, sm_count, to_kernel_device, triton_interprets
from . import paged_plans, value_checks
from .flash.runners import RUNNERS, keep_recent
from .fp8_cache import FP8, fp8_read

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .input_checks import check_window  # noqa: E402

# re-exported: ``paged.X`` is where the course, its tests and scripts find each of these names
from .paged_checks import (  # noqa: E402,F401
    CACHE_DTYPES,
    MAX_HEAD_DIM,
    MAX_SPLITS,
    MIN_HEAD_DIM,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    VARIANTS,
    check_paged_inputs,
    check_shapes,
    check_splits,
    check_values_on_host,
    check_values_option,
    check_variant,
)
from .paged_dispatch import (  # noqa: E402,F401
    GPU_CONFIGS,
    INTERPRETER_CONFIG,
    LaunchConfig,
    default_config,
    head_dim_class,
    head_dim_tiles,
    padded,
    row_alignment,
)
from .paged_plans import LOG2E, MAX_PLANS, Plan, make_plan, plan_key  # noqa: E402,F401
from .value_checks import raise_pending_errors  # noqa: E402,F401

CODE = paged_plans.CODE                                          # this kernel's index in value_checks.KERNELS
LN2 = tl.constexpr(0.6931471805599453)                           # ln(2): m back to natural-log units


# ------------------------------------------------------------------------------------------- kernels
@triton.jit
def _aligned(rows, ALIGN: tl.constexpr):
    """``rows`` (row offsets, each a multiple of ALIGN: ``row_alignment``) in a form that tells Triton so,
    so that a row is read in vectors of up to 16 bytes. Triton itself knows only which strides are
    multiples of 16, and without the hint rows of D = 120 (strides multiples of 8) were read one element
    at a time, not asynchronously, with kilobytes of spills (docs/paged_notes.md, "What the compiled
    code showed").
    ``tl.multiple_of`` on the sum did not survive Triton's rewriting of it; a product by ALIGN does."""
    if ALIGN < 16:          # at 16 Triton knows it already: it specialises each stride divisible by 16
        if ALIGN > 1:
            rows = (rows // ALIGN) * ALIGN              # the same values; the product tells Triton
    return rows


@triton.jit
def _load_rows(ptr, rows, stride_d, valid, DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """[len(rows), BLOCK_D] elements at ptr + rows[:, None] + d·stride_d; rows not ``valid`` and the
    columns d >= DIM (the padding to a power of two) read as zeros and touch no memory."""
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = ptr + rows[:, None] + offs_d[None, :] * stride_d
    if DIM >= BLOCK_D:
        mask = valid[:, None]
    else:
        mask = valid[:, None] & (offs_d[None, :] < DIM)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _kv_rows(bt_row, tok, valid, kv, num_pages, stride_btp, stride_kp, stride_ks, stride_kh,
             stride_vp, stride_vs, stride_vh, PAGE_SIZE: tl.constexpr, K_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr):
    """The offsets of the K and V rows of KV head kv for the tokens ``tok`` of one sequence, found through
    its row of the page table (token t: page bt_row[t // PAGE_SIZE], slot t % PAGE_SIZE); tokens not
    ``valid`` read no table entry (and, masked, touch no page)."""
    page = tl.load(bt_row + (tok // PAGE_SIZE) * stride_btp, mask=valid, other=0)   # physical page
    page = tl.where((page >= 0) & (page < num_pages), page, 0)          # a bad id reads page 0, no fault
    slot = tok % PAGE_SIZE                                               # offset inside the page
    k_rows = _aligned(page.to(tl.int64) * stride_kp + slot * stride_ks + kv * stride_kh, K_ALIGN)
    v_rows = _aligned(page.to(tl.int64) * stride_vp + slot * stride_vs + kv * stride_vh, V_ALIGN)
    return k_rows, v_rows


@triton.jit
def _scores(q, k, GROUPED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """q [BLOCK_G, d] · kᵀ: by tl.dot (tensor cores) when GROUPED, else by multiply-and-sum."""
    if GROUPED:   # fp32 inputs: "ieee" products (tf32 misses the fp32 bound at long contexts)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    else:
        s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2)
    return s


@triton.jit
def _weighted(p, v, GROUPED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """p [BLOCK_G, BLOCK_N] · v [BLOCK_N, d] in fp32."""
    if GROUPED:
        pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    else:
        pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], 1)
    return pv


@triton.jit
def _to_compute(x, valid, dtype, SCALED: tl.constexpr, SELECT: tl.constexpr):
    """An FP8 cache's rows converted to q's dtype (others unchanged). SELECT (V): the select, a no-op since
    those rows loaded as zeros, keeps the conversion in the loaded layout, rows contiguous along d: without
    it Triton converts after moving V into p·v's operand layout, where a thread's elements run down the
    tokens, and reads V's fp8 from shared memory one byte at a time (docs/paged_notes.md, "What the
    compiled code showed")."""
    if SCALED:
        if SELECT:
            x = tl.where(valid[:, None], x.to(dtype), 0.0)
        else:
            x = x.to(dtype)
    return x


@triton.jit
def _check_values(bt_ptr, lens_ptr, k_scale_ptr, v_scale_ptr, state_ptr, batch, num_pages, max_len, n_kv,
                  stride_btb, stride_btp, stride_lens,
                  PAGE_SIZE: tl.constexpr, SCALED: tl.constexpr, BLOCK_KV: tl.constexpr, CODE: tl.constexpr,
                  N_KERNELS: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr):
    """check_values="device" in one program: the ``value_checks.RULES`` bits this call's values break
    (1: a length outside 1 .. max_len = max_pages·PAGE_SIZE; 2: a used table entry outside [0, num_pages);
    4: a scale that is not finite and > 0), recorded in the device's state in value_checks' layout
    (first bad call's code, bad calls, first bad call's rules, calls). Calls on one stream run in
    order and only this program of a call touches the state, so nothing races."""
    bad_len = tl.zeros([BLOCK_B], tl.int32)
    bad_page = tl.zeros([BLOCK_B], tl.int32)
    for b0 in range(0, batch, BLOCK_B):
        rows = b0 + tl.arange(0, BLOCK_B)
        row_ok = rows < batch
        lens = tl.load(lens_ptr + rows * stride_lens, mask=row_ok, other=1)
        bad_len = tl.maximum(bad_len, (row_ok & ((lens < 1) | (lens > max_len))).to(tl.int32))
        used_pages = (tl.minimum(tl.maximum(lens, 0), max_len) + PAGE_SIZE - 1) // PAGE_SIZE
        used_pages = tl.where(row_ok, used_pages, 0)
        for p0 in range(0, tl.max(used_pages, 0), BLOCK_P):
            cols = p0 + tl.arange(0, BLOCK_P)
            used = row_ok[:, None] & (cols[None, :] < used_pages[:, None])
            ids = tl.load(bt_ptr + rows[:, None] * stride_btb + cols[None, :] * stride_btp, mask=used, other=0)
            bad = used & ((ids < 0) | (ids >= num_pages))
            bad_page = tl.maximum(bad_page, tl.max(bad.to(tl.int32), 1))
    rules = (tl.max(bad_len, 0) > 0).to(tl.int64) + 2 * (tl.max(bad_page, 0) > 0).to(tl.int64)
    if SCALED:
        heads = tl.arange(0, BLOCK_KV)
        ok = heads < n_kv
        ks = tl.load(k_scale_ptr + heads, mask=ok, other=1.0)
        vs = tl.load(v_scale_ptr + heads, mask=ok, other=1.0)
        good = (ks > 0) & (ks < float("inf")) & (vs > 0) & (vs < float("inf"))   # NaN fails both tests
        rules = rules + 4 * (tl.max((ok & ~good).to(tl.int32), 0) > 0).to(tl.int64)
    calls = tl.load(state_ptr + 3)
    bad_call = rules != 0
    take = bad_call & (tl.load(state_ptr) < 0)                          # the first bad call since the read
    tl.store(state_ptr, calls * N_KERNELS + CODE, mask=take)
    tl.store(state_ptr + 2, rules, mask=take)
    tl.store(state_ptr + 1, tl.load(state_ptr + 1) + bad_call.to(tl.int64))
    tl.store(state_ptr + 3, calls + 1)


@triton.jit
def _store_cols(rows, x, row_ok, DIM: tl.constexpr, BLOCK: tl.constexpr, FIRST: tl.constexpr):
    """x [BLOCK_G, BLOCK] into columns FIRST .. FIRST + BLOCK - 1 of the rows at ``rows`` (those < DIM),
    in the rows' element type."""
    cols = FIRST + tl.arange(0, BLOCK)
    tl.store(rows[:, None] + cols[None, :], x.to(rows.dtype.element_ty), mask=row_ok[:, None] & (cols[None, :] < DIM))


@triton.jit
def _paged_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, k_scale_ptr, v_scale_ptr, state_ptr,
        qk_scale, tokens_per_split, num_pages, max_len, window_left, batch, n_kv,
        stride_qb, stride_qh, stride_qd,
        stride_kp, stride_ks, stride_kh, stride_kd,
        stride_vp, stride_vs, stride_vh, stride_vd,
        stride_btb, stride_btp, stride_lens,
        stride_ob, stride_oh, stride_os,
        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, DIM_QK: tl.constexpr, DIM_V: tl.constexpr,
        BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_D2: tl.constexpr, BLOCK_DV2: tl.constexpr,
        PAGE_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, GROUPED: tl.constexpr, DOT_PRECISION: tl.constexpr,
        SCALED: tl.constexpr, CHECK: tl.constexpr, BLOCK_KV: tl.constexpr, CODE: tl.constexpr,
        N_KERNELS: tl.constexpr, Q_ALIGN: tl.constexpr, K_ALIGN: tl.constexpr, V_ALIGN: tl.constexpr):
    """One program: sequence b, tokens [split·tokens_per_split, ...) of it, and the query heads of
    program_id(0) as the rows of q [BLOCK_G, BLOCK_D]:

    - GROUPED: the GROUP query heads kv·GROUP .. kv·GROUP+GROUP-1 that share KV head kv = program_id(0)
      (rows past GROUP are padding, masked); scores [BLOCK_G, BLOCK_N] = q · kᵀ by tl.dot (tensor cores);
    - else: query head program_id(0) alone (BLOCK_G = 1), reading KV head h // GROUP; scores by
      multiply-and-sum (no tensor cores; a KV head's rows are read once for each of its query heads).

    Head dims: q and K have DIM_QK columns, V and the output DIM_V, held in registers as one tile of a
    power of two (BLOCK_D, BLOCK_DV; BLOCK_D2 = BLOCK_DV2 = 0) or as two (columns 0 .. BLOCK_D - 1, then
    BLOCK_D2 more: 80 = 64 + 32, 192 = 128 + 64; ``head_dim_tiles``), the last padded; the padding loads
    as zeros (it adds nothing to a score) and is never stored. SCALED (an FP8 cache): K and V rows are
    converted to q's dtype in registers; the scores take the KV head's k_scale, the output its v_scale.
    Sliding window: the new token (position seq_len - 1) sees tokens >= seq_len - 1 - window_left; the
    loop starts there, so the blocks before it are never loaded. exp2 with qk_scale = scale·log2 e.
    Without SPLIT: writes o = z / ℓ. With SPLIT: writes the partial state to the workspace row of
    (b, head, split): z in columns 0 .. DIM_V - 1, m (natural-log units) in DIM_V, ℓ in DIM_V + 1.
    CHECK: program (0, 0, 0) also checks the values of the whole call, after its own output (``_check_values``;
    last, so that its registers do not add to the main loop's: ptxas spills no more than without it).
    """
    b = tl.program_id(1)
    split = tl.program_id(2)
    offs_g = tl.arange(0, BLOCK_G)                                       # [BLOCK_G] row of the tile
    if GROUPED:
        kv = tl.program_id(0)          # KV heads of one sequence are neighbours: they read the same pages
        heads = kv * GROUP + offs_g                                      # [BLOCK_G] query heads
        row_ok = offs_g < GROUP
    else:
        kv = tl.program_id(0) // GROUP     # the query heads of one group are neighbours (L2 reuse)
        heads = tl.program_id(0) + offs_g
        row_ok = offs_g < 1
    seq_len = tl.minimum(tl.maximum(tl.load(lens_ptr + b * stride_lens), 0), max_len)   # within the table
    first_seen = tl.maximum(seq_len - 1 - window_left, 0)              # the window's first token
    start = tl.maximum(split * tokens_per_split, first_seen)
    end = tl.minimum(split * tokens_per_split + tokens_per_split, seq_len)

    if SCALED:                                                           # an FP8 cache: per-KV-head scales
        qk_scale = qk_scale * tl.load(k_scale_ptr + kv)
    q_base = q_ptr + b * stride_qb
    q_rows = _aligned(heads * stride_qh, Q_ALIGN)
    q = _load_rows(q_base, q_rows, stride_qd, row_ok, DIM_QK, BLOCK_D)  # [BLOCK_G, BLOCK_D]
    if BLOCK_D2 > 0:                                                     # columns BLOCK_D .. DIM_QK - 1
        q2 = _load_rows(q_base + BLOCK_D * stride_qd, q_rows, stride_qd, row_ok, DIM_QK - BLOCK_D, BLOCK_D2)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)                  # running max (log2 units)
    l_i = tl.zeros([BLOCK_G], tl.float32)                                # running sum of exponentials
    acc = tl.zeros([BLOCK_G, BLOCK_DV], tl.float32)                      # running Σ p·v
    if BLOCK_DV2 > 0:
        acc2 = tl.zeros([BLOCK_G, BLOCK_DV2], tl.float32)               # its columns BLOCK_DV .. DIM_V - 1
    bt_row = bt_ptr + b * stride_btb
    for tok0 in range(start, end, BLOCK_N):
        tok = tok0 + tl.arange(0, BLOCK_N)                               # [BLOCK_N] token index
        valid = tok < end
        k_rows, v_rows = _kv_rows(bt_row, tok, valid, kv, num_pages, stride_btp, stride_kp, stride_ks, stride_kh,
                                  stride_vp, stride_vs, stride_vh, PAGE_SIZE, K_ALIGN, V_ALIGN)
        k = _to_compute(_load_rows(k_ptr, k_rows, stride_kd, valid, DIM_QK, BLOCK_D), valid, q.dtype, SCALED, False)
        s = _scores(q, k, GROUPED, DOT_PRECISION)                        # [BLOCK_G, BLOCK_N]
        if BLOCK_D2 > 0:
            k2 = _load_rows(k_ptr + BLOCK_D * stride_kd, k_rows, stride_kd, valid, DIM_QK - BLOCK_D, BLOCK_D2)
            s += _scores(q2, _to_compute(k2, valid, q.dtype, SCALED, False), GROUPED, DOT_PRECISION)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))                            # finite: a block has a token
        alpha = tl.math.exp2(m_i - m_new)                                # rescale of the old state
        p = tl.math.exp2(s - m_new[:, None])                             # [BLOCK_G, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _to_compute(_load_rows(v_ptr, v_rows, stride_vd, valid, DIM_V, BLOCK_DV), valid, q.dtype, SCALED, True)
        acc = acc * alpha[:, None] + _weighted(p, v, GROUPED, DOT_PRECISION)
        if BLOCK_DV2 > 0:
            v2 = _load_rows(v_ptr + BLOCK_DV * stride_vd, v_rows, stride_vd, valid, DIM_V - BLOCK_DV, BLOCK_DV2)
            acc2 = acc2 * alpha[:, None] + _weighted(p, _to_compute(v2, valid, q.dtype, SCALED, True), GROUPED,
                                                     DOT_PRECISION)
        m_i = m_new

    v_scale = 1.0
    if SCALED:
        v_scale = tl.load(v_scale_ptr + kv)                              # V = stored V · v_scale
    if SPLIT:
        rows = out_ptr + b * stride_ob + heads * stride_oh + split * stride_os    # [BLOCK_G] workspace rows
        tl.store(rows + DIM_V, m_i * LN2, mask=row_ok)                  # natural-log units
        tl.store(rows + DIM_V + 1, l_i, mask=row_ok)
        norm = tl.full([BLOCK_G], 1.0, tl.float32) * v_scale             # z unnormalised
    else:
        rows = out_ptr + b * stride_ob + heads * stride_oh
        norm = v_scale / l_i                                             # o = z / ℓ
    _store_cols(rows, acc * norm[:, None], row_ok, DIM_V, BLOCK_DV, 0)
    if BLOCK_DV2 > 0:
        _store_cols(rows, acc2 * norm[:, None], row_ok, DIM_V, BLOCK_DV2, BLOCK_DV)
    if CHECK:       # last: the main loop's registers are free by then
        if (tl.program_id(0) == 0) & (b == 0) & (split == 0):
            _check_values(bt_ptr, lens_ptr, k_scale_ptr, v_scale_ptr, state_ptr, batch, num_pages, max_len, n_kv,
                          stride_btb, stride_btp, stride_lens, PAGE_SIZE, SCALED, BLOCK_KV, CODE, N_KERNELS, 16, 64)


@triton.jit
def _merge_splits_kernel(ws_ptr, o_ptr, num_splits, stride_wb, stride_wh, stride_ws, stride_ob, stride_oh,
                         DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program per (sequence, query head): o = Σ_s e^(m_s − M) z_s / Σ_s e^(m_s − M) ℓ_s, M = max m_s,
    from the workspace rows ``_paged_kernel`` wrote (z, then m, then ℓ).

    A split that saw no token has m = −inf, ℓ = 0, z = 0 and weight 0; the split holding the newest
    token always saw one.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_DV)
    s_ok = offs_s < num_splits
    d_ok = offs_d < DIM_V
    rows = ws_ptr + b * stride_wb + h * stride_wh + offs_s * stride_ws   # [BLOCK_S]
    m = tl.load(rows + DIM_V, mask=s_ok, other=float("-inf"))
    l = tl.load(rows + DIM_V + 1, mask=s_ok, other=0.0)
    z = tl.load(rows[:, None] + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)   # [BLOCK_S, BLOCK_DV]
    m_max = tl.max(m, 0)
    w = tl.exp(m - m_max)                                                # rescale each split's state
    total = tl.sum(w * l, 0)
    out = tl.sum(w[:, None] * z, 0) / total                              # [BLOCK_DV]
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty), mask=d_ok)



# Public names of the kernels for tests and scripts: the same objects; the kernels keep their underscore
# names, which profilers record.
paged_kernel = _paged_kernel
merge_splits_kernel = _merge_splits_kernel


# ------------------------------------------------------------------------------- splits and launch
def choose_num_splits(batch: int, n_kv: int, max_len: int, device) -> int:
    """Splits per sequence so that the grid fills the GPU: about two programs per multiprocessor,
    each with at least 512 tokens. 1 when B·Hkv programs already fill it (and on the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    sms = sm_count(device)
    programs = batch * n_kv
    if programs >= sms:
        return 1
    wanted = -(-2 * sms // programs)
    return max(1, min(wanted, max_len // 512, MAX_SPLITS))


def new_buffer(shape, dtype, device) -> torch.Tensor:
    """Every output and workspace buffer the kernels write, contiguous (tests fill these with NaN instead)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _run(plan: Plan, q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, check: bool):
    """o [B, Hq, Dv] in q's dtype and on q's device: one launch (two with splits), one allocation (two)."""
    where, out_dtype = q.device, q.dtype
    if plan.direct:                                  # the common case: the strides are the plan's key's
        strides = plan.input_strides
    else:
        q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale = to_kernel_device(
            q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale)
        if plan.upcast:
            q = q.float()
            k_pages, v_pages = (t if t.dtype == FP8 else t.float() for t in (k_pages, v_pages))
        k_pages, v_pages = fp8_read(k_pages), fp8_read(v_pages)       # NaN bytes on the interpreter
        strides = (*q.stride(), *k_pages.stride(), *v_pages.stride(), *block_table.stride())
    if k_scale is not None:                          # [Hkv], read as scale_ptr + kv: made contiguous
        k_scale, v_scale = k_scale.contiguous(), v_scale.contiguous()
    else:
        k_scale = v_scale = seq_lens                 # never read (SCALED is off)
    device = q.device
    if check:
        state = plan.state if plan.state is not None else value_checks.state(device)
    else:
        state = seq_lens                             # never read without CHECK
    o = new_buffer(plan.out_shape, q.dtype, device)
    split = plan.num_splits > 1
    if split:
        workspace = new_buffer(plan.workspace_shape, torch.float32, device)
        target, target_strides = workspace, workspace.stride()[:3]
    else:
        target, target_strides = o, (*o.stride()[:2], 0)
    args = (q, k_pages, v_pages, block_table, seq_lens, target, k_scale, v_scale, state, *plan.scalars,
            *strides, seq_lens.stride(0), *target_strides)
    merge_args = (workspace, o, plan.num_splits, *target_strides, *o.stride()[:2]) if split else None
    with on_device(device):
        if plan.direct:            # every argument but the tensors and the buffers' strides is the plan's
            RUNNERS.launch_planned(plan.runners, (check, *target_strides), paged_kernel, plan.grid, args,
                                   plan.constexprs[check], device, 9)
            if split:
                RUNNERS.launch_planned(plan.runners, merge_args[3:], merge_splits_kernel,
                                       plan.grid[1:2] + plan.out_shape[1:2], merge_args, plan.merge_constexprs,
                                       device, 2)
        else:
            RUNNERS.launch(paged_kernel, plan.grid, args, plan.constexprs[check], device)
            if split:
                RUNNERS.launch(merge_splits_kernel, plan.grid[1:2] + plan.out_shape[1:2], merge_args,
                               plan.merge_constexprs, device)
    return o if o.device == where and o.dtype == out_dtype else o.to(where, out_dtype)


def _checked_plan(q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, sm_scale, num_splits, variant,
                  window, check_values) -> Plan:
    """Every check that shapes and options decide (ValueError naming the argument), then the plan."""
    check_values = check_values_option(check_values)
    check_shapes(q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale)
    sm_scale = validation.softmax_scale(sm_scale, q.shape[-1])
    window_left = check_window(window)[0]
    num_splits = check_splits(num_splits)
    check_variant(variant)
    if num_splits is None:
        longest = block_table.shape[1] * k_pages.shape[1]
        seen = longest if window_left < 0 else min(longest, window_left + 1)
        num_splits = choose_num_splits(q.shape[0], k_pages.shape[2], seen, q.device)
    return make_plan(q, k_pages, v_pages, block_table, sm_scale, num_splits, variant, window_left,
                     k_scale is not None, check_values)


def launch(q, k_pages, v_pages, block_table, seq_lens, sm_scale: float, num_splits: int, variant: str,
           config: LaunchConfig | None = None, window_left: int = -1, k_scale=None, v_scale=None):
    """The kernels alone on inputs already checked (``check_paged_inputs``), no value check: what the
    benchmarks time and the launch sweeps tune. ``config``: a LaunchConfig (None: ``default_config``)."""
    plan = make_plan(q, k_pages, v_pages, block_table, sm_scale, num_splits, variant, window_left,
                     k_scale is not None, False, config)
    return _run(plan, q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, False)


def paged_decode(q, k_pages, v_pages, block_table, seq_lens, *, sm_scale: float | None = None,
                 num_splits: int | None = None, variant: str = "grouped", check_values=None, window=(-1, -1),
                 k_scale=None, v_scale=None):
    """Decode attention over a paged KV cache: o[b, h] = softmax(q[b, h]·Kᵀ·sm_scale) V over the first
    seq_lens[b] tokens of sequence b, found through block_table. See the module docstring for shapes.

    num_splits: None picks one (``choose_num_splits``); S > 1 splits each sequence's tokens into S
    chunks (flash-decoding) merged by the (m, ℓ) rule. variant: "grouped" (default) or "per_head".
    k_scale, v_scale: fp32 [Hkv], exactly when the cache is float8_e4m3fn (module docstring).
    window: (left, right) as in ``flash_attention``; the new token is the last of its sequence, so only
    left counts (its last left + 1 tokens are seen; -1: all); right is checked and otherwise ignored.
    check_values: how the contents of seq_lens, block_table and the scales are checked
    (``check_paged_inputs``); None: "strict" for CPU tensors, "device" for CUDA tensors (checked by the
    kernel itself: no host synchronisation, so a call can be captured in a CUDA graph and costs no
    round trip).
    """
    if check_values is None:
        check_values = "device" if getattr(q, "is_cuda", False) else "strict"
    key = plan_key(q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, sm_scale, num_splits, variant,
                   window, check_values)
    try:
        plan = paged_plans.PLANS.get(key) if key is not None else None
    except TypeError:                                # an unhashable option: the full checks decide
        key = plan = None
    if plan is None:
        plan = _checked_plan(q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, sm_scale, num_splits,
                             variant, window, check_values)
        if key is not None:
            keep_recent(paged_plans.PLANS, key, plan, paged_plans.MAX_PLANS)
        if plan.check_values == "device" and not triton_interprets() and not value_checks.capturing(q):
            # compile the kernel a CUDA graph captures (it checks nothing) now, not while capturing
            _run(plan, q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, False)
    if plan.check_values == "strict":
        check_values_on_host(block_table, seq_lens, plan.num_pages, plan.page_size, k_scale, v_scale)
    check = plan.check_values == "device" and not value_checks.capturing(q)
    return _run(plan, q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, check)


# ------------------------------------------------------------------------------- merge, references
def merge_partials(m, l, z):
    """Merge S partial softmax states along dim -2 of z (the split axis) with the rule of lesson 3.

    m, l: [..., S] (m natural-log maxima, −inf for a split that saw nothing; l sums of exponentials);
    z: [..., S, D] unnormalised outputs. Returns o [..., D] = Σ_s e^(m_s−M) z_s / Σ_s e^(m_s−M) ℓ_s.
    """
    m_max = m.amax(dim=-1, keepdim=True)                              # [..., 1]
    w = torch.exp(m - m_max)                                          # [..., S]; 0 for empty splits
    total = (w * l).sum(dim=-1)                                       # [...]
    return (w[..., None] * z).sum(dim=-2) / total[..., None]          # [..., D]


def token_pages(block_table, seq_lens, page_size: int):
    """Physical (page, offset) of every cached token: two lists of int64 tensors, one per sequence."""
    pages, offsets = [], []
    for b in range(block_table.shape[0]):
        t = torch.arange(int(seq_lens[b]))
        pages.append(block_table[b].cpu().long()[t // page_size])
        offsets.append(t % page_size)
    return pages, offsets


def gather_dense(k_pages, v_pages, block_table, seq_lens):
    """Dense copies k [B, Hkv, L, D], v [B, Hkv, L, Dv] (L = max seq_len; zeros past each sequence's end)."""
    page_size = k_pages.shape[1]
    pages, offsets = token_pages(block_table, seq_lens, page_size)
    batch, longest = block_table.shape[0], int(seq_lens.max())
    k = torch.zeros((batch, longest, *k_pages.shape[2:]), dtype=k_pages.dtype, device=k_pages.device)
    v = torch.zeros((batch, longest, *v_pages.shape[2:]), dtype=v_pages.dtype, device=v_pages.device)
    for b, (p, o) in enumerate(zip(pages, offsets)):
        p, o = p.to(k_pages.device), o.to(k_pages.device)
        k[b, : len(p)] = k_pages[p, o]                                # [n_b, Hkv, D]
        v[b, : len(p)] = v_pages[p, o]
    return k.transpose(1, 2), v.transpose(1, 2)                       # [B, Hkv, L, D]


def paged_decode_ref(q, k_pages, v_pages, block_table, seq_lens, sm_scale: float | None = None, window=(-1, -1),
                     k_scale=None, v_scale=None):
    """float64 reference on the CPU: each sequence's tokens gathered through the page table (its last
    left + 1 with ``window=(left, _)``, left >= 0), then exact attention. Returns float64 [B, Hq, Dv]."""
    left = check_window(window)[0]
    from ..reference.attention import attention_ref

    pages, offsets = token_pages(block_table, seq_lens, k_pages.shape[1])
    k_all, v_all = k_pages.detach().cpu().double(), v_pages.detach().cpu().double()
    if k_scale is not None:                                           # an FP8 cache: dequantise
        k_all = k_all * k_scale.detach().cpu().double()[:, None]
        v_all = v_all * v_scale.detach().cpu().double()[:, None]
    outs = []
    for b, (p, o) in enumerate(zip(pages, offsets)):
        if left >= 0:
            p, o = p[-(left + 1):], o[-(left + 1):]                   # the window's tokens
        k = k_all[p, o].transpose(0, 1)[None]                         # [1, Hkv, n_b, D]
        v = v_all[p, o].transpose(0, 1)[None]
        qb = q[b].detach().cpu().double()[None, :, None, :]           # [1, Hq, 1, D]
        outs.append(attention_ref(qb, k, v, sm_scale=sm_scale)[0, :, 0, :])
    return torch.stack(outs)                                          # [B, Hq, Dv]


__all__ = ["paged_decode", "merge_partials", "gather_dense", "paged_decode_ref", "token_pages",
           "check_paged_inputs", "raise_pending_errors", "choose_num_splits", "launch", "default_config",
           "LaunchConfig", "VARIANTS", "SUPPORTED_HEAD_DIMS", "MIN_HEAD_DIM", "MAX_HEAD_DIM", "SUPPORTED_DTYPES",
           "new_buffer"]
