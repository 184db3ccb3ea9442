"""Round 6 of fresh wrong answers for lab 03 (online softmax in NumPy), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in round 5. New classes here: the
blocks kept (the stream reuses its buffer), a state kept across calls, a factor broadcast along the columns
(silent when rows = dv), one maximum for every row, the partial last query tile dropped, an empty state
started at m = 0, a key loop stepped by block_q (right when block_q = block_k). The correct answers: the
running sum kept as a log, a merge that guards an empty maximum with np.where, an output of np.empty filled
tile by tile, and a block's state referred to the running maximum directly."""
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


def os_keeps_blocks(blocks):
    """Exercise 1. The blocks kept in a list and reduced at the end ('one pass to read, then compute'): the
    stream reuses its buffer, so every kept block is the last one (and the pass is not online)."""
    kept = [block for block in blocks]
    m = max(float(b.max()) for b in kept)
    return m, float(sum(np.exp(b - m).sum() for b in kept))


_STATE = {"m": -math.inf, "l": 0.0}


def os_state_across_calls(blocks):
    """Exercise 1. The running state kept in a module dict ('like a kernel's registers') and never reset: the
    first row is right, every later row starts from the previous row's (m, l)."""
    m, l = _STATE["m"], _STATE["l"]
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    _STATE["m"], _STATE["l"] = m, l
    return m, l


# ---------------------------------------------------------------- exercise 2


def mg_factor_on_columns(a, b):
    """Exercise 2. z scaled as alpha * z_a without [:, None] ('NumPy broadcasts'): alpha [rows] multiplies z's
    columns; when rows = dv it runs and is wrong, otherwise it raises."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l = alpha * l_a + beta * l_b
    z = alpha * z_a + beta * z_b
    return m, l, z


def mg_one_max_for_all_rows(a, b):
    """Exercise 2. m = max over every row of both states ('the largest score'): rows whose maxima lie 1000
    below another row's underflow to l = 0."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.full_like(m_a, max(m_a.max(), m_b.max()))
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l = alpha * l_a + beta * l_b
    z = alpha[:, None] * z_a + beta[:, None] * z_b
    return m, l, z


# ---------------------------------------------------------------- exercise 3


def ta_full_query_tiles_only(Q, K, V, block_q, block_k):
    """Exercise 3. Query tiles from range(0, n_q - block_q + 1, block_q) ('only whole tiles'): the rows of a
    partial last tile are left at 0."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q - block_q + 1, block_q):
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


def ta_empty_state_m_zero(Q, K, V, block_q, block_k):
    """Exercise 3. The empty state started at m = 0 ('no -inf needed, l and z are 0'): exact while a row's
    scores reach above about -745; a row of scores near -1000 underflows to 0/0."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.zeros(rows), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_key_loop_by_block_q(Q, K, V, block_q, block_k):
    """Exercise 3. The key loop stepped by block_q, range(0, n_k, block_q) ('the tiles are square'): right
    when block_q = block_k; otherwise keys are skipped or counted twice."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_q):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


# ---------------------------------------------------------------- correct alternatives


def online_log_sum(blocks):
    """Exercise 1, correct: the running sum kept as log l (np.logaddexp of the block's log-sum), exponentiated
    at the end."""
    m, log_l = -math.inf, -math.inf
    for block in blocks:
        b_max = float(block.max())
        m_new = max(m, b_max)
        block_log = b_max - m_new + math.log(float(np.exp(block - b_max).sum()))
        log_l = float(np.logaddexp(log_l + (m - m_new if m > -math.inf else 0.0), block_log))
        m = m_new
    return m, math.exp(log_l)


def merge_where_guard(a, b):
    """Exercise 2, correct: each factor is 0 where its state is empty, by np.where, and exp elsewhere."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    with np.errstate(invalid="ignore"):
        alpha = np.where(np.isneginf(m_a), 0.0, np.exp(m_a - m))
        beta = np.where(np.isneginf(m_b), 0.0, np.exp(m_b - m))
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def tiled_attention_empty_out(Q, K, V, block_q, block_k):
    """Exercise 3, correct: O allocated with np.empty (every row is written by its tile), the scale folded
    into each query tile."""
    n_q, d = Q.shape
    dv = V.shape[1]
    O = np.empty((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q] / math.sqrt(d)
        state = (np.full(len(Q_i), -np.inf), np.zeros(len(Q_i)), np.zeros((len(Q_i), dv)))
        for k0 in range(0, K.shape[0], block_k):
            S = Q_i @ K[k0:k0 + block_k].T
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


WRONG = {
    "online_softmax": [os_keeps_blocks, os_state_across_calls],
    "merge": [mg_factor_on_columns, mg_one_max_for_all_rows],
    "tiled_attention": [ta_full_query_tiles_only, ta_empty_state_m_zero, ta_key_loop_by_block_q],
}
CORRECT = {"online_softmax": [online_softmax, online_log_sum], "merge": [merge, merge_where_guard],
           "tiled_attention": [tiled_attention, tiled_attention_empty_out]}


class _ReusingStream:
    """A one-pass stream that hands every block over in one buffer, refilled for the next block."""

    def __init__(self, blocks):
        self._blocks = [np.asarray(b, dtype=np.float64) for b in blocks]
        self._buf = np.empty(max(len(b) for b in self._blocks))

    def __iter__(self):
        for b in self._blocks:
            view = self._buf[:len(b)]
            view[:] = b
            yield view


_rng = np.random.default_rng(6)
_blocks = [_rng.standard_normal(5) * 3 for _ in range(4)]
_blocks[1][2] = 9.0


def _twice(f):
    f(_ReusingStream(_blocks))
    return f(_ReusingStream(_blocks[::-1]))


def _states(rows, dv):
    r = np.random.default_rng(7)
    a = (r.standard_normal(rows), r.random(rows) + 0.5, r.standard_normal((rows, dv)))
    b = (r.standard_normal(rows), r.random(rows) + 0.5, r.standard_normal((rows, dv)))
    return a, b


def _far_rows(f):
    a, b = _states(3, 2)
    a[0][1] -= 1000.0
    b[0][1] -= 1000.0
    return f(a, b)


def _qkv(n_q, n_k, d, dv, shift=0.0):
    r = np.random.default_rng(8)
    Q = r.standard_normal((n_q, d))
    K = r.standard_normal((n_k, d))
    if shift:
        Q = np.abs(Q) + 3.0
        K = -(np.abs(K) + 1.0) * shift
    return Q, K, r.standard_normal((n_k, dv))


WITNESS = {
    "os_keeps_blocks": lambda f: f(_ReusingStream(_blocks)),
    "os_state_across_calls": _twice,
    "mg_factor_on_columns": lambda f: f(*_states(3, 3)),
    "mg_one_max_for_all_rows": _far_rows,
    "ta_full_query_tiles_only": lambda f: f(*_qkv(7, 9, 4, 3), 3, 4),
    "ta_empty_state_m_zero": lambda f: f(*_qkv(5, 9, 4, 3, shift=300.0), 2, 4),
    "ta_key_loop_by_block_q": lambda f: f(*_qkv(7, 9, 4, 3), 2, 4),
}
