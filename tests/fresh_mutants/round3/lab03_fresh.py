"""Round 3 of fresh wrong answers for lab 03 (online softmax), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py."""
import math

import numpy as np

from attnkit.classroom.checking import OneShotStream

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

# ---------------------------------------------------------------- exercise 1: online softmax


def os_block_mean(blocks):
    """Exercise 1. np.exp(...).mean() where the block's sum belongs (reads ℓ as an average)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).mean())
        m = m_new
    return m, l


def os_rescale_base2(blocks):
    """Exercise 1. Rescaled the old sum with 2 ** (m - m_new) (a GPU's exp2 habit) while the block's terms use e."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * 2 ** (m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_skip_far_blocks(blocks):
    """Exercise 1. 'Optimisation': skips a block whose maximum lies more than 10 below the running maximum
    (its terms are at most e^-10 each, but they are not 0)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        if float(block.max()) < m - 10:
            continue
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


# ---------------------------------------------------------------- exercise 2: merge


def mg_reference_b(a, b):
    """Exercise 2. Takes b's maximum as the reference (b holds the later keys, 'so the larger one'): the factor
    e^(m_a - m_b) overflows when a's maximum is far larger, and m is not the maximum."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = m_b
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l = alpha * l_a + beta * l_b
    z = alpha[:, None] * z_a + beta[:, None] * z_b
    return m, l, z


def mg_empty_shortcut_first_row(a, b):
    """Exercise 2. Returns b when a is empty, testing only a's first row (np.isinf(m_a[0])): a state empty in
    row 0 but not in the others loses its other rows."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    if np.isinf(m_a[0]):
        return m_b, l_b, z_b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l = alpha * l_a + beta * l_b
    z = alpha[:, None] * z_a + beta[:, None] * z_b
    return m, l, z


# ---------------------------------------------------------------- exercise 3: tiled attention


def ta_skip_first_key_block(Q, K, V, block_q, block_k):
    """Exercise 3. Key loop range(block_k, n_k, block_k): starts one block late, the first keys are never seen."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(block_k, n_k, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_state_rows_block_q(Q, K, V, block_q, block_k):
    """Exercise 3. The empty state sized block_q rows, not the block's real rows: right only when block_q
    divides Nq (the last, shorter query block does not broadcast)."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = block_q
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


def ta_remainder_twice(Q, K, V, block_q, block_k):
    """Exercise 3. Adds a 'remainder' step for the partial last key block after the loop, which the loop had
    already merged: when block_k does not divide Nk the last keys count twice."""
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
        if n_k % block_k:
            k0 = n_k - n_k % block_k
            K_j, V_j = K[k0:], V[k0:]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


# ---------------------------------------------------------------- correct alternatives


def merge_guarded(a, b):
    """Exercise 2, correct: the factors through np.where, 0 where a state's maximum is -inf."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    with np.errstate(invalid="ignore"):
        alpha = np.where(np.isneginf(m_a), 0.0, np.exp(m_a - m))
        beta = np.where(np.isneginf(m_b), 0.0, np.exp(m_b - m))
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def tiled_prescaled(Q, K, V, block_q, block_k):
    """Exercise 3, correct: the query block scaled once, the block's state by its own merge call order (new, old)."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q] / math.sqrt(d)
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            S = Q_i @ K[k0:k0 + block_k].T
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge((m, P.sum(axis=1), P @ V[k0:k0 + block_k]), state)
        O[q0:q0 + rows] = state[2] / state[1][:, None]
    return O


WRONG = {
    "online_softmax": [os_block_mean, os_rescale_base2, os_skip_far_blocks],
    "merge": [mg_reference_b, mg_empty_shortcut_first_row],
    "tiled_attention": [ta_skip_first_key_block, ta_state_rows_block_q, ta_remainder_twice],
}
CORRECT = {"merge": [merge, merge_guarded], "tiled_attention": [tiled_attention, tiled_prescaled]}

_blocks = [np.array([1.0, 3.5]), np.array([20.0, 2.0, -4.0]), np.array([9.5, 5.0]), np.array([19.0])]
_a = (np.array([-np.inf, 800.0, 1.0]), np.array([0.0, 1.5, 2.0]), np.arange(6.0).reshape(3, 2))
_b = (np.array([2.0, -5.0, 3.0]), np.array([1.0, 1.0, 1.2]), np.ones((3, 2)))
_rng = np.random.default_rng(3)
_Q, _K, _V = _rng.normal(size=(7, 4)) * 2, _rng.normal(size=(9, 4)) * 2, _rng.normal(size=(9, 3))


def _stream(f):
    return f(OneShotStream([b.copy() for b in _blocks]))


WITNESS = {
    **{f.__name__: _stream for f in WRONG["online_softmax"]},
    **{f.__name__: (lambda f: f(tuple(x.copy() for x in _a), tuple(x.copy() for x in _b))) for f in WRONG["merge"]},
    **{f.__name__: (lambda f: f(_Q, _K, _V, 3, 2)) for f in WRONG["tiled_attention"]},
}
