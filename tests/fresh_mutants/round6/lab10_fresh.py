# ruff: noqa: E501
"""Round 6 of fresh wrong answers for lab 10 (beyond one GPU), written from the lab's text and its solution only
(the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in round 5; a ring's witness runs it on 2 and 3
gloo processes. New classes here: adjacent chunks for the zig-zag pair, the ratio inverted or with the
triangle counted as a whole block, a merge through logaddexp without the empty-row guard, a merge that
rescales o_a in place, a merge computed in float32, one shift for every row, a ring turned the other way
(invisible on 2 ranks and without a mask), a ring that returns float32, a ring that sends the caller's strided
views, a backward step that moves only the gradients or moves them in bf16, a time in whole microseconds and
beta read as GiB/s. The correct answers: a merge through logaddexp with the guard, a ring that waits for the
transfer before it computes, and the time with beta converted to bytes per microsecond."""
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


def zz_adjacent_pair(rank, world_size):
    """Exercise 1. Rank r given chunks 2r and 2r + 1 ('two chunks each, in order'): a contiguous split in 2W
    chunks, not an early and a late one."""
    return [2 * rank, 2 * rank + 1]


# ---------------------------------------------------------------- exercise 2


def wr_first_over_last(world_size):
    """Exercise 2. The ratio written first rank over last ('how much the first rank does'): 1 / (2W − 1)."""
    return 0.5 / (world_size - 1 + 0.5)


def wr_triangle_as_whole_block(world_size):
    """Exercise 2. The diagonal block counted as a whole block ('one block each step'): W / 1, where the lab
    counts the triangle as the half block it is."""
    return (world_size - 1 + 1) / 1


# ---------------------------------------------------------------- exercise 3


def mb_logaddexp_unguarded(o_a, lse_a, o_b, lse_b):
    """Exercise 3. lse = torch.logaddexp(lse_a, lse_b) ('stable by construction'), o weighted by exp(lse_x − lse)
    without a guard: a row empty in both blocks gets exp(−inf − (−inf)) = NaN where the lab wants o = 0."""
    lse = torch.logaddexp(lse_a, lse_b)
    o = torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b
    return o, lse


def mb_scales_o_a_in_place(o_a, lse_a, o_b, lse_b):
    """Exercise 3. o_a rescaled in place, o_a.mul_(w_a) ('save a tensor'): the result is right, the caller's
    o_a is changed."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = o_a.mul_(torch.exp(lse_a - safe)[..., None]) + torch.exp(lse_b - safe)[..., None] * o_b
    return o, lse


def mb_float32(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Everything cast to float32 first ('GPUs merge in fp32'): float64 inputs come back float32,
    with float32's rounding."""
    o_a, lse_a, o_b, lse_b = o_a.float(), lse_a.float(), o_b.float(), lse_b.float()
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b
    return o, lse


def mb_one_shift_for_all(o_a, lse_a, o_b, lse_b):
    """Exercise 3. One shift, the largest finite lse of both blocks ('the maximum'), for every row: a row whose
    lse lies 800 below another row's underflows to log(0) = −inf and o = 0."""
    both = torch.cat([lse_a.flatten(), lse_b.flatten()])
    m = both[torch.isfinite(both)].max()
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b
    return o, lse


# ---------------------------------------------------------------- exercise 4


def rg_ring_reversed(q, k, v, causal):
    """Exercise 4. K/V sent to rank r − 1 and received from r + 1 ('either way round'), the owner still (r − s) mod W: the blocks arrive in the other order, so under a causal mask the wrong ones are skipped (the same ring on 2 ranks)."""
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
                dist.P2POp(dist.isend, k, (rank - 1) % world), dist.P2POp(dist.isend, v, (rank - 1) % world),
                dist.P2POp(dist.irecv, next_k, (rank + 1) % world), dist.P2POp(dist.irecv, next_v, (rank + 1) % world)])
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


def rg_dtype_not_restored(q, k, v, causal):
    """Exercise 4. The merged output returned as it comes ('o is the output'): float32 from the block kernel, where the lab asks for q's dtype."""
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


def rg_sends_strided_view(q, k, v, causal):
    """Exercise 4. k and v sent as given, without .contiguous() ('they are already tensors'): the caller's strided views, which gloo does not send."""
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


# ---------------------------------------------------------------- exercise 5


def st_backward_grads_only(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. A backward step counted as dK and dV alone ('the backward sends gradients'): the lab's step
    moves K and V again as well."""
    bytes_per_element = 2 * 4 if backward else 2 * 2
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


def st_grads_bf16(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. dK and dV counted in bf16 like K and V ('all tensors are bf16'): the lab accumulates them in
    float32, 4 bytes."""
    bytes_per_element = 2 * 2 + (2 * 2 if backward else 0)
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


def st_whole_microseconds(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. The time rounded to whole microseconds ('µs are the unit'): 44.5 + 0.7 becomes 45, 0.4% off
    and more on small messages."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return round(alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6)


def st_beta_gib(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. beta read as GiB/s, 2**30 bytes ('GB means 2^30'): the lab's GB/s are 10^9 bytes, 7% apart."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 2**30) * 1e6


# ---------------------------------------------------------------- correct alternatives


def merge_logaddexp_guarded(o_a, lse_a, o_b, lse_b):
    """Exercise 3, correct: lse by torch.logaddexp, the weights taken against a finite stand-in where both
    blocks are empty (o = 0 there)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b, lse


def ring_wait_first(q, k, v, causal):
    """Exercise 4, correct: the transfer waited for before the block is computed (no overlap, the same blocks; the received K/V is used only at the next step)."""
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
        for request in requests:
            request.wait()
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


def step_transfer_bytes_per_us(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5, correct: beta converted to bytes per microsecond (1 GB/s = 1000 bytes/µs)."""
    per_token = kv_heads * head_dim * (2 * 2 + (2 * 4 if backward else 0))
    return alpha_us + tokens_per_rank * per_token / (beta_gb_per_s * 1e3)


WRONG = {
    "zigzag": [zz_adjacent_pair],
    "ratio": [wr_first_over_last, wr_triangle_as_whole_block],
    "merge": [mb_logaddexp_unguarded, mb_scales_o_a_in_place, mb_float32, mb_one_shift_for_all],
    "ring": [rg_ring_reversed, rg_dtype_not_restored, rg_sends_strided_view],
    "step_transfer": [st_backward_grads_only, st_grads_bf16, st_whole_microseconds, st_beta_gib],
}
CORRECT = {"merge": [merge_blocks, merge_logaddexp_guarded], "ring": [ring_forward, ring_wait_first],
           "step_transfer": [step_transfer_us, step_transfer_bytes_per_us]}


def _merge_inputs():
    g = torch.Generator().manual_seed(6)
    rows, D = 3, 4
    o_a, o_b = torch.randn(2, rows, D, generator=g).double(), torch.randn(2, rows, D, generator=g).double()
    lse_a = torch.tensor([[300.0, 1.0, float("-inf")], [-500.0, float("-inf"), 0.5]], dtype=torch.float64)
    lse_b = torch.tensor([[299.0, float("-inf"), float("-inf")], [-501.0, 3.0, 0.5]], dtype=torch.float64)
    o_a[0, 2] = 0.0
    o_a[1, 1] = 0.0
    o_b[0, 1:] = 0.0
    return o_a, lse_a, o_b, lse_b


def _w_merge(f):
    o_a, lse_a, o_b, lse_b = _merge_inputs()
    o_a0 = o_a.clone()
    o, lse = f(o_a, lse_a, o_b, lse_b)
    return [o, lse, str(o.dtype), o_a - o_a0]


def _ring_child(name, rank, world, port, causal, results, strided=False):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(6)
        n, B, Hq, Hkv, D = 3, 1, 4, 2, 8
        q = torch.randn(B, Hq, n * world, D, generator=g).half()
        k, v = (torch.randn(B, Hkv, n * world, D, generator=g).half() for _ in range(2))
        part = slice(rank * n, (rank + 1) * n)
        q_r, k_r, v_r = q[:, :, part].contiguous(), k[:, :, part].contiguous(), v[:, :, part].contiguous()
        if strided:      # [B, n, H, D] caches seen as [B, H, n, D]
            k_r, v_r = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k_r, v_r))
        o = globals()[name](q_r, k_r, v_r, causal)
        results.put((rank, (o.double().numpy(), str(o.dtype))))
    except Exception as exc:  # reported as a result that differs
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


def _ring_run(f, world, causal, strided=False):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_ring_child, args=(f.__name__, r, world, port, causal, results, strided))
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


WITNESS = {
    "zz_adjacent_pair": lambda f: [f(r, w) for w in (1, 2, 3, 4) for r in range(w)],
    "wr_first_over_last": lambda f: [f(w) for w in (2, 3, 4, 8)],
    "wr_triangle_as_whole_block": lambda f: [f(w) for w in (2, 3, 4, 8)],
    "mb_logaddexp_unguarded": _w_merge, "mb_scales_o_a_in_place": _w_merge, "mb_float32": _w_merge,
    "mb_one_shift_for_all": _w_merge,
    "rg_ring_reversed": lambda f: _ring_run(f, 3, True),
    "rg_dtype_not_restored": lambda f: _ring_run(f, 2, False),
    "rg_sends_strided_view": lambda f: _ring_run(f, 2, False, strided=True),
    "st_backward_grads_only": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
    "st_grads_bf16": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
    "st_whole_microseconds": lambda f: [f(1024, 8, 128, 44.5, 374.0, b) for b in (False, True)],
    "st_beta_gib": lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)],
}
