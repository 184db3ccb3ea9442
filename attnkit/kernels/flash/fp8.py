"""An FP8 (e4m3) FlashAttention forward, for Hopper (sm_90) tensor cores: forward only.

Public functions
- ``quantize_for_attention(q, k, v) -> (q8, k8, v8, q_scale, k_scale, v_scale)``: fp16, bf16 or fp32
  [B, H, N, D] tensors to float8_e4m3fn with one float32 scale per (batch, head), amax / 448 (the
  helpers ``fp8_scales`` and ``quantize_fp8`` of ``paged_extend``): x ≈ x8 · scale. q8, k8 are
  contiguous; v8 has the same [B, Hkv, N, D] shape but its memory is V transposed ([B, Hkv, D, N]
  contiguous, N the fastest dimension), the layout the second product wants on sm_90 (below).
- ``flash_attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale, *, causal=False, sm_scale=None,
  out_dtype=torch.float16) -> o``: softmax(sm_scale · (q8 · q_scale)(k8 · k_scale)ᵀ) (v8 · v_scale),
  o [B, Hq, Nq, D] in ``out_dtype`` (float16, bfloat16 or float32).
- ``dequantize(x8, scale)``: x8 · scale in float32, the inputs the kernel computes with exactly.
- ``check_fp8_inputs(...)``: the ValueErrors. ``REL_TOL_DEQUANTISED``, ``REL_TOL_QUANTISED``: the
  accuracy the tests hold the kernel to (below).

Shapes and rules: q8 [B, Hq, Nq, D]; k8, v8 [B, Hkv, Nk, D]; Hq a multiple of Hkv (query head h reads
K/V head h // (Hq // Hkv): grouped-query attention without copies); D = 64 or 128 only (the head dims
fp8 attention is built for; others raise ValueError); any Nq, Nk >= 1; any strides; all three
float8_e4m3fn on one device. q_scale float32 [B, Hq]; k_scale, v_scale float32 [B, Hkv], positive
(checked on CPU tensors; on a GPU the values are not read, so that no call synchronises). Causal
attention with Nq != Nk is aligned to the end, as in ``flash_attention``: query i sees key j when
j <= i + Nk - Nq; a row that sees no key gives 0. ``sm_scale`` defaults to 1/sqrt(D).

The algorithm, one program per BLOCK_M queries of one (batch, head), as ``flash_attention``:
1. S = q8 · k8ᵀ on the tensor cores, fp8 operands, fp32 results: raw products of the stored values;
   the logits are S · (q_scale · k_scale · sm_scale), the three scales folded into one multiply
   (times log2 e: the softmax runs in exp2).
2. online softmax in fp32 (running maximum m and sum l per row, as in lesson 5).
3. P is rounded to e4m3 before the second product, scaled by 2⁸: p = exp2(s − m + 8) lies in (0, 256].
   Kept in [0, 1] (as Triton's tutorial does with e5m2), every p below 2⁻⁶ would be subnormal in
   e4m3 (a fixed spacing of 2⁻⁹) and below 2⁻¹⁰ zero, and in long rows most weights are that small
   (for N(0, 1) logits over 16k keys the typical p is about e⁻⁴ ≈ 0.02; sharper logits push it lower).
   Scaled, p keeps 3 mantissa bits down to 2⁻¹⁴ and is zero only below 2⁻¹⁸ (tests/kernels/test_flash_fp8.py
   compares the two on long rows; the measured errors: docs/flash_notes.md, "Rule: FP8 accuracy"). A
   power of two rather than 448: the scale is exact, it costs
   nothing (the +8 is folded into the subtraction of m), and exp2's rounding can never push p past
   448, the largest e4m3 value. The factor cancels: the sum l is taken over the same scaled p
   (in fp32, before rounding), and o = acc / l.
4. acc += P8 · V8 (fp8 operands, fp32 results), added to the fp32 accumulator outside the product:
   Hopper's fp8 tensor cores accumulate in reduced precision, so each product spans only BLOCK_N
   keys and the sum over key tiles stays in fp32 (as FP8 matrix-product kernels promote partial
   sums every 128 elements). Passing acc into the product instead (``forward(promote=False)``, as
   Triton's tutorial does) saves registers; scripts/gpu_flash_fp8.py measures both.
5. o = acc / l · v_scale: V is descaled once, at the end.

V transposed on sm_90: Hopper's fp8 tensor-core instruction (wgmma) reads its second operand from
shared memory only "K-major", the reduction dimension contiguous. In S = Q Kᵀ that dimension is D,
contiguous in K; in P V it is the key dimension N, so V must be stored transposed ([B, H, D, N]).
``quantize_for_attention`` returns it so; a v8 with D contiguous is copied to that layout per call
on sm_90 (one extra pass over V).

Where it runs (``attnkit.device.kernel_device``): CUDA tensors run compiled; on sm_90 with Triton's
tensor descriptors (and Nk a multiple of 16, the TMA engine's 16-byte rule for V transposed) tiles
move through host-built descriptors, elsewhere through pointer loads. On a machine without a GPU the
same kernel runs in Triton's interpreter, with two substitutions (``EMULATE``): the interpreter's
fp32 → e4m3 conversion is not faithful (Triton 3.9: 124.26 becomes 64, and 480 is not saturated to
448), so P is rounded to the e4m3 grid by arithmetic (3 mantissa bits, subnormals below 2⁻⁶, kept in
fp16) instead of by conversion; and every fp8 tile is upcast to fp16 as it is loaded (each e4m3
value is exact in fp16, so the products are the same numbers), which keeps the test independent of
how a Triton version's interpreter treats fp8 operands of tl.dot. Scales, descaling, masks, ragged tiles and grouped
heads are the compiled kernel's code; only the two conversions differ.

Accuracy (relative error ‖o − ref‖ / ‖ref‖, the course's measure, on N(0, 1) inputs). Rounding to
e4m3 (3 mantissa bits) errs by at most 2⁻⁴ of a value, about 2⁻⁴/√6 ≈ 0.026 in the mean square; the
output inherits that from each input that is rounded:
- against float64 attention of the dequantised inputs only P's rounding remains (and fp32 sums):
  about 0.026 predicted; bound ``REL_TOL_DEQUANTISED`` = 4e-2;
- against float64 attention of the original inputs, q's and k's rounding (through the logits) and
  v's add to it: about 0.05 predicted; bound ``REL_TOL_QUANTISED`` = 8e-2 (fp16 kernels: 2e-3). What
  the tests measure against both bounds: docs/flash_notes.md, "Rule: FP8 accuracy".
When each row's keys fit in one key tile, the kernel's P is exactly the float64 softmax weights
rounded to e4m3, and the tests check it to 1e-3.

Its head dims (``SUPPORTED_HEAD_DIMS``) and launch configurations (``GPU_CONFIGS``, ``POINTER_CONFIG``) are
rules of ``attnkit.kernels.flash.dispatch``, as is where descriptors are used (``fp8_descriptors_usable``).
Internal API for tests and scripts: ``forward`` (the launch, with descriptors, configuration and promotion
chosen by the caller), ``v_transposed`` and the kernel's helper ``round_e4m3`` (P rounded to e4m3, or emulated
in the interpreter); the kernel ``_attn_fwd_fp8`` keeps the name profilers record.
"""
from __future__ import annotations

import torch

from ... import validation
from ...device import (
    bf16_computed_in_fp32,
    ensure_triton_backend,
    launch_options,
    on_device,
    to_kernel_device,
    triton_interprets,
)
from ..paged_extend import FP8, FP8_MAX, fp8_read, fp8_scales, quantize_fp8

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .dispatch import FP8_GPU_CONFIGS as GPU_CONFIGS  # noqa: E402
from .dispatch import FP8_POINTER_CONFIG as POINTER_CONFIG  # noqa: E402
from .dispatch import BlockConfig, fp8_config, fp8_descriptors_usable, head_dims_with  # noqa: E402
from .triton_kernels import load_tile  # noqa: E402

SUPPORTED_HEAD_DIMS = head_dims_with("fp8")     # the head dims whose row of dispatch.HEAD_DIMS sets fp8
OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INPUT_DTYPES = validation.FLOAT_DTYPES
LOG2E = 1.4426950408889634
P_SCALE_LOG2 = 8.0                      # P is scaled by 2**8 before it is rounded to e4m3
_P_SCALE_LOG2 = tl.constexpr(P_SCALE_LOG2)   # the same, as a compiled kernel may read it
REL_TOL_DEQUANTISED = 4e-2              # against float64 attention of x8 · scale
REL_TOL_QUANTISED = 8e-2                # against float64 attention of the inputs before quantising

POINTERS, HOST_DESCRIPTORS = 0, 2       # how tiles move (the values of DESC, as in triton_kernels)


# ------------------------------------------------------------------------------------------ kernel
@triton.jit
def _load_tile(X, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d,
               ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, DESC: tl.constexpr,
               EMULATE: tl.constexpr):
    """Rows [row, row + ROWS) of head h of batch b: a [ROWS, HEAD_DIM] e4m3 tile (fp16 with EMULATE);
    rows past n_rows are zeros (under a mask with MASKED, by the descriptor's bounds with DESC). The
    fp16 kernels' loader, ``triton_kernels.load_tile``, at the full head dim."""
    tile = load_tile(X, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d, ROWS, HEAD_DIM, MASKED, DESC,
                     HEAD_DIM)
    if EMULATE:
        tile = tile.to(tl.float16)                                      # exact: e4m3 ⊂ fp16
    return tile


@triton.jit
def _load_v_tile(V, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d,
                 ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, DESC: tl.constexpr,
                 EMULATE: tl.constexpr):
    """Keys [row, row + ROWS) of V as a [ROWS, HEAD_DIM] tile. With DESC, V is a descriptor over V
    transposed, [B, H, D, N]: a [D, ROWS] block is loaded and transposed (a view of shared memory,
    no data moves), so the product P · V reads it with the key dimension contiguous."""
    if DESC:
        tile = tl.trans(V.load([b, h, 0, row]).reshape(HEAD_DIM, ROWS))
        if EMULATE:
            tile = tile.to(tl.float16)
    else:
        tile = _load_tile(V, b, h, row, n_rows, stride_b, stride_h, stride_n, stride_d, ROWS, HEAD_DIM,
                          MASKED, DESC, EMULATE)
    return tile


@triton.jit
def round_e4m3(p, EMULATE: tl.constexpr):
    """p (fp32, in [0, 256]) rounded to float8_e4m3fn for the second product. With EMULATE (the
    interpreter) the rounding is done by arithmetic and the result kept in fp16: 3 mantissa bits, a
    spacing of 2^(e - 3) for p in [2^e, 2^(e + 1)), and 2⁻⁹ (the subnormals) below 2⁻⁶."""
    if EMULATE:
        e = tl.maximum(tl.floor(tl.log2(tl.maximum(p, 1e-30))), -6.0)
        spacing = tl.exp2(e - 3.0)
        return (tl.floor(p / spacing + 0.5) * spacing).to(tl.float16)
    else:
        return p.to(tl.float8e4nv)


@triton.jit
def _fp8_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, lo, hi, n_q, n_k, logit_scale,
              stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn, stride_vd,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
              DESC: tl.constexpr, EMULATE: tl.constexpr, PROMOTE: tl.constexpr):
    """Fold key blocks [lo, hi) into the running (acc, l_i, m_i) of one query block q [BLOCK_M, D].
    logit_scale = q_scale · k_scale · sm_scale · log2 e: logits in log2 units from raw fp8 products.
    PROMOTE: P · V of each tile is added to acc in fp32 (else acc goes into the product, whose fp8
    accumulation on sm_90 is imprecise, as Triton's tutorial does)."""
    for start_n in range(lo, hi, BLOCK_N):
        k = _load_tile(K, off_b, off_hk, start_n, n_k, stride_kb, stride_kh, stride_kn, stride_kd,
                       BLOCK_N, HEAD_DIM, MASKED, DESC, EMULATE)                        # [BLOCK_N, D]
        qk = tl.dot(q, tl.trans(k))                                    # [BLOCK_M, BLOCK_N] fp32
        if MASKED:
            cols = start_n + tl.arange(0, BLOCK_N)
            visible = cols[None, :] < n_k
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + (n_k - n_q))
            s = tl.where(visible, qk * logit_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)      # a row that has seen no key yet
            p = tl.math.exp2(s - (m_sub - _P_SCALE_LOG2)[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * logit_scale)
            m_sub = m_new
            p = tl.math.exp2(qk * logit_scale - (m_new - _P_SCALE_LOG2)[:, None])   # one FMA, then exp2
        alpha = tl.math.exp2(m_i - m_sub)                              # rescales the old state
        l_i = l_i * alpha + tl.sum(p, 1)                               # fp32, P before rounding
        v = _load_v_tile(V, off_b, off_hk, start_n, n_k, stride_vb, stride_vh, stride_vn, stride_vd,
                         BLOCK_N, HEAD_DIM, MASKED, DESC, EMULATE)                      # [BLOCK_N, D]
        if PROMOTE:
            acc = acc * alpha[:, None] + tl.dot(round_e4m3(p, EMULATE), v)
        else:
            acc = tl.dot(round_e4m3(p, EMULATE), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_fp8(Q, K, V, O, Q_SCALE, K_SCALE, V_SCALE, sm_scale_log2,
                  stride_qb, stride_qh, stride_qm, stride_qd,
                  stride_kb, stride_kh, stride_kn, stride_kd,
                  stride_vb, stride_vh, stride_vn, stride_vd,
                  stride_ob, stride_oh, stride_om, stride_od,
                  n_heads, group, n_q, n_k,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                  DESC: tl.constexpr, EMULATE: tl.constexpr, PROMOTE: tl.constexpr):
    """O = softmax(Q Kᵀ · scale) V · v_scale for one block of BLOCK_M queries of one (batch, head), from
    e4m3 inputs. grid = (cdiv(Nq, BLOCK_M), Hq, B). Q_SCALE [B, Hq], K_SCALE and V_SCALE [B, Hkv]:
    contiguous fp32. DESC = 2: Q, K, O are host-built descriptors over [B, H, N, D] and V one over V
    transposed, [B, Hkv, D, N] (the strides are then unused); DESC = 0: pointers with strides."""
    start_m = tl.program_id(0)
    if CAUSAL:  # the last query blocks read the most keys: start them first
        start_m = tl.num_programs(0) - 1 - start_m
    off_b, off_h = tl.program_id(2), tl.program_id(1)
    off_bh = off_b * n_heads + off_h
    off_hk = off_h // group                                            # the shared K/V head
    kv_heads = n_heads // group
    q_scale = tl.load(Q_SCALE + off_bh)
    k_scale = tl.load(K_SCALE + off_b * kv_heads + off_hk)
    v_scale = tl.load(V_SCALE + off_b * kv_heads + off_hk)
    logit_scale = q_scale * k_scale * sm_scale_log2

    row0 = start_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)                                # [BLOCK_M] query indices
    q = _load_tile(Q, off_b, off_h, row0, n_q, stride_qb, stride_qh, stride_qm, stride_qd,
                   BLOCK_M, HEAD_DIM, True, DESC, EMULATE)             # [BLOCK_M, D]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # keys [0, whole) every row of the block sees in full blocks; [whole, hi) need a mask
    if CAUSAL:
        hi = tl.maximum(tl.minimum(row0 + BLOCK_M + n_k - n_q, n_k), 0)
        whole = tl.maximum(tl.minimum(row0 + 1 + n_k - n_q, n_k), 0) // BLOCK_N * BLOCK_N
    else:
        hi = n_k
        whole = n_k // BLOCK_N * BLOCK_N
    acc, l_i, m_i = _fp8_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, 0, whole, n_q, n_k, logit_scale,
                              stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn,
                              stride_vd, HEAD_DIM, BLOCK_N, False, CAUSAL, DESC, EMULATE, PROMOTE)
    acc, l_i, m_i = _fp8_keys(acc, l_i, m_i, q, K, V, off_b, off_hk, rows, whole, hi, n_q, n_k, logit_scale,
                              stride_kb, stride_kh, stride_kn, stride_kd, stride_vb, stride_vh, stride_vn,
                              stride_vd, HEAD_DIM, BLOCK_N, True, CAUSAL, DESC, EMULATE, PROMOTE)

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                            # a row that saw no key gives 0
    o = acc * (v_scale / l_safe)[:, None]                              # P's 2⁸ cancels in acc / l
    if DESC:
        O.store([off_b, off_h, row0, 0], o.to(O.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    else:
        cols = tl.arange(0, HEAD_DIM)
        ptrs = (O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
                + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_od)
        tl.store(ptrs, o.to(O.dtype.element_ty), mask=rows[:, None] < n_q)


# ------------------------------------------------------------------------------------ quantising
def dequantize(x8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x8 [B, H, N, D] · scale [B, H] in float32: the values the kernel computes with."""
    return x8.float() * scale.to(x8.device, torch.float32)[:, :, None, None]


def _quantize_heads(x: torch.Tensor, name: str = "x") -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, H, N, D] -> (x8 [B, H, N, D] contiguous e4m3, scale [B, H] fp32 = amax / 448 per (b, h))."""
    b, h, n, d = x.shape
    per_head = x.permute(2, 0, 1, 3).reshape(n, b * h, d)       # [N, B·H, D]: one "KV head" per (b, h)
    scale = fp8_scales(per_head, name)                           # [B·H]; ValueError unless finite
    x8 = quantize_fp8(per_head, scale).reshape(n, b, h, d).permute(1, 2, 0, 3).contiguous()
    return x8, scale.reshape(b, h)


def quantize_for_attention(q, k, v):
    """(q8, k8, v8, q_scale, k_scale, v_scale): float8_e4m3fn copies of fp16, bf16 or fp32 q [B, Hq, N, D],
    k, v [B, Hkv, Nk, D] and float32 scales [B, H] (amax / 448 of each (batch, head)), x ≈ x8 · scale.
    v8 is stored transposed (memory [B, Hkv, D, Nk], shape [B, Hkv, Nk, D]), as sm_90 wants it."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, 4, "[B, H, N, D]", INPUT_DTYPES)
    validation.same("device", q=q, k=k, v=v)
    _check_shapes(q, k, v, names=("q", "k", "v"))
    (q8, q_scale), (k8, k_scale), (v8, v_scale) = (_quantize_heads(t, name)
                                                   for name, t in (("q", q), ("k", k), ("v", v)))
    v8 = v8.transpose(-1, -2).contiguous().transpose(-1, -2)     # same values, N the fastest dimension
    return q8, k8, v8, q_scale, k_scale, v_scale


# ------------------------------------------------------------------------------------ input checks
def _check_shapes(q, k, v, names) -> None:
    """Batch, heads, head dims of [B, H, N, D] q, k, v (``names`` in the messages)."""
    nq, nk, nv = names
    if k.shape != v.shape:
        raise ValueError(f"{nk}, {nv}: must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"{nq}, {nk}: batch sizes differ ({q.shape[0]} vs {k.shape[0]})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{nq}, {nk}: head dims differ ({q.shape[-1]} vs {k.shape[-1]})")
    validation.head_groups(f"{nq}, {nk}", q.shape[1], k.shape[1])


def _check_scale(name: str, scale, shape: tuple, device) -> None:
    if not isinstance(scale, torch.Tensor):
        raise ValueError(f"{name}: expected a float32 tensor of shape {list(shape)}, got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise ValueError(f"{name}: dtype {scale.dtype} is not supported; use float32")
    if tuple(scale.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)} (one scale per batch and head), "
                         f"got {list(scale.shape)}")
    if scale.device != device:
        raise ValueError(f"{name}: must be on q8's device {device}, got {scale.device}")
    if device.type == "cpu" and not bool(torch.all(torch.isfinite(scale) & (scale > 0))):
        raise ValueError(f"{name}: every scale must be positive and finite")


def check_fp8_inputs(q8, k8, v8, q_scale, k_scale, v_scale, out_dtype=torch.float16) -> None:
    """Raise ValueError naming the argument and the rule unless these are valid ``flash_attention_fp8``
    inputs (the scales' values are checked on CPU tensors only: reading them on a GPU synchronises)."""
    for name, t in (("q8", q8), ("k8", k8), ("v8", v8)):
        validation.tensor(name, t, 4, "[B, H, N, D]", (FP8,))
    validation.same("device", q8=q8, k8=k8, v8=v8)
    validation.kernel_device("q8", q8)
    _check_shapes(q8, k8, v8, names=("q8", "k8", "v8"))
    validation.head_dim("q8", q8.shape[-1], SUPPORTED_HEAD_DIMS)
    batch, heads, heads_kv = q8.shape[0], q8.shape[1], k8.shape[1]
    validation.grid_axis("q8", "batch B", batch)                      # the grid: (query blocks, Hq, B)
    validation.grid_axis("q8", "heads H", heads)
    _check_scale("q_scale", q_scale, (batch, heads), q8.device)
    _check_scale("k_scale", k_scale, (batch, heads_kv), q8.device)
    _check_scale("v_scale", v_scale, (batch, heads_kv), q8.device)
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype: {out_dtype!r} is not supported; use torch.float16, torch.bfloat16 or "
                         "torch.float32")


# ---------------------------------------------------------------------------------------- launch
def v_transposed(v8: torch.Tensor) -> torch.Tensor:
    """V [B, H, N, D] as a contiguous [B, H, D, N] tensor (no copy when v8 is already stored so)."""
    vt = v8.transpose(-1, -2)
    return vt if vt.is_contiguous() else vt.contiguous()


def forward(q8, k8, v8, q_scale, k_scale, v_scale, causal: bool, sm_scale: float, out_dtype,
             desc: bool | None = None, config: BlockConfig | None = None, promote: bool = True) -> torch.Tensor:
    """The launch (inputs already checked). ``desc``: None chooses (descriptors where usable); True
    asks for descriptors where usable; False forces pointer loads. ``config``: the launch configuration
    on a GPU (``dispatch.fp8_config`` picks it otherwise; the interpreter always takes one small one).
    ``promote``: step 4 of the module docstring; False passes the accumulator into the product instead
    (fewer registers, sums over all key tiles in the tensor cores' reduced precision), for measuring the
    trade-off."""
    where = q8.device
    q8, k8, v8, q_scale, k_scale, v_scale = to_kernel_device(q8, k8, v8, q_scale, k_scale, v_scale)
    emulate = triton_interprets()
    q8, k8, v8 = (fp8_read(t) for t in (q8, k8, v8))          # NaN bytes on the interpreter (fp8_read)
    batch, heads, n_q, head_dim = q8.shape
    n_k = k8.shape[2]
    buffer_dtype = torch.float32 if out_dtype == torch.bfloat16 and bf16_computed_in_fp32(q8.device) else out_dtype
    o = torch.empty((batch, heads, n_q, head_dim), dtype=buffer_dtype, device=q8.device)
    q_scale, k_scale, v_scale = (s.contiguous() for s in (q_scale, k_scale, v_scale))
    strides = [st for t in (q8, k8, v8, o) for st in t.stride()]
    vt = v_transposed(v8) if desc is not False and fp8_descriptors_usable(q8, k8, n_k) else None   # [B, Hkv, D, Nk]
    use_desc = vt is not None and vt.data_ptr() % 16 == 0
    config = fp8_config(causal, use_desc, config)
    if use_desc:
        from triton.tools.tensor_descriptor import TensorDescriptor

        def descriptor(t, rows, cols):
            return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols])
        tensors = (descriptor(q8, config.block_m, head_dim), descriptor(k8, config.block_n, head_dim),
                   descriptor(vt, head_dim, config.block_n), descriptor(o, config.block_m, head_dim))
    else:
        tensors = (q8, k8, v8, o)
    grid = (triton.cdiv(n_q, config.block_m), heads, batch)
    with on_device(q8.device):
        _attn_fwd_fp8[grid](*tensors, q_scale, k_scale, v_scale, sm_scale * LOG2E, *strides,
                            heads, heads // k8.shape[1], n_q, n_k,
                            HEAD_DIM=head_dim, BLOCK_M=config.block_m, BLOCK_N=config.block_n, CAUSAL=causal,
                            DESC=HOST_DESCRIPTORS if use_desc else POINTERS, EMULATE=emulate, PROMOTE=promote,
                            **launch_options(num_warps=config.num_warps, num_stages=config.num_stages))
    return o.to(where, out_dtype)


def flash_attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale, *, causal: bool = False,
                        sm_scale: float | None = None, out_dtype=torch.float16) -> torch.Tensor:
    """softmax(sm_scale · (q8 · q_scale)(k8 · k_scale)ᵀ [+ causal mask]) (v8 · v_scale), forward only.

    q8 [B, Hq, Nq, D], k8 and v8 [B, Hkv, Nk, D] float8_e4m3fn, D = 64 or 128; q_scale float32
    [B, Hq], k_scale and v_scale float32 [B, Hkv] (``quantize_for_attention`` makes all six).
    Returns o [B, Hq, Nq, D] in ``out_dtype``. See the module docstring for the algorithm, where it runs
    and its accuracy.
    """
    check_fp8_inputs(q8, k8, v8, q_scale, k_scale, v_scale, out_dtype)
    causal = validation.flag("causal", causal)
    sm_scale = validation.softmax_scale(sm_scale, q8.shape[-1])
    with torch.no_grad():
        return forward(q8, k8, v8, q_scale, k_scale, v_scale, causal, sm_scale, out_dtype)


def attention_flops(batch: int, heads: int, n_q: int, n_k: int, head_dim: int, causal: bool) -> float:
    """Floating-point operations of the forward: 4 · D per visible (query, key) pair (two products)."""
    return 4.0 * batch * heads * head_dim * (_causal_pairs(n_q, n_k) if causal else n_q * n_k)


def _causal_pairs(n_q: int, n_k: int) -> int:
    """Σ_i max(0, min(Nk, i + Nk − Nq + 1)) over the rows i < Nq, in closed form: row i sees
    i + Nk − Nq + 1 keys (the last row all Nk); rows before Nq − Nk see none."""
    first = max(0, n_q - n_k)
    rows = n_q - first
    return rows * (first + n_k - n_q + 1) + rows * (rows - 1) // 2


__all__ = ["flash_attention_fp8", "quantize_for_attention", "dequantize", "check_fp8_inputs", "attention_flops",
           "SUPPORTED_HEAD_DIMS", "REL_TOL_DEQUANTISED", "REL_TOL_QUANTISED", "FP8", "FP8_MAX", "GPU_CONFIGS",
           "POINTER_CONFIG"]
