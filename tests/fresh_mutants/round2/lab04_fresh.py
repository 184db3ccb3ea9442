# ruff: noqa: E501, B007, F841
"""Round 2 of fresh wrong answers for lab 04 (Triton puzzles), written from the lab's text and its
solution only. Each wrong answer is the solution's kernel and launch function with one student's edit
(its docstring says which). WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
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


# scaled_add: sa_store_unmasked
@triton.jit
def scaled_add_kernel__sa_store_unmasked(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y)


def sa_store_unmasked(x, y, alpha, out):
    """Store without its mask: the last block writes past the end of out."""
    n = x.numel()
    scaled_add_kernel__sa_store_unmasked[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


# scaled_add: sa_alpha_on_y
@triton.jit
def scaled_add_kernel__sa_alpha_on_y(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


def sa_alpha_on_y(x, y, alpha, out):
    """alpha multiplies y instead of x."""
    n = x.numel()
    scaled_add_kernel__sa_alpha_on_y[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


# scaled_add: sa_no_program_offset
@triton.jit
def scaled_add_kernel__sa_no_program_offset(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def sa_no_program_offset(x, y, alpha, out):
    """Forgot the program's offset: every program does block 0."""
    n = x.numel()
    scaled_add_kernel__sa_no_program_offset[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


# scaled_add: sa_mask_le
@triton.jit
def scaled_add_kernel__sa_mask_le(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets <= n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def sa_mask_le(x, y, alpha, out):
    """mask = offsets <= n: one element too many."""
    n = x.numel()
    scaled_add_kernel__sa_mask_le[(triton.cdiv(n, 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


# scaled_add: sa_grid_floor
@triton.jit
def scaled_add_kernel__sa_grid_floor(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, alpha * x + y, mask=mask)


def sa_grid_floor(x, y, alpha, out):
    """Grid n // 16: the partial last block has no program."""
    n = x.numel()
    scaled_add_kernel__sa_grid_floor[(max(1, n // 16),)](x, y, out, n, alpha, BLOCK=16)
    return out


# block_max: bm_other_zero
@triton.jit
def block_max_kernel__bm_other_zero(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=0.0)
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def bm_other_zero(x, out):
    """Masked lanes read 0, which wins on negative vectors."""
    block_max_kernel__bm_other_zero[(1,)](x, out, x.numel(), BLOCK=16)
    return out


# block_max: bm_start_zero
@triton.jit
def block_max_kernel__bm_start_zero(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def bm_start_zero(x, out):
    """Running maximum started at 0 instead of -inf."""
    block_max_kernel__bm_start_zero[(1,)](x, out, x.numel(), BLOCK=16)
    return out


# block_max: bm_loop_drops_tail
@triton.jit
def block_max_kernel__bm_loop_drops_tail(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n - BLOCK, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=float("-inf"))
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def bm_loop_drops_tail(x, out):
    """range(0, n - BLOCK, BLOCK): the last block(s) never read."""
    block_max_kernel__bm_loop_drops_tail[(1,)](x, out, x.numel(), BLOCK=16)
    return out


# block_max: bm_no_start
@triton.jit
def block_max_kernel__bm_no_start(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + lanes, mask=lanes < n, other=float("-inf"))
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def bm_no_start(x, out):
    """Loads x_ptr + lanes in every iteration (forgot + start)."""
    block_max_kernel__bm_no_start[(1,)](x, out, x.numel(), BLOCK=16)
    return out


# affine_columns: ac_contiguous_columns
@triton.jit
def affine_columns_kernel__ac_contiguous_columns(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)        # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)        # [BLOCK_N]
    mask = (rows[:, None] < M) & (cols[None, :] < N)                 # [BLOCK_M, BLOCK_N]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], x * scale[None, :] + bias[None, :], mask=mask)


def ac_contiguous_columns(x, scale, bias, out):
    """Ignored stride_xn (assumes columns are contiguous)."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    affine_columns_kernel__ac_contiguous_columns[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=8, BLOCK_N=16)
    return out


# affine_columns: ac_scale_by_row
@triton.jit
def affine_columns_kernel__ac_scale_by_row(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)        # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)        # [BLOCK_N]
    mask = (rows[:, None] < M) & (cols[None, :] < N)                 # [BLOCK_M, BLOCK_N]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + rows, mask=rows < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], x * scale[:, None] + bias[None, :], mask=mask)


def ac_scale_by_row(x, scale, bias, out):
    """scale and bias indexed by the row."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    affine_columns_kernel__ac_scale_by_row[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=8, BLOCK_N=16)
    return out


# affine_columns: ac_out_with_x_stride
@triton.jit
def affine_columns_kernel__ac_out_with_x_stride(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)        # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)        # [BLOCK_N]
    mask = (rows[:, None] < M) & (cols[None, :] < N)                 # [BLOCK_M, BLOCK_N]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * stride_xm + cols[None, :], x * scale[None, :] + bias[None, :], mask=mask)


def ac_out_with_x_stride(x, scale, bias, out):
    """Stored with x's row stride instead of out's."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    affine_columns_kernel__ac_out_with_x_stride[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=8, BLOCK_N=16)
    return out


# affine_columns: ac_row_mask_only
@triton.jit
def affine_columns_kernel__ac_row_mask_only(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)        # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)        # [BLOCK_N]
    mask = (rows[:, None] < M) & (cols[None, :] < BLOCK_N * 1000)                 # [BLOCK_M, BLOCK_N]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], x * scale[None, :] + bias[None, :], mask=mask)


def ac_row_mask_only(x, scale, bias, out):
    """Mask on the rows only."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    affine_columns_kernel__ac_row_mask_only[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=8, BLOCK_N=16)
    return out


# affine_columns: ac_bias_before_scale
@triton.jit
def affine_columns_kernel__ac_bias_before_scale(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)        # [BLOCK_M]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)        # [BLOCK_N]
    mask = (rows[:, None] < M) & (cols[None, :] < N)                 # [BLOCK_M, BLOCK_N]
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], (x + bias[None, :]) * scale[None, :], mask=mask)


def ac_bias_before_scale(x, scale, bias, out):
    """(x + bias) * scale."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    affine_columns_kernel__ac_bias_before_scale[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                BLOCK_M=8, BLOCK_N=16)
    return out


# row_sums: rs_no_start
@triton.jit
def row_sums_kernel__rs_no_start(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def rs_no_start(x, out):
    """Column indices without start: the first tile summed again and again."""
    M, N = x.shape
    row_sums_kernel__rs_no_start[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_sums: rs_acc_reset
@triton.jit
def row_sums_kernel__rs_acc_reset(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        acc = tl.zeros([BLOCK_M], tl.float32)
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def rs_acc_reset(x, out):
    """Accumulator zeroed inside the loop: only the last tile counts."""
    M, N = x.shape
    row_sums_kernel__rs_acc_reset[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_sums: rs_contiguous_columns
@triton.jit
def row_sums_kernel__rs_contiguous_columns(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def rs_contiguous_columns(x, out):
    """Ignored stride_xn."""
    M, N = x.shape
    row_sums_kernel__rs_contiguous_columns[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_sums: rs_loop_to_M
@triton.jit
def row_sums_kernel__rs_loop_to_M(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, M, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        acc += tl.sum(tile, axis=1)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def rs_loop_to_M(x, out):
    """Loop bound M (rows) instead of N (columns)."""
    M, N = x.shape
    row_sums_kernel__rs_loop_to_M[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# matmul: mm_no_k_mask
@triton.jit
def matmul_kernel__mm_no_k_mask(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=rows[:, None] < M, other=0.0)       # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=cols[None, :] < N, other=0.0)       # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_no_k_mask(a, b, out):
    """Loads along k masked on rows/columns only."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_no_k_mask[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# matmul: mm_fp16_acc
@triton.jit
def matmul_kernel__mm_fp16_acc(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float16)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)       # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)       # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, b).to(tl.float16)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_fp16_acc(a, b, out):
    """Accumulator in fp16."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_fp16_acc[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# matmul: mm_b_strides_swapped
@triton.jit
def matmul_kernel__mm_b_strides_swapped(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)       # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + ks[:, None] * stride_bn + cols[None, :] * stride_bk,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)       # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_b_strides_swapped(a, b, out):
    """b's two strides swapped (reads bᵀ)."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_b_strides_swapped[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# matmul: mm_grid_swapped
@triton.jit
def matmul_kernel__mm_grid_swapped(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
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


def mm_grid_swapped(a, b, out):
    """Grid (N tiles, M tiles)."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(N, 16), triton.cdiv(M, 16))
    matmul_kernel__mm_grid_swapped[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# matmul: mm_k_loop_floor
@triton.jit
def matmul_kernel__mm_k_loop_floor(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K - BLOCK_K + 1, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)       # [BLOCK_M, BLOCK_K]
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)       # [BLOCK_K, BLOCK_N]
        acc += tl.dot(a, b)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_k_loop_floor(a, b, out):
    """range(0, K - BLOCK_K + 1, BLOCK_K): the partial last k step skipped."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_k_loop_floor[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                        BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# prediction: pl_read_once
def pl_read_once(M, N, K):
    """Each input read once."""
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    # every program in a row of tiles reads those rows of a; every program in a column reads b's columns
    return M * K + K * N


# prediction: pl_tiles_swapped
def pl_tiles_swapped(M, N, K):
    """a read per row of tiles, b per column of tiles, swapped."""
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    # every program in a row of tiles reads those rows of a; every program in a column reads b's columns
    return M * K * tiles_m + K * N * tiles_n


# prediction: pl_padded_lanes
def pl_padded_lanes(M, N, K):
    """Counted the masked lanes too (whole 16 × 16 tiles)."""
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    # every program in a row of tiles reads those rows of a; every program in a column reads b's columns
    return 2 * tiles_m * tiles_n * 256 * triton.cdiv(K, 16)


# prediction: pl_floor_tiles
def pl_floor_tiles(M, N, K):
    """Tiles counted with // (partial tiles lost)."""
    tiles_m, tiles_n = max(1, M // 16), max(1, N // 16)
    # every program in a row of tiles reads those rows of a; every program in a column reads b's columns
    return M * K * tiles_n + K * N * tiles_m


# causal_softmax: cs_mask_not_aligned
@triton.jit
def causal_softmax_kernel__cs_mask_not_aligned(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_mask_not_aligned(s, scale, out):
    """Mask j <= i (not aligned to the end of the keys)."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_mask_not_aligned[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# causal_softmax: cs_mask_hides_diagonal
@triton.jit
def causal_softmax_kernel__cs_mask_hides_diagonal(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols < row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_mask_hides_diagonal(s, scale, out):
    """Mask j < i + Nk - Nq: the diagonal is hidden."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_mask_hides_diagonal[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# causal_softmax: cs_no_scale
@triton.jit
def causal_softmax_kernel__cs_no_scale(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_no_scale(s, scale, out):
    """Forgot the scale."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_no_scale[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# causal_softmax: cs_max_before_mask
@triton.jit
def causal_softmax_kernel__cs_max_before_mask(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    mx = tl.max(s * scale, axis=0)
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - mx)
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_max_before_mask(s, scale, out):
    """Row maximum taken before the causal mask."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_max_before_mask[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# causal_softmax: cs_store_unmasked
@triton.jit
def causal_softmax_kernel__cs_store_unmasked(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0))


def cs_store_unmasked(s, scale, out):
    """Store of the whole BLOCK (past the row's end)."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_store_unmasked[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# causal_softmax: cs_row_contiguous
@triton.jit
def causal_softmax_kernel__cs_row_contiguous(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_row_contiguous(s, scale, out):
    """Ignored stride_sn."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_row_contiguous[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# row_logsumexp: lse_no_rescale
@triton.jit
def row_logsumexp_kernel__lse_no_rescale(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def lse_no_rescale(x, out):
    """The old sum is not rescaled when the maximum grows."""
    M, N = x.shape
    row_logsumexp_kernel__lse_no_rescale[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_logsumexp: lse_other_zero
@triton.jit
def row_logsumexp_kernel__lse_other_zero(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def lse_other_zero(x, out):
    """Masked lanes read 0 (they add exp(-m) each)."""
    M, N = x.shape
    row_logsumexp_kernel__lse_other_zero[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_logsumexp: lse_stale_max
@triton.jit
def row_logsumexp_kernel__lse_stale_max(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)


def lse_stale_max(x, out):
    """Forgot m = m_new."""
    M, N = x.shape
    row_logsumexp_kernel__lse_stale_max[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_logsumexp: lse_log2
@triton.jit
def row_logsumexp_kernel__lse_log2(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
    tl.store(out_ptr + rows, m + tl.log2(l), mask=rows < M)


def lse_log2(x, out):
    """log2 instead of the natural log."""
    M, N = x.shape
    row_logsumexp_kernel__lse_log2[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_logsumexp: lse_forgot_m
@triton.jit
def row_logsumexp_kernel__lse_forgot_m(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
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
    tl.store(out_ptr + rows, tl.log(l), mask=rows < M)


def lse_forgot_m(x, out):
    """Stored log(l) without adding m."""
    M, N = x.shape
    row_logsumexp_kernel__lse_forgot_m[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# softmax_weighted_sum: sws_acc_not_rescaled
@triton.jit
def softmax_weighted_sum_kernel__sws_acc_not_rescaled(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
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
        acc = acc + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_acc_not_rescaled(s, v, out):
    """acc not multiplied by alpha."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_acc_not_rescaled[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# softmax_weighted_sum: sws_v_unmasked
@triton.jit
def softmax_weighted_sum_kernel__sws_v_unmasked(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
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
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, )
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_v_unmasked(s, v, out):
    """v's rows past N not masked."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_v_unmasked[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# softmax_weighted_sum: sws_l_not_rescaled
@triton.jit
def softmax_weighted_sum_kernel__sws_l_not_rescaled(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
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
        l = l + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_l_not_rescaled(s, v, out):
    """l not multiplied by alpha."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_l_not_rescaled[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# softmax_weighted_sum: sws_v_row_contiguous
@triton.jit
def softmax_weighted_sum_kernel__sws_v_row_contiguous(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
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
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :], mask=keys[:, None] < N, other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_v_row_contiguous(s, v, out):
    """Ignored stride_vd."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_v_row_contiguous[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# softmax_weighted_sum: sws_fp16_dot
@triton.jit
def softmax_weighted_sum_kernel__sws_fp16_dot(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
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


def sws_fp16_dot(s, v, out):
    """p and v cast to fp16 for tl.dot."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_fp16_dot[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# softmax_weighted_sum: sws_stale_alpha
@triton.jit
def softmax_weighted_sum_kernel__sws_stale_alpha(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
                                stride_om, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    alpha = tl.full([BLOCK_M], 1.0, tl.float32)
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * stride_sn,
                    mask=(rows[:, None] < M) & (keys[None, :] < N), other=float("-inf"))
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=keys[:, None] < N, other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
        alpha = tl.exp(m - m_new)
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_stale_alpha(s, v, out):
    """alpha computed after m is updated (always 1)."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_stale_alpha[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# row_sums: rs_fp16_acc
@triton.jit
def row_sums_kernel__rs_fp16_acc(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float16)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        acc = (acc + tl.sum(tile, axis=1)).to(tl.float16)
    tl.store(out_ptr + rows, acc, mask=rows < M)


def rs_fp16_acc(x, out):
    """Row sums accumulated in fp16."""
    M, N = x.shape
    row_sums_kernel__rs_fp16_acc[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# row_logsumexp: lse_l_fp16
@triton.jit
def row_logsumexp_kernel__lse_l_fp16(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float16)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        l = (l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)).to(tl.float16)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l.to(tl.float32)), mask=rows < M)


def lse_l_fp16(x, out):
    """Running sum l kept in fp16."""
    M, N = x.shape
    row_logsumexp_kernel__lse_l_fp16[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# causal_softmax: cs_max_of_unscaled
@triton.jit
def causal_softmax_kernel__cs_max_of_unscaled(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_k - n_q, s, float("-inf"))
    p = tl.exp(s * scale - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_max_of_unscaled(s, scale, out):
    """Subtracted the maximum of the unscaled scores from the scaled ones."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_max_of_unscaled[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                  BLOCK=triton.next_power_of_2(n_k))
    return out


# softmax_weighted_sum: sws_padded_keys_score_zero
@triton.jit
def softmax_weighted_sum_kernel__sws_padded_keys_score_zero(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd,
                                stride_om, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * stride_sn,
                    mask=(rows[:, None] < M) & (keys[None, :] < N), other=0.0)
        v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * stride_vd, mask=keys[:, None] < N, other=0.0)
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v)
        m = m_new
    tl.store(out_ptr + rows[:, None] * stride_om + dims[None, :], acc / l[:, None], mask=rows[:, None] < M)


def sws_padded_keys_score_zero(s, v, out):
    """Scores of keys past N read as 0 (other=0.0)."""
    M, N = s.shape
    D = v.shape[1]
    softmax_weighted_sum_kernel__sws_padded_keys_score_zero[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


WRONG = {
    "scaled_add": [sa_store_unmasked, sa_alpha_on_y, sa_no_program_offset, sa_mask_le, sa_grid_floor],
    "block_max": [bm_other_zero, bm_start_zero, bm_loop_drops_tail, bm_no_start],
    "affine_columns": [ac_contiguous_columns, ac_scale_by_row, ac_out_with_x_stride, ac_row_mask_only, ac_bias_before_scale],
    "row_sums": [rs_no_start, rs_acc_reset, rs_contiguous_columns, rs_loop_to_M, rs_fp16_acc],
    "matmul": [mm_no_k_mask, mm_fp16_acc, mm_b_strides_swapped, mm_grid_swapped, mm_k_loop_floor],
    "prediction": [pl_read_once, pl_tiles_swapped, pl_padded_lanes, pl_floor_tiles],
    "causal_softmax": [cs_mask_not_aligned, cs_mask_hides_diagonal, cs_no_scale, cs_max_before_mask, cs_store_unmasked, cs_row_contiguous, cs_max_of_unscaled],
    "row_logsumexp": [lse_no_rescale, lse_other_zero, lse_stale_max, lse_log2, lse_forgot_m, lse_l_fp16],
    "softmax_weighted_sum": [sws_acc_not_rescaled, sws_v_unmasked, sws_l_not_rescaled, sws_v_row_contiguous, sws_fp16_dot, sws_stale_alpha, sws_padded_keys_score_zero],
}
SOLUTION = {"scaled_add": scaled_add, "block_max": block_max, "affine_columns": affine_columns, "row_sums": row_sums,
            "matmul": matmul, "prediction": predicted_matmul_loads, "causal_softmax": causal_softmax,
            "row_logsumexp": row_logsumexp, "softmax_weighted_sum": softmax_weighted_sum}
CORRECT = {k: [v] for k, v in SOLUTION.items()}

_g = torch.Generator().manual_seed(0)


def _padded(rows, cols, col_major=False, scale=1.0):
    """A [rows, cols] view with row stride cols + 7 (or column-major), NaN in the padding."""
    if col_major:
        buf = torch.full((cols, rows + 7), float("nan"))
        buf[:, :rows] = torch.randn(cols, rows, generator=_g) * scale
        return buf[:, :rows].t()
    buf = torch.full((rows, cols + 7), float("nan"))
    buf[:, :cols] = torch.randn(rows, cols, generator=_g) * scale
    return buf[:, :cols]


def _out(*shape):
    """out inside a buffer of sentinels; the witness returns the whole buffer."""
    n = 1
    for s in shape:
        n *= s
    buf = torch.full((3 * n + 64,), -777.0)
    return buf, buf[:n].view(*shape)


def _w_scaled_add(f):
    x, y = torch.randn(37, generator=_g), torch.randn(37, generator=_g)
    buf = torch.full((64,), float("nan"))
    buf[:37] = x
    whole, out = _out(37)
    f(buf[:37], y, 1.5, out)
    return whole


def _w_block_max(f):
    x = -torch.rand(37, generator=_g) - 1.0
    x[33] = -0.5                                     # the maximum sits in the last block
    whole, out = _out(1)
    f(x, out)
    return whole


def _w_affine(f, col_major=True):
    x = _padded(11, 21, col_major=col_major)
    whole, out = _out(11, 21)
    f(x, torch.randn(21, generator=_g), torch.randn(21, generator=_g), out)
    return whole


def _w_row_sums(f):
    x = _padded(6, 37, col_major=True)
    whole, out = _out(6)
    f(x, out)
    return whole


def _w_matmul(f):
    a = torch.randn(20, 37, generator=_g).half()
    b = torch.randn(30, 37, generator=_g).half().t()          # stride_bk = 1
    whole, out = _out(20, 30)
    f(a, b, out)
    return whole


def _w_matmul_long(f):
    a = (torch.rand(17, 300, generator=_g) + 1).half()
    b = (torch.rand(300, 18, generator=_g) + 1).half()
    whole, out = _out(17, 18)
    f(a, b, out)
    return whole


def _w_causal(f, big=False):
    s = _padded(5, 19, col_major=True, scale=3.0)
    if big:
        s = s.clone()
        s[:, :] = -200.0
        s[0, 18] = 300.0                              # a hidden key of row 0 scores far above its visible ones
    whole, out = _out(5, 19)
    f(s, 0.5, out)
    return whole


def _w_lse(f):
    x = _padded(6, 37, scale=20.0)
    x = x.clone() if False else x
    x[:, 20] += 100.0                                 # the maximum grows in the second tile
    whole, out = _out(6)
    f(x, out)
    return whole


def _w_sws(f):
    s = _padded(18, 37, scale=20.0)
    s[:, 20] += 100.0
    vbuf = torch.full((40, 16), float("nan"))
    vbuf[:37] = torch.randn(37, 16, generator=_g)
    v = vbuf[:37]
    whole, out = _out(18, 16)
    f(s, v, out)
    return whole


def _w_sws_colmajor(f):
    s = _padded(18, 37, scale=3.0)
    v = torch.randn(16, 37, generator=_g).t()
    whole, out = _out(18, 16)
    f(s, v, out)
    return whole


WITNESS = {
    **{n.__name__: _w_scaled_add for n in WRONG["scaled_add"]},
    **{n.__name__: _w_block_max for n in WRONG["block_max"]},
    **{n.__name__: _w_affine for n in WRONG["affine_columns"]},
    "ac_out_with_x_stride": lambda f: _w_affine(f, col_major=False),
    **{n.__name__: _w_row_sums for n in WRONG["row_sums"]},
    **{n.__name__: _w_matmul for n in WRONG["matmul"]},
    "mm_fp16_acc": _w_matmul_long,
    **{n.__name__: (lambda f: f(20, 50, 37)) for n in WRONG["prediction"]},
    **{n.__name__: _w_causal for n in WRONG["causal_softmax"]},
    "cs_max_before_mask": lambda f: _w_causal(f, big=True),
    **{n.__name__: _w_lse for n in WRONG["row_logsumexp"]},
    **{n.__name__: _w_sws for n in WRONG["softmax_weighted_sum"]},
    "sws_v_row_contiguous": _w_sws_colmajor,
}


def _w_matmul_rect(f):
    """3 row tiles by 2 column tiles: a grid with its axes swapped leaves tiles of out unwritten."""
    a = torch.randn(40, 37, generator=_g).half()
    b = torch.randn(37, 18, generator=_g).half()
    whole, out = _out(40, 18)
    f(a, b, out)
    return whole


def _w_lse_low(f):
    """Scores near −30, 37 a row (a partial last tile), no single dominant term: a masked lane read as
    0 outweighs the row, l ≈ 37·e^−1 is far from 1 (log2 vs log shows) and fp16 rounds it."""
    x = _padded(6, 37, scale=1.0)
    x -= 30.0
    whole, out = _out(6)
    f(x, out)
    return whole


def _w_sws_low(f):
    """Scores near −30 and a partial last tile: a key past N scoring 0 takes all the weight."""
    s = _padded(18, 37, scale=2.0)
    s -= 30.0
    v = torch.randn(37, 16, generator=_g)
    whole, out = _out(18, 16)
    f(s, v, out)
    return whole


# Witnesses whose inputs can show these mistakes (those above agree with the solution on them).
WITNESS.update({"mm_grid_swapped": _w_matmul_rect, "lse_other_zero": _w_lse_low, "lse_log2": _w_lse_low,
                "lse_l_fp16": _w_lse_low, "sws_padded_keys_score_zero": _w_sws_low})


def _seeded(witness):
    """The witness on the same inputs every time it is called (the generator restarted): the wrong
    answer and the solution see the same inputs, so a difference is the answer's, not the draw's."""
    def run(f):
        _g.manual_seed(0)
        return witness(f)
    return run


WITNESS = {name: _seeded(w) for name, w in WITNESS.items()}
