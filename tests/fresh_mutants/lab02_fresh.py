"""Fresh wrong answers (and alternative correct answers) for lab 02, written from the student notebook
and the solutions only. Each function's docstring names the exercise it answers and the mistake."""
import math

from attnkit.bench import iomodel

H100 = iomodel.GPUS["H100 SXM"]


def _matmul_cost(batch, m, n, k, itemsize):
    return batch * 2 * m * n * k, batch * itemsize * (m * k + k * n + m * n)


def _roofline(flops, nbytes, gpu):
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    return intensity, max(flops / peak, nbytes / bandwidth), intensity < peak / bandwidth


# ---------------------------------------------------------------- exercise 1: matmul_cost
def matmul_no_output_write(batch, m, n, k, itemsize):
    """Exercise 1. Counts reading A and B but forgets writing C."""
    return batch * 2 * m * n * k, batch * itemsize * (m * k + k * n)


def matmul_one_flop_per_madd(batch, m, n, k, itemsize):
    """Exercise 1. Counts a multiply-add as 1 FLOP."""
    return batch * m * n * k, batch * itemsize * (m * k + k * n + m * n)


def matmul_b_shared_across_batch(batch, m, n, k, itemsize):
    """Exercise 1. Reads B once for the whole batch (as if it were a shared weight)."""
    return batch * 2 * m * n * k, itemsize * (batch * m * k + k * n + batch * m * n)


def matmul_square_assumption(batch, m, n, k, itemsize):
    """Exercise 1. Writes the bytes as if B were [k, m] (uses m where n belongs in B's size)."""
    return batch * 2 * m * n * k, batch * itemsize * (m * k + k * m + m * n)


# ---------------------------------------------------------------- exercise 2: flash_forward_cost
def flash_floor_tiles(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Number of query tiles n_q // block_q (forgets the partly empty last tile)."""
    tiles = n_q // block_q
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * (2 * n_q * d + tiles * 2 * n_k * d)


def flash_kv_once(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Reads K and V once per head, not once per query tile."""
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * (2 * n_q * d + 2 * n_k * d)


def flash_kv_length_nq(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Uses n_q for the length of K and V in the bytes."""
    tiles = math.ceil(n_q / block_q)
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * (2 * n_q * d + tiles * 2 * n_q * d)


def flash_counts_lse_and_s(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Adds the score matrix S to the bytes (as naive attention writes it)."""
    tiles = math.ceil(n_q / block_q)
    per_head = 2 * n_q * d + tiles * 2 * n_k * d + n_q * n_k
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


# ---------------------------------------------------------------- exercise 3: decode_cost
def decode_kv_per_query_head(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. Reads the cache once per query head (no sharing in a GQA group)."""
    flops = batch * q_heads * 4 * context * d
    return flops, batch * itemsize * (2 * q_heads * d + 2 * q_heads * context * d)


def decode_only_k(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. Reads only the K cache (forgets V)."""
    flops = batch * q_heads * 4 * context * d
    return flops, batch * itemsize * (2 * q_heads * d + kv_heads * context * d)


def decode_flops_per_kv_head(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. Counts the FLOPs per KV head instead of per query head."""
    flops = batch * kv_heads * 4 * context * d
    return flops, batch * itemsize * (2 * q_heads * d + 2 * kv_heads * context * d)


def decode_group_division(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. Divides the cache by the group size q_heads // kv_heads a second time."""
    group = q_heads // kv_heads
    flops = batch * q_heads * 4 * context * d
    return flops, batch * itemsize * (2 * q_heads * d + 2 * kv_heads * context * d // group)


# ---------------------------------------------------------------- exercise 4: roofline
def roofline_gib(flops, nbytes, gpu):
    """Exercise 4. Reads GB/s as GiB/s (2**30 bytes)."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 2**30
    intensity = flops / nbytes
    return intensity, max(flops / peak, nbytes / bandwidth), intensity < peak / bandwidth


def roofline_sum_of_times(flops, nbytes, gpu):
    """Exercise 4. Adds compute time and memory time instead of taking the larger."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    return intensity, flops / peak + nbytes / bandwidth, intensity < peak / bandwidth


def roofline_inverted_bound(flops, nbytes, gpu):
    """Exercise 4. Says memory-bound when the intensity is ABOVE the ridge."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    return intensity, max(flops / peak, nbytes / bandwidth), intensity > peak / bandwidth


def roofline_bytes_per_flop(flops, nbytes, gpu):
    """Exercise 4. Intensity written as bytes per FLOP; the bound compares that with F/B."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    intensity = nbytes / flops
    return intensity, max(flops / peak, nbytes / bandwidth), intensity < peak / bandwidth


def roofline_tib(flops, nbytes, gpu):
    """Exercise 4. Reads TFLOP/s as 2**40 FLOP/s."""
    peak, bandwidth = gpu.tensor_tflops * 2**40, gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    return intensity, max(flops / peak, nbytes / bandwidth), intensity < peak / bandwidth


# ---------------------------------------------------------------- exercise 5: predicted_qk_ms
def predict_seconds(n):
    """Exercise 5. Returns seconds, not milliseconds."""
    flops, nbytes = _matmul_cost(32, n, n, 128, 2)
    return _roofline(flops, nbytes, H100)[1]


def predict_fp32(n):
    """Exercise 5. Counts 4-byte elements (fp32) although the kernel runs in fp16."""
    flops, nbytes = _matmul_cost(32, n, n, 128, 4)
    return _roofline(flops, nbytes, H100)[1] * 1e3


def predict_compute_only(n):
    """Exercise 5. Predicts from the FLOPs alone (the tensor-core time)."""
    flops, _ = _matmul_cost(32, n, n, 128, 2)
    return flops / (H100.tensor_tflops * 1e12) * 1e3


def predict_gib(n):
    """Exercise 5. Uses a roofline with GB/s read as GiB/s."""
    flops, nbytes = _matmul_cost(32, n, n, 128, 2)
    return roofline_gib(flops, nbytes, H100)[1] * 1e3


def predict_one_head(n):
    """Exercise 5. Forgets the 32 heads (batch = 1)."""
    flops, nbytes = _matmul_cost(1, n, n, 128, 2)
    return _roofline(flops, nbytes, H100)[1] * 1e3


# ---------------------------------------------------------------- correct alternatives
def correct_matmul(batch, m, n, k, itemsize):
    """Exercise 1, correct: elements first, then bytes; FLOPs as 2 per output per k."""
    outputs = batch * m * n
    elements = batch * (m * k) + batch * (k * n) + outputs
    return 2 * k * outputs, elements * itemsize


def correct_roofline(flops, nbytes, gpu):
    """Exercise 4, correct: compares the two times to decide the bound."""
    t_compute = flops / (gpu.tensor_tflops * 1e12)
    t_memory = nbytes / (gpu.hbm_gbs * 1e9)
    return flops / nbytes, max(t_compute, t_memory), t_memory > t_compute


def correct_flash(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2, correct: ceil by negative floor division."""
    tiles = -(-n_q // block_q)
    q_o = 2 * n_q * d
    kv = 2 * n_k * d * tiles
    return 2 * 2 * batch * heads * n_q * n_k * d, itemsize * batch * heads * (q_o + kv)


def correct_predict(n):
    """Exercise 5, correct: inline bytes over bandwidth (it is memory-bound) checked against compute."""
    nbytes = 32 * 2 * (n * 128 * 2 + n * n)
    flops = 32 * 2 * n * n * 128
    return max(nbytes / (H100.hbm_gbs * 1e9), flops / (H100.tensor_tflops * 1e12)) * 1000


WRONG = {
    "matmul_cost": [matmul_no_output_write, matmul_one_flop_per_madd, matmul_b_shared_across_batch,
                    matmul_square_assumption],
    "flash_forward_cost": [flash_floor_tiles, flash_kv_once, flash_kv_length_nq, flash_counts_lse_and_s],
    "decode_cost": [decode_kv_per_query_head, decode_only_k, decode_flops_per_kv_head, decode_group_division],
    "roofline": [roofline_gib, roofline_sum_of_times, roofline_inverted_bound, roofline_bytes_per_flop,
                 roofline_tib],
    "prediction": [predict_seconds, predict_fp32, predict_compute_only, predict_gib, predict_one_head],
}
CORRECT = {
    "matmul_cost": [correct_matmul],
    "flash_forward_cost": [correct_flash],
    "roofline": [correct_roofline],
    "prediction": [correct_predict],
}
