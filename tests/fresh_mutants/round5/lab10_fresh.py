"""Round 5 of fresh wrong answers for lab 10 (beyond one GPU), written from the lab's text and its solution only
(the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; a ring's witness runs it on 2 and
3 gloo processes. New classes here: the usual definition of imbalance (max over mean) where the exercise asks
for last over first, a log-sum-exp returned with an extra axis, a ring whose owner is counted one step ahead, a
ring that sends V the other way round (invisible on 2 ranks), and a transfer counted in both directions. The
correct answers probe the other side: a merge normalised by the sum of its weights, and a
double-buffered ring (two pairs of receive buffers used in turn, never the one being sent)."""
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

# ---------------------------------------------------------------- exercise 2


def wr_max_over_mean(world_size):
    """Exercise 2. The imbalance as the busiest rank's work over the mean work ('imbalance is max / mean'):
    (W − 1/2) / (W / 2); the exercise asks for the last rank's work over the first rank's."""
    total = sum(r + 0.5 for r in range(world_size))
    return (world_size - 1 + 0.5) / (total / world_size)


# ---------------------------------------------------------------- exercise 3


def mb_lse_column(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Returns lse[..., None] ('so it lines up with o'): shape [..., rows, 1] where the lab asks for
    [..., rows]."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b
    return o, lse[..., None]


def merge_normalised_sum(o_a, lse_a, o_b, lse_b):
    """Exercise 3, correct: weights e^(lse − m) shifted by the larger lse, the output divided by their sum (1
    where both blocks are empty, so o = 0 there)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    den = w_a + w_b
    o = (w_a[..., None] * o_a + w_b[..., None] * o_b) / torch.where(den > 0, den, torch.ones_like(den))[..., None]
    return o, m + torch.log(den)


# ---------------------------------------------------------------- exercise 4


def rg_owner_of_next_block(q, k, v, causal):
    """Exercise 4. owner = (rank − step − 1) mod W ('after the first transfer the block comes from r − 1'):
    counted one step ahead, so under the causal mask the own chunk is taken for an earlier one (rank 0 even
    skips it as a later one) and another block gets the mask."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    k, v = k.contiguous(), v.contiguous()
    for step in range(world):
        owner = (rank - step - 1) % world
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


def rg_v_other_direction(q, k, v, causal):
    """Exercise 4. V sent to r − 1 and received from r + 1 while K goes to r + 1 ('the two halves of the
    exchange'): on 2 ranks both neighbours are the same rank, on 3 or more a step pairs one rank's K with
    another rank's V."""
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
                dist.P2POp(dist.isend, k, (rank + 1) % world), dist.P2POp(dist.isend, v, (rank - 1) % world),
                dist.P2POp(dist.irecv, next_k, (rank - 1) % world), dist.P2POp(dist.irecv, next_v, (rank + 1) % world)])
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


def ring_double_buffered(q, k, v, causal):
    """Exercise 4, correct: two pairs of receive buffers allocated once and used in turn: step s receives into
    pair s mod 2 while it sends the other (or the input), and every transfer is waited on before the next
    step starts."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    k, v = k.contiguous(), v.contiguous()
    buffers = [(torch.empty_like(k), torch.empty_like(v)) for _ in range(2)]
    for step in range(world):
        owner = (rank - step) % world
        requests = []
        if step < world - 1:
            next_k, next_v = buffers[step % 2]
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


# ---------------------------------------------------------------- exercise 5


def st_send_and_receive(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Counts the step's bytes twice ('each rank sends its K/V and receives its neighbour's'): the
    model's link moves one message each way at once, and the time of a step is that of one message."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)
    nbytes = 2 * bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


WRONG = {
    "ratio": [wr_max_over_mean],
    "merge": [mb_lse_column],
    "ring": [rg_owner_of_next_block, rg_v_other_direction],
    "step_transfer": [st_send_and_receive],
}
CORRECT = {"merge": [merge_blocks, merge_normalised_sum],
           "ring": [ring_forward, ring_double_buffered]}


def _merge_inputs():
    g = torch.Generator().manual_seed(5)
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
    o, lse = f(o_a, lse_a, o_b, lse_b)
    return o, lse


def _ring_child(name, rank, world, port, causal, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(5)
        n, B, Hq, Hkv, D = 3, 1, 4, 2, 8
        q = torch.randn(B, Hq, n * world, D, generator=g).half()
        k, v = (torch.randn(B, Hkv, n * world, D, generator=g).half() for _ in range(2))
        part = slice(rank * n, (rank + 1) * n)
        o = globals()[name](q[:, :, part].contiguous(), k[:, :, part].contiguous(), v[:, :, part].contiguous(), causal)
        results.put((rank, (o.double().numpy(), str(o.dtype))))
    except Exception as exc:  # reported as a result that differs
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


def _ring_run(f, world, causal):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_ring_child, args=(f.__name__, r, world, port, causal, results))
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
    return [_ring_run(f, w, c) for w in (2, 3) for c in (True, False)]


WITNESS = {
    "wr_max_over_mean": lambda f: [f(w) for w in (2, 3, 4, 8)],
    "mb_lse_column": _w_merge,
    "rg_owner_of_next_block": _w_ring, "rg_v_other_direction": lambda f: _ring_run(f, 3, False),
    "st_send_and_receive": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
}
