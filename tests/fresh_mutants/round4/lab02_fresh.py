"""Round 4 of fresh wrong answers for lab 02 (why attention is IO-bound), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New classes
here: a result tuple in the other order, the last tile's padded rows counted, an output the exercise does
not count, mixed item sizes, a boundary exactly at the ridge, a bool returned as 0/1, the wrong datasheet
column, a launch overhead added to a bound."""
import math
import types

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


def mm_bytes_first(batch, m, n, k, itemsize):
    """Exercise 1. Returns (bytes, flops): the two numbers in the other order ('bytes come first in the
    lesson's table')."""
    flops = batch * 2 * m * n * k
    nbytes = batch * itemsize * (m * k + k * n + m * n)
    return nbytes, flops


# ---------------------------------------------------------------- exercise 2


def ff_q_whole_tiles(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Q and O counted as whole tiles, tiles · block_q rows each ('every program loads a full
    tile'): the last tile's masked rows are not read or written."""
    tiles = math.ceil(n_q / block_q)
    flops = 4 * batch * heads * n_q * n_k * d
    per_head = 2 * tiles * block_q * d + tiles * 2 * n_k * d
    return flops, batch * heads * itemsize * per_head


def ff_writes_lse(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Adds the write of the fp32 log-sum-exp, 4 bytes per query row ('lesson 5's kernel writes
    it'): the exercise counts Q, K, V and O only."""
    tiles = math.ceil(n_q / block_q)
    flops = 4 * batch * heads * n_q * n_k * d
    per_head = 2 * n_q * d + tiles * 2 * n_k * d
    return flops, batch * heads * (itemsize * per_head + 4 * n_q)


# ---------------------------------------------------------------- exercise 3


def dc_q_o_fp32(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. q and o counted at 4 bytes ('activations are fp32'), the cache at itemsize."""
    flops = batch * q_heads * (2 * context * d + 2 * context * d)
    q_and_o = 2 * q_heads * d
    cache = 2 * kv_heads * context * d
    return flops, batch * (4 * q_and_o + itemsize * cache)


# ---------------------------------------------------------------- exercise 4


def rf_bound_at_ridge(flops, nbytes, gpu):
    """Exercise 4. memory_bound = intensity <= ridge: exactly at the ridge (both times equal) it says
    memory-bound, where the lab's rule (below the ridge) says not."""
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity <= peak / bandwidth


def rf_bound_as_int(flops, nbytes, gpu):
    """Exercise 4. memory_bound returned as int(intensity < ridge), 1 or 0, where the lab asks for True or
    False."""
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, int(intensity < peak / bandwidth)


def rf_fp32_peak(flops, nbytes, gpu):
    """Exercise 4. Peak from gpu.fp32_tflops (the CUDA-core column of the datasheet) instead of
    gpu.tensor_tflops."""
    peak = gpu.fp32_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity < peak / bandwidth


# ---------------------------------------------------------------- exercise 5


def pred_d_is_n(n):
    """Exercise 5. matmul_cost(32, n, n, n, 2): passed n where the head dimension 128 belongs."""
    flops, nbytes = matmul_cost(32, n, n, n, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return seconds * 1e3


def pred_launch_overhead(n):
    """Exercise 5. Adds 5 µs of kernel launch to the roofline bound ('the lesson says short kernels pay a
    start-up'): no longer the bound."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return seconds * 1e3 + 0.005


# ---------------------------------------------------------------- correct alternatives


def roofline_by_times(flops, nbytes, gpu):
    """Exercise 4, correct: the ridge test written as intensity · bandwidth < peak, the time as the larger of
    the two."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    return intensity, max(flops / peak, nbytes / bandwidth), bool(intensity * bandwidth < peak)


def predicted_inline(n):
    """Exercise 5, correct: bytes of Q, K and S in fp16 over the bandwidth (memory-bound), in ms."""
    nbytes = 32 * 2 * (n * 128 + 128 * n + n * n)
    flops = 32 * 2 * n * n * 128
    return 1e3 * max(nbytes / (H100.hbm_gbs * 1e9), flops / (H100.tensor_tflops * 1e12))


WRONG = {
    "matmul_cost": [mm_bytes_first],
    "flash_forward_cost": [ff_q_whole_tiles, ff_writes_lse],
    "decode_cost": [dc_q_o_fp32],
    "roofline": [rf_bound_at_ridge, rf_bound_as_int, rf_fp32_peak],
    "prediction": [pred_d_is_n, pred_launch_overhead],
}
CORRECT = {"roofline": [roofline, roofline_by_times], "prediction": [predicted_qk_ms, predicted_inline]}

_ridge_gpu = types.SimpleNamespace(tensor_tflops=1.0, hbm_gbs=1.0, fp32_tflops=1.0)   # ridge exactly 1000

WITNESS = {
    "mm_bytes_first": lambda f: f(2, 3, 5, 7, 2),
    "ff_q_whole_tiles": lambda f: f(1, 2, 100, 128, 64, 64, 2),
    "ff_writes_lse": lambda f: f(1, 2, 100, 128, 64, 64, 2),
    "dc_q_o_fp32": lambda f: f(2, 32, 8, 4096, 128, 2),
    "rf_bound_at_ridge": lambda f: f(1000.0, 1.0, _ridge_gpu),
    "rf_bound_as_int": lambda f: f(1e9, 1e8, H100),
    "rf_fp32_peak": lambda f: f(1e15, 1e9, H100),
    "pred_d_is_n": lambda f: f(1024),
    "pred_launch_overhead": lambda f: f(1024),
}
