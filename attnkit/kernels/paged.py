"""Paged decode attention in Triton: one new query token per sequence, its K/V cache stored in pages.

Public functions
- ``paged_decode(q, k_pages, v_pages, block_table, seq_lens, *, sm_scale=None, num_splits=None,
  variant="grouped", window=(-1, -1)) -> o``: attention of each sequence's new token over its cached
  tokens (with ``window=(left, _)``, over its last left + 1 tokens only, as Mistral's and Gemma 2's
  local layers; pages wholly before the window are never read).
- ``merge_partials(m, l, z) -> o``: the (m, ℓ, z) merge rule of lesson 3 in PyTorch, over a split axis.
- ``gather_dense(k_pages, v_pages, block_table, seq_lens) -> (k, v)``: copy each sequence's pages into
  dense [B, Hkv, L, D] tensors (the correctness checkpoint: gather, then ordinary attention).
- ``paged_decode_ref(q, k_pages, v_pages, block_table, seq_lens, sm_scale=None)``: the float64
  reference, token by token through the page table.
- ``check_paged_inputs(...)``: the ValueErrors; ``choose_num_splits(...)``: the split heuristic.

Shapes
- q: [B, Hq, D], the one new token of each of B sequences;
- k_pages, v_pages: [num_pages, page_size, Hkv, D], any strides; Hq % Hkv == 0 and query head h reads
  KV head h // (Hq // Hkv);
- block_table: int32 [B, max_pages]; sequence b's token t lives in page block_table[b, t // page_size]
  at offset t % page_size; entries past a sequence's last page are never read (any value);
- seq_lens: int32 [B], 1 <= seq_lens[b] <= max_pages * page_size;
- o: [B, Hq, D] in q's dtype. fp16, bf16 and fp32; D in {16, 32, 64, 128, 256}.
- An FP8 cache (as ``paged_extend``'s): k_pages, v_pages of dtype float8_e4m3fn holding K / k_scale and
  V / v_scale, with ``k_scale``, ``v_scale`` fp32 [Hkv] (one per KV head, ``paged_extend.fp8_scales``).
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
maximum, ℓ the sum of exponentials, z the unnormalised output), and a merge kernel combines them with
the rule of lesson 3. ``num_splits=None`` picks S with ``choose_num_splits`` (more programs when
B·Hkv is too small to fill the GPU).

Every tensor argument may have any strides (a view, an expanded or offset tensor): the kernels read
each through its strides.

Where it runs: as every kernel of the course, by ``attnkit.device.kernel_device``: CUDA tensors run
compiled kernels; on a machine without a GPU, CPU tensors run the same kernels in Triton's
interpreter, with bf16 computed in fp32 and rounded (the interpreter's bf16 is not faithful); CPU
tensors on a machine with a GPU are computed on the GPU and copied back.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .. import validation
from ..device import (
    bf16_computed_in_fp32,
    ensure_triton_backend,
    launch_options,
    on_device,
    sm_count,
    to_kernel_device,
    triton_interprets,
)
from . import value_checks

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .flash import check_window  # noqa: E402
from .flash_kernels import LN2, LOG2E  # noqa: E402
from .paged_extend import FP8, fp8_read  # noqa: E402
from .value_checks import raise_pending_errors  # noqa: E402,F401  (re-exported: paged.raise_pending_errors)

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
SUPPORTED_DTYPES = validation.FLOAT_DTYPES
CACHE_DTYPES = SUPPORTED_DTYPES + (torch.float8_e4m3fn,)        # an FP8 cache takes k_scale, v_scale
VARIANTS = {
    "grouped": "the query heads that share a KV head in one tile; scores by tl.dot (tensor cores)",
    "per_head": "one query head per program; scores by multiply-and-sum (no tensor cores)",
}
MAX_SPLITS = 256


# ------------------------------------------------------------------------------------------- kernels
@triton.jit
def _kv_block(k_ptr, v_ptr, bt_row, tok, valid, kv, num_pages, stride_btp,
              stride_kp, stride_ks, stride_kh, stride_kd, stride_vp, stride_vs, stride_vh, stride_vd,
              HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """The K and V rows [len(tok), D] of KV head kv for the tokens ``tok`` of one sequence, found
    through its row of the page table (token t: page bt_row[t // PAGE_SIZE], slot t % PAGE_SIZE);
    tokens not ``valid`` read as zeros and touch no page."""
    page = tl.load(bt_row + (tok // PAGE_SIZE) * stride_btp, mask=valid, other=0)   # physical page
    page = tl.where((page >= 0) & (page < num_pages), page, 0)          # a bad id reads page 0, no fault
    slot = tok % PAGE_SIZE                                               # offset inside the page
    offs_d = tl.arange(0, HEAD_DIM)
    k_rows = page.to(tl.int64) * stride_kp + slot * stride_ks + kv * stride_kh
    v_rows = page.to(tl.int64) * stride_vp + slot * stride_vs + kv * stride_vh
    k = tl.load(k_ptr + k_rows[:, None] + offs_d[None, :] * stride_kd, mask=valid[:, None], other=0.0)
    v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :] * stride_vd, mask=valid[:, None], other=0.0)
    return k, v


@triton.jit
def _paged_kernel(
        q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, m_ptr, l_ptr, k_scale_ptr, v_scale_ptr,
        qk_scale, tokens_per_split, num_pages, max_len, window_left,
        stride_qb, stride_qh, stride_qd,
        stride_kp, stride_ks, stride_kh, stride_kd,
        stride_vp, stride_vs, stride_vh, stride_vd,
        stride_btb, stride_btp, stride_lens,
        stride_ob, stride_oh, stride_os, stride_od,
        stride_mb, stride_mh, stride_ms,
        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, GROUPED: tl.constexpr, DOT_PRECISION: tl.constexpr,
        SCALED: tl.constexpr):
    """One program: sequence b, tokens [split·tokens_per_split, ...) of it, and the query heads of
    program_id(0) as the rows of q [BLOCK_G, D]:

    - GROUPED: the GROUP query heads kv·GROUP .. kv·GROUP+GROUP-1 that share KV head kv = program_id(0)
      (rows past GROUP are padding, masked); scores [BLOCK_G, BLOCK_N] = q · kᵀ by tl.dot (tensor cores);
    - else: query head program_id(0) alone (BLOCK_G = 1), reading KV head h // GROUP; scores by
      multiply-and-sum (no tensor cores; a KV head's rows are read once for each of its query heads).

    SCALED (an FP8 cache): K and V rows are converted to q's dtype in registers; the scores take the KV
    head's k_scale, the output its v_scale.
    Sliding window: the new token (position seq_len - 1) sees tokens >= seq_len - 1 - window_left; the
    loop starts there, so the blocks before it are never loaded. exp2 with qk_scale = scale·log2 e.
    Without SPLIT: writes o = z / ℓ. With SPLIT: writes the partial (m, ℓ, z), m in natural-log units.
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
    offs_d = tl.arange(0, HEAD_DIM)                                      # [D]
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)                         # [BLOCK_G, D]
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)                  # running max (log2 units)
    l_i = tl.zeros([BLOCK_G], tl.float32)                                # running sum of exponentials
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)                      # running Σ p·v
    bt_row = bt_ptr + b * stride_btb
    for tok0 in range(start, end, BLOCK_N):
        tok = tok0 + tl.arange(0, BLOCK_N)                               # [BLOCK_N] token index
        valid = tok < end
        k, v = _kv_block(k_ptr, v_ptr, bt_row, tok, valid, kv, num_pages, stride_btp, stride_kp, stride_ks, stride_kh,
                         stride_kd, stride_vp, stride_vs, stride_vh, stride_vd, HEAD_DIM, PAGE_SIZE)
        if SCALED:                                                       # fp8 bytes -> q's dtype
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        if GROUPED:   # fp32 inputs: "ieee" products (tf32 misses the fp32 bound at long contexts)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        else:
            s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))        # [BLOCK_G, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(s, 1))                            # finite: a block has a token
        alpha = tl.math.exp2(m_i - m_new)                                # rescale of the old state
        p = tl.math.exp2(s - m_new[:, None])                             # [BLOCK_G, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, 1)
        if GROUPED:
            pv = tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        else:
            pv = tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], 1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    if SCALED:
        acc = acc * tl.load(v_scale_ptr + kv)                            # V = stored V · v_scale
    if SPLIT:
        o_rows = o_ptr + b * stride_ob + heads[:, None] * stride_oh + split * stride_os
        tl.store(o_rows + offs_d[None, :] * stride_od, acc, mask=row_ok[:, None])
        ml_rows = b * stride_mb + heads * stride_mh + split * stride_ms
        tl.store(m_ptr + ml_rows, m_i * LN2, mask=row_ok)  # natural-log units
        tl.store(l_ptr + ml_rows, l_i, mask=row_ok)
    else:
        out = acc / l_i[:, None]
        o_rows = o_ptr + b * stride_ob + heads[:, None] * stride_oh
        tl.store(o_rows + offs_d[None, :] * stride_od, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _merge_splits_kernel(m_ptr, l_ptr, z_ptr, o_ptr, num_splits,
                         stride_mb, stride_mh, stride_ms,
                         stride_zb, stride_zh, stride_zs, stride_zd,
                         stride_ob, stride_oh, stride_od,
                         HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program per (sequence, query head): o = Σ_s e^(m_s − M) z_s / Σ_s e^(m_s − M) ℓ_s, M = max m_s.

    A split that saw no token has m = −inf, ℓ = 0, z = 0 and weight 0; the split holding the newest
    token always saw one.
    """
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < num_splits
    ml = b * stride_mb + h * stride_mh + offs_s * stride_ms
    m = tl.load(m_ptr + ml, mask=s_ok, other=float("-inf"))              # [BLOCK_S]
    l = tl.load(l_ptr + ml, mask=s_ok, other=0.0)
    z = tl.load(z_ptr + b * stride_zb + h * stride_zh + offs_s[:, None] * stride_zs
                + offs_d[None, :] * stride_zd, mask=s_ok[:, None], other=0.0)   # [BLOCK_S, D]
    m_max = tl.max(m, 0)
    w = tl.exp(m - m_max)                                                # rescale each split's state
    total = tl.sum(w * l, 0)
    out = tl.sum(w[:, None] * z, 0) / total                              # [D]
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d * stride_od, out.to(o_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------- launch configs
@dataclass(frozen=True)
class LaunchConfig:
    """Tokens per loop iteration, warps per program and software-pipelining depth."""

    block_n: int
    num_warps: int
    num_stages: int


INTERPRETER_CONFIG = LaunchConfig(16, 1, 1)   # small blocks: ragged lengths span several blocks
# On a GPU (chosen by the sweep in scripts/gpu_paged.py on an H100; see docs/paged_notes.md).
GPU_CONFIGS = {"grouped": LaunchConfig(128, 4, 3), "per_head": LaunchConfig(128, 4, 2)}


# ------------------------------------------------------------------------------------- input checks
def check_paged_inputs(q, k_pages, v_pages, block_table, seq_lens, *, check_values="strict", k_scale=None,
                       v_scale=None) -> None:
    """Raise ValueError, naming the argument and the rule, unless the inputs are a valid decode step.

    Shapes, dtypes and devices are always checked (on the host, no synchronisation). The contents of
    seq_lens and block_table, by ``check_values``:
    - "strict" (True): copied to the host and checked now (a synchronisation on a GPU);
    - "device": checked on the device, without synchronising, under the contract of
      ``attnkit.kernels.value_checks``: ``raise_pending_errors()`` reports the first bad call by its
      index, and nothing else does. The kernel clamps lengths and page ids, so a bad table gives a
      wrong answer that is reported, never a device fault. Skipped while a CUDA graph is being captured;
    - False: not checked.
    """
    validation.tensor("q", q, 3, "[B, Hq, D]", SUPPORTED_DTYPES)
    validation.tensor("k_pages", k_pages, 4, "[num_pages, page_size, Hkv, D]", CACHE_DTYPES)
    validation.tensor("v_pages", v_pages, 4, "[num_pages, page_size, Hkv, D]", CACHE_DTYPES)
    validation.tensor("block_table", block_table, 2, "[B, max_pages]")
    validation.tensor("seq_lens", seq_lens, 1, "[B]")
    validation.same("dtype", k_pages=k_pages, v_pages=v_pages)
    if k_pages.dtype != FP8:
        validation.same("dtype", q=q, k_pages=k_pages)
    _check_scales(k_pages, k_scale, v_scale)
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: dtype must be torch.int32, got {t.dtype}")
    validation.same("device", q=q, k_pages=k_pages, v_pages=v_pages, block_table=block_table, seq_lens=seq_lens,
                    **({"k_scale": k_scale, "v_scale": v_scale} if k_scale is not None else {}))
    validation.kernel_device("q", q)
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages, v_pages: must have the same shape, got {tuple(k_pages.shape)} and "
                         f"{tuple(v_pages.shape)}")
    batch, n_heads, head_dim = q.shape
    num_pages, page_size, n_kv, kv_dim = k_pages.shape
    if kv_dim != head_dim:
        raise ValueError(f"q, k_pages: head dims differ (q has D={head_dim}, k_pages has D={kv_dim})")
    validation.head_dim("q", head_dim, SUPPORTED_HEAD_DIMS)
    validation.head_groups("q, k_pages", n_heads, n_kv)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: needs one row per sequence of q (B={batch}), got "
                         f"{block_table.shape[0]} rows")
    if seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens: needs one length per sequence of q (B={batch}), got {seq_lens.shape[0]}")
    if check_values is True:
        check_values = "strict"
    if check_values not in ("strict", "device", False):
        raise ValueError(f"check_values: expected 'strict', 'device', True or False, got {check_values!r}")
    if check_values == "device":
        _flag_bad_values(block_table, seq_lens, num_pages, page_size, k_scale, v_scale)
        return
    if not check_values:
        return
    max_pages = block_table.shape[1]
    lens = seq_lens.detach().to("cpu", torch.int64)
    table = block_table.detach().to("cpu", torch.int64)
    capacity = max_pages * page_size
    bad = torch.nonzero((lens < 1) | (lens > capacity)).flatten()
    if bad.numel():
        b = int(bad[0])
        raise ValueError(f"seq_lens: seq_lens[{b}] = {int(lens[b])} is out of range; each sequence needs "
                         f"1 <= seq_len <= max_pages * page_size = {max_pages} * {page_size} = {capacity}")
    pages_used = (lens + page_size - 1) // page_size                                  # [B]
    used = torch.arange(max_pages)[None, :] < pages_used[:, None]                     # [B, max_pages]
    out_of_range = used & ((table < 0) | (table >= num_pages))
    if out_of_range.any():
        b, p = (int(i) for i in torch.nonzero(out_of_range)[0])
        raise ValueError(f"block_table: block_table[{b}, {p}] = {int(table[b, p])} is not a page; "
                         f"the pages a sequence uses must lie in [0, num_pages) = [0, {num_pages})")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None and not bool(torch.all(torch.isfinite(scale) & (scale > 0))):
            raise ValueError(f"{name}: every scale must be finite and > 0")


def _check_scales(k_pages, k_scale, v_scale) -> None:
    """k_scale, v_scale: fp32 [Hkv], given exactly when the cache is float8_e4m3fn."""
    if (k_pages.dtype == FP8) != (k_scale is not None) or (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale, v_scale: required (fp32 [Hkv], one per KV head) exactly when k_pages and "
                         f"v_pages are float8_e4m3fn; the cache is {k_pages.dtype}")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None:
            validation.tensor(name, scale, 1, "[Hkv]", (torch.float32,))
            if scale.shape[0] != k_pages.shape[2]:
                raise ValueError(f"{name}: expected {k_pages.shape[2]} scales (one per KV head), got {scale.shape[0]}")


def _bad_values(block_table, seq_lens, num_pages: int, page_size: int, k_scale=None, v_scale=None):
    """A 0-d int64 tensor on the tables' device: the ``value_checks.RULES`` bits the values break (0: none)."""
    capacity = block_table.shape[1] * page_size
    lens = seq_lens.to(torch.int64)
    used = torch.arange(block_table.shape[1], device=lens.device)[None, :] * page_size < lens[:, None]
    table = block_table.to(torch.int64)
    rules = ((lens < 1) | (lens > capacity)).any().to(torch.int64)
    rules = rules + 2 * (used & ((table < 0) | (table >= num_pages))).any().to(torch.int64)
    for scale in (k_scale, v_scale):
        if scale is not None:
            rules = rules | 4 * (~(torch.isfinite(scale) & (scale > 0)).all()).to(torch.int64)
    return rules


def _flag_bad_values(block_table, seq_lens, num_pages: int, page_size: int, k_scale=None, v_scale=None) -> None:
    if value_checks.capturing(block_table):
        return
    value_checks.flag("paged_decode", _bad_values(block_table, seq_lens, num_pages, page_size, k_scale, v_scale))


def _check_splits(num_splits) -> int | None:
    """``num_splits`` as a Python int (NumPy's integers accepted) in [1, MAX_SPLITS], or None."""
    if num_splits is None:
        return None
    if (isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral)
            or not 1 <= num_splits <= MAX_SPLITS):
        raise ValueError(f"num_splits: expected None or an integer in [1, {MAX_SPLITS}], got {num_splits!r}")
    return int(num_splits)


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


# ------------------------------------------------------------------------------------------- launch
def _new_buffer(shape, dtype, device) -> torch.Tensor:
    """Every output and scratch buffer the kernels write (tests fill these with NaN instead)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _launch(q, k_pages, v_pages, block_table, seq_lens, sm_scale: float, num_splits: int, variant: str,
            config: LaunchConfig | None = None, window_left: int = -1, k_scale=None, v_scale=None):
    """o [B, Hq, D] in q's dtype and on q's device (inputs already checked)."""
    where, out_dtype = q.device, q.dtype
    scaled = k_scale is not None
    q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale = to_kernel_device(
        q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale)
    if q.dtype == torch.bfloat16 and bf16_computed_in_fp32(q.device):   # interpreter, or below sm_80
        q = q.float()
        k_pages, v_pages = (t if t.dtype == FP8 else t.float() for t in (k_pages, v_pages))
    k_pages, v_pages = fp8_read(k_pages), fp8_read(v_pages)           # NaN bytes on the interpreter
    if scaled:                                       # [Hkv], read as scale_ptr + kv: made contiguous
        k_scale, v_scale = k_scale.contiguous(), v_scale.contiguous()
    else:
        k_scale = v_scale = torch.ones(1, dtype=torch.float32, device=q.device)   # never read
    if config is None:
        config = INTERPRETER_CONFIG if triton_interprets() else GPU_CONFIGS[variant]
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    max_len = block_table.shape[1] * page_size
    # each split covers a whole number of blocks of tokens
    blocks = -(-max_len // config.block_n)
    tokens_per_split = -(-blocks // num_splits) * config.block_n
    split = num_splits > 1
    o = _new_buffer((batch, n_heads, head_dim), q.dtype, q.device)
    if split:
        z = _new_buffer((batch, n_heads, num_splits, head_dim), torch.float32, q.device)
        m = _new_buffer((batch, n_heads, num_splits), torch.float32, q.device)
        l = _new_buffer((batch, n_heads, num_splits), torch.float32, q.device)
        target = z
    else:
        z = m = l = None
        target = o
    o_strides = target.stride() if split else (*o.stride()[:2], 0, o.stride()[2])
    ml_strides = m.stride() if split else (0, 0, 0)
    args = [q, k_pages, v_pages, block_table, seq_lens, target, m if split else o, l if split else o, k_scale, v_scale,
            sm_scale * LOG2E.value, tokens_per_split, k_pages.shape[0], max_len,
            window_left if window_left >= 0 else max_len,
            *q.stride(), *k_pages.stride(), *v_pages.stride(), *block_table.stride(), seq_lens.stride(0),
            *o_strides, *ml_strides]
    meta = dict(HEAD_DIM=head_dim, PAGE_SIZE=page_size, BLOCK_N=config.block_n, SPLIT=split,
                **launch_options(num_warps=config.num_warps, num_stages=config.num_stages))
    with on_device(q.device):
        grouped = variant == "grouped"
        _paged_kernel[(n_kv if grouped else n_heads, batch, num_splits)](
            *args, GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)) if grouped else 1, GROUPED=grouped,
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", SCALED=scaled, **meta)
        if split:
            _merge_splits_kernel[(batch, n_heads)](
                m, l, z, o, num_splits, *m.stride(), *z.stride(), *o.stride(),
                HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits), **launch_options(num_warps=4))
    return o.to(where, out_dtype)


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
    check_values: how the contents of seq_lens and block_table are checked (``check_paged_inputs``);
    None: "strict" for CPU tensors, "device" for CUDA tensors (no host synchronisation, so a call can
    be captured in a CUDA graph and costs no round trip).
    """
    if check_values is None:
        check_values = "device" if getattr(q, "is_cuda", False) else "strict"
    check_paged_inputs(q, k_pages, v_pages, block_table, seq_lens, check_values=check_values, k_scale=k_scale,
                       v_scale=v_scale)
    sm_scale = validation.softmax_scale(sm_scale, q.shape[-1])
    window_left = check_window(window)[0]
    num_splits = _check_splits(num_splits)
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {list(VARIANTS)}, got {variant!r}")
    if num_splits is None:
        longest = block_table.shape[1] * k_pages.shape[1]
        seen = longest if window_left < 0 else min(longest, window_left + 1)
        num_splits = choose_num_splits(q.shape[0], k_pages.shape[2], seen, q.device)
    with torch.no_grad():
        return _launch(q, k_pages, v_pages, block_table, seq_lens, sm_scale, num_splits, variant,
                       window_left=window_left, k_scale=k_scale, v_scale=v_scale)


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
    """Dense copies k, v [B, Hkv, L, D] (L = max seq_len; zeros past each sequence's end)."""
    page_size = k_pages.shape[1]
    pages, offsets = token_pages(block_table, seq_lens, page_size)
    batch, longest = block_table.shape[0], int(seq_lens.max())
    shape = (batch, longest, k_pages.shape[2], k_pages.shape[3])
    k = torch.zeros(shape, dtype=k_pages.dtype, device=k_pages.device)
    v = torch.zeros(shape, dtype=v_pages.dtype, device=v_pages.device)
    for b, (p, o) in enumerate(zip(pages, offsets)):
        p, o = p.to(k_pages.device), o.to(k_pages.device)
        k[b, : len(p)] = k_pages[p, o]                                # [n_b, Hkv, D]
        v[b, : len(p)] = v_pages[p, o]
    return k.transpose(1, 2), v.transpose(1, 2)                       # [B, Hkv, L, D]


def paged_decode_ref(q, k_pages, v_pages, block_table, seq_lens, sm_scale: float | None = None, window=(-1, -1),
                     k_scale=None, v_scale=None):
    """float64 reference on the CPU: each sequence's tokens gathered through the page table (its last
    left + 1 with ``window=(left, _)``, left >= 0), then exact attention. Returns float64 [B, Hq, D]."""
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
    return torch.stack(outs)                                          # [B, Hq, D]


__all__ = ["paged_decode", "merge_partials", "gather_dense", "paged_decode_ref", "token_pages",
           "check_paged_inputs", "raise_pending_errors", "choose_num_splits", "VARIANTS", "SUPPORTED_HEAD_DIMS",
           "SUPPORTED_DTYPES"]
