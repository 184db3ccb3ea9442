"""Round 3 of fresh wrong answers for lab 10 (beyond one GPU), written from the lab's text and its solution only
(the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; a ring's witness runs it on 2 and
3 gloo processes."""
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

# ---------------------------------------------------------------- exercise 1


def zz_tuple(rank, world_size):
    """Exercise 1. Returns a tuple (rank, 2W − 1 − rank) where the lab asks for a list."""
    return (rank, 2 * world_size - 1 - rank)


# ---------------------------------------------------------------- exercise 2


def wr_inverted(world_size):
    """Exercise 2. The first rank's work over the last rank's: 1/(2W − 1), the inverse of the ratio asked."""
    return 0.5 / (world_size - 1 + 0.5)


# ---------------------------------------------------------------- exercise 3


def mb_logaddexp2(o_a, lse_a, o_b, lse_b):
    """Exercise 3. torch.logaddexp2 and exp2 (base 2) on natural-log log-sum-exps."""
    lse = torch.logaddexp2(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp2(lse_a - safe)[..., None] * o_a + torch.exp2(lse_b - safe)[..., None] * o_b
    return o, lse


def mb_float32_internal(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Converts everything to float32 'to save memory' and returns float32 for float64 inputs."""
    o_a, lse_a, o_b, lse_b = o_a.float(), lse_a.float(), o_b.float(), lse_b.float()
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b
    return o, lse


# ---------------------------------------------------------------- exercise 4


def rg_no_dtype_cast(q, k, v, causal):
    """Exercise 4. Returns the merged output as it is (float32 after the merges) instead of in q's dtype."""
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
    return o


def rg_scale_by_tokens(q, k, v, causal):
    """Exercise 4. scale = 1/sqrt(q.shape[-2]): the number of tokens per rank in place of the head dim."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-2])
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


def rg_loop_world_minus_one(q, k, v, causal):
    """Exercise 4. range(world - 1) steps ('W − 1 transfers'): the block received at the last transfer is never
    computed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    k, v = k.contiguous(), v.contiguous()
    for step in range(world - 1):
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


# ---------------------------------------------------------------- exercise 5


def st_whole_microseconds(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Rounds the time to whole microseconds."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return round(alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6)


def st_backward_all_fp32(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Backward: K and V counted in float32 too (4 bytes each, as the gradients)."""
    bytes_per_element = 2 * 2 if not backward else 4 * 4
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


# ---------------------------------------------------------------- correct alternatives


def merge_nan_to_num(o_a, lse_a, o_b, lse_b):
    """Exercise 3, correct: the shifted formula without a guard, then the NaN of rows empty in both blocks
    replaced: o by 0 and lse by −inf."""
    m = torch.maximum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    o = torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b
    return torch.nan_to_num(o, nan=0.0), torch.nan_to_num(lse, nan=-math.inf)


WRONG = {
    "zigzag": [zz_tuple],
    "ratio": [wr_inverted],
    "merge": [mb_logaddexp2, mb_float32_internal],
    "ring": [rg_no_dtype_cast, rg_scale_by_tokens, rg_loop_world_minus_one],
    "step_transfer": [st_whole_microseconds, st_backward_all_fp32],
}
CORRECT = {"merge": [merge_blocks, merge_nan_to_num]}


def _w_merge(f):
    g = torch.Generator().manual_seed(3)
    rows, D = 3, 4
    o_a, o_b = torch.randn(2, rows, D, generator=g).double(), torch.randn(2, rows, D, generator=g).double()
    lse_a = torch.tensor([[300.0, 1.0, float("-inf")], [2.0, float("-inf"), 0.5]], dtype=torch.float64)
    lse_b = torch.tensor([[299.0, float("-inf"), float("-inf")], [-1.0, 3.0, 0.5]], dtype=torch.float64)
    o_a[0, 2] = 0.0
    o_a[1, 1] = 0.0
    o_b[0, 1:] = 0.0
    o, lse = f(o_a, lse_a, o_b, lse_b)
    return o, lse, str(o.dtype), str(lse.dtype)


def _ring_child(name, rank, world, port, causal, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(3)
        n, B, Hq, Hkv, D = 3, 1, 4, 2, 8
        q, k, v = (torch.randn(B, h, n * world, D, generator=g).half() for h in (Hq, Hkv, Hkv))
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
    procs = [ctx.Process(target=_ring_child, args=(f.__name__, r, world, port, causal, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(world):
            rank, o = results.get(timeout=60)
            got[rank] = o
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
    return [got.get(r, "no result") for r in range(world)]


def _w_ring(f):
    return [_ring_run(f, w, c) for w in (2, 3) for c in (True, False)]


WITNESS = {
    "zz_tuple": lambda f: [(list(f(r, w)), type(f(r, w)).__name__) for w in (1, 2, 3, 4) for r in range(w)],
    "wr_inverted": lambda f: [f(w) for w in (2, 3, 4, 8)],
    "mb_logaddexp2": _w_merge, "mb_float32_internal": _w_merge,
    "rg_no_dtype_cast": _w_ring, "rg_scale_by_tokens": _w_ring, "rg_loop_world_minus_one": _w_ring,
    "st_whole_microseconds": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
    "st_backward_all_fp32": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
}
