# ruff: noqa: E501, B007, F841
"""Round 2 of fresh wrong answers for lab 10 (beyond one GPU), written from the lab's text and its
solution only. Each wrong answer is the solution with one student's edit (its docstring says which).
WRONG / CORRECT / WITNESS as in lab01_fresh.py; a ring's witness runs it on 2 and 3 gloo processes."""
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


# zigzag: zz_decreasing
def zz_decreasing(rank, world_size):
    """Late chunk first."""
    return [2 * world_size - 1 - rank, rank]


# zigzag: zz_off_by_one
def zz_off_by_one(rank, world_size):
    """Mirror chunk 2W − r."""
    return [rank, 2 * world_size - rank]


# zigzag: zz_mirror_in_w
def zz_mirror_in_w(rank, world_size):
    """Mirror inside W chunks: W − 1 − r."""
    return sorted([rank, world_size - 1 - rank])


# zigzag: zz_neighbours
def zz_neighbours(rank, world_size):
    """Two adjacent chunks 2r, 2r + 1."""
    return [2 * rank, 2 * rank + 1]


# ratio: wr_own_chunk_full
def wr_own_chunk_full(world_size):
    """Own chunk counted as a whole block: W / 1."""
    return world_size / 1


# ratio: wr_w_blocks
def wr_w_blocks(world_size):
    """Last rank counted as W full blocks plus its triangle."""
    return (world_size + 0.5) / 0.5


# ratio: wr_first_rank_full
def wr_first_rank_full(world_size):
    """First rank's triangle counted as 1."""
    return (world_size - 1 + 0.5) / 1


# ratio: wr_quadratic
def wr_quadratic(world_size):
    """Work grows with the square of W."""
    return world_size ** 2


# merge: mb_no_empty_guard
def mb_no_empty_guard(o_a, lse_a, o_b, lse_b):
    """No guard for rows empty in both blocks (−inf − −inf = NaN)."""
    m = torch.maximum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))  # −inf where both are empty
    safe = lse
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b  # 0 there
    return o, lse


# merge: mb_unshifted_exp
def mb_unshifted_exp(o_a, lse_a, o_b, lse_b):
    """lse = log(exp(a) + exp(b)) without a shift."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))  # −inf where both are empty
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b  # 0 there
    return o, lse


# merge: mb_weights_no_row_axis
def mb_weights_no_row_axis(o_a, lse_a, o_b, lse_b):
    """Weights without [..., None] (broadcast along D)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))  # −inf where both are empty
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe) * o_a + torch.exp(lse_b - safe) * o_b  # 0 there
    return o, lse


# merge: mb_average
def mb_average(o_a, lse_a, o_b, lse_b):
    """o = (o_a + o_b) / 2."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))  # −inf where both are empty
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = (o_a + o_b) / 2  # 0 there
    return o, lse


# merge: mb_weights_from_max
def mb_weights_from_max(o_a, lse_a, o_b, lse_b):
    """Weights exp(lse − max) (not normalised)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))  # −inf where both are empty
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - m)[..., None] * o_a + torch.exp(lse_b - m)[..., None] * o_b  # 0 there
    return o, lse


# merge: mb_lse_is_max
def mb_lse_is_max(o_a, lse_a, o_b, lse_b):
    """lse = max(lse_a, lse_b)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = torch.maximum(lse_a, lse_b)  # −inf where both are empty
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b  # 0 there
    return o, lse


# merge: mb_logaddexp_unguarded
def mb_logaddexp_unguarded(o_a, lse_a, o_b, lse_b):
    """torch.logaddexp, then weights exp(lse_a − lse) (NaN where both are empty)."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = torch.logaddexp(lse_a, lse_b)  # −inf where both are empty
    safe = lse
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b  # 0 there
    return o, lse


# ring: rg_reverse_direction
def rg_reverse_direction(q, k, v, causal):
    """Sends to r − 1, receives from r + 1 (owner still counted as r − s)."""
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


# ring: rg_no_causal_skip
def rg_no_causal_skip(q, k, v, causal):
    """Later chunks not skipped under the causal mask."""
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
        if True:
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


# ring: rg_mask_every_block
def rg_mask_every_block(q, k, v, causal):
    """Causal mask applied to every block."""
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
            o_b, lse_b = block_forward_torch(q, k, v, causal, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


# ring: rg_owner_plus_step
def rg_owner_plus_step(q, k, v, causal):
    """Owner counted as (r + s) mod W."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    k, v = k.contiguous(), v.contiguous()
    for step in range(world):
        owner = (rank + step) % world
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


# ring: rg_unscaled
def rg_unscaled(q, k, v, causal):
    """Scale 1."""
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
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, 1.0)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


# ring: rg_zero_initial_state
def rg_zero_initial_state(q, k, v, causal):
    """Started from o = 0, lse = 0 (a fake block of weight 1)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.zeros(q.shape[:-1], dtype=torch.float64)
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
            o, lse = merge_blocks(o.to(o_b.dtype), lse.to(lse_b.dtype), o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


# ring: rg_diagonal_at_rank_zero
def rg_diagonal_at_rank_zero(q, k, v, causal):
    """Mask applied to the block of chunk 0 instead of this rank's own."""
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
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == 0, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


# step_transfer: st_gib
def st_gib(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """GB/s read as GiB/s."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 2**30) * 1e6


# step_transfer: st_fp16_grads
def st_fp16_grads(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Gradients counted in 2 bytes."""
    bytes_per_element = 2 * 2 + (2 * 2 if backward else 0)      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


# step_transfer: st_no_alpha
def st_no_alpha(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Forgot α."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return nbytes / (beta_gb_per_s * 1e9) * 1e6


# step_transfer: st_seconds
def st_seconds(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Returned seconds."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us * 1e-6 + nbytes / (beta_gb_per_s * 1e9)


# step_transfer: st_k_only
def st_k_only(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Counted K, not V."""
    bytes_per_element = 2 + (4 if backward else 0)      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


# step_transfer: st_backward_grads_only
def st_backward_grads_only(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Backward moves only dK and dV."""
    bytes_per_element = 2 * 4 if backward else 2 * 2      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + nbytes / (beta_gb_per_s * 1e9) * 1e6


# step_transfer: st_bits
def st_bits(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """β read as Gbit/s."""
    bytes_per_element = 2 * 2 + (2 * 4 if backward else 0)      # K, V in bf16; dK, dV in float32
    nbytes = bytes_per_element * kv_heads * tokens_per_rank * head_dim
    return alpha_us + 8 * nbytes / (beta_gb_per_s * 1e9) * 1e6


# ring: rg_skips_own_block
def rg_skips_own_block(q, k, v, causal):
    """Causal: skips owner >= rank (its own chunk too)."""
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
        if not (causal and owner >= rank):
            o_b, lse_b = block_forward_torch(q, k, v, causal and owner == rank, scale)
            o, lse = (o_b, lse_b) if o is None else merge_blocks(o, lse, o_b, lse_b)
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


# ring: rg_gqa_tiled_heads
def rg_gqa_tiled_heads(q, k, v, causal):
    """Expanded K/V heads with repeat (tiles) instead of repeat_interleave."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, g, 1, 1).contiguous(), v.repeat(1, g, 1, 1).contiguous()
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


# merge: mb_clamped_neg_inf
def mb_clamped_neg_inf(o_a, lse_a, o_b, lse_b):
    """−inf clamped to −1e4 (an empty row gets a finite lse)."""
    lse_a, lse_b = lse_a.clamp(min=-1e4), lse_b.clamp(min=-1e4)
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))        # both empty: shift by 0, not −inf
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))  # −inf where both are empty
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    o = torch.exp(lse_a - safe)[..., None] * o_a + torch.exp(lse_b - safe)[..., None] * o_b  # 0 there
    return o, lse


WRONG = {
    "zigzag": [zz_decreasing, zz_off_by_one, zz_mirror_in_w, zz_neighbours],
    "ratio": [wr_own_chunk_full, wr_w_blocks, wr_first_rank_full, wr_quadratic],
    "merge": [mb_no_empty_guard, mb_unshifted_exp, mb_weights_no_row_axis, mb_average, mb_weights_from_max, mb_lse_is_max, mb_logaddexp_unguarded, mb_clamped_neg_inf],
    "ring": [rg_reverse_direction, rg_no_causal_skip, rg_mask_every_block, rg_owner_plus_step, rg_unscaled, rg_zero_initial_state, rg_diagonal_at_rank_zero, rg_skips_own_block, rg_gqa_tiled_heads],
    "step_transfer": [st_gib, st_fp16_grads, st_no_alpha, st_seconds, st_k_only, st_backward_grads_only, st_bits],
}
SOLUTION = {"zigzag": zigzag_chunks, "ratio": predicted_work_ratio, "merge": merge_blocks, "ring": ring_forward,
            "step_transfer": step_transfer_us}
CORRECT = {k: [v] for k, v in SOLUTION.items()}


def _w_merge(f, D=4):
    g = torch.Generator().manual_seed(0)
    rows = 3
    o_a, o_b = torch.randn(2, rows, D, generator=g), torch.randn(2, rows, D, generator=g)
    lse_a = torch.tensor([[300.0, 1.0, float("-inf")], [2.0, float("-inf"), 0.5]])
    lse_b = torch.tensor([[299.0, float("-inf"), float("-inf")], [-1.0, 3.0, 0.5]])
    o_a[0, 2] = 0.0
    o_a[1, 1] = 0.0
    o_b[0, 1:] = 0.0
    return f(o_a, lse_a, o_b, lse_b)


def _ring_child(name, rank, world, port, causal, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(0)
        n, B, Hq, Hkv, D = 3, 1, 4, 2, 8
        q = torch.randn(B, Hq, n * world, D, generator=g, dtype=torch.float64)
        k = torch.randn(B, Hkv, n * world, D, generator=g, dtype=torch.float64)
        v = torch.randn(B, Hkv, n * world, D, generator=g, dtype=torch.float64)
        part = slice(rank * n, (rank + 1) * n)
        o = globals()[name](q[:, :, part].contiguous(), k[:, :, part].contiguous(), v[:, :, part].contiguous(), causal)
        results.put((rank, o.double().numpy()))
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
    **{n.__name__: (lambda f: [f(r, w) for w in (1, 2, 3, 4) for r in range(w)]) for n in WRONG["zigzag"]},
    **{n.__name__: (lambda f: [f(w) for w in (2, 3, 4, 8)]) for n in WRONG["ratio"]},
    **{n.__name__: _w_merge for n in WRONG["merge"]},
    "mb_weights_no_row_axis": lambda f: _w_merge(f, D=3),
    **{n.__name__: _w_ring for n in WRONG["ring"]},
    **{n.__name__: (lambda f: [f(16384, 8, 128, 44.5, 374.0, b) for b in (False, True)]) for n in WRONG["step_transfer"]},
}
