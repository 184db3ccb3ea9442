# ruff: noqa: E501, B007, F841
"""Round 3 of fresh wrong answers for lab 04 (Triton puzzles), written from the lab's text and its
solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py."""
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


def predicted_matmul_loads(M, N, K):
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    # every program in a row of tiles reads those rows of a; every program in a column reads b's columns
    return M * K * tiles_n + K * N * tiles_m


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


# ---------------------------------------------------------------- puzzle 1


def sa_block_grid_mismatch(x, y, alpha, out):
    """Puzzle 1. Launched with BLOCK=8 but kept the grid cdiv(n, 16): half the blocks have no program."""
    n = x.numel()
    scaled_add_kernel[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=8)
    return out


# ---------------------------------------------------------------- puzzle 3


@triton.jit
def _ac_pid_axis_kernel(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)          # program_id(0) again
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], x * scale[None, :] + bias[None, :], mask=mask)


def ac_pid_axis_mixup(x, scale, bias, out):
    """Puzzle 3. Column indices from tl.program_id(0) (copied from the row line): the grid's second axis is unused."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    _ac_pid_axis_kernel[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0), BLOCK_M=8, BLOCK_N=16)
    return out


@triton.jit
def _ac_out_contiguous_kernel(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], x * scale[None, :] + bias[None, :], mask=mask)


def ac_out_assumed_contiguous(x, scale, bias, out):
    """Puzzle 3. Stores at rows · N + cols ('out is a fresh tensor, so its row stride is N'): stride_om ignored."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    _ac_out_contiguous_kernel[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0), BLOCK_M=8, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- puzzle 4


@triton.jit
def _rs_linear_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + (rows[:, None] * N + cols[None, :]) * stride_xn, mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def rs_linear_index(x, out):
    """Puzzle 4. Address (row · N + col) · stride_xn: the flat index of a contiguous matrix times the element
    stride, which assumes the row stride is N · stride_xn."""
    M, N = x.shape
    _rs_linear_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- puzzle 5


@triton.jit
def _mm_k_mask_m_kernel(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < M), other=0.0)      # ks bounded by M (copy-paste)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_k_mask_uses_m(a, b, out):
    """Puzzle 5. a's k-mask written ks < M (copied from the row mask): right when M == K only."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    _mm_k_mask_m_kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                              BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# ---------------------------------------------------------------- prediction


def pl_counts_store(M, N, K):
    """Prediction. Adds the M·N elements of out (a store, not a load)."""
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    return M * K * tiles_n + K * N * tiles_m + M * N


# ---------------------------------------------------------------- puzzle 6


@triton.jit
def _cs_exp2_kernel(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp2(s - tl.max(s, axis=0))                                 # exp2 'is faster', no log2(e) factor
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_exp2_no_log2e(s, scale, out):
    """Puzzle 6. tl.exp2 in place of tl.exp without multiplying the scores by log2(e): a softmax in base 2."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    _cs_exp2_kernel[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0), BLOCK=triton.next_power_of_2(n_k))
    return out


# ---------------------------------------------------------------- puzzle 7


@triton.jit
def _lse_m_zero_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.zeros([BLOCK_M], tl.float32)                                # 0 instead of -inf
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def lse_m_start_zero(x, out):
    """Puzzle 7. Running maximum started at 0 ('any start works, the rescale fixes it'): a row of scores far
    below 0 keeps the reference 0, every e^(x - 0) underflows and the answer is -inf."""
    M, N = x.shape
    _lse_m_zero_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


@triton.jit
def _lse_log2_units_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        x = x * 1.4426950408889634                                     # to base 2
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log2(l), mask=rows < M)           # not divided back by log2(e)


def lse_log2_units(x, out):
    """Puzzle 7. Works in base 2 (scores times log2(e), exp2, log2), as FlashAttention does, but stores the
    result in log2 units: it forgets to multiply by ln 2 at the end."""
    M, N = x.shape
    _lse_log2_units_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- puzzle 8


@triton.jit
def _sws_alpha_row_kernel(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
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
        acc = acc * alpha[None, :] + tl.dot(p, v)                      # [None, :]: scales columns, not rows
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_alpha_row_broadcast(s, v, out):
    """Puzzle 8. acc * alpha[None, :] instead of alpha[:, None]: compiles only when D == BLOCK_M (16), and
    then rescales column j by row j's factor."""
    M, N = s.shape
    D = v.shape[1]
    _sws_alpha_row_kernel[(triton.cdiv(M, 16),)](s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1),
                                                 out.stride(0), D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- correct alternatives


@triton.jit
def _rs_extra_kernel(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N + BLOCK_N, BLOCK_N):                       # one more, fully masked, tile
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def row_sums_extra_tile(x, out):
    """Puzzle 4, correct: the loop runs one tile past N; that tile is masked off entirely and adds 0."""
    M, N = x.shape
    _rs_extra_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


@triton.jit
def _cs_shift_then_scale_kernel(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=0.0)
    s = tl.where(cols <= row + n_k - n_q, s, float("-inf"))            # padding lanes lie past the diagonal too
    p = tl.exp((s - tl.max(s, axis=0)) * scale)                        # max(scale·s) = scale·max(s) for scale > 0
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def causal_softmax_shift_then_scale(s, scale, out):
    """Puzzle 6, correct: masks first, shifts by the unscaled maximum and scales after (the same for a positive
    scale); padding lanes read 0 and are hidden by the causal mask, whose bound lies below Nk."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    _cs_shift_then_scale_kernel[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                        BLOCK=triton.next_power_of_2(n_k))
    return out


WRONG = {
    "scaled_add": [sa_block_grid_mismatch],
    "affine_columns": [ac_pid_axis_mixup, ac_out_assumed_contiguous],
    "row_sums": [rs_linear_index],
    "matmul": [mm_k_mask_uses_m],
    "prediction": [pl_counts_store],
    "causal_softmax": [cs_exp2_no_log2e],
    "row_logsumexp": [lse_m_start_zero, lse_log2_units],
    "softmax_weighted_sum": [sws_alpha_row_broadcast],
}
SOLUTION = {"scaled_add": scaled_add, "block_max": block_max, "affine_columns": affine_columns, "row_sums": row_sums,
            "matmul": matmul, "prediction": predicted_matmul_loads, "causal_softmax": causal_softmax,
            "row_logsumexp": row_logsumexp, "softmax_weighted_sum": softmax_weighted_sum}
CORRECT = {"row_sums": [row_sums, row_sums_extra_tile], "causal_softmax": [causal_softmax, causal_softmax_shift_then_scale]}

_g = torch.Generator().manual_seed(3)


def _strided(rows, cols, scale=1.0, shift=0.0):
    """A [rows, cols] view with row stride cols + 5, NaN in the padding."""
    buf = torch.full((rows + 1, cols + 5), float("nan"))
    buf[:rows, :cols] = torch.randn(rows, cols, generator=_g) * scale + shift
    return buf[:rows, :cols]


def _w_scaled_add(f):
    x, y = torch.randn(41, generator=_g), torch.randn(41, generator=_g)
    out = torch.full((41,), -777.0)
    return f(x, y, 1.5, out)


def _w_affine(f):
    x = _strided(11, 37)
    outbuf = torch.full((11, 40), -777.0)                  # out with row stride 40
    f(x, torch.randn(37, generator=_g), torch.randn(37, generator=_g), outbuf[:, :37])
    return outbuf


def _w_row_sums(f):
    x = _strided(6, 23)
    out = torch.full((8,), -777.0)
    f(x, out[:6])
    return out


def _w_matmul(f):
    a = torch.randn(20, 37, generator=_g).half()
    b = torch.randn(37, 18, generator=_g).half()
    out = torch.full((20, 18), -777.0)
    return f(a, b, out)


def _w_causal(f):
    s = _strided(5, 19, scale=3.0)
    out = torch.full((5, 19), -777.0)
    return f(s, 0.7, out)


def _w_lse_negative(f):
    x = _strided(6, 37, scale=3.0, shift=-150.0)
    out = torch.full((6,), -777.0)
    return f(x, out)


def _w_sws(f):
    s = _strided(18, 37, scale=4.0)
    v = torch.randn(37, 16, generator=_g)
    out = torch.full((18, 16), -777.0)
    return f(s, v, out)


def _seeded(witness):
    """The witness on the same inputs every time it is called (the generator restarted)."""
    def run(f):
        _g.manual_seed(3)
        return witness(f)
    return run


WITNESS = {
    "sa_block_grid_mismatch": _w_scaled_add,
    "ac_pid_axis_mixup": _w_affine, "ac_out_assumed_contiguous": _w_affine,
    "rs_linear_index": _w_row_sums,
    "mm_k_mask_uses_m": _w_matmul,
    "pl_counts_store": lambda f: f(20, 50, 37),
    "cs_exp2_no_log2e": _w_causal,
    "lse_m_start_zero": _w_lse_negative, "lse_log2_units": _w_lse_negative,
    "sws_alpha_row_broadcast": _w_sws,
}
WITNESS = {name: _seeded(w) for name, w in WITNESS.items()}
