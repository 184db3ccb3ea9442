"""Round 2 of fresh wrong answers for lab 02 (counting FLOPs and bytes), written from the lab's text and
its solution only. WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
import math

from attnkit.bench import iomodel

H100 = iomodel.GPUS["H100 SXM"]

# ---------------------------------------------------------------- the solution


def matmul_cost(batch, m, n, k, itemsize):
    return batch * 2 * m * n * k, batch * itemsize * (m * k + k * n + m * n)


def flash_forward_cost(batch, heads, n_q, n_k, d, block_q, itemsize):
    tiles = math.ceil(n_q / block_q)
    per_head = 2 * n_q * d + tiles * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def decode_cost(batch, q_heads, kv_heads, context, d, itemsize):
    flops = batch * q_heads * 4 * context * d
    return flops, batch * itemsize * (2 * q_heads * d + 2 * kv_heads * context * d)


def roofline(flops, nbytes, gpu):
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    intensity = flops / nbytes
    return intensity, max(flops / peak, nbytes / bandwidth), intensity < peak / bandwidth


def predicted_qk_ms(n):
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    return roofline(flops, nbytes, H100)[1] * 1e3


SOLUTION = {"matmul_cost": matmul_cost, "flash_forward_cost": flash_forward_cost, "decode_cost": decode_cost,
            "roofline": roofline, "prediction": predicted_qk_ms}

# ---------------------------------------------------------------- exercise 1


def mm_flops_no_two(batch, m, n, k, itemsize):
    """A multiply-add counted as one FLOP."""
    return batch * m * n * k, batch * itemsize * (m * k + k * n + m * n)


def mm_no_output_bytes(batch, m, n, k, itemsize):
    """Counted the reads only."""
    return batch * 2 * m * n * k, batch * itemsize * (m * k + k * n)


def mm_b_shared(batch, m, n, k, itemsize):
    """B read once for the whole batch (as if it were shared weights)."""
    return batch * 2 * m * n * k, itemsize * (batch * (m * k + m * n) + k * n)


def mm_no_itemsize(batch, m, n, k, itemsize):
    """Elements, not bytes."""
    return batch * 2 * m * n * k, batch * (m * k + k * n + m * n)


def mm_c_read_too(batch, m, n, k, itemsize):
    """C read and written (as in C += AB)."""
    return batch * 2 * m * n * k, batch * itemsize * (m * k + k * n + 2 * m * n)


def mm_flops_no_batch(batch, m, n, k, itemsize):
    """FLOPs of one product only."""
    return 2 * m * n * k, batch * itemsize * (m * k + k * n + m * n)


def mm_output_k_by_n(batch, m, n, k, itemsize):
    """C sized k × n (mixed up the shapes)."""
    return batch * 2 * m * n * k, batch * itemsize * (m * k + k * n + k * n)


def mm_output_fp32(batch, m, n, k, itemsize):
    """C counted in 4 bytes (an fp32 accumulator)."""
    return batch * 2 * m * n * k, batch * (itemsize * (m * k + k * n) + 4 * m * n)


# ---------------------------------------------------------------- exercise 2


def ff_tiles_floor(batch, heads, n_q, n_k, d, block_q, itemsize):
    """n_q // block_q: the partial last tile is not counted."""
    per_head = 2 * n_q * d + (n_q // block_q) * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_kv_once(batch, heads, n_q, n_k, d, block_q, itemsize):
    """K and V read once per head, as if every tile shared them."""
    per_head = 2 * n_q * d + 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_flops_two(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Counted only QKᵀ's FLOPs."""
    per_head = 2 * n_q * d + math.ceil(n_q / block_q) * 2 * n_k * d
    return 2 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_tiles_of_keys(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Tiles counted along the keys: ceil(n_k / block_q)."""
    per_head = 2 * n_q * d + math.ceil(n_k / block_q) * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_no_output(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Forgot O's write."""
    per_head = n_q * d + math.ceil(n_q / block_q) * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_tiles_plus_one(batch, heads, n_q, n_k, d, block_q, itemsize):
    """n_q // block_q + 1 tiles: one too many when block_q divides n_q."""
    per_head = 2 * n_q * d + (n_q // block_q + 1) * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_writes_lse_as_s(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Added a write of the n_q × n_k scores."""
    per_head = 2 * n_q * d + math.ceil(n_q / block_q) * 2 * n_k * d + n_q * n_k
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_v_once(batch, heads, n_q, n_k, d, block_q, itemsize):
    """K read by every tile, V only once."""
    per_head = 2 * n_q * d + math.ceil(n_q / block_q) * n_k * d + n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_last_tile_partial(batch, heads, n_q, n_k, d, block_q, itemsize):
    """Read K and V n_q / block_q times (a fraction for the partial tile)."""
    per_head = 2 * n_q * d + (n_q / block_q) * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


def ff_round_tiles(batch, heads, n_q, n_k, d, block_q, itemsize):
    """round(n_q / block_q) tiles: a last tile less than half full is lost."""
    per_head = 2 * n_q * d + round(n_q / block_q) * 2 * n_k * d
    return 4 * batch * heads * n_q * n_k * d, batch * heads * itemsize * per_head


# ---------------------------------------------------------------- exercise 3


def dec_cache_per_q_head(batch, q_heads, kv_heads, context, d, itemsize):
    """The cache read once per query head (no GQA sharing)."""
    flops = batch * q_heads * 4 * context * d
    return flops, batch * itemsize * (2 * q_heads * d + 2 * q_heads * context * d)


def dec_flops_per_kv_head(batch, q_heads, kv_heads, context, d, itemsize):
    """FLOPs counted per KV head."""
    flops = batch * kv_heads * 4 * context * d
    return flops, batch * itemsize * (2 * q_heads * d + 2 * kv_heads * context * d)


def dec_no_q_o(batch, q_heads, kv_heads, context, d, itemsize):
    """Forgot q and o."""
    return batch * q_heads * 4 * context * d, batch * itemsize * 2 * kv_heads * context * d


def dec_only_k(batch, q_heads, kv_heads, context, d, itemsize):
    """Counted K's cache, forgot V's."""
    return batch * q_heads * 4 * context * d, batch * itemsize * (2 * q_heads * d + kv_heads * context * d)


def dec_flops_scores_only(batch, q_heads, kv_heads, context, d, itemsize):
    """Forgot p·V's FLOPs."""
    return batch * q_heads * 2 * context * d, batch * itemsize * (2 * q_heads * d + 2 * kv_heads * context * d)


def dec_q_o_per_kv_head(batch, q_heads, kv_heads, context, d, itemsize):
    """q and o counted per KV head."""
    return batch * q_heads * 4 * context * d, batch * itemsize * (2 * kv_heads * d + 2 * kv_heads * context * d)


def dec_cache_shared_by_batch(batch, q_heads, kv_heads, context, d, itemsize):
    """The cache counted once for the whole batch."""
    return (batch * q_heads * 4 * context * d,
            itemsize * (batch * 2 * q_heads * d + 2 * kv_heads * context * d))


def dec_group_multiplied(batch, q_heads, kv_heads, context, d, itemsize):
    """Cache bytes scaled by the group size q_heads // kv_heads instead of kv_heads."""
    g = q_heads // kv_heads
    return batch * q_heads * 4 * context * d, batch * itemsize * (2 * q_heads * d + 2 * g * context * d)


# ---------------------------------------------------------------- exercise 4


def rf_gib(flops, nbytes, gpu):
    """GB/s read as GiB/s."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 2**30
    i = flops / nbytes
    return i, max(flops / peak, nbytes / bandwidth), i < peak / bandwidth


def rf_tib(flops, nbytes, gpu):
    """TFLOP/s read as 2^40 FLOP/s."""
    peak, bandwidth = gpu.tensor_tflops * 2**40, gpu.hbm_gbs * 1e9
    i = flops / nbytes
    return i, max(flops / peak, nbytes / bandwidth), i < peak / bandwidth


def rf_sum(flops, nbytes, gpu):
    """Added the two times instead of taking the larger."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    i = flops / nbytes
    return i, flops / peak + nbytes / bandwidth, i < peak / bandwidth


def rf_min(flops, nbytes, gpu):
    """Took the smaller time."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    i = flops / nbytes
    return i, min(flops / peak, nbytes / bandwidth), i < peak / bandwidth


def rf_intensity_inverted(flops, nbytes, gpu):
    """Bytes per FLOP."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    i = nbytes / flops
    return i, max(flops / peak, nbytes / bandwidth), i > bandwidth / peak


def rf_bound_inverted(flops, nbytes, gpu):
    """memory_bound when the intensity is above the ridge."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    i = flops / nbytes
    return i, max(flops / peak, nbytes / bandwidth), i > peak / bandwidth


def rf_milliseconds(flops, nbytes, gpu):
    """Returned milliseconds."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    i = flops / nbytes
    return i, max(flops / peak, nbytes / bandwidth) * 1e3, i < peak / bandwidth


def rf_bandwidth_mb(flops, nbytes, gpu):
    """GB/s converted with 1e6."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e6
    i = flops / nbytes
    return i, max(flops / peak, nbytes / bandwidth), i < peak / bandwidth


def rf_bound_as_string(flops, nbytes, gpu):
    """memory_bound from the time comparison, but returns the two times' ratio as the intensity."""
    peak, bandwidth = gpu.tensor_tflops * 1e12, gpu.hbm_gbs * 1e9
    t_c, t_m = flops / peak, nbytes / bandwidth
    return t_c / t_m, max(t_c, t_m), t_m > t_c


# ---------------------------------------------------------------- exercise 5


def pred_seconds(n):
    """Forgot to convert to milliseconds."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    return roofline(flops, nbytes, H100)[1]


def pred_one_head(n):
    """Forgot the 32 heads."""
    flops, nbytes = matmul_cost(1, n, n, 128, 2)
    return roofline(flops, nbytes, H100)[1] * 1e3


def pred_fp32(n):
    """itemsize 4."""
    flops, nbytes = matmul_cost(32, n, n, 128, 4)
    return roofline(flops, nbytes, H100)[1] * 1e3


def pred_gib(n):
    """GB/s read as GiB/s."""
    flops, nbytes = matmul_cost(32, n, n, 128, 2)
    return rf_gib(flops, nbytes, H100)[1] * 1e3


def pred_head_dim_64(n):
    """d = 64."""
    flops, nbytes = matmul_cost(32, n, n, 64, 2)
    return roofline(flops, nbytes, H100)[1] * 1e3


def pred_no_s_write(n):
    """Counted the reads of Q and K only."""
    return 32 * 2 * (2 * n * 128) / (H100.hbm_gbs * 1e9) * 1e3


def pred_compute_bound(n):
    """Used the FLOP time only."""
    return 32 * 2 * n * n * 128 / (H100.tensor_tflops * 1e12) * 1e3


def pred_measured_factor(n):
    """The bound times 1.03 (a guess at the overhead)."""
    return predicted_qk_ms(n) * 1.03


def pred_q_and_k_fp32_s(n):
    """Wrote S in fp32 (4 bytes) while reading Q and K in fp16."""
    nbytes = 32 * (2 * 2 * n * 128 + 4 * n * n)
    return max(32 * 2 * n * n * 128 / (H100.tensor_tflops * 1e12), nbytes / (H100.hbm_gbs * 1e9)) * 1e3


WRONG = {
    "matmul_cost": [mm_flops_no_two, mm_no_output_bytes, mm_b_shared, mm_no_itemsize, mm_c_read_too,
                    mm_flops_no_batch, mm_output_k_by_n, mm_output_fp32],
    "flash_forward_cost": [ff_tiles_floor, ff_kv_once, ff_flops_two, ff_tiles_of_keys, ff_no_output,
                           ff_tiles_plus_one, ff_writes_lse_as_s, ff_v_once, ff_last_tile_partial, ff_round_tiles],
    "decode_cost": [dec_cache_per_q_head, dec_flops_per_kv_head, dec_no_q_o, dec_only_k, dec_flops_scores_only,
                    dec_q_o_per_kv_head, dec_cache_shared_by_batch, dec_group_multiplied],
    "roofline": [rf_gib, rf_tib, rf_sum, rf_min, rf_intensity_inverted, rf_bound_inverted, rf_milliseconds,
                 rf_bandwidth_mb, rf_bound_as_string],
    "prediction": [pred_seconds, pred_one_head, pred_fp32, pred_gib, pred_head_dim_64, pred_no_s_write,
                   pred_compute_bound, pred_measured_factor, pred_q_and_k_fp32_s],
}
CORRECT = {k: [v] for k, v in SOLUTION.items()}

WITNESS = {
    **{f.__name__: (lambda f: f(2, 3, 5, 7, 2)) for f in WRONG["matmul_cost"]},
    **{f.__name__: (lambda f: f(2, 3, 100, 70, 64, 32, 2)) for f in WRONG["flash_forward_cost"]},
    "ff_tiles_plus_one": lambda f: f(1, 1, 128, 128, 64, 64, 2),
    **{f.__name__: (lambda f: f(2, 32, 8, 1000, 128, 2)) for f in WRONG["decode_cost"]},
    **{f.__name__: (lambda f: f(1e12, 1e10, H100)) for f in WRONG["roofline"]},
    "rf_bound_inverted": lambda f: f(1e12, 1e11, H100), "rf_tib": lambda f: f(1e15, 1e9, H100),
    **{f.__name__: (lambda f: f(4096)) for f in WRONG["prediction"]},
}
