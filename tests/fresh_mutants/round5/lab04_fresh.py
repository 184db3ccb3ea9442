# ruff: noqa: E501, B007, F841
"""Round 5 of fresh wrong answers for lab 04 (Triton puzzles), written from the lab's text and its
solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: a launch that returns a view of out or a tensor of its own, an output written with its row and
column roles swapped, tl.dot's operands in the other order (square tiles compile), a count in bytes where
elements are asked, a count that assumes a square product, a causal offset with its sign flipped, a block
width taken from the wrong tensor. The correct answers probe the other side: a finite `other=` that no float32
lies below, and an `other=0` that the causal mask hides anyway."""
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


# ---------------------------------------------------------------- bm_returns_scalar_view

def bm_returns_scalar_view(x, out):
    """Puzzle 2. The launch returns out[0] ('the maximum is one number'): a 0-d view of out where the lab asks
    for out itself."""
    block_max_kernel[(1,)](x, out, x.numel(), BLOCK=16)
    return out[0]


# ---------------------------------------------------------------- ac_out_index_swapped

@triton.jit
def affine_columns_kernel__ac_out_index_swapped(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
                                                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < N)
    bias = tl.load(bias_ptr + cols, mask=cols < N)
    tl.store(out_ptr + rows[:, None] + cols[None, :] * stride_om, x * scale[None, :] + bias[None, :], mask=mask)


def ac_out_index_swapped(x, scale, bias, out):
    """Puzzle 3. The store's address written rows + cols · stride_om ('the stride goes with the second
    index'): element (i, j) lands at out's (j, i) position, a transposed output (and past out's rows when
    N > M)."""
    M, N = x.shape
    grid = (triton.cdiv(M, 8), triton.cdiv(N, 16))
    affine_columns_kernel__ac_out_index_swapped[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                                                      BLOCK_M=8, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- rs_new_output

def rs_new_output(x, out):
    """Puzzle 4. The launch allocates its own output, out = torch.empty(M) ('a fresh tensor is safer'), fills
    and returns it: the right numbers, but the caller's out is never written."""
    M, N = x.shape
    out = torch.empty(M, dtype=x.dtype, device=x.device)
    row_sums_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- mm_dot_operands_swapped

@triton.jit
def matmul_kernel__mm_dot_operands_swapped(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                    mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(b, a)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mm_dot_operands_swapped(a, b, out):
    """Puzzle 5. acc += tl.dot(b, a) ('out = a · b, and b is loaded last'): the tiles are all 16 × 16, so the
    product of the tiles in the other order compiles and is wrong."""
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
    matmul_kernel__mm_dot_operands_swapped[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                                 out.stride(0), BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return out


# ---------------------------------------------------------------- prediction

def pl_bytes_not_elements(M, N, K):
    """Prediction. The loads counted in bytes, 2 per fp16 element ('lesson 2 counts bytes'): the lab asks for
    the number of elements."""
    tiles_m, tiles_n = triton.cdiv(M, 16), triton.cdiv(N, 16)
    return 2 * (M * K * tiles_n + K * N * tiles_m)


def pl_square_tiles(M, N, K):
    """Prediction. One tile count for both inputs, cdiv(M, 16) ('the grid is square'): right only when M and N
    give the same number of tiles."""
    tiles = triton.cdiv(M, 16)
    return M * K * tiles + K * N * tiles


# ---------------------------------------------------------------- cs_offset_sign_flipped

@triton.jit
def causal_softmax_kernel__cs_offset_sign_flipped(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=float("-inf"))
    s = tl.where(cols <= row + n_q - n_k, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def cs_offset_sign_flipped(s, scale, out):
    """Puzzle 6. The offset written row + Nq − Nk ('the later rows see more'): the same as the solution when
    Nq = Nk; with Nq < Nk the first rows see no key at all (0/0)."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__cs_offset_sign_flipped[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                                          BLOCK=triton.next_power_of_2(n_k))
    return out


# ---------------------------------------------------------------- sws_d_from_s

def sws_d_from_s(s, v, out):
    """Puzzle 8. The launch takes D = s.shape[1] ('the second dimension'): the number of keys where v's width
    belongs; a non-power-of-two N does not compile, a power of two reads and writes the wrong columns."""
    M, N = s.shape
    D = s.shape[1]
    softmax_weighted_sum_kernel[(triton.cdiv(M, 16),)](
        s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
        D=D, BLOCK_M=16, BLOCK_N=16)
    return out


# ---------------------------------------------------------------- correct alternatives

@triton.jit
def block_max_kernel__finite_other(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=-3.4028234663852886e38)
        m = tl.maximum(m, x)
    tl.store(out_ptr, tl.max(m, axis=0))


def block_max_finite_other(x, out):
    """Puzzle 2, correct: masked lanes read the most negative finite float32 (no float32 lies below it)."""
    block_max_kernel__finite_other[(1,)](x, out, x.numel(), BLOCK=16)
    return out


@triton.jit
def causal_softmax_kernel__other_zero(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    s = tl.load(s_ptr + row * stride_sm + cols * stride_sn, mask=cols < n_k, other=0.0)
    s = tl.where(cols <= row + n_k - n_q, s * scale, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=0))
    tl.store(out_ptr + row * stride_om + cols, p / tl.sum(p, axis=0), mask=cols < n_k)


def causal_softmax_other_zero(s, scale, out):
    """Puzzle 6, correct: the padding lanes load 0, but every lane past Nk − 1 lies beyond row + Nk − Nq, so
    the causal mask sets it to −∞ before the maximum."""
    n_q, n_k = s.shape
    if n_q > n_k:
        raise ValueError(f"s: needs Nq <= Nk, got Nq = {n_q}, Nk = {n_k}")
    causal_softmax_kernel__other_zero[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                                              BLOCK=triton.next_power_of_2(n_k))
    return out


SOLUTION = {"scaled_add": scaled_add, "block_max": block_max, "affine_columns": affine_columns, "row_sums": row_sums,
            "matmul": matmul, "prediction": predicted_matmul_loads, "causal_softmax": causal_softmax,
            "row_logsumexp": row_logsumexp, "softmax_weighted_sum": softmax_weighted_sum}
WRONG = {
    "block_max": [bm_returns_scalar_view],
    "affine_columns": [ac_out_index_swapped],
    "row_sums": [rs_new_output],
    "matmul": [mm_dot_operands_swapped],
    "prediction": [pl_bytes_not_elements, pl_square_tiles],
    "causal_softmax": [cs_offset_sign_flipped],
    "softmax_weighted_sum": [sws_d_from_s],
}
CORRECT = {"block_max": [block_max, block_max_finite_other],
           "causal_softmax": [causal_softmax, causal_softmax_other_zero]}

_g = torch.Generator().manual_seed(5)


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


def _w_block_max(f):
    x = torch.randn(41, generator=_g) - 5.0
    return f(x, torch.full((1,), -777.0))


def _w_affine(f):
    x = _strided(6, 20)
    scale, bias = torch.randn(20, generator=_g), torch.randn(20, generator=_g)
    buf, out = _padded_out(6, 20)
    f(x, scale, bias, out)
    return buf


def _w_row_sums(f):
    x = _strided(7, 37)
    out = torch.full((7,), -777.0)
    got = f(x, out)
    return [got, out]


def _w_matmul(f):
    a = torch.randn(20, 37, generator=_g).half()
    b = torch.randn(37, 18, generator=_g).half()
    return f(a, b, torch.full((20, 18), -777.0))


def _w_causal(f):
    s = _strided(5, 19, scale=3.0)
    return f(s, 0.7, torch.full((5, 19), -777.0))


def _w_sws(f):
    s = _strided(18, 32, scale=4.0)
    vbuf = torch.randn(34, 40, generator=_g)
    v = vbuf[:32, :16]
    buf, out = _padded_out(18, 16)
    f(s, v, out)
    return buf


def _seeded(witness):
    """The witness on the same inputs every time it is called (the generator restarted)."""
    def run(f):
        _g.manual_seed(5)
        return witness(f)
    return run


WITNESS = {
    "bm_returns_scalar_view": _w_block_max,
    "ac_out_index_swapped": _w_affine,
    "rs_new_output": _w_row_sums,
    "mm_dot_operands_swapped": _w_matmul,
    "pl_bytes_not_elements": lambda f: f(20, 50, 37),
    "pl_square_tiles": lambda f: f(20, 50, 37),
    "cs_offset_sign_flipped": _w_causal,
    "sws_d_from_s": _w_sws,
}
WITNESS = {name: _seeded(w) for name, w in WITNESS.items()}
