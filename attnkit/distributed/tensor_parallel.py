"""Tensor parallelism for grouped-query attention: the heads split over ranks, and the KV cache with them.

Rank r of ``tp`` takes query heads r·Hq/tp … (r + 1)·Hq/tp − 1 and the KV heads they read (query head h
reads KV head h // (Hq / Hkv)). With tp ≤ Hkv each rank holds Hkv / tp KV heads of its own; with
tp > Hkv each rank holds one KV head, each KV head replicated on tp / Hkv ranks: the cache per GPU
stops shrinking once tp passes Hkv.

- ``heads_of_rank(rank, tp, num_q_heads, num_kv_heads) -> (q_heads, kv_heads)``: global head numbers.
- ``kv_cache_bytes_per_gpu(config, tp, *, tokens, batch=1, dtype_bytes=2)``: one GPU's K and V cache.
- ``tp_generate(rank, tp, model, prompt_ids, max_new_tokens, stop_token=None)``: greedy decoding of the
  capstone's tiny model with its attention split over ``tp`` ranks: each rank projects only its heads,
  caches only its KV heads, and multiplies its heads' output by its columns of the output projection;
  one all-reduce per layer sums the partial outputs (the MLP runs whole on every rank, for brevity).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..reference.rope import apply_rope
from ..validation import positive_int


def _check_split(tp: int, num_q_heads: int, num_kv_heads: int) -> None:
    positive_int("tp", tp)
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads: {num_q_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    if num_q_heads % tp:
        raise ValueError(f"tp: {tp} ranks must divide the {num_q_heads} query heads")
    if tp > num_kv_heads and tp % num_kv_heads:
        raise ValueError(f"tp: with more ranks than KV heads ({num_kv_heads}), tp must be a multiple of them")


def heads_of_rank(rank: int, tp: int, num_q_heads: int, num_kv_heads: int) -> tuple[list[int], list[int]]:
    _check_split(tp, num_q_heads, num_kv_heads)
    if not 0 <= rank < tp:
        raise ValueError(f"rank: expected 0 <= rank < tp={tp}, got {rank}")
    per_rank, group = num_q_heads // tp, num_q_heads // num_kv_heads
    q_heads = list(range(rank * per_rank, (rank + 1) * per_rank))
    return q_heads, sorted({h // group for h in q_heads})


def kv_heads_per_gpu(tp: int, num_q_heads: int, num_kv_heads: int) -> int:
    return len(heads_of_rank(0, tp, num_q_heads, num_kv_heads)[1])


def kv_cache_bytes_per_gpu(config, tp: int, *, tokens: int, batch: int = 1, dtype_bytes: int = 2) -> int:
    """K and V bytes on one GPU: 2 · L · (KV heads per GPU) · D · tokens · batch · dtype_bytes."""
    kv = kv_heads_per_gpu(tp, config.num_q_heads, config.num_kv_heads)
    for name, value in (("tokens", tokens), ("batch", batch), ("dtype_bytes", dtype_bytes)):
        positive_int(name, value)
    return 2 * config.num_layers * kv * config.head_dim * tokens * batch * dtype_bytes


def _rows(weight: torch.Tensor, heads: list[int], head_dim: int) -> torch.Tensor:
    """The output rows of a projection that belong to ``heads``."""
    return torch.cat([weight[h * head_dim:(h + 1) * head_dim] for h in heads])


@torch.no_grad()
def tp_generate(rank: int, tp: int, model, prompt_ids: list[int], max_new_tokens: int,
                stop_token: int | None = None) -> dict:
    """Greedy tokens of ``model`` on ``prompt_ids``, attention split over the ``tp`` ranks of the
    current process group (call it on every rank). Returns the tokens and this rank's cache size."""
    cfg = model.cfg
    q_heads, kv_heads = heads_of_rank(rank, tp, cfg.n_heads, cfg.n_kv_heads)
    group, d = cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    local_kv = [kv_heads.index(h // group) for h in q_heads]       # each local q head's local KV head
    parts = [dict(wq=_rows(b.wq.weight, q_heads, d), wk=_rows(b.wk.weight, kv_heads, d),
                  wv=_rows(b.wv.weight, kv_heads, d),
                  wo=torch.cat([b.wo.weight[:, h * d:(h + 1) * d] for h in q_heads], dim=1))
             for b in model.blocks]
    cache = [([], []) for _ in model.blocks]                       # per layer: K and V rows [Hkv_local, D]
    seq, tokens = list(prompt_ids), []
    position = 0
    while len(tokens) < max_new_tokens:
        new = seq[position:]                                        # the prompt first, then one token
        x = model.embed(torch.tensor([new]))                        # [1, T, d_model]
        pos = torch.arange(position, position + len(new))[None, None, :]
        for block, w, (ks, vs) in zip(model.blocks, parts, cache):
            h = block.attn_norm(x)[0]                               # [T, d_model]
            q = (h @ w["wq"].T).view(len(new), len(q_heads), d).transpose(0, 1)[None]
            k = (h @ w["wk"].T).view(len(new), len(kv_heads), d).transpose(0, 1)[None]
            v = (h @ w["wv"].T).view(len(new), len(kv_heads), d).transpose(0, 1)[None]
            q = apply_rope(q, pos, mode="half", base=cfg.rope_base)
            k = apply_rope(k, pos, mode="half", base=cfg.rope_base)
            ks.append(k[0])
            vs.append(v[0])
            k_all, v_all = torch.cat(ks, dim=1), torch.cat(vs, dim=1)   # [Hkv_local, position + T, D]
            scores = q[0] @ k_all[local_kv].transpose(-1, -2) / d ** 0.5  # [Hq_local, T, position + T]
            t, n = scores.shape[-2:]
            scores = scores.masked_fill(torch.ones(t, n, dtype=torch.bool).triu(1 + n - t), float("-inf"))
            attn = torch.softmax(scores, dim=-1) @ v_all[local_kv]  # [Hq_local, T, D]
            partial = attn.transpose(0, 1).reshape(len(new), -1) @ w["wo"].T  # [T, d_model]
            dist.all_reduce(partial)                                # the sum over ranks: wo on all heads
            x = x + partial[None]
            x = x + block.down(torch.nn.functional.gelu(block.up(block.mlp_norm(x))))
        position += len(new)
        token = int(model.logits(x[0, -1]).argmax())
        tokens.append(token)
        seq.append(token)
        if token == stop_token:
            break
    cache_bytes = sum(t.numel() * t.element_size() for ks, vs in cache for t in (*ks, *vs))
    return dict(tokens=tokens, kv_heads=kv_heads, q_heads=q_heads, cache_bytes=cache_bytes)
