"""Every public kernel function reads each tensor argument through its strides.

Each argument in turn is replaced by a view of the same values (the others stay contiguous) and the
result is compared with the float64 reference computed on contiguous copies:
- "strided": every dimension's stride is not the contiguous one (a slice of a larger buffer);
- "expanded": one dimension has stride 0 (its values repeat; the reference sees the repeated values);
- "offset": the view starts 3 elements into its storage (not 16-byte aligned, so no TMA either).
A kernel that assumes a contiguous layout, a unit stride or a zero storage offset reads the wrong
elements and fails. On a CPU the kernels run in Triton's interpreter, so the shapes are small.
"""
from __future__ import annotations

import pytest
import torch

from attnkit.kernels.flash import flash_attention
from attnkit.kernels.paged import paged_decode, paged_decode_ref
from attnkit.kernels.rope_append import rope_append, rope_append_reference
from attnkit.kernels.softmax import softmax
from attnkit.reference.attention import attention_ref, softmax_np
from attnkit.tolerances import rel_error, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KINDS = ("strided", "expanded", "offset")


def view(t: torch.Tensor, kind: str, dim: int = 0) -> torch.Tensor:
    """A view of kind ``kind`` holding t's values ("expanded": t's first slice along ``dim``, repeated)."""
    if kind == "expanded":
        return t.narrow(dim, 0, 1).expand(t.shape)
    if kind == "strided":
        big = torch.zeros([2 * s + 1 for s in t.shape], dtype=t.dtype, device=t.device)
        out = big[tuple(slice(1, None, 2) for _ in t.shape)]
    else:
        out = torch.zeros(t.numel() + 3, dtype=t.dtype, device=t.device)[3:].view(t.shape)
    out.copy_(t)
    assert out.data_ptr() != t.data_ptr() and out.is_contiguous() == (kind == "offset")
    return out


def replaced(args: dict, name: str, kind: str, dim: int = 0) -> tuple[dict, dict]:
    """(arguments with ``name`` replaced by its view, the same values as contiguous tensors)."""
    strided = dict(args, **{name: view(args[name], kind, dim)})
    return strided, {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in strided.items()}


def close(got, expected, dtype=torch.float32) -> bool:
    return rel_error(got, expected) <= tolerance(dtype, DEVICE)


# --------------------------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("kind", KINDS)
def test_softmax(kind):
    x = torch.randn(5, 37, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    x_view = view(x, kind)
    assert close(softmax(x_view), softmax_np(x_view.double().cpu().numpy()))


# ----------------------------------------------------------------------------------------------- flash
FLASH_DIMS = {"q": 1, "k": 2, "v": 3}      # expanded along heads (q), keys (k), the head dim (v)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(FLASH_DIMS))
def test_flash_attention(name, kind):
    gen = torch.Generator().manual_seed(2)
    args = dict(q=torch.randn(2, 4, 19, 16, generator=gen), k=torch.randn(2, 2, 23, 16, generator=gen),
                v=torch.randn(2, 2, 23, 16, generator=gen))
    args, values = replaced({n: t.to(DEVICE) for n, t in args.items()}, name, kind, FLASH_DIMS[name])
    o = flash_attention(args["q"], args["k"], args["v"], causal=True)
    assert close(o, attention_ref(values["q"], values["k"], values["v"], causal=True)), f"{name} {kind}"


# ----------------------------------------------------------------------------------------------- paged
def paged_args(gen):
    """Two sequences (14 and 9 tokens) in 4-token pages scattered over a pool of 8."""
    lens, page_size = [14, 9], 4
    k_pages, v_pages = (torch.randn(8, page_size, 2, 16, generator=gen) for _ in range(2))
    table = torch.tensor([[5, 0, 7, 2], [3, 6, 1, 4]], dtype=torch.int32)
    return dict(q=torch.randn(2, 4, 16, generator=gen), k_pages=k_pages, v_pages=v_pages, block_table=table,
                seq_lens=torch.tensor(lens, dtype=torch.int32))


PAGED_DIMS = {"q": 1, "k_pages": 2, "v_pages": 3, "block_table": 0, "seq_lens": 0}


def test_paged_decode_reads_seq_lens_through_its_stride():
    """A column of a [B, 2] tensor: stride 2 (the second sequence attends to 9 tokens, not 1)."""
    args = paged_args(torch.Generator().manual_seed(3))
    args["seq_lens"] = torch.tensor([[14, 1], [9, 1]], dtype=torch.int32)[:, 0]
    args = {n: t.to(DEVICE) for n, t in args.items()}
    assert close(paged_decode(*args.values()), paged_decode_ref(*(t.contiguous() for t in args.values())))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(PAGED_DIMS))
@pytest.mark.parametrize("num_splits", [1, 2])
def test_paged_decode(name, kind, num_splits):
    args = {n: t.to(DEVICE) for n, t in paged_args(torch.Generator().manual_seed(4)).items()}
    args, values = replaced(args, name, kind, PAGED_DIMS[name])
    o = paged_decode(*args.values(), num_splits=num_splits)
    assert close(o, paged_decode_ref(*values.values())), f"{name} {kind}"


# ----------------------------------------------------------------------------------------- rope_append
def rope_args(gen):
    """Two sequences appending 3 tokens to caches of 12 rows after 4 and 6 cached ones."""
    b, s, hq, hkv, d, cap = 2, 3, 4, 2, 16, 12
    return dict(q=torch.randn(b, s, hq, d, generator=gen), k=torch.randn(b, s, hkv, d, generator=gen),
                v=torch.randn(b, s, hkv, d, generator=gen), k_cache=torch.randn(b, hkv, cap, d, generator=gen),
                v_cache=torch.randn(b, hkv, cap, d, generator=gen),
                seqlens_k=torch.tensor([6, 8], dtype=torch.int32),
                position_ids=torch.tensor([[4, 5, 6], [6, 7, 8]], dtype=torch.int64))


ROPE_DIMS = {"q": 2, "k": 3, "v": 1, "k_cache": 1, "v_cache": 3, "seqlens_k": 0, "position_ids": 0}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(ROPE_DIMS))
@pytest.mark.parametrize("share_buffer", [True, False], ids=["shared", "separate"])
def test_rope_append(name, kind, share_buffer):
    args = {n: t.to(DEVICE) for n, t in rope_args(torch.Generator().manual_seed(5)).items()}
    args, values = replaced(args, name, kind, ROPE_DIMS[name])
    options = dict(share_buffer=share_buffer, backend="triton")
    if share_buffer and kind == "expanded" and name in ("k_cache", "v_cache"):
        with pytest.raises(ValueError, match=f"{name}: is written"):
            rope_append(**args, **options)
        return
    expected = rope_append_reference(**values, share_buffer=share_buffer)
    out = rope_append(**args, **options)
    for what, got, want in zip(("q", "k_cache", "v_cache"), (out.q, out.k_cache, out.v_cache), expected):
        assert close(got, want), f"{what} for {name} {kind}"


def test_rope_append_reads_seqlens_k_through_its_stride():
    """A column of a [B, 2] tensor: with its stride ignored, sequence 1 would write at row 0."""
    args = {n: t.to(DEVICE) for n, t in rope_args(torch.Generator().manual_seed(6)).items()}
    args["seqlens_k"] = torch.tensor([[6, 0], [8, 0]], dtype=torch.int32, device=DEVICE)[:, 0]
    del args["position_ids"]
    expected = rope_append_reference(**{n: t.contiguous() for n, t in args.items()})
    out = rope_append(**args, backend="triton")
    assert close(out.k_cache, expected[1]) and close(out.v_cache, expected[2])


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_rope_append_refuses_caches_that_share_memory(backend):
    args = rope_args(torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match="k_cache, v_cache: must not share memory"):
        rope_append(**dict(args, v_cache=args["k_cache"]), backend=backend)
    both = torch.randn(2, 2, 13, 16)              # overlapping rows of one buffer
    with pytest.raises(ValueError, match="k_cache, v_cache: must not share memory"):
        rope_append(**dict(args, k_cache=both[:, :, :12], v_cache=both[:, :, 1:]), backend=backend)
    with pytest.raises(ValueError, match="k, k_cache: must not share memory"):
        rope_append(**dict(args, k=args["k_cache"][:, :, :3].transpose(1, 2)), backend=backend)
    kv = torch.randn(2, 2, 12, 2, 16)             # K and V interleaved in one buffer: no element shared
    out = rope_append(**dict(args, k_cache=kv[..., 0, :], v_cache=kv[..., 1, :]), backend=backend)
    assert out.k_cache.data_ptr() == kv.data_ptr()
