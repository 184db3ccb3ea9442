"""Fresh wrong answers (and alternative correct answers) for lab 04, written from the student notebook
and the solutions only. Each launch function's docstring names the puzzle it answers and the mistake.
To keep the file short, the variants of one puzzle share one kernel whose constexpr MUT selects the
mistake (MUT = 0 is the correct body); each launch function is what one student would hand in."""
from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


# ---------------------------------------------------------------- puzzle 1: scaled_add
@triton.jit
def _scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, MUT: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    if MUT == 1:    # alpha on the wrong operand
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + alpha * y, mask=mask)
    elif MUT == 2:  # off-by-one mask: offsets <= n
        mask2 = offsets <= n
        x = tl.load(x_ptr + offsets, mask=mask2, other=0.0)
        y = tl.load(y_ptr + offsets, mask=mask2, other=0.0)
        tl.store(out_ptr + offsets, alpha * x + y, mask=mask2)
    else:
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def scaled_add_alpha_on_y(x, y, alpha, out):
    """Puzzle 1. Computes x + alpha*y."""
    n = x.numel()
    _scaled_add_kernel[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16, MUT=1)
    return out


def scaled_add_mask_le(x, y, alpha, out):
    """Puzzle 1. Mask offsets <= n: reads and writes one element past the end."""
    n = x.numel()
    _scaled_add_kernel[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16, MUT=2)
    return out


def scaled_add_floor_grid(x, y, alpha, out):
    """Puzzle 1. Grid n // 16 programs: the partial last block is never computed."""
    n = x.numel()
    _scaled_add_kernel[(max(n // 16, 1),)](x, y, out, n, alpha, BLOCK=16, MUT=0)
    return out


# ---------------------------------------------------------------- puzzle 2: block_max
@triton.jit
def _block_max_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, MUT: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    if MUT == 1:     # running max starts at 0
        m = tl.zeros([BLOCK], tl.float32)
    else:
        m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        if MUT == 2:   # masked lanes read -1e4 (a "very negative" number)
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=-1e4)
        elif MUT == 3:  # the tile's maximum replaces the running one instead of joining it
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
            m = tl.maximum(x, x)
        else:
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        if MUT != 3:
            m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def block_max_starts_at_zero(x, out):
    """Puzzle 2. Running maximum initialised to 0 (wrong for all-negative vectors)."""
    _block_max_kernel[(1,)](x, out, x.numel(), BLOCK=16, MUT=1)
    return out


def block_max_other_minus_1e4(x, out):
    """Puzzle 2. Masked lanes read -1e4 instead of -inf."""
    _block_max_kernel[(1,)](x, out, x.numel(), BLOCK=16, MUT=2)
    return out


def block_max_overwrites(x, out):
    """Puzzle 2. m = tile instead of max(m, tile): only the last block counts."""
    _block_max_kernel[(1,)](x, out, x.numel(), BLOCK=16, MUT=3)
    return out


# ---------------------------------------------------------------- puzzle 3: affine_columns
@triton.jit
def _affine_kernel(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MUT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    if MUT == 1:     # per-row scale and bias
        scale = tl.load(scale_ptr + rows, mask=rows < M)
        bias = tl.load(bias_ptr + rows, mask=rows < M)
        y = x * scale[:, None] + bias[:, None]
    else:
        scale = tl.load(scale_ptr + cols, mask=cols < N)
        bias = tl.load(bias_ptr + cols, mask=cols < N)
        y = x * scale[None, :] + bias[None, :]
    if MUT == 2:     # stores through x's row stride
        tl.store(out_ptr + rows[:, None] * stride_xm + cols[None, :], y, mask=mask)
    elif MUT == 3:   # row mask only
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], y, mask=rows[:, None] < M)
    else:
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], y, mask=mask)


def _affine(x, scale, bias, out, mut):
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    _affine_kernel[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                         BLOCK_M=8, BLOCK_N=16, MUT=mut)
    return out


def affine_per_row(x, scale, bias, out):
    """Puzzle 3. Indexes scale and bias by the row instead of the column."""
    return _affine(x, scale, bias, out, 1)


def affine_out_with_x_stride(x, scale, bias, out):
    """Puzzle 3. Stores out with x's row stride (the wrong tensor's stride)."""
    return _affine(x, scale, bias, out, 2)


def affine_row_mask_only(x, scale, bias, out):
    """Puzzle 3. Loads with the full mask but stores with the row mask only."""
    return _affine(x, scale, bias, out, 3)


# ---------------------------------------------------------------- puzzle 4: row_sums
@triton.jit
def _row_sums_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     MUT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    if MUT == 2:
        acc = tl.zeros([BLOCK_M], tl.float16)
    else:
        acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        if MUT == 3:  # column offset multiplied by the row stride
            tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xm, mask=mask, other=0.0)
        else:
            tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        if MUT == 1:
            acc = tl.sum(tile, axis=1)
        elif MUT == 2:
            acc += tl.sum(tile, axis=1).to(tl.float16)
        else:
            acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc.to(tl.float32), mask=rows < M)


def _row_sums(x, out, mut):
    M, N = x.shape
    _row_sums_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16, MUT=mut)
    return out


def row_sums_overwrite(x, out):
    """Puzzle 4. acc = tile sum (overwrites instead of adding): only the last tile counts."""
    return _row_sums(x, out, 1)


def row_sums_fp16_acc(x, out):
    """Puzzle 4. Accumulator in float16."""
    return _row_sums(x, out, 2)


def row_sums_row_stride_twice(x, out):
    """Puzzle 4. Uses stride_xm for the columns too."""
    return _row_sums(x, out, 3)


# ---------------------------------------------------------------- puzzle 5: matmul
@triton.jit
def _matmul_kernel(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MUT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        if MUT == 1:   # masks rows/cols, not k
            a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak, mask=rows[:, None] < M, other=0.0)
            b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn, mask=cols[None, :] < N, other=0.0)
        elif MUT == 2:  # b's strides swapped
            a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                        mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
            b = tl.load(b_ptr + ks[:, None] * stride_bn + cols[None, :] * stride_bk,
                        mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        else:
            a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                        mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
            b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                        mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        if MUT == 3:    # fp16 accumulator
            acc = (acc.to(tl.float16) + tl.dot(a, b).to(tl.float16)).to(tl.float32)
        elif MUT == 4:  # float32 tiles (allowed: slower, more exact)
            acc += tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


def _matmul(a, b, out, mut):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    _matmul_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                         BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, MUT=mut)
    return out


def matmul_no_k_mask(a, b, out):
    """Puzzle 5. Masks the m and n edges but not k (reads past K in the last step)."""
    return _matmul(a, b, out, 1)


def matmul_b_strides_swapped(a, b, out):
    """Puzzle 5. Reads b with stride_bn along k and stride_bk along n."""
    return _matmul(a, b, out, 2)


def matmul_fp16_accumulator(a, b, out):
    """Puzzle 5. Accumulates the partial products in float16."""
    return _matmul(a, b, out, 3)


# ---------------------------------------------------------------- prediction
def predict_once(M, N, K):
    """Prediction. Each input read once: M*K + K*N."""
    return M * K + K * N


def predict_swapped(M, N, K):
    """Prediction. Swaps which tile count multiplies which input."""
    return M * K * triton.cdiv(M, 16) + K * N * triton.cdiv(N, 16)


def predict_padded_tiles(M, N, K):
    """Prediction. Counts the masked-off lanes too (whole 16x16 tiles)."""
    tm, tn, tk = triton.cdiv(M, 16), triton.cdiv(N, 16), triton.cdiv(K, 16)
    return tm * tn * tk * 2 * 256


# ---------------------------------------------------------------- puzzle 6: causal_softmax
@triton.jit
def _causal_softmax_kernel(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr,
                           MUT: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    if MUT == 1:     # mask j <= i (not aligned to the end)
        s = tl.where(cols <= row, s * scale, float("-inf"))
    elif MUT == 2:   # max of the unscaled scores, exp of the scaled ones
        mx = tl.max(tl.where(cols <= row + n_k - n_q, s, float("-inf")), axis=0)
        s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
        p = tl.exp(s - mx)
        tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)
    elif MUT == 3:   # mask off by one: j < i + Nk - Nq
        s = tl.where(cols < row + n_k - n_q, s * scale, float("-inf"))
    else:
        s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    if MUT != 2:
        p = tl.exp(s - tl.max(s, axis=0))
        tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def _causal_softmax(s, scale, out, mut):
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    _causal_softmax_kernel[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                   BLOCK=triton.next_power_of_2(n_k), MUT=mut)
    return out


def causal_softmax_mask_not_aligned(s, scale, out):
    """Puzzle 6. Hides j > i (the square-matrix mask), not j > i + Nk - Nq."""
    return _causal_softmax(s, scale, out, 1)


def causal_softmax_unscaled_max(s, scale, out):
    """Puzzle 6. Subtracts the maximum of the unscaled scores from the scaled ones."""
    return _causal_softmax(s, scale, out, 2)


def causal_softmax_off_by_one(s, scale, out):
    """Puzzle 6. Mask j < i + Nk - Nq: hides the diagonal key (the last row sees all but one)."""
    return _causal_softmax(s, scale, out, 3)


# ---------------------------------------------------------------- puzzle 7: row_logsumexp
@triton.jit
def _lse_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                MUT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        if MUT == 1:   # padding reads 0 and is summed
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        else:
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask,
                        other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        if MUT == 2:   # no rescale of l
            l = l + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        else:
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    if MUT == 3:
        tl.store(out_ptr + rows, tl.log(l * tl.exp(m)), mask=rows < M)
    else:
        tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def _lse(x, out, mut):
    M, N = x.shape
    _lse_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16, MUT=mut)
    return out


def logsumexp_other_zero(x, out):
    """Puzzle 7. Masked lanes read 0 (they add exp(-m) per padding lane)."""
    return _lse(x, out, 1)


def logsumexp_no_rescale(x, out):
    """Puzzle 7. Adds each tile's sum to l without rescaling the old l."""
    return _lse(x, out, 2)


def logsumexp_exp_of_m(x, out):
    """Puzzle 7. Final value log(l * exp(m)): overflows once m > 88."""
    return _lse(x, out, 3)


# ---------------------------------------------------------------- puzzle 8: softmax_weighted_sum
@triton.jit
def _sws_kernel(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd, stride_om,
                D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MUT: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * stride_sn,
                    mask=(rows[:, None] < M) & (keys[None, :] < N), other=float("-inf"))
        if MUT == 1:   # v through s's strides
            v = tl.load(v_ptr + keys[:, None] * stride_sm + dims[None, :] * stride_sn, mask=keys[:, None] < N,
                        other=0.0)
        else:
            v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=keys[:, None] < N,
                        other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        if MUT == 2:   # acc not rescaled
            acc = acc + tl.dot(p, v)
        elif MUT == 3:  # p cast to fp16 before the product
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
        else:
            acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    if MUT == 4:   # normalises by the last tile's sum
        tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / tl.sum(p, axis=1)[:, None],
                 mask=rows[:, None] < M)
    else:
        tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def _sws(s, v, out, mut):
    M, N = s.shape
    D = v.shape[1]
    _sws_kernel[(triton.cdiv(M, 16),)](s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1),
                                       out.stride(0), D=D, BLOCK_M=16, BLOCK_N=16, MUT=mut)
    return out


def sws_v_with_s_strides(s, v, out):
    """Puzzle 8. Loads v through s's strides (the wrong tensor's stride)."""
    return _sws(s, v, out, 1)


def sws_acc_not_rescaled(s, v, out):
    """Puzzle 8. Rescales l but not acc."""
    return _sws(s, v, out, 2)


def sws_fp16_weights(s, v, out):
    """Puzzle 8. Casts p to fp16 for tl.dot (weights lose digits; v is fp32)."""
    return _sws(s, v, out, 3)


def sws_last_tile_sum(s, v, out):
    """Puzzle 8. Divides by the last tile's sum of p instead of the running l."""
    return _sws(s, v, out, 4)


# ---------------------------------------------------------------- correct alternatives
@triton.jit
def _block_max_scalar_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    best = tl.max(tl.load(x_ptr + lanes, mask=lanes < n, other=float("-inf")), axis=0)
    for start in range(BLOCK, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        best = tl.maximum(best, tl.max(x, axis=0))
    tl.store(out_ptr, best)


def correct_block_max_scalar(x, out):
    """Puzzle 2, correct: a scalar running maximum, each tile reduced as it comes."""
    _block_max_scalar_kernel[(1,)](x, out, x.numel(), BLOCK=16)
    return out


def correct_matmul_fp32_tiles(a, b, out):
    """Puzzle 5, correct: converts the tiles to float32 before tl.dot."""
    return _matmul(a, b, out, 4)


def correct_predict(M, N, K):
    """Prediction, correct: per program, its rows of a and its columns of b, summed over the grid."""
    total = 0
    for i in range(triton.cdiv(M, 16)):
        rows = min(16, M - 16 * i)
        for j in range(triton.cdiv(N, 16)):
            cols = min(16, N - 16 * j)
            total += rows * K + K * cols
    return total


WRONG = {
    "scaled_add": [scaled_add_alpha_on_y, scaled_add_mask_le, scaled_add_floor_grid],
    "block_max": [block_max_starts_at_zero, block_max_other_minus_1e4, block_max_overwrites],
    "affine_columns": [affine_per_row, affine_out_with_x_stride, affine_row_mask_only],
    "row_sums": [row_sums_overwrite, row_sums_fp16_acc, row_sums_row_stride_twice],
    "matmul": [matmul_no_k_mask, matmul_b_strides_swapped, matmul_fp16_accumulator],
    "prediction": [predict_once, predict_swapped, predict_padded_tiles],
    "causal_softmax": [causal_softmax_mask_not_aligned, causal_softmax_unscaled_max, causal_softmax_off_by_one],
    "row_logsumexp": [logsumexp_other_zero, logsumexp_no_rescale, logsumexp_exp_of_m],
    "softmax_weighted_sum": [sws_v_with_s_strides, sws_acc_not_rescaled, sws_fp16_weights, sws_last_tile_sum],
}
CORRECT = {
    "block_max": [correct_block_max_scalar],
    "matmul": [correct_matmul_fp32_tiles],
    "prediction": [correct_predict],
}
