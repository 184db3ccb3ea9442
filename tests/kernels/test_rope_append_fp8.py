"""rope_append writing an FP8 (e4m3) cache: the stored bytes against the reference (rotate in float64,
quantise with fp8_cache.quantize_fp8), on the Triton and the PyTorch path, through strided views,
and the ValueErrors for bad scales.

The bound: V is not rotated, so its bytes equal quantize_fp8's exactly. K is rotated in fp32 by the
kernels, so a K value that lies within an fp32 rounding of an e4m3 rounding boundary may land on the
neighbouring e4m3 value: each stored K byte is at most one e4m3 step from the reference's, and all
but a few per mille are equal (on these inputs: all).
"""
import pytest
import torch

from attnkit.kernels import rope_append as ra
from attnkit.kernels.fp8_cache import FP8, fp8_scales, quantize_fp8
from attnkit.kernels.paged_extend import paged_extend, paged_extend_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ("triton", "torch")


def e4m3_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a − b| in e4m3 steps: each byte as a signed ordinal (sign-magnitude to two's order)."""
    def ordinal(t):
        bits = t.view(torch.uint8).to(torch.int32)
        magnitude = bits & 0x7F
        return torch.where(bits >= 0x80, -magnitude, magnitude)
    return (ordinal(a.cpu()) - ordinal(b.cpu())).abs()


def make_inputs(dtype=torch.float16, batch=2, new_len=3, hq=4, hkv=2, d=24, cache_len=11, seed=0):
    """New tokens BSNH, an fp8 cache BNSH with old rows in it, per-KV-head scales (amax / 448)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, new_len, hq, d, generator=g).to(dtype)
    k = (torch.randn(batch, new_len, hkv, d, generator=g) * 3).to(dtype)
    v = torch.randn(batch, new_len, hkv, d, generator=g).to(dtype)
    k_scale, v_scale = fp8_scales(k.float()), fp8_scales(v.float()) * 0.75      # 0.75: some values saturate
    old = torch.randn(batch, cache_len, hkv, d, generator=g)                      # BSNH, as quantize_fp8 takes
    k_cache = quantize_fp8(old, k_scale).transpose(1, 2).contiguous()             # [B, Hkv, S_cache, D]
    v_cache = quantize_fp8(old * 0.5, v_scale).transpose(1, 2).contiguous()
    seqlens_k = torch.tensor([new_len + 2, cache_len - 1][:batch], dtype=torch.int32)
    return [t.to(DEVICE) for t in (q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k)]


def expected(q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k, share_buffer=True, mode="half"):
    """Rotate in float64 (rope_append_reference on the new tokens), quantise with quantize_fp8."""
    q_rot, k64, _ = ra.rope_append_reference(q, k, v, torch.zeros_like(k_cache, dtype=q.dtype),
                                             torch.zeros_like(v_cache, dtype=q.dtype), seqlens_k=seqlens_k,
                                             share_buffer=share_buffer, mode=mode)
    new_len = q.shape[1]
    present_k = k_cache.cpu().clone() if share_buffer else torch.zeros(k64.shape, dtype=FP8)
    present_v = v_cache.cpu().clone() if share_buffer else torch.zeros(k64.shape, dtype=FP8)
    for b, last in enumerate(seqlens_k.tolist()):
        past = last + 1 - new_len
        rows = slice(past, past + new_len)
        if not share_buffer:
            present_k[b, :, :past] = k_cache[b, :, :past].cpu()
            present_v[b, :, :past] = v_cache[b, :, :past].cpu()
        present_k[b, :, rows] = quantize_fp8(k64[b, :, rows].transpose(0, 1), k_scale.cpu()).transpose(0, 1)
        present_v[b, :, rows] = quantize_fp8(v[b].double().cpu(), v_scale.cpu()).transpose(0, 1)
    return q_rot, present_k, present_v


def assert_within_bound(got_k, got_v, want_k, want_v):
    assert got_k.dtype == FP8 and got_v.dtype == FP8
    assert torch.equal(got_v.cpu().view(torch.uint8), want_v.view(torch.uint8)), "V bytes differ"
    steps = e4m3_steps(got_k, want_k)
    assert int(steps.max()) <= 1, f"a K byte is {int(steps.max())} e4m3 steps away"
    assert float((steps > 0).float().mean()) <= 0.005


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("share_buffer", [True, False])
def test_fp8_cache_bytes_match_the_reference(backend, dtype, share_buffer):
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = make_inputs(dtype)
    want_q, want_k, want_v = expected(q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k, share_buffer)
    before = k_cache.clone()
    out = ra.rope_append(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k, share_buffer=share_buffer,
                         k_scale=k_scale, v_scale=v_scale, backend=backend)
    assert_within_bound(out.k_cache, out.v_cache, want_k, want_v)
    torch.testing.assert_close(out.q.double().cpu(), want_q, **({"rtol": 1e-2, "atol": 1e-2} if dtype ==
                                                                 torch.bfloat16 else {"rtol": 2e-3, "atol": 2e-3}))
    if share_buffer:
        assert out.k_cache is k_cache
    else:
        assert torch.equal(k_cache.view(torch.uint8), before.view(torch.uint8)), "the past was written"


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_reference_function_agrees_with_the_test_expectation(backend):
    inputs = make_inputs(torch.float32, seed=3)
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = inputs
    _, ref_k, ref_v = ra.rope_append_reference(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k,
                                               k_scale=k_scale, v_scale=v_scale, mode="interleaved")
    _, want_k, want_v = expected(*inputs, mode="interleaved")
    assert torch.equal(ref_k.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(ref_v.view(torch.uint8), want_v.view(torch.uint8))
    out = ra.rope_append(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k, k_scale=k_scale, v_scale=v_scale,
                         mode="interleaved", backend=backend)
    assert_within_bound(out.k_cache, out.v_cache, want_k, want_v)


def test_float64_inputs_on_the_pytorch_path_give_the_reference_bytes_exactly():
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = make_inputs(torch.float64, seed=5)
    _, want_k, want_v = expected(q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k)
    out = ra.rope_append(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k, k_scale=k_scale, v_scale=v_scale,
                         backend="torch")
    assert torch.equal(out.k_cache.cpu().view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(out.v_cache.cpu().view(torch.uint8), want_v.view(torch.uint8))


def e4m3_edge_values() -> torch.Tensor:
    """Every finite e4m3 value, the midpoints between neighbours (ties), one fp32 step either side of
    each midpoint, values past ±448, zero, both signs: fp32 [N]."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    grid = torch.unique(codes[torch.isfinite(codes) & (codes >= 0)])                  # sorted, 0 .. 448
    mid = (grid[1:] + grid[:-1]) / 2
    near = torch.cat([mid, torch.nextafter(mid, grid[1:]), torch.nextafter(mid, grid[:-1])])
    values = torch.cat([grid, near, torch.tensor([449.0, 464.0, 500.0, 1e4])])
    return torch.cat([values, -values])


@pytest.mark.parametrize("backend", BACKENDS)
def test_rounding_to_e4m3_matches_torch_at_every_tie_and_boundary(backend):
    """V is stored without rotation: with v_scale = 1 its bytes are fp32 → e4m3 conversions, checked on
    every e4m3 value, every tie, the values next to every tie and the saturating range."""
    values = e4m3_edge_values()
    d = 16
    n = -(-values.numel() // d)
    flat = torch.zeros(n * d)
    flat[: values.numel()] = values
    v = flat.reshape(1, n, 1, d).to(DEVICE)                                           # [B=1, S=n, Hkv=1, D]
    q, k = torch.zeros(1, n, 1, d, device=DEVICE), torch.zeros(1, n, 1, d, device=DEVICE)
    cache = torch.zeros(1, 1, n, d, dtype=FP8, device=DEVICE)
    one = torch.ones(1, device=DEVICE)
    out = ra.rope_append(q, k, v, cache, cache.clone(), k_scale=one, v_scale=one, backend=backend)
    want = quantize_fp8(flat.reshape(n, 1, d), torch.ones(1)).reshape(1, 1, n, d)
    got_bytes, want_bytes = out.v_cache.cpu().view(torch.uint8).flatten(), want.view(torch.uint8).flatten()
    wrong = (got_bytes != want_bytes).nonzero().flatten()[:8].tolist()
    assert not wrong, [(flat[i].item(), f"got {got_bytes[i].item():#04x}", f"want {want_bytes[i].item():#04x}")
                       for i in wrong]


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_views_of_every_argument(backend):
    """q, k, v sliced from wider tensors, the caches stored BSNH and seen through a transpose, the
    scales a column of a [Hkv, layers] table, seqlens_k every other element of a longer tensor."""
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = make_inputs(torch.float16, seed=7)
    want = expected(q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k)
    wide = lambda t: torch.cat([t, torch.randn_like(t.float()).to(t.dtype)], dim=-1)[..., : t.shape[-1]]  # noqa: E731
    q_s, k_s, v_s = wide(q), wide(k), wide(v)
    store_k = k_cache.transpose(1, 2).contiguous()                                    # [B, S, Hkv, D] memory
    store_v = v_cache.transpose(1, 2).contiguous()
    table_k = torch.stack([k_scale * 9, k_scale], dim=1)                              # [Hkv, layers]
    table_v = torch.stack([v_scale * 9, v_scale], dim=1)
    lens = torch.stack([seqlens_k, seqlens_k * 0 + 99], dim=1).flatten()[::2]
    assert not any(t.is_contiguous() for t in (q_s, k_s, store_k.transpose(1, 2), table_k[:, 1], lens))
    out = ra.rope_append(q_s, k_s, v_s, store_k.transpose(1, 2), store_v.transpose(1, 2), seqlens_k=lens,
                         k_scale=table_k[:, 1], v_scale=table_v[:, 1], backend=backend)
    assert_within_bound(out.k_cache, out.v_cache, want[1], want[2])
    assert_within_bound(store_k.transpose(1, 2), store_v.transpose(1, 2), want[1], want[2])


def test_an_fp8_cache_written_by_rope_append_is_read_by_paged_extend():
    """A BSNH fp8 cache is paged_extend's page layout (pages of P rows, in order): append a chunk with
    rope_append, attend with paged_extend, compare with float64 over the dequantised cache."""
    batch, hq, hkv, d, page, pages = 2, 4, 2, 32, 4, 5
    g = torch.Generator().manual_seed(11)
    new_len = 3
    q = torch.randn(batch, new_len, hq, d, generator=g, dtype=torch.float16)
    k = torch.randn(batch, new_len, hkv, d, generator=g, dtype=torch.float16)
    v = torch.randn(batch, new_len, hkv, d, generator=g, dtype=torch.float16)
    k_scale, v_scale = fp8_scales(k.float()) * 2, fp8_scales(v.float()) * 2
    store_k = quantize_fp8(torch.randn(batch, pages * page, hkv, d, generator=g), k_scale)   # [B, S, Hkv, D]
    store_v = quantize_fp8(torch.randn(batch, pages * page, hkv, d, generator=g), v_scale)
    seqlens_k = torch.tensor([6, 13], dtype=torch.int32)                                # last index: 7 and 14 tokens
    out = ra.rope_append(q, k, v, store_k.transpose(1, 2), store_v.transpose(1, 2), seqlens_k=seqlens_k,
                         k_scale=k_scale, v_scale=v_scale, backend="triton")
    k_pages = store_k.view(batch * pages, page, hkv, d)
    v_pages = store_v.view(batch * pages, page, hkv, d)
    table = torch.arange(batch * pages, dtype=torch.int32).view(batch, pages)
    seq_lens = (seqlens_k + 1).to(torch.int32)
    cu = torch.arange(batch + 1, dtype=torch.int32) * new_len
    q_new = out.q.reshape(batch * new_len, hq, d)
    o = paged_extend(q_new, k_pages, v_pages, table, seq_lens, cu, k_scale=k_scale, v_scale=v_scale)
    ref = paged_extend_ref(q_new, k_pages, v_pages, table, seq_lens, cu, k_scale=k_scale, v_scale=v_scale)
    torch.testing.assert_close(o.double(), ref, rtol=5e-3, atol=5e-3)


# --------------------------------------------------------------------------------------- bad scales
def call(backend="torch", **changes):
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = make_inputs(torch.float16)
    kwargs = dict(k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale, seqlens_k=seqlens_k)
    kwargs.update(changes)
    return ra.rope_append(q, k, v, kwargs.pop("k_cache"), kwargs.pop("v_cache"), backend=backend, **kwargs)


HKV = 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
@pytest.mark.parametrize("bad, rule", [
    (torch.ones(HKV + 1), "shape"),
    (torch.ones(1, HKV), "shape"),
    (torch.ones(HKV, dtype=torch.float16), "float32"),
    (torch.ones(HKV, dtype=torch.float64), "float32"),
    (torch.tensor([1.0, 0.0]), "> 0"),
    (torch.tensor([1.0, -2.0]), "> 0"),
    (torch.tensor([1.0, float("nan")]), "finite"),
    (torch.tensor([float("inf"), 1.0]), "finite"),
    ([1.0, 1.0], "tensor"),
])
def test_bad_scales_raise_naming_the_argument(backend, name, bad, rule):
    if isinstance(bad, torch.Tensor):
        bad = bad.to(DEVICE)
    with pytest.raises(ValueError, match=f"{name}.*{rule}"):
        call(backend, **{name: bad})


@pytest.mark.parametrize("name", ["k_scale", "v_scale"])
def test_an_fp8_cache_needs_both_scales(name):
    with pytest.raises(ValueError, match=f"{name}: required"):
        call(**{name: None})


def test_scales_for_a_cache_that_is_not_fp8_raise():
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = make_inputs(torch.float16)
    with pytest.raises(ValueError, match="k_scale, v_scale: only for a float8_e4m3fn cache"):
        ra.rope_append(q, k, v, k_cache.to(torch.float16), v_cache.to(torch.float16), seqlens_k=seqlens_k,
                       k_scale=k_scale, v_scale=v_scale)


def test_caches_of_different_dtypes_raise():
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = make_inputs(torch.float16)
    with pytest.raises(ValueError, match="dtype"):
        ra.rope_append(q, k, v, k_cache, v_cache.to(torch.float16), seqlens_k=seqlens_k,
                       k_scale=k_scale, v_scale=v_scale)
    with pytest.raises(ValueError, match="k_cache: dtype"):
        ra.rope_append(q, k, v, k_cache.to(torch.float32), v_cache.to(torch.float32), seqlens_k=seqlens_k)


def test_writing_fp8_needs_sm89_for_the_triton_path():
    q = torch.zeros(1, 1, 4, 16)
    assert ra.choose_backend(q, capability=(8, 0), cache_dtype=FP8).name == "torch"
    assert "sm_89" in str(ra.choose_backend(q, capability=(8, 6), cache_dtype=FP8))
    assert ra.choose_backend(q, capability=(8, 9), cache_dtype=FP8).name == "triton"
    assert ra.choose_backend(q, capability=(8, 0), cache_dtype=torch.float32).name == "triton"


def test_quantize_e4m3_is_quantize_fp8():
    x = torch.randn(5, 3, 2, 8) * torch.tensor([1.0, 100.0, 1e-3])[None, :, None, None].expand(5, 3, 1, 1)
    scale = torch.tensor([0.5, 3.0])
    assert torch.equal(ra.quantize_e4m3(x, scale).view(torch.uint8), quantize_fp8(x, scale).view(torch.uint8))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["expanded", "offset"])
def test_scales_as_expanded_and_offset_views(backend, kind):
    """One scale for every head as a stride-0 view; scales that start part-way into a longer tensor."""
    q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k = make_inputs(torch.float32, seed=9)
    if kind == "expanded":
        k_scale = k_scale.max().reshape(1).expand(HKV)
        v_scale = v_scale.max().reshape(1).expand(HKV)
        assert k_scale.stride() == (0,)
    else:
        k_scale = torch.cat([torch.full((3,), 7.0, device=DEVICE), k_scale])[3:]
        v_scale = torch.cat([torch.full((3,), 7.0, device=DEVICE), v_scale])[3:]
        assert k_scale.storage_offset() == 3
    want = expected(q, k, v, k_cache, v_cache, k_scale, v_scale, seqlens_k)
    out = ra.rope_append(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k, k_scale=k_scale, v_scale=v_scale,
                         backend=backend)
    assert_within_bound(out.k_cache, out.v_cache, want[1], want[2])
