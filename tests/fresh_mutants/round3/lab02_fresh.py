"""Round 3 of fresh wrong answers for lab 02 (counting FLOPs and bytes), written from the lab's text and
its solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py."""
import math

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


def mm_exact_adds(batch, m, n, k, itemsize):
    """Exercise 1. Counted the exact operations of a dot product, k multiplies and k - 1 adds, instead of the
    course's 2 FLOPs per multiply-add."""
    flops = batch * m * n * (2 * k - 1)
    nbytes = batch * itemsize * (m * k + k * n + m * n)
    return flops, nbytes


def mm_c_without_itemsize(batch, m, n, k, itemsize):
    """Exercise 1. Parentheses slip: C's m·n elements added outside the itemsize product."""
    flops = batch * 2 * m * n * k
    nbytes = batch * (itemsize * (m * k + k * n) + m * n)
    return flops, nbytes


# ---------------------------------------------------------------- exercise 2



def ff_precedence(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. batch · heads · itemsize applied to the Q and O term only (no parentheses round the sum)."""
    tiles = math.ceil(n_q / block_q)
    flops = 4 * batch * heads * n_q * n_k * d
    return flops, batch * heads * itemsize * 2 * n_q * d + tiles * 2 * n_k * d


# ---------------------------------------------------------------- exercise 3


def dc_heads_swapped(batch, kv_heads, q_heads, context, d, itemsize):
    """Exercise 3. Wrote the signature with q_heads and kv_heads in the other order (callers pass them by position)."""
    flops = batch * q_heads * (2 * context * d + 2 * context * d)
    q_and_o = 2 * q_heads * d
    cache = 2 * kv_heads * context * d
    return flops, batch * itemsize * (q_and_o + cache)


def dc_appends_new_token(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. Also counted writing the new token's K and V into the cache (the exercise counts reads of
    q and the cache and the write of o only)."""
    flops = batch * q_heads * (2 * context * d + 2 * context * d)
    q_and_o = 2 * q_heads * d
    cache = 2 * kv_heads * context * d + 2 * kv_heads * d
    return flops, batch * itemsize * (q_and_o + cache)


# ---------------------------------------------------------------- exercise 4


def rf_gbit(flops, nbytes, gpu):
    """Exercise 4. Read the bandwidth as gigabits per second (divided by 8)."""
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9 / 8
    intensity = flops / nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity < peak / bandwidth



def rf_floor_intensity(flops, nbytes, gpu):
    """Exercise 4. Integer division flops // nbytes for the intensity (whole FLOPs per byte)."""
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops // nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity < peak / bandwidth


# ---------------------------------------------------------------- exercise 5


def pred_a100(n):
    """Exercise 5. Took the A100 SXM 80GB from the table (the '80 GB' one) instead of the H100 SXM."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, iomodel.GPUS["A100 SXM 80GB"])
    return seconds * 1e3


def pred_rounded(n):
    """Exercise 5. Rounded the prediction to 2 decimals of a millisecond."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return round(seconds * 1e3, 2)


def pred_heads_as_rows(n):
    """Exercise 5. Stacked the 32 heads as rows of one product (m = 32n): K is then read once for all heads."""
    flops, nbytes = matmul_cost(1, 32 * n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return seconds * 1e3


# ---------------------------------------------------------------- correct alternatives


def ff_per_tile_sum(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2, correct: bytes summed tile by tile (the last tile's rows counted as they are)."""
    total = 0
    for start in range(0, n_q, block_q):
        rows = min(block_q, n_q - start)
        total += 2 * rows * d + 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * total


def roofline_times(flops, nbytes, gpu):
    """Exercise 4, correct: the bound from the two times, memory-bound when moving the bytes takes longer."""
    t_compute = flops / (gpu.tensor_tflops * 1e12)
    t_memory = nbytes / (gpu.hbm_gbs * 1e9)
    return flops / nbytes, max(t_compute, t_memory), t_memory > t_compute


WRONG = {
    "matmul_cost": [mm_exact_adds, mm_c_without_itemsize],
    "flash_forward_cost": [ff_precedence],
    "decode_cost": [dc_heads_swapped, dc_appends_new_token],
    "roofline": [rf_gbit, rf_floor_intensity],
    "prediction": [pred_a100, pred_rounded, pred_heads_as_rows],
}
CORRECT = {"flash_forward_cost": [flash_forward_cost, ff_per_tile_sum], "roofline": [roofline, roofline_times]}

WITNESS = {
    **{f.__name__: (lambda f: f(2, 3, 5, 7, 2)) for f in WRONG["matmul_cost"]},
    **{f.__name__: (lambda f: f(2, 3, 100, 70, 64, 32, 2)) for f in WRONG["flash_forward_cost"]},
    **{f.__name__: (lambda f: f(2, 32, 8, 1000, 128, 2)) for f in WRONG["decode_cost"]},
    **{f.__name__: (lambda f: f(1e12, 3e10, H100)) for f in WRONG["roofline"]},
    "rf_floor_intensity": lambda f: f(10**12, 3 * 10**10, H100),
    **{f.__name__: (lambda f: f(4096)) for f in WRONG["prediction"]},
    "pred_rounded": lambda f: f(512),
}
