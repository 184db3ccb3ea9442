"""Round 2 of fresh wrong answers for lab 03 (online softmax), written from the lab's text and its
solution only. WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
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
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


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


def os_no_rescale(blocks):
    """Forgot to rescale the old sum when the maximum grows."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_rescale_inverted(blocks):
    """exp(m_new - m) instead of exp(m - m_new)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * (math.exp(m_new - m) if l else 1.0) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_block_own_max(blocks):
    """Each block's sum relative to its own maximum, added as is."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - block.max()).sum())
        m = m_new
    return m, l


def os_keeps_blocks(blocks):
    """Kept the blocks and summed at the end (the stream reuses its buffer)."""
    kept = [block for block in blocks]
    m = max(float(b.max()) for b in kept)
    return m, float(sum(np.exp(b - m).sum() for b in kept))


def os_stale_max(blocks):
    """Summed with the old maximum, then updated it (first block overflows)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        ref = m if m > -math.inf else 0.0
        l = l + float(np.exp(block - ref).sum())
        m = max(m, float(block.max()))
    l = l * math.exp(0.0 - m) if m > -math.inf else l
    return m, l


def os_first_block_max(blocks):
    """Took the maximum of the first block only."""
    m, l = -math.inf, 0.0
    for block in blocks:
        if m == -math.inf:
            m = float(block.max())
        l = l + float(np.exp(block - m).sum())
    return m, l


def os_unshifted_first(blocks):
    """First block without a shift (m = 0 while m is -inf)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        if m == -math.inf:
            l = float(np.exp(block).sum())
            m = 0.0
            m_new = max(m, float(block.max()))
            l = l * math.exp(m - m_new)
            m = m_new
            continue
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_int_max(blocks):
    """int() on the block maximum (truncates)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, int(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_returns_log(blocks):
    """Returned log(l) (a log-sum-exp habit)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    l = math.log(l)
    return m, l


def os_last_element_max(blocks):
    """The running maximum compared with the block's last element."""
    m, l = -math.inf, 0.0
    for block in blocks:
        m_new = max(m, float(block[-1]))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


def os_float16_sum(blocks):
    """The running sum kept in float16."""
    m, l = -math.inf, np.float16(0.0)
    for block in blocks:
        m_new = max(m, float(block.max()))
        l = np.float16(l * np.float16(math.exp(m - m_new)) + np.exp(block - m_new).astype(np.float16).sum())
        m = m_new
    return m, float(l)


# ---------------------------------------------------------------- exercise 2: merge


def mg_no_rescale_z(a, b):
    """Rescaled l but not z."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, z_a + z_b


def mg_no_rescale_l(a, b):
    """Rescaled z but not l."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, l_a + l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def mg_alpha_swapped(a, b):
    """alpha and beta swapped on z."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, beta[:, None] * z_a + alpha[:, None] * z_b


def mg_alpha_no_column(a, b):
    """alpha * z_a without [:, None]: scales z's columns when rows == dv."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha * z_a + beta * z_b


def mg_scalar_max(a, b):
    """One maximum for all rows."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.full_like(m_a, max(np.max(m_a), np.max(m_b)))
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def mg_exp_inverted(a, b):
    """exp(m - m_a) instead of exp(m_a - m)."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m - m_a), np.exp(m - m_b)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def mg_mean_reference(a, b):
    """Referred both to the mean of the two maxima."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = (m_a + m_b) / 2
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def mg_empty_as_zero(a, b):
    """Replaced -inf maxima by 0 to avoid NaN."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m_a, m_b = np.where(np.isinf(m_a), 0.0, m_a), np.where(np.isinf(m_b), 0.0, m_b)
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def mg_in_place(a, b):
    """Updated a's arrays in place to save memory."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l_a *= alpha
    l_a += beta * l_b
    z_a *= alpha[:, None]
    z_a += beta[:, None] * z_b
    m_a[...] = m
    return m_a, l_a, z_a


def mg_l_from_z(a, b):
    """l rescaled with beta for both terms."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, beta * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


# ---------------------------------------------------------------- exercise 3: tiled attention


def ta_step_mixup(Q, K, V, block_q, block_k):
    """Key loop steps by block_q but slices block_k keys."""
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


def ta_drops_last_keys(Q, K, V, block_q, block_k):
    """range(0, n_k - block_k + 1, block_k): the partial last key block is dropped."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k - block_k + 1, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T * scale
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_drops_last_queries(Q, K, V, block_q, block_k):
    """range(0, n_q - block_q + 1, block_q): the partial last query block stays 0."""
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


def ta_tile_max(Q, K, V, block_q, block_k):
    """One maximum per tile instead of per row."""
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


def ta_no_shift(Q, K, V, block_q, block_k):
    """exp(S) with m = 0."""
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
            m = np.zeros(rows)
            P = np.exp(S)
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_normalise_each_block(Q, K, V, block_q, block_k):
    """Normalised each block (l = 1) before merging."""
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
            P = P / P.sum(axis=1, keepdims=True)
            state = merge(state, (m, np.ones(rows), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_sum_axis0(Q, K, V, block_q, block_k):
    """l from P.sum(axis=0) (square tiles only)."""
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
            state = merge(state, (m, P.sum(axis=0), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_divides_by_last_block_sum(Q, K, V, block_q, block_k):
    """Divided z by the last block's sum (the variable left from the loop) instead of the merged l."""
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
        m_all, _, z = state
        O[q0:q0 + block_q] = z / (P.sum(axis=1) * np.exp(m - m_all))[:, None]
    return O


def ta_scale_dv(Q, K, V, block_q, block_k):
    """Scaled by 1/sqrt(dv)."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
            S = Q_i @ K_j.T / math.sqrt(dv)
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_state_not_reset(Q, K, V, block_q, block_k):
    """The state is started once, before the query loop (carries earlier rows)."""
    n_q, d = Q.shape
    n_k, dv = V.shape
    scale = 1 / math.sqrt(d)
    O = np.zeros((n_q, dv))
    state = None
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        if state is None or len(state[0]) != rows:
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


def ta_fp16_p(Q, K, V, block_q, block_k):
    """P in float16 before P @ V (as on a GPU)."""
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
            P = np.exp(S - m[:, None]).astype(np.float16)
            state = merge(state, (m, P.sum(axis=1, dtype=np.float64), P.astype(np.float64) @ V_j))
        _, l, z = state
        O[q0:q0 + block_q] = z / l[:, None]
    return O


def ta_l_no_column(Q, K, V, block_q, block_k):
    """z / l without [:, None]: divides columns when a block's rows equal dv (and fails otherwise)."""
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
        O[q0:q0 + block_q] = z / l
    return O


WRONG = {
    "online_softmax": [os_no_rescale, os_rescale_inverted, os_block_own_max, os_keeps_blocks, os_stale_max,
                       os_first_block_max, os_unshifted_first, os_int_max, os_returns_log, os_last_element_max,
                       os_float16_sum],
    "merge": [mg_no_rescale_z, mg_no_rescale_l, mg_alpha_swapped, mg_alpha_no_column, mg_scalar_max,
              mg_exp_inverted, mg_mean_reference, mg_empty_as_zero, mg_in_place, mg_l_from_z],
    "tiled_attention": [ta_step_mixup, ta_drops_last_keys, ta_drops_last_queries, ta_tile_max, ta_no_shift,
                        ta_normalise_each_block, ta_sum_axis0, ta_divides_by_last_block_sum, ta_scale_dv,
                        ta_state_not_reset, ta_fp16_p, ta_l_no_column],
}
CORRECT = {k: [v] for k, v in SOLUTION.items()}

_blocks = [np.array([1.0, 3.5]), np.array([800.0, 2.0, -4.0]), np.array([799.5])]
_rng = np.random.default_rng(1)
_rows = 3


def _state(m):
    m = np.asarray(m, dtype=float)
    return m, np.abs(_rng.normal(size=len(m))) + 0.5, _rng.normal(size=(len(m), _rows))


_a = _state([1.0, -3.0, -np.inf])
_b = _state([2.5, -700.0, -5.0])
_b = (_b[0], _b[1], _b[2])
_a = (_a[0], np.where(np.isinf(_a[0]), 0.0, _a[1]), np.where(np.isinf(_a[0])[:, None], 0.0, _a[2]))


def _merge_twice(f):
    a = tuple(x.copy() for x in _a)
    f(a, _b)
    return f(a, _b)


_Q, _K, _V = _rng.normal(size=(7, 4)) * 3, _rng.normal(size=(9, 4)) * 3, _rng.normal(size=(9, 3))
_Qbig = _Q.copy()
_Qbig[1] *= 400                     # one row of scores in the thousands
_Qbig[0] *= 0.001

WITNESS = {
    **{f.__name__: (lambda f: f(OneShotStream([b.copy() for b in _blocks]))) for f in WRONG["online_softmax"]},
    **{f.__name__: (lambda f: f(tuple(x.copy() for x in _a), _b)) for f in WRONG["merge"]},
    "mg_in_place": _merge_twice,
    "os_unshifted_first": lambda f: f(OneShotStream([np.array([800.0, 1.0]), np.array([2.0])])),
    **{f.__name__: (lambda f: f(_Q, _K, _V, 3, 2)) for f in WRONG["tiled_attention"]},
    "ta_step_mixup": lambda f: f(_Q, _K, _V, 4, 2),
    "ta_tile_max": lambda f: f(_Qbig, _K, _V, 3, 4), "ta_no_shift": lambda f: f(_Qbig, _K, _V, 3, 4),
    "ta_sum_axis0": lambda f: f(_Q, _K, _V, 3, 3),
    "ta_state_not_reset": lambda f: f(_Q[:6], _K, _V, 3, 2),
    "ta_l_no_column": lambda f: f(_Q[:6], _K, _V, 3, 2),
}
