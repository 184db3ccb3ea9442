"""Fresh wrong answers (and alternative correct answers) for lab 03, written from the student notebook
and the solutions only. Each function's docstring names the exercise it answers and the mistake."""
import math

import numpy as np


# ---------------------------------------------------------------- exercise 1: online_softmax
def online_no_rescale(blocks):
    """Exercise 1. Adds each block's sum relative to the new max but never rescales the old l."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m = max(m, float(block.max()))
        l = l + float(np.exp(block - m).sum())
    return m, l


def online_update_order(blocks):
    """Exercise 1. Updates m before the rescale, so exp(m - m_new) is always 1."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        m = m_new
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
    return m, l


def online_first_block_max(blocks):
    """Exercise 1. Takes the first block's maximum as the row maximum and never updates it."""
    m, l = -math.inf, 0.0
    for block in blocks:
        if m == -math.inf:
            m = float(block.max())
        l = l + float(np.exp(block - m).sum())
    return m, l


def online_keeps_references(blocks):
    """Exercise 1. Keeps the blocks (references into the reused buffer) and computes at the end."""
    kept = [block for block in blocks]
    x = np.concatenate(kept)
    m = float(x.max())
    return m, float(np.exp(x - m).sum())


def online_float16_sum(blocks):
    """Exercise 1. Accumulates l in float16."""
    m, l = -math.inf, np.float16(0.0)
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = np.float16(l * np.float16(math.exp(m - m_new))) + np.float16(np.exp(block - m_new).sum())
        m = m_new
    return m, float(l)


def online_rescale_inverted(blocks):
    """Exercise 1. Rescales the old sum by exp(m_new - m) instead of exp(m - m_new)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        scale = math.exp(m_new - m) if l > 0 else 0.0
        l = l * scale + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


# ---------------------------------------------------------------- exercise 2: merge
def merge_swapped_factors(a, b):
    """Exercise 2. Weights a's state with b's factor and b's with a's."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, beta * l_a + alpha * l_b, beta[:, None] * z_a + alpha[:, None] * z_b


def merge_l_unscaled(a, b):
    """Exercise 2. Rescales z but adds the l's as they are."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, l_a + l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def merge_difference_form(a, b):
    """Exercise 2. Uses d = m_a - m_b and exp(-|d|): NaN when both states are empty (-inf - -inf)."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    d = m_a - m_b
    small = np.exp(-np.abs(d))
    alpha = np.where(d >= 0, 1.0, small)
    beta = np.where(d >= 0, small, 1.0)
    m = np.where(d >= 0, m_a, m_b)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def merge_loop_rows(a, b):
    """Exercise 2. Correct numbers, but a Python loop over the rows (the lab forbids it)."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.empty_like(m_a)
    l = np.empty_like(l_a)
    z = np.empty_like(z_a)
    for r in range(len(m_a)):
        m[r] = max(m_a[r], m_b[r])
        x, y = math.exp(m_a[r] - m[r]), math.exp(m_b[r] - m[r])
        l[r] = x * l_a[r] + y * l_b[r]
        z[r] = x * z_a[r] + y * z_b[r]
    return m, l, z


def merge_scalar_max(a, b):
    """Exercise 2. One maximum over all rows of both states instead of one per row."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m_all = max(m_a.max(), m_b.max())
    m = np.full_like(m_a, m_all)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def merge_nan_to_zero(a, b):
    """Exercise 2. Guards empty states by replacing a maximum of -inf with 0 (np.nan_to_num(m, neginf=0))."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m_a, m_b = np.nan_to_num(m_a, neginf=0.0), np.nan_to_num(m_b, neginf=0.0)
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


# ---------------------------------------------------------------- exercise 3: tiled_attention
def _merge(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def tiled_drops_last_key_block(Q, K, V, block_q, block_k):
    """Exercise 3. Key loop range(0, n_k - block_k + 1, block_k): the partial last key block is skipped."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, max(n_k - block_k + 1, 1), block_k):
            S = Q_i @ K[k0:k0 + block_k].T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = _merge(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


def tiled_state_not_reset(Q, K, V, block_q, block_k):
    """Exercise 3. Starts from the empty state once, before the query loop, not once per query block."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    state = (np.full(block_q, -np.inf), np.zeros(block_q), np.zeros((block_q, dv)))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = tuple(x[:rows] for x in state)
        for k0 in range(0, n_k, block_k):
            S = Q_i @ K[k0:k0 + block_k].T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = _merge(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


def tiled_whole_matrix(Q, K, V, block_q, block_k):
    """Exercise 3. Ignores the tiles: builds the whole score matrix (the lab forbids it)."""
    S = Q @ K.T / math.sqrt(Q.shape[1])
    P = np.exp(S - S.max(axis=1, keepdims=True))
    return (P / P.sum(axis=1, keepdims=True)) @ V


def tiled_block_k_for_queries(Q, K, V, block_q, block_k):
    """Exercise 3. Steps the query loop by block_k (mixes up the two tile sizes)."""
    return _tiled(Q, K, V, block_k, block_k)


def tiled_scale_dv(Q, K, V, block_q, block_k):
    """Exercise 3. Scales by 1/sqrt(dv) (V's width) instead of 1/sqrt(d)."""
    return _tiled(Q, K, V, block_q, block_k, scale=1 / math.sqrt(V.shape[1]))


def tiled_no_max_in_block(Q, K, V, block_q, block_k):
    """Exercise 3. Block state with m = 0 (no per-block maximum): exp overflows on large scores."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    with np.errstate(over="ignore", invalid="ignore"):
        for q0 in range(0, n_q, block_q):
            Q_i = Q[q0:q0 + block_q]
            rows = len(Q_i)
            state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
            for k0 in range(0, n_k, block_k):
                S = Q_i @ K[k0:k0 + block_k].T * scale
                m = np.zeros(rows)
                P = np.exp(S)
                state = _merge(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
            O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


def tiled_one_row_at_a_time(Q, K, V, block_q, block_k):
    """Exercise 3. Tiles the keys but takes one query row at a time (the lab forbids it)."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    O = np.zeros((n_q, dv))
    for i in range(n_q):
        O[i] = _tiled(Q[i:i + 1], K, V, 1, block_k)[0]
    return O


def _tiled(Q, K, V, block_q, block_k, scale=None, reverse=False):
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d) if scale is None else scale
    O = np.zeros((n_q, dv))
    starts = list(range(0, n_k, block_k))
    if reverse:
        starts = starts[::-1]
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in starts:
            S = Q_i @ K[k0:k0 + block_k].T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = _merge(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


# ---------------------------------------------------------------- correct alternatives
def correct_online_logaddexp(blocks):
    """Exercise 1, correct: keeps the running log-sum-exp, returns (m, exp(lse - m))."""
    m, lse = -math.inf, -math.inf
    for block in blocks:
        bm = float(block.max())
        blse = bm + math.log(float(np.exp(block - bm).sum()))
        m = max(m, bm)
        lse = float(np.logaddexp(lse, blse))
    return m, math.exp(lse - m)


def correct_merge_where(a, b):
    """Exercise 2, correct: factors via np.where on which state holds the maximum."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.where(m_a >= m_b, m_a, m_b)
    with np.errstate(invalid="ignore"):
        alpha = np.where(m_a == -np.inf, 0.0, np.exp(m_a - m))
        beta = np.where(m_b == -np.inf, 0.0, np.exp(m_b - m))
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def correct_tiled_reverse_keys(Q, K, V, block_q, block_k):
    """Exercise 3, correct: walks the key blocks from last to first (the merge is commutative)."""
    return _tiled(Q, K, V, block_q, block_k, reverse=True)


WRONG = {
    "online_softmax": [online_no_rescale, online_update_order, online_first_block_max, online_keeps_references,
                       online_float16_sum, online_rescale_inverted],
    "merge": [merge_swapped_factors, merge_l_unscaled, merge_difference_form, merge_loop_rows, merge_scalar_max,
              merge_nan_to_zero],
    "tiled_attention": [tiled_drops_last_key_block, tiled_state_not_reset, tiled_whole_matrix,
                        tiled_block_k_for_queries, tiled_scale_dv, tiled_no_max_in_block, tiled_one_row_at_a_time],
}
CORRECT = {
    "online_softmax": [correct_online_logaddexp],
    "merge": [correct_merge_where],
    "tiled_attention": [correct_tiled_reverse_keys],
}
