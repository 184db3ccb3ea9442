"""Every head size 8–256 in both paged kernels, and a value head size Dv that differs from D.

The grid is vLLM's paged-attention test grid (tests/kernels/test_attention.py: HEAD_SIZES = [64, 80, 96,
112, 120, 128, 192, 256], BLOCK_SIZES = [16, 32]; dtypes fp16, bf16, fp32), plus the small and odd sizes
8 and 24 and DeepSeek's (D, Dv) = (192, 128). Each case compares with the float64 reference through a
permuted page table, on pages whose unused slots hold NaN, with the kernels' output buffers poisoned
with NaN: a padding column read from memory, a column left unwritten or a store past Dv fails. In the
interpreter the shapes are small (two sequences, a few dozen tokens).
"""
from __future__ import annotations

import pytest
import torch

from attnkit.kernels import paged, paged_extend
from attnkit.kernels.fp8_cache import fp8_scales, quantize_fp8
from attnkit.tolerances import rel_error, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    def nan_buffer(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(paged, "new_buffer", nan_buffer)
    monkeypatch.setattr(paged_extend, "new_buffer", nan_buffer)


def make_cache(seed, lens, d, dv, page, dtype, *, hq=4, hkv=2, strided=False):
    """q [B, hq, d]; k_pages [P, page, hkv, d] and v_pages [P, page, hkv, dv] with each sequence's pages
    scattered and NaN in every slot no sequence owns; block_table with out-of-range ids past each
    sequence's pages; seq_lens. ``strided``: the pages are one layer of a two-layer buffer with a wider
    head dim, and q a view with gaps (no tensor contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // page) for n in lens]
    num_pages = sum(per_seq) + 2
    k = torch.full((num_pages, page, hkv, d), float("nan"))
    v = torch.full((num_pages, page, hkv, dv), float("nan"))
    q = torch.randn(len(lens), hq, d, generator=gen)
    order = torch.randperm(num_pages, generator=gen)
    table = torch.full((len(lens), max(per_seq) + 1), 10 ** 6, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        pages = order[used: used + per_seq[b]]
        used += per_seq[b]
        table[b, : len(pages)] = pages.int()
        t = torch.arange(n)
        k[pages[t // page], t % page] = torch.randn(n, hkv, d, generator=gen)
        v[pages[t // page], t % page] = torch.randn(n, hkv, dv, generator=gen)
    to = dict(device=DEVICE, dtype=dtype)
    if strided:
        views = (torch.full((2, num_pages, page, hkv, d + 8), float("nan"), **to)[1, ..., 3:3 + d],
                 torch.full((num_pages, 2, page, hkv, dv), float("nan"), **to)[:, 0],
                 torch.zeros(len(lens), hq, 2 * d, **to)[..., ::2])
        k, v, q = (view.copy_(t) for view, t in zip(views, (k, v, q)))
    else:
        q, k, v = q.to(**to), k.to(**to), v.to(**to)
    return q, k, v, table.to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE)


def check_decode(case, **kwargs):
    q, v = case[0], case[2]
    o = paged.paged_decode(*case, **kwargs)
    assert o.shape == (*q.shape[:2], v.shape[-1]) and o.dtype == q.dtype
    err = rel_error(o, paged.paged_decode_ref(*case, k_scale=kwargs.get("k_scale"), v_scale=kwargs.get("v_scale")))
    assert err <= tolerance(q.dtype, DEVICE), f"relative error {err:.2e} for {kwargs}"


# vLLM's head sizes and block sizes, each dtype in turn; 8 and 24 below its smallest
GRID = [(d, page, DTYPES[i % 3]) for i, (d, page) in enumerate(
    [(d, page) for d in (8, 24, 64, 80, 96, 112, 120, 128, 192, 256) for page in (16, 32)])]


@pytest.mark.parametrize("d,page,dtype", GRID, ids=[f"D{d}-page{p}-{str(t)[6:]}" for d, p, t in GRID])
def test_decode_every_head_size(d, page, dtype):
    """Both variants, one and three splits (the merge kernel reads the padded workspace rows)."""
    case = make_cache(d + page, [page + 5, 3], d, d, page, dtype)
    check_decode(case, variant="grouped", num_splits=1)
    check_decode(case, variant="per_head", num_splits=3)


@pytest.mark.parametrize("d,dv", [(192, 128), (64, 96), (24, 8), (80, 256)])
def test_decode_value_head_dim_differs(d, dv):
    case = make_cache(d * dv, [40, 7], d, dv, 16, torch.float16)
    for variant in paged.VARIANTS:
        check_decode(case, variant=variant, num_splits=2)


@pytest.mark.parametrize("d,dv,page", [(80, 80, 32), (120, 96, 16)])
def test_decode_non_contiguous_cache(d, dv, page):
    q, k, v, table, lens = make_cache(7, [35, 12], d, dv, page, torch.float32, strided=True)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    check_decode((q, k, v, table, lens), num_splits=2)


def test_decode_fp8_cache_at_a_padded_head_dim():
    """An FP8 cache at D = 80, Dv = 112 (vLLM's grid runs its FP8 cache at every head size)."""
    q, k, v, table, lens = make_cache(9, [30, 5], 80, 112, 16, torch.float16)
    finite_k, finite_v = k.nan_to_num(0.0), v.nan_to_num(0.0)
    k_scale, v_scale = fp8_scales(finite_k), fp8_scales(finite_v)
    k8, v8 = quantize_fp8(finite_k, k_scale), quantize_fp8(finite_v, v_scale)
    check_decode((q, k8, v8, table, lens), num_splits=2, k_scale=k_scale, v_scale=v_scale)


def extend_case(seed, q_lens, ctx_lens, d, dv, page, dtype, strided=False):
    """paged_extend's inputs: the decode case's cache and table, and q_lens new tokens per sequence."""
    _, k, v, table, lens = make_cache(seed, ctx_lens, d, dv, page, dtype, strided=strided)
    gen = torch.Generator().manual_seed(seed + 1)
    total = sum(q_lens)
    q = torch.randn(total, 4, d, generator=gen).to(device=DEVICE, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    return q, k, v, table, lens, cu


EXTEND = [(8, 8, 16, torch.float32), (24, 24, 32, torch.float16), (80, 80, 16, torch.bfloat16),
          (96, 96, 32, torch.float32), (120, 120, 16, torch.float16), (192, 192, 32, torch.bfloat16),
          (192, 128, 16, torch.float16), (40, 72, 32, torch.float32)]


@pytest.mark.parametrize("d,dv,page,dtype", EXTEND, ids=[f"D{d}-Dv{v}-page{p}" for d, v, p, _ in EXTEND])
def test_extend_head_sizes(d, dv, page, dtype):
    args = extend_case(d + dv, [3, 1], [page + 6, 9], d, dv, page, dtype)
    o = paged_extend.paged_extend(*args)
    assert o.shape == (args[0].shape[0], 4, dv)
    err = rel_error(o, paged_extend.paged_extend_ref(*args))
    assert err <= tolerance(dtype, DEVICE), f"relative error {err:.2e}"


def test_extend_non_contiguous_cache():
    q, k, v, table, lens, cu = extend_case(3, [2, 4], [20, 33], 80, 96, 16, torch.float32, strided=True)
    assert not (k.is_contiguous() or v.is_contiguous())
    err = rel_error(paged_extend.paged_extend(q, k, v, table, lens, cu),
                    paged_extend.paged_extend_ref(q, k, v, table, lens, cu))
    assert err <= tolerance(torch.float32, DEVICE)


@pytest.mark.parametrize("d,dv,message", [
    (4, 4, "q: head dim D=4 is not supported; D must be between 8 and 256"),
    (264, 264, "q: head dim D=264 is not supported"),
    (16, 300, "v_pages: head dim Dv=300 is not supported; Dv must be between 8 and 256"),
])
def test_head_dims_out_of_range_are_refused(d, dv, message):
    q = torch.zeros(2, 4, d, device=DEVICE)
    k = torch.zeros(3, 16, 2, d, device=DEVICE)
    v = torch.zeros(3, 16, 2, dv, device=DEVICE)
    table = torch.zeros(2, 1, dtype=torch.int32, device=DEVICE)
    lens = torch.ones(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=message):
        paged.paged_decode(q, k, v, table, lens)
    with pytest.raises(ValueError, match=message):
        paged_extend.paged_extend(q, k, v, table, lens, torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("make,expected", [
    (lambda: torch.empty(3, 16, 8, 120), 8),                       # D = 120: strides 15360, 960, 120
    (lambda: torch.empty(3, 16, 8, 128), 16),
    (lambda: torch.empty(3, 16, 8, 80, dtype=torch.float8_e4m3fn), 16),
    (lambda: torch.empty(3, 16, 8, 122)[..., 1:121], 2),            # one layer of a wider buffer
    (lambda: torch.empty(3, 16, 8, 128)[..., ::2], 16),             # strides 16384, 1024, 128, 2
    (lambda: torch.empty(1, 16, 1, 120).expand(5, 16, 8, 120), 8),  # stride 0: its contiguous copy decides
    (lambda: torch.empty(3, 1, 1, 24).expand(3, 16, 8, 24), 8),
    (lambda: torch.empty(3, 16, 8, 120).transpose(1, 2), 8),
])
def test_row_alignment_divides_every_row_offset(make, expected):
    """The kernels read a row at page·s0 + slot·s1 + head·s2 and are told that this is a multiple of
    ``row_alignment`` (so that D = 120's rows are read in 16-byte vectors): the claim must hold for every
    row of the tensor and of its contiguous copy (what a bf16 upcast passes), and be the largest one."""
    t = make()
    align = paged.row_alignment(t)
    assert align == expected
    for strides in (t.stride()[:-1], t.contiguous().stride()[:-1]):
        index = torch.cartesian_prod(*(torch.arange(n) for n in t.shape[:-1])).reshape(-1, t.dim() - 1)
        offsets = (index * torch.tensor(strides)).sum(-1)
        assert bool((offsets % align == 0).all())


def test_every_head_size_and_cache_has_a_launch_configuration():
    """One table holds every GPU launch configuration: each (variant, cache, head-dim class) has an entry,
    the head sizes padded to a power of two up to 128 (80-120) have their own, and DeepSeek's (192, 128) too."""
    classes = {paged.head_dim_class(d, dv) for d in range(8, 257, 8) for dv in (d, 128)}
    assert classes == {"narrow", "narrow_padded", "wide_qk", "wide", "widest"}
    assert set(paged.GPU_CONFIGS) == {(variant, cache, c) for variant in paged.VARIANTS for cache in ("16", "fp8")
                                      for c in classes}
    assert paged.head_dim_class(64) == paged.head_dim_class(128) == paged.head_dim_class(16, 128) == "narrow"
    assert paged.head_dim_class(120) == paged.head_dim_class(80) == paged.head_dim_class(128, 96) == "narrow_padded"
    assert paged.head_dim_class(192, 128) == "wide_qk" and paged.head_dim_class(192) == "wide"
    assert paged.head_dim_class(64, 256) == paged.head_dim_class(256) == paged.head_dim_class(200) == "widest"


def test_head_dim_tiles_cover_each_head_dim_with_no_more_columns_than_one_padded_tile():
    """Each head dim's register tiles are powers of two (the second at least 32) that cover it and do not
    exceed the one padded tile; 80, 96 and 192 take two, which saves columns."""
    for d in range(8, 257):
        first, second = paged.head_dim_tiles(d)
        assert first & (first - 1) == 0 and first >= 16
        assert second == 0 or (second & (second - 1) == 0 and second >= 32 and first < d)
        assert d <= first + second <= paged.padded(d)
        assert (second == 0) == (first == paged.padded(d))
    assert [paged.head_dim_tiles(d) for d in (80, 96, 112, 120, 128, 192)] == [
        (64, 32), (64, 32), (128, 0), (128, 0), (128, 0), (128, 64)]
