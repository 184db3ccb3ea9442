"""Checks for lab 01, attention by hand. Each check takes the student's function and reports."""
from __future__ import annotations

import math

import numpy as np

from ..classroom.checking import CheckResult, case, run_check
from ..reference.attention import attention_np, softmax_np
from ..tolerances import tolerance

TOL = tolerance("float64") * 1e3   # float64 arithmetic in a different order: far below any real bug


def reference_scores(Q, K):
    return Q @ K.T / math.sqrt(Q.shape[-1])


def reference_positions(n_positions, d_model):
    pos = np.arange(n_positions)[:, None]
    inv_freq = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((n_positions, d_model))
    pe[:, 0::2] = np.sin(pos * inv_freq)
    pe[:, 1::2] = np.cos(pos * inv_freq)
    return pe


def _rng():
    return np.random.default_rng()    # fresh inputs on every check


def _qkv_cases(with_values: bool):
    rng = _rng()
    shapes = [(4, 4, 4, 2), (3, 7, 8, 5), (9, 5, 16, 3), (1, 6, 2, 4), (12, 12, 32, 8)]
    cases = []
    for n_q, n_k, d, d_v in shapes:
        arrays = [rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d))]
        if with_values:
            arrays.append(rng.standard_normal((n_k, d_v)))
        label = f"Q {arrays[0].shape}, K {arrays[1].shape}" + (f", V {arrays[2].shape}" if with_values else "")
        cases.append(case(*arrays, label=label))
    return cases


def check_scores(scores) -> CheckResult:
    """scores(Q, K) -> S = Q Kᵀ / √d, shape [Nq, Nk]."""
    return run_check("scores", scores, reference_scores, _qkv_cases(False), tol=TOL,
                     hint="S[i, j] is the dot product of query i and key j, divided by √d (d = Q.shape[1]).")


def check_softmax(softmax_rows) -> CheckResult:
    """softmax_rows(S) -> each row of S turned into weights that are positive and sum to 1."""
    rng = _rng()
    cases = [case(rng.standard_normal((4, 4)), label="4×4 scores"),
             case(rng.standard_normal((3, 9)) * 3, label="3×9 scores"),
             case(rng.standard_normal((5, 2)), label="5×2 scores (more rows than columns)"),
             case(rng.standard_normal((2, 6)) * 50 + 800, label="2×6 scores near 800 (exp overflows)")]
    return run_check("softmax_rows", softmax_rows, softmax_np, cases, tol=TOL,
                     hint="normalise along each row (axis=-1), and subtract the row's maximum before exp "
                          "so that large scores do not overflow.")


def check_attention(attention) -> CheckResult:
    """attention(Q, K, V, causal=False) -> softmax(Q Kᵀ/√d) V, with the causal mask when asked."""
    cases = _qkv_cases(True)
    square = [c for c in _qkv_cases(True) if c.args[0].shape[0] == c.args[1].shape[0]]
    cases += [case(*c.args, causal=True, label=c.label + ", causal") for c in square]
    return run_check("attention", attention, lambda Q, K, V, causal=False: attention_np(Q, K, V, causal=causal),
                     cases, tol=TOL,
                     hint="mask before the softmax: query i may see keys j ≤ i (set S[i, j] = -inf for j > i), "
                          "then softmax each row and multiply by V.")


def check_positions(sinusoidal_positions) -> CheckResult:
    """sinusoidal_positions(n_positions, d_model) -> PE [n_positions, d_model]."""
    rng = _rng()
    # (positions, d_model / 2) ranges: a few positions and a narrow model up to many and a wide one.
    # At least 2 positions and d_model >= 4, so that a wrong exponent (i/d instead of 2i/d) shows.
    ranges = [((2, 9), (2, 5)), ((10, 65), (4, 17)), ((2, 6), (16, 33)), ((65, 129), (8, 33))]
    sizes = [(int(rng.integers(*n)), 2 * int(rng.integers(*half))) for n, half in ranges]
    cases = [case(n, d, label=f"{n} positions, d_model={d}") for n, d in sizes]
    return run_check("sinusoidal_positions", sinusoidal_positions, reference_positions, cases, tol=TOL,
                     hint="even columns 2i hold sin(pos / 10000^(2i/d_model)), odd columns 2i+1 the cos "
                          "of the same angle.")


# The exercises of the lab: the student's function name -> its check.
EXERCISES = {
    "scores": check_scores,
    "softmax_rows": check_softmax,
    "attention": check_attention,
    "sinusoidal_positions": check_positions,
}
