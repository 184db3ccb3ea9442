"""Round 5 of fresh wrong answers for lab 02 (why attention is IO-bound), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New classes
here: an argument ignored (itemsize fixed at 2), the padding of the last key tile counted, the new token
counted in the context, q and o counted for one sequence of the batch, NumPy scalars where the lab asks for a
bool, a bound from the memory side only, microseconds for milliseconds, a causal half of S."""
import functools
import math

import numpy as np

from attnkit.bench import iomodel

H100 = iomodel.GPUS["H100 SXM"]

# ---------------------------------------------------------------- the solution


def matmul_cost(batch, m, n, k, itemsize):
    flops = batch * 2 * m * n * k
    nbytes = batch * itemsize * (m * k + k * n + m * n)
    return flops, nbytes


def flash_forward_cost(batch, heads, n_q, n_k, d, block_q, itemsize):
    tiles = math.ceil(n_q / block_q)
    flops = 4 * batch * heads * n_q * n_k * d
    per_head = 2 * n_q * d + tiles * 2 * n_k * d
    return flops, batch * heads * itemsize * per_head


def decode_cost(batch, q_heads, kv_heads, context, d, itemsize):
    flops = batch * q_heads * (2 * context * d + 2 * context * d)
    q_and_o = 2 * q_heads * d
    cache = 2 * kv_heads * context * d
    return flops, batch * itemsize * (q_and_o + cache)


def roofline(flops, nbytes, gpu):
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity < peak / bandwidth


def predicted_qk_ms(n):
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return seconds * 1e3


SOLUTION = {"matmul_cost": matmul_cost, "flash_forward_cost": flash_forward_cost, "decode_cost": decode_cost,
            "roofline": roofline, "prediction": predicted_qk_ms}

# ---------------------------------------------------------------- exercise 1


def mm_itemsize_fixed(batch, m, n, k, itemsize):
    """Exercise 1. Bytes with 2 per element written in ('attention runs in fp16'): the itemsize argument is
    ignored, so fp32 and 8-bit products are counted as fp16."""
    flops = batch * 2 * m * n * k
    nbytes = batch * 2 * (m * k + k * n + m * n)
    return flops, nbytes


# ---------------------------------------------------------------- exercise 2


def ff_padded_key_tiles(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. K and V read in whole tiles of block_q keys ('the kernel loads full tiles'): the masked
    keys of the last key tile are counted, ceil(n_k / block_q) · block_q rows instead of n_k."""
    tiles = math.ceil(n_q / block_q)
    flops = 4 * batch * heads * n_q * n_k * d
    keys = math.ceil(n_k / block_q) * block_q
    per_head = 2 * n_q * d + tiles * 2 * keys * d
    return flops, batch * heads * itemsize * per_head


# ---------------------------------------------------------------- exercise 3


def dc_context_plus_new_token(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. Attends to context + 1 tokens ('the new token sees itself too'): the FLOPs and the cache
    reads count one token more than the context the exercise gives."""
    n = context + 1
    flops = batch * q_heads * (2 * n * d + 2 * n * d)
    q_and_o = 2 * q_heads * d
    cache = 2 * kv_heads * n * d
    return flops, batch * itemsize * (q_and_o + cache)


def dc_q_o_once(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. The batch applied to the cache only ('one query, one output'): q and o counted for one
    sequence whatever the batch."""
    flops = batch * q_heads * (2 * context * d + 2 * context * d)
    q_and_o = 2 * q_heads * d
    cache = 2 * kv_heads * context * d
    return flops, itemsize * (q_and_o + batch * cache)


# ---------------------------------------------------------------- exercise 4


def rf_numpy_scalars(flops, nbytes, gpu):
    """Exercise 4. The intensity from np.divide ('NumPy is safer with big numbers'): every number returned is
    a NumPy scalar and memory_bound is np.bool_, where the lab asks for a bool."""
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = np.divide(flops, nbytes)
    seconds = np.maximum(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity < peak / bandwidth


def rf_seconds_memory_side(flops, nbytes, gpu):
    """Exercise 4. The time as bytes / bandwidth ('attention is memory-bound'): right left of the ridge,
    too short for a compute-bound kernel."""
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    seconds = nbytes / bandwidth
    return intensity, seconds, intensity < peak / bandwidth


# ---------------------------------------------------------------- exercise 5


def pred_microseconds(n):
    """Exercise 5. seconds · 1e6 ('the kernel takes microseconds'): microseconds where the lab asks for
    milliseconds."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return seconds * 1e6


def pred_causal_half_s(n):
    """Exercise 5. Only half of S written ('attention is causal, the upper half is masked'): the kernel the
    exercise names writes all of S."""
    nbytes = 32 * 2 * (n * 128 + 128 * n + n * n // 2)
    flops = 32 * 2 * n * n * 128
    _, seconds, _ = roofline(flops, nbytes, H100)
    return seconds * 1e3


# ---------------------------------------------------------------- correct alternatives


def decode_per_group(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3, correct: counted group by group, each KV head's cache once and its group's q and o."""
    group = q_heads // kv_heads
    per_group_flops = group * 4 * context * d
    per_group_elems = 2 * context * d + group * 2 * d
    return batch * kv_heads * per_group_flops, batch * kv_heads * per_group_elems * itemsize


@functools.lru_cache(maxsize=None)
def predicted_cached(n):
    """Exercise 5, correct: the solution memoised with functools.lru_cache (a pure function of n)."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return seconds * 1e3


WRONG = {
    "matmul_cost": [mm_itemsize_fixed],
    "flash_forward_cost": [ff_padded_key_tiles],
    "decode_cost": [dc_context_plus_new_token, dc_q_o_once],
    "roofline": [rf_numpy_scalars, rf_seconds_memory_side],
    "prediction": [pred_microseconds, pred_causal_half_s],
}
CORRECT = {"decode_cost": [decode_cost, decode_per_group], "prediction": [predicted_qk_ms, predicted_cached]}

WITNESS = {
    "mm_itemsize_fixed": lambda f: f(2, 3, 5, 7, 4),
    "ff_padded_key_tiles": lambda f: f(1, 2, 128, 100, 64, 64, 2),
    "dc_context_plus_new_token": lambda f: f(2, 32, 8, 4096, 128, 2),
    "dc_q_o_once": lambda f: f(4, 32, 8, 4096, 128, 2),
    "rf_numpy_scalars": lambda f: [type(x).__name__ for x in f(1e9, 1e8, H100)],
    "rf_seconds_memory_side": lambda f: f(1e15, 1e9, H100),
    "pred_microseconds": lambda f: f(1024),
    "pred_causal_half_s": lambda f: f(1024),
}
