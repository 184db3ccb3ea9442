"""Round 2 of fresh wrong answers for lab 01 (attention by hand), written from the lab's text and its
solution only. WRONG maps an exercise to wrong answers; CORRECT to right ones; WITNESS names, for each
wrong answer, a call on which it differs from the solution (tests/fresh_mutants/round2/verify.py runs it)."""
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
        S = np.where(np.triu(np.ones(S.shape, dtype=bool), k=1), -np.inf, S)
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


def by_hand_no_scale():
    """Forgot the 1/sqrt(d): scores (4, 0, 3, 1)."""
    return [4.0, 0.0, 3.0, 1.0], [0.6964, 0.0128, 0.2562, 0.0347], [1.0219, 0.3036]


def by_hand_scale_by_d():
    """Divided by d = 4 instead of sqrt(d)."""
    return [1.0, 0.0, 0.75, 0.25], [0.3818, 0.1405, 0.2974, 0.1804], [1.0399, 0.6182]


def by_hand_output_from_rounded_weights():
    """Rounded the weights to 4 decimals, then computed the output from the rounded weights."""
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1136], [1.0448, 0.4912]


def by_hand_rounded_exponentials():
    """Rounded each e^x to 4 decimals before dividing (rounds twice)."""
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1135], [1.0446, 0.4911]


def by_hand_truncated():
    """Truncated to 4 decimals instead of rounding."""
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0688, 0.3086, 0.1135], [1.0446, 0.491]


def by_hand_key_columns():
    """Used the columns of K as the keys (q·K instead of q·Kᵀ)."""
    return [2.0, 1.0, 1.0, 0.5], [0.5105, 0.1878, 0.1878, 0.1139], [0.9261, 0.4895]


def by_hand_unnormalised():
    """Forgot to divide by the sum: weights e^(s - max)."""
    return [2.0, 0.0, 1.5, 0.5], [1.0, 0.1353, 0.6065, 0.2231], [2.0527, 0.9649]


def by_hand_output_swapped():
    """Output components in the wrong order (read V's columns swapped)."""
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1136], [0.4911, 1.0447]


# ---------------------------------------------------------------- exercise 2: scores


def scores_sqrt_nk(Q, K):
    """Scaled by sqrt of the number of keys, not of d."""
    return Q @ K.T / math.sqrt(K.shape[0])


def scores_sqrt_nq(Q, K):
    """len(Q) is the number of queries, not d."""
    return Q @ K.T / math.sqrt(len(Q))


def scores_scale_d(Q, K):
    """Scaled by 1/d."""
    return Q @ K.T / Q.shape[1]


def scores_isqrt(Q, K):
    """Integer square root: wrong when d is not a perfect square."""
    return Q @ K.T / math.isqrt(Q.shape[1])


def scores_transposed(Q, K):
    """K Qᵀ: the transpose of S (shape [Nk, Nq])."""
    return K @ Q.T / math.sqrt(Q.shape[1])


def scores_fp16(Q, K):
    """Computed in float16 to save memory."""
    return (Q.astype(np.float16) @ K.T.astype(np.float16) / np.float16(math.sqrt(Q.shape[1]))).astype(np.float64)


# ---------------------------------------------------------------- exercise 3: softmax


def softmax_global_max(S):
    """One maximum for the whole matrix."""
    w = np.exp(S - S.max())
    return w / w.sum(axis=-1, keepdims=True)


def softmax_axis0(S):
    """Normalised down the columns."""
    w = np.exp(S - S.max(axis=0, keepdims=True))
    return w / w.sum(axis=0, keepdims=True)


def softmax_no_shift(S):
    """No shift: overflows at 710."""
    w = np.exp(S)
    return w / w.sum(axis=-1, keepdims=True)


def softmax_min_shift(S):
    """Subtracted the row minimum."""
    w = np.exp(S - S.min(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def softmax_mean_shift(S):
    """Subtracted the row mean."""
    w = np.exp(S - S.mean(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def softmax_clip(S):
    """Clipped the scores to ±700 instead of shifting."""
    w = np.exp(np.clip(S, -700, 700))
    return w / w.sum(axis=-1, keepdims=True)


def softmax_sum_axis0(S):
    """Row shift right, but the sum over axis 0."""
    w = np.exp(S - S.max(axis=-1, keepdims=True))
    return w / w.sum(axis=0, keepdims=True)


def softmax_fp16(S):
    """Exponentials in float16."""
    w = np.exp((S - S.max(axis=-1, keepdims=True)).astype(np.float16))
    return (w / w.sum(axis=-1, keepdims=True)).astype(np.float64)


def softmax_log_domain_bug(S):
    """exp(S - logsumexp) with the log-sum-exp taken over the whole matrix."""
    m = S.max()
    lse = m + np.log(np.exp(S - m).sum())
    return np.exp(S - lse)


def softmax_in_place(S):
    """Worked in place on the caller's array to save memory."""
    S -= S.max(axis=-1, keepdims=True)
    np.exp(S, out=S)
    S /= S.sum(axis=-1, keepdims=True)
    return S


def _twice(f):
    S = _S.copy()
    f(S)
    return f(S)


# ---------------------------------------------------------------- exercise 4: attention


def attention_diag_hidden(Q, K, V, causal=False):
    """triu with k=0 also hides the diagonal (row 0 sees nothing)."""
    S = scores(Q, K)
    if causal:
        S = np.where(np.triu(np.ones(S.shape, dtype=bool), k=0), -np.inf, S)
    return softmax_rows(S) @ V


def attention_hides_past(Q, K, V, causal=False):
    """tril instead of triu: hides the past, shows the future."""
    S = scores(Q, K)
    if causal:
        S = np.where(np.tril(np.ones(S.shape, dtype=bool), k=-1), -np.inf, S)
    return softmax_rows(S) @ V


def attention_mask_after_softmax(Q, K, V, causal=False):
    """Zeroed the future weights after the softmax, no renormalisation."""
    P = softmax_rows(scores(Q, K))
    if causal:
        P = P * np.tril(np.ones(P.shape))
    return P @ V


def attention_mask_after_softmax_renorm(Q, K, V, causal=False):
    """Zeroed the future weights after the softmax, then renormalised (underflows when a hidden key dominates)."""
    P = softmax_rows(scores(Q, K))
    if causal:
        P = P * np.tril(np.ones(P.shape))
        P = P / P.sum(axis=-1, keepdims=True)
    return P @ V


def attention_ignores_causal(Q, K, V, causal=False):
    """Forgot the mask altogether."""
    return softmax_rows(scores(Q, K)) @ V


def attention_scaled_twice(Q, K, V, causal=False):
    """scores() already scales; divided by sqrt(d) again."""
    S = scores(Q, K) / math.sqrt(Q.shape[1])
    if causal:
        S = np.where(np.triu(np.ones(S.shape, dtype=bool), k=1), -np.inf, S)
    return softmax_rows(S) @ V


def attention_mask_zero(Q, K, V, causal=False):
    """Hidden scores set to 0 instead of -inf."""
    S = scores(Q, K)
    if causal:
        S = np.where(np.triu(np.ones(S.shape, dtype=bool), k=1), 0.0, S)
    return softmax_rows(S) @ V


def attention_mask_minus_1e4(Q, K, V, causal=False):
    """Additive -1e4 on hidden keys."""
    S = scores(Q, K)
    if causal:
        S = S - 1e4 * np.triu(np.ones(S.shape), k=1)
    return softmax_rows(S) @ V


def attention_mask_multiplied(Q, K, V, causal=False):
    """Multiplied the scores by a 0/1 mask (hidden scores become 0)."""
    S = scores(Q, K)
    if causal:
        S = S * np.tril(np.ones(S.shape))
    return softmax_rows(S) @ V


# ---------------------------------------------------------------- exercise 5: positions


def pe_swapped(n_positions, d_model):
    """cos on even columns, sin on odd."""
    pe = sinusoidal_positions(n_positions, d_model)
    return pe[:, [i ^ 1 for i in range(d_model)]]


def pe_exponent_i(n_positions, d_model):
    """Exponent i/d instead of 2i/d."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(d_model // 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def pe_concatenated(n_positions, d_model):
    """[sin | cos] halves instead of interleaved columns."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def pe_positions_from_one(n_positions, d_model):
    """Positions counted from 1."""
    pos = np.arange(1, n_positions + 1)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def pe_wrong_sign_exponent(n_positions, d_model):
    """pos · 10000^(2i/d) instead of pos / 10000^(2i/d)."""
    pos = np.arange(n_positions)[:, None]
    angles = pos * 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def pe_over_half_d(n_positions, d_model):
    """Even indices 2i divided by d/2."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / (d_model // 2))
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def pe_degrees(n_positions, d_model):
    """Treated the angle as degrees."""
    pos = np.arange(n_positions)[:, None]
    angles = np.deg2rad(pos / 10000 ** (np.arange(0, d_model, 2) / d_model))
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


def pe_float16(n_positions, d_model):
    """Table stored in float16."""
    return sinusoidal_positions(n_positions, d_model).astype(np.float16)


def pe_int_division(n_positions, d_model):
    """Exponent 2i // d (integer division: every frequency 1)."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) // d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    return pe


# ---------------------------------------------------------------- correct alternatives


def softmax_float32(S):
    """float32 throughout: allowed by the lab."""
    S = S.astype(np.float32)
    w = np.exp(S - S.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def attention_where_mask(Q, K, V, causal=False):
    d = Q.shape[1]
    S = (Q @ K.T) / np.sqrt(d)
    if causal:
        i, j = np.indices(S.shape)
        S[j > i] = -np.inf
    return softmax_rows(S) @ V


WRONG = {
    "by_hand": [by_hand_no_scale, by_hand_scale_by_d, by_hand_output_from_rounded_weights, by_hand_rounded_exponentials,
                by_hand_truncated, by_hand_key_columns, by_hand_unnormalised, by_hand_output_swapped],
    "scores": [scores_sqrt_nk, scores_sqrt_nq, scores_scale_d, scores_isqrt, scores_transposed, scores_fp16],
    "softmax": [softmax_global_max, softmax_axis0, softmax_no_shift, softmax_min_shift, softmax_mean_shift,
                softmax_clip, softmax_sum_axis0, softmax_fp16, softmax_log_domain_bug, softmax_in_place],
    "attention": [attention_diag_hidden, attention_hides_past, attention_mask_after_softmax,
                  attention_mask_after_softmax_renorm, attention_ignores_causal, attention_scaled_twice,
                  attention_mask_zero, attention_mask_minus_1e4, attention_mask_multiplied],
    "positions": [pe_swapped, pe_exponent_i, pe_concatenated, pe_positions_from_one, pe_wrong_sign_exponent,
                  pe_over_half_d, pe_degrees, pe_float16, pe_int_division],
}
CORRECT = {"by_hand": [by_hand], "scores": [scores], "softmax": [softmax_rows, softmax_float32],
           "attention": [attention, attention_where_mask], "positions": [sinusoidal_positions]}

_rng = np.random.default_rng(0)
_Q, _K, _V = _rng.normal(size=(3, 5)), _rng.normal(size=(4, 5)), _rng.normal(size=(4, 2))
_Qs, _Ks, _Vs = _rng.normal(size=(4, 5)), _rng.normal(size=(4, 5)), _rng.normal(size=(4, 3))
_Qbig = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]) * 40        # query 0 meets a hidden key scoring +2000 above
_Kbig = np.array([[-1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]) * 40
_Vbig = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
_S = np.array([[800.0, 801.0, 0.0], [-1000.0, -999.0, -1001.0], [0.0, 0.0, 1500.0]])

# name -> the call (on the wrong answer or on the solution) whose results must differ
WITNESS = {
    **{f.__name__: (lambda f: f()) for f in WRONG["by_hand"]},
    "scores_sqrt_nk": lambda f: f(_Q, _K), "scores_sqrt_nq": lambda f: f(_Q, _K), "scores_scale_d": lambda f: f(_Q, _K),
    "scores_isqrt": lambda f: f(_Q, _K), "scores_transposed": lambda f: f(_Qs, _Ks),
    "scores_fp16": lambda f: f(_Q * 1e3, _K),
    **{f.__name__: (lambda f: f(_S)) for f in WRONG["softmax"]},
    "softmax_in_place": _twice,
    "attention_diag_hidden": lambda f: f(_Qs, _Ks, _Vs, True), "attention_hides_past": lambda f: f(_Qs, _Ks, _Vs, True),
    "attention_mask_after_softmax": lambda f: f(_Qs, _Ks, _Vs, True),
    "attention_mask_after_softmax_renorm": lambda f: f(_Qbig, _Kbig, _Vbig, True),
    "attention_ignores_causal": lambda f: f(_Qs, _Ks, _Vs, True), "attention_scaled_twice": lambda f: f(_Q, _K, _V),
    "attention_mask_zero": lambda f: f(_Qs, _Ks, _Vs, True),
    "attention_mask_minus_1e4": lambda f: f(_Qbig * 3, _Kbig * 3, _Vbig, True),
    "attention_mask_multiplied": lambda f: f(_Qs, _Ks, _Vs, True),
    **{f.__name__: (lambda f: f(50, 8)) for f in WRONG["positions"]},
}
