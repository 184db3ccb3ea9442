"""Fresh wrong answers (and alternative correct answers) for lab 10, written from the student notebook
and the solutions only. Each function's docstring names the exercise it answers and the mistake."""
import math

import torch
import torch.distributed as dist

from attnkit.distributed.context_parallel import block_forward_torch


# ---------------------------------------------------------------- exercise 1: zigzag_chunks
def zigzag_unsorted(rank, world_size):
    """Exercise 1. Returns the late chunk first (not in increasing order)."""
    return [2 * world_size - 1 - rank, rank]


def zigzag_off_by_one(rank, world_size):
    """Exercise 1. Late chunk 2W - r (one past the mirror; rank 0 gets a chunk that does not exist)."""
    return [rank, 2 * world_size - rank]


def zigzag_adjacent_pairs(rank, world_size):
    """Exercise 1. Gives rank r chunks 2r and 2r + 1 (a contiguous split in disguise)."""
    return [2 * rank, 2 * rank + 1]


def zigzag_mirror_of_w(rank, world_size):
    """Exercise 1. Mirrors within W chunks: [r, W - 1 - r] (sorted)."""
    return sorted([rank, world_size - 1 - rank])


# ---------------------------------------------------------------- exercise 2: predicted_work_ratio
def ratio_full_blocks(world_size):
    """Exercise 2. Counts the own chunk as a whole block: W / 1."""
    return float(world_size)


def ratio_twice_w(world_size):
    """Exercise 2. Counts the last rank's own chunk as a whole block but the first rank's as a half: 2W."""
    return world_size / 0.5


def ratio_total_work(world_size):
    """Exercise 2. Total blocks over all ranks divided by the first rank's: W^2 / 2 / 0.5."""
    return world_size * world_size / 2 / 0.5


# ---------------------------------------------------------------- exercise 3: merge_blocks
def merge_no_shift(o_a, lse_a, o_b, lse_b):
    """Exercise 3. lse = log(exp(lse_a) + exp(lse_b)) directly (overflows for lse in the hundreds)."""
    lse = torch.log(torch.exp(lse_a) + torch.exp(lse_b))
    o = torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b
    return o, lse


def merge_max_lse(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Takes lse = max(lse_a, lse_b) (forgets the smaller block's mass)."""
    m = torch.maximum(lse_a, lse_b)
    o = torch.exp(lse_a - m)[..., None] * o_a + torch.exp(lse_b - m)[..., None] * o_b
    return o, m


def merge_no_empty_guard(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Shift by the maximum without a guard: both blocks empty gives NaN."""
    m = torch.maximum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    o = torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b
    return o, lse


def merge_logaddexp_unweighted(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Right lse (torch.logaddexp), but o = (o_a + o_b) / 2."""
    return (o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)


def merge_sigmoid_swapped(o_a, lse_a, o_b, lse_b):
    """Exercise 3. Weight of a computed as sigmoid(lse_b - lse_a) (the two weights swapped)."""
    w_a = torch.sigmoid(lse_b - lse_a)
    return w_a[..., None] * o_a + (1 - w_a)[..., None] * o_b, torch.logaddexp(lse_a, lse_b)


# ---------------------------------------------------------------- exercise 4: ring_forward
def _merge(o_a, lse_a, o_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    o = torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b
    return o, lse


def _ring(q, k, v, causal, *, send_to=1, owner_sign=-1, own_mask="own", skip="later", wait_first=True,
          steps_with_comm=None, init_empty=False, drop_stale=False):
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    if init_empty:
        o = torch.zeros(q.shape, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=o.dtype)
    k, v = k.contiguous(), v.contiguous()
    comm_steps = world - 1 if steps_with_comm is None else steps_with_comm
    for step in range(world):
        owner = (rank + owner_sign * step) % world
        requests = []
        if step < comm_steps:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            requests = dist.batch_isend_irecv([
                dist.P2POp(dist.isend, k, (rank + send_to) % world),
                dist.P2POp(dist.isend, v, (rank + send_to) % world),
                dist.P2POp(dist.irecv, next_k, (rank - send_to) % world),
                dist.P2POp(dist.irecv, next_v, (rank - send_to) % world)])
        if not wait_first and requests:
            k_use, v_use = next_k, next_v        # computes on the buffers being received
        else:
            k_use, v_use = k, v
        skipped = causal and ((owner > rank) if skip == "later" else (owner < rank))
        if not skipped:
            block_causal = causal and (owner == rank if own_mask == "own" else True)
            o_b, lse_b = block_forward_torch(q, k_use, v_use, block_causal, scale)
            if o is None:
                o, lse = o_b, lse_b
            else:
                o, lse = _merge(o.to(o_b.dtype), lse.to(lse_b.dtype), o_b, lse_b)
        if drop_stale:
            del k_use, v_use                     # no name keeps this block once the next step is posted
        for request in requests:
            request.wait()
        if requests:
            k, v = next_k, next_v
    return o.to(q.dtype)


def ring_wrong_direction(q, k, v, causal):
    """Exercise 4. Sends to r - 1 and receives from r + 1, but still takes the owner as (r - s) mod W."""
    return _ring(q, k, v, causal, send_to=-1)


def ring_mask_every_block(q, k, v, causal):
    """Exercise 4. Applies the causal mask inside every block, not only the own chunk's."""
    return _ring(q, k, v, causal, own_mask="all")


def ring_skips_earlier(q, k, v, causal):
    """Exercise 4. Under the causal mask skips the blocks of EARLIER chunks instead of later ones."""
    return _ring(q, k, v, causal, skip="earlier")


def ring_computes_on_incoming(q, k, v, causal):
    """Exercise 4. Computes each step's block on the receive buffers before waiting (a race)."""
    return _ring(q, k, v, causal, wait_first=False)


def ring_extra_round(q, k, v, causal):
    """Exercise 4. Communicates on every step, the last one too (W blocks received instead of W - 1)."""
    return _ring(q, k, v, causal, steps_with_comm=dist.get_world_size())


def ring_broadcast(q, k, v, causal):
    """Exercise 4. Replaces the ring by W broadcasts (a collective the lab forbids)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    o = lse = None
    for src in range(world):
        kb = k.contiguous().clone() if src == rank else torch.empty_like(k.contiguous())
        vb = v.contiguous().clone() if src == rank else torch.empty_like(v.contiguous())
        dist.broadcast(kb, src)
        dist.broadcast(vb, src)
        if causal and src > rank:
            continue
        o_b, lse_b = block_forward_torch(q, kb, vb, causal and src == rank, scale)
        o, lse = (o_b, lse_b) if o is None else _merge(o, lse, o_b, lse_b)
    return o.to(q.dtype)


def ring_keeps_every_block(q, k, v, causal):
    """Exercise 4. Correct ring, but keeps every block received in a list and attends once at the end."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = 1 / math.sqrt(q.shape[-1])
    k, v = k.contiguous(), v.contiguous()
    blocks = [(rank, k, v)]
    for step in range(world - 1):
        next_k, next_v = torch.empty_like(k), torch.empty_like(v)
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, k, (rank + 1) % world), dist.P2POp(dist.isend, v, (rank + 1) % world),
            dist.P2POp(dist.irecv, next_k, (rank - 1) % world), dist.P2POp(dist.irecv, next_v, (rank - 1) % world)])
        for r in reqs:
            r.wait()
        k, v = next_k, next_v
        blocks.append(((rank - step - 1) % world, k, v))
    o = lse = None
    for owner, kb, vb in blocks:
        if causal and owner > rank:
            continue
        o_b, lse_b = block_forward_torch(q, kb, vb, causal and owner == rank, scale)
        o, lse = (o_b, lse_b) if o is None else _merge(o, lse, o_b, lse_b)
    return o.to(q.dtype)


# ---------------------------------------------------------------- correct alternatives
def correct_zigzag(rank, world_size):
    """Exercise 1, correct: sorted pair."""
    return sorted((2 * world_size - 1 - rank, rank))


def correct_ratio(world_size):
    """Exercise 2, correct: (W - 1 full blocks + a half) / a half = 2W - 1."""
    return 2 * world_size - 1


def correct_merge_logaddexp(o_a, lse_a, o_b, lse_b):
    """Exercise 3, correct: torch.logaddexp, weights exp(lse_x - lse) with empty rows kept at 0."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w_a = torch.exp(lse_a - safe)
    w_b = torch.exp(lse_b - safe)
    return w_a[..., None] * o_a + w_b[..., None] * o_b, lse


def correct_ring_empty_start(q, k, v, causal):
    """Exercise 4, correct: starts from the empty state (o = 0, lse = -inf) and merges every block."""
    return _ring(q, k, v, causal, init_empty=True)


def correct_ring_empty_start_no_stale(q, k, v, causal):
    """Exercise 4, correct: as correct_ring_empty_start, and no local name keeps the block just used
    (correct_ring_empty_start's k_use still refers to it when the next step is posted)."""
    return _ring(q, k, v, causal, init_empty=True, drop_stale=True)


WRONG = {
    "zigzag": [zigzag_unsorted, zigzag_off_by_one, zigzag_adjacent_pairs, zigzag_mirror_of_w],
    "ratio": [ratio_full_blocks, ratio_twice_w, ratio_total_work],
    "merge": [merge_no_shift, merge_max_lse, merge_no_empty_guard, merge_logaddexp_unweighted, merge_sigmoid_swapped],
    "ring": [ring_wrong_direction, ring_mask_every_block, ring_skips_earlier, ring_computes_on_incoming,
             ring_extra_round, ring_broadcast, ring_keeps_every_block],
}
CORRECT = {
    "zigzag": [correct_zigzag],
    "ratio": [correct_ratio],
    "merge": [correct_merge_logaddexp],
    "ring": [correct_ring_empty_start, correct_ring_empty_start_no_stale],
}


# ---------------------------------------------------------------- exercise 5: step_transfer_us
# (written from the solution notebook after the exercise was added, before reading its check)
def transfer_grads_in_bf16(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Backward: dK and dV counted in bf16 (2 bytes) instead of float32."""
    per = 2 * 2 + (2 * 2 if backward else 0)
    return alpha_us + per * kv_heads * tokens_per_rank * head_dim / (beta_gb_per_s * 1e9) * 1e6


def transfer_backward_grads_only(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Backward moves only dK and dV (forgets that K and V travel again)."""
    per = 2 * 4 if backward else 2 * 2
    return alpha_us + per * kv_heads * tokens_per_rank * head_dim / (beta_gb_per_s * 1e9) * 1e6


def transfer_two_alphas(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Backward pays alpha twice (K/V and dK/dV as two messages), against the lab's model."""
    per = 2 * 2 + (2 * 4 if backward else 0)
    return alpha_us * (2 if backward else 1) + per * kv_heads * tokens_per_rank * head_dim / (beta_gb_per_s * 1e9) * 1e6


def transfer_k_only(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Counts K but not V (and dK but not dV)."""
    per = 2 + (4 if backward else 0)
    return alpha_us + per * kv_heads * tokens_per_rank * head_dim / (beta_gb_per_s * 1e9) * 1e6


def transfer_elements_not_bytes(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Divides the number of elements (not bytes) by the bandwidth."""
    per = 2 + (2 if backward else 0)
    return alpha_us + per * kv_heads * tokens_per_rank * head_dim / (beta_gb_per_s * 1e9) * 1e6


def transfer_ms(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5. Converts the bandwidth term to milliseconds but adds alpha in microseconds."""
    per = 2 * 2 + (2 * 4 if backward else 0)
    return alpha_us + per * kv_heads * tokens_per_rank * head_dim / (beta_gb_per_s * 1e9) * 1e3


def correct_transfer_bytes_per_us(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward=False):
    """Exercise 5, correct: beta as bytes per microsecond (1 GB/s = 1000 bytes/us)."""
    elements = kv_heads * tokens_per_rank * head_dim
    nbytes = elements * (2 + 2) + (elements * (4 + 4) if backward else 0)
    return alpha_us + nbytes / (beta_gb_per_s * 1e3)


WRONG["step_transfer"] = [transfer_grads_in_bf16, transfer_backward_grads_only, transfer_two_alphas, transfer_k_only,
                          transfer_elements_not_bytes, transfer_ms]
CORRECT["step_transfer"] = [correct_transfer_bytes_per_us]
