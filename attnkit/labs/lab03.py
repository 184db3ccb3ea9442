"""Checks for lab 03, online softmax and tiled attention in NumPy.

Students write three functions:

    online_softmax(row)                    -> softmax of a 1-D row, from one streaming pass for (m, ℓ)
    merge(a, b)                            -> (m, l, z), the state over the keys of both a and b
    tiled_attention(Q, K, V, block_q, block_k) -> softmax(Q Kᵀ/√d) V, tile by tile

Each check draws fresh random inputs and compares with the float64 references of the package.
"""
from __future__ import annotations

import numpy as np

from ..classroom.checking import CheckResult, case, run_check, summarize
from ..reference.attention import attention_np, softmax_np
from ..reference.online_softmax import PartialState, block_state, empty_state, merge
from ..tolerances import tolerance

TOL = tolerance("float64") * 1e3   # float64 arithmetic in a different order: far below any real bug


def _rng():
    return np.random.default_rng()    # fresh inputs on every check


# ------------------------------------------------------------------------------ online softmax
def _row_cases():
    rng = _rng()
    return [
        case(rng.standard_normal(7), label="a row of 7 scores"),
        case(np.sort(rng.standard_normal(12) * 3), label="12 increasing scores (the maximum changes at every step)"),
        case(np.sort(rng.standard_normal(9))[::-1].copy(), label="9 decreasing scores (the maximum comes first)"),
        case(rng.standard_normal(33) * 2 + np.linspace(-4, 4, 33), label="33 scores drifting upwards"),
        case(rng.standard_normal(10) * 30 + 900, label="10 scores near 900 (exp(900) overflows)"),
        case(np.concatenate([rng.uniform(800, 1000, 4), rng.uniform(-1000, -800, 4)]),
             label="8 scores: four near +900, then four near -900"),
        case(np.array([rng.standard_normal()]), label="a single score"),
    ]


def check_online_softmax(online_softmax) -> CheckResult:
    """online_softmax(row) -> the softmax of the 1-D array ``row``."""
    return run_check("online_softmax", online_softmax, softmax_np, _row_cases(), tol=TOL,
                     hint="keep the running maximum m and the running sum ℓ; when the maximum grows from "
                          "m to m_new, multiply ℓ by exp(m − m_new) before adding exp(x − m_new); at the end "
                          "return exp(row − m) / ℓ.")


# ------------------------------------------------------------------------------------ merge rule
def _random_state(rng, rows, dv, n_keys, shift=0.0) -> tuple:
    scores = rng.standard_normal((rows, n_keys)) * 2 + shift
    values = rng.standard_normal((n_keys, dv))
    s = block_state(scores, values)
    return (s.m, s.l, s.z)


def _merge_cases():
    rng = _rng()
    cases = []
    a, b = _random_state(rng, 3, 2, 4, shift=0.0), _random_state(rng, 3, 2, 5, shift=3.0)
    cases.append(case(a, b, label="3 rows, b holds the larger scores"))
    a, b = _random_state(rng, 4, 3, 6, shift=3.0), _random_state(rng, 4, 3, 2, shift=0.0)
    cases.append(case(a, b, label="4 rows, a holds the larger scores"))
    a = _random_state(rng, 5, 4, 3, shift=0.0)
    b = _random_state(rng, 5, 4, 7, shift=0.0)
    b = (b[0] + np.array([-5.0, 5.0, -5.0, 5.0, 0.0]), b[1], b[2])       # larger max in some rows only
    cases.append(case(a, b, label="5 rows, the larger maximum differs from row to row"))
    e = empty_state(3, 2)
    cases.append(case((e.m, e.l, e.z), _random_state(rng, 3, 2, 4), label="a is the empty state (m=-inf, l=0, z=0)"))
    a, b = _random_state(rng, 2, 3, 5, shift=500.0), _random_state(rng, 2, 3, 5, shift=510.0)
    cases.append(case(a, b, label="2 rows with scores near 500"))
    return cases


def _flatten_state(state):
    """(m, l, z) as one vector m | l | z, so that the report can show where it differs."""
    if isinstance(state, (tuple, list)) and len(state) == 3:
        return np.concatenate([np.ravel(np.asarray(x, dtype=np.float64)) for x in state])
    size = f" of {len(state)} items" if isinstance(state, (tuple, list)) else ""
    raise TypeError(f"merge must return a tuple (m, l, z) of three arrays, got a {type(state).__name__}{size}")


def _merge_ref(a, b):
    s = merge(PartialState(*a), PartialState(*b))
    return _flatten_state((s.m, s.l, s.z))


def check_merge(merge_fn) -> CheckResult:
    """merge(a, b) -> (m, l, z) where a = (m_a, l_a, z_a), b = (m_b, l_b, z_b); m, l: [rows], z: [rows, dv].

    The report shows the three arrays flattened one after another: m (rows values), l (rows), z (rows·dv).
    """
    return run_check(
        "merge", lambda a, b: _flatten_state(merge_fn(a, b)), _merge_ref, _merge_cases(), tol=TOL,
        hint="m = max(m_a, m_b) row by row; then l = exp(m_a − m)·l_a + exp(m_b − m)·l_b and "
             "z = exp(m_a − m)[:, None]·z_a + exp(m_b − m)[:, None]·z_b. Return the tuple (m, l, z) "
             "(the report lists m, then l, then z, flattened).")


# ----------------------------------------------------------------------------- tiled attention
def _tiled_cases():
    rng = _rng()
    shapes = [  # (N_q, N_k, d, dv, block_q, block_k)
        (4, 4, 4, 2, 2, 2),
        (10, 10, 8, 8, 4, 4),        # N not a multiple of the tile
        (7, 13, 16, 5, 3, 4),        # N_q ≠ N_k, d ≠ dv, ragged tiles on both axes
        (16, 9, 8, 8, 16, 2),        # one query block, many key blocks
        (5, 20, 4, 3, 2, 32),        # one key block larger than N_k
    ]
    cases = []
    for n_q, n_k, d, dv, bq, bk in shapes:
        Q, K, V = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d)), rng.standard_normal((n_k, dv))
        cases.append(case(Q, K, V, bq, bk, label=f"Q {Q.shape}, K {K.shape}, V {V.shape}, tiles {bq}×{bk}"))
    Q, K, V = rng.standard_normal((6, 4)) * 12, rng.standard_normal((11, 4)) * 12, rng.standard_normal((11, 3))
    cases.append(case(Q, K, V, 4, 3, label="large scores (up to a few hundred), tiles 4×3"))
    # Scores that grow along the keys by about 1500: a stale maximum overflows exp.
    Q = np.abs(rng.standard_normal((5, 4))) + np.array([50.0, 0, 0, 0])
    K = np.column_stack([np.linspace(-30, 30, 9), rng.standard_normal((9, 3))])
    V = rng.standard_normal((9, 2))
    cases.append(case(Q, K, V, 2, 3, label="scores rising from about -800 to +800 along the keys, tiles 2×3"))
    return cases


def check_tiled_attention(tiled_attention) -> CheckResult:
    """tiled_attention(Q, K, V, block_q, block_k) -> softmax(Q Kᵀ/√d) V, [N_q, dv]."""
    return run_check(
        "tiled_attention", tiled_attention,
        lambda Q, K, V, block_q, block_k: attention_np(Q, K, V), _tiled_cases(), tol=TOL,
        hint="for each block of query rows start from m = -inf, l = 0, z = 0; for each key/value block "
             "compute the scores S = Q_i K_jᵀ/√d, turn them into a block state and merge it in; the last "
             "tiles may be shorter than block_q / block_k; finish with O_i = z / l.")


EXERCISES = {
    "online_softmax": check_online_softmax,
    "merge": check_merge,
    "tiled_attention": check_tiled_attention,
}


def check_all(online_softmax, merge_fn, tiled_attention):
    """All three checks together, with a one-line score."""
    return summarize([check_online_softmax(online_softmax), check_merge(merge_fn),
                      check_tiled_attention(tiled_attention)])
