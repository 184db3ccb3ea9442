"""Round 4 of fresh wrong answers for lab 10 (beyond one GPU), written from the lab's text and its solution only
(the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; a ring's witness runs it on 2 and
3 gloo processes. New classes here: the answer to another question (the zig-zag split's ratio), a merge that
changes its inputs in place, a row axis written for 2-D inputs only, a ring whose last rank does not wrap
around, a ring that sends a non-contiguous view, a result with an extra value, one head counted for all, and an
argument with a default ignored."""
import math
import multiprocessing
import os
import socket

import torch
import torch.distributed as dist

from attnkit.distributed.context_parallel import block_forward_torch

# ---------------------------------------------------------------- the solution


def zigzag_chunks(rank, world_size):
    return [rank, 2 * world_size - 1 - rank]


def predicted_work_ratio(world_size):
    return (world_size - 1 + 0.5) / 0.5


def merge_blocks(o_a, lse_a, o_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))  # −inf where both are empty
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b  # 0 there
    return o, lse


def ring_forward(q, k, v, causal):
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    k, v = k.contiguous(), v.contiguous()
    for step in range(world):
        owner = (rank - step) % world
        requests = []
        if step < world - 1:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + 1) % world), dist.P2POp(dist.isend, v, (rank + 1) % world),
                dist.P2POp(dist.irecv, next_k, (rank - 1) % world), dist.P2POp(dist.irecv, next_v, (rank - 1) % world)])
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


def step_transfer_us(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


SOLUTION = {"zigzag": zigzag_chunks, "ratio": predicted_work_ratio, "merge": merge_blocks, "ring": ring_forward,
            "step_transfer": step_transfer_us}

# ---------------------------------------------------------------- exercise 2


def wr_zigzag_balance(world_size):
    """Exercise 2. Returns 1.0 for every W: the ratio of the zig-zag split (balanced), not of the contiguous
    split the exercise asks about."""
    return 1.0


# ---------------------------------------------------------------- exercise 3


def mb_in_place(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Scales o_a and o_b in place (o_a.mul_, then o_a.add_) and returns o_a ('no new tensor'): the
    result is right, but the caller's o_a and o_b are changed."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o_a.mul_(torch.exp(lse_a - safe)[..., None])
    o_a.add_(o_b.mul_(torch.exp(lse_b - safe)[..., None]))
    return o_a, lse


def mb_row_axis_2d(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Weights broadcast with [:, None] ('rows are the first axis'): right for lse of shape [rows];
    with leading axes [..., rows] the new axis lands in the wrong place."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[:, None] * o_a + torch.exp(lse_b - safe)[:, None] * o_b
    return o, lse


# ---------------------------------------------------------------- exercise 4


def rg_no_wraparound(q, k, v, causal):
    """Exercise 4. Neighbours rank + 1 and rank − 1 without % world ('the ring closes by itself'): the last rank
    sends to rank W, which does not exist, and rank 0 receives from −1."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    k, v = k.contiguous(), v.contiguous()
    for step in range(world):
        owner = (rank - step) % world
        requests = []
        if step < world - 1:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, rank + 1), dist.P2POp(dist.isend, v, rank + 1),
                dist.P2POp(dist.irecv, next_k, rank - 1), dist.P2POp(dist.irecv, next_v, rank - 1)])
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


def rg_no_contiguous(q, k, v, causal):
    """Exercise 4. Drops k.contiguous() ('the inputs are contiguous anyway'): a k or v that is a strided view
    (a BSNH cache seen as BNSH) is sent as it is, and its receive buffer, empty_like(k), keeps its strides."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    for step in range(world):
        owner = (rank - step) % world
        requests = []
        if step < world - 1:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + 1) % world), dist.P2POp(dist.isend, v, (rank + 1) % world),
                dist.P2POp(dist.irecv, next_k, (rank - 1) % world), dist.P2POp(dist.irecv, next_v, (rank - 1) % world)])
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


def rg_returns_lse(q, k, v, causal):
    """Exercise 4. Returns (o, lse) ('the next layer may want to merge more'): a tuple where the lab asks for the
    output tensor."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    k, v = k.contiguous(), v.contiguous()
    for step in range(world):
        owner = (rank - step) % world
        requests = []
        if step < world - 1:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + 1) % world), dist.P2POp(dist.isend, v, (rank + 1) % world),
                dist.P2POp(dist.irecv, next_k, (rank - 1) % world), dist.P2POp(dist.irecv, next_v, (rank - 1) % world)])
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype), lse


# ---------------------------------------------------------------- exercise 5


def st_one_head(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Counts one KV head's K and V ('per head, as the lesson's table'): kv_heads left out of the
    bytes."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)
    nbytes = bytes_per_element * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


def st_ignores_backward(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. The forward's bytes whatever `backward` says (the argument has a default, and the student's
    own trial called it without it)."""
    bytes_per_element = 2 * 2
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


# ---------------------------------------------------------------- correct alternatives


def zigzag_modulo(rank, world_size):
    """Exercise 1, correct: the mirror chunk as (−1 − rank) mod 2W, sorted."""
    return sorted([rank, (-1 - rank) % (2 * world_size)])


def merge_nan_to_num_default(o_a, lse_a, o_b, lse_b):
    """Exercise 3, correct: the shift and the weights' reference through torch.nan_to_num with its default
    (−inf becomes the most negative finite number, so exp of −inf minus it is still 0)."""
    m = torch.nan_to_num(torch.maximum(lse_a, lse_b))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    ref = torch.nan_to_num(lse)
    w_a, w_b = torch.exp(lse_a - ref), torch.exp(lse_b - ref)
    return w_a.unsqueeze(-1) * o_a + w_b.unsqueeze(-1) * o_b, lse


WRONG = {
    "ratio": [wr_zigzag_balance],
    "merge": [mb_in_place, mb_row_axis_2d],
    "ring": [rg_no_wraparound, rg_no_contiguous, rg_returns_lse],
    "step_transfer": [st_one_head, st_ignores_backward],
}
CORRECT = {"zigzag": [zigzag_chunks, zigzag_modulo], "merge": [merge_blocks, merge_nan_to_num_default]}


def _merge_inputs():
    g = torch.Generator().manual_seed(4)
    rows, D = 3, 4
    o_a, o_b = torch.randn(2, rows, D, generator=g).double(), torch.randn(2, rows, D, generator=g).double()
    lse_a = torch.tensor([[300.0, 1.0, float("-inf")], [2.0, float("-inf"), 0.5]], dtype=torch.float64)
    lse_b = torch.tensor([[299.0, float("-inf"), float("-inf")], [-1.0, 3.0, 0.5]], dtype=torch.float64)
    o_a[0, 2] = 0.0
    o_a[1, 1] = 0.0
    o_b[0, 1:] = 0.0
    return o_a, lse_a, o_b, lse_b


def _w_merge(f):
    o_a, lse_a, o_b, lse_b = _merge_inputs()
    try:
        o, lse = f(o_a, lse_a, o_b, lse_b)
    except RuntimeError as exc:
        return f"RuntimeError: {exc}"
    return o.clone(), lse, o_a, o_b


def _ring_child(name, rank, world, port, causal, strided, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(4)
        n, B, Hq, Hkv, D = 3, 1, 4, 2, 8
        q = torch.randn(B, Hq, n * world, D, generator=g).half()
        k, v = (torch.randn(B, n * world, Hkv, D, generator=g).half() for _ in range(2))   # BSNH
        part = slice(rank * n, (rank + 1) * n)
        k_r, v_r = k[:, part].transpose(1, 2), v[:, part].transpose(1, 2)                 # BNSH views
        if not strided:
            k_r, v_r = k_r.contiguous(), v_r.contiguous()
        o = globals()[name](q[:, :, part].contiguous(), k_r, v_r, causal)
        results.put((rank, (o.double().numpy(), str(o.dtype))))
    except Exception as exc:  # reported as a result that differs
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


def _ring_run(f, world, causal, strided):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_ring_child, args=(f.__name__, r, world, port, causal, strided, results))
             for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(world):
            rank, o = results.get(timeout=60)
            got[rank] = o
    except Exception as exc:  # a rank that never reports (a ring that hangs) is a result that differs
        got["timeout"] = type(exc).__name__
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    return [got.get(r, "no result") for r in range(world)]


def _w_ring(f):
    return [_ring_run(f, w, c, False) for w in (2, 3) for c in (True, False)]


def _w_ring_strided(f):
    return [_ring_run(f, w, c, True) for w in (2, 3) for c in (True, False)]


WITNESS = {
    "wr_zigzag_balance": lambda f: [f(w) for w in (2, 3, 4, 8)],
    "mb_in_place": _w_merge, "mb_row_axis_2d": _w_merge,
    "rg_no_wraparound": lambda f: _ring_run(f, 2, False, False), "rg_returns_lse": _w_ring,
    "rg_no_contiguous": _w_ring_strided,
    "st_one_head": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
    "st_ignores_backward": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
}
