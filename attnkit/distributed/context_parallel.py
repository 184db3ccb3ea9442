"""Context parallelism: the sequence split over ranks, attention assembled by the merge rule of lesson 3.

Each rank holds the queries, keys and values of some chunks of the sequence (``layout``):
- "contiguous": W chunks, rank r holds chunk r;
- "zigzag": 2W chunks, rank r holds chunks r and 2W − 1 − r, so that under a causal mask every rank
  has the same work.

Three ways to give each rank's queries every key (``VARIANTS``):

``ring_attention(q, k, v, *, causal=False, layout="contiguous", block="kernel")``: K and V travel around
the ring (``batch_isend_irecv`` to rank r + 1, from r − 1) while the block already here is computed;
block results (o, lse) merge by the log-sum-exp rule. On NCCL the sends and receives run on NCCL's own
stream, so the block's attention (on the current stream) overlaps them; ``wait()`` makes the current
stream wait for the received block. The backward sends K, V and their gradients dK, dV around the ring
once more, each rank adding its queries' share, so each rank ends with the gradients of its own K and V.

``all_gather_kv_attention(...)``: every rank gathers all K and V (one all-gather), then computes its
queries' blocks. The gathered K/V are not kept for the backward: it gathers them again, and the
gradients of the gathered K/V go back by one reduce-scatter (the gradient of an all-gather is a
reduce-scatter: rank r's dK is the sum over ranks of their share of shard r).

``ulysses_attention(...)``: an all-to-all trades the sequence split for a head split (rank r receives
heads r·H/W … (r + 1)·H/W − 1 of the whole sequence), attention runs on whole sequences, and a second
all-to-all gives each rank back its tokens. Hq and Hkv must be multiples of W. Its backward is the same
two all-to-alls in reverse.

``block``: "kernel" runs the course's FlashAttention forward (o and lse) and backward (with the final
o and lse) on each block; "torch" the same formulas in PyTorch (float32 or float64, for small checks).

Tensors are [B, H, n, D] shards: n = N / W tokens for "contiguous", two halves of N / (2W) for
"zigzag" in the order of the rank's chunks. ``shard``/``unshard`` convert from and to the full sequence.
Every rank's shard must have the same shape: each call checks it with one small all-gather and
raises ValueError naming each rank's length (``check_lengths=False`` skips that collective).
The same code runs on gloo with CPU tensors and on NCCL with CUDA tensors.

``no_communication()``: inside it, every scheme runs the same block computations, merges and local
copies but calls nothing in torch.distributed: a "received" K/V block is the rank's own (same shape),
a gathered K/V is the rank's own W times, a reduce-scatter keeps the rank's own share, an all-to-all
copies the rank's own part to every slot. The results are wrong; the work is the scheme's compute
alone, which the benchmark times to split a scheme's time into compute and communication
(``attnkit.distributed.benchmark``); ``communicating()`` says whether a call now would communicate.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from .. import validation

LAYOUTS = ("contiguous", "zigzag")
BLOCKS = ("kernel", "torch")
VARIANTS = ("ring", "all_gather_kv", "ulysses")
_COMMUNICATE = [True]          # False inside no_communication()


@contextlib.contextmanager
def no_communication():
    """The schemes' compute alone: no torch.distributed call inside (module doc); results are wrong."""
    _COMMUNICATE[0] = False
    try:
        yield
    finally:
        _COMMUNICATE[0] = True


def communicating() -> bool:
    """Whether the schemes call torch.distributed: False inside ``no_communication()`` only."""
    return _COMMUNICATE[0]


# ------------------------------------------------------------------------------------------- layouts
def chunks_of_rank(rank: int, world_size: int, layout: str) -> list[int]:
    """The global chunk numbers a rank holds, in the order its shard stores them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def num_chunks(world_size: int, layout: str) -> int:
    return world_size if layout == "contiguous" else 2 * world_size


def shard(x: torch.Tensor, rank: int, world_size: int, layout: str, dim: int = 2) -> torch.Tensor:
    """The rank's shard of a full-sequence tensor (sequence along ``dim``)."""
    c = num_chunks(world_size, layout)
    if x.shape[dim] % c:
        raise ValueError(f"x: the sequence length {x.shape[dim]} must be a multiple of {c} chunks "
                         f"({layout} layout over {world_size} ranks)")
    pieces = x.chunk(c, dim=dim)
    return torch.cat([pieces[i] for i in chunks_of_rank(rank, world_size, layout)], dim=dim)


def unshard(shards, layout: str, dim: int = 2) -> torch.Tensor:
    """The full-sequence tensor from every rank's shard (rank order)."""
    world_size = len(shards)
    pieces = {}
    for rank, s in enumerate(shards):
        ids = chunks_of_rank(rank, world_size, layout)
        for cid, piece in zip(ids, s.chunk(len(ids), dim=dim)):
            pieces[cid] = piece
    return torch.cat([pieces[i] for i in range(len(pieces))], dim=dim)


def causal_work(world_size: int, layout: str) -> list[float]:
    """Blocks each rank computes under a causal mask, in units of one full chunk × chunk block of the
    contiguous split (a diagonal block counts one half)."""
    c = num_chunks(world_size, layout)
    scale = (world_size / c) ** 2              # a zig-zag chunk is half as long: a quarter of the area
    work = []
    for rank in range(world_size):
        mine = chunks_of_rank(rank, world_size, layout)
        work.append(scale * sum(0.5 if j == i else 1.0 for i in mine for j in range(c) if j <= i))
    return work


def comm_bytes(variant: str, *, batch: int, kv_heads: int, seq_len: int, head_dim: int, world_size: int,
               q_heads: int | None = None, itemsize: int = 2, backward: bool = False, grad_itemsize: int = 4) -> int:
    """Bytes each rank receives for one attention layer (what ``traffic.count_traffic`` counts).

    With s = 2·B·Hkv·(N/W)·D elements (one rank's K and V) and e = ``itemsize``, g_e = ``grad_itemsize``:

    ring: forward (W − 1)·s·e (W − 1 steps of one K/V shard); backward K and V again, (W − 1)·s·e,
    and dK, dV (accumulated in g_e) around the whole ring so they return to their owner, W·s·g_e.
    all_gather_kv: forward the other W − 1 shards at once, (W − 1)·s·e; backward the same all-gather
    again (the gathered K/V are not kept) and a reduce-scatter of dK, dV, (W − 1)·s·g_e.
    ulysses (needs ``q_heads``): forward an all-to-all of q, k, v and one of o, each receiving (W − 1)/W
    of the rank's tokens × heads: (W − 1)·B·(N/W)·D·(2·Hq + 2·Hkv)/W·e; backward the same volume
    (dO in; dQ, dK, dV out), in e: each head's gradients are complete on one rank, nothing is summed.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {VARIANTS}, got {variant!r}")
    w, n = world_size, seq_len // world_size
    shard_kv = 2 * batch * kv_heads * n * head_dim
    if variant == "ring":
        fwd = (w - 1) * shard_kv * itemsize
        bwd = (w - 1) * shard_kv * itemsize + w * shard_kv * grad_itemsize
    elif variant == "all_gather_kv":
        fwd = (w - 1) * shard_kv * itemsize
        bwd = (w - 1) * shard_kv * itemsize + (w - 1) * shard_kv * grad_itemsize
    else:
        if q_heads is None:
            raise ValueError("q_heads: Ulysses moves the queries too; give the number of query heads")
        if q_heads % w or kv_heads % w:
            raise ValueError(f"world_size: Ulysses splits the heads; Hq={q_heads} and Hkv={kv_heads} must be "
                             f"multiples of {w}")
        fwd = (w - 1) * batch * n * head_dim * (2 * q_heads + 2 * kv_heads) // w * itemsize
        bwd = fwd
    return fwd + bwd if backward else fwd


# ------------------------------------------------------------------------------------ one block
def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.repeat_interleave(group, dim=1) if group > 1 else x


def block_forward_torch(q, k, v, causal: bool, sm_scale: float):
    """(o, lse) of one block: softmax(q kᵀ · scale) v, lse the natural log-sum-exp of each row (fp32+)."""
    group = q.shape[1] // k.shape[1]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = q.to(dtype) @ _repeat_kv(k, group).to(dtype).transpose(-1, -2) * sm_scale      # [B, H, m, n]
    if causal:
        m, n = s.shape[-2:]
        s = s.masked_fill(torch.ones(m, n, dtype=torch.bool, device=s.device).triu(1 + n - m), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.exp(s - lse[..., None]) @ _repeat_kv(v, group).to(dtype)
    return o.to(q.dtype), lse


def block_backward_torch(do, q, k, v, o, lse, causal: bool, sm_scale: float):
    """(dq, dk, dv) of one block given the FINAL output o and log-sum-exp lse of the rows of q."""
    group = q.shape[1] // k.shape[1]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q_, k_, v_, do_, o_ = (t.to(dtype) for t in (q, _repeat_kv(k, group), _repeat_kv(v, group), do, o))
    s = q_ @ k_.transpose(-1, -2) * sm_scale
    if causal:
        m, n = s.shape[-2:]
        s = s.masked_fill(torch.ones(m, n, dtype=torch.bool, device=s.device).triu(1 + n - m), float("-inf"))
    p = torch.exp(s - lse[..., None].to(dtype))                                         # [B, H, m, n]
    d_row = (do_ * o_).sum(-1, keepdim=True)                                            # D = rowsum(dO ∘ O)
    ds = p * (do_ @ v_.transpose(-1, -2) - d_row)
    dq = ds @ k_ * sm_scale
    dk = (ds.transpose(-1, -2) @ q_ * sm_scale)
    dv = p.transpose(-1, -2) @ do_
    b, h, n, d = dk.shape
    dk = dk.reshape(b, h // group, group, n, d).sum(2)
    dv = dv.reshape(b, h // group, group, n, dv.shape[-1]).sum(2)
    return dq, dk, dv


def _block_fns(block: str):
    if block == "torch":
        return block_forward_torch, block_backward_torch
    if block != "kernel":
        raise ValueError(f"block: expected one of {BLOCKS}, got {block!r}")
    from ..kernels.flash import flash_attention_backward, flash_attention_forward

    def forward(q, k, v, causal, sm_scale):
        return flash_attention_forward(q, k, v, causal=causal, sm_scale=sm_scale)

    def backward(do, q, k, v, o, lse, causal, sm_scale):
        return flash_attention_backward(do, q, k, v, o, lse, causal=causal, sm_scale=sm_scale)

    return forward, backward


def merge(state, o, lse):
    """The running (o, lse) of some rows and one more block's (o, lse): the log-sum-exp merge rule."""
    if state is None:
        return o.float() if o.dtype != torch.float64 else o, lse
    o_acc, lse_acc = state
    new = torch.logaddexp(lse_acc, lse)
    # A row that sees no key in either block keeps lse = -inf and o = 0: shift by 0 there, not by -inf
    # (-inf - -inf is NaN).
    shift = torch.where(torch.isfinite(new), new, torch.zeros_like(new))
    return o_acc * torch.exp(lse_acc - shift)[..., None] + o * torch.exp(lse - shift)[..., None], new


# ------------------------------------------------------------------------------------ the pairs
def _pairs(q_ids, kv_ids, causal):
    """(i, j) positions in the q and kv chunk lists whose block is computed, and whether it is diagonal."""
    for i, ci in enumerate(q_ids):
        for j, cj in enumerate(kv_ids):
            if not causal or cj <= ci:
                yield i, j, causal and cj == ci


def _local_forward(q_chunks, q_ids, k_chunks, v_chunks, kv_ids, states, causal, sm_scale, fwd):
    for i, j, diagonal in _pairs(q_ids, kv_ids, causal):
        o, lse = fwd(q_chunks[i], k_chunks[j], v_chunks[j], diagonal, sm_scale)
        states[i] = merge(states[i], o, lse)


def _local_backward(do_chunks, q_chunks, o_chunks, lse_chunks, q_ids, k_chunks, v_chunks, kv_ids,
                    dq, dk, dv, causal, sm_scale, bwd):
    for i, j, diagonal in _pairs(q_ids, kv_ids, causal):
        dq_b, dk_b, dv_b = bwd(do_chunks[i], q_chunks[i], k_chunks[j], v_chunks[j], o_chunks[i], lse_chunks[i],
                               diagonal, sm_scale)
        dq[i] += dq_b
        dk[j] += dk_b
        dv[j] += dv_b


def _exchange(tensors, rank, world_size, group=None):
    """Send ``tensors`` to rank + 1 and receive the same shapes from rank − 1 (asynchronously)."""
    if not _COMMUNICATE[0]:
        return [], list(tensors)                         # no_communication(): the rank's own tensors
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, (rank + 1) % world_size, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, t, (rank - 1) % world_size, group) for t in received]
    return dist.batch_isend_irecv(ops), received


def _wait(requests):
    for r in requests:
        r.wait()


def _split(x, n):
    return list(x.contiguous().chunk(n, dim=2))


def _rank_view(layout: str):
    """(rank, world size, this rank's chunk numbers) in the current process group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return rank, world, chunks_of_rank(rank, world, layout)


def _assemble(states, dtype):
    """This rank's o (in ``dtype``) and lse from the merged (o, lse) of each of its chunks."""
    return torch.cat([s[0] for s in states], dim=2).to(dtype), torch.cat([s[1] for s in states], dim=2)


def _backward_rows(q, o, lse, do, n):
    """The rank's rows cut into its n chunks (q, o, dO, lse) and zeroed dQ accumulators per chunk."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    q_c, o_c, do_c, lse_c = _split(q, n), _split(o, n), _split(do.to(q.dtype), n), list(lse.chunk(n, dim=2))
    return q_c, o_c, do_c, lse_c, [torch.zeros_like(c, dtype=acc) for c in q_c], acc


# ------------------------------------------------------------------------------------ ring
class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, layout, sm_scale, block):
        rank, world, ids = _rank_view(layout)
        fwd, _ = _block_fns(block)
        q_chunks, states = _split(q, len(ids)), [None] * len(ids)
        kv = (k.contiguous(), v.contiguous())
        for step in range(world):
            owner = (rank - step) % world                      # whose K/V are here now
            pending = None
            if step < world - 1:
                pending = _exchange(kv, rank, world)
            _local_forward(q_chunks, ids, _split(kv[0], len(ids)), _split(kv[1], len(ids)),
                           chunks_of_rank(owner, world, layout), states, causal, sm_scale, fwd)
            if pending:
                _wait(pending[0])
                kv = tuple(pending[1])
        o, lse = _assemble(states, q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.layout, ctx.sm_scale, ctx.block = causal, layout, sm_scale, block
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        rank, world, ids = _rank_view(ctx.layout)
        _, bwd = _block_fns(ctx.block)
        n = len(ids)
        q_c, o_c, do_c, lse_c, dq, acc = _backward_rows(q, o, lse, do, n)
        k, v = k.contiguous(), v.contiguous()
        dk, dv = torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)
        for step in range(world):
            owner = (rank - step) % world
            dk_c, dv_c = list(dk.chunk(n, dim=2)), list(dv.chunk(n, dim=2))
            _local_backward(do_c, q_c, o_c, lse_c, ids, _split(k, n), _split(v, n),
                            chunks_of_rank(owner, world, ctx.layout), dq, dk_c, dv_c, ctx.causal, ctx.sm_scale, bwd)
            dk, dv = torch.cat(dk_c, dim=2), torch.cat(dv_c, dim=2)
            # K and V move on while there is a rank left to visit; dK and dV always move on, so after W
            # moves they are back with the rank that owns them.
            if world == 1:
                break
            requests, received = _exchange((k, v, dk, dv) if step < world - 1 else (dk, dv), rank, world)
            _wait(requests)
            if step < world - 1:
                k, v, dk, dv = received
            else:
                dk, dv = received
        return (torch.cat(dq, dim=2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None)


def _check(q, k, v, causal, layout, block, check_lengths=True):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a tensor [B, H, n, D] (this rank's shard)")
    if q.shape[2] != k.shape[2] or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q, k, v: shards of one sequence must have the same B, length n and D, and k, v one "
                         f"shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q, k: Hq={q.shape[1]} must be a multiple of Hkv={k.shape[1]}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v: must be on one device, got {q.device}, {k.device}, {v.device}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal: expected True or False, got {causal!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    if block not in BLOCKS:
        raise ValueError(f"block: expected one of {BLOCKS}, got {block!r}")
    if q.shape[2] % len(chunks_of_rank(0, 1, layout)):
        raise ValueError(f"q: a {layout} shard holds two chunks; its length {q.shape[2]} must be even")
    if not dist.is_initialized():
        raise ValueError("torch.distributed: no process group (call dist.init_process_group, or use "
                         "attnkit.distributed.launch.run_group)")
    if dist.get_backend() == "nccl" and q.device.type != "cuda":
        raise ValueError(f"q: the NCCL backend moves CUDA tensors only, got a tensor on {q.device}")
    if check_lengths and _COMMUNICATE[0]:
        _agree_on_shapes(q, k)


def _agree_on_shapes(q, k):
    """Every rank's (B, Hq, Hkv, n, D) must be the same: one all-gather of five integers, then every rank
    raises the same ValueError (a ring with one longer shard would otherwise wait for bytes never sent)."""
    mine = torch.tensor([q.shape[0], q.shape[1], k.shape[1], q.shape[2], q.shape[3]], dtype=torch.int64,
                        device=q.device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    shapes = [tuple(int(x) for x in t.tolist()) for t in everyone]
    if len(set(shapes)) > 1:
        lengths = ", ".join(f"rank {r}: n={s[3]}" + ("" if s[:3] + s[4:] == shapes[0][:3] + shapes[0][4:]
                                                      else f" (B, Hq, Hkv, D = {s[:3] + s[4:]})")
                            for r, s in enumerate(shapes))
        raise ValueError(f"q, k, v: every rank's shard must have the same shape (pad the sequence to a multiple "
                         f"of the chunk count, and mask the padding), got {lengths}")


def _scale(q, sm_scale):
    """The softmax scale: 1/sqrt(D) by default; NaN, 0 or a negative scale is refused (whatever the block)."""
    return validation.softmax_scale(sm_scale, q.shape[-1])


def ring_attention(q, k, v, *, causal: bool = False, layout: str = "contiguous", sm_scale: float | None = None,
                   block: str = "kernel", check_lengths: bool = True) -> torch.Tensor:
    """This rank's attention output [B, Hq, n, D] for its shard of the sequence (see the module doc)."""
    _check(q, k, v, causal, layout, block, check_lengths)
    return _Ring.apply(q, k, v, causal, layout, _scale(q, sm_scale), block)


# ------------------------------------------------------------------------------------ all-gather
def _gather_kv(k, v, world):
    """[K_0, …, K_{W-1}], [V_0, …] of every rank, by one all-gather of this rank's K and V stacked."""
    kv = torch.stack((k, v)).contiguous()
    if not _COMMUNICATE[0]:
        return [kv[0]] * world, [kv[1]] * world          # no_communication(): the rank's own, W times
    everyone = [torch.empty_like(kv) for _ in range(world)]
    dist.all_gather(everyone, kv)
    return [t[0] for t in everyone], [t[1] for t in everyone]


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, layout, sm_scale, block):
        rank, world, ids = _rank_view(layout)
        fwd, _ = _block_fns(block)
        ks, vs = _gather_kv(k, v, world)
        q_chunks, states = _split(q, len(ids)), [None] * len(ids)
        for owner in range(world):
            _local_forward(q_chunks, ids, _split(ks[owner], len(ids)), _split(vs[owner], len(ids)),
                           chunks_of_rank(owner, world, layout), states, causal, sm_scale, fwd)
        o, lse = _assemble(states, q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)        # this rank's K/V only: the backward gathers again
        ctx.causal, ctx.layout, ctx.sm_scale, ctx.block = causal, layout, sm_scale, block
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        rank, world, ids = _rank_view(ctx.layout)
        _, bwd = _block_fns(ctx.block)
        n = len(ids)
        ks, vs = _gather_kv(k, v, world)
        q_c, o_c, do_c, lse_c, dq, acc = _backward_rows(q, o, lse, do, n)
        shares = []                                   # this rank's share of dK, dV of every rank's shard
        for owner in range(world):
            dk_c = list(torch.zeros_like(ks[owner], dtype=acc).chunk(n, dim=2))
            dv_c = list(torch.zeros_like(vs[owner], dtype=acc).chunk(n, dim=2))
            _local_backward(do_c, q_c, o_c, lse_c, ids, _split(ks[owner], n), _split(vs[owner], n),
                            chunks_of_rank(owner, world, ctx.layout), dq, dk_c, dv_c, ctx.causal, ctx.sm_scale, bwd)
            shares.append(torch.stack((torch.cat(dk_c, dim=2), torch.cat(dv_c, dim=2))).contiguous())
        mine = torch.empty_like(shares[rank])
        if _COMMUNICATE[0]:
            dist.reduce_scatter(mine, shares)
        else:                                         # no_communication(): this rank's own share
            mine.copy_(shares[rank])             # the gradient of an all-gather: sum the shares of shard r on r
        return (torch.cat(dq, dim=2).to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype),
                None, None, None, None)


def all_gather_kv_attention(q, k, v, *, causal: bool = False, layout: str = "contiguous",
                            sm_scale: float | None = None, block: str = "kernel",
                            check_lengths: bool = True) -> torch.Tensor:
    """Like ``ring_attention``, with all K and V gathered on every rank first (see the module doc)."""
    _check(q, k, v, causal, layout, block, check_lengths)
    return _AllGather.apply(q, k, v, causal, layout, _scale(q, sm_scale), block)


# ------------------------------------------------------------------------------------ Ulysses
def _all_to_all(received: list, parts: list) -> None:
    """``received[i]`` ← rank i's ``parts[rank]``: ``dist.all_to_all``, or its pairwise sends on gloo.

    gloo has no all-to-all before torch 2.13 (Colab's and most installed torches), so on gloo every rank
    posts one send and one receive per peer in one batch and copies its own part; the bytes each rank
    receives are the same, (W - 1) parts.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if not _COMMUNICATE[0]:                               # no_communication(): the own part in every slot
        for slot in received:
            slot.copy_(parts[rank])
        return
    if dist.get_backend() != "gloo":
        dist.all_to_all(received, parts)
        return
    received[rank].copy_(parts[rank])
    ops = [op for peer in range(world) if peer != rank
           for op in (dist.P2POp(dist.isend, parts[peer], peer), dist.P2POp(dist.irecv, received[peer], peer))]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def _seq_to_heads(x, world, layout):
    """[B, H, n, D] (this rank's tokens, every head) -> [B, H/W, N, D] (every token of this rank's heads)."""
    parts = [p.contiguous() for p in x.chunk(world, dim=1)]           # part j: the heads rank j will own
    received = [torch.empty_like(parts[0]) for _ in range(world)]     # from rank i: its tokens of my heads
    _all_to_all(received, parts)
    return unshard(received, layout)


def _heads_to_seq(y, world, layout):
    """The inverse of ``_seq_to_heads``: [B, H/W, N, D] -> [B, H, n, D]."""
    parts = [shard(y, r, world, layout).contiguous() for r in range(world)]
    received = [torch.empty_like(parts[0]) for _ in range(world)]
    _all_to_all(received, parts)
    return torch.cat(received, dim=1)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layout):
        ctx.layout = layout
        return _seq_to_heads(x, dist.get_world_size(), layout)

    @staticmethod
    def backward(ctx, grad):
        return _heads_to_seq(grad, dist.get_world_size(), ctx.layout), None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, layout):
        ctx.layout = layout
        return _heads_to_seq(y, dist.get_world_size(), layout)

    @staticmethod
    def backward(ctx, grad):
        return _seq_to_heads(grad, dist.get_world_size(), ctx.layout), None


class _WholeSequence(torch.autograd.Function):
    """One block: attention of whole sequences (this rank's heads), with the block's backward."""
    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, block):
        fwd, _ = _block_fns(block)
        o, lse = fwd(q, k, v, causal, sm_scale)
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.block = causal, sm_scale, block
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        _, bwd = _block_fns(ctx.block)
        dq, dk, dv = bwd(do.to(q.dtype).contiguous(), q, k, v, o, lse, ctx.causal, ctx.sm_scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


def ulysses_attention(q, k, v, *, causal: bool = False, layout: str = "contiguous", sm_scale: float | None = None,
                      block: str = "kernel", check_lengths: bool = True) -> torch.Tensor:
    """Like ``ring_attention``, by two all-to-alls of heads (see the module doc); Hq, Hkv multiples of W."""
    _check(q, k, v, causal, layout, block, check_lengths)
    world = dist.get_world_size()
    if q.shape[1] % world or k.shape[1] % world:
        raise ValueError(f"q, k: Ulysses gives each of the {world} ranks whole heads; Hq={q.shape[1]} and "
                         f"Hkv={k.shape[1]} must be multiples of {world} (replicate KV heads, or use the ring)")
    q_h, k_h, v_h = (_SeqToHeads.apply(t, layout) for t in (q, k, v))
    o_h = _WholeSequence.apply(q_h, k_h, v_h, causal, _scale(q, sm_scale), block)
    return _HeadsToSeq.apply(o_h, layout)


ATTEND = {"ring": ring_attention, "all_gather_kv": all_gather_kv_attention, "ulysses": ulysses_attention}

__all__ = ["LAYOUTS", "VARIANTS", "ATTEND", "no_communication", "chunks_of_rank", "shard", "unshard", "causal_work",
           "comm_bytes", "ring_attention", "all_gather_kv_attention", "ulysses_attention", "merge",
           "block_forward_torch", "block_backward_torch"]
