"""Tensor parallelism for grouped-query attention: the heads split over ranks, and the KV cache with them.

Rank r of ``tp`` takes query heads r·Hq/tp … (r + 1)·Hq/tp − 1 and the KV heads they read (query head h
reads KV head h // (Hq / Hkv)). With tp ≤ Hkv each rank holds Hkv / tp KV heads of its own; with
tp > Hkv each rank holds one KV head, each KV head replicated on tp / Hkv ranks: the cache per GPU
stops shrinking once tp passes Hkv.

- ``heads_of_rank(rank, tp, num_q_heads, num_kv_heads) -> (q_heads, kv_heads)``: global head numbers.
- ``kv_cache_bytes_per_gpu(config, tp, *, tokens, batch=1, dtype_bytes=2)``: one GPU's K and V cache.
- ``tp_generate(rank, tp, model, prompt_ids, max_new_tokens, stop_token=None, device=None)``: greedy
  decoding of the capstone's tiny model with its attention split over ``tp`` ranks: each rank projects
  only its heads, caches only its KV heads, and multiplies its heads' output by its columns of the
  output projection; one all-reduce per layer sums the partial outputs (the MLP runs whole on every
  rank, for brevity). On gloo everything stays on the CPU; on NCCL each rank works on its own GPU
  (``cuda:<rank>`` unless ``device`` says otherwise): its slices of the attention weights and a copy of
  the rest of the model live there, and the all-reduce sums CUDA tensors.
- ``decode_rank(rank, tp, *, prompt, max_new_tokens, repeats=3)``: what ``scripts/gpu_tensor_parallel.py``
  runs on every rank: the shipped tiny model decoded by ``tp_generate`` (no stop token, so every run
  makes ``max_new_tokens`` tokens), once to warm up, then ``repeats`` times timed; each decode step's
  time is the slowest rank's.
"""
from __future__ import annotations

import copy
import statistics
import time

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


def _rank_device(rank: int, device) -> torch.device:
    """Where this rank computes: ``device`` if given; else its own GPU on NCCL, the CPU on gloo."""
    if device is not None:
        return torch.device(device)
    backend = dist.get_backend() if dist.is_initialized() else "gloo"
    return torch.device("cuda", rank % torch.cuda.device_count()) if backend == "nccl" else torch.device("cpu")


def _replicated(model, device):
    """The model without its attention projections (embedding, norms, MLPs, head), on ``device``."""
    shared = copy.deepcopy(model)
    for block in shared.blocks:
        block.wq = block.wk = block.wv = block.wo = None
    return shared.to(device)


@torch.no_grad()
def tp_generate(rank: int, tp: int, model, prompt_ids: list[int], max_new_tokens: int,
                stop_token: int | None = None, device=None, step_times: list | None = None) -> dict:
    """Greedy tokens of ``model`` on ``prompt_ids``, attention split over the ``tp`` ranks of the
    current process group (call it on every rank). Returns the tokens and this rank's cache size.
    ``step_times``, when given, receives each step's seconds on this rank (the prompt's step first)."""
    cfg = model.cfg
    q_heads, kv_heads = heads_of_rank(rank, tp, cfg.n_heads, cfg.n_kv_heads)
    if not prompt_ids:
        raise ValueError("prompt_ids: needs at least one token")
    if dist.is_initialized() and dist.get_world_size() != tp:
        raise ValueError(f"tp: the process group has {dist.get_world_size()} ranks, tp={tp}")
    device = _rank_device(rank, device)
    if dist.is_initialized() and dist.get_backend() == "nccl" and device.type != "cuda":
        raise ValueError(f"device: the NCCL backend sums CUDA tensors only, got {device}")
    group, d = cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    local_kv = [kv_heads.index(h // group) for h in q_heads]       # each local q head's local KV head
    parts = [dict(wq=_rows(b.wq.weight, q_heads, d), wk=_rows(b.wk.weight, kv_heads, d),
                  wv=_rows(b.wv.weight, kv_heads, d),
                  wo=torch.cat([b.wo.weight[:, h * d:(h + 1) * d] for h in q_heads], dim=1))
             for b in model.blocks]
    parts = [{name: w.to(device).contiguous() for name, w in p.items()} for p in parts]
    model = _replicated(model, device)
    cache = [([], []) for _ in model.blocks]                       # per layer: K and V rows [Hkv_local, D]
    seq, tokens = list(prompt_ids), []
    position = 0
    while len(tokens) < max_new_tokens:
        start = time.perf_counter()
        new = seq[position:]                                        # the prompt first, then one token
        x = model.embed(torch.tensor([new], device=device))         # [1, T, d_model]
        pos = torch.arange(position, position + len(new), device=device)[None, None, :]
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
            scores = scores.masked_fill(torch.ones(t, n, dtype=torch.bool, device=device).triu(1 + n - t),
                                        float("-inf"))
            attn = torch.softmax(scores, dim=-1) @ v_all[local_kv]  # [Hq_local, T, D]
            partial = attn.transpose(0, 1).reshape(len(new), -1) @ w["wo"].T  # [T, d_model]
            if tp > 1:
                dist.all_reduce(partial)                            # the sum over ranks: wo on all heads
            x = x + partial[None]
            x = x + block.down(torch.nn.functional.gelu(block.up(block.mlp_norm(x))))
        position += len(new)
        token = int(model.logits(x[0, -1]).argmax())                # a host copy: the step is done
        if step_times is not None:
            step_times.append(time.perf_counter() - start)
        tokens.append(token)
        seq.append(token)
        if token == stop_token:
            break
    cache_bytes = sum(t.numel() * t.element_size() for ks, vs in cache for t in (*ks, *vs))
    return dict(tokens=tokens, kv_heads=kv_heads, q_heads=q_heads, cache_bytes=cache_bytes)


def decode_rank(rank: int, tp: int, *, prompt: str, max_new_tokens: int, repeats: int = 3) -> dict:
    """The shipped tiny model decoded by ``tp_generate`` on this rank (see the module doc): the tokens,
    this rank's heads and cache bytes, and the median over repeats of the median decode step, the
    slowest rank's (the prompt's step is left out: it is a prefill)."""
    from ..serving.tinymodel import load_model

    positive_int("repeats", repeats)
    model = load_model()
    ids = model.encode(prompt)
    device = _rank_device(rank, None)
    result = tp_generate(rank, tp, model, ids, max_new_tokens, device=device)         # warm-up
    medians = []
    for _ in range(repeats):
        steps = []
        again = tp_generate(rank, tp, model, ids, max_new_tokens, device=device, step_times=steps)
        if again["tokens"] != result["tokens"]:
            raise RuntimeError(f"rank {rank}: two runs of the same decode gave different tokens")
        slowest = torch.tensor(steps[1:] or steps, dtype=torch.float64, device=device)
        if dist.is_initialized():
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        medians.append(statistics.median(slowest.tolist()))
    return dict(result, ms_per_token=statistics.median(medians) * 1e3, steps=max_new_tokens - 1,
                device=str(device))
