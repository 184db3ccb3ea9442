# ruff: noqa: E501, B007, F841
"""Round 6 of fresh wrong answers for lab 04 (Triton puzzles), written from the lab's text and its
solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in round 5. New classes
here: an input written in place, a launch grid with its axes swapped (right while one tile covers the data),
a sentinel `other=` that is right for fp16-sized data only, a product rounded to fp16 where fp32 is asked,
a running maximum started at 0 or at -1e4 (right unless every value lies below it), a rescale from the tile's
maximum alone (exp overflows when a row falls by more than 88), the last column of a row skipped when
N = 16k + 1, a shift by the row's first score, a k loop bounded by N, an element count that includes the
masked lanes. The correct answers: the scale applied after the maximum is subtracted (scale > 0),
exp2 with the exact log2(e), the maximum of the scaled row taken as scale · max (scale > 0), and a column
loop for the affine tile."""
import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ---------------------------------------------------------------- the solution

@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def scaled_add(x, y, alpha, out):
    n = x.numel()
    scaled_add_kernel[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


@triton.jit
def block_max_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def block_max(x, out):
    block_max_kernel[(1,)](x, out, x.numel(), BLOCK=16)
    return out


@triton.jit
def affine_columns_kernel(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)        # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)        # [BLOCK_N]
    mask = (rows[:, None] < M) & (cols[None, :] < N)                 # [BLOCK_M, BLOCK_N]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], x * scale[None, :] + bias[None, :], mask=mask)


def affine_columns(x, scale, bias, out):
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    affine_columns_kernel[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=8, BLOCK_N=16)
    return out


@triton.jit
def row_sums_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def row_sums(x, out):
    M, N = x.shape
    row_sums_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


@triton.jit
def matmul_kernel(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)       # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)       # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a, b, out):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


@triton.jit
def causal_softmax_kernel(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def causal_softmax(s, scale, out):
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


@triton.jit
def row_logsumexp_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def row_logsumexp(x, out):
    M, N = x.shape
    row_logsumexp_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


@triton.jit
def softmax_weighted_sum_kernel(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
                                stride_om, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * stride_sn,
                    mask=(rows[:, None] < M) & (keys[None, :] < N), other=float("-inf"))
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=keys[:, None] < N, other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def softmax_weighted_sum(s, v, out):
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


def predicted_matmul_loads(M, N, K):
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    # every program in a row of tiles reads those rows of a; every program in a column reads b's columns
    return M * K * tiles_n + K * N * tiles_m




# ---------------------------------------------------------------- sa_result_into_y

@triton.jit
def scaled_add_kernel__sa_result_into_y(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, alpha * x + y, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def sa_result_into_y(x, y, alpha, out):
    """Puzzle 1. The kernel stores alpha·x + y into y as well ('y += alpha·x, as in BLAS axpy'), then into out: out is right, the caller's y is changed."""
    n = x.numel()
    scaled_add_kernel__sa_result_into_y[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


# ---------------------------------------------------------------- sa_alpha_fp16

@triton.jit
def scaled_add_kernel__sa_alpha_fp16(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def sa_alpha_fp16(x, y, alpha, out):
    """Puzzle 1. alpha rounded to fp16 before the launch ('a scalar in half precision is enough'): alpha = 0.1 becomes 0.0999755859375, a relative error of 2.4e-4 in alpha · x."""
    n = x.numel()
    alpha = float(torch.tensor(alpha, dtype=torch.float16))
    scaled_add_kernel__sa_alpha_fp16[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


# ---------------------------------------------------------------- bm_other_fp16_lowest

@triton.jit
def block_max_kernel__bm_other_fp16_lowest(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=-65504.0)
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def bm_other_fp16_lowest(x, out):
    """Puzzle 2. Masked lanes read -65504 ('the lowest half-precision number'): right until every element lies below -65504; the input is float32."""
    block_max_kernel__bm_other_fp16_lowest[(1,)](x, out, x.numel(), BLOCK=16)
    return out


# ---------------------------------------------------------------- ac_grid_axes_swapped

def ac_grid_axes_swapped(x, scale, bias, out):
    """Puzzle 3. The grid written (cdiv(N, 16), cdiv(M, 8)) ('columns first'): right while one tile covers x (M <= 8, N <= 16); otherwise rows or columns are never written."""
    M, N = x.shape
    grid = (triton.cdiv(N, 16), triton.cdiv(M, 8))
    affine_columns_kernel[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=8, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- rs_loop_stops_before_last

@triton.jit
def row_sums_kernel__rs_loop_stops_before_last(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N - 1, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def rs_loop_stops_before_last(x, out):
    """Puzzle 4. The column loop runs range(0, N - 1, BLOCK_N) ('the last index is N - 1'): when N = 16k + 1 the last column, alone in its tile, is never added."""
    M, N = x.shape
    row_sums_kernel__rs_loop_stops_before_last[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- mm_k_loop_to_n

@triton.jit
def matmul_kernel__mm_k_loop_to_n(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)       # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)       # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_k_loop_to_n(a, b, out):
    """Puzzle 5. The k loop bounded by N ('loop to the size of out'): right when N >= K rounds to the same tiles; with N < K the last k tiles are never added."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_k_loop_to_n[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# ---------------------------------------------------------------- mm_result_fp16

@triton.jit
def matmul_kernel__mm_result_fp16(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)       # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)       # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(tl.float16).to(tl.float32),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_result_fp16(a, b, out):
    """Puzzle 5. The accumulator rounded to fp16 before the store ('the inputs are fp16'): the lab asks for an fp32 result; every element loses its bits past fp16's 11."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_result_fp16[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# ---------------------------------------------------------------- pl_masked_lanes_counted

def pl_masked_lanes_counted(M, N, K):
    """Prediction. Whole 16 x 16 tiles counted ('each load reads a tile'): the lab counts only the lanes that
    are not masked off; wrong whenever M, N or K is not a multiple of 16."""
    tiles_m, tiles_n, tiles_k = triton.cdiv(M, 16), triton.cdiv(N, 16), triton.cdiv(K, 16)
    return 2 * tiles_m * tiles_n * tiles_k * 16 * 16


# ---------------------------------------------------------------- cs_shift_by_first_score

@triton.jit
def causal_softmax_kernel__cs_shift_by_first_score(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - tl.sum(tl.where(cols == 0, s, 0.0), axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_shift_by_first_score(s, scale, out):
    """Puzzle 6. The row shifted by its first (visible) score instead of its maximum ('any shift cancels'): right on mild rows, exp overflows to inf (NaN after the division) when a later score exceeds the first by more than 88 / scale."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_shift_by_first_score[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# ---------------------------------------------------------------- lse_max_starts_at_zero

@triton.jit
def row_logsumexp_kernel__lse_max_starts_at_zero(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.zeros([BLOCK_M], tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def lse_max_starts_at_zero(x, out):
    """Puzzle 7. The running maximum starts at 0 ('scores are around 0'): still exact while some element is near or above 0; on a row whose values all lie below about -88, exp underflows, l = 0 and the result is -inf."""
    M, N = x.shape
    row_logsumexp_kernel__lse_max_starts_at_zero[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- lse_rescale_from_tile_max

@triton.jit
def row_logsumexp_kernel__lse_rescale_from_tile_max(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.max(x, axis=1)
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def lse_rescale_from_tile_max(x, out):
    """Puzzle 7. m_new = rowmax(tile) alone, not max(m, rowmax(tile)) ('the sum is rescaled anyway'): the algebra still holds, but exp(m - m_new) overflows when a row falls by more than 88 from one tile to the next."""
    M, N = x.shape
    row_logsumexp_kernel__lse_rescale_from_tile_max[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- sws_max_starts_at_minus_1e4

@triton.jit
def softmax_weighted_sum_kernel__sws_max_starts_at_minus_1e4(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
                                stride_om, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_M], -1.0e4, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * stride_sn,
                    mask=(rows[:, None] < M) & (keys[None, :] < N), other=float("-inf"))
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=keys[:, None] < N, other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_max_starts_at_minus_1e4(s, v, out):
    """Puzzle 8. The running maximum starts at -1e4 ('a large negative number instead of -inf'): right unless a row's scores all lie below about -1e4 + -88, where every p underflows and out = 0/0."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_max_starts_at_minus_1e4[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- sws_p_fp16_dot

@triton.jit
def softmax_weighted_sum_kernel__sws_p_fp16_dot(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
                                stride_om, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * stride_sn,
                    mask=(rows[:, None] < M) & (keys[None, :] < N), other=float("-inf"))
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=keys[:, None] < N, other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16))
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_p_fp16_dot(s, v, out):
    """Puzzle 8. p and v cast to fp16 for tl.dot ('tensor cores want fp16', as in puzzle 5): the scores and v are fp32 here; p · v loses fp16's rounding, about 5e-4 relative."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_p_fp16_dot[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out

# ---------------------------------------------------------------- correct alternatives

# ---------------------------------------------------------------- causal_softmax_scale_after_shift

@triton.jit
def causal_softmax_kernel__causal_softmax_scale_after_shift(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s, float("-inf"))
    p = tl.exp((s - tl.max(s, axis=0)) * scale)
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def causal_softmax_scale_after_shift(s, scale, out):
    """Puzzle 6, correct: exp(scale · (s - max s)), the scale applied after the shift: equal to softmax(scale · s) because scale > 0 keeps the same maximum."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__causal_softmax_scale_after_shift[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# ---------------------------------------------------------------- row_logsumexp_exp2

@triton.jit
def row_logsumexp_kernel__row_logsumexp_exp2(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp2((m - m_new) * 1.4426950408889634) + tl.sum(tl.exp2((x - m_new[:, None]) * 1.4426950408889634), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def row_logsumexp_exp2(x, out):
    """Puzzle 7, correct: the running sum in base 2 (exp2 of x·log2 e) and the result converted back with ln 2, log2 e written to full float precision."""
    M, N = x.shape
    row_logsumexp_kernel__row_logsumexp_exp2[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- block_max_two_reductions

@triton.jit
def block_max_kernel__block_max_two_reductions(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = float("-inf")
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        m = tl.maximum(m, tl.max(x, axis=0))
    tl.store(out_ptr, m)


def block_max_two_reductions(x, out):
    """Puzzle 2, correct: a scalar running maximum, each block reduced with tl.max as it is loaded."""
    block_max_kernel__block_max_two_reductions[(1,)](x, out, x.numel(), BLOCK=16)
    return out


SOLUTION = {"scaled_add": scaled_add, "block_max": block_max, "affine_columns": affine_columns, "row_sums": row_sums,
            "matmul": matmul, "prediction": predicted_matmul_loads, "causal_softmax": causal_softmax,
            "row_logsumexp": row_logsumexp, "softmax_weighted_sum": softmax_weighted_sum}
WRONG = {
    "scaled_add": [sa_result_into_y, sa_alpha_fp16],
    "block_max": [bm_other_fp16_lowest],
    "affine_columns": [ac_grid_axes_swapped],
    "row_sums": [rs_loop_stops_before_last],
    "matmul": [mm_k_loop_to_n, mm_result_fp16],
    "prediction": [pl_masked_lanes_counted],
    "causal_softmax": [cs_shift_by_first_score],
    "row_logsumexp": [lse_max_starts_at_zero, lse_rescale_from_tile_max],
    "softmax_weighted_sum": [sws_max_starts_at_minus_1e4, sws_p_fp16_dot],
}
CORRECT = {"block_max": [block_max_two_reductions],
           "causal_softmax": [causal_softmax, causal_softmax_scale_after_shift],
           "row_logsumexp": [row_logsumexp, row_logsumexp_exp2]}

_g = torch.Generator().manual_seed(6)


def _strided(rows, cols, scale=1.0, shift=0.0):
    """A [rows, cols] view with row stride cols + 5, NaN in the padding."""
    buf = torch.full((rows + 1, cols + 5), float("nan"))
    buf[:rows, :cols] = torch.randn(rows, cols, generator=_g) * scale + shift
    return buf[:rows, :cols]


def _padded_out(rows, cols, width=48):
    """A [rows, cols] output of -777 inside a buffer of -555 wide enough for a store in the wrong place."""
    buf = torch.full((max(rows, cols) + 2, width), -555.0)
    buf[:rows, :cols] = -777.0
    return buf, buf[:rows, :cols]


def _w_sa_y(f):
    x, y = torch.randn(37, generator=_g), torch.randn(37, generator=_g)
    out = f(x, y, 0.1, torch.full((37,), -777.0))
    return [out, y]


def _w_bm(f):
    x = torch.randn(41, generator=_g) * 10.0 - 1.0e5
    return f(x, torch.full((1,), -777.0))


def _w_affine(f):
    x = _strided(20, 5)
    scale, bias = torch.randn(5, generator=_g), torch.randn(5, generator=_g)
    buf, out = _padded_out(20, 5)
    f(x, scale, bias, out)
    return buf


def _w_row_sums(f):
    x = _strided(7, 33)
    return f(x, torch.full((7,), -777.0))


def _w_matmul(f):
    a = torch.randn(20, 37, generator=_g).half()
    b = torch.randn(37, 18, generator=_g).half()
    return f(a, b, torch.full((20, 18), -777.0))


def _w_causal(f):
    s = _strided(5, 19)
    s[:, 3] = 300.0
    s[:, 0] = -300.0
    return f(s, 1.0, torch.full((5, 19), -777.0))


def _w_lse_low(f):
    x = _strided(6, 37, scale=3.0, shift=-300.0)
    return f(x, torch.full((6,), -777.0))


def _w_lse_fall(f):
    x = _strided(6, 37)
    x[:, :16] += 100.0
    x[:, 16:] -= 100.0
    return f(x, torch.full((6,), -777.0))


def _w_sws_low(f):
    s = _strided(18, 32, scale=4.0, shift=-2.0e4)
    v = torch.randn(32, 16, generator=_g)
    return f(s, v, torch.full((18, 16), -777.0))


def _w_sws(f):
    s = _strided(18, 32, scale=4.0)
    v = torch.randn(32, 16, generator=_g)
    return f(s, v, torch.full((18, 16), -777.0))


def _seeded(witness):
    """The witness on the same inputs every time it is called (the generator restarted)."""
    def run(f):
        _g.manual_seed(6)
        return witness(f)
    return run


WITNESS = {
    "sa_result_into_y": _w_sa_y,
    "sa_alpha_fp16": _w_sa_y,
    "bm_other_fp16_lowest": _w_bm,
    "ac_grid_axes_swapped": _w_affine,
    "rs_loop_stops_before_last": _w_row_sums,
    "mm_k_loop_to_n": _w_matmul,
    "mm_result_fp16": _w_matmul,
    "pl_masked_lanes_counted": lambda f: f(20, 50, 37),
    "cs_shift_by_first_score": _w_causal,
    "lse_max_starts_at_zero": _w_lse_low,
    "lse_rescale_from_tile_max": _w_lse_fall,
    "sws_max_starts_at_minus_1e4": _w_sws_low,
    "sws_p_fp16_dot": _w_sws,
}
WITNESS = {name: _seeded(w) for name, w in WITNESS.items()}
