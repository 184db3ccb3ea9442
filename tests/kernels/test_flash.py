"""FlashAttention kernels (attnkit.kernels.flash) against the float64 reference, on fresh random inputs.

On a CPU the kernels run in Triton's interpreter, so the shapes are small; every N is chosen so that
it is not a multiple of the interpreter's 16-row tiles (or is smaller than one tile).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit.kernels import flash
from attnkit.kernels.flash import (
    LADDER,
    VARIANTS,
    dispatch,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
    layout,
    plans,
)
from attnkit.kernels.flash import backward as backward_launch
from attnkit.kernels.flash import forward as forward_launch
from attnkit.reference.attention import attention_grads_ref, attention_ref, lse_ref
from attnkit.tolerances import assert_close, rel_error, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------- helpers
@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every buffer the kernels write starts as NaN: an element left unwritten fails the comparison."""
    def nan_buffer(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(layout, "new_buffer", nan_buffer)


def make_inputs(gen, b, hq, hkv, nq, nk, d, dtype, device=DEVICE):
    """Fresh N(0, 1) q [b, hq, nq, d], k, v [b, hkv, nk, d] from the generator ``gen``."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    return randn(b, hq, nq, d), randn(b, hkv, nk, d), randn(b, hkv, nk, d)


def reference_lse(q, k, causal, sm_scale=None):
    return lse_ref(q, k, causal=causal, sm_scale=sm_scale)


def reference_grads(q, k, v, do, causal, sm_scale=None):
    """(dq, dk, dv) by float64 autograd through attention_ref's math (checked by finite differences in
    tests/reference/test_reference.py)."""
    return attention_grads_ref(q, k, v, do, causal=causal, sm_scale=sm_scale)


def check_forward(gen, b, hq, hkv, nq, nk, d, dtype, causal, variant="best", sm_scale=None):
    q, k, v = make_inputs(gen, b, hq, hkv, nq, nk, d, dtype)
    o, lse = flash_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale, variant=variant)
    assert o.shape == q.shape and o.dtype == dtype and o.device == q.device
    what = f"o for {(b, hq, hkv, nq, nk, d)} {dtype} causal={causal} {variant}"
    assert_close(o, attention_ref(q, k, v, causal=causal, sm_scale=sm_scale), dtype, DEVICE, what)
    ref = reference_lse(q, k, causal, sm_scale)
    seen = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse.cpu()), seen), "lse: -inf exactly for rows that see no key"
    assert torch.all(lse.cpu()[~seen] == -math.inf)
    assert_close(lse.cpu()[seen], ref[seen], dtype, DEVICE, f"lse for {what}")


def check_gradients(gen, b, hq, hkv, nq, nk, d, dtype, causal, sm_scale=None):
    q, k, v = make_inputs(gen, b, hq, hkv, nq, nk, d, dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    do = torch.randn(q.shape, generator=gen).to(device=DEVICE, dtype=dtype)
    o = flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    o.backward(do)
    expected = reference_grads(q, k, v, do, causal, sm_scale)
    for name, got, ref in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), expected):
        assert got.shape == ref.shape and got.dtype == dtype
        assert_close(got, ref, dtype, DEVICE, f"{name} for {(b, hq, hkv, nq, nk, d)} {dtype} causal={causal}")


# ---------------------------------------------------------------------------------------- forward
# (B, Hq, Hkv, Nq, Nk, D, causal): GQA ratios 1, 4, 8 and MQA; ragged N; causal with Nq < Nk and Nq > Nk.
FORWARD_CASES = [
    (1, 2, 2, 37, 37, 32, False),     # MHA, square
    (2, 4, 1, 21, 45, 16, True),      # MQA, Nq < Nk: every query sees the first Nk - Nq keys and more
    (1, 8, 2, 33, 19, 64, True),      # GQA 4, Nq > Nk: the first 14 rows see no key
    (1, 8, 1, 17, 29, 32, False),     # GQA 8 (and MQA)
    (1, 3, 3, 1, 40, 16, True),       # one query (decoding-like)
    (1, 2, 1, 40, 1, 16, False),      # one key
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", FORWARD_CASES, ids=str)
def test_forward_matches_reference(shape, dtype):
    gen = torch.Generator().manual_seed(hash((shape, str(dtype))) % 2**31)
    check_forward(gen, *shape[:6], dtype, causal=shape[6])


@pytest.mark.parametrize("d", [16, 32, 64, 128, 256])
def test_every_head_dim(d):
    gen = torch.Generator().manual_seed(d)
    n = 9 if d == 256 else 19
    check_forward(gen, 1, 2, 1, n, n + 4, d, torch.float16, causal=True)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("causal", [False, True])
def test_every_ladder_rung(variant, causal):
    assert set(LADDER) == set(VARIANTS)
    gen = torch.Generator().manual_seed(7 + causal)
    check_forward(gen, 1, 4, 2, 35, 27, 32, torch.float16, causal=causal, variant=variant)


def test_custom_scale():
    gen = torch.Generator().manual_seed(3)
    check_forward(gen, 1, 2, 1, 19, 23, 16, torch.float32, causal=True, sm_scale=0.3)
    check_forward(gen, 1, 2, 1, 19, 23, 16, torch.float32, causal=False, sm_scale=1.7)


def test_rows_that_see_no_key_are_zero():
    gen = torch.Generator().manual_seed(11)
    q, k, v = make_inputs(gen, 1, 2, 1, 30, 6, 16, torch.float32)     # rows 0..23 see no key
    q.requires_grad_()
    o = flash_attention(q, k, v, causal=True)
    assert torch.all(o[:, :, :24] == 0) and torch.all(o[:, :, 24:].abs().sum(-1) > 0)
    o.sum().backward()
    assert torch.all(q.grad[:, :, :24] == 0) and torch.isfinite(q.grad).all()


settings.register_profile("flash", max_examples=6, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])


@settings(settings.get_profile("flash"))
@given(hkv=st.integers(1, 2), group=st.sampled_from([1, 3, 4]), nq=st.integers(1, 40),
       nk=st.integers(1, 40), d=st.sampled_from([16, 32]), causal=st.booleans(),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_forward_property(hkv, group, nq, nk, d, causal, dtype, seed):
    check_forward(torch.Generator().manual_seed(seed), 1, hkv * group, hkv, nq, nk, d, dtype, causal)


def test_non_contiguous_inputs():
    gen = torch.Generator().manual_seed(5)
    b, n, hq, hkv, d = 2, 21, 4, 2, 32
    # a [B, N, H, D] layout viewed as [B, H, N, D]; v additionally every other head dim element
    q = torch.randn(b, n, hq, d, generator=gen).to(DEVICE).transpose(1, 2)
    k = torch.randn(b, n + 3, hkv, d, generator=gen).to(DEVICE).transpose(1, 2)
    v = torch.randn(b, hkv, n + 3, 2 * d, generator=gen).to(DEVICE)[..., ::2]
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    assert not any(t.is_contiguous() for t in (q, k, v))
    o = flash_attention(q, k, v, causal=True)
    assert_close(o, attention_ref(q, k, v, causal=True), torch.float32, DEVICE, "o (strided)")
    do = torch.randn(b, n, hq, d, generator=gen).to(DEVICE).transpose(1, 2)   # strided dO too
    o.backward(do)
    for name, got, ref in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                              reference_grads(q, k, v, do, True)):
        assert_close(got, ref, torch.float32, DEVICE, f"{name} (strided)")


# --------------------------------------------------------------------------------------- backward
GRAD_CASES = [
    (1, 2, 2, 23, 23, 16, False, torch.float32),
    (1, 4, 1, 19, 35, 32, True, torch.float32),    # MQA, Nq < Nk
    (2, 8, 2, 27, 17, 16, True, torch.float16),    # GQA 4, Nq > Nk (rows that see no key)
    (1, 8, 1, 21, 21, 64, True, torch.bfloat16),   # GQA 8
    (1, 2, 1, 9, 11, 128, False, torch.float16),
    (1, 2, 1, 5, 7, 256, True, torch.float32),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradients_match_float64_autograd(case):
    gen = torch.Generator().manual_seed(hash(str(case)) % 2**31)
    check_gradients(gen, *case[:6], case[7], causal=case[6])


def test_backward_entry_point_matches_autograd():
    gen = torch.Generator().manual_seed(13)
    q, k, v = make_inputs(gen, 1, 4, 2, 18, 25, 16, torch.float32)
    do = torch.randn(q.shape, generator=gen).to(DEVICE)
    o, lse = flash_attention_forward(q, k, v, causal=True)
    dq, dk, dv = flash_attention_backward(do, q, k, v, o, lse, causal=True)
    assert dk.shape == k.shape and dv.shape == v.shape
    for name, got, ref in zip(("dq", "dk", "dv"), (dq, dk, dv), reference_grads(q, k, v, do, True)):
        assert_close(got, ref, torch.float32, DEVICE, name)


# ------------------------------------------------------------------------------------- bad input
def _valid(**changes):
    shapes = dict(q=(1, 4, 8, 16), k=(1, 2, 8, 16), v=(1, 2, 8, 16))
    tensors = {name: torch.randn(shape) for name, shape in shapes.items()}
    tensors.update(changes)
    return tensors


BAD_INPUTS = [
    ("q: expected 4 dimensions", _valid(q=torch.randn(4, 8, 16))),
    ("k: expected 4 dimensions", _valid(k=torch.randn(1, 1, 2, 8, 16))),
    ("v: expected a torch.Tensor", _valid(v=np.zeros((1, 2, 8, 16)))),
    ("q, k: batch sizes differ", _valid(q=torch.randn(2, 4, 8, 16))),
    ("q, k: head dims differ", _valid(q=torch.randn(1, 4, 8, 32))),
    ("k, v: must have the same shape", _valid(v=torch.randn(1, 2, 9, 16))),
    ("k, v: must have the same shape", _valid(v=torch.randn(1, 1, 8, 32))),
    ("Hq % Hkv == 0", _valid(q=torch.randn(1, 3, 8, 16))),
    ("q: head dim D=264 is not supported", _valid(q=torch.randn(1, 4, 8, 264), k=torch.randn(1, 2, 8, 264),
                                                v=torch.randn(1, 2, 8, 264))),
    ("q: head dim D=4 is not supported", _valid(q=torch.randn(1, 4, 8, 4), k=torch.randn(1, 2, 8, 4),
                                              v=torch.randn(1, 2, 8, 4))),
    ("q: dtype torch.float64 is not supported", _valid(q=torch.randn(1, 4, 8, 16, dtype=torch.float64))),
    ("k: dtype torch.int32 is not supported", _valid(k=torch.ones(1, 2, 8, 16, dtype=torch.int32))),
    ("must share one dtype", _valid(k=torch.randn(1, 2, 8, 16).half(), v=torch.randn(1, 2, 8, 16).half())),
    ("every size must be >= 1", _valid(q=torch.randn(1, 4, 0, 16))),
    ("every size must be >= 1", _valid(k=torch.randn(1, 2, 0, 16), v=torch.randn(1, 2, 0, 16))),
    ("every size must be >= 1", _valid(q=torch.randn(0, 4, 8, 16), k=torch.randn(0, 2, 8, 16),
                                       v=torch.randn(0, 2, 8, 16))),
    # the kernels' grids run heads along one axis, sequences along another: at most 65,535 each
    ("q: batch B = 65536 is more than one launch runs (65535", _valid(
        q=torch.randn(65536, 1, 1, 16), k=torch.randn(65536, 1, 1, 16), v=torch.randn(65536, 1, 1, 16))),
    ("q: heads H = 65536 is more than one launch runs (65535", _valid(
        q=torch.randn(1, 65536, 1, 16), k=torch.randn(1, 1, 1, 16), v=torch.randn(1, 1, 1, 16))),
]


@pytest.mark.parametrize("message, tensors", BAD_INPUTS, ids=[m for m, _ in BAD_INPUTS])
def test_bad_input_raises_value_error(message, tensors):
    for fn in (flash_attention, flash_attention_forward):
        with pytest.raises(ValueError, match=re.escape(message)):
            fn(tensors["q"], tensors["k"], tensors["v"])


def test_inputs_like_ones_that_passed_skip_the_checks_and_bad_ones_never_pass(monkeypatch):
    """check_inputs remembers the kinds of inputs (types, shapes, dtypes, devices) that passed: another call
    with such inputs is not checked again; a bad input is checked every time (it never joins them), and a
    change of shape, dtype or device is checked afresh."""
    monkeypatch.setattr(flash, "PASSED_CHECKS", {})
    runs = []
    real = flash.check_inputs_uncached
    monkeypatch.setattr(flash, "check_inputs_uncached", lambda *args: runs.append(1) or real(*args))
    t = _valid()
    for _ in range(3):
        flash.check_inputs(t["q"], t["k"], t["v"])
    fresh = _valid()                                       # other tensors, same kind: remembered
    flash.check_inputs(fresh["q"], fresh["k"], fresh["v"])
    assert len(runs) == 1
    for message, bad in BAD_INPUTS:
        for _ in range(2):
            with pytest.raises(ValueError, match=re.escape(message)):
                flash.check_inputs(bad["q"], bad["k"], bad["v"])
    assert len(runs) == 1 + 2 * len(BAD_INPUTS)
    for changed in (_valid(q=torch.randn(1, 4, 9, 16)), _valid(q=t["q"].half(), k=t["k"].half(), v=t["v"].half())):
        flash.check_inputs(changed["q"], changed["k"], changed["v"])
    assert len(runs) == 3 + 2 * len(BAD_INPUTS)


def test_a_call_that_needs_no_gradient_records_no_graph_and_gives_the_same_output():
    """flash_attention without gradients to track (inputs that do not need them, or torch.no_grad) runs the
    forward alone, and its output is the differentiable call's, bit for bit."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = make_inputs(gen, 1, 4, 2, 20, 20, 16, torch.float32)
    tracked = [t.detach().requires_grad_() for t in (q, k, v)]
    with_graph = flash_attention(*tracked, causal=True)
    assert with_graph.grad_fn is not None
    plain = flash_attention(q, k, v, causal=True)
    with torch.no_grad():
        untracked = flash_attention(*tracked, causal=True)
    for o in (plain, untracked):
        assert o.grad_fn is None and not o.requires_grad
        assert torch.equal(o, with_graph.detach())


def test_bad_options_raise_value_error():
    t = _valid()
    with pytest.raises(ValueError, match="sm_scale"):
        flash_attention(t["q"], t["k"], t["v"], sm_scale=float("nan"))
    with pytest.raises(ValueError, match="sm_scale"):
        flash_attention(t["q"], t["k"], t["v"], sm_scale="0.5")
    with pytest.raises(ValueError, match="sm_scale"):
        flash_attention(t["q"], t["k"], t["v"], sm_scale=-0.5)
    with pytest.raises(ValueError, match="causal"):
        flash_attention(t["q"], t["k"], t["v"], causal="yes")
    with pytest.raises(ValueError, match="variant"):
        flash_attention_forward(t["q"], t["k"], t["v"], variant="fastest")
    with pytest.raises(ValueError, match="lse"):
        flash_attention_backward(t["q"], t["q"], t["k"], t["v"], t["q"], torch.zeros(1, 4, 9))


def test_tensors_on_different_devices_raise_value_error():
    t = _valid()
    other = t["k"].to("meta")
    with pytest.raises(ValueError, match="one device"):
        flash_attention(t["q"], other, t["v"])
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="one device"):
            flash_attention(t["q"].cuda(), t["k"], t["v"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d, backward", [(32, "two_kernels"), (64, "atomic_dq"), (128, "warp_specialized")])
def test_more_batch_and_head_pairs_than_one_grid_axis_holds(d, backward):
    """B · Hq = 2048 · 33 = 67,584 (batch, head) pairs, past the 65,535 programs one axis of a CUDA grid
    holds (the grids run heads along one axis and sequences along another): the output and the gradients
    of every head match float64."""
    gen = torch.Generator().manual_seed(d)
    q, k, v = make_inputs(gen, 2048, 33, 11, 5, 7, d, torch.float16)
    do = torch.randn(q.shape, generator=gen).to(DEVICE, torch.float16)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, causal=True, backward=backward)
    grads = torch.autograd.grad(out, leaves, do)
    assert_close(out, attention_ref(q, k, v, causal=True), torch.float16, DEVICE, "o")
    for name, got, want in zip(("dq", "dk", "dv"), grads, reference_grads(q, k, v, do, causal=True)):
        assert_close(got, want, torch.float16, DEVICE, name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cpu_and_cuda_agree():
    gen = torch.Generator().manual_seed(17)
    q, k, v = make_inputs(gen, 1, 4, 2, 70, 90, 64, torch.float16, device="cpu")
    on_cpu = flash_attention(q, k, v, causal=True)
    on_gpu = flash_attention(q.cuda(), k.cuda(), v.cuda(), causal=True)
    assert rel_error(on_gpu.cpu(), on_cpu) <= tolerance(torch.float16, "cuda")


# ------------------------------------------------------------------ tensor-descriptor forward kernel
def _interpreted_descriptor_kernel():
    """The descriptor rungs run here only where Triton's interpreter has descriptors."""
    import triton.language as tl

    from attnkit.device import triton_interprets

    return triton_interprets() and hasattr(tl, "make_tensor_descriptor")


@pytest.mark.skipif(not _interpreted_descriptor_kernel(), reason="needs Triton's interpreter with tensor descriptors")
@pytest.mark.parametrize("desc", [1, 2], ids=["device_descriptors", "host_descriptors"])
@pytest.mark.parametrize("shape", [(1, 4, 2, 35, 27, 32, True), (2, 4, 1, 21, 45, 16, True),
                                   (1, 2, 1, 40, 19, 16, False), (1, 8, 2, 33, 19, 64, True),
                                   (1, 2, 2, 50, 67, 16, False)], ids=str)
def test_descriptor_kernel_in_the_interpreter(monkeypatch, shape, desc):
    """The forward with DESC = 1 and 2 (the GPU-only rungs' tiles) run in the interpreter: descriptor
    loads pad the ragged ends with zeros and descriptor stores clip them, as TMA does."""
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    monkeypatch.setattr(layout, "ensure_allocator", lambda: None)
    launched = []
    real_launch = plans.launch
    monkeypatch.setattr(plans, "launch", lambda *a, **kw: launched.append(kw["DESC"]) or real_launch(*a, **kw))
    b, hq, hkv, nq, nk, d, causal = shape
    gen = torch.Generator().manual_seed(hash(shape) % 2**31)
    q, k, v = make_inputs(gen, b, hq, hkv, nq, nk, d, torch.float32, device="cpu")
    o, lse = forward_launch.forward_rung(q, k, v, causal, 1 / math.sqrt(d), flash.Rung(desc=desc))
    assert launched == [desc]
    assert_close(o, attention_ref(q, k, v, causal=causal), torch.float32, "cpu", "o (descriptor kernel)")
    ref = reference_lse(q, k, causal)
    seen = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), seen) and torch.all(lse[~seen] == -math.inf)
    assert_close(lse[seen], ref[seen], torch.float32, "cpu", "lse (descriptor kernel)")


def test_new_rungs_fall_back_where_their_features_are_missing():
    """On the CPU (and below sm_90, or without descriptors) the descriptor rungs run the pointer kernel."""
    q = torch.randn(1, 2, 19, 64)
    assert not flash.descriptors_supported(q.device)
    for name in ("descriptors", "host_descriptors", "warp_specialized"):
        assert flash.effective_rung(VARIANTS[name], True, q, q, q, q).desc == 0
    long = torch.randn(1, 2, 4096, 128)
    assert forward_launch.warp_specialized_forward(long, long, long, False, 0.1) is None      # a CPU tensor: Triton
    for name in (flash.BEST, flash.BEST_TRITON):
        assert name in VARIANTS and list(VARIANTS).index(name) >= list(VARIANTS).index("autotuned")
    assert VARIANTS[flash.BEST].warp_specialized and not VARIANTS[flash.BEST_TRITON].warp_specialized
    strided = torch.randn(1, 2, 19, 32)[..., ::2]           # last stride 2: no TMA even on a GPU
    assert not dispatch.tma_compatible(strided)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["descriptors", "best"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_descriptor_rungs_on_the_gpu(variant, dtype):
    """The GPU-only rungs (or their fallbacks below sm_90) on ragged GQA shapes, causal and not."""
    gen = torch.Generator().manual_seed(23)
    for causal, (nq, nk) in ((False, (301, 517)), (True, (517, 301)), (True, (300, 1031))):
        check_forward(gen, 2, 8, 2, nq, nk, 128, dtype, causal=causal, variant=variant)
        check_forward(gen, 1, 4, 1, nq, nk, 64, dtype, causal=causal, variant=variant)


def test_warp_specialized_rule_keeps_to_the_measured_wins():
    """The Gluon kernel where it was measured faster than the Triton forward on the H100: D = 128 from 1k,
    D = 64 from 4k (causal from 8k); never elsewhere (other head dims, shorter sequences)."""
    choice = flash.warp_specialized_choice
    assert choice(False, 128, 1024, 1024) and not choice(False, 128, 1023, 4096) and not choice(False, 128, 4096, 1000)
    assert choice(True, 128, 1024, 1024) and not choice(True, 128, 1000, 1024)
    assert choice(False, 64, 4096, 4096) and not choice(False, 64, 2048, 4096)
    assert choice(True, 64, 8192, 20000) and not choice(True, 64, 4096, 4096)
    assert not any(choice(causal, d, 16384, 16384) for d in (16, 32, 96, 256) for causal in (False, True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs an sm_90 GPU")
@pytest.mark.parametrize("causal, n, d, heads, kv_heads", [
    (False, 1100, 128, 4, 2), (True, 2048, 128, 4, 2), (True, 8200, 64, 1, 1), (False, 4100, 64, 4, 2),
    (True, 1024, 128, 20, 4), (False, 4100, 128, 6, 2)])   # 160 and 198 tiles, more than the SMs: persistent
def test_best_runs_the_warp_specialized_kernel_where_it_is_chosen(monkeypatch, causal, n, d, heads, kv_heads):
    """flash_attention's forward is the Gluon kernel where the rule picks it (counted), its output and the
    gradients through the default backward match float64; a non-contiguous q falls back to Triton."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from attnkit.kernels.flash import hopper

    launched = []
    real = hopper.launch
    monkeypatch.setattr(hopper, "launch", lambda *args, **kw: launched.append(args[3]) or real(*args, **kw))
    gen = torch.Generator().manual_seed(n + d)
    check_forward(gen, 1, heads, kv_heads, n, n, d, torch.float16, causal=causal)
    assert launched == [causal]
    q, k, v = (t.requires_grad_() for t in make_inputs(gen, 1, heads, kv_heads, n, n, d, torch.float16))
    o = flash_attention(q, k, v, causal=causal)
    assert len(launched) == 2
    do = torch.randn_like(o)
    o.backward(do)
    for name, got, want in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), reference_grads(q, k, v, do, causal)):
        assert_close(got, want, torch.float16, DEVICE, name)
    every_other_row = torch.cat([q.detach(), q.detach()], 2)[:, :, ::2]        # a strided view of q's values
    flash_attention_forward(every_other_row, k.detach(), v.detach(), causal=causal)
    assert len(launched) == 2                                  # non-contiguous q: the Triton kernel


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9,
                    reason="needs an sm_90 GPU")
def test_a_gluon_forward_that_fails_leaves_the_triton_forward_with_a_warning(monkeypatch):
    """As with a Triton whose Gluon API differs: one RuntimeWarning, then the Triton kernel, bit for bit."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from attnkit.kernels.flash import hopper

    def fails(*args, **kw):
        raise TypeError("warp_specialize() got an unexpected keyword argument")
    monkeypatch.setattr(dispatch, "GLUON_FAILED", set())
    monkeypatch.setattr(hopper, "launch", fails)
    q, k, v = make_inputs(torch.Generator().manual_seed(5), 1, 4, 2, 1100, 1100, 128, torch.float16)
    with pytest.warns(RuntimeWarning, match="flash.hopper: the Gluon kernel failed"):
        o, lse = flash_attention_forward(q, k, v)
    want_o, want_lse = flash_attention_forward(q, k, v, variant=flash.BEST_TRITON)
    assert torch.equal(o, want_o) and torch.equal(lse, want_lse)
    assert dispatch.GLUON_FAILED == {"attnkit.kernels.flash.hopper"}


@pytest.mark.parametrize("causal", [False, True])
def test_host_descriptor_rule_picks_the_tiles(monkeypatch, causal):
    """host_descriptors on a device with descriptors: its rule takes them at D = 64 (causal, or from 1k
    keys) and pointer loads for short non-causal sequences and other head dims."""
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    rung = VARIANTS["host_descriptors"]
    short, long, d32 = (torch.randn(1, 1, n, d) for n, d in ((33, 64), (1024, 64), (33, 32)))
    assert flash.effective_rung(rung, causal, short, short, short, short).desc == (2 if causal else 0)
    assert flash.effective_rung(rung, causal, short, long, long, short).desc == 2
    assert flash.effective_rung(rung, causal, d32, d32, d32, d32).desc == 0


def test_numpy_scalars_are_valid_scales():
    """sm_scale may be any positive finite real, NumPy's float32 included (flash and paged share the rule)."""
    import numpy as np

    from attnkit.validation import softmax_scale

    assert softmax_scale(np.float32(0.5), 64) == 0.5 and softmax_scale(np.float64(0.25), 64) == 0.25
    for bad in (np.float32("nan"), np.float32(-1.0), True, "0.5"):
        with pytest.raises(ValueError, match="sm_scale"):
            softmax_scale(bad, 64)


def test_host_descriptor_choice():
    """The host_descriptors rung: descriptors at D = 64 and 128 (causal always, non-causal from 1k keys) and
    at D = 256 at every length."""
    choice = flash.host_descriptor_choice
    assert choice(True, 128, 512) == choice(False, 64, 1024) == choice(True, 64, 16384) == dict(desc=True)
    assert choice(False, 256, 16) == choice(True, 256, 4096) == dict(desc=True)
    assert choice(False, 128, 512) == dict(desc=False)
    assert all(choice(c, d, 4096) == dict(desc=False) for c in (False, True) for d in (16, 32, 192))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["split", flash.BEST_TRITON])
def test_launches_through_kept_runners_match_the_jit_bit_for_bit(monkeypatch, variant):
    """The Triton forward and both Triton backward designs: each shape twice with fresh inputs, a strided
    view among them, every output through the kept runners equal bit for bit to the JIT's."""
    from attnkit.kernels.flash.runners import Runners

    runners = Runners()
    monkeypatch.setattr(plans, "RUNNERS", runners)
    monkeypatch.setattr(backward_launch, "RUNNERS", runners)
    gen = torch.Generator().manual_seed(21)
    shapes = [(2, 4, 2, 300, 300, 64, True), (1, 4, 4, 129, 700, 128, False)]
    for index, (b, hq, hkv, n_q, n_k, d, causal) in enumerate(shapes * 2):
        q, k, v = make_inputs(gen, b, hq, hkv, n_q, n_k, d, torch.float16)
        if index % 2:
            q = torch.cat([q, q], dim=2)[:, :, ::2]                      # a strided view of q's values
        do = torch.randn(q.shape, generator=gen).to(q)
        results = []
        for enabled in (True, False):
            runners.enabled = enabled
            o, lse = flash_attention_forward(q, k, v, causal=causal, variant=variant)
            scale = 1 / math.sqrt(d)
            grads = [backward_launch.backward(do, q, k, v, o, lse, causal, scale, design=design)
                     for design in ("two_kernels", "atomic_dq")]
            results.append([o, lse, *grads[0], *grads[1][1:]])        # atomic dq: not deterministic
        for name, direct, through_jit in zip("o lse dq dk dv dk' dv'".split(), *results):
            assert torch.equal(direct, through_jit), name
    assert runners.by_key


# ------------------------------------------------------------------------------ broadcast output gradients
def _grads(q, k, v, causal, backward_of):
    """(dq, dk, dv) of flash_attention through ``backward_of(o)``, which calls backward on (a function of) o."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    backward_of(flash_attention(*leaves, causal=causal))
    return [t.grad for t in leaves]


def test_broadcast_and_strided_output_gradients_match_a_contiguous_clone():
    """``o.sum().backward()`` hands the backward an expanded dO (every stride 0); a dO broadcast over heads
    or transposed is strided too. Each gives the same gradients, bit for bit, as its contiguous clone (the
    backward lays dO out as ``dispatch.backward_do`` says: contiguous, the layout its fast paths take), and
    float64's."""
    gen = torch.Generator().manual_seed(40)
    q, k, v = make_inputs(gen, 1, 2, 1, 17, 19, 16, torch.float32)
    per_row = torch.randn(1, 1, 17, 16, generator=gen).to(DEVICE).expand(1, 2, 17, 16)     # stride 0 over heads
    transposed = torch.randn(1, 2, 16, 17, generator=gen).to(DEVICE).transpose(-1, -2)
    for do in (per_row, transposed):
        assert not do.is_contiguous()
        strided = _grads(q, k, v, True, lambda o, do=do: o.backward(do))
        cloned = _grads(q, k, v, True, lambda o, do=do: o.backward(do.contiguous()))
        assert all(torch.equal(a, b) for a, b in zip(strided, cloned))
    for name, got, want in zip(("dq", "dk", "dv"), strided, reference_grads(q, k, v, transposed, True)):
        assert_close(got, want, torch.float32, DEVICE, f"{name} with a transposed dO")
    summed = _grads(q, k, v, True, lambda o: o.sum().backward())                  # dO expanded from one 1
    ones = _grads(q, k, v, True, lambda o: o.backward(torch.ones_like(o)))
    assert all(torch.equal(a, b) for a, b in zip(summed, ones))


def test_the_backward_takes_do_contiguous():
    """The rule the backward's fast paths need (the Gluon kernels' TMA, host descriptors): dO contiguous, a
    strided one copied, a contiguous one passed as it is."""
    do = torch.ones(2, 3, 5, 8)
    assert dispatch.backward_do(do) is do
    for strided in (torch.ones(()).expand(2, 3, 5, 8), do.transpose(1, 2).contiguous().transpose(1, 2)):
        laid_out = dispatch.backward_do(strided)
        assert laid_out.is_contiguous() and torch.equal(laid_out, strided)
