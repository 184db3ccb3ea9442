"""Checks for lab 04, a ladder of Triton puzzles run in Triton's interpreter (or compiled on a GPU).

Each puzzle is a launch function that the lab gives and a kernel that the student writes; the check
calls the launch function with the inputs and an output tensor ``out`` to fill, and compares ``out``
with a float64 reference:

    scaled_add(x, y, alpha, out)          out = alpha·x + y                      (a masked vector op)
    block_max(x, out)                     out[0] = max(x), one program, a loop   (a reduction, other=)
    affine_columns(x, scale, bias, out)   out[i, j] = x[i, j]·scale[j] + bias[j] (2-D tiles, broadcasting)
    row_sums(x, out)                      out[i] = Σ_j x[i, j], a loop over column tiles
    matmul(a, b, out)                     out = a·b with tl.dot, a loop over k tiles
    causal_softmax(s, scale, out)         softmax(scale·s) per row, key j hidden when j > i + Nk − Nq
    row_logsumexp(x, out)                 out[i] = log Σ_j exp(x[i, j]), ONE pass, running (m, ℓ)
    softmax_weighted_sum(s, v, out)       out = softmax(s)·v, ONE pass: the loop of lesson 5

and one prediction, checked against a measurement: predicted_matmul_loads(M, N, K), the elements of a
and b that puzzle 5's tiled launch loads, against the loads counted in the interpreter (within 1%).

Inputs are views into larger buffers filled with NaN, 2-D inputs have a row stride larger than their
row (so the strides must be used), every 2-D input is stored column by column in some fixed case (so
the column stride must be used too), and ``out`` sits inside a buffer of a sentinel value; a 2-D
``out`` has a row stride of its width + ``OUT_ROW_GAP`` in every case but those of one exact tile, with
sentinels in the gaps (so ``stride_om`` must be used, and a store through an input's stride shows). Values go
below −1000, and puzzles 2, 6, 7 and 8 each have a case whose values all lie far below (near −3.3·10³⁸
in puzzle 2, −10⁹ in the others: ``lab04_runner.FAR_BELOW``): a running maximum started at a finite value above
them, or such a finite ``other=`` or mask value (−10⁴, −10⁸), fails there; −inf and float32's lowest
pass. Puzzles 7 and 8 have rows whose running
maximum falls or rises by 200 from one tile to the next (a rescale from the tile's own maximum, or
from the first tile's, overflows). Every alpha, and puzzle 6's first scale, is exact in neither float16
nor bfloat16 (``ALPHAS``: a scalar rounded to either fails). One puzzle 8 case puts a quarter of each
row's weight on one key (the scores' scale must be exact: log2(e) cut to 1.44 fails it); puzzle 6 hides a
key scoring far above the visible ones (a row maximum taken before the mask is 0/0), and puzzle 8 has
values above float16's range and weights below it (p or v cast to float16 for tl.dot fails). Every
puzzle has a case whose grid is larger than its first case's, and runs its first case again at the
end with other values of the same shapes and layouts (a launch that keeps a grid, a block size or a
result from an earlier call fails), and every input is compared after each call with a copy taken
before it (a kernel or launch that writes into an input fails). Puzzle 6's scale is positive, as the
lab states. Sizes are
small and never all multiples of the blocks, so a missing mask either reads NaN or writes outside
``out``. In the interpreter the check also records every address the kernel loads and stores: reads
must stay inside the inputs, every element of ``out`` must be written by the kernel's ``tl.store``,
and the two one-pass puzzles must read each score once; a masked load without ``other=`` reads NaN in
its masked lanes (a GPU leaves whatever was there), and the cases run in a child process, so a kernel
that crashes the interpreter fails with the case it was on. The bound is float32's on every device
(fp16 inputs to tl.dot multiply exactly into an fp32 accumulator), tf32's for puzzle 8, whose fp32
products go through tl.dot (tensor cores read them as tf32 on a GPU). Calls to PyTorch's softmax or matrix products
and to attnkit's own kernels and references raise while the student's function runs.

Internal API for tests: ``COUNTED_LOADS`` (the loads counted so far, by shape) and ``interpreting``.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ...reference.attention import softmax_np
from ...tolerances import check_tolerance
from ..checking import (
    FAILED,
    PASSED,
    CheckResult,
    Exercise,
    check_exercises,
    is_not_implemented,
    not_implemented,
)
from .lab04_runner import (  # noqa: F401  (lab 04's names, importable from here as before)
    ALSO_FORBIDDEN,
    FAR_BELOW,
    OUT_ROW_GAP,
    PAD,
    PAD_ROWS,
    ROW_GAP,
    SENTINEL,
    ForbiddenCall,
    Puzzle,
    _element_addresses,
    _fail,
    _find_forbidden,
    _forbidden_name,
    _forbidding,
    _Memory,
    _run_puzzle,
    _torch,
    falling_and_rising,
    far_below,
    interpreting,
    matrix,
    output,
    run_puzzle,
    vector,
)


def _rng(seed):
    return np.random.default_rng(seed)


# Scalars: every alpha and softmax scale a puzzle gives is a number with all its digits (√3, π, 1/√12):
# none is exact in float16 or bfloat16, and each multiplies values large enough that a scalar rounded
# to either (10⁻⁴ relative and more) moves the result past float32's bound; a float32 scalar (6·10⁻⁸)
# does not.
ALPHAS = (-math.sqrt(3.0), math.pi, 1 / math.sqrt(12.0), -math.e)

# ------------------------------------------------------------------------------------------ puzzle 1
def scaled_add_reference(x, y, alpha):
    return alpha * x + y


def _scaled_add_cases(seed):
    rng = _rng(seed)
    sizes = [(1, "n = 1"), (16, "n = 16 = one block"), (17, "n = 17 = one block + 1"),
             (47, "n = 47 = three blocks − 1")] + \
        [(int(n), f"n = {int(n)}") for n in rng.integers(2, 150, size=2)]
    cases = []
    for index, (n, label) in enumerate(sizes):
        # the fixed cases take every alpha in turn, the random ones any (see ALPHAS)
        alpha = ALPHAS[index] if index < len(ALPHAS) else float(rng.choice(ALPHAS))
        cases.append(Puzzle((vector(rng.standard_normal(n)), vector(rng.standard_normal(n)), alpha), (n,),
                            f"{label}, alpha = {alpha:.17g} (not exact in float16 or bfloat16)"))
    return cases


def check_scaled_add(scaled_add, *, seed: int | None = None) -> CheckResult:
    """Puzzle 1: scaled_add(x, y, alpha, out) -> out = alpha·x + y for 1-D fp32 x, y."""
    return run_puzzle("scaled_add", scaled_add, scaled_add_reference, _scaled_add_cases(seed),
                      hint="offsets = pid·BLOCK + tl.arange(0, BLOCK); mask = offsets < n on the loads AND the "
                           "store; out = alpha·x + y (only x is scaled).")


# ------------------------------------------------------------------------------------------ puzzle 2
def _block_max_cases(seed):
    rng = _rng(seed)
    cases = [Puzzle((vector([-3.5]),), (1,), "n = 1, a negative value"),
             Puzzle((vector(-1 - rng.random(16)),), (1,), "n = 16, all negative (the masked lanes must not win)")]
    tail = rng.standard_normal(33) - 5
    tail[32] = 4.0
    cases.append(Puzzle((vector(tail),), (1,), "n = 33, the maximum is the last element (alone in its block)"))
    head = -np.abs(rng.standard_normal(47)) - 1
    head[0] = -0.5
    cases.append(Puzzle((vector(head),), (1,), "n = 47, all negative, the maximum is the first element"))
    cases.append(Puzzle((vector((rng.random(21) + 1.0) * -1e30),), (1,),
                        "n = 21, every value near −10³⁰ (a masked lane's other= must be −inf to lose to all of "
                        "them)"))
    cases.append(Puzzle((vector(far_below(rng, 19, top=-3.3e38)),), (1,),
                        "n = 19, every value near −3.3·10³⁸ (below every finite other= or start but float32's "
                        "lowest, −3.4·10³⁸: use −inf)"))
    for n in rng.integers(2, 200, size=2):
        shift = float(rng.choice([0.0, -10.0]))
        cases.append(Puzzle((vector(rng.standard_normal(int(n)) + shift),), (1,), f"n = {int(n)}"))
    return cases


def check_block_max(block_max, *, seed: int | None = None) -> CheckResult:
    """Puzzle 2: block_max(x, out) -> out[0] = max(x), one program looping over blocks of x."""
    return run_puzzle("block_max", block_max, lambda x: np.max(x, keepdims=True), _block_max_cases(seed),
                      hint="start from a running maximum of −inf; for start in range(0, n, BLOCK): load with "
                           "mask=offsets < n and other=−inf (0 would beat negative data), then "
                           "m = tl.maximum(m, tl.max(x, axis=0)); store m once, after the loop.")


# ------------------------------------------------------------------------------------------ puzzle 3
# A 2-D `out` has a row stride of its width + OUT_ROW_GAP (unlike its inputs' width + ROW_GAP) in every
# case but those that fill exactly one tile (8 × 16, 16 × 16 and the like), which keep a contiguous `out`:
# a kernel that stores row i at i·width, or through an input's row stride, writes into the gaps.
CONTIGUOUS_OUT = {(1, 1), (8, 16), (16, 16), (1, 33), (3, 17), (4, 17)}


def _out_gap(rows, cols) -> int:
    return 0 if (rows, cols) in CONTIGUOUS_OUT else OUT_ROW_GAP


def affine_columns_reference(x, scale, bias):
    return x * scale[None, :] + bias[None, :]


def _affine_cases(seed):
    rng = _rng(seed)
    shapes = [(1, 1, "1 × 1"), (9, 17, "9 × 17 (one row and one column past the 8 × 16 tile)"),
              (20, 5, "20 × 5 (more rows than columns)"), (8, 16, "8 × 16 = one tile exactly"),
              (3, 40, "3 × 40")] + [(int(m), int(n), f"{int(m)} × {int(n)}") for m, n in rng.integers(1, 30, (2, 2))]
    made = [Puzzle((matrix(rng.standard_normal((m, n))), vector(rng.standard_normal(n) + 2),
                    vector(rng.standard_normal(n))), (m, n), f"x {label}, row stride {n + ROW_GAP}",
                   out_row_gap=_out_gap(m, n))
            for m, n, label in shapes]
    made.insert(2, Puzzle((matrix(rng.standard_normal((11, 19)), transposed=True), vector(rng.standard_normal(19) + 2),
                           vector(rng.standard_normal(19))), (11, 19),
                          "x 11 × 19 stored column by column (strides (1, 18): use stride_xn)",
                          out_row_gap=OUT_ROW_GAP))
    return made


def check_affine_columns(affine_columns, *, seed: int | None = None) -> CheckResult:
    """Puzzle 3: affine_columns(x, scale, bias, out) -> out[i, j] = x[i, j]·scale[j] + bias[j]."""
    return run_puzzle("affine_columns", affine_columns, affine_columns_reference, _affine_cases(seed),
                      hint="rows = pid_m·BLOCK_M + arange, cols = pid_n·BLOCK_N + arange; x's pointers are "
                           "x_ptr + rows[:, None]·stride_x + cols[None, :]; scale and bias are indexed by the "
                           "column and broadcast as [None, :]; mask = (rows < M)[:, None] & (cols < N)[None, :].")


# ------------------------------------------------------------------------------------------ puzzle 4
def _row_sums_cases(seed):
    rng = _rng(seed)
    shapes = [(1, 1, "1 × 1"), (5, 16, "5 × 16 = one column tile"), (6, 17, "6 × 17 (a column past the tile)"),
              (3, 47, "3 × 47 (three column tiles, the last one partly empty)"), (9, 50, "9 × 50")] + \
        [(int(m), int(n), f"{int(m)} × {int(n)}") for m, n in rng.integers(1, 60, (2, 2))]
    made = [Puzzle((matrix(rng.standard_normal((m, n)) + 0.5),), (m,), f"x {label}, row stride {n + ROW_GAP}")
            for m, n, label in shapes]
    made.insert(2, Puzzle((matrix(rng.standard_normal((7, 21)) + 0.5, transposed=True),), (7,),
                          "x 7 × 21 stored column by column (strides (1, 14): use stride_xn)"))
    return made


def check_row_sums(row_sums, *, seed: int | None = None) -> CheckResult:
    """Puzzle 4: row_sums(x, out) -> out[i] = Σ_j x[i, j], a tile of rows looping over column tiles."""
    return run_puzzle("row_sums", row_sums, lambda x: x.sum(axis=1), _row_sums_cases(seed),
                      hint="acc = zeros([BLOCK_M]); for start in range(0, N, BLOCK_N): cols = start + arange; "
                           "load the [BLOCK_M, BLOCK_N] tile with the row AND column mask and other=0; "
                           "acc += tl.sum(tile, axis=1); store acc with the row mask.")


# ------------------------------------------------------------------------------------------ puzzle 5
def _matmul_cases(seed):
    torch = _torch()
    rng = _rng(seed)
    shapes = [(17, 40, 33, "17 × 40 by 40 × 33 (every size off the 16 tile)"),
              (16, 16, 16, "16 × 16 by 16 × 16 (one tile)"), (5, 47, 18, "5 × 47 by 47 × 18 (three k tiles)"),
              (33, 15, 1, "33 × 15 by 15 × 1")] + \
        [(int(m), int(k), int(n), f"{int(m)} × {int(k)} by {int(k)} × {int(n)}")
         for m, k, n in rng.integers(1, 40, (2, 3))]
    made = [Puzzle((matrix(rng.standard_normal((m, k)), torch.float16),
                    matrix(rng.standard_normal((k, n)), torch.float16, transposed=True)), (m, n),
                   f"fp16 {label}, b stored column by column", out_row_gap=_out_gap(m, n))
            for m, k, n, label in shapes]
    made.insert(1, Puzzle((matrix(rng.standard_normal((20, 35)), torch.float16, transposed=True),
                           matrix(rng.standard_normal((35, 18)), torch.float16)), (20, 18),
                          "fp16 20 × 35 by 35 × 18, a stored column by column, b row by row", out_row_gap=OUT_ROW_GAP))
    return made


def check_matmul(matmul, *, seed: int | None = None) -> CheckResult:
    """Puzzle 5: matmul(a, b, out) -> out = a·b (fp16 inputs, fp32 out) with tl.dot and a loop over k."""
    return run_puzzle("matmul", matmul, lambda a, b: a @ b, _matmul_cases(seed),
                      hint="acc = zeros([BLOCK_M, BLOCK_N], fp32); for start in range(0, K, BLOCK_K): load an "
                           "a tile [BLOCK_M, BLOCK_K] and a b tile [BLOCK_K, BLOCK_N] through their strides, "
                           "masked on m, k and k, n with other=0; acc += tl.dot(a_tile, b_tile); store with "
                           "the m, n mask.")


# ------------------------------------------------------------------------------------------ puzzle 6
def causal_softmax_reference(s, scale):
    n_q, n_k = s.shape
    visible = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)
    return softmax_np(np.where(visible, scale * s, -np.inf))


def _causal_cases(seed):
    rng = _rng(seed)
    # The first case's scale, 1/√12, is exact in neither float16 nor bfloat16, and its scores spread
    # enough (scaled, about ±3) for a scale rounded to either to show (see ALPHAS).
    cases = [((5, 5), 10.0, 1 / math.sqrt(12), "5 × 5"),
             ((3, 17), 1.0, 1 / math.sqrt(8), "3 × 17 (Nq < Nk: the mask is aligned to the end)"),
             ((1, 33), 1.0, 1 / math.sqrt(64), "1 × 33 (one query row sees every key)"),
             ((4, 16), 300.0, 1 / math.sqrt(4), "4 × 16, scores up to about ±600 (exp overflows without the "
                                                "row maximum)")]
    for _ in range(2):
        n_q = int(rng.integers(1, 12))
        n_k = n_q + int(rng.integers(0, 30))
        cases.append(((n_q, n_k), float(rng.choice([1.0, 20.0])), 1 / math.sqrt(float(rng.choice([12, 16, 40, 64]))),
                      f"{n_q} × {n_k}"))
    made = [Puzzle((matrix(rng.standard_normal(shape) * spread), scale), shape,
                   f"s {label}, scale {scale:.4g}, row stride {shape[1] + ROW_GAP}", out_row_gap=_out_gap(*shape))
            for shape, spread, scale, label in cases]
    made.insert(2, Puzzle((matrix(rng.standard_normal((6, 23)) * 20, transposed=True), 0.25), (6, 23),
                          "s 6 × 23 stored column by column (use stride_sn), scores of spread 5 (exp2 needs "
                          "log2(e) to all its digits)", out_row_gap=OUT_ROW_GAP))
    # Visible keys near −200, the last key (hidden from every row but the last) at +300: a row maximum
    # taken before the mask is 150 after scaling, every visible exp(−250) underflows and the row is 0/0.
    hidden_high = rng.standard_normal((5, 19)) - 200.0
    hidden_high[:, -1] = 300.0
    made.insert(3, Puzzle((matrix(hidden_high), 0.5), (5, 19),
                          "s 5 × 19, visible keys near −200 and the last key, hidden from rows 0–3, at +300, "
                          "scale 0.5 (the row maximum must be taken after the mask)", out_row_gap=OUT_ROW_GAP))
    # Every score far below any finite mask value or other= (see lab04_runner.FAR_BELOW), 23 keys in a block of 32.
    made.insert(6, Puzzle((matrix(far_below(rng, (4, 23))), 1.0), (4, 23),
                          "s 4 × 23, scale 1, every score near −10⁹, a few tied at each row's maximum (a "
                          "finite value for hidden keys or masked lanes, −10⁴ or −10⁸, outweighs them all: use "
                          "−inf)", out_row_gap=OUT_ROW_GAP))
    return made


def check_causal_softmax(causal_softmax, *, seed: int | None = None) -> CheckResult:
    """Puzzle 6: causal_softmax(s, scale, out) -> softmax over each row of scale·s, key j hidden from
    query i when j > i + Nk − Nq (aligned to the end, as in lesson 5).

    The lab states scale > 0 (a softmax scale such as 1/√d): every case's scale is positive, and a kernel
    that shifts by the unscaled maximum and scales after (max(scale·s) = scale·max(s) for scale > 0) is
    right by that rule."""
    return run_puzzle("causal_softmax", causal_softmax, causal_softmax_reference, _causal_cases(seed),
                      hint="one program per row i: load the row with other=−inf past Nk, multiply by scale, set "
                           "keys j > i + Nk − Nq to −inf with tl.where, subtract the row maximum, exp, divide by "
                           "the sum; store with mask cols < Nk.")


# ------------------------------------------------------------------------------------------ puzzle 7
def logsumexp_reference(x):
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


def _lse_cases(seed):
    rng = _rng(seed)
    rising = np.sort(rng.standard_normal((2, 47)) * 3, axis=1) + np.linspace(0, 30, 47)
    cases = [Puzzle((matrix(rising),), (2,), "2 × 47, rising along the row (the maximum grows in every tile)",
                    stream=0),
             Puzzle((matrix(rng.standard_normal((3, 33)) * 5 + 1000),), (3,),
                    "3 × 33 near +1000 (exp overflows without the running maximum)", stream=0),
             Puzzle((matrix(rng.standard_normal((2, 17)) * 5 - 1000),), (2,),
                    "2 × 17 near −1000 (exp underflows to 0 without the running maximum)", stream=0),
             Puzzle((matrix(rng.standard_normal((1, 1))),), (1,), "1 × 1", stream=0),
             Puzzle((matrix(np.sort(rng.standard_normal((4, 16)) * 4, axis=1)[:, ::-1] - 50),), (4,),
                    "4 × 16 = one tile, falling, near −50", stream=0),
             Puzzle((matrix(rng.standard_normal((3, 29)) * 8, transposed=True),), (3,),
                    "3 × 29 stored column by column (use stride_xn)", stream=0),
             # More rows than the earlier cases: a launch that keeps the first call's grid leaves rows unwritten.
             Puzzle((matrix(rng.standard_normal((13, 21)) * 4),), (13,), "13 × 21 (more row blocks than the cases "
                    "before it)", stream=0),
             # The running maximum falls and rises by 200 between tiles (see lab04_runner.falling_and_rising), and every
             # value lies far below any finite start or other= (see lab04_runner.FAR_BELOW; 37 columns: masked lanes in
             # the last tile of any width).
             Puzzle((matrix(falling_and_rising(rng, 4, 150)),), (4,),
                    "4 × 150 whose rows fall by 200 or more from one tile to the next (row 0: +100 for 20 "
                    "columns, then −100) or rise by 200 (row 1), at any tile width below 150", stream=0),
             Puzzle((matrix(far_below(rng, (3, 37))),), (3,),
                    "3 × 37, every value near −10⁹, a few tied at each row's maximum (a running maximum "
                    "started at a finite value, or masked lanes read as one, −10⁴ or −10⁸, is above them all: "
                    "use −inf)", stream=0)]
    for _ in range(2):
        m, n = int(rng.integers(1, 6)), int(rng.integers(2, 70))
        cases.append(Puzzle((matrix(rng.standard_normal((m, n)) * 10 + float(rng.choice([0.0, 500.0]))),), (m,),
                            f"{m} × {n}", stream=0))
    return cases


def check_row_logsumexp(row_logsumexp, *, seed: int | None = None) -> CheckResult:
    """Puzzle 7: row_logsumexp(x, out) -> out[i] = log Σ_j exp(x[i, j]), reading each element once."""
    return run_puzzle("row_logsumexp", row_logsumexp, logsumexp_reference, _lse_cases(seed),
                      hint="one pass over the row in tiles, keeping m (running max, from −inf) and l (running "
                           "Σ exp(x − m)): m_new = max(m, tl.max(tile)); l = l·exp(m − m_new) + "
                           "Σ exp(tile − m_new); masked lanes load −inf. At the end out = m + log(l).")


# ------------------------------------------------------------------------------------------ puzzle 8
def weighted_sum_reference(s, v):
    return softmax_np(s) @ v


def _weighted_cases(seed):
    rng = _rng(seed)

    def make(shape, d, scores, label, s_by_columns=False, v_by_columns=False, values=None):
        values = rng.standard_normal((shape[1], d)) if values is None else values
        return Puzzle((matrix(scores, transposed=s_by_columns), matrix(values, transposed=v_by_columns)),
                      (shape[0], d), f"s {label}, v {shape[1]} × {d}", stream=0, out_row_gap=_out_gap(*shape))

    # One key scores 4 above 159 others, so it holds a quarter of each row's weight; only its value is
    # non-zero. A change of 0.2% in the scores' scale (exp2 with log2(e) cut to 1.44) moves that weight,
    # and the output, by 0.6%.
    lone = np.zeros((3, 160))
    lone[:, 0] = 4.0
    lone_values = np.zeros((160, 16))
    lone_values[0] = rng.standard_normal(16) + 3.0

    # float16 keeps 5 exponent bits: values above 65504 overflow, weights below 6e-8 vanish; the fp32
    # product (tf32 on a GPU keeps fp32's 8 exponent bits) holds both.
    far = np.full((2, 40), -20.0)
    far[:, 0] = 0.0
    far_values = rng.standard_normal((40, 16)) + 3.0
    far_values[0] = 0.0

    cases = [make((2, 47), 16, np.sort(rng.standard_normal((2, 47)) * 3, axis=1) + np.linspace(0, 40, 47),
                  "2 × 47, rising along the row (the maximum grows in every tile)"),
             make((3, 33), 16, rng.standard_normal((3, 33)) * 300 + 800,
                  "3 × 33 near +800 with gaps of hundreds (exp overflows without the running maximum)"),
             make((1, 1), 16, rng.standard_normal((1, 1)), "1 × 1"),
             make((4, 17), 32, np.sort(rng.standard_normal((4, 17)) * 4, axis=1)[:, ::-1].copy(),
                  "4 × 17, falling (the maximum comes first)"),
             make((5, 21), 16, rng.standard_normal((5, 21)) * 3, "5 × 21 stored column by column (use stride_sn)",
                  s_by_columns=True),
             make((3, 19), 16, rng.standard_normal((3, 19)) * 3, "3 × 19, v stored column by column (use stride_vd)",
                  v_by_columns=True),
             make((3, 160), 16, lone, "3 × 160, one key 4 above the rest holds a quarter of the weight",
                  values=lone_values),
             make((3, 40), 16, rng.standard_normal((3, 40)) * 3, "3 × 40 of values about ±10⁵ (above float16's "
                  "largest, 65504: keep p and v in float32 for tl.dot)", values=rng.standard_normal((40, 16)) * 1e5),
             make((2, 40), 16, far, "2 × 40, key 0 scores 20 above the rest and has value 0: the output is the "
                  "other keys' weights, e^−20 ≈ 2e-9 each (below float16's smallest, 6e-8)", values=far_values),
             # Three blocks of 16 rows where every earlier case has one: a launch that keeps the first
             # call's grid leaves rows 16 to 36 unwritten.
             make((37, 9), 16, rng.standard_normal((37, 9)) * 3, "37 × 9 (three blocks of rows, where the cases "
                  "before it have one)"),
             # As in puzzle 7: rows whose running maximum falls or rises by 200 between tiles, and scores far
             # below any finite start or other= (their output: the mean of v over each row's tied maxima).
             make((4, 150), 16, falling_and_rising(rng, 4, 150), "4 × 150 whose rows fall by 200 or more from "
                  "one tile of keys to the next (row 0: +100 for 20 keys, then −100) or rise by 200 (row 1), at "
                  "any tile width below 150"),
             make((3, 37), 16, far_below(rng, (3, 37)), "3 × 37, every score near −10⁹, a few tied at each "
                  "row's maximum (a running maximum started at a finite value, or masked scores read as one, "
                  "−10⁴ or −10⁸, is above them all: use −inf)")]
    for _ in range(2):
        m, n, d = int(rng.integers(1, 5)), int(rng.integers(2, 60)), int(rng.choice([16, 32]))
        cases.append(make((m, n), d, rng.standard_normal((m, n)) * 5, f"{m} × {n}"))
    return cases


def check_softmax_weighted_sum(softmax_weighted_sum, *, seed: int | None = None) -> CheckResult:
    """Puzzle 8: softmax_weighted_sum(s, v, out) -> out = softmax(s)·v row by row, one pass over s."""
    return run_puzzle("softmax_weighted_sum", softmax_weighted_sum, weighted_sum_reference, _weighted_cases(seed),
                      tol=check_tolerance("float32", dot=True),
                      hint="one pass over the tiles of keys, for a block of rows: m_new = max(m, tl.max(s_tile)); "
                           "alpha = exp(m − m_new); p = exp(s_tile − m_new); l = l·alpha + Σp; "
                           "acc = acc·alpha[:, None] + tl.dot(p, v_tile); "
                           "mask the rows of v past Nk too; at the end out = acc / l.")


# ------------------------------------------------------------------------- the prediction: loads
MATMUL_TILE = 16                 # puzzle 5's launch: 16 × 16 tiles of out, k in steps of 16
PREDICTION_BAND = 0.01           # the predicted count must be within 1% of the counted one
_KERNEL = []
COUNTED_LOADS: dict = {}


def _counting_matmul():
    """Puzzle 5's tiled product as the course writes it, always run in Triton's interpreter (on CPU
    tensors, whatever the device), where every load can be recorded."""
    if not _KERNEL:
        from ...device import ensure_triton_backend

        ensure_triton_backend()
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        def tiled_matmul(a_ptr, b_ptr, out_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                         BLOCK: tl.constexpr):
            rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            acc = tl.zeros([BLOCK, BLOCK], tl.float32)
            for start in range(0, K, BLOCK):
                ks = start + tl.arange(0, BLOCK)
                a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                            mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
                b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                            mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
                acc += tl.dot(a, b)
            tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], acc,
                     mask=(rows[:, None] < M) & (cols[None, :] < N))

        _KERNEL.append(InterpretedFunction(tiled_matmul))
    return _KERNEL[0]


def _count_in_a_fresh_interpreter(shapes) -> None:
    """Where Triton compiles (a GPU), this process cannot also interpret (its ``triton.language`` was
    imported for compiling): count the loads of ``shapes`` in a child Python with TRITON_INTERPRET=1."""
    import json
    import subprocess
    import sys

    program = ("import json, sys; from attnkit.classroom.labchecks.lab04 import counted_matmul_loads; "
               "print(json.dumps([counted_matmul_loads(*s) for s in json.loads(sys.argv[1])]))")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", program, json.dumps([list(s) for s in shapes])], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    for shape, count in zip(shapes, json.loads(done.stdout.strip().splitlines()[-1])):
        COUNTED_LOADS[tuple(shape)] = int(count)


def counted_matmul_loads(M: int, N: int, K: int) -> int:
    """Elements of a and b that puzzle 5's launch loads (masked-off lanes not counted), counted by
    running the tiled kernel in Triton's interpreter and recording every load."""
    key = (M, N, K)
    if key not in COUNTED_LOADS and not interpreting():
        _count_in_a_fresh_interpreter([key])
    if key not in COUNTED_LOADS:
        torch = _torch()
        kernel = _counting_matmul()
        a = torch.ones(M, K, dtype=torch.float16)
        b = torch.ones(K, N, dtype=torch.float16)
        out = torch.empty(M, N)
        memory = _Memory()
        tiles = (-(-M // MATMUL_TILE), -(-N // MATMUL_TILE))
        with memory.watching(always=True):
            kernel[tiles](a, b, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
                          BLOCK=MATMUL_TILE)
        loaded = memory.loaded()
        inside = np.isin(loaded, _element_addresses(a)) | np.isin(loaded, _element_addresses(b))
        COUNTED_LOADS[key] = int(inside.sum())
    return COUNTED_LOADS[key]


ALSO_FORBIDDEN.extend((counted_matmul_loads, _counting_matmul))   # the prediction's measurement


def check_prediction(predicted_matmul_loads, *, seed: int | None = None) -> CheckResult:
    """predicted_matmul_loads(M, N, K) -> your prediction of how many elements of a and b puzzle 5's
    launch loads (16 × 16 tiles of out, k in steps of 16; masked-off lanes are not loads).

    The check then counts the loads of the course's tiled kernel in the interpreter, shape by shape,
    and passes when every prediction is within 1% of the count.
    """
    name = "predicted_matmul_loads"
    rng = _rng(seed)
    shapes = [(40, 48, 40), (17, 33, 40), (16, 16, 16), (1, 100, 20)] + \
        [tuple(int(v) for v in rng.integers(1, 70, size=3)) for _ in range(2)]
    lines = []
    uncounted = [shape for shape in shapes if shape not in COUNTED_LOADS]
    if uncounted and not interpreting():
        _count_in_a_fresh_interpreter(uncounted)          # one child process for every shape
    for M, N, K in shapes:
        try:
            with _forbidding():
                got = predicted_matmul_loads(M, N, K)
        except Exception as exc:
            forbidden = _find_forbidden(exc)
            if forbidden is not None:
                return CheckResult(name, FAILED, f"❌ {name}: your function calls {_forbidden_name(forbidden)}; "
                                                 f"the prediction is yours to work out, before the count")
            if is_not_implemented(exc):
                return not_implemented(name)
            return CheckResult(name, FAILED, f"❌ {name}: M={M}, N={N}, K={K}: your function raised "
                                             f"{type(exc).__name__}: {exc}")
        try:
            got = float(got)
        except (TypeError, ValueError):
            return CheckResult(name, FAILED, f"❌ {name}: M={M}, N={N}, K={K}: return a number of elements, "
                                             f"got {type(got).__name__}")
        counted = counted_matmul_loads(M, N, K)
        lines.append(f"   M={M:3d}, N={N:3d}, K={K:3d}: predicted {got:9,.0f}, counted {counted:9,d} "
                     f"(read once: {M * K + K * N:,d})")
        if not (math.isfinite(got) and abs(got - counted) <= PREDICTION_BAND * counted):
            return CheckResult(name, FAILED, "\n".join(
                [f"❌ {name}: M={M}, N={N}, K={K}: your prediction is not within 1% of the loads counted "
                 f"in Triton's interpreter.", *lines,
                 "   hint: each program owns one 16 × 16 tile of out and reads the full rows of a and the full "
                 "columns of b that the tile needs (only the real ones: masked lanes load nothing). How many "
                 "programs share each row of a, and each column of b?"]))
    return CheckResult(name, PASSED, "\n".join(
        [f"✅ {name}: within 1% of the loads counted in Triton's interpreter at all {len(shapes)} shapes.",
         *lines[:4]]))


# ----------------------------------------------------------------------------------------- the lab
EXERCISES = (
    Exercise(function="scaled_add", check=check_scaled_add),
    Exercise(function="block_max", check=check_block_max),
    Exercise(function="affine_columns", check=check_affine_columns),
    Exercise(function="row_sums", check=check_row_sums),
    Exercise(function="matmul", check=check_matmul),
    Exercise(function="predicted_matmul_loads", check=check_prediction),
    Exercise(function="causal_softmax", check=check_causal_softmax),
    Exercise(function="row_logsumexp", check=check_row_logsumexp),
    Exercise(function="softmax_weighted_sum", check=check_softmax_weighted_sum),
)


def check_lab(*, seed: int | None = None, **functions):
    """Every puzzle's check, in order, with a summary line."""
    return check_exercises(EXERCISES, functions, seed=seed)
