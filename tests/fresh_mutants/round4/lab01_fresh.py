"""Round 4 of fresh wrong answers for lab 01 (attention by hand), written from the lab's text and its
solution only (the checks unread). WRONG maps an exercise to wrong answers; CORRECT to right ones;
WITNESS names, for each wrong answer, a call on which it differs from the solution
(tests/fresh_mutants/round4/verify.py runs it). Each wrong answer is one edit of the solution. This round
tries classes no earlier round tried: a slip carried consistently through every later number, state kept
between calls, an input changed in place, results of another type or layout, integer overflow."""
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


def by_hand_slip_carried():
    """Exercise 1. One arithmetic slip, q·k_4 = 2 (read k_4's third entry 2 as meeting q's 1), carried
    consistently through weights and output: scores (2, 0, 1.5, 1), sum of e^(s - max) 2.1097."""
    return [2.0, 0.0, 1.5, 1.0], [0.4740, 0.0641, 0.2875, 0.1744], [1.1102, 0.5260]


def by_hand_keys_reversed():
    """Exercise 1. Every list in the order k_4, k_3, k_2, k_1 (read K from the bottom row up); the output is
    right."""
    return [0.5, 1.5, 0.0, 2.0], [0.1136, 0.3087, 0.0689, 0.5089], [1.0447, 0.4911]


# ---------------------------------------------------------------- exercise 2: scores


def scores_mutates_q(Q, K):
    """Exercise 2. Scales Q in place ('saves a copy'): right on the first call, but the caller's Q is divided
    by sqrt(d) every time, so a second call on the same Q is wrong."""
    Q /= math.sqrt(Q.shape[1])
    return Q @ K.T


_scores_cache = {}


def scores_cached_by_shape(Q, K):
    """Exercise 2. Memoises the result by the inputs' shapes ('the lab calls it twice'): a second call with
    other values of the same shapes returns the first call's scores."""
    key = (Q.shape, K.shape)
    if key not in _scores_cache:
        _scores_cache[key] = Q @ K.T / math.sqrt(Q.shape[1])
    return _scores_cache[key]


# ---------------------------------------------------------------- exercise 3: softmax


def softmax_abs_max_shift(S):
    """Exercise 3. Shifts by the largest magnitude, np.abs(S).max(...) ('the biggest number in the row'):
    a row of large negative scores (all near -1000) is shifted to near -2000 and underflows to 0/0."""
    shifted = S - np.abs(S).max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def softmax_returns_list(S):
    """Exercise 3. Returns weights.tolist() ('plain numbers are easier to print'): a list of lists, not a
    NumPy array."""
    shifted = S - S.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return (weights / weights.sum(axis=-1, keepdims=True)).tolist()


# ---------------------------------------------------------------- exercise 4: attention


def attention_mask_inf_product(Q, K, V, causal=False):
    """Exercise 4. Hides the future by subtracting np.inf * mask: 0 · inf is NaN, so every visible score
    becomes NaN too."""
    S = scores(Q, K)
    if causal:
        future = np.triu(np.ones(S.shape), k=1)
        S = S - np.inf * future
    return softmax_rows(S) @ V


_mask = {}


def attention_mask_built_once(Q, K, V, causal=False):
    """Exercise 4. Builds the causal mask on the first causal call and keeps it for later calls ('it never
    changes'): a later call with another length gets the first call's mask (cut or broadcast wrongly)."""
    S = scores(Q, K)
    if causal:
        if "future" not in _mask:
            _mask["future"] = np.triu(np.ones(S.shape, dtype=bool), k=1)
        future = _mask["future"][:S.shape[0], :S.shape[1]]
        if future.shape != S.shape:
            future = np.pad(future, ((0, S.shape[0] - future.shape[0]), (0, S.shape[1] - future.shape[1])))
        S = np.where(future, -np.inf, S)
    return softmax_rows(S) @ V


def attention_returns_weights(Q, K, V, causal=False):
    """Exercise 4. Returns (O, P) ('the weights are useful for the heatmap'): a tuple, not the output."""
    S = scores(Q, K)
    if causal:
        future = np.triu(np.ones(S.shape, dtype=bool), k=1)
        S = np.where(future, -np.inf, S)
    P = softmax_rows(S)
    return P @ V, P


# ---------------------------------------------------------------- exercise 5: positions


def pe_integer_power_overflow(n_positions, d_model):
    """Exercise 5. 10000^(2i/d) computed as (10000^(2i))^(1/d) with integer arrays: 10000^(2i) overflows
    int64 from 2i = 5 on (silently, wrapping), so every frequency from the third on is wrong for d >= 6."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / (10000 ** np.arange(0, d_model, 2)) ** (1 / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def pe_transposed(n_positions, d_model):
    """Exercise 5. Returns the table as [d_model, n_positions] ('one row per dimension', as the lesson's
    heatmap draws it)."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe.T


def pe_linspace_positions(n_positions, d_model):
    """Exercise 5. Positions from np.linspace(0, n_positions, n_positions): spaced n/(n - 1) apart, not 1."""
    pos = np.linspace(0, n_positions, n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


# ---------------------------------------------------------------- correct alternatives


def attention_normalise_after(Q, K, V, causal=False):
    """Exercise 4, correct: exponentials times V first, divided by the row sums after (the mask from tril
    of the transpose), the maximum shift kept."""
    S = scores(Q, K)
    if causal:
        future = np.tril(np.ones(S.shape, dtype=bool), k=-1).T
        S = np.where(future, -np.inf, S)
    E = np.exp(S - S.max(axis=1, keepdims=True))
    return (E @ V) / E.sum(axis=1)[:, None]


def softmax_via_logsumexp_float32_input(S):
    """Exercise 3, correct: exp(S - lse) with the log-sum-exp of each row from the shifted sum, in S's dtype."""
    m = S.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(S - m).sum(axis=-1, keepdims=True))
    return np.exp(S - lse)


WRONG = {
    "by_hand": [by_hand_slip_carried, by_hand_keys_reversed],
    "scores": [scores_mutates_q, scores_cached_by_shape],
    "softmax": [softmax_abs_max_shift, softmax_returns_list],
    "attention": [attention_mask_inf_product, attention_mask_built_once, attention_returns_weights],
    "positions": [pe_integer_power_overflow, pe_transposed, pe_linspace_positions],
}
CORRECT = {"softmax": [softmax_rows, softmax_via_logsumexp_float32_input],
           "attention": [attention, attention_normalise_after]}

_rng = np.random.default_rng(4)
_Q, _K = _rng.normal(size=(3, 5)), _rng.normal(size=(4, 5))
_Q2, _K2 = _rng.normal(size=(3, 5)), _rng.normal(size=(4, 5))
_Qa, _Ka, _Va = _rng.normal(size=(5, 4)), _rng.normal(size=(5, 4)), _rng.normal(size=(5, 3))
_Sneg = -1000.0 + _rng.normal(size=(3, 6))


def _twice_same_q(f):
    Q = _Q.copy()
    f(Q, _K)
    return f(Q, _K)


def _two_inputs(f):
    f(_Q, _K)
    return f(_Q2, _K2)


def _two_lengths(f):
    f(_Qa[:3], _Ka[:3], _Va[:3], True)
    return f(_Qa, _Ka, _Va, True)


WITNESS = {
    **{f.__name__: (lambda f: f()) for f in WRONG["by_hand"]},
    "scores_mutates_q": _twice_same_q,
    "scores_cached_by_shape": _two_inputs,
    "softmax_abs_max_shift": lambda f: f(_Sneg),
    "softmax_returns_list": lambda f: type(f(_Sneg)).__name__,
    "attention_mask_inf_product": lambda f: f(_Qa, _Ka, _Va, True),
    "attention_mask_built_once": _two_lengths,
    "attention_returns_weights": lambda f: type(f(_Qa, _Ka, _Va)).__name__,
    **{f.__name__: (lambda f: f(50, 16)) for f in WRONG["positions"]},
}
