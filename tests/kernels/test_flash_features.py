"""FlashAttention for the models people run (attnkit.kernels.flash): any head dim from 8 to 256, a value
head dim of its own, packed variable-length sequences, sliding windows and logit softcapping, forward
and backward.

fp32 is compared with a float64 reference by attnkit.tolerances; fp16 and bf16 by FlashAttention-2's own
criterion: the kernel's max error against an fp32 reference is at most twice that of a plain PyTorch
implementation run in the same low precision, for out, dq, dk and dv. On a CPU the kernels run in
Triton's interpreter (16-row tiles), so the sizes are small and chosen not to be multiples of 16.
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from attnkit.kernels import flash
from attnkit.kernels.flash import (
    flash_attention,
    flash_attention_forward,
    flash_attention_varlen,
    layout,
    triton_kernels,
)
from attnkit.tolerances import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FA2_HEAD_DIMS = (8, 40, 59, 80, 96, 111, 112, 120, 160, 192, 224, 256)   # FlashAttention-2's grid, 8 and 256


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every buffer the kernels write starts as NaN: an element left unwritten fails the comparison."""
    monkeypatch.setattr(layout, "new_buffer",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))


# ------------------------------------------------------------------------------------- references
def attention_torch(q, k, v, *, causal=False, window=(-1, -1), softcap=None, sm_scale=None):
    """Plain PyTorch attention in the inputs' dtype, differentiable: q [B, Hq, Nq, D], k [B, Hkv, Nk, D],
    v [B, Hkv, Nk, Dv]. Query i sees key j when -left <= j - i - (Nk - Nq) <= right (-1: unbounded;
    causal: right = 0); logits s = scale · q·k, softcapped to softcap · tanh(s / softcap); a row that
    sees no key gives 0."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    diagonal = torch.arange(n_k)[None, :] - torch.arange(n_q)[:, None] - (n_k - n_q)
    left, right = window
    right = 0 if causal else right
    visible = torch.ones(n_q, n_k, dtype=torch.bool)
    if right >= 0:
        visible &= diagonal <= right
    if left >= 0:
        visible &= diagonal >= -left
    s = s.masked_fill(~visible.to(s.device), -math.inf)
    return torch.softmax(s.float(), -1).nan_to_num(0.0).to(q.dtype) @ v


def grads(fn, tensors, do, dtype):
    """(out, dq, dk, dv) of fn on copies of ``tensors`` in ``dtype`` (on the CPU), for output gradient do."""
    leaves = [t.detach().cpu().to(dtype).requires_grad_() for t in tensors]
    out = fn(*leaves)
    return (out, *torch.autograd.grad(out, leaves, do.cpu().to(dtype)))


def check(kernel, ref, tensors, dtype, what):
    """kernel and ref: functions of (q, k, v) -> o. fp32 against float64 with the course's tolerance;
    fp16/bf16 by FlashAttention-2's criterion (both against fp32, the kernel at most 2x the plain error)."""
    gen = torch.Generator().manual_seed(7)
    o_shape = ref(*tensors).shape
    do = torch.randn(o_shape, generator=gen).to(dtype).float()
    leaves = [t.detach().to(DEVICE, dtype).requires_grad_() for t in tensors]
    out = kernel(*leaves)
    got = (out, *torch.autograd.grad(out, leaves, do.to(DEVICE, dtype)))
    assert got[0].dtype == dtype and got[0].shape == o_shape
    names = ("out", "dq", "dk", "dv")
    if dtype == torch.float32:
        for name, g, r in zip(names, got, grads(ref, tensors, do, torch.float64)):
            assert torch.isfinite(g).all(), f"{what} {name}: not finite"
            assert_close(g, r, dtype, DEVICE, f"{what} {name}")
        return
    exact = grads(ref, [t.to(dtype) for t in tensors], do, torch.float32)
    plain = grads(ref, tensors, do, dtype)
    for name, g, p, r in zip(names, got, plain, exact):
        err = (g.detach().cpu().float() - r).abs().max().item()
        plain_err = (p.detach().float() - r).abs().max().item()
        assert err <= 2 * plain_err, f"{what} {name} {dtype}: error {err:.3g} > 2 x plain PyTorch's {plain_err:.3g}"


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def dense_case(seed, b, hq, hkv, nq, nk, d, dv=None):
    gen = torch.Generator().manual_seed(seed)
    return randn(gen, b, hq, nq, d), randn(gen, b, hkv, nk, d), randn(gen, b, hkv, nk, dv or d)


def dense(**options):
    """The kernel and the reference with the same options, as functions of (q, k, v)."""
    return (lambda q, k, v: flash_attention(q, k, v, **options),
            lambda q, k, v: attention_torch(q, k, v, **options))


# ------------------------------------------------------------------------------------- head dims
@pytest.mark.parametrize("d", FA2_HEAD_DIMS)
def test_every_head_dim_fp32(d):
    causal = d % 2 == 0
    check(*dense(causal=causal), dense_case(d, 1, 2, 1, 19, 23, d), torch.float32, f"D={d} causal={causal}")


@pytest.mark.parametrize("d", [40, 59, 96, 192])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_head_dims_low_precision(d, dtype):
    check(*dense(causal=True), dense_case(d + 1, 1, 2, 1, 21, 21, d), dtype, f"D={d}")


@pytest.mark.slow
@pytest.mark.parametrize("d", sorted(set(FA2_HEAD_DIMS) - {40, 59, 96, 192}))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_rest_of_the_head_dim_grid_low_precision(d, dtype):
    check(*dense(causal=False), dense_case(d + 2, 1, 2, 2, 17, 29, d), dtype, f"D={d}")


@pytest.mark.parametrize("d, dv, causal", [(192, 128, True), (40, 24, False), (16, 72, True)])
def test_value_head_dim_differs(d, dv, causal):
    tensors = dense_case(dv, 1, 2, 1, 18, 21, d, dv)
    o, lse = flash_attention_forward(*tensors, causal=causal)
    assert o.shape == (1, 2, 18, dv) and lse.shape == (1, 2, 18)
    check(*dense(causal=causal), tensors, torch.float32, f"D={d} Dv={dv}")


def test_value_head_dim_differs_low_precision():
    check(*dense(causal=True), dense_case(3, 1, 2, 1, 20, 20, 192, 128), torch.float16, "D=192 Dv=128")


def test_padded_head_dim_reads_no_neighbouring_column():
    """A head dim that is padded reads exactly D columns: the columns of a wider tensor next to a
    [.., D] slice (here NaN) must not reach the result."""
    q, k, v = dense_case(5, 1, 2, 1, 19, 19, 40)
    wide = [torch.cat([t, torch.full((*t.shape[:-1], 24), float("nan"))], -1) for t in (q, k, v)]
    sliced = [w[..., :40] for w in wide]
    out = flash_attention(*sliced, causal=True)
    assert_close(out, attention_torch(q.double(), k.double(), v.double(), causal=True), torch.float32, DEVICE,
                 "D=40 slice of a D=64 tensor")


# --------------------------------------------------------------------------- windows and softcap
@pytest.mark.parametrize("nq, nk, causal, window", [
    (37, 37, False, (3, 2)),      # smaller than a tile on both sides
    (37, 37, True, (5, -1)),      # causal sliding window (Mistral), smaller than a tile
    (45, 45, True, (20, -1)),     # larger than a tile
    (21, 45, False, (-1, 18)),    # only a right bound, Nq != Nk
    (45, 21, False, (0, 0)),      # each query sees at most one key; most see none
])
def test_sliding_window(nq, nk, causal, window):
    check(*dense(causal=causal, window=window), dense_case(nq, 1, 2, 1, nq, nk, 24), torch.float32,
          f"window={window} causal={causal}")


@pytest.mark.parametrize("causal", [False, True])
def test_sliding_window_low_precision(causal):
    check(*dense(causal=causal, window=(7, 9)), dense_case(1, 1, 2, 1, 33, 33, 32), torch.bfloat16, "window")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_softcap(causal, dtype):
    q, k, v = dense_case(11, 1, 2, 1, 23, 27, 32)
    q = q * 4                                             # logits of several units: the cap matters
    check(*dense(causal=causal, softcap=2.5), (q, k, v), dtype, f"softcap causal={causal}")


def test_softcap_with_window_and_scale():
    check(*dense(causal=True, window=(9, -1), softcap=1.5, sm_scale=0.7), dense_case(2, 1, 2, 2, 30, 30, 16),
          torch.float32, "softcap + window")


def test_softcap_changes_the_result():
    q, k, v = dense_case(4, 1, 1, 1, 17, 17, 16)
    assert (flash_attention(4 * q, k, v, softcap=1.0) - flash_attention(4 * q, k, v)).abs().max() > 0.05


def _key_ranges(row0s, n_cols, shift, left, right, block_rows, block_cols):
    """triton_kernels.key_range for several row blocks, run as a kernel."""
    import triton
    import triton.language as tl

    @triton.jit
    def ranges(ROW0, OUT, n_cols, shift, left, right, BR: tl.constexpr, BC: tl.constexpr):
        i = tl.program_id(0)
        lo, a, b, hi = triton_kernels.key_range(tl.load(ROW0 + i), n_cols, shift, left, right, BR, BC)
        tl.store(OUT + 4 * i, lo)
        tl.store(OUT + 4 * i + 1, a)
        tl.store(OUT + 4 * i + 2, b)
        tl.store(OUT + 4 * i + 3, hi)

    row0 = torch.tensor(row0s, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(len(row0s), 4, dtype=torch.int32, device=DEVICE)
    ranges[(len(row0s),)](row0, out, n_cols, shift, left, right, BR=block_rows, BC=block_cols)
    return out.cpu().tolist()


@pytest.mark.parametrize("n_rows, n_cols, left, right", [
    (200, 200, 20, 0), (200, 200, 40, 5), (100, 300, -1, 0), (300, 100, 3, -1), (128, 128, -1, -1), (90, 90, 0, 0)])
def test_key_range_skips_blocks_outside_the_band(n_rows, n_cols, left, right):
    """Every visible column lies in [lo, hi); [a, b) are whole blocks every row sees; blocks before lo
    or from hi on are skipped, and a window of w keys visits at most w + 2 blocks of work per row block."""
    br, bc, big = 16, 16, flash.UNBOUNDED
    shift = n_cols - n_rows
    lft, rgt = (big if left < 0 else left), (big if right < 0 else right)
    row0s = list(range(0, n_rows, br))
    for row0, (lo, a, b, hi) in zip(row0s, _key_ranges(row0s, n_cols, shift, lft, rgt, br, bc)):
        rows = torch.arange(row0, min(row0 + br, n_rows))[:, None]
        cols = torch.arange(n_cols)[None, :]
        visible = (cols - rows - shift <= rgt) & (cols - rows - shift >= -lft)
        seen = torch.nonzero(visible.any(0)).flatten()
        assert lo <= a <= b <= hi and lo % bc == 0 and (a == b or (a % bc == 0 and b % bc == 0))
        if len(seen):
            assert lo <= seen.min() and seen.max() < hi, (row0, lo, hi)
            assert lo > seen.min() - bc and hi <= seen.max() + bc
        else:
            assert hi == lo
        assert visible[:, a:b].all() and b <= n_cols
        if left >= 0 and right >= 0:
            assert hi - lo <= left + right + br + 2 * bc


# ------------------------------------------------------------------------------- packed sequences
def packed_case(seed, lens_q, lens_k, hq, hkv, d, dv=None):
    gen = torch.Generator().manual_seed(seed)
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) for lens in (lens_q, lens_k)]
    return (randn(gen, sum(lens_q), hq, d), randn(gen, sum(lens_k), hkv, d), randn(gen, sum(lens_k), hkv, dv or d),
            cu[0], cu[1])


def per_sequence(cu_q, cu_k, **options):
    """The reference for packed sequences: attention_torch on each sequence on its own."""
    def ref(q, k, v):
        outs = []
        for b in range(len(cu_q) - 1):
            sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
            heads = [t[s].transpose(0, 1)[None] for t, s in ((q, sq), (k, sk), (v, sk))]
            if heads[1].shape[2] == 0:      # no keys: the rows see nothing
                outs.append(q.new_zeros(heads[0].shape[2], q.shape[1], v.shape[-1]))
            else:
                outs.append(attention_torch(*heads, **options)[0].transpose(0, 1))
        return torch.cat(outs, 0)
    return ref


VARLEN_LENGTHS = [([5, 0, 1, 20, 33], [7, 3, 0, 20, 40]),     # an empty query, an empty key sequence, length 1
                  ([1, 17, 0], [1, 17, 0])]                   # self-attention shapes, one empty


@pytest.mark.parametrize("lengths", VARLEN_LENGTHS, ids=["mixed", "self"])
@pytest.mark.parametrize("causal, window, softcap", [(False, (-1, -1), None), (True, (-1, -1), None),
                                                     (True, (6, -1), 2.0)])
def test_varlen_matches_each_sequence(lengths, causal, window, softcap):
    q, k, v, cu_q, cu_k = packed_case(1, *lengths, 4, 2, 24, 40)
    options = dict(causal=causal, window=window, softcap=softcap)

    def kernel(q, k, v):
        return flash_attention_varlen(q, k, v, cu_q.to(q.device), cu_k.to(q.device), max(lengths[0]),
                                      max(lengths[1]), **options)
    check(kernel, per_sequence(cu_q, cu_k, **options), (q, k, v), torch.float32, f"varlen {options}")


def test_varlen_low_precision():
    lens_q, lens_k = [9, 1, 26], [12, 4, 26]
    q, k, v, cu_q, cu_k = packed_case(2, lens_q, lens_k, 2, 1, 59)

    def kernel(q, k, v):
        return flash_attention_varlen(q, k, v, cu_q.to(q.device), cu_k.to(q.device), 26, 26, causal=True)
    check(kernel, per_sequence(cu_q, cu_k, causal=True), (q, k, v), torch.float16, "varlen fp16")


def test_varlen_equals_the_dense_kernel_on_one_sequence():
    q, k, v = dense_case(9, 1, 2, 1, 19, 25, 32)
    packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v)]
    cu_q, cu_k = (torch.tensor([0, n], dtype=torch.int32, device=DEVICE) for n in (19, 25))
    out = flash_attention_varlen(*(t.to(DEVICE) for t in packed), cu_q, cu_k, 19, 25, causal=True)
    torch.testing.assert_close(out.cpu(), flash_attention(q, k, v, causal=True)[0].transpose(0, 1).cpu(),
                               rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------- bad input
def _dense(d=16, dv=None):
    return dense_case(0, 1, 2, 1, 8, 8, d, dv)


def _packed(**changes):
    q, k, v, cu_q, cu_k = packed_case(0, [3, 5], [4, 4], 2, 1, 16)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=4)
    args.update(changes)
    return args


BAD_DENSE = [
    ("q: every size must be >= 1", dict(tensors=_dense(d=0))),
    ("q: head dim D=264 is not supported; D must be between 8 and 256", dict(tensors=_dense(d=264))),
    ("v: head dim D=300 is not supported", dict(tensors=_dense(dv=300))),
    ("window: each side must be >= -1", dict(window=(-2, 0))),
    ("window: each side must be >= -1", dict(window=(4, -3))),
    ("window: expected (left, right)", dict(window=4)),
    ("window: expected (left, right)", dict(window=(1.5, 2))),
    ("window: expected (left, right)", dict(window=(1, 2, 3))),
    ("softcap: expected a positive finite number", dict(softcap=0.0)),
    ("softcap: expected a positive finite number", dict(softcap=-1.0)),
    ("softcap: expected a positive finite number", dict(softcap=float("inf"))),
    ("softcap: expected a positive finite number", dict(softcap=True)),
]


@pytest.mark.parametrize("message, case", BAD_DENSE, ids=[m for m, _ in BAD_DENSE])
def test_bad_dense_input_raises_value_error(message, case):
    case = dict(case)
    tensors = case.pop("tensors", _dense())
    for fn in (flash_attention, flash_attention_forward):
        with pytest.raises(ValueError, match=re.escape(message)):
            fn(*tensors, **case)


BAD_PACKED = [
    ("cu_seqlens_q: must start at 0", _packed(cu_seqlens_q=torch.tensor([1, 3, 8], dtype=torch.int32))),
    ("cu_seqlens_k: must not decrease", _packed(cu_seqlens_k=torch.tensor([0, 5, 4, 8], dtype=torch.int32),
                                                cu_seqlens_q=torch.tensor([0, 3, 3, 8], dtype=torch.int32))),
    ("cu_seqlens_q: its last entry must be the total number of tokens 8",
     _packed(cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32))),
    ("cu_seqlens_k: dtype torch.int64 is not supported; use torch.int32",
     _packed(cu_seqlens_k=torch.tensor([0, 4, 8]))),
    ("cu_seqlens_q: expected a 1-D int32 tensor", _packed(cu_seqlens_q=torch.tensor([0], dtype=torch.int32))),
    ("cu_seqlens_q: expected a 1-D int32 tensor", _packed(cu_seqlens_q=[0, 3, 8])),
    ("cu_seqlens_q, cu_seqlens_k: must have the same length",
     _packed(cu_seqlens_k=torch.tensor([0, 4, 6, 8], dtype=torch.int32))),
    ("max_seqlen_q: must be at least the longest sequence (5)", _packed(max_seqlen_q=4)),
    ("max_seqlen_k: expected a positive integer", _packed(max_seqlen_k=4.0)),
    ("q: expected 3 dimensions [total, H, D]", _packed(q=torch.randn(1, 8, 2, 16))),
    ("k, v: must have the same shape but for the head dim", _packed(v=torch.randn(7, 1, 16))),
    ("q, k: head dims differ", _packed(k=torch.randn(8, 1, 32))),
    ("q: head dim D=4 is not supported", _packed(q=torch.randn(8, 2, 4), k=torch.randn(8, 1, 4),
                                                 v=torch.randn(8, 1, 4))),
    ("window: each side must be >= -1", dict(_packed(), window=(-5, -1))),
    ("softcap: expected a positive finite number", dict(_packed(), softcap=0)),
    # one token a sequence, 65,536 sequences: more than one grid axis runs
    ("cu_seqlens_q: sequences B = 65536 is more than one launch runs (65535", _packed(
        q=torch.randn(65536, 2, 16), k=torch.randn(65536, 1, 16), v=torch.randn(65536, 1, 16),
        cu_seqlens_q=torch.arange(65537, dtype=torch.int32), cu_seqlens_k=torch.arange(65537, dtype=torch.int32),
        max_seqlen_q=1, max_seqlen_k=1)),
]


@pytest.mark.parametrize("message, args", BAD_PACKED, ids=[m for m, _ in BAD_PACKED])
def test_bad_packed_input_raises_value_error(message, args):
    with pytest.raises(ValueError, match=re.escape(message)):
        flash_attention_varlen(**args)


# --------------------------------------------------------------------------- compiled for a GPU
COMPILE_FOR_SM90 = r'''
import os
os.environ["TRITON_INTERPRET"] = "0"   # compile for a GPU target, even on a CPU
from attnkit.kernels.flash import triton_kernels as kernels
from attnkit.bench.compiled import compile_ptx

constexprs = dict(HEAD_DIM=128, BLOCK_M=64, BLOCK_N=64, CAUSAL=True, USE_EXP2=True, SPLIT=True, DESC=0,
                  DOT_PRECISION="tf32", HEAD_DIM_V=64, DIM_QK=80, DIM_V=48, BAND=True, SOFTCAP=True, VARLEN=True,
                  LONGEST_FIRST=True, ATOMIC_DQ=True)
for fn in (kernels._attn_fwd, kernels._bwd_dkdv, kernels._bwd_dq, kernels._bwd_preprocess):
    mine = {name: value for name, value in constexprs.items() if name in fn.arg_names}
    assert ".entry" in compile_ptx(fn, mine, num_warps=4, num_stages=2), fn.__name__
    print("compiled", fn.__name__)
'''


@pytest.mark.slow
def test_kernels_compile_for_an_h100():
    """The interpreter is lenient: every kernel, with every feature on (padded head dims, Dv != D, a
    band, softcap, packed sequences), must also compile to PTX for sm_90 (no GPU needed)."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 4


# ------------------------------------------------------------------------------------ hostile input
def _strided_cu(values, how):
    """``values`` as an int32 view whose entries are not adjacent: every other entry of a longer tensor,
    or the first column of a [B + 1, 2] tensor (filler in between that the kernels would read)."""
    filler = torch.full((len(values), 2), 10 ** 6, dtype=torch.int32)
    filler[:, 0] = torch.tensor(values, dtype=torch.int32)
    return filler[:, 0] if how == "column" else filler.flatten()[::2]


@pytest.mark.parametrize("how", ["every_other", "column"])
@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k"])
def test_varlen_refuses_non_contiguous_cu_seqlens(how, which):
    """The kernels read entry b at cu_seqlens + b, so a strided view would be read as its filler (out of
    bounds reads and writes): refused, as FlashAttention-2 refuses it."""
    args = _packed()
    view = _strided_cu(args[which].tolist(), how)
    assert view.tolist() == args[which].tolist() and view.stride(0) == 2
    args[which] = view
    with pytest.raises(ValueError, match=f"{which}: must be contiguous \\(stride 1\\)"):
        flash_attention_varlen(**args)


@pytest.mark.parametrize("softcap", [1e3, 1e8])
def test_a_large_softcap_keeps_fp32_accuracy(softcap):
    """softcap · tanh(s / softcap) with s / softcap tiny: (1 - e) / (1 + e) alone lost about 6e-8 / |x|
    relative (1.9e-5 at 1e3, 0.72 at 1e8); the kernel's tanh must stay at fp32 rounding (triton_kernels.tanh)."""
    q, k, v = dense_case(11, 1, 2, 1, 20, 20, 16)
    o, _ = flash_attention_forward(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), causal=True, softcap=softcap)
    ref = attention_torch(q.double(), k.double(), v.double(), causal=True, softcap=softcap)
    assert_close(o, ref, torch.float32, DEVICE, f"softcap {softcap:g}")


def test_double_backward_is_a_clear_error():
    """The backward kernels are not differentiable: a second derivative raises instead of being zero."""
    q, k, v = (t.to(DEVICE).requires_grad_() for t in dense_case(12, 1, 2, 1, 9, 9, 16))
    o = flash_attention(q, k, v, causal=True)
    (dq,) = torch.autograd.grad(o.pow(2).sum(), q, create_graph=True)      # dO = 2o depends on q
    penalty = dq.pow(2).sum() + o.sum()       # without the error, the penalty's term would add nothing
    with pytest.raises(RuntimeError, match="second derivatives .* are not implemented"):
        torch.autograd.grad(penalty, q, retain_graph=True)
    with pytest.raises(RuntimeError, match="second derivatives .* are not implemented"):
        penalty.backward()
