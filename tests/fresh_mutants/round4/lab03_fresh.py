"""Round 4 of fresh wrong answers for lab 03 (online softmax in NumPy), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New classes
here: a maximum truncated to an integer, the reference taken from the last block, a merge that changes its
input in place, states returned as columns, a last key block of one key dropped, one maximum per tile, scores
rounded to float32."""
import math

import numpy as np

# ---------------------------------------------------------------- the solution


def online_softmax(blocks):
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def merge(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l = alpha * l_a + beta * l_b
    z = alpha[:, None] * z_a + beta[:, None] * z_b
    return m, l, z


def tiled_attention(Q, K, V, block_q, block_k):
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


SOLUTION = {"online_softmax": online_softmax, "merge": merge, "tiled_attention": tiled_attention}

# ---------------------------------------------------------------- exercise 1


def os_max_truncated(blocks):
    """Exercise 1. m_new = max(m, int(block.max())) ('a whole number is enough for a shift'): l is consistent
    with the m returned, but m is not the row's maximum (3.7 becomes 3)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, int(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_last_block_reference(blocks):
    """Exercise 1. Each block's terms and the rescale measured against that block's own maximum, while m keeps
    the running maximum: l ends up relative to the last block's maximum, not to m."""
    m, l, ref = -math.inf, 0.0, -math.inf
    for block in blocks:
        b_max = float(block.max())
        l = l * math.exp(ref - b_max) + float(np.exp(block - b_max).sum())
        ref = b_max
        m = max(m, b_max)
    return m, l


# ---------------------------------------------------------------- exercise 2


def mg_in_place(a, b):
    """Exercise 2. Rescales a's arrays in place and returns them ('no new arrays'): the result is right, but
    the caller's state a is changed."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l_a *= alpha
    l_a += beta * l_b
    z_a *= alpha[:, None]
    z_a += beta[:, None] * z_b
    return m, l_a, z_a


def mg_column_state(a, b):
    """Exercise 2. Works on columns, m[:, None] from the start ('so z broadcasts'), and returns m and l as
    [rows, 1] instead of [rows]."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)[:, None]
    alpha, beta = np.exp(m_a[:, None] - m), np.exp(m_b[:, None] - m)
    l = alpha * l_a[:, None] + beta * l_b[:, None]
    z = alpha * z_a + beta * z_b
    return m, l, z


# ---------------------------------------------------------------- exercise 3


def ta_last_key_of_one_dropped(Q, K, V, block_q, block_k):
    """Exercise 3. Key loop range(0, n_k - 1, block_k) ('the last index is n_k - 1'): a last key block that
    holds exactly one key (n_k ≡ 1 mod block_k) is never seen."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k - 1, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_tile_max(Q, K, V, block_q, block_k):
    """Exercise 3. The block's m is one number for the whole tile, S.max() ('the tile's maximum'), repeated
    for every row: a row whose scores lie far below another row's underflows to 0/0."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = np.full(rows, S.max())
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_scores_float32(Q, K, V, block_q, block_k):
    """Exercise 3. Each score tile stored in float32 ('a GPU keeps scores in fp32'): scores in the thousands
    keep only about 4 decimals, and a difference of two of them loses the rest."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = (Q_i @ K_j.T * scale).astype(np.float32)
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


# ---------------------------------------------------------------- correct alternatives


def merge_fmax_guarded(a, b):
    """Exercise 2, correct: np.fmax for the maximum and each factor 0 where its state's maximum is -inf."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.fmax(m_a, m_b)
    with np.errstate(invalid="ignore"):
        alpha = np.where(np.isneginf(m_a), 0.0, np.exp(m_a - m))
        beta = np.where(np.isneginf(m_b), 0.0, np.exp(m_b - m))
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def tiled_queries_last_first(Q, K, V, block_q, block_k):
    """Exercise 3, correct: query blocks from the last to the first, the number of blocks by negative floor
    division, each block's state merged as (new, old)."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for i in reversed(range(-(-n_q // block_q))):
        q0 = i * block_q
        Q_i = Q[q0:q0 + block_q]
        rows = Q_i.shape[0]
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            S = Q_i @ K[k0:k0 + block_k].T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge((m, P.sum(axis=1), P @ V[k0:k0 + block_k]), state)
        O[q0:q0 + rows] = state[2] / state[1][:, None]
    return O


WRONG = {
    "online_softmax": [os_max_truncated, os_last_block_reference],
    "merge": [mg_in_place, mg_column_state],
    "tiled_attention": [ta_last_key_of_one_dropped, ta_tile_max, ta_scores_float32],
}
CORRECT = {"merge": [merge, merge_fmax_guarded], "tiled_attention": [tiled_attention, tiled_queries_last_first]}

_rng = np.random.default_rng(4)
_blocks = [np.array([1.0, 3.7]), np.array([9.2, 0.5]), np.array([2.0])]
_a = (np.array([1.0, -np.inf, 3.0]), np.array([2.0, 0.0, 1.5]), _rng.normal(size=(3, 2)))
_b = (np.array([2.0, 0.5, -np.inf]), np.array([1.0, 3.0, 0.0]), _rng.normal(size=(3, 2)))
_Q, _K, _V = _rng.normal(size=(6, 4)), _rng.normal(size=(9, 4)), _rng.normal(size=(9, 3))
_Qbig = _rng.normal(size=(4, 4)) * np.array([[40.0], [40.0], [1.0], [1.0]])
_Kbig = _rng.normal(size=(5, 4)) * 40


def _merge_then_a(f):
    a = tuple(x.copy() for x in _a)
    out = f(a, _b)
    return [out, list(a)]


WITNESS = {
    "os_max_truncated": lambda f: f(iter(_blocks)),
    "os_last_block_reference": lambda f: f(iter(_blocks)),
    "mg_in_place": _merge_then_a,
    "mg_column_state": lambda f: [x.shape for x in f(_a, _b)],
    "ta_last_key_of_one_dropped": lambda f: f(_Q, _K, _V, 2, 4),
    "ta_tile_max": lambda f: f(np.array([[200.0] * 4, [-200.0] * 4]), 1 + 0.01 * _K, _V, 2, 4),
    "ta_scores_float32": lambda f: f(_Qbig, _Kbig, _V[:5], 2, 2),
}
