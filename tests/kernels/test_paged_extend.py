"""paged_extend: several new tokens per sequence over a paged cache, against float64, with an FP8 cache;
its one-token case agrees with paged_decode."""
import pytest
import torch

from attnkit.kernels.fp8_cache import FP8, fp8_scales, quantize_fp8
from attnkit.kernels.paged import paged_decode
from attnkit.kernels.paged_extend import paged_extend, paged_extend_ref
from attnkit.tolerances import assert_close

# On a GPU float32 products run on tf32 tensor cores: the bound is the device's (tolerances.tolerance).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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
    assert_close(paged_extend(*args), paged_extend_ref(*args), torch.float32, DEVICE)


def test_gqa_groups_mqa_and_non_contiguous_inputs():
    q, k, v, table, lens, cu = _problem(1, [6, 9], [20, 9], hq=8, hkv=1, d=32)
    q_view = torch.randn(q.shape[0], q.shape[1], 2 * q.shape[2]).to(q)[..., ::2]
    q_view.copy_(q)
    k_wide = torch.cat([k, k], dim=-1)[..., :32]                             # rows strided by 64
    assert not q_view.is_contiguous() and not k_wide.is_contiguous()
    lens_view = torch.stack([lens, lens]).t()[:, 0]                          # stride 2
    assert_close(paged_extend(q_view, k_wide, v, table, lens_view, cu), paged_extend_ref(q, k, v, table, lens, cu),
                 torch.float32, DEVICE)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    args = _problem(2, [4, 11], [30, 11], dtype=dtype)
    assert_close(paged_extend(*args), paged_extend_ref(*args), dtype, DEVICE)


def test_one_new_token_per_sequence_is_paged_decode():
    q, k, v, table, lens, cu = _problem(3, [1, 1, 1], [7, 16, 29])
    assert_close(paged_extend(q, k, v, table, lens, cu), paged_decode(q, k, v, table, lens), torch.float32, DEVICE)


def test_an_fp8_cache_is_dequantised_in_registers():
    q, k, v, table, lens, cu = _problem(4, [3, 8], [21, 14], d=32)
    k_scale, v_scale = fp8_scales(k), fp8_scales(v)
    k8, v8 = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    assert k8.dtype == FP8 and k8.element_size() == 1
    got = paged_extend(q, k8, v8, table, lens, cu, k_scale=k_scale, v_scale=v_scale)
    # exact against float64 attention over the dequantised cache ...
    assert_close(got, paged_extend_ref(q, k8, v8, table, lens, cu, k_scale=k_scale, v_scale=v_scale), torch.float32,
                 DEVICE)
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


# ------------------------------------------------------------------------------------ hostile input
@pytest.mark.parametrize("max_q_len", [5, 0, -3, 2.5, True])
def test_max_q_len_is_checked_against_the_chunks(max_q_len):
    """max_q_len bounds the longest chunk (17 here): a smaller one, 0, a negative or a float is refused."""
    args = _problem(6, [5, 1, 17], [5, 9, 40])
    with pytest.raises(ValueError, match="max_q_len"):
        paged_extend(*args, max_q_len=max_q_len)


def test_every_row_is_computed_whatever_max_q_len():
    """max_q_len sizes the grid only: unchecked, a too small one still computes every row (the programs
    stride over the row blocks), and the device check flags it."""
    from attnkit.kernels import paged

    args = _problem(6, [5, 1, 17], [5, 9, 40])
    paged.raise_pending_errors()
    got = paged_extend(*args, max_q_len=1, check_values=False)
    assert_close(got, paged_extend_ref(*args), torch.float32, DEVICE)
    paged_extend(*args, max_q_len=1, check_values="device")
    with pytest.raises(ValueError, match="paged_extend call 1 of 1: max_q_len"):
        paged.raise_pending_errors()


@pytest.mark.parametrize("tiles", [dict(block_n=3), dict(block_m=0), dict(block_m=8), dict(block_n=512),
                                   dict(block_m=16.0), dict(block_n=True)])
def test_tile_sizes_are_checked(tiles):
    args = _problem(6, [3, 2], [9, 12])
    with pytest.raises(ValueError, match=f"{next(iter(tiles))}: expected a power of two from 16 to 256"):
        paged_extend(*args, **tiles)


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), 0.0])
def test_scales_must_be_finite_and_positive(scale):
    q, k, v, table, lens, cu = _problem(7, [3, 2], [9, 12])
    k_scale, v_scale = fp8_scales(k), fp8_scales(v)
    k8, v8 = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    bad = v_scale.clone()
    bad[1] = scale
    with pytest.raises(ValueError, match="v_scale: every scale must be finite and > 0"):
        paged_extend(q, k8, v8, table, lens, cu, k_scale=k_scale, v_scale=bad)


def test_bad_page_ids_and_offsets_unchecked_stay_in_bounds():
    """Unchecked (check_values=False, or "device" before the flag is read) bad values are clamped in the
    kernel: page ids past the pool, lengths past the table and offsets past total_q read and write
    nothing out of bounds; "device" reports them."""
    from attnkit.kernels import paged

    q, k, v, table, lens, cu = _problem(8, [3, 4], [9, 12], num_pages=8)
    table = table.clone()
    table[0, 0] = 10 ** 6                      # a used page past the pool
    table[1, 1] = -(10 ** 6)
    long_lens = torch.tensor([9, 10 ** 5], dtype=torch.int32)
    far_cu = torch.tensor([0, 3, 10 ** 6], dtype=torch.int32)
    paged.raise_pending_errors()
    for bad in (dict(table=table), dict(lens=long_lens), dict(cu=far_cu)):
        a = dict(table=table if "table" in bad else _problem(8, [3, 4], [9, 12], num_pages=8)[3], lens=lens, cu=cu)
        a.update(bad)
        for mode in (False, "device"):
            out = paged_extend(q, k, v, a["table"], a["lens"], a["cu"], check_values=mode, max_q_len=4)
            assert out.shape == q.shape
        with pytest.raises(ValueError, match="paged_extend call 1 of 1"):
            paged.raise_pending_errors()
        with pytest.raises(ValueError):
            paged_extend(q, k, v, a["table"], a["lens"], a["cu"], check_values="strict")


def test_an_fp8_nan_byte_gives_nan_not_480():
    """On Triton's interpreter an e4m3 NaN byte reads as 480 unless the kernel's caller takes care
    (fp8_cache.fp8_read): the rows that read the NaN are NaN, as on a GPU; the others are exact."""
    q, k, v, table, lens, cu = _problem(9, [3, 2], [9, 12])
    k_scale, v_scale = fp8_scales(k), fp8_scales(v)
    k8, v8 = quantize_fp8(k, k_scale), quantize_fp8(v, v_scale)
    page = int(table[1, 0])                     # sequence 1's first token: only sequence 1 reads it
    k8.view(torch.uint8)[page, 0, 0, 0] = 0x7F  # e4m3's NaN: every score of KV head 0 with that key
    got = paged_extend(q, k8, v8, table, lens, cu, k_scale=k_scale, v_scale=v_scale)
    assert torch.isnan(got[3:, :2]).all(), "the rows of sequence 1, KV head 0, must be NaN"
    ref = paged_extend_ref(q, k8, v8, table, lens, cu, k_scale=k_scale, v_scale=v_scale)
    assert_close(got[:3], ref[:3], torch.float32, DEVICE)
    got_decode = paged_decode(q[[2, 4]], k8, v8, table, lens, k_scale=k_scale, v_scale=v_scale)
    assert torch.isnan(got_decode[1, :2]).all() and torch.isfinite(got_decode[0]).all()


COMPILE_FOR_SM90 = r'''
import os
os.environ["TRITON_INTERPRET"] = "0"   # compile for a GPU target, even on a CPU
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnkit.kernels.paged_extend import _extend_kernel as fn

for scaled, cache in ((True, "*fp8e4nv"), (False, "*fp16")):
    constexprs = dict(GROUP=4, PAGE=16, D=80, BLOCK_D=128, DV=72, BLOCK_DV=128, BLOCK_M=16, BLOCK_N=32, SCALED=scaled,
                      K_ALIGN=16, V_ALIGN=8)       # V's rows of 72: multiples of 8 (paged.row_alignment)
    types = {"table_ptr": "*i32", "lens_ptr": "*i32", "cu_ptr": "*i32", "k_scale_ptr": "*fp32",
             "v_scale_ptr": "*fp32", "k_ptr": cache, "v_ptr": cache, "sm_scale_log2": "fp32"}
    signature = {name: "constexpr" if name in constexprs
                 else types.get(name, "*fp16" if name.endswith("_ptr") else "i32") for name in fn.arg_names}
    source = ASTSource(fn=fn, signature=signature,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    assert ".entry" in triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
    print("compiled", scaled)
'''


@pytest.mark.slow
def test_the_kernel_compiles_for_an_h100():
    """The interpreter is lenient: the kernel (its programs striding over row blocks, clamped reads, an fp8
    cache or not, a padded head dim) must also compile to PTX for sm_90 (no GPU needed)."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 2
