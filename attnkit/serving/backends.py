"""How the serving engine attends: the course's Triton kernels, or the same attention in plain PyTorch.

    kernel_backend()     # flash_attention(_varlen) for prefill, paged_decode for decode, paged_extend for chunks
    torch_backend()      # causal_attention_torch and paged_decode_torch: no Triton, for comparison
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .tinymodel import causal_attention_torch


def paged_decode_torch(q, k_pages, v_pages, block_table, seq_lens):
    """Decode attention over a paged cache in plain PyTorch: gather each sequence's pages, then attend.

    q [B, Hq, D]; k_pages, v_pages [num_pages, page_size, Hkv, D]; block_table int32 [B, max_pages];
    seq_lens int32 [B] → [B, Hq, D]. Sequence b sees its first seq_lens[b] cached tokens.
    """
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    max_len = block_table.shape[1] * page_size
    k = k_pages[block_table.long()].reshape(batch, max_len, n_kv, head_dim)    # [B, L, Hkv, D]
    v = v_pages[block_table.long()].reshape(batch, max_len, n_kv, head_dim)
    group = n_heads // n_kv
    k = k.repeat_interleave(group, dim=2).transpose(1, 2)                       # [B, Hq, L, D]
    v = v.repeat_interleave(group, dim=2).transpose(1, 2)
    scores = (k @ q[..., None])[..., 0] / math.sqrt(head_dim)                   # [B, Hq, L]
    visible = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(q.device)  # [B, L]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return (torch.softmax(scores, dim=-1)[:, :, None, :] @ v)[:, :, 0, :]        # [B, Hq, D]


@dataclass(frozen=True)
class Backend:
    """How the engine attends: ``prefill(q, k, v)`` causal over a prompt, ``decode(...)`` over pages,
    and optionally ``extend(q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q)``: a chunk of new
    tokens over the paged cache (else a chunk after a cached prefix gathers the prefix for ``prefill``)."""

    name: str
    prefill: object
    decode: object
    extend: object = None
    prefill_packed: object = None     # prefill_packed(q, k, v, cu_seqlens): several prompts in one call


def kernel_backend() -> Backend:
    """The course's Triton kernels: flash_attention for prefill, paged_decode for decode (its values
    checked on the device, so a decode step makes no host synchronisation on any device)."""
    from ..kernels.flash import flash_attention, flash_attention_varlen
    from ..kernels.paged import paged_decode
    from ..kernels.paged_extend import paged_extend

    def prefill_packed(q, k, v, cu_seqlens):
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        return flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=True)

    return Backend("kernels", lambda q, k, v: flash_attention(q, k, v, causal=True),
                   functools.partial(paged_decode, check_values="device"), paged_extend, prefill_packed)


def torch_backend() -> Backend:
    """The same attention written out in PyTorch (for comparison; no Triton)."""
    return Backend("torch", causal_attention_torch, paged_decode_torch)
