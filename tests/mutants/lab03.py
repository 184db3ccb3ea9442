"""Lab 03: wrong answers a student could write (WRONG) and right ones written differently (RIGHT)."""
import math

import numpy as np


# ------------------------------------------------------------------------ exercise 1: online_softmax
def online_elementwise(blocks):
    m, l = -math.inf, 0.0
    for block in blocks:
        for x in block:
            m_new = max(m, x)
            l = l * math.exp(m - m_new) + math.exp(x - m_new)
            m = m_new
    return m, l


def online_blockwise(blocks):
    m, l = -np.inf, 0.0
    for block in blocks:
        m_new = max(m, block.max())
        l = l * np.exp(m - m_new) + np.exp(block - m_new).sum()
        m = m_new
    return m, l


def online_log_sum_exp(blocks):
    m, lse = -np.inf, -np.inf
    for block in blocks:
        top = block.max()
        lse = np.logaddexp(lse, top + np.log(np.exp(block - top).sum()))
        m = max(m, top)
    return m, np.exp(lse - m)


ONLINE_RIGHT = {"element by element": online_elementwise, "block by block": online_blockwise,
                "log-sum-exp": online_log_sum_exp}


def online_two_passes(blocks):
    m = max(block.max() for block in blocks)
    l = sum(np.exp(block - m).sum() for block in blocks)
    return m, l


def online_list_then_two_passes(blocks):
    blocks = list(blocks)
    m = max(block.max() for block in blocks)
    return m, sum(np.exp(block - m).sum() for block in blocks)


def online_copies_then_two_passes(blocks):
    kept = [block.copy() for block in blocks]
    m = max(block.max() for block in kept)
    return m, sum(np.exp(block - m).sum() for block in kept)


def online_concatenate_copies(blocks):
    row = np.concatenate([block.copy() for block in blocks])
    return row.max(), np.exp(row - row.max()).sum()


def online_concatenate(blocks):
    row = np.concatenate(list(blocks))
    return row.max(), np.exp(row - row.max()).sum()


def online_no_rescale(blocks):
    m, l = -np.inf, 0.0
    for block in blocks:
        m = max(m, block.max())
        l = l + np.exp(block - m).sum()
    return m, l


def online_rescale_inverted(blocks):
    m, l = -np.inf, 0.0
    for block in blocks:
        m_new = max(m, block.max())
        l = (l * np.exp(m_new - m) if l else 0.0) + np.exp(block - m_new).sum()
        m = m_new
    return m, l


def online_no_max(blocks):
    m, l = -np.inf, 0.0
    for block in blocks:
        m = max(m, block.max())
        l += np.exp(block).sum()
    return m, l * np.exp(-m)


def online_block_max_not_carried(blocks):
    m, l = -np.inf, 0.0
    for block in blocks:
        m = max(m, block.max())
        l += np.exp(block - block.max()).sum()
    return m, l


def online_first_block_max(blocks):
    m, l = None, 0.0
    for block in blocks:
        if m is None:
            m = block.max()
        l += np.exp(block - m).sum()
    return m, l


def online_returns_log(blocks):
    m, l = online_blockwise(blocks)
    return m, np.log(l)


def online_swapped(blocks):
    m, l = online_blockwise(blocks)
    return l, m


def online_calls_the_course(blocks):
    from attnkit.reference.online_softmax import online_max_sum
    return online_max_sum(np.concatenate([block.copy() for block in blocks]))


def _online_skipping(threshold=None, flush=None):
    """The online loop with an 'optimisation' that drops small terms: a block whose maximum lies more
    than ``threshold`` below the running maximum is skipped, or terms below ``flush`` are set to 0."""
    def online(blocks):
        m, l = -math.inf, 0.0
        for block in blocks:
            if threshold is not None and float(block.max()) < m - threshold:
                continue
            m_new = max(m, float(block.max()))
            terms = np.exp(block - m_new)
            if flush is not None:
                terms = np.where(terms < flush, 0.0, terms)
            l = l * math.exp(m - m_new) + float(terms.sum())
            m = m_new
        return m, l
    return online


def online_skip_negligible_factor(blocks):
    """Skips a block when e^(block max − m) is below 1e-6 (about 13.8 below the running maximum)."""
    m, l = -math.inf, 0.0
    for block in blocks:
        if np.exp(float(block.max()) - m) < 1e-6:
            continue
        m_new = max(m, float(block.max()))
        l = l * math.exp(m - m_new) + float(np.exp(block - m_new).sum())
        m = m_new
    return m, l


ONLINE_WRONG = {
    "two passes over the stream": online_two_passes,
    "keeps the blocks, then two passes": online_list_then_two_passes,
    "concatenates the stream": online_concatenate,
    "copies the blocks, then two passes": online_copies_then_two_passes,
    "concatenates copies of the blocks": online_concatenate_copies,
    "no rescale when the maximum grows": online_no_rescale,
    "rescale by exp(m_new − m)": online_rescale_inverted,
    "no maximum (overflows)": online_no_max,
    "each block's own maximum, never carried": online_block_max_not_carried,
    "maximum of the first block only": online_first_block_max,
    "returns log ℓ": online_returns_log,
    "returns (ℓ, m)": online_swapped,
    "calls the course's online_max_sum": online_calls_the_course,
    # Small terms dropped: each is tiny, but their sum is part of ℓ.
    "skips blocks more than 10 below the running maximum": _online_skipping(threshold=10.0),
    "skips blocks more than 20 below the running maximum": _online_skipping(threshold=20.0),
    "flushes terms below 1e-4 to 0": _online_skipping(flush=1e-4),
    "skips a block whose factor e^(max − m) is below 1e-6": online_skip_negligible_factor,
}


# ------------------------------------------------------------------------------------ exercise 2: merge
def merge_maximum(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def merge_where(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    a_wins = m_a >= m_b
    m = np.where(a_wins, m_a, m_b)
    other = np.where(a_wins, m_b, m_a)
    w = np.exp(other - m)                                   # the weight of the smaller side
    l = np.where(a_wins, l_a + w * l_b, w * l_a + l_b)
    z = np.where(a_wins[:, None], z_a + w[:, None] * z_b, w[:, None] * z_a + z_b)
    return m, l, z


def merge_log_sum_exp(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    with np.errstate(divide="ignore"):
        lse = np.logaddexp(m_a + np.log(l_a), m_b + np.log(l_b))
    return m, np.exp(lse - m), np.exp(m_a - m)[:, None] * z_a + np.exp(m_b - m)[:, None] * z_b


def merge_loops(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m, l, z = np.empty(len(m_a)), np.empty(len(m_a)), np.empty(z_a.shape)
    for r in range(len(m_a)):
        m[r] = max(m_a[r], m_b[r])
        alpha, beta = math.exp(m_a[r] - m[r]), math.exp(m_b[r] - m[r])
        l[r] = alpha * l_a[r] + beta * l_b[r]
        z[r] = alpha * z_a[r] + beta * z_b[r]
    return m, l, z


MERGE_RIGHT = {"np.maximum": merge_maximum, "np.where": merge_where, "log-sum-exp": merge_log_sum_exp}


def merge_maxima_by_zip(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.array([max(x, y) for x, y in zip(m_a, m_b)])      # a Python loop over the rows, hidden in a list
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def _merge_with(a, b, *, m_of=np.maximum, weight=lambda m_x, m: np.exp(m_x - m), rescale_z=True,
                column=True, normalise=False, m_out=None):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = m_of(m_a, m_b)
    alpha, beta = weight(m_a, m), weight(m_b, m)
    l = alpha * l_a + beta * l_b
    ca, cb = (alpha[:, None], beta[:, None]) if column else (alpha, beta)
    z = ca * z_a + cb * z_b if rescale_z else z_a + z_b
    if normalise:
        z = z / l[:, None]
    return (m if m_out is None else m_out(m_a, m_b)), l, z


def merge_into_a(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    l_a *= alpha                                              # a's arrays overwritten: its caller's state is lost
    l_a += beta * l_b
    z_a *= alpha[:, None]
    z_a += beta[:, None] * z_b
    m_a[...] = m
    return m_a, l_a, z_a


def _merge_shortcut(empty_a=None, empty_b=None):
    """The solution's merge behind a shortcut that returns the other state when ``empty_a(a)`` (or
    ``empty_b(b)``) says a state is empty, judged from part of its rows."""
    def merge(a, b):
        if empty_a is not None and empty_a(a):
            return b
        if empty_b is not None and empty_b(b):
            return a
        return merge_maximum(a, b)
    return merge


MERGE_WRONG = {
    "writes the merge into a's arrays": merge_into_a,
    "loops over rows (the lab asks for none)": merge_loops,
    "row maxima by a loop over zip": merge_maxima_by_zip,
    "one maximum for all rows": lambda a, b: _merge_with(a, b, m_of=lambda x, y: np.full_like(x, max(x.max(),
                                                                                                       y.max()))),
    "rescales l but not z": lambda a, b: _merge_with(a, b, rescale_z=False),
    "no rescale at all": lambda a, b: (np.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]),
    "keeps m_a as the maximum": lambda a, b: _merge_with(a, b, m_of=lambda x, y: x),
    "exp(m − m_a) instead of exp(m_a − m)": lambda a, b: _merge_with(
        a, b, weight=lambda m_x, m: np.where(np.isfinite(m_x), np.exp(m - m_x), 0.0)),
    "weights without [:, None]": lambda a, b: _merge_with(a, b, column=False),
    "the minimum instead of the maximum": lambda a, b: _merge_with(a, b, m_of=np.minimum),
    "weights swapped": lambda a, b: _merge_with(a, b, weight=lambda m_x, m: np.exp(
        (b[0] if m_x is a[0] else a[0]) - m)),
    "returns z / l": lambda a, b: _merge_with(a, b, normalise=True),
    "returns the old m": lambda a, b: _merge_with(a, b, m_out=lambda x, y: x),
    "calls the course's merge": lambda a, b: (lambda s: (s.m, s.l, s.z))(
        __import__("attnkit.reference.online_softmax", fromlist=["x"]).merge(
            __import__("attnkit.reference.online_softmax", fromlist=["x"]).PartialState(*a),
            __import__("attnkit.reference.online_softmax", fromlist=["x"]).PartialState(*b))),
    # "a is empty" decided from some of its rows: a state can be empty in some rows and not in others.
    "returns b when a's row 0 is empty": _merge_shortcut(empty_a=lambda a: np.isinf(a[0][0])),
    "returns b when any row of a is empty": _merge_shortcut(empty_a=lambda a: bool(np.isinf(a[0]).any())),
    "returns b when a's last row has l = 0": _merge_shortcut(empty_a=lambda a: a[1][-1] == 0),
    "returns a when b's row 0 is empty": _merge_shortcut(empty_b=lambda b: np.isinf(b[0][0])),
}


# ----------------------------------------------------------------------------- exercise 3: tiled_attention
def tiled_with_merge(Q, K, V, block_q, block_k, merge=merge_maximum):
    n_q, d = Q.shape
    n_k, dv = V.shape
    O = np.zeros((n_q, dv))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        rows = len(Q_i)
        state = (np.full(rows, -np.inf), np.zeros(rows), np.zeros((rows, dv)))
        for k0 in range(0, n_k, block_k):
            S = Q_i @ K[k0:k0 + block_k].T / math.sqrt(d)
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


def tiled_keys_outside(Q, K, V, block_q, block_k):
    """Another tiling: the key loop outside, one running state per query block."""
    n_q, d = Q.shape
    dv = V.shape[1]
    starts = range(0, n_q, block_q)
    states = {q0: (np.full(len(Q[q0:q0 + block_q]), -np.inf), np.zeros(len(Q[q0:q0 + block_q])),
                   np.zeros((len(Q[q0:q0 + block_q]), dv))) for q0 in starts}
    for k0 in range(0, len(K), block_k):
        K_j, V_j = K[k0:k0 + block_k], V[k0:k0 + block_k]
        for q0 in starts:
            S = np.einsum("id,jd->ij", Q[q0:q0 + block_q], K_j) / math.sqrt(d)
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            states[q0] = merge_where(states[q0], (m, P.sum(axis=1), np.einsum("ij,jd->id", P, V_j)))
    return np.concatenate([states[q0][2] / states[q0][1][:, None] for q0 in starts])


def tiled_log_sum_exp(Q, K, V, block_q, block_k):
    """A running log-sum-exp per row and a normalised accumulator."""
    n_q, d = Q.shape
    out = []
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        lse = np.full(len(Q_i), -np.inf)
        acc = np.zeros((len(Q_i), V.shape[1]))
        for k0 in range(0, len(K), block_k):
            S = Q_i @ K[k0:k0 + block_k].T / math.sqrt(d)
            top = S.max(axis=1)
            new = np.logaddexp(lse, top + np.log(np.exp(S - top[:, None]).sum(axis=1)))
            acc = acc * np.exp(lse - new)[:, None] + np.exp(S - new[:, None]) @ V[k0:k0 + block_k]
            lse = new
        out.append(acc)
    return np.vstack(out)


TILED_RIGHT = {"skeleton with merge": tiled_with_merge, "keys outside, einsum": tiled_keys_outside,
               "log-sum-exp": tiled_log_sum_exp, "with a np.where merge": lambda Q, K, V, bq, bk: tiled_with_merge(
                   Q, K, V, bq, bk, merge=merge_where)}


def tiled_tile_max(Q, K, V, block_q, block_k):
    """One maximum per tile instead of one per row."""
    n_q, d = Q.shape
    O = np.zeros((n_q, V.shape[1]))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        state = (np.full(len(Q_i), -np.inf), np.zeros(len(Q_i)), np.zeros((len(Q_i), V.shape[1])))
        for k0 in range(0, len(K), block_k):
            S = Q_i @ K[k0:k0 + block_k].T / math.sqrt(d)
            m = np.full(len(Q_i), S.max())
            P = np.exp(S - m[:, None])
            state = merge_maximum(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


def tiled_full_matrix(Q, K, V, block_q, block_k):
    """Builds the whole score matrix, then walks over it in tiles."""
    S_all = Q @ K.T / math.sqrt(Q.shape[1])
    O = np.zeros((len(Q), V.shape[1]))
    for q0 in range(0, len(Q), block_q):
        S = S_all[q0:q0 + block_q]
        P = np.exp(S - S.max(axis=1, keepdims=True))
        O[q0:q0 + block_q] = P @ V / P.sum(axis=1, keepdims=True)
    return O


def tiled_row_of_tiles(Q, K, V, block_q, block_k):
    """Tiles the queries only: each query block against all keys at once."""
    O = np.zeros((len(Q), V.shape[1]))
    for q0 in range(0, len(Q), block_q):
        S = Q[q0:q0 + block_q] @ K.T / math.sqrt(Q.shape[1])
        P = np.exp(S - S.max(axis=1, keepdims=True))
        O[q0:q0 + block_q] = P @ V / P.sum(axis=1, keepdims=True)
    return O


def tiled_ignores_block_q(Q, K, V, block_q, block_k):
    """Tiles the keys only: every query against one key block."""
    return tiled_with_merge(Q, K, V, len(Q), block_k)


def tiled_no_rescale(Q, K, V, block_q, block_k):
    return tiled_with_merge(Q, K, V, block_q, block_k,
                            merge=lambda a, b: (np.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]))


def tiled_drops_ragged_tiles(Q, K, V, block_q, block_k):
    n_k = len(K) - len(K) % block_k if len(K) >= block_k else len(K)
    return tiled_with_merge(Q, K[:n_k], V[:n_k], block_q, block_k)


def tiled_averages_tiles(Q, K, V, block_q, block_k):
    """Normalises each tile on its own, then averages the tiles."""
    O = np.zeros((len(Q), V.shape[1]))
    for q0 in range(0, len(Q), block_q):
        tiles = []
        for k0 in range(0, len(K), block_k):
            S = Q[q0:q0 + block_q] @ K[k0:k0 + block_k].T / math.sqrt(Q.shape[1])
            P = np.exp(S - S.max(axis=1, keepdims=True))
            tiles.append(P / P.sum(axis=1, keepdims=True) @ V[k0:k0 + block_k])
        O[q0:q0 + block_q] = np.mean(tiles, axis=0)
    return O


def tiled_no_scale(Q, K, V, block_q, block_k):
    return tiled_with_merge(Q * math.sqrt(Q.shape[1]), K, V, block_q, block_k)


def tiled_scale_by_d(Q, K, V, block_q, block_k):
    return tiled_with_merge(Q / math.sqrt(Q.shape[1]), K, V, block_q, block_k)


def tiled_state_reset_per_key_tile(Q, K, V, block_q, block_k):
    O = np.zeros((len(Q), V.shape[1]))
    for q0 in range(0, len(Q), block_q):
        Q_i = Q[q0:q0 + block_q]
        for k0 in range(0, len(K), block_k):
            state = (np.full(len(Q_i), -np.inf), np.zeros(len(Q_i)), np.zeros((len(Q_i), V.shape[1])))
            S = Q_i @ K[k0:k0 + block_k].T / math.sqrt(Q.shape[1])
            m = S.max(axis=1)
            P = np.exp(S - m[:, None])
            state = merge_maximum(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


def tiled_calls_the_course(Q, K, V, block_q, block_k):
    from attnkit.reference.tiled_numpy import tiled_attention
    return tiled_attention(Q, K, V, block_q=block_q, block_k=block_k).output


def tiled_uses_course_block_state(Q, K, V, block_q, block_k):
    from attnkit.reference.online_softmax import block_state

    def merge_states(a, b):
        return merge_maximum(a, b)

    O = np.zeros((len(Q), V.shape[1]))
    for q0 in range(0, len(Q), block_q):
        Q_i = Q[q0:q0 + block_q]
        state = (np.full(len(Q_i), -np.inf), np.zeros(len(Q_i)), np.zeros((len(Q_i), V.shape[1])))
        for k0 in range(0, len(K), block_k):
            s = block_state(Q_i @ K[k0:k0 + block_k].T / math.sqrt(Q.shape[1]), V[k0:k0 + block_k])
            state = merge_states(state, (s.m, s.l, s.z))
        O[q0:q0 + block_q] = state[2] / state[1][:, None]
    return O


def tiled_row_against_all_keys(Q, K, V, block_q, block_k):
    """One query row at a time against every key: tiles ignored, and never more than a row of scores."""
    out = np.zeros((len(Q), V.shape[1]))
    for i in range(len(Q)):
        s = K @ Q[i] / math.sqrt(Q.shape[1])
        p = np.exp(s - s.max())
        out[i] = p @ V / p.sum()
    return out


def tiled_row_one_liner(Q, K, V, block_q, block_k):
    """The same in one line per row."""
    return np.array([(lambda s: np.exp(s - s.max()) @ V / np.exp(s - s.max()).sum())(K @ q / math.sqrt(len(q)))
                     for q in Q])


def tiled_row_max_by_loop(Q, K, V, block_q, block_k):
    """Tiles, but each row's maximum taken by a Python loop over the tile's rows."""
    n_q, d = Q.shape
    out = np.zeros((n_q, V.shape[1]))
    for q0 in range(0, n_q, block_q):
        Q_i = Q[q0:q0 + block_q]
        state = (np.full(len(Q_i), -np.inf), np.zeros(len(Q_i)), np.zeros((len(Q_i), V.shape[1])))
        for k0 in range(0, len(K), block_k):
            S = Q_i @ K[k0:k0 + block_k].T / math.sqrt(d)
            m = np.array([row.max() for row in S])
            P = np.exp(S - m[:, None])
            state = merge_maximum(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
        out[q0:q0 + block_q] = state[2] / state[1][:, None]
    return out


TILED_WRONG = {
    "one query row against all keys": tiled_row_against_all_keys,
    "one query row against all keys, one line": tiled_row_one_liner,
    "one query row at a time, key tile by key tile": lambda Q, K, V, bq, bk: tiled_with_merge(Q, K, V, 1, bk),
    "block_q ignored: block_k used for both": lambda Q, K, V, bq, bk: tiled_with_merge(Q, K, V, bk, bk),
    "block_q ignored: 64 query rows always": lambda Q, K, V, bq, bk: tiled_with_merge(Q, K, V, 64, bk),
    "row maxima by a Python loop inside each tile": tiled_row_max_by_loop,
    "one maximum per tile, not per row": tiled_tile_max,
    "builds the whole score matrix": tiled_full_matrix,
    "each query block against all keys": tiled_row_of_tiles,
    "every query against one key block": tiled_ignores_block_q,
    "no rescale when the maximum grows": tiled_no_rescale,
    "drops the ragged last key tile": tiled_drops_ragged_tiles,
    "averages normalised tiles": tiled_averages_tiles,
    "no 1/√d": tiled_no_scale,
    "1/d instead of 1/√d": tiled_scale_by_d,
    "state reset for every key tile": tiled_state_reset_per_key_tile,
    "calls the course's tiled_attention": tiled_calls_the_course,
    "calls the course's block_state": tiled_uses_course_block_state,
    "calls the lab module's own reference": lambda Q, K, V, bq, bk: __import__(
        "attnkit.classroom.labchecks.lab03", fromlist=["x"])._tiled_reference(Q, K, V, bq, bk),
}

RIGHT = {"online_softmax": ONLINE_RIGHT, "merge": MERGE_RIGHT, "tiled_attention": TILED_RIGHT}
WRONG = {"online_softmax": ONLINE_WRONG, "merge": MERGE_WRONG, "tiled_attention": TILED_WRONG}
