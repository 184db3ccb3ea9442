"""Checks for lab 01, attention by hand.

    scores(Q, K)                              exercise 1: S = Q Kᵀ / √d
    softmax_rows(S)                           exercise 2: a softmax of each row that never overflows
    attention(Q, K, V, causal=False)          exercise 3: softmax(Q Kᵀ/√d) V, with the causal mask
    sinusoidal_positions(n_positions, d_model) exercise 4: the sinusoidal position table

Each check runs fixed adversarial cases first (shapes where Nq, Nk, d and dv all differ, rows whose
maxima are thousands apart, scores that overflow ``exp``), then cases drawn from ``seed`` (fresh ones
when None), and compares with a float64 reference. A float32 answer is held to the float32 bound; the
student's function may not call the course's own implementations.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from ..classroom.checking import (
    CheckResult,
    Exercise,
    case,
    check_exercises,
    exercise_check,
    fixed_and_random,
    module_functions,
    run_check,
    within_dtype_tolerance,
)
from ..reference import attention as _attention
from ..reference import example_4x4 as _example
from ..reference import online_softmax as _online
from ..reference import tiled_numpy as _tiled
from ..tolerances import tolerance

TOL = tolerance("float64") * 1e3   # float64 arithmetic in a different order: far below any real bug
COMPARE = within_dtype_tolerance(TOL)

HINT_SCORES = "S[i, j] is the dot product of query i and key j, divided by √d with d = Q.shape[1]."
HINT_SOFTMAX = ("normalise along each row (axis=-1), and subtract EACH ROW's own maximum "
                "(S.max(axis=-1, keepdims=True)) before exp: one maximum for the whole matrix underflows "
                "the rows whose scores are far below it.")
HINT_ATTENTION = "P = softmax of each row of S = Q Kᵀ/√d, then O = P V, shape [Nq, dv]."
HINT_CAUSAL = ("mask before the softmax: query i may see keys j ≤ i (set S[i, j] = -inf for j > i, the "
               "diagonal stays visible), then softmax each row and multiply by V.")
HINT_POSITIONS = ("even columns 2i hold sin(pos / 10000^(2i/d_model)), odd columns 2i+1 the cos of the "
                  "same angle; positions start at 0.")


def reference_scores(Q, K):
    return np.asarray(Q, dtype=np.float64) @ np.asarray(K, dtype=np.float64).T / math.sqrt(Q.shape[-1])


def reference_positions(n_positions, d_model):
    pos = np.arange(n_positions)[:, None]
    inv_freq = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((n_positions, d_model))
    pe[:, 0::2] = np.sin(pos * inv_freq)
    pe[:, 1::2] = np.cos(pos * inv_freq)
    return pe


def _reference_attention(Q, K, V, causal=False):
    return _attention.attention_np(Q, K, V, causal=causal)


def forbidden() -> tuple:
    """The course's own implementations (the references and this module's functions): a student's
    function that calls one of them fails."""
    return module_functions(_attention, _online, _tiled, sys.modules[__name__])


def _check(name, student_fn, reference_fn, fixed, drawn, hint) -> CheckResult:
    return run_check(name, student_fn, reference_fn, fixed + drawn, tol=TOL, hint=hint, compare=COMPARE,
                     forbidden=forbidden(), fixed=len(fixed))


def _qkv(rng, n_q, n_k, d, d_v=None, scale=1.0):
    arrays = [rng.standard_normal((n_q, d)) * scale, rng.standard_normal((n_k, d)) * scale]
    if d_v is not None:
        arrays.append(rng.standard_normal((n_k, d_v)))
    return arrays


def _label(arrays) -> str:
    return ", ".join(f"{n} {a.shape}" for n, a in zip("QKV", arrays))


# Shapes where Nq, Nk, d and dv all differ (a transposed product or the wrong √ shows), d ≠ 4 (a
# hard-coded √4 = 2 shows), Nq = 1, and d < Nq.
FIXED_SHAPES = [(3, 5, 8, 2), (6, 4, 2, 3), (1, 7, 16, 5), (5, 3, 9, 4)]


# ------------------------------------------------------------------------------------ exercise 1
def _check_scores(scores, *, seed: int | None = None) -> CheckResult:
    """scores(Q, K) -> S = Q Kᵀ / √d, shape [Nq, Nk]."""
    fixed = [case(_example.Q.astype(float), _example.K.astype(float), label="the 4×4 example of lesson 1")]
    rng = np.random.default_rng(1)
    fixed += [case(*a, label=_label(a)) for a in (_qkv(rng, *s[:3]) for s in FIXED_SHAPES)]
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(4):
        n_q, n_k, d = (int(x) for x in rng.integers(1, 13, 3))
        a = _qkv(rng, n_q, n_k, 2 * d + 1)
        drawn.append(case(*a, label=_label(a)))
    return _check("scores", scores, reference_scores, fixed, drawn, HINT_SCORES)


# ------------------------------------------------------------------------------------ exercise 2
def _spread_rows(rng, rows, cols, spread):
    """Scores whose rows sit at very different heights: row maxima up to ``spread`` apart."""
    offsets = rng.uniform(-spread, spread, (rows, 1))
    offsets[0, 0], offsets[-1, 0] = -spread, spread         # at least one pair of rows far apart
    return rng.standard_normal((rows, cols)) * 3 + offsets


def _check_softmax(softmax_rows, *, seed: int | None = None) -> CheckResult:
    """softmax_rows(S) -> each row of S turned into weights that are positive and sum to 1."""
    rng = np.random.default_rng(2)
    masked = rng.standard_normal((4, 4))
    masked[np.triu_indices(4, k=1)] = -np.inf
    fixed = [
        case(np.array([[0.0, 1.0, 2.0], [2000.0, 2001.0, 1999.0], [-1500.0, -1502.0, -1501.0]]),
             label="3 rows near 0, 2000 and -1500 (one maximum for all rows underflows two of them)"),
        case(rng.standard_normal((2, 6)) * 50 + 800, label="2×6 scores near 800 (exp(800) overflows)"),
        case(_spread_rows(rng, 4, 4, 1200), label="4×4 scores, rows up to 2400 apart"),
        case(_spread_rows(rng, 5, 2, 900), label="5×2 scores (more rows than columns), rows far apart"),
        case(rng.standard_normal((1, 7)) * 4, label="a single row of 7 scores"),
        case(masked, label="4×4 scores with -inf above the diagonal (a causal mask)"),
    ]
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(4):
        rows, cols = (int(x) for x in rng.integers(2, 10, 2))
        S = _spread_rows(rng, rows, cols, float(rng.uniform(800, 3000)))
        drawn.append(case(S, label=f"{rows}×{cols} scores, rows far apart"))
    return _check("softmax_rows", softmax_rows, _attention.softmax_np, fixed, drawn, HINT_SOFTMAX)


# ------------------------------------------------------------------------------------ exercise 3
def _far_apart_rows(rng, n_q, n_k, d=4, d_v=3):
    """Q, K, V where the rows of S sit near 0, ±1000 and ±2000: one maximum for all rows underflows."""
    Q, K, V = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d)), rng.standard_normal((n_k, d_v))
    K[:, 0] = rng.uniform(1.0, 1.5, n_k)                      # every key leans the same way
    Q[:, 0] = np.resize([0.0, 2000.0, -2000.0, 4000.0, -4000.0], n_q)
    return Q, K, V


def _check_attention(attention, *, seed: int | None = None) -> CheckResult:
    """attention(Q, K, V, causal=False) -> softmax(Q Kᵀ/√d) V, with the causal mask when asked."""
    ex = [a.astype(float) for a in (_example.Q, _example.K, _example.V)]
    rng = np.random.default_rng(3)
    plain = [case(*ex, label="the 4×4 example of lesson 1")]
    plain += [case(*a, label=_label(a)) for a in (_qkv(rng, *s) for s in FIXED_SHAPES)]
    plain += [case(*_qkv(rng, 3, 6, 4, 2, scale=8.0), label="Q (3, 4), K (6, 4) with scores in the hundreds")]
    plain += [case(*_far_apart_rows(rng, 5, 7), label="Q (5, 4), K (7, 4), rows whose scores are thousands apart")]
    causal = [case(*ex, causal=True, label="the 4×4 example, causal")]
    causal += [case(*_far_apart_rows(rng, 6, 6), causal=True, label="6×6, rows thousands apart, causal")]
    causal += [case(*_qkv(rng, 6, 6, 3, 2, scale=6.0), causal=True, label="6×6, scores in the tens, causal")]
    causal += [case(*_qkv(rng, 1, 1, 4, 3), causal=True, label="one query and one key, causal")]
    rng = np.random.default_rng(seed)
    drawn_plain, drawn_causal = [], []
    for _ in range(3):
        n_q, n_k, d, d_v = (int(x) for x in rng.integers(1, 12, 4))
        a = _qkv(rng, n_q, n_k, d + 1, d_v)
        drawn_plain.append(case(*a, label=_label(a)))
        n = int(rng.integers(2, 12))
        a = _qkv(rng, n, n, int(rng.integers(1, 9)), int(rng.integers(1, 6)), scale=3.0)
        drawn_causal.append(case(*a, causal=True, label=_label(a) + ", causal"))
    first = _check("attention", attention, _reference_attention, plain, drawn_plain, HINT_ATTENTION)
    if not first.passed:
        return first
    second = _check("attention", attention, _reference_attention, causal, drawn_causal, HINT_CAUSAL)
    if not second.passed:
        return second
    n_fixed, n_drawn = len(plain) + len(causal), len(drawn_plain) + len(drawn_causal)
    return CheckResult("attention", second.status, f"✅ attention: matches the float64 reference on "
                                                   f"{fixed_and_random(n_fixed, n_drawn)}.")


# ------------------------------------------------------------------------------------ exercise 4
def _check_positions(sinusoidal_positions, *, seed: int | None = None) -> CheckResult:
    """sinusoidal_positions(n_positions, d_model) -> PE [n_positions, d_model] (float64 or float32)."""
    # Several positions and d_model ≥ 4, so that a wrong exponent (i/d instead of 2i/d) or base shows;
    # d_model = 6 is not a multiple of 4; 128 positions make large angles.
    fixed = [case(n, d, label=f"{n} positions, d_model={d}") for n, d in ((4, 4), (10, 6), (50, 16), (128, 64))]
    rng = np.random.default_rng(seed)
    ranges = [((2, 9), (2, 5)), ((10, 65), (4, 17)), ((2, 6), (16, 33)), ((65, 129), (8, 33))]
    sizes = [(int(rng.integers(*n)), 2 * int(rng.integers(*half))) for n, half in ranges]
    drawn = [case(n, d, label=f"{n} positions, d_model={d}") for n, d in sizes]
    return _check("sinusoidal_positions", sinusoidal_positions, reference_positions, fixed, drawn, HINT_POSITIONS)


# ------------------------------------------------------------------------------------ the lab
EXERCISES = (
    Exercise(function="scores", check=_check_scores),
    Exercise(function="softmax_rows", check=_check_softmax),
    Exercise(function="attention", check=_check_attention, depends=("scores", "softmax_rows")),
    Exercise(function="sinusoidal_positions", check=_check_positions),
)

check_scores = exercise_check(EXERCISES, "scores")
check_softmax = exercise_check(EXERCISES, "softmax_rows")
check_attention = exercise_check(EXERCISES, "attention")
check_positions = exercise_check(EXERCISES, "sinusoidal_positions")


def check_lab(*, seed: int | None = None, **functions):
    """Every exercise's check: ``check_lab(scores=scores, softmax_rows=softmax_rows, attention=attention,
    sinusoidal_positions=sinusoidal_positions)``."""
    return check_exercises(EXERCISES, functions, seed=seed)
