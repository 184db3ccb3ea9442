"""The float64 references agree with each other and with PyTorch's own attention."""

import re

import numpy as np
import pytest
import torch

from attnkit.reference.attention import attention_np, attention_ref, causal_mask_np, softmax_np


def test_softmax_rows_sum_to_one_and_survive_large_scores():
    scores = np.array([[1000.0, 1001.0, 999.0], [-np.inf, 0.0, 0.0]])
    p = softmax_np(scores)
    assert np.allclose(p.sum(-1), 1.0) and np.all(np.isfinite(p))
    assert p[1, 0] == 0.0


def test_fully_masked_row_gives_zero():
    assert np.all(softmax_np(np.full((1, 4), -np.inf)) == 0.0)


def test_causal_mask_is_aligned_to_the_end():
    mask = causal_mask_np(2, 5)            # 2 new queries at the end of 5 keys
    assert mask.tolist() == [[True, True, True, True, False], [True] * 5]
    assert not causal_mask_np(3, 1)[:2].any()   # more queries than keys: early rows see nothing


@pytest.mark.parametrize("causal", [False, True])
def test_torch_reference_matches_sdpa(causal):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 13, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 2, 13, 16, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 2, 13, 16, generator=gen, dtype=torch.float64)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), is_causal=causal)
    assert torch.allclose(attention_ref(q, k, v, causal=causal), expected, atol=1e-12)


def test_numpy_and_torch_references_agree_with_rows_that_see_nothing():
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((7, 8)), rng.standard_normal((3, 8)), rng.standard_normal((3, 5))
    out_np = attention_np(q, k, v, causal=True, scale=0.3)
    out_t = attention_ref(*(torch.from_numpy(x)[None, None] for x in (q, k, v)), causal=True, sm_scale=0.3)
    assert np.allclose(out_np, out_t[0, 0].numpy(), atol=1e-12)
    assert np.all(out_np[:4] == 0.0)       # queries 0..3 come before every key
    assert np.abs(out_np[4:]).sum() > 0


@pytest.mark.parametrize("causal", [False, True])
def test_attention_grads_ref_matches_finite_differences(causal):
    """The float64 gradient reference against central differences of attention_ref, with grouped heads
    and more keys than queries, in a few random directions."""
    from attnkit.reference.attention import attention_grads_ref

    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((1, 4, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8)))
    do = torch.randn(1, 4, 5, 8, generator=gen, dtype=torch.float64)
    grads = attention_grads_ref(q, k, v, do, causal=causal)
    eps = 1e-6
    for index, (tensor, grad) in enumerate(zip((q, k, v), grads)):
        assert grad.shape == tensor.shape
        direction = torch.randn(tensor.shape, generator=gen, dtype=torch.float64)
        moved = [list((q, k, v)), list((q, k, v))]
        moved[0][index] = tensor + eps * direction
        moved[1][index] = tensor - eps * direction
        ahead, behind = (attention_ref(*args, causal=causal) for args in moved)
        slope = ((ahead - behind) * do).sum() / (2 * eps)
        assert abs(slope.item() - (grad * direction).sum().item()) < 1e-6


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_nan_propagates_as_in_sdpa(where):
    """A NaN in a query row, or in a key or a value that a row sees: the reference gives NaN exactly where
    SDPA's math backend (PyTorch's definition) does; with ``causal``, SDPA runs row by row over the keys the
    row sees (a key outside the mask is never read, as in the kernels). The reference used to turn a NaN
    row into 0, hiding NaN propagation from every test that compares with it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 8, generator=gen, dtype=torch.float64) for n in (5, 6, 6))
    {"q": q, "k": k, "v": v}[where][0, 1, 2, 3] = float("nan")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.MATH):
        plain = sdpa(q, k, v)
        causal = torch.cat([sdpa(q[:, :, i:i + 1], k[:, :, :i + 2], v[:, :, :i + 2]) for i in range(5)], dim=2)
    for is_causal, expected in ((False, plain), (True, causal)):
        got = attention_ref(q, k, v, causal=is_causal)
        assert torch.isnan(got).any() and torch.equal(torch.isnan(got), torch.isnan(expected)), (where, is_causal)
        finite = ~torch.isnan(expected)
        assert torch.allclose(got[finite], expected[finite], atol=1e-12)
    rows = np.array([[0.0, np.nan, 1.0], [0.0, 1.0, 2.0], [-np.inf, -np.inf, -np.inf]])
    p = softmax_np(rows)
    assert np.isnan(p[0]).all() and np.allclose(p[1].sum(), 1.0) and (p[2] == 0).all()


def test_the_semantics_table_holds():
    """docs/semantics.md: SDPA's side of each difference (PyTorch on the CPU), and each refusal of the
    course's side. No kernel is launched: every refusal comes before one."""
    import math

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    from attnkit.kernels.flash import flash_attention, flash_attention_varlen

    sdpa = torch.nn.functional.scaled_dot_product_attention
    gen = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 1, n, 8, generator=gen) for n in (2, 5, 5))
    # causal with Nq != Nk: SDPA's is_causal is top-left (query 0 sees key 0 alone); the course's bottom-right
    assert torch.allclose(sdpa(q, k, v, is_causal=True)[0, 0, 0], v[0, 0, 0])
    assert causal_mask_np(2, 5).tolist() == [[True, True, True, True, False], [True] * 5]
    assert torch.allclose(sdpa(q, k, v, attn_mask=causal_lower_right(2, 5)).double(),
                          attention_ref(q, k, v, causal=True), atol=1e-6)
    # a row that sees no key: 0 in both
    hidden = torch.ones(2, 5, dtype=torch.bool)
    hidden[1] = False
    with sdpa_kernel(SDPBackend.MATH):
        assert (sdpa(q, k, v, attn_mask=hidden)[0, 0, 1] == 0).all()
    assert (attention_ref(torch.randn(1, 1, 7, 8), k, v, causal=True)[0, 0, :2] == 0).all()
    # accepted by SDPA, refused here: softcap 0, sm_scale <= 0 or NaN, float64, empty dense sequences
    assert torch.allclose(sdpa(q, k, v, scale=0.0)[0, 0, 0], v[0, 0].mean(0), atol=1e-6)
    assert sdpa(q, k, v, scale=-1.0).shape == q.shape
    assert sdpa(q.double(), k.double(), v.double()).dtype == torch.float64
    assert sdpa(q[:, :, :0], k, v).shape == (1, 1, 0, 8) and (sdpa(q, k[:, :, :0], v[:, :, :0]) == 0).all()
    for args, options, message in [
            ((q, k, v), dict(softcap=0.0), "softcap: expected a positive finite number or None"),
            ((q, k, v), dict(sm_scale=0.0), "sm_scale: expected a positive finite number"),
            ((q, k, v), dict(sm_scale=-1.0), "sm_scale: expected a positive finite number"),
            ((q, k, v), dict(sm_scale=math.nan), "sm_scale: expected a positive finite number"),
            ((q.double(), k.double(), v.double()), {}, "q: dtype torch.float64 is not supported"),
            ((q[:, :, :0], k, v), {}, "q: every size must be >= 1"),
            ((q, k[:, :, :0], v[:, :, :0]), {}, "k: every size must be >= 1")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            flash_attention(*args, **options)
    packed = torch.randn(4, 1, 8)
    column = torch.tensor([[0, 9], [4, 9]], dtype=torch.int32)[:, 0]
    with pytest.raises(ValueError, match="cu_seqlens_q: must be contiguous"):
        flash_attention_varlen(packed, packed, packed, column, torch.tensor([0, 4], dtype=torch.int32), 4, 4)
    # NaN: a query row is NaN with SDPA's math backend; the CPU's default backend gave a finite row
    q_nan = q.clone()
    q_nan[0, 0, 1, 0] = math.nan
    with sdpa_kernel(SDPBackend.MATH):
        assert torch.isnan(sdpa(q_nan, k, v)[0, 0, 1]).all()
    assert torch.isfinite(sdpa(q_nan, k, v)).all(), "PyTorch's default CPU backend changed: update docs/semantics.md"
    assert torch.isnan(attention_ref(q_nan, k, v)[0, 0, 1]).all()
    # a NaN key or value that a row does not see: every row NaN with SDPA's math backend; in the reference
    # only the rows that see it (causal, Nq = 3 of Nk = 5: key 4 is seen by row 2 alone)
    q3 = torch.randn(1, 1, 3, 8, generator=gen)
    for which in ("k", "v"):
        kk, vv = k.clone(), v.clone()
        (kk if which == "k" else vv)[0, 0, 4, 0] = math.nan
        with sdpa_kernel(SDPBackend.MATH):
            assert torch.isnan(sdpa(q3, kk, vv, attn_mask=causal_lower_right(3, 5))).any(dim=-1).all()
        rows = torch.isnan(attention_ref(q3, kk, vv, causal=True)).any(dim=-1)[0, 0]
        assert rows.tolist() == [False, False, True], which
