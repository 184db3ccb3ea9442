"""Round 5 of fresh wrong answers for lab 01 (attention by hand), written from the lab's text and its
solution only (the checks unread). WRONG maps an exercise to wrong answers; CORRECT to right ones;
WITNESS names, for each wrong answer, a call on which it differs from the solution
(tests/fresh_mutants/round5/verify.py runs it). Each wrong answer is one edit of the solution. This round
tries classes no earlier round tried: too few decimals, weights proportional to the scores, a singleton
axis squeezed away, log2(e) truncated, an output returned transposed, a default argument flipped, a
frequency per column, a cache keyed on one argument of two."""
import math

import numpy as np

# ---------------------------------------------------------------- the solution (the reference of WITNESS)


def by_hand():
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1136], [1.0447, 0.4911]


def scores(Q, K):
    return Q @ K.T / math.sqrt(Q.shape[1])


def softmax_rows(S):
    shifted = S - S.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def attention(Q, K, V, causal=False):
    S = scores(Q, K)
    if causal:
        future = np.triu(np.ones(S.shape, dtype=bool), k=1)
        S = np.where(future, -np.inf, S)
    return softmax_rows(S) @ V


def sinusoidal_positions(n_positions, d_model):
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


SOLUTION = {"by_hand": by_hand, "scores": scores, "softmax": softmax_rows, "attention": attention,
            "positions": sinusoidal_positions}

# ---------------------------------------------------------------- exercise 1: by hand


def by_hand_three_decimals():
    """Exercise 1. Every number typed to 3 decimals ('the calculator showed 3'), rounded correctly: the lab
    asks for 4."""
    return [2.0, 0.0, 1.5, 0.5], [0.509, 0.069, 0.309, 0.114], [1.045, 0.491]


def by_hand_linear_weights():
    """Exercise 1. Weights proportional to the scores, s_j / sum s (no exponential: 'softmax normalises'):
    weights (0.5, 0, 0.375, 0.125) and the output from them."""
    return [2.0, 0.0, 1.5, 0.5], [0.5, 0.0, 0.375, 0.125], [1.125, 0.5]


# ---------------------------------------------------------------- exercise 2: scores


def scores_squeezed(Q, K):
    """Exercise 2. np.squeeze of the product ('drop the extra brackets'): a single query gives shape [Nk],
    a single key [Nq], not [Nq, Nk]."""
    return np.squeeze(Q @ K.T) / math.sqrt(Q.shape[1])


# ---------------------------------------------------------------- exercise 3: softmax


def softmax_exp2_short_log2e(S):
    """Exercise 3. exp through exp2 with log2(e) typed as 1.4427 ('exp2 is faster'): every weight is off by a
    factor 2^(-0.0000041·(s - max)), visible on rows spread over tens of units."""
    shifted = S - S.max(axis=-1, keepdims=True)
    weights = np.exp2(shifted * 1.4427)
    return weights / weights.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- exercise 4: attention


def attention_output_transposed(Q, K, V, causal=False):
    """Exercise 4. Computes O^T = V^T P^T ('the lesson writes outputs as columns') and returns it without
    transposing back: shape [d_v, Nq]."""
    S = scores(Q, K)
    if causal:
        future = np.triu(np.ones(S.shape, dtype=bool), k=1)
        S = np.where(future, -np.inf, S)
    return V.T @ softmax_rows(S).T


def attention_default_causal_true(Q, K, V, causal=True):
    """Exercise 4. The signature's default written as causal=True ('decoders are causal'): a call that leaves
    causal out gets the masked answer."""
    S = scores(Q, K)
    if causal:
        future = np.triu(np.ones(S.shape, dtype=bool), k=1)
        S = np.where(future, -np.inf, S)
    return softmax_rows(S) @ V


# ---------------------------------------------------------------- exercise 5: positions


def pe_exponent_per_column(n_positions, d_model):
    """Exercise 5. One frequency per column j, 10000^(j/d_model): the cosine of pair i gets exponent
    (2i + 1)/d_model instead of 2i/d_model."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(d_model) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles[:, 0::2])
    pe[:, 1::2] = np.cos(angles[:, 1::2])
    return pe


_pe_cache = {}


def pe_cached_by_positions(n_positions, d_model):
    """Exercise 5. Memoises the table by n_positions ('the table depends on the positions'): a later call with
    the same n_positions and another d_model returns the first call's table."""
    if n_positions not in _pe_cache:
        pos = np.arange(n_positions)[:, None]
        angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
        pe = np.empty((n_positions, d_model))
        pe[:, 0::2] = np.sin(angles)
        pe[:, 1::2] = np.cos(angles)
        _pe_cache[n_positions] = pe
    return _pe_cache[n_positions]


# ---------------------------------------------------------------- correct alternatives


def scores_float32(Q, K):
    """Exercise 2, correct: the product in float32 (the lab allows float32, held at float32's precision)."""
    Q32, K32 = np.asarray(Q, dtype=np.float32), np.asarray(K, dtype=np.float32)
    return Q32 @ K32.T / np.float32(math.sqrt(Q.shape[1]))


def attention_row_loop(Q, K, V, causal=False):
    """Exercise 4, correct: one row at a time; under the mask row i sees only keys 0..i (the hidden keys are
    left out instead of set to -inf)."""
    out = np.empty((Q.shape[0], V.shape[1]))
    for i in range(Q.shape[0]):
        n = i + 1 if causal else K.shape[0]
        s = scores(Q[i:i + 1], K[:n])
        out[i] = (softmax_rows(s) @ V[:n])[0]
    return out


WRONG = {
    "by_hand": [by_hand_three_decimals, by_hand_linear_weights],
    "scores": [scores_squeezed],
    "softmax": [softmax_exp2_short_log2e],
    "attention": [attention_output_transposed, attention_default_causal_true],
    "positions": [pe_exponent_per_column, pe_cached_by_positions],
}
CORRECT = {"scores": [scores, scores_float32], "attention": [attention, attention_row_loop]}

_rng = np.random.default_rng(5)
_Q, _K = _rng.normal(size=(1, 6)), _rng.normal(size=(4, 6))
_Qa, _Ka, _Va = _rng.normal(size=(5, 4)), _rng.normal(size=(5, 4)), _rng.normal(size=(5, 3))
_Swide = np.array([[-30.0, 0.0, 10.0, 5.0]])


def _pe_two_widths(f):
    f(12, 4)
    return f(12, 8)


WITNESS = {
    **{f.__name__: (lambda f: f()) for f in WRONG["by_hand"]},
    "scores_squeezed": lambda f: f(_Q, _K),
    "softmax_exp2_short_log2e": lambda f: f(_Swide),
    "attention_output_transposed": lambda f: f(_Qa, _Ka, _Va, True),
    "attention_default_causal_true": lambda f: f(_Qa, _Ka, _Va),
    "pe_exponent_per_column": lambda f: f(20, 8),
    "pe_cached_by_positions": _pe_two_widths,
}
