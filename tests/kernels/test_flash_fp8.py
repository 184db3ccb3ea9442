"""The FP8 (e4m3) FlashAttention forward (attnkit.kernels.flash.fp8) against float64 references.

Two references: attention of the dequantised inputs x8 · scale (what the kernel computes with, so only
its rounding of P to e4m3 is left: REL_TOL_DEQUANTISED), and attention of the original fp16 inputs
(the quantisation error too: REL_TOL_QUANTISED). On a CPU the kernel runs in Triton's interpreter with
16-row tiles, so every N below is ragged (not a multiple of 16) or spans several tiles.
"""
from __future__ import annotations

import math

import pytest
import torch

from attnkit.device import triton_interprets
from attnkit.kernels.flash import fp8
from attnkit.kernels.flash.fp8 import (
    FP8,
    REL_TOL_DEQUANTISED,
    REL_TOL_QUANTISED,
    attention_flops,
    dequantize,
    flash_attention_fp8,
    quantize_for_attention,
)
from attnkit.reference.attention import attention_ref
from attnkit.tolerances import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(seed, b, hq, hkv, nq, nk, d, dtype=torch.float16):
    """Fresh N(0, 1) q [b, hq, nq, d], k, v [b, hkv, nk, d]."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)

    return randn(b, hq, nq, d), randn(b, hkv, nk, d), randn(b, hkv, nk, d)


def dequantised_reference(q8, k8, v8, qs, ks, vs, causal, sm_scale=None):
    return attention_ref(dequantize(q8, qs), dequantize(k8, ks), dequantize(v8, vs), causal=causal,
                         sm_scale=sm_scale)


CASES = [  # (b, hq, hkv, nq, nk, d, causal)
    (1, 2, 2, 37, 37, 64, False),
    (1, 2, 2, 37, 37, 64, True),
    (2, 4, 2, 45, 45, 64, True),          # GQA, 2 query heads per K/V head
    (1, 3, 1, 29, 50, 128, False),        # MQA, Nq != Nk
    (1, 2, 1, 20, 50, 128, True),         # causal aligned to the end: every row sees 31 keys or more
    (1, 2, 2, 50, 20, 64, True),          # Nq > Nk: the first 30 rows see no key and give 0
    (1, 1, 1, 1, 1, 64, False),
]


# ------------------------------------------------------------------------------------ the kernel
@pytest.mark.parametrize("b, hq, hkv, nq, nk, d, causal", CASES)
def test_matches_float64_references(b, hq, hkv, nq, nk, d, causal):
    q, k, v = make_inputs(sum((b, hq, hkv, nq, nk, d, causal)), b, hq, hkv, nq, nk, d)
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    o = flash_attention_fp8(q8, k8, v8, qs, ks, vs, causal=causal)
    assert o.shape == q.shape and o.dtype == torch.float16 and o.device == q.device
    err_dequantised = rel_error(o, dequantised_reference(q8, k8, v8, qs, ks, vs, causal))
    err_original = rel_error(o, attention_ref(q, k, v, causal=causal))
    assert err_dequantised <= REL_TOL_DEQUANTISED, f"against the dequantised inputs: {err_dequantised:.3e}"
    assert err_original <= REL_TOL_QUANTISED, f"against the fp16 inputs: {err_original:.3e}"


def test_rows_that_see_no_key_are_zero():
    q, k, v = make_inputs(3, 1, 2, 2, 40, 17, 64)
    o = flash_attention_fp8(*quantize_for_attention(q, k, v), causal=True)
    blind = 40 - 17                                    # rows i < Nq - Nk see no key
    assert torch.all(o[:, :, :blind] == 0)
    assert torch.all(o[:, :, blind:].abs().sum(-1) > 0)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to float8_e4m3fn (round to nearest even), back in float64."""
    return x.float().to(FP8).double()


@pytest.mark.parametrize("causal, hq, hkv", [(False, 2, 2), (True, 4, 2)])
def test_one_key_tile_rounds_p_to_e4m3_exactly(causal, hq, hkv):
    """With at most 16 keys a row's keys lie in one tile, so its running maximum is the row's maximum
    and the kernel's P is the float64 weights exp(s − max) · 2⁸ rounded to e4m3: the reference does the
    same rounding, and only fp32 arithmetic separates the two (out_dtype float32)."""
    nq, nk, d = 11, 13, 64                             # every row sees a key
    q, k, v = make_inputs(5 + hq, 1, hq, hkv, nq, nk, d)
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    sm_scale = 0.3
    o = flash_attention_fp8(q8, k8, v8, qs, ks, vs, causal=causal, sm_scale=sm_scale, out_dtype=torch.float32)
    group = hq // hkv
    q64 = dequantize(q8, qs).double().cpu()
    k64 = dequantize(k8, ks).double().cpu().repeat_interleave(group, 1)
    v64 = dequantize(v8, vs).double().cpu().repeat_interleave(group, 1)
    s = q64 @ k64.transpose(-1, -2) * sm_scale
    if causal:
        visible = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + nk - nq
        s = s.masked_fill(~visible, -math.inf)
    p = torch.exp(s - s.amax(-1, keepdim=True)) * 2.0 ** fp8.P_SCALE_LOG2
    ref = (e4m3(p) @ v64) / p.sum(-1, keepdim=True)
    assert rel_error(o, ref) <= 1e-3
    # the rounding matters: without it the reference is much further away
    assert rel_error(o, (p @ v64) / p.sum(-1, keepdim=True)) > 5e-3


def test_small_weights_keep_their_precision():
    """Long rows of small weights: sharp logits over 2000 keys put most of P below 2⁻⁶, where e4m3 is
    subnormal (coarse) unless P is scaled up first; v has mean 1, so lost weight shows as a bias.
    Measured: 2.7e-3 with P scaled by 2⁸, 1.3e-2 with P kept in [0, 1]."""
    gen = torch.Generator().manual_seed(31)
    q, k = (torch.randn(1, 1, n, 64, generator=gen).to(DEVICE, torch.float16) for n in (3, 2000))
    v = (torch.randn(1, 1, 2000, 64, generator=gen) + 1).to(DEVICE, torch.float16)
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    o = flash_attention_fp8(q8, k8, v8, qs, ks, vs, sm_scale=0.5, out_dtype=torch.float32)
    assert rel_error(o, dequantised_reference(q8, k8, v8, qs, ks, vs, False, sm_scale=0.5)) <= 6e-3


def test_scales_are_applied():
    """Scaling an input and its scale inversely changes nothing; scaling v's scale scales the output."""
    q, k, v = make_inputs(7, 1, 2, 2, 33, 33, 64)
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    o = flash_attention_fp8(q8, k8, v8, qs, ks, vs, out_dtype=torch.float32)
    assert torch.allclose(flash_attention_fp8(q8, k8, v8, qs, ks, vs * 4, out_dtype=torch.float32), o * 4)
    logits_doubled = flash_attention_fp8(q8, k8, v8, qs * 2, ks, vs, out_dtype=torch.float32)
    same_logits = flash_attention_fp8(q8, k8, v8, qs, ks, vs, sm_scale=2 / math.sqrt(64), out_dtype=torch.float32)
    assert torch.allclose(logits_doubled, same_logits)
    assert not torch.allclose(logits_doubled, o, atol=1e-2)


def test_non_contiguous_views_give_the_same_output():
    """q8 and k8 as views of [B, N, H, D] tensors, v8 with D contiguous or N contiguous, scales strided."""
    q, k, v = make_inputs(11, 2, 4, 2, 35, 35, 64)
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    expected = flash_attention_fp8(q8, k8, v8, qs, ks, vs, causal=True)
    q8_view, k8_view = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q8, k8))
    v8_rows = v8.contiguous()                                   # D contiguous, not the kernel's favourite
    qs_view = qs.t().contiguous().t()
    assert not q8_view.is_contiguous() and v8.stride(2) == 1 and v8_rows.stride(3) == 1
    assert not qs_view.is_contiguous()
    for args in ((q8_view, k8_view, v8, qs_view, ks, vs), (q8, k8, v8_rows, qs, ks, vs)):
        assert torch.equal(flash_attention_fp8(*args, causal=True), expected)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_out_dtype(out_dtype):
    q, k, v = make_inputs(13, 1, 2, 1, 21, 21, 64)
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    o = flash_attention_fp8(q8, k8, v8, qs, ks, vs, out_dtype=out_dtype)
    assert o.dtype == out_dtype
    assert rel_error(o, dequantised_reference(q8, k8, v8, qs, ks, vs, False)) <= REL_TOL_DEQUANTISED


# ------------------------------------------------------------------------------------ quantising
def test_quantize_for_attention():
    q, k, v = make_inputs(17, 2, 4, 2, 19, 23, 64, dtype=torch.float32)
    q[1, 3] *= 100                                                  # a head with its own range
    k[0, 1] = 0                                                     # an all-zero head
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    for x, x8, scale in ((q, q8, qs), (k, k8, ks), (v, v8, vs)):
        assert x8.dtype == FP8 and x8.shape == x.shape and scale.shape == x.shape[:2]
        assert scale.dtype == torch.float32
        amax = x.abs().amax(dim=(2, 3))
        assert torch.allclose(scale, (amax / 448).clamp_min(torch.finfo(torch.float32).tiny))
        back = dequantize(x8, scale)
        assert torch.all(torch.isfinite(back))
        # e4m3 keeps 3 mantissa bits: within 2⁻⁴ of each value, or below the subnormal spacing
        assert torch.all((back - x).abs() <= x.abs() / 16 + scale[:, :, None, None] * 2.0 ** -10)
    assert torch.all(k8[0, 1].float() == 0)
    assert q8.is_contiguous() and k8.is_contiguous()
    assert v8.stride(2) == 1 and v8.transpose(-1, -2).is_contiguous()   # V transposed in memory


@pytest.mark.skipif(not triton_interprets(), reason="the emulated rounding runs in the interpreter")
def test_emulated_rounding_matches_e4m3():
    import triton
    import triton.language as tl

    @triton.jit
    def round_kernel(X, Y, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(Y + offs, fp8.round_e4m3(tl.load(X + offs), True).to(tl.float32))

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(2048, generator=gen) * 256, torch.rand(1024, generator=gen) * 2.0 ** -5,
                   torch.rand(1024, generator=gen) * 2.0 ** -9, torch.tensor([0.0, 256.0, 1.0, 2.0 ** -6])])
    x = torch.cat([x, torch.zeros(8192 - x.numel())])
    y = torch.empty_like(x)
    round_kernel[(1,)](x, y, N=x.numel())
    expected = x.to(FP8).float()
    differs = y != expected
    # ties (exactly half way) are rounded up rather than to even: none in random data
    assert int(differs.sum()) == 0, f"{int(differs.sum())} values differ, e.g. {x[differs][:4].tolist()}"


# ------------------------------------------------------------------------------------ bad inputs
def _valid():
    q, k, v = make_inputs(19, 1, 4, 2, 17, 17, 64)
    return list(quantize_for_attention(q, k, v))


@pytest.mark.parametrize("position, replace, match", [
    (0, lambda t: t.float(), "q8: dtype"),
    (1, lambda t: t.to(torch.float8_e5m2), "k8: dtype"),
    (2, lambda t: t[0], "v8: expected 4 dimensions"),
    (0, lambda t: torch.zeros(1, 4, 17, 96, dtype=FP8, device=t.device), "q8, k8: head dims differ"),
    (2, lambda t: t[:, :, :9], "k8, v8: must have the same shape"),
    (0, lambda t: t[:, :3], "Hq=3 must be a multiple"),
    (0, lambda t: torch.cat([t, t]), "q8, k8: batch sizes differ"),
    (3, lambda s: s.double(), "q_scale: dtype"),
    (4, lambda s: s[:, :1], r"k_scale: expected shape \[1, 2\]"),
    (5, lambda s: s[0], r"v_scale: expected shape \[1, 2\]"),
    (5, lambda s: s.tolist(), "v_scale: expected a float32 tensor"),
    (4, lambda s: s.to("meta"), "k_scale: must be on q8's device"),
])
def test_bad_inputs_raise(position, replace, match):
    args = _valid()
    args[position] = replace(args[position])
    with pytest.raises(ValueError, match=match):
        flash_attention_fp8(*args)


def test_unsupported_head_dim_raises():
    q, k, v = make_inputs(23, 1, 2, 2, 17, 17, 32)
    with pytest.raises(ValueError, match=r"q8: head dim D=32 is not supported; D must be one of \(64, 128\)"):
        flash_attention_fp8(*quantize_for_attention(q, k, v))


@pytest.mark.skipif(DEVICE != "cpu", reason="scale values are checked on CPU tensors only")
def test_non_positive_scale_raises():
    args = _valid()
    args[3] = args[3].clone()
    args[3][0, 1] = 0.0
    with pytest.raises(ValueError, match="q_scale: every scale must be positive"):
        flash_attention_fp8(*args)


@pytest.mark.parametrize("options, match", [
    (dict(causal=1), "causal: expected True or False"),
    (dict(sm_scale=-1.0), "sm_scale: expected a positive finite number"),
    (dict(out_dtype=torch.float8_e4m3fn), "out_dtype: .* is not supported"),
])
def test_bad_options_raise(options, match):
    with pytest.raises(ValueError, match=match):
        flash_attention_fp8(*_valid(), **options)


@pytest.mark.parametrize("replace, match", [
    (lambda q, k, v: (q.int(), k, v), "q: dtype torch.int32 is not supported"),
    (lambda q, k, v: (q, k, v[:, :, :5]), "k, v: must have the same shape"),
    (lambda q, k, v: (q, k[:, :, :, :32], v[:, :, :, :32]), "q, k: head dims differ"),
    (lambda q, k, v: (q, k.to("meta"), v), "q, k, v: must be on one device"),
])
def test_quantize_bad_inputs_raise(replace, match):
    q, k, v = make_inputs(29, 1, 2, 2, 9, 9, 64)
    with pytest.raises(ValueError, match=match):
        quantize_for_attention(*replace(q, k, v))


# ------------------------------------------------------------------------------------ bookkeeping
@pytest.mark.parametrize("n_q, n_k", [(5, 5), (3, 7), (7, 3), (1, 1), (16, 33), (4096, 4096)])
def test_attention_flops_counts_visible_pairs(n_q, n_k):
    pairs = sum(max(0, min(n_k, i + n_k - n_q + 1)) for i in range(n_q))
    assert attention_flops(2, 3, n_q, n_k, 64, True) == 4.0 * 2 * 3 * 64 * pairs
    assert attention_flops(2, 3, n_q, n_k, 64, False) == 4.0 * 2 * 3 * 64 * n_q * n_k


def test_accumulator_in_the_product_gives_the_same_result():
    """promote=False (the accumulator passed into P · V) computes the same sums, in another order."""
    q, k, v = make_inputs(37, 1, 2, 1, 41, 41, 64)
    quantised = quantize_for_attention(q, k, v)
    args = (*quantised, True, 1 / 8, torch.float32)
    assert torch.allclose(fp8.forward(*args, promote=False), fp8.forward(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not triton_interprets(), reason="forces the descriptor path, which the interpreter runs anywhere")
@pytest.mark.parametrize("n_q, n_k, causal", [(37, 48, False), (45, 32, True)])
def test_descriptor_path_matches_pointer_path(monkeypatch, n_q, n_k, causal):
    """The sm_90 path (host tensor descriptors, V transposed loaded as [D, BLOCK_N] and transposed in
    registers), run in the interpreter: the same output, bit for bit, as pointer loads."""
    pytest.importorskip("triton.tools.tensor_descriptor")
    taken = []
    transposed = fp8.v_transposed
    monkeypatch.setattr(fp8, "fp8_descriptors_usable", lambda q8, k8, n: n % 16 == 0)
    monkeypatch.setattr(fp8, "v_transposed", lambda v8: taken.append(v8.shape) or transposed(v8))
    q, k, v = make_inputs(43, 2, 4, 2, n_q, n_k, 64)
    quantised = quantize_for_attention(q, k, v)
    args = (*quantised, causal, 0.125, torch.float16)
    with_descriptors = fp8.forward(*args, desc=True)
    assert taken, "the descriptor path was not taken"
    assert torch.equal(with_descriptors, fp8.forward(*args, desc=False))
    ref = dequantised_reference(*quantised, causal, sm_scale=0.125)
    assert rel_error(with_descriptors, ref) <= REL_TOL_DEQUANTISED


# ------------------------------------------------------------------------------------ the GPU script
@pytest.fixture(scope="module")
def gpu_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_flash_fp8.py"
    spec = importlib.util.spec_from_file_location("gpu_flash_fp8", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_script_reference_is_attention(gpu_script):
    q, k, v = make_inputs(41, 2, 3, 3, 21, 21, 64, dtype=torch.float32)
    for causal in (False, True):
        ref = gpu_script.reference_fp32(q, k, v, causal, heads=2, chunk=8)
        assert rel_error(ref, attention_ref(q, k, v, causal=causal)[0, :2]) <= 1e-5


def test_gpu_script_rows_on_a_small_case(gpu_script):
    """One small case through the script's own code: rows for every implementation, the fp8 and fp16
    errors where they belong, and a backend that cannot run recorded with its reason."""
    device = torch.device(DEVICE)
    rows = gpu_script.attention_rows(19, True, device, heads=2, head_dim=64, tokens=19)
    by_impl = {r["impl"]: r for r in rows}
    assert {"fp8_quantize", "fp8", "fp16_attnkit", "fp16_sdpa_cudnn"} <= set(by_impl)
    assert by_impl["fp8"]["note"] == "" and by_impl["fp8"]["rel_err"] <= REL_TOL_QUANTISED
    assert by_impl["fp16_attnkit"]["rel_err"] <= 2e-3
    assert by_impl["fp8"]["ms"] > 0 and by_impl["fp8"]["tflops"] > 0
    cudnn = by_impl["fp16_sdpa_cudnn"]
    assert cudnn["note"] or cudnn["ms"] > 0
    gpu_script.summary(rows)


# ------------------------------------------------------------------------------------ compiled for sm_90
COMPILE_FOR_SM90 = r'''
import os, re
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnkit.kernels.flash import fp8

fn = fp8._attn_fwd_fp8
D = 128
variants = [(fp8.HOST_DESCRIPTORS, c) for c in fp8.GPU_CONFIGS.values()]
variants.append((fp8.POINTERS, fp8.POINTER_CONFIG))
for desc, config in variants:
    m, n = config.block_m, config.block_n
    if desc:
        tiles = dict(Q=[1, 1, m, D], K=[1, 1, n, D], V=[1, 1, D, n])
        signature = {name: f"tensordesc<fp8e4nv[{','.join(map(str, shape))}]>" for name, shape in tiles.items()}
        signature["O"] = f"tensordesc<fp16[1,1,{m},{D}]>"
    else:
        signature = dict(Q="*fp8e4nv", K="*fp8e4nv", V="*fp8e4nv", O="*fp16")
    constexprs = dict(HEAD_DIM=D, BLOCK_M=m, BLOCK_N=n, CAUSAL=True, DESC=desc, EMULATE=False, PROMOTE=True)
    for name in fn.arg_names:
        if name not in signature:
            signature[name] = ("constexpr" if name in constexprs else "*fp32" if name.endswith("_SCALE")
                               else "fp32" if name == "sm_scale_log2" else "i32")
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=config.num_warps, num_stages=config.num_stages)).asm["ptx"]
    fp8_products = len(re.findall(r"wgmma\.mma_async[^\n]*e4m3\.e4m3", ptx))
    tma = len(re.findall(r"cp\.async\.bulk\.tensor", ptx))
    print("compiled", desc, fp8_products, tma)
'''


@pytest.mark.slow
def test_kernel_compiles_to_fp8_tensor_core_products_for_an_h100():
    """Compiled for sm_90 (no GPU needed), both products run on fp8 tensor cores (wgmma with e4m3
    operands: V transposed is what lets P · V do so), and the descriptor kernel moves tiles by TMA."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines() if line.startswith("compiled")]
    assert len(lines) == len(fp8.GPU_CONFIGS) + 1, result.stdout
    for _, desc, fp8_products, tma in lines:
        assert int(fp8_products) > 0, f"DESC={desc}: no fp8 wgmma in the PTX"
        assert (int(tma) > 0) == (desc == "2"), f"DESC={desc}: {tma} TMA copies"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_more_batch_and_head_pairs_than_one_grid_axis_holds():
    """B · Hq = 2048 · 33 = 67,584 (batch, head) pairs, past the 65,535 programs one axis of a CUDA grid
    holds: every head matches float64 on its dequantised inputs."""
    q, k, v = make_inputs(33, 2048, 33, 11, 5, 7, 64)
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    o = flash_attention_fp8(q8, k8, v8, qs, ks, vs, causal=True)
    assert rel_error(o, dequantised_reference(q8, k8, v8, qs, ks, vs, True)) <= REL_TOL_DEQUANTISED


def test_more_heads_than_one_grid_axis_holds_are_refused():
    q, k, v = (t.expand(1, 65536, 1, 64) for t in make_inputs(3, 1, 1, 1, 1, 1, 64))
    q8, k8, v8, qs, ks, vs = quantize_for_attention(q, k, v)
    with pytest.raises(ValueError, match=r"q8: heads H = 65536 is more than one launch runs \(65535"):
        flash_attention_fp8(q8, k8, v8, qs, ks, vs)


# ------------------------------------------------------------------------------------ hostile input
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_quantize_refuses_values_without_a_finite_scale(which, value):
    """A NaN or an infinity would make its head's scale NaN or infinite (every value of the head lost)."""
    q, k, v = make_inputs(3, 1, 2, 1, 9, 9, 64)
    {"q": q, "k": k, "v": v}[which][0, 0, 4, 5] = value
    with pytest.raises(ValueError, match=f"{which}: holds a NaN or an infinity"):
        quantize_for_attention(q, k, v)


def test_an_fp8_nan_byte_gives_a_nan_row():
    """e4m3's NaN byte in k8: the rows whose scores read it are NaN, as on a GPU (the interpreter alone
    would read it as 480: paged_extend.fp8_read); the other rows are unchanged."""
    q8, k8, v8, qs, ks, vs = quantize_for_attention(*make_inputs(4, 1, 2, 1, 20, 20, 64))
    clean = flash_attention_fp8(q8, k8, v8, qs, ks, vs, causal=True)
    k8 = k8.clone()
    k8.view(torch.uint8)[0, 0, 7, 3] = 0x7F           # key 7: causal rows 7 .. 19 see it
    got = flash_attention_fp8(q8, k8, v8, qs, ks, vs, causal=True)
    assert torch.isnan(got[:, :, 7:]).all()
    assert torch.equal(got[:, :, :7], clean[:, :, :7])
