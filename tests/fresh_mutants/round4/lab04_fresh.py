# ruff: noqa: E501, B007, F841
"""Round 4 of fresh wrong answers for lab 04 (Triton puzzles), written from the lab's text and its
solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: a launch that writes into an input, a reduction left undone, an output rounded to the inputs'
precision, a negative scale, a block sized by the wrong dimension, a two-pass kernel, a grid cached between
calls, and the masked lanes of one dimension counted."""
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


_GRID = {}


# ---------------------------------------------------------------- sa_writes_into_y

@triton.jit
def scaled_add_kernel__sa_writes_into_y(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def sa_writes_into_y(x, y, alpha, out):
    """Puzzle 1. The launch passes y as the output ("y + alpha·x updates y, as axpy does") and returns y: out is
    never written, and the caller's y is overwritten."""
    n = x.numel()
    scaled_add_kernel__sa_writes_into_y[(triton.cdiv(n, 16),)](x, y, y, n, alpha, BLOCK=16)
    return y


# ---------------------------------------------------------------- bm_no_final_reduce

@triton.jit
def block_max_kernel__bm_no_final_reduce(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        m = tl.maximum(m, x)
    tl.store(out_ptr + lanes, m, mask=lanes < 1)


def bm_no_final_reduce(x, out):
    """Puzzle 2. Stores the running maximum with tl.store(out_ptr + lanes, m, mask=lanes < 1) ('out has one
    element'): lane 0's maximum, the maximum of every 16th element, not of the vector."""
    block_max_kernel__bm_no_final_reduce[(1,)](x, out, x.numel(), BLOCK=16)
    return out


# ---------------------------------------------------------------- mm_out_rounded_fp16

@triton.jit
def matmul_kernel__mm_out_rounded_fp16(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
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
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc.to(tl.float16),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_out_rounded_fp16(a, b, out):
    """Puzzle 5. Stores acc.to(tl.float16) ('the inputs are fp16, so the output is'): the fp32 result rounded to
    11 bits before it reaches the fp32 out."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_out_rounded_fp16[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# ---------------------------------------------------------------- cs_scale_after_shift

@triton.jit
def causal_softmax_kernel__cs_scale_after_shift(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s, float("-inf"))
    p = tl.exp(scale * (s - tl.max(s, axis=0)))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_scale_after_shift(s, scale, out):
    """Puzzle 6. Masks the unscaled scores, then tl.exp(scale · (s − max s)) ('scale once, at the end'): the
    same for a positive scale, but with a negative scale the hidden keys' −inf becomes +inf and the shift is by
    the wrong end of the row."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_scale_after_shift[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# ---------------------------------------------------------------- cs_block_from_nq

@triton.jit
def causal_softmax_kernel__cs_block_from_nq(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_block_from_nq(s, scale, out):
    """Puzzle 6. BLOCK = next_power_of_2(n_q) in the launch ('one lane per row'): when Nk exceeds that, the keys
    past the block are never loaded."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_block_from_nq[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_q))
    return out


# ---------------------------------------------------------------- lse_two_pass

@triton.jit
def row_logsumexp_kernel__lse_two_pass(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m = tl.maximum(m, tl.max(x, axis=1))
    m_safe = tl.where(rows < M, m, 0.0)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        l += tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def lse_two_pass(x, out):
    """Puzzle 7. Two passes ('simpler'): the row maximum first, then the sum of exp(x − m): the same numbers, but
    every element is read twice, which the lab refuses."""
    M, N = x.shape
    row_logsumexp_kernel__lse_two_pass[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- sws_grid_cached

@triton.jit
def softmax_weighted_sum_kernel__sws_grid_cached(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
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


def sws_grid_cached(s, v, out):
    """Puzzle 8. The launch keeps the first call's grid in a module variable ('the grid is the same every time'):
    a later call with more rows launches too few programs and leaves the last rows unwritten."""
    M, N = s.shape
    D = v.shape[1]
    _GRID.setdefault("grid", (triton.cdiv(M, 16),))
    softmax_weighted_sum_kernel__sws_grid_cached[_GRID["grid"]](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- block_max_first_tile

@triton.jit
def block_max_kernel__block_max_first_tile(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.load(x_ptr + lanes, mask=lanes < n, other=float("-inf")).to(tl.float32)
    for start in range(BLOCK, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def block_max_first_tile(x, out):
    """Puzzle 2, correct: the running maximum starts from the first tile (masked with −inf), the loop from the
    second."""
    block_max_kernel__block_max_first_tile[(1,)](x, out, x.numel(), BLOCK=16)
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
        x = x * 1.4426950408889634
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, (m + tl.log2(l)) * 0.6931471805599453, mask=rows < M)


def row_logsumexp_exp2(x, out):
    """Puzzle 7, correct: base 2 inside the loop (scores times log2(e) in full precision, exp2), converted back
    with ln 2 at the end."""
    M, N = x.shape
    row_logsumexp_kernel__row_logsumexp_exp2[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- pl_k_padded

def pl_k_padded(M, N, K):
    """Prediction. Counts K rounded up to whole steps of 16 ('each step loads a full 16-wide slice of k'): the
    masked lanes of the last k step are counted, the masked rows and columns are not."""
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    k_padded = triton.cdiv(K, 16) * 16
    return M * k_padded * tiles_n + k_padded * N * tiles_m


SOLUTION = {"scaled_add": scaled_add, "block_max": block_max, "affine_columns": affine_columns, "row_sums": row_sums,
            "matmul": matmul, "prediction": predicted_matmul_loads, "causal_softmax": causal_softmax,
            "row_logsumexp": row_logsumexp, "softmax_weighted_sum": softmax_weighted_sum}
WRONG = {
    "scaled_add": [sa_writes_into_y],
    "block_max": [bm_no_final_reduce],
    "matmul": [mm_out_rounded_fp16],
    "prediction": [pl_k_padded],
    "causal_softmax": [cs_scale_after_shift, cs_block_from_nq],
    "row_logsumexp": [lse_two_pass],
    "softmax_weighted_sum": [sws_grid_cached],
}
CORRECT = {"block_max": [block_max, block_max_first_tile], "row_logsumexp": [row_logsumexp, row_logsumexp_exp2]}

_g = torch.Generator().manual_seed(4)


def _strided(rows, cols, scale=1.0, shift=0.0):
    """A [rows, cols] view with row stride cols + 5, NaN in the padding."""
    buf = torch.full((rows + 1, cols + 5), float("nan"))
    buf[:rows, :cols] = torch.randn(rows, cols, generator=_g) * scale + shift
    return buf[:rows, :cols]


def _w_scaled_add(f):
    x, y = torch.randn(41, generator=_g), torch.randn(41, generator=_g)
    out = torch.full((41,), -777.0)
    f(x, y, 1.5, out)
    return [out, y]


def _w_block_max(f):
    x = torch.randn(41, generator=_g) - 5.0
    out = torch.full((1,), -777.0)
    return f(x, out)


def _w_matmul(f):
    a = torch.randn(20, 37, generator=_g).half()
    b = torch.randn(37, 18, generator=_g).half()
    out = torch.full((20, 18), -777.0)
    return f(a, b, out)


def _w_causal(scale):
    def run(f):
        s = _strided(5, 19, scale=3.0)
        out = torch.full((5, 19), -777.0)
        return f(s, scale, out)
    return run


def _w_lse(f):
    x = _strided(6, 37, scale=30.0)
    out = torch.full((6,), -777.0)
    return f(x, out)


def _w_sws_two_sizes(f):
    s = _strided(18, 37, scale=4.0)
    v = torch.randn(37, 16, generator=_g)
    f(s, v, torch.full((18, 16), -777.0))
    s = _strided(40, 37, scale=4.0)
    out = torch.full((40, 16), -777.0)
    return f(s, v, out)


def _w_lse_loads(f):
    """The output and the number of masked tl.load calls the interpreter runs (a two-pass kernel makes twice as
    many)."""
    from triton.runtime import interpreter
    calls = []
    original = interpreter.InterpreterBuilder.create_masked_load

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    interpreter.InterpreterBuilder.create_masked_load = counting
    try:
        out = _w_lse(f)
    finally:
        interpreter.InterpreterBuilder.create_masked_load = original
    return [out, float(len(calls))]


def _seeded(witness):
    """The witness on the same inputs every time it is called (the generator restarted)."""
    def run(f):
        _g.manual_seed(4)
        _GRID.clear()
        return witness(f)
    return run


WITNESS = {
    "sa_writes_into_y": _w_scaled_add,
    "bm_no_final_reduce": _w_block_max,
    "mm_out_rounded_fp16": _w_matmul,
    "pl_k_padded": lambda f: f(20, 50, 37),
    "cs_scale_after_shift": _w_causal(-0.7),
    "cs_block_from_nq": _w_causal(0.7),
    "lse_two_pass": _w_lse_loads,
    "sws_grid_cached": _w_sws_two_sizes,
}
WITNESS = {name: _seeded(w) for name, w in WITNESS.items()}
