"""paged_extend: several new tokens per sequence over a paged cache, against float64, with an FP8 cache;
its one-token case agrees with paged_decode."""
import pytest
import torch

from attnkit.kernels.paged import paged_decode
from attnkit.kernels.paged_extend import FP8, fp8_scales, paged_extend, paged_extend_ref, quantize_fp8
from attnkit.tolerances import assert_close


def _problem(seed, q_lens, ctx_lens, *, hq=4, hkv=2, d=16, page=4, dtype=torch.float32, num_pages=40):
    gen = torch.Generator().manual_seed(seed)
    k_pages = torch.randn(num_pages, page, hkv, d, generator=gen).to(dtype)
    v_pages = torch.randn(num_pages, page, hkv, d, generator=gen).to(dtype)
    max_pages = max(-(-c // page) for c in ctx_lens) + 1
    perm = torch.randperm(num_pages, generator=gen)[:len(ctx_lens) * max_pages]
    table = perm.reshape(len(ctx_lens), max_pages).to(torch.int32)        # pages out of order, unshared
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=gen).to(dtype)
    return q, k_pages, v_pages, table, torch.tensor(ctx_lens, dtype=torch.int32), cu


@pytest.mark.parametrize("q_lens, ctx_lens", [
    ([5, 1, 17], [5, 9, 40]),          # a first prompt, one decode token, a chunk after 23 cached tokens
    ([16, 3], [33, 16]),               # chunks that end on page and block boundaries
    ([0, 7], [12, 7]),                 # a sequence with no new tokens this step
])
def test_extend_matches_float64(q_lens, ctx_lens):
    args = _problem(0, q_lens, ctx_lens)
    assert_close(paged_extend(*args), paged_extend_ref(*args), torch.float32)


def test_gqa_groups_mqa_and_non_contiguous_inputs():
    q, k, v, table, lens, cu = _problem(1, [6, 9], [20, 9], hq=8, hkv=1, d=32)
    q_view = torch.randn(q.shape[0], q.shape[1], 2 * q.shape[2]).to(q)[..., ::2]
    q_view.copy_(q)
    k_wide = torch.cat([k, k], dim=-1)[..., :32]                             # rows strided by 64
    assert not q_view.is_contiguous() and not k_wide.is_contiguous()
    lens_view = torch.stack([lens, lens]).t()[:, 0]                          # stride 2
    assert_close(paged_extend(q_view, k_wide, v, table, lens_view, cu), paged_extend_ref(q, k, v, table, lens, cu),
                 torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    args = _problem(2, [4, 11], [30, 11], dtype=dtype)
    assert_close(paged_extend(*args), paged_extend_ref(*args), dtype)


def test_one_new_token_per_sequence_is_paged_decode():
    q, k, v, table, lens, cu = _problem(3, [1, 1, 1], [7, 16, 29])
    assert_close(paged_extend(q, k, v, table, lens, cu), paged_decode(q, k, v, table, lens), torch.float32)


def test_an_fp8_cache_is_dequantised_in_registers():
    q, k, v, table, lens, cu = _problem(4, [3, 8], [21, 14], d=32)
    k_scale, v_scale = fp8_scales(k), fp8_scales(v)
    k8, v8 = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    assert k8.dtype == FP8 and k8.element_size() == 1
    got = paged_extend(q, k8, v8, table, lens, cu, k_scale=k_scale, v_scale=v_scale)
    # exact against float64 attention over the dequantised cache ...
    assert_close(got, paged_extend_ref(q, k8, v8, table, lens, cu, k_scale=k_scale, v_scale=v_scale), torch.float32)
    # ... and within e4m3's rounding of the fp32 cache's answer (3 mantissa bits: a few percent)
    full = paged_extend_ref(q, k, v, table, lens, cu)
    assert (got.double() - full).abs().max() < 0.1 * full.abs().max()


@pytest.mark.parametrize("change, rule", [
    (lambda a: a.update(cu=torch.tensor([0, 3, 2], dtype=torch.int32)), "cu_seqlens_q"),
    (lambda a: a.update(cu=torch.tensor([1, 3, 5], dtype=torch.int32)), "cu_seqlens_q"),
    (lambda a: a.update(cu=torch.tensor([0, 3, 5], dtype=torch.int64)), "cu_seqlens_q"),
    (lambda a: a.update(lens=torch.tensor([2, 30], dtype=torch.int32)), "seq_lens"),
    (lambda a: a.update(lens=torch.tensor([9, 99], dtype=torch.int32)), "seq_lens"),
    (lambda a: a.update(table=a["table"] + 100), "block_table"),
    (lambda a: a.update(k_scale=torch.ones(2)), "k_scale"),
    (lambda a: a.update(q=a["q"][:, :3]), "Hq"),
])
def test_bad_input_is_named(change, rule):
    q, k, v, table, lens, cu = _problem(5, [3, 2], [9, 12])
    a = dict(q=q, k=k, v=v, table=table, lens=lens, cu=cu, k_scale=None)
    change(a)
    with pytest.raises(ValueError, match=rule):
        paged_extend(a["q"], a["k"], a["v"], a["table"], a["lens"], a["cu"], k_scale=a["k_scale"],
                     v_scale=a["k_scale"])
