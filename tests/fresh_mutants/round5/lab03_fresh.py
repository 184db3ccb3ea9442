"""Round 5 of fresh wrong answers for lab 03 (online softmax in NumPy), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New classes
here: a stream iterated twice (a peek at the first block), a block's exponentials in float32, z merged as a
weighted average, weights that sum to one, a query tile scaled in place through a view of the caller's Q,
a key loop bounded by n_q."""
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


def os_peeks_first_block(blocks):
    """Exercise 1. Starts the state from the first block, taken with next(iter(blocks)), then loops over
    `blocks` again ('the loop skips it'): a list hands the first block over twice, a one-pass stream hands
    over nothing more."""
    first = next(iter(blocks))
    m = float(first.max())
    l = float(np.exp(first - m).sum())
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_block_sum_float32(blocks):
    """Exercise 1. Each block's exponentials summed in float32, np.exp(..., dtype=np.float32) ('a GPU sums in
    fp32'): l keeps about 7 digits."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new, dtype=np.float32).sum())
        m = m_new
    return m, l


# ---------------------------------------------------------------- exercise 2


def mg_average_z(a, b):
    """Exercise 2. z merged as a weighted average, (αz_a + βz_b)/(α + β) ('as outputs are merged'): z is an
    unnormalised sum, so its parts add with their factors and nothing divides them."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l = alpha * l_a + beta * l_b
    z = (alpha[:, None] * z_a + beta[:, None] * z_b) / (alpha + beta)[:, None]
    return m, l, z


def mg_beta_one_minus_alpha(a, b):
    """Exercise 2. β = 1 − α ('the two factors are weights, they sum to 1'): right only where one maximum
    is the merged one and the other state is empty."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha = np.exp(m_a - m)
    beta = 1 - alpha
    l = alpha * l_a + beta * l_b
    z = alpha[:, None] * z_a + beta[:, None] * z_b
    return m, l, z


# ---------------------------------------------------------------- exercise 3


def ta_scales_query_view(Q, K, V, block_q, block_k):
    """Exercise 3. Scales the query block once, Q_i *= scale ('instead of every score tile'): Q_i is a view of
    the caller's Q, so Q itself is scaled; the output is right, a second call on the same Q is not."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        Q_i *= scale
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_key_loop_to_nq(Q, K, V, block_q, block_k):
    """Exercise 3. The key loop copied from the query loop, range(0, n_q, block_k): with more keys than
    queries the last keys are never seen (with fewer, an empty key slice)."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_q, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


# ---------------------------------------------------------------- correct alternatives


def online_from_iterator(blocks):
    """Exercise 1, correct: one iterator; the state starts from its first block, the loop takes the rest."""
    it = iter(blocks)
    first = next(it, None)
    if first is None:
        return -math.inf, 0.0
    m = float(first.max())
    l = float(np.exp(first - m).sum())
    for block in it:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def tiled_running_reference(Q, K, V, block_q, block_k):
    """Exercise 3, correct: each block's state measured against the running maximum (any reference works as
    long as m, l and z share it)."""
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
            m = np.maximum(state[0], S.max(axis=1))
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


WRONG = {
    "online_softmax": [os_peeks_first_block, os_block_sum_float32],
    "merge": [mg_average_z, mg_beta_one_minus_alpha],
    "tiled_attention": [ta_scales_query_view, ta_key_loop_to_nq],
}
CORRECT = {"online_softmax": [online_softmax, online_from_iterator],
           "tiled_attention": [tiled_attention, tiled_running_reference]}

_rng = np.random.default_rng(5)
_blocks = [np.array([1.0, 3.7]), np.array([9.2, 0.5]), np.array([2.0])]
_long = [_rng.normal(size=300) for _ in range(3)]
_a = (np.array([1.0, -np.inf, 3.0]), np.array([2.0, 0.0, 1.5]), _rng.normal(size=(3, 2)))
_b = (np.array([2.0, 0.5, 1.0]), np.array([1.0, 3.0, 2.0]), _rng.normal(size=(3, 2)))
_Q, _K, _V = _rng.normal(size=(6, 4)), _rng.normal(size=(9, 4)), _rng.normal(size=(9, 3))


def _twice_same_q(f):
    Q = _Q.copy()
    f(Q, _K, _V, 2, 4)
    return f(Q, _K, _V, 2, 4)


WITNESS = {
    "os_peeks_first_block": lambda f: f(list(_blocks)),
    "os_block_sum_float32": lambda f: f(iter(_long)),
    "mg_average_z": lambda f: f(_a, _b),
    "mg_beta_one_minus_alpha": lambda f: f(_a, _b),
    "ta_scales_query_view": _twice_same_q,
    "ta_key_loop_to_nq": lambda f: f(_Q, _K, _V, 2, 4),
}
