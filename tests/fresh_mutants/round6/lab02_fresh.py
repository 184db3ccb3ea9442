"""Round 6 of fresh wrong answers for lab 02 (why attention is IO-bound), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in round 5. New classes here: B
read once for the whole batch (as weights are), C read as well as written, the query tiles counted as
n_q // block_q + 1, the last query tile's padding counted for Q and O, o written in fp32 whatever the
itemsize, an intensity floor-divided, the fp32 (non-tensor) peak used for the roofline, only S's bytes
counted in the prediction, and a prediction rounded to hundredths of a millisecond. The correct answers:
tiles by negative floor division, memory_bound decided by comparing the two times, and the prediction as a
closed-form bytes / bandwidth."""
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


def mm_b_shared_by_batch(batch, m, n, k, itemsize):
    """Exercise 1. B counted once for the whole batch ('B is the weight matrix'): the lab's products are
    independent, each with its own B."""
    flops = batch * 2 * m * n * k
    nbytes = itemsize * (batch * (m * k + m * n) + k * n)
    return flops, nbytes


def mm_c_read_and_written(batch, m, n, k, itemsize):
    """Exercise 1. C counted twice, read and written ('C = C + AB'): the lab's kernel only writes its output."""
    flops = batch * 2 * m * n * k
    nbytes = batch * itemsize * (m * k + k * n + 2 * m * n)
    return flops, nbytes


# ---------------------------------------------------------------- exercise 2


def ff_tiles_floor_plus_one(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Query tiles counted as n_q // block_q + 1 ('one more for the remainder'): right unless
    block_q divides n_q, where it counts a tile too many."""
    tiles = n_q // block_q + 1
    flops = 4 * batch * heads * n_q * n_k * d
    per_head = 2 * n_q * d + tiles * 2 * n_k * d
    return flops, batch * heads * itemsize * per_head


def ff_q_o_padded_tiles(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2. Q read and O written in whole tiles, tiles · block_q rows ('each program moves a full
    tile'): the masked rows of the last tile are never read or written."""
    tiles = math.ceil(n_q / block_q)
    flops = 4 * batch * heads * n_q * n_k * d
    per_head = 2 * tiles * block_q * d + tiles * 2 * n_k * d
    return flops, batch * heads * itemsize * per_head


# ---------------------------------------------------------------- exercise 3


def dc_o_written_fp32(batch, q_heads, kv_heads, context, d, itemsize):
    """Exercise 3. o counted at 4 bytes per element ('the kernel accumulates in fp32'): the output is written
    in the model's dtype, itemsize bytes."""
    flops = batch * q_heads * (2 * context * d + 2 * context * d)
    cache = 2 * kv_heads * context * d
    return flops, batch * (itemsize * (q_heads * d + cache) + 4 * q_heads * d)


# ---------------------------------------------------------------- exercise 4


def rf_intensity_floor(flops, nbytes, gpu):
    """Exercise 4. The intensity floor-divided, flops // nbytes ('FLOPs per whole byte'): 0.5 becomes 0, and
    memory_bound follows from the truncated value."""
    peak = gpu.tensor_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops // nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity < peak / bandwidth


def rf_fp32_peak(flops, nbytes, gpu):
    """Exercise 4. The peak taken from gpu.fp32_tflops ('the scores are fp32'): the lab's F is the tensor
    rate, gpu.tensor_tflops; compute-bound times come out 15x too long on an H100."""
    peak = gpu.fp32_tflops * 1e12
    bandwidth = gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    seconds = max(flops / peak, nbytes / bandwidth)
    return intensity, seconds, intensity < peak / bandwidth


# ---------------------------------------------------------------- exercise 5


def pred_s_bytes_only(n):
    """Exercise 5. Only the bytes of S counted ('S dominates'): Q and K add 2 · n · 128 elements per head,
    50% more at n = 512."""
    _, seconds, _ = roofline(0, 32 * n * n * 2, H100)
    return seconds * 1e3


def pred_rounded_to_hundredths(n):
    """Exercise 5. The prediction rounded to 2 decimals ('milliseconds to 2 places'): at n = 512 the bound is
    0.0075 ms, rounded to 0.01."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    _, seconds, _ = roofline(flops, nbytes, H100)
    return round(seconds * 1e3, 2)


# ---------------------------------------------------------------- correct alternatives


def flash_forward_cost_negfloor(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Exercise 2, correct: tiles by negative floor division, K and V counted per tile, Q and O once."""
    tiles = -(-n_q // block_q)
    kv = tiles * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * (kv + 2 * n_q * d)


def roofline_by_times(flops, nbytes, gpu):
    """Exercise 4, correct: memory_bound when the memory time is strictly longer than the compute time (the
    same comparison as intensity < F/B, both sides multiplied by bytes/F)."""
    t_compute = flops / (gpu.tensor_tflops * 1e12)
    t_memory = nbytes / (gpu.hbm_gbs * 1e9)
    return flops / nbytes, max(t_compute, t_memory), t_memory > t_compute


def predicted_closed_form(n):
    """Exercise 5, correct: the kernel is memory-bound at every n, so the bound is its bytes over 3.35 TB/s."""
    nbytes = 32 * 2 * (2 * n * 128 + n * n)
    return max(nbytes / (H100.hbm_gbs * 1e9), 32 * 2 * n * n * 128 / (H100.tensor_tflops * 1e12)) * 1e3


WRONG = {
    "matmul_cost": [mm_b_shared_by_batch, mm_c_read_and_written],
    "flash_forward_cost": [ff_tiles_floor_plus_one, ff_q_o_padded_tiles],
    "decode_cost": [dc_o_written_fp32],
    "roofline": [rf_intensity_floor, rf_fp32_peak],
    "prediction": [pred_s_bytes_only, pred_rounded_to_hundredths],
}
CORRECT = {"flash_forward_cost": [flash_forward_cost, flash_forward_cost_negfloor],
           "roofline": [roofline, roofline_by_times], "prediction": [predicted_qk_ms, predicted_closed_form]}

WITNESS = {
    "mm_b_shared_by_batch": lambda f: f(2, 3, 5, 7, 2),
    "mm_c_read_and_written": lambda f: f(2, 3, 5, 7, 2),
    "ff_tiles_floor_plus_one": lambda f: f(1, 2, 128, 100, 64, 64, 2),
    "ff_q_o_padded_tiles": lambda f: f(1, 2, 100, 100, 64, 64, 2),
    "dc_o_written_fp32": lambda f: f(2, 32, 8, 4096, 128, 2),
    "rf_intensity_floor": lambda f: f(1e9, 2e9, H100),
    "rf_fp32_peak": lambda f: f(1e15, 1e9, H100),
    "pred_s_bytes_only": lambda f: f(512),
    "pred_rounded_to_hundredths": lambda f: f(512),
}
