"""Lab 04's checks (Triton puzzles in the interpreter): every plausible wrong kernel is rejected on every
one of 10 seeds, and already by a fixed case (so the seed cannot save it); other correct kernels are
accepted; the solution passes, the blank lab reports "not implemented yet", and calls into PyTorch's
softmax or matrix products, or into attnkit's kernels, are refused.

Each puzzle's wrong answers are one kernel with a ``BUG`` switch (0 = correct; negative = another
correct way of writing it), so the whole catalogue shares one interpreted function per puzzle."""
import functools
import linecache
import re

import nbformat
import pytest
import torch
from mutation import FEW_SEEDS, assert_accepted, assert_rejected_on_every_seed

from attnkit.classroom import checking
from attnkit.classroom.checking import NOT_IMPLEMENTED, PASSED
from attnkit.classroom.labchecks import lab04
from attnkit.classroom.notebooks import ROOT
from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SOLUTION, LAB = "solutions/lab04_triton_primer.ipynb", "labs/lab04_triton_primer.ipynb"
ACCEPT_SEEDS = FEW_SEEDS[:3]      # correct kernels: the fixed cases plus three seeds' random ones


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """The checks run here, not in a child process: the interpreter's work on a kernel is kept between
    seeds (a child starts it afresh each time); the crash test switches the child process back on."""
    monkeypatch.setattr(checking, "ISOLATE", False)
NEG_INF = float("-inf")
F32_LOWEST = -3.4028234663852886e38            # float32's lowest finite value: a start or other= below all data


def _namespace(relpath: str) -> dict:
    """The notebook's code cells, except the setup cell and the check cells, run in a fresh namespace."""
    nb = nbformat.read(ROOT / relpath, as_version=4)
    namespace: dict = {}
    for index, source in enumerate([c.source for c in nb.cells if c.cell_type == "code"][1:]):
        if "lab04.check" in source:
            continue
        filename = f"<{relpath} cell {index + 1}>"        # Triton reads a kernel's source via inspect
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


# ------------------------------------------------------------------------------ 1: scaled_add
@triton.jit
def _scaled_add(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr, BUG: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    if BUG == 4:
        offs = pid + tl.arange(0, BLOCK)                       # forgot · BLOCK
    mask = offs < n
    if BUG == 3:
        mask = offs <= n
    if BUG == 9:
        mask = offs < n - 1
    if BUG == 1 or BUG == 10:
        x = tl.load(x_ptr + offs)
        y = tl.load(y_ptr + offs)
    elif BUG == -1:
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    else:
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
    res = alpha * x + y
    if BUG == 11:                                  # alpha rounded to float16 in the kernel
        res = alpha.to(tl.float16).to(tl.float32) * x + y
    if BUG == 12:                                  # alpha rounded to bfloat16 in the kernel
        res = alpha.to(tl.bfloat16).to(tl.float32) * x + y
    if BUG == 5:
        res = alpha * (x + y)
    if BUG == 6:
        res = x + alpha * y
    if BUG == 1 or BUG == 2:
        tl.store(out_ptr + offs, res)
    elif BUG == 7:
        tl.store(out_ptr + offs, res, mask=offs < BLOCK)
    elif BUG == 8:
        tl.store(out_ptr + pid * BLOCK, tl.sum(tl.where(mask, res, 0.0), axis=0) / BLOCK)
    elif BUG == -1:
        tl.store(out_ptr + offs, tl.where(mask, res, 0.0), mask=mask)
    else:
        tl.store(out_ptr + offs, res, mask=mask)


def scaled_add(x, y, alpha, out, bug=0, block=16):
    n = x.numel()
    if bug == 13:                                  # round 6's sa_alpha_fp16: rounded before the launch
        alpha = float(torch.tensor(alpha, dtype=torch.float16))
    if bug == 14:                                  # 'two decimals are plenty'
        alpha = round(alpha, 2)
    _scaled_add[(triton.cdiv(n, block),)](x, y, out, n, alpha, BLOCK=block, BUG=bug)
    return out


SCALED_ADD_WRONG = {"no masks": 1, "store without a mask": 2, "mask offsets <= n": 3, "offsets without ·BLOCK": 4,
                    "alpha·(x + y)": 5, "x + alpha·y": 6, "store mask offsets < BLOCK": 7,
                    "one value per program": 8, "mask offsets < n − 1": 9, "loads without a mask": 10,
                    # scalars whose precision the cases must see (lab04.ALPHAS)
                    "alpha in float16 in the kernel": 11, "alpha in bfloat16 in the kernel": 12,
                    "alpha rounded to float16 before the launch": 13, "alpha rounded to 2 decimals": 14}
SCALED_ADD_RIGHT = {"other=0 and tl.where": dict(bug=-1), "blocks of 64": dict(block=64)}


# ------------------------------------------------------------------------------- 2: block_max
@triton.jit
def _block_max(x_ptr, out_ptr, n, BLOCK: tl.constexpr, BUG: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    m = tl.full([BLOCK], NEG_INF, tl.float32)
    if BUG == 5:
        m = tl.zeros([BLOCK], tl.float32)
    if BUG == 13:
        m = tl.full([BLOCK], -1.0e38, tl.float32)
    if BUG == -2:
        m = tl.full([BLOCK], F32_LOWEST, tl.float32)
    best = tl.max(m, axis=0)
    stop = n
    if BUG == 3:
        stop = n - BLOCK
    if BUG == 4:
        stop = n // BLOCK * BLOCK
    first = 0
    if BUG == 9:
        first = BLOCK
    for start in range(first, stop, BLOCK):
        if BUG == 1:
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=0.0)
        elif BUG == 10:
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=-1000.0)
        elif BUG == 11:
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=-1.0e9)
        elif BUG == 12:
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=-3.0e38)
        elif BUG == -2:
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=F32_LOWEST)
        elif BUG == 2:
            x = tl.load(x_ptr + start + lanes)
        else:
            x = tl.load(x_ptr + start + lanes, mask=start + lanes < n, other=NEG_INF)
        if BUG == 6:
            m = x
        elif BUG == 8:
            m = tl.minimum(m, x)
        elif BUG == -1:
            best = tl.maximum(best, tl.max(x, axis=0))
        else:
            m = tl.maximum(m, x)
    if BUG == 7:
        tl.store(out_ptr, tl.sum(tl.where(m > NEG_INF, m, 0.0), axis=0))
    elif BUG == -1:
        tl.store(out_ptr, best)
    else:
        tl.store(out_ptr, tl.max(m, axis=0))


def block_max(x, out, bug=0, block=16):
    _block_max[(1,)](x, out, x.numel(), BLOCK=block, BUG=bug)
    return out


BLOCK_MAX_WRONG = {"other=0.0": 1, "no mask": 2, "range(0, n − BLOCK)": 3, "tail block skipped": 4,
                   "running max starts at 0": 5, "running max replaced, not combined": 6,
                   "sum instead of max": 7, "tl.minimum": 8, "first block skipped": 9, "other=−1000": 10,
                   "other=−10⁹": 11, "other=−3·10³⁸": 12, "running max starts at −10³⁸": 13}
BLOCK_MAX_RIGHT = {"scalar running max": dict(bug=-1), "blocks of 64": dict(block=64),
                   "start and other= float32's lowest": dict(bug=-2)}


# --------------------------------------------------------------------------- 3: affine_columns
@triton.jit
def _affine(x_ptr, scale_ptr, bias_ptr, out_ptr, M, N, stride_xm, stride_xn, stride_om,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if BUG == 6:
        pid_m, pid_n = tl.program_id(1), tl.program_id(0)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if BUG == 3:
        mask = (cols[None, :] < N) & (rows[:, None] >= 0)
    if BUG == 4:
        mask = (rows[:, None] < M) & (cols[None, :] >= 0)
    if BUG == 7:
        mask = (rows[:, None] <= M) & (cols[None, :] <= N)
    row_stride = stride_xm
    if BUG == 2:
        row_stride = N
    col_stride = stride_xn
    if BUG == 10:
        col_stride = 1
    x = tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :] * col_stride, mask=mask)
    if BUG == 1:
        scale = tl.load(scale_ptr + rows, mask=rows < N)
        bias = tl.load(bias_ptr + rows, mask=rows < N)
        res = x * scale[:, None] + bias[:, None]
    else:
        if BUG == 8:
            scale = tl.load(scale_ptr + cols)
        else:
            scale = tl.load(scale_ptr + cols, mask=cols < N)
        bias = tl.load(bias_ptr + cols, mask=cols < N)
        res = x * scale[None, :] + bias[None, :]
        if BUG == 5:
            res = (x + bias[None, :]) * scale[None, :]
    out_stride = stride_om
    if BUG == 9:
        out_stride = stride_xm
    if BUG == 11:                                  # out taken as contiguous: its row stride read as N
        out_stride = N
    if BUG == -1:
        tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], tl.where(mask, res, 0.0), mask=mask)
    else:
        tl.store(out_ptr + rows[:, None] * out_stride + cols[None, :], res, mask=mask)


def affine_columns(x, scale, bias, out, bug=0, block_m=8, block_n=16):
    M, N = x.shape
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    _affine[grid](x, scale, bias, out, M, N, x.stride(0), x.stride(1), out.stride(0),
                  BLOCK_M=block_m, BLOCK_N=block_n, BUG=bug)
    return out


AFFINE_WRONG = {"scale and bias by row": 1, "row stride taken as N": 2, "column mask only": 3,
                "row mask only": 4, "(x + bias)·scale": 5, "program ids swapped": 6, "masks with <=": 7,
                "scale loaded without a mask": 8, "out addressed with x's stride": 9, "column stride ignored": 10,
                "out stored as if contiguous (row stride N)": 11}
AFFINE_RIGHT = {"tl.where before the store": dict(bug=-1), "16 × 8 tiles": dict(block_m=16, block_n=8)}


# -------------------------------------------------------------------------------- 4: row_sums
@triton.jit
def _row_sums(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BUG: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M], tl.float32)
    tile_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    stop = N
    if BUG == 1:
        stop = N - BLOCK_N
    if BUG == 2:
        stop = N // BLOCK_N * BLOCK_N
    first = 0
    if BUG == 9:
        first = BLOCK_N
    row_stride, col_stride = stride_xm, stride_xn
    if BUG == 7:
        row_stride = N
    if BUG == 8:
        row_stride, col_stride = stride_xn, stride_xm
    if BUG == 10:
        col_stride = 1
    for start in range(first, stop, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        if BUG == 3:
            mask = (rows[:, None] < M) & (cols[None, :] >= 0)
        if BUG == 11:
            tile = tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :] * col_stride, mask=mask)
        else:
            tile = tl.load(x_ptr + rows[:, None] * row_stride + cols[None, :] * col_stride, mask=mask, other=0.0)
        if BUG == 5:
            acc = tl.sum(tile, axis=1)
        elif BUG == 6:
            acc += tl.sum(tile, axis=0)
        elif BUG == -1:
            tile_acc += tile
        else:
            acc += tl.sum(tile, axis=1)
    if BUG == -1:
        acc = tl.sum(tile_acc, axis=1)
    if BUG == 4:
        tl.store(out_ptr + rows, acc)
    else:
        tl.store(out_ptr + rows, acc, mask=rows < M)


def row_sums(x, out, bug=0, block_m=4, block_n=16):
    M, N = x.shape
    _row_sums[(triton.cdiv(M, block_m),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=block_m,
                                          BLOCK_N=block_n, BUG=bug)
    return out


ROW_SUMS_WRONG = {"range(0, N − BLOCK_N)": 1, "partial last tile skipped": 2, "no column mask": 3,
                  "store without the row mask": 4, "accumulator overwritten": 5, "sum over axis 0": 6,
                  "row stride taken as N": 7, "strides swapped": 8, "first tile skipped": 9,
                  "column stride ignored": 10, "masked load without other=": 11}
ROW_SUMS_RIGHT = {"2-D accumulator, one sum at the end": dict(bug=-1), "2 × 32 tiles": dict(block_m=2, block_n=32)}


# ---------------------------------------------------------------------------------- 5: matmul
@triton.jit
def _matmul(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BUG: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    stop = K
    if BUG == 3:
        stop = K - BLOCK_K
    am, ak = stride_am, stride_ak
    if BUG == 4:
        am, ak = stride_ak, stride_am
    if BUG == 10:
        ak = 1
    bk, bn = stride_bk, stride_bn
    if BUG == 5:
        bk, bn = N, 1
    for start in range(0, stop, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        a_mask = (rows[:, None] < M) & (ks[None, :] < K)
        b_mask = (ks[:, None] < K) & (cols[None, :] < N)
        if BUG == 1:
            a_mask = (rows[:, None] < M) & (ks[None, :] >= 0)
            b_mask = (ks[:, None] >= 0) & (cols[None, :] < N)
        if BUG == 9:
            b_mask = (ks[:, None] >= 0) & (cols[None, :] < N)
        a = tl.load(a_ptr + rows[:, None] * am + ks[None, :] * ak, mask=a_mask, other=0.0)
        b = tl.load(b_ptr + ks[:, None] * bk + cols[None, :] * bn, mask=b_mask, other=0.0)
        if BUG == 2:
            acc = tl.dot(a, b)
        elif BUG == 7:
            acc = (acc + tl.dot(a, b)).to(tl.float16).to(tl.float32)
        elif BUG == 8:
            acc += tl.dot(b, a)
        else:
            acc += tl.dot(a, b)
    out_mask = (rows[:, None] < M) & (cols[None, :] < N)
    om = stride_om
    if BUG == 11:                                  # out taken as contiguous
        om = N
    if BUG == 12:                                  # out addressed with a's row stride
        om = stride_am
    if BUG == 6:
        tl.store(out_ptr + rows[:, None] * om + cols[None, :], acc)
    else:
        tl.store(out_ptr + rows[:, None] * om + cols[None, :], acc, mask=out_mask)


@triton.jit
def _matmul_pointers(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BUG: tl.constexpr):
    """Another correct way: advance the tiles' pointers by BLOCK_K each step (the Triton tutorial's)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak
    b_ptrs = b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - step * BLOCK_K
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(ks[:, None] < left) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a, b, out, bug=0, blocks=(16, 16, 16), kernel=_matmul):
    M, K = a.shape
    N = b.shape[1]
    grid = (triton.cdiv(M, blocks[0]), triton.cdiv(N, blocks[1]))
    kernel[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                 BLOCK_M=blocks[0], BLOCK_N=blocks[1], BLOCK_K=blocks[2], BUG=bug)
    return out


MATMUL_WRONG = {"a's column stride ignored": 10, "no mask along k": 1, "accumulator overwritten": 2,
                "last k tile skipped": 3,
                "a's strides swapped": 4, "b taken as row-major": 5, "store without a mask": 6,
                "accumulator rounded to fp16": 7, "tl.dot(b, a)": 8, "b not masked along k": 9,
                "out stored as if contiguous (row stride N)": 11, "out addressed with a's row stride": 12}
MATMUL_RIGHT = {"pointers advanced per step": dict(kernel=_matmul_pointers),
                "32 × 16 × 32 tiles": dict(blocks=(32, 16, 32))}


# -------------------------------------------------------------------------- 6: causal_softmax
@triton.jit
def _causal(s_ptr, out_ptr, n_q, n_k, scale, stride_sm, stride_sn, stride_om, BLOCK: tl.constexpr,
            BUG: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    row_stride = stride_sm
    if BUG == 7:
        row_stride = n_k
    col_stride = stride_sn
    if BUG == 10:
        col_stride = 1
    raw = tl.load(s_ptr + row * row_stride + cols * col_stride, mask=cols < n_k, other=NEG_INF)
    visible = cols <= row + n_k - n_q
    if BUG == 2:
        visible = cols <= row
    if BUG == 3:
        visible = cols < row + n_k - n_q
    if BUG == 9:
        visible = cols <= row + n_q - n_k
    scaled = raw * scale
    if BUG == 4:
        scaled = raw
    if BUG == 15:                                  # the scale rounded to float16
        scaled = raw * scale.to(tl.float16).to(tl.float32)
    if BUG == 5:
        s = tl.where(visible & (cols < n_k), scaled, 0.0)
    elif BUG == 16:
        s = tl.where(visible, scaled, -1.0e4)
    elif BUG == 17:
        s = tl.where(visible, scaled, -1.0e8)
    elif BUG == -4:
        s = tl.where(visible, scaled, F32_LOWEST)
    else:
        s = tl.where(visible, scaled, NEG_INF)
    if BUG == 1:
        p = tl.exp(s)
    elif BUG == 6:
        p = tl.exp(s - tl.max(tl.where(visible, raw, NEG_INF), axis=0))
    elif BUG == 12:                                # the row maximum taken before the mask
        p = tl.exp(s - tl.max(scaled, axis=0))
    elif BUG == -1:
        p = tl.exp2((s - tl.max(s, axis=0)) * 1.4426950408889634)
    elif BUG == 11:
        p = tl.exp2((s - tl.max(s, axis=0)) * 1.44)
    elif BUG == -2:
        keep = visible & (cols < n_k)
        top = tl.max(tl.where(keep, scaled, NEG_INF), axis=0)
        p = tl.where(keep, tl.exp(scaled - top), 0.0)
    elif BUG == -3:                                # masked unscaled, shifted, then scaled: right for scale > 0
        hidden = tl.where(visible, raw, NEG_INF)
        p = tl.exp(scale * (hidden - tl.max(hidden, axis=0)))
    else:
        p = tl.exp(s - tl.max(s, axis=0))
    y = p / tl.sum(p, axis=0)
    om = stride_om
    if BUG == 13:                                  # out taken as contiguous
        om = n_k
    if BUG == 14:                                  # out addressed with s's row stride
        om = stride_sm
    if BUG == 8:
        tl.store(out_ptr + row * om + cols, y)
    else:
        tl.store(out_ptr + row * om + cols, y, mask=cols < n_k)


def causal_softmax(s, scale, out, bug=0):
    n_q, n_k = s.shape
    _causal[(n_q,)](s, out, n_q, n_k, scale, s.stride(0), s.stride(1), out.stride(0),
                    BLOCK=triton.next_power_of_2(n_k), BUG=bug)
    return out


CAUSAL_WRONG = {"no row maximum": 1, "mask aligned to the start (j <= i)": 2, "strict mask": 3,
                "scale forgotten": 4, "hidden scores set to 0": 5, "maximum of the unscaled scores": 6,
                "row stride taken as Nk": 7, "store without a mask": 8, "offset Nq − Nk": 9,
                "column stride ignored": 10, "exp2 with log2(e) cut to 1.44": 11,
                "row maximum taken before the mask": 12, "out stored as if contiguous (row stride Nk)": 13,
                "out addressed with s's row stride": 14, "scale rounded to float16": 15,
                "hidden keys set to −10⁴": 16, "hidden keys set to −10⁸": 17}
CAUSAL_RIGHT = {"exp2 with log2(e)": dict(bug=-1), "one combined mask": dict(bug=-2),
                # The lab states scale > 0, where max(scale·s) = scale·max(s) (round 4's cs_scale_after_shift).
                "shifted by the unscaled maximum, scaled after": dict(bug=-3),
                "hidden keys set to float32's lowest": dict(bug=-4)}


# --------------------------------------------------------------------------- 7: row_logsumexp
@triton.jit
def _lse(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         BUG: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], NEG_INF, tl.float32)
    if BUG == 4:
        m = tl.zeros([BLOCK_M], tl.float32)
    if BUG == 13:
        m = tl.full([BLOCK_M], -1.0e4, tl.float32)
    if BUG == -3:
        m = tl.full([BLOCK_M], F32_LOWEST, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    m_lanes = tl.full([BLOCK_M, BLOCK_N], NEG_INF, tl.float32)
    l_lanes = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if BUG == 1:                                   # two passes: the maximum first, then the sum
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=NEG_INF)
            m = tl.maximum(m, tl.max(x, axis=1))
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        other = NEG_INF
        if BUG == 5:
            other = 0.0
        if BUG == 14:
            other = -1.0e8
        if BUG == -3:
            other = F32_LOWEST
        col_stride = stride_xn
        if BUG == 10:
            col_stride = 1
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * col_stride, mask=mask, other=other)
        if BUG == 1:
            l += tl.sum(tl.exp(x - m[:, None]), axis=1)
        elif BUG == 6:
            l += tl.sum(tl.exp(x), axis=1)
        elif BUG == -1:
            m_new_lanes = tl.maximum(m_lanes, x)
            seen = m_new_lanes > NEG_INF                     # lanes that have met a real score
            l_lanes = tl.where(seen, l_lanes * tl.exp(m_lanes - m_new_lanes) + tl.exp(x - m_new_lanes), 0.0)
            m_lanes = m_new_lanes
        else:
            m_new = tl.maximum(m, tl.max(x, axis=1))
            if BUG == 11:                          # round 6's lse_rescale_from_tile_max
                m_new = tl.max(x, axis=1)
            if BUG == 12:                          # the first tile's maximum kept for the whole row
                m_new = tl.where(m == NEG_INF, tl.max(x, axis=1), m)
            if BUG == 2:
                l = l + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
            elif BUG == 3:
                l = l * tl.exp(m_new - m) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
            elif BUG == 9:
                l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - tl.max(x, axis=1)[:, None]), axis=1)
            elif BUG == -2:
                log2e = 1.4426950408889634
                l = l * tl.exp2((m - m_new) * log2e) + tl.sum(tl.exp2((x - m_new[:, None]) * log2e), axis=1)
            else:
                l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
            m = m_new
    if BUG == -1:
        m = tl.max(m_lanes, axis=1)
        l = tl.sum(tl.where(m_lanes > NEG_INF, l_lanes * tl.exp(m_lanes - m[:, None]), 0.0), axis=1)
    res = m + tl.log(l)
    if BUG == 6:
        res = tl.log(l)
    if BUG == 7:
        res = m + l
    if BUG == 8:
        res = tl.log(l)
    tl.store(out_ptr + rows, res, mask=rows < M)


def row_logsumexp(x, out, bug=0):
    M, N = x.shape
    _lse[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16, BUG=bug)
    return out


LSE_WRONG = {"two passes (maximum, then sum)": 1, "l not rescaled": 2, "rescaled by exp(m_new − m)": 3,
             "running maximum starts at 0": 4, "masked lanes read 0": 5, "no maximum at all": 6,
             "m + l, no log": 7, "log(l) without m": 8, "each tile against its own maximum": 9,
             "column stride ignored": 10, "rescaled from the tile's own maximum": 11,
             "the first tile's maximum kept": 12, "running maximum starts at −10⁴": 13, "masked lanes read −10⁸": 14}
LSE_RIGHT = {"per-lane running state, combined at the end": dict(bug=-1), "exp2 and log2(e)": dict(bug=-2),
             "start and other= float32's lowest": dict(bug=-3)}


# --------------------------------------------------------------------- 8: softmax_weighted_sum
@triton.jit
def _wsum(s_ptr, v_ptr, out_ptr, M, N, stride_sm, stride_sn, stride_vn, stride_vd, stride_om,
          D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    m = tl.full([BLOCK_M], NEG_INF, tl.float32)
    if BUG == 17:                                  # round 6's sws_max_starts_at_minus_1e4
        m = tl.full([BLOCK_M], -1.0e4, tl.float32)
    if BUG == -2:
        m = tl.full([BLOCK_M], F32_LOWEST, tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if BUG == 4:                                   # two passes: the maximum first
        for start in range(0, N, BLOCK_N):
            keys = start + tl.arange(0, BLOCK_N)
            s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * stride_sn,
                        mask=(rows[:, None] < M) & (keys[None, :] < N), other=NEG_INF)
            m = tl.maximum(m, tl.max(s, axis=1))
    for start in range(0, N, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        other = NEG_INF
        if BUG == 5:
            other = 0.0
        if BUG == 18:
            other = -1.0e8
        if BUG == -2:
            other = F32_LOWEST
        sn, vd = stride_sn, stride_vd
        if BUG == 10:
            sn = 1
        if BUG == 11:
            vd = 1
        s = tl.load(s_ptr + rows[:, None] * stride_sm + keys[None, :] * sn,
                    mask=(rows[:, None] < M) & (keys[None, :] < N), other=other)
        if BUG == 6:
            v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * vd)
        else:
            v = tl.load(v_ptr + keys[:, None] * stride_vn + dims[None, :] * vd, mask=keys[:, None] < N,
                        other=0.0)
        if BUG == 4:
            p = tl.exp(s - m[:, None])
            l += tl.sum(p, axis=1)
            acc += tl.dot(p, v)
        else:
            m_new = tl.maximum(m, tl.max(s, axis=1))
            if BUG == 19:                          # rescaled from the tile's own maximum
                m_new = tl.max(s, axis=1)
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            if BUG == 7:
                p = tl.exp(s - m[:, None])
            if BUG == -1 or BUG == 12:
                log2e = 1.4426950408889634 if BUG == -1 else 1.44
                alpha = tl.exp2((m - m_new) * log2e)
                p = tl.exp2((s - m_new[:, None]) * log2e)
            if BUG == 2:
                l = l + tl.sum(p, axis=1)
            else:
                l = l * alpha + tl.sum(p, axis=1)
            if BUG == 13:                          # p and v in float16 for the product
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v.to(tl.float16)).to(tl.float32)
            elif BUG == 14:                        # p rounded to float16, v kept in float32
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16).to(tl.float32), v)
            elif BUG == 1:
                acc = acc + tl.dot(p, v)
            elif BUG == 9:
                acc = acc + tl.dot(p, v) * alpha[:, None]
            else:
                acc = acc * alpha[:, None] + tl.dot(p, v)
            if BUG == 3:
                acc = acc / l[:, None]
            m = m_new
    res = acc / l[:, None]
    if BUG == 8 or BUG == 3:
        res = acc
    om = stride_om
    if BUG == 15:                                  # out taken as contiguous
        om = D
    if BUG == 16:                                  # out addressed with s's row stride
        om = stride_sm
    tl.store(out_ptr + rows[:, None] * om + dims[None, :], res, mask=rows[:, None] < M)


def softmax_weighted_sum(s, v, out, bug=0, block_n=16):
    M, N = s.shape
    _wsum[(triton.cdiv(M, 16),)](s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1),
                                 out.stride(0), D=v.shape[1], BLOCK_M=16, BLOCK_N=block_n, BUG=bug)
    return out


WSUM_WRONG = {"acc not rescaled": 1, "l not rescaled": 2, "normalised after every tile": 3,
              "two passes (maximum, then sums)": 4, "masked scores read 0": 5, "v not masked past N": 6,
              "p against the old maximum": 7, "no final division": 8, "alpha on the new tile": 9,
              "s's column stride ignored": 10, "v's column stride ignored": 11, "exp2 with log2(e) cut to 1.44": 12,
              "p and v cast to float16 for tl.dot": 13, "p rounded to float16": 14,
              "out stored as if contiguous (row stride D)": 15, "out addressed with s's row stride": 16,
              "running maximum starts at −10⁴": 17, "masked scores read −10⁸": 18,
              "rescaled from the tile's own maximum": 19}
WSUM_RIGHT = {"exp2 and log2(e)": dict(bug=-1), "tiles of 32 keys": dict(block_n=32),
              "start and other= float32's lowest": dict(bug=-2)}


# ------------------------------------------------------------------------------------ catalogue
CATALOGUE = {  # exercise: (check, launcher, wrong, right, number of fixed cases)
    "scaled_add": (lab04.check_scaled_add, scaled_add, SCALED_ADD_WRONG, SCALED_ADD_RIGHT, 4),
    "block_max": (lab04.check_block_max, block_max, BLOCK_MAX_WRONG, BLOCK_MAX_RIGHT, 6),
    "affine_columns": (lab04.check_affine_columns, affine_columns, AFFINE_WRONG, AFFINE_RIGHT, 6),
    "row_sums": (lab04.check_row_sums, row_sums, ROW_SUMS_WRONG, ROW_SUMS_RIGHT, 6),
    "matmul": (lab04.check_matmul, matmul, MATMUL_WRONG, MATMUL_RIGHT, 5),
    "causal_softmax": (lab04.check_causal_softmax, causal_softmax, CAUSAL_WRONG, CAUSAL_RIGHT, 7),
    "row_logsumexp": (lab04.check_row_logsumexp, row_logsumexp, LSE_WRONG, LSE_RIGHT, 9),
    "softmax_weighted_sum": (lab04.check_softmax_weighted_sum, softmax_weighted_sum, WSUM_WRONG, WSUM_RIGHT, 12),
}


def _named(launcher, name, **kwargs):
    fn = functools.partial(launcher, **kwargs)
    fn.__name__ = name
    return fn


def _wrong_params():
    return [pytest.param(check, _named(launcher, name, bug=bug), fixed, id=f"{exercise}: {name}")
            for exercise, (check, launcher, wrong, _, fixed) in CATALOGUE.items() for name, bug in wrong.items()]


def _right_params():
    return [pytest.param(check, _named(launcher, name, **kwargs), id=f"{exercise}: {name}")
            for exercise, (check, launcher, _, right, _) in CATALOGUE.items() for name, kwargs in right.items()]


@pytest.mark.parametrize(("check", "mutant", "fixed"), _wrong_params())
def test_wrong_kernel_rejected_by_a_fixed_case_on_every_seed(check, mutant, fixed):
    assert_rejected_on_every_seed(check, mutant, FEW_SEEDS)
    report = check(mutant, seed=0).report
    case = re.search(r"case (\d+) of", report)
    assert case and int(case.group(1)) <= fixed, f"rejected only by a random case:\n{report}"


@pytest.mark.parametrize(("check", "correct"), _right_params())
def test_other_correct_kernel_accepted(check, correct):
    assert_accepted(check, correct, ACCEPT_SEEDS)


# ----------------------------------------------------------------------------- the prediction
def _cdiv(a, b):
    return -(-a // b)


def _loads_by_program(M, N, K):
    total = 0
    for i in range(_cdiv(M, 16)):
        for j in range(_cdiv(N, 16)):                  # one program per tile of out
            rows, cols = min(16, M - 16 * i), min(16, N - 16 * j)
            total += rows * K + K * cols                # its rows of a, its columns of b
    return total


PREDICTION_WRONG = {
    "read once": lambda M, N, K: M * K + K * N,
    "masked lanes counted": lambda M, N, K: _cdiv(M, 16) * _cdiv(N, 16) * 2 * 16 * 16 * _cdiv(K, 16),
    "re-read factors swapped": lambda M, N, K: M * K * _cdiv(M, 16) + K * N * _cdiv(N, 16),
    "bytes, not elements": lambda M, N, K: 2 * (M * K * _cdiv(N, 16) + K * N * _cdiv(M, 16)),
    "a only": lambda M, N, K: M * K * _cdiv(N, 16),
    "floor instead of ceiling": lambda M, N, K: M * K * max(N // 16, 1) + K * N * max(M // 16, 1),
    "out counted too": lambda M, N, K: M * K * _cdiv(N, 16) + K * N * _cdiv(M, 16) + M * N,
    "K padded to the tile": lambda M, N, K: (M * _cdiv(N, 16) + N * _cdiv(M, 16)) * 16 * _cdiv(K, 16),
    "one tile per program, whatever K": lambda M, N, K: _cdiv(M, 16) * _cdiv(N, 16) * 2 * 16 * 16,
}
PREDICTION_RIGHT = {"sum over programs": _loads_by_program,
                    "closed form": lambda M, N, K: K * (M * triton.cdiv(N, 16) + N * triton.cdiv(M, 16))}


@pytest.mark.parametrize("mutant", [pytest.param(fn, id=name) for name, fn in PREDICTION_WRONG.items()])
def test_wrong_prediction_rejected_on_every_seed(mutant):
    assert_rejected_on_every_seed(lab04.check_prediction, mutant, FEW_SEEDS)
    first_line = lab04.check_prediction(mutant, seed=0).report.splitlines()[0]
    fixed = [(40, 48, 40), (17, 33, 40), (16, 16, 16), (1, 100, 20)]
    assert any(f"M={m}, N={n}, K={k}:" in first_line for m, n, k in fixed), first_line


@pytest.mark.parametrize("correct", [pytest.param(fn, id=name) for name, fn in PREDICTION_RIGHT.items()])
def test_right_prediction_accepted(correct):
    assert_accepted(lab04.check_prediction, correct, FEW_SEEDS)


def test_loads_are_counted_in_the_interpreter():
    assert lab04.counted_matmul_loads(40, 48, 40) == _loads_by_program(40, 48, 40) == 10560
    assert lab04.counted_matmul_loads(1, 100, 20) == 1 * 20 * 7 + 20 * 100      # a read by 7 column tiles


def test_catalogue_covers_every_puzzle():
    assert [e.function for e in lab04.EXERCISES if e.function != "predicted_matmul_loads"] == list(CATALOGUE)
    for exercise, (_, _, wrong, right, _) in CATALOGUE.items():
        assert len(wrong) >= 8 and len(right) >= 2, exercise
    assert len(PREDICTION_WRONG) >= 8 and len(PREDICTION_RIGHT) >= 2


def test_solution_passes_and_blank_is_not_implemented():
    solved, blank = _namespace(SOLUTION), _namespace(LAB)
    names = [e.function for e in lab04.EXERCISES]
    summary = lab04.check_lab(seed=11, **{n: solved[n] for n in names})
    assert summary.passed, summary
    summary = lab04.check_lab(seed=11, **{n: blank[n] for n in names})
    assert [r.status for r in summary.results] == [NOT_IMPLEMENTED] * len(names), summary


def test_library_calls_are_refused():
    from attnkit.kernels.softmax import softmax as course_softmax

    def torch_softmax(s, scale, out):
        out.copy_(torch.softmax(s * scale, dim=-1))
        return out

    def course_kernel(s, scale, out):
        out.copy_(course_softmax(s * scale))
        return out

    def torch_matmul(a, b, out):
        out.copy_((a @ b).float())
        return out

    for check, fn, name in ((lab04.check_causal_softmax, torch_softmax, "torch.softmax"),
                            (lab04.check_causal_softmax, course_kernel, "attnkit.kernels.softmax.softmax"),
                            (lab04.check_matmul, torch_matmul, "torch.Tensor.__matmul__")):
        result = check(fn, seed=0)
        assert not result.passed and f"calls {name}" in result.report, result.report
    assert lab04.check_causal_softmax(causal_softmax, seed=0).status == PASSED     # restored afterwards
    assert torch.softmax(torch.zeros(2), 0).tolist() == [0.5, 0.5]


def test_a_result_computed_outside_the_kernel_is_refused():
    def torch_add(x, y, alpha, out):
        out.copy_(alpha * x + y)
        return out

    result = lab04.check_scaled_add(torch_add, seed=0)
    assert not result.passed and "not written by your kernel" in result.report


def test_prediction_may_not_call_the_counter():
    result = lab04.check_prediction(lambda M, N, K: lab04.counted_matmul_loads(M, N, K), seed=0)
    assert not result.passed and "calls" in result.report and "counted_matmul_loads" in result.report, result.report
    assert lab04.counted_matmul_loads(16, 16, 16) == 512                            # restored afterwards


def test_loads_are_counted_in_a_child_interpreter_where_triton_compiles(monkeypatch):
    """On a GPU this process compiles kernels and cannot interpret: the count comes from a child
    Python with TRITON_INTERPRET=1, and equals the count made here in the interpreter."""
    from attnkit.classroom.labchecks import lab04

    here = lab04.counted_matmul_loads(17, 33, 40)
    monkeypatch.setattr(lab04, "COUNTED_LOADS", {})
    monkeypatch.setattr(lab04, "interpreting", lambda: False)
    assert lab04.counted_matmul_loads(17, 33, 40) == here == 17 * 40 * 3 + 40 * 33 * 2


def test_a_crashing_kernel_fails_and_names_the_case(monkeypatch):
    """A store far outside `out` corrupts the heap or faults: the check runs in a child process and
    reports the case it was on instead of taking the notebook down."""
    monkeypatch.setattr(checking, "ISOLATE", True)
    if not checking.can_isolate():
        pytest.skip("a compiled kernel's stray store faults the GPU context: crash isolation is for the interpreter")

    @triton.jit
    def far_store(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offsets, mask=offsets < n)
        tl.store(out_ptr + offsets * (1 << 24), x)

    def launch(x, y, alpha, out):
        far_store[(1,)](x, y, out, x.numel(), alpha, BLOCK=16)
        return out

    report = lab04.check_scaled_add(launch, seed=0).report
    # a store far away faults, hits a sentinel, or corrupts the child so the case computes NaN: each fails it
    assert "case 1 of" in report and any(n in report for n in ("crashed", "outside", "non-finite")), report


def test_a_store_that_ignores_outs_row_stride_is_named_in_outs_units():
    """Every 2-D out is, in some fixed case, a view whose row stride is not its width: a kernel that
    stores row i at i·N is told where it wrote and what out's stride was."""
    report = lab04.check_affine_columns(_named(affine_columns, "contiguous out", bug=11), seed=0).report
    assert "case 2 of" in report and "into the gaps between out's rows" in report, report
    assert "row stride here is 20, its width 17" in report, report


@pytest.mark.skipif(__import__("os").environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_interpreted_puzzles_live_on_the_cpu_also_on_a_gpu_machine(monkeypatch):
    """With TRITON_INTERPRET=1 on a machine whose runtime is CUDA, the interpreter runs kernels on host copies
    of CUDA tensors, whose addresses are not the tensors': the puzzles' tensors are made on the CPU there, so
    a correct kernel's loads fall inside its inputs."""
    from types import SimpleNamespace

    from attnkit.classroom.labchecks import lab04_runner

    monkeypatch.setattr(lab04_runner, "runtime", lambda: SimpleNamespace(device="cuda"))
    assert lab04_runner.interpreting()
    made = [lab04_runner.vector([1.0, 2.0]), lab04_runner.matrix([[1.0, 2.0]]), lab04_runner.output((2, 3), 1)]
    assert [t.device.type for t in made] == ["cpu"] * 3
    monkeypatch.setattr(lab04_runner, "interpreting", lambda: False)
    with pytest.raises((RuntimeError, AssertionError)):          # compiled: the runtime's device (no CUDA here)
        lab04_runner.vector([1.0])


# ---------------------------------------------------------------------- state kept between calls
# Launch functions that keep something from an earlier call in a module variable: a grid, a block size,
# an input made contiguous once. Each puzzle has a case whose grid is larger than its first case's, and
# runs its first case again at the end with other values of the same shapes and layouts.
_KEPT: dict = {}


def wsum_grid_kept(s, v, out):
    """Puzzle 8 with the first call's grid kept ('the grid is the same every time')."""
    M, N = s.shape
    grid = _KEPT.setdefault("wsum grid", (triton.cdiv(M, 16),))
    _wsum[grid](s, v, out, M, N, s.stride(0), s.stride(1), v.stride(0), v.stride(1), out.stride(0),
                D=v.shape[1], BLOCK_M=16, BLOCK_N=16, BUG=0)
    return out


def lse_grid_kept(x, out):
    """Puzzle 7 with the first call's grid kept."""
    M, N = x.shape
    grid = _KEPT.setdefault("lse grid", (triton.cdiv(M, 4),))
    _lse[grid](x, out, M, N, x.stride(0), x.stride(1), BLOCK_M=4, BLOCK_N=16, BUG=0)
    return out


def matmul_grid_kept(a, b, out):
    """Puzzle 5 with the first call's grid kept."""
    M, K = a.shape
    N = b.shape[1]
    grid = _KEPT.setdefault("matmul grid", (triton.cdiv(M, 16), triton.cdiv(N, 16)))
    _matmul[grid](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                  BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, BUG=0)
    return out


def affine_scale_kept_by_shape(x, scale, bias, out):
    """Puzzle 3 with scale and bias made contiguous once per shape and kept ('they never change')."""
    scale, bias = _KEPT.setdefault(("affine", tuple(x.shape)), (scale.contiguous(), bias.contiguous()))
    return affine_columns(x, scale, bias, out)


STATE_WRONG = {
    "softmax_weighted_sum: grid kept from the first call": (lab04.check_softmax_weighted_sum, wsum_grid_kept),
    "row_logsumexp: grid kept from the first call": (lab04.check_row_logsumexp, lse_grid_kept),
    "matmul: grid kept from the first call": (lab04.check_matmul, matmul_grid_kept),
    "affine_columns: scale and bias kept by shape": (lab04.check_affine_columns, affine_scale_kept_by_shape),
}


@pytest.mark.parametrize(("check", "mutant"), [pytest.param(*v, id=k) for k, v in STATE_WRONG.items()])
def test_state_kept_between_calls_is_rejected_on_every_seed(check, mutant):
    assert_rejected_on_every_seed(check, mutant, FEW_SEEDS)
    report = check(mutant, seed=0).report
    # the again case, the larger grid's unwritten rows, or (scale and bias kept from another call's
    # buffers) reads outside this call's inputs
    assert any(why in report for why in ("called again with other values", "was not written",
                                         "outside its inputs")), report


# ------------------------------------------------------------------------- inputs changed in place
def scaled_add_x_scaled_in_place(x, y, alpha, out):
    """Puzzle 1 with x scaled in place first ('saves a buffer'): out is right, the caller's x is not."""
    x.mul_(alpha)
    return scaled_add(x, y, 1.0, out)


def causal_scores_scaled_in_place(s, scale, out):
    """Puzzle 6 with the scores scaled in place before the launch."""
    s.mul_(scale)
    return causal_softmax(s, 1.0, out)


@triton.jit
def _row_sums_into_x(x_ptr, out_ptr, M, N, stride_xm, stride_xn, BLOCK_N: tl.constexpr):
    """Row sums that keep the running sum in the row's first element (x used as scratch)."""
    row = tl.program_id(0)
    acc = 0.0
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        acc += tl.sum(tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=cols < N, other=0.0), axis=0)
    tl.store(x_ptr + row * stride_xm, acc)
    tl.store(out_ptr + row, tl.load(x_ptr + row * stride_xm))


def row_sums_x_as_scratch(x, out):
    M, N = x.shape
    _row_sums_into_x[(M,)](x, out, M, N, x.stride(0), x.stride(1), BLOCK_N=16)
    return out


INPLACE_WRONG = {
    "scaled_add: x scaled in place": (lab04.check_scaled_add, scaled_add_x_scaled_in_place),
    "causal_softmax: scores scaled in place": (lab04.check_causal_softmax, causal_scores_scaled_in_place),
    "row_sums: the running sum kept in x": (lab04.check_row_sums, row_sums_x_as_scratch),
}


@pytest.mark.parametrize(("check", "mutant"), [pytest.param(*v, id=k) for k, v in INPLACE_WRONG.items()])
def test_an_input_changed_in_place_is_rejected_on_every_seed(check, mutant):
    assert_rejected_on_every_seed(check, mutant, FEW_SEEDS, contains="your function wrote into")


# ---------------------------------------------------------------------- a part of out returned
# The launch function returns `out`: not one element of it, a slice or a view of another shape (each
# shares out's storage, so the check compares shapes and strides too).
RETURNS_WRONG = {
    "block_max: returns out[0]": (lab04.check_block_max, lambda x, out: block_max(x, out)[0]),
    "row_sums: returns out[:1]": (lab04.check_row_sums, lambda x, out: row_sums(x, out)[:1]),
    "scaled_add: returns out as a column": (lab04.check_scaled_add,
                                            lambda x, y, alpha, out: scaled_add(x, y, alpha, out)[:, None]),
}


@pytest.mark.parametrize(("check", "mutant"), [pytest.param(*v, id=k) for k, v in RETURNS_WRONG.items()])
def test_a_part_or_reshaped_view_of_out_returned_is_rejected_on_every_seed(check, mutant):
    assert_rejected_on_every_seed(check, mutant, FEW_SEEDS, contains="return `out`")


COMPILED_PROCESS = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "0"            # Triton imported for compiling, as on a GPU
import triton, triton.language as tl
from attnkit.classroom import checking
from attnkit.classroom.labchecks import lab04, lab04_runner as runner

@triton.jit
def lse_kernel(x_ptr, out_ptr, M, N, sxm, sxn, TWO_PASS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    if TWO_PASS:
        for start in range(0, N, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn,
                        mask=(rows[:, None] < M) & (cols[None, :] < N), other=float("-inf"))
            m = tl.maximum(m, tl.max(x, axis=1))
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn,
                    mask=(rows[:, None] < M) & (cols[None, :] < N), other=float("-inf"))
        m_new = m if TWO_PASS else tl.maximum(m, tl.max(x, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
        m = m_new
    tl.store(out_ptr + rows, m + tl.log(l), mask=rows < M)

def launch(two_pass):
    def row_logsumexp(x, out):
        M, N = x.shape
        lse_kernel[(triton.cdiv(M, 4),)](x, out, M, N, x.stride(0), x.stride(1), TWO_PASS=two_pass,
                                         BLOCK_M=4, BLOCK_N=16)
        return out
    return row_logsumexp

def language(names=None):
    """Every attribute of triton.language's modules (those of ``names``: the ones loaded before) and of
    tl.tensor, by identity."""
    names = names or [n for n, m in sorted(sys.modules.items()) if n.startswith("triton.language") and m]
    spaces = [(n, vars(sys.modules[n])) for n in names] + [("tl.tensor", vars(tl.tensor))]
    return {(n, key): id(value) for n, space in spaces for key, value in space.items()}

def unchanged(before, after):
    """Every attribute as it was (the interpreter's rewriting may add names to a module's globals, never
    change one), and no attribute added to tl.tensor."""
    return all(after.get(key) == value for key, value in before.items()) and \
        {k for k in after if k[0] == "tl.tensor"} - {k for k in before if k[0] == "tl.tensor"} <= \
        {("tl.tensor", "__annotations__")}       # made by Python on reading a class's annotations

captured = {}
def spy(name, fn, reference, puzzles, *, hint, tol=None):
    captured.update(name=name, reference=reference, puzzles=puzzles, hint=hint)
    return checking.CheckResult(name, checking.PASSED, "")
lab04.run_puzzle = spy
lab04.check_row_logsumexp(launch(False), seed=0)
assert not runner.interpreting()
before = language()
def wrapped(fn):                                 # as the grader's student process wraps a function
    def call(*args):
        return fn(*args)
    call.__wrapped__ = fn
    return call

for two_pass in (False, True, "wrapped"):
    fn = launch(bool(two_pass)) if two_pass != "wrapped" else wrapped(launch(True))
    with runner.interpreted_kernels(fn):
        result = runner._run_cases(captured["name"], fn, captured["reference"],
                                   [runner.on_cpu(p) for p in captured["puzzles"]], 3, hint="", note=" (again)",
                                   tol=runner.check_tolerance("float32"))
    print(two_pass, result.status, result.report.splitlines()[0])
print(type(lse_kernel).__name__, type(tl.max).__name__, os.environ["TRITON_INTERPRET"], runner.interpreting(),
      unchanged(before, language(sorted({n for n, _ in before if n != "tl.tensor"}))))
'''


def test_where_kernels_compile_the_cases_run_again_in_the_interpreter(tmp_path):
    """On a GPU, loads cannot be recorded: after the compiled cases, run_puzzle runs them again in Triton's
    interpreter in the same process (every @triton.jit swapped for the interpreter's). Here a process that
    imported Triton for compiling: a two-pass kernel is refused for reading twice, the one-pass kernel
    passes, and the compiled functions and every attribute of triton.language are back afterwards (the
    interpreter's patches to the language, left in place by Triton 3.6, broke every later compile)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    program = tmp_path / "compiled_process.py"          # Triton reads a kernel's source from its file
    program.write_text(COMPILED_PROCESS)
    done = subprocess.run([sys.executable, str(program)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("False passed"), lines
    assert lines[1].startswith("True failed") and "reads each input element 2 times" in lines[1], lines
    assert lines[2].startswith("wrapped failed") and "2 times" in lines[2], lines       # reached through __wrapped__
    assert lines[3] == "JITFunction JITFunction 0 False True", lines      # triton.language as it was
