"""paged_decode over an FP8 (e4m3) cache: the fp8 bytes dequantised in registers by one scale per KV
head, against the float64 reference of the dequantised cache, against paged_extend's one-token case,
and against the fp16 cache it was quantised from (the quantisation error)."""
from __future__ import annotations

import pytest
import torch
from test_paged import make_case

from attnkit.kernels import paged
from attnkit.kernels.fp8_cache import FP8, fp8_scales, quantize_fp8
from attnkit.kernels.paged import paged_decode, paged_decode_ref
from attnkit.kernels.paged_extend import paged_extend
from attnkit.tolerances import rel_error, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    monkeypatch.setattr(paged, "new_buffer", lambda shape, dtype, device: torch.full(shape, float("nan"),
                                                                                       dtype=dtype, device=device))


def fp8_case(seed, lens, dtype=torch.float16, **kw):
    """The fp16 case of test_paged (NaN in unused slots) and its FP8 cache with per-KV-head scales."""
    gen = torch.Generator().manual_seed(seed)
    q, k_pages, v_pages, table, seq_lens = make_case(gen, lens, dtype=dtype, device="cpu", **kw)
    finite_k, finite_v = k_pages.nan_to_num(0.0), v_pages.nan_to_num(0.0)
    k_scale, v_scale = fp8_scales(finite_k), fp8_scales(finite_v) * 2        # V uses half of e4m3's range
    k8, v8 = quantize_fp8(finite_k, k_scale), quantize_fp8(finite_v, v_scale)
    return (q, k_pages, v_pages, table, seq_lens), (k8, v8, k_scale, v_scale)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("variant", ["grouped", "per_head"])
def test_fp8_cache_matches_the_dequantised_reference(dtype, num_splits, variant):
    (q, _, _, table, lens), (k8, v8, ks, vs) = fp8_case(11, [37, 1, 20], dtype=dtype, hq=8, hkv=2)
    expected = paged_decode_ref(q, k8, v8, table, lens, k_scale=ks, v_scale=vs)
    out = paged_decode(*(t.to(DEVICE) for t in (q, k8, v8, table, lens)), k_scale=ks.to(DEVICE),
                       v_scale=vs.to(DEVICE), num_splits=num_splits, variant=variant)
    assert out.dtype == dtype
    assert rel_error(out.cpu(), expected) <= tolerance(dtype, DEVICE)


def test_fp8_decode_agrees_with_extend_one_token_each():
    (q, _, _, table, lens), (k8, v8, ks, vs) = fp8_case(5, [9, 30, 16])
    cu = torch.arange(len(lens) + 1, dtype=torch.int32)
    args = [t.to(DEVICE) for t in (q, k8, v8, table, lens)]
    decode = paged_decode(*args, k_scale=ks.to(DEVICE), v_scale=vs.to(DEVICE))
    extend = paged_extend(args[0], *args[1:], cu.to(DEVICE), k_scale=ks.to(DEVICE), v_scale=vs.to(DEVICE))
    assert rel_error(decode.float().cpu(), extend.float().cpu()) <= tolerance(torch.float16, DEVICE)


def test_fp8_error_against_the_fp16_cache_is_quantisation_sized():
    (q, k, v, table, lens), (k8, v8, ks, vs) = fp8_case(2, [64, 50], hq=4, hkv=2, d=32)
    exact = paged_decode_ref(q, k.nan_to_num(0.0), v.nan_to_num(0.0), table, lens)
    fp8 = paged_decode(*(t.to(DEVICE) for t in (q, k8, v8, table, lens)), k_scale=ks.to(DEVICE),
                       v_scale=vs.to(DEVICE)).double().cpu()
    error = rel_error(fp8, exact)
    assert 1e-4 < error < 0.1, error       # e4m3 keeps 3 mantissa bits: unit roundoff 2^-4


@pytest.mark.parametrize("change, match", [
    (lambda a: a.update(k_scale=None, v_scale=None), "k_scale, v_scale: required"),
    (lambda a: a.update(v_scale=None), "k_scale, v_scale: required"),
    (lambda a: a.update(k_scale=a["k_scale"].double()), "k_scale"),
    (lambda a: a.update(v_scale=a["v_scale"][:1]), "v_scale: expected 2 scales"),
    (lambda a: a.update(k_scale=-a["k_scale"]), "k_scale: every scale must be finite and > 0"),
    (lambda a: a.update(v_scale=a["v_scale"] * float("nan")), "v_scale: every scale must be finite and > 0"),
])
def test_bad_scales_are_refused(change, match):
    (q, _, _, table, lens), (k8, v8, ks, vs) = fp8_case(1, [5, 7])
    args = dict(q=q, k_pages=k8, v_pages=v8, block_table=table, seq_lens=lens, k_scale=ks, v_scale=vs,
                check_values="strict")
    change(args)
    with pytest.raises(ValueError, match=match):
        paged_decode(**args)


def test_scales_without_an_fp8_cache_are_refused():
    (q, k, v, table, lens), (_, _, ks, vs) = fp8_case(1, [5])
    with pytest.raises(ValueError, match="k_scale, v_scale: required .* exactly when"):
        paged_decode(q, k, v, table, lens, k_scale=ks, v_scale=vs)


def test_device_mode_flags_a_bad_scale():
    (q, _, _, table, lens), (k8, v8, ks, vs) = fp8_case(1, [5])
    paged.raise_pending_errors()
    paged_decode(q, k8, v8, table, lens, k_scale=ks * 0, v_scale=vs, check_values="device")
    with pytest.raises(ValueError, match="k_scale, v_scale: a scale that is not finite and > 0"):
        paged.raise_pending_errors()
    assert FP8 == torch.float8_e4m3fn


@pytest.mark.parametrize("view", ["strided", "expanded", "offset"])
def test_scales_may_be_any_view(view):
    """A scale tensor that is a view (every other element, an expanded scalar, an offset slice) is read
    through its strides, by paged_decode and by paged_extend."""
    (q, _, _, table, lens), (k8, v8, ks, vs) = fp8_case(4, [9, 30], hq=4, hkv=2)
    if view == "strided":
        ks_view = torch.stack([ks, torch.full_like(ks, 1e9)], 1).reshape(-1)[::2]
    elif view == "expanded":
        ks = torch.full_like(ks, float(ks.max()))
        ks_view = ks[:1].expand(2)
    else:
        ks_view = torch.cat([torch.tensor([1e9]), ks])[1:]
    assert torch.equal(ks_view, ks) and (ks_view.stride() != (1,) or ks_view.storage_offset() > 0)
    expected = paged_decode_ref(q, k8, v8, table, lens, k_scale=ks, v_scale=vs)
    args = [t.to(DEVICE) for t in (q, k8, v8, table, lens)]
    out = paged_decode(*args, k_scale=ks_view.to(DEVICE), v_scale=vs.to(DEVICE))
    assert rel_error(out.cpu(), expected) <= tolerance(torch.float16, DEVICE)
    cu = torch.arange(3, dtype=torch.int32, device=DEVICE)
    extend = paged_extend(*args, cu, k_scale=ks_view.to(DEVICE), v_scale=vs.to(DEVICE))
    assert rel_error(extend.cpu(), expected) <= tolerance(torch.float16, DEVICE)
