"""Fresh wrong answers (and alternative correct answers) for lab 01, written from the student notebook
and the solutions only. Each function's docstring names the exercise it answers and the mistake."""
import math

import numpy as np


# ---------------------------------------------------------------- exercise 1: by_hand
def by_hand_no_scale():
    """Exercise 1. Forgets the 1/sqrt(d): scores q.k_j, then softmax and output from those."""
    return [4.0, 0.0, 3.0, 1.0], [0.6964, 0.0128, 0.2562, 0.0347], [1.0219, 0.3036]


def by_hand_scale_by_d():
    """Exercise 1. Divides by d = 4 instead of sqrt(d) = 2."""
    return [1.0, 0.0, 0.75, 0.25], [0.3818, 0.1405, 0.2974, 0.1804], [1.0399, 0.6182]


def by_hand_unnormalised_weights():
    """Exercise 1. Types e^(s - max s) as the weights (forgets to divide by their sum 1.9650); output right."""
    return [2.0, 0.0, 1.5, 0.5], [1.0, 0.1353, 0.6065, 0.2231], [1.0447, 0.4911]


def by_hand_rounds_twice():
    """Exercise 1. Computes the output from the weights already rounded to 4 decimals (rounds twice)."""
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1136], [1.0448, 0.4912]


# ---------------------------------------------------------------- exercise 2: scores
def scores_no_scale(Q, K):
    """Exercise 2. Forgets the scale: Q K^T."""
    return Q @ K.T


def scores_sqrt_nk(Q, K):
    """Exercise 2. Scales by sqrt of the number of keys (K.shape[0]) instead of the head dim."""
    return Q @ K.T / math.sqrt(K.shape[0])


def scores_int_sqrt(Q, K):
    """Exercise 2. Uses integer square root (math.isqrt): right only when d is a perfect square."""
    return Q @ K.T / math.isqrt(Q.shape[1])


# ---------------------------------------------------------------- exercise 3: softmax
def softmax_global_max(S):
    """Exercise 3. One maximum for the whole matrix (the lesson warns a far-below row gives 0/0)."""
    w = np.exp(S - S.max())
    return w / w.sum(axis=-1, keepdims=True)


def softmax_clip(S):
    """Exercise 3. Avoids overflow by clipping the scores to [-80, 80] instead of shifting by the max."""
    w = np.exp(np.clip(S, -80, 80))
    return w / w.sum(axis=-1, keepdims=True)


def softmax_columns(S):
    """Exercise 3. Normalises along axis 0 (columns) instead of each row."""
    w = np.exp(S - S.max(axis=0, keepdims=True))
    return w / w.sum(axis=0, keepdims=True)


def softmax_float16(S):
    """Exercise 3. Computes in float16 to 'save memory', returns float64."""
    s = S.astype(np.float16)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)).astype(np.float64)


def softmax_min_shift(S):
    """Exercise 3. Subtracts the row minimum instead of the maximum (overflows on wide rows)."""
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.exp(S - S.min(axis=-1, keepdims=True))
        return w / w.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- exercise 4: attention
def _scores(Q, K):
    return Q @ K.T / math.sqrt(Q.shape[1])


def _softmax(S):
    w = np.exp(S - S.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def attention_mask_multiplied(Q, K, V, causal=False):
    """Exercise 4. 'Masks' by multiplying the hidden scores by 0 (they become 0, not -inf)."""
    S = _scores(Q, K)
    if causal:
        S = S * np.tril(np.ones(S.shape))
    return _softmax(S) @ V


def attention_mask_wrong_side(Q, K, V, causal=False):
    """Exercise 4. Hides the past (j < i) instead of the future (np.tril with k=-1)."""
    S = _scores(Q, K)
    if causal:
        S = np.where(np.tril(np.ones(S.shape, dtype=bool), k=-1), -np.inf, S)
    return _softmax(S) @ V


def attention_mask_weights_after(Q, K, V, causal=False):
    """Exercise 4. Softmax over all keys, then zeroes the future weights (no renormalisation)."""
    P = _softmax(_scores(Q, K))
    if causal:
        P = P * np.tril(np.ones(P.shape))
    return P @ V


def attention_scale_by_dv(Q, K, V, causal=False):
    """Exercise 4. Scales by sqrt of V's width (d_v) instead of d."""
    S = Q @ K.T / math.sqrt(V.shape[1])
    if causal:
        S = np.where(np.triu(np.ones(S.shape, dtype=bool), k=1), -np.inf, S)
    return _softmax(S) @ V


def attention_torch_softmax(Q, K, V, causal=False):
    """Exercise 4. Breaks the 'NumPy only' rule: PyTorch's softmax via torch.from_numpy."""
    import torch
    S = torch.from_numpy(_scores(Q, K))
    if causal:
        S = S.masked_fill(torch.triu(torch.ones(S.shape, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(S, dim=-1).numpy() @ V


# ---------------------------------------------------------------- exercise 5: positions
def positions_sin_cos_swapped(n_positions, d_model):
    """Exercise 5. cos in the even columns and sin in the odd ones."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.cos(angles)
    pe[:, 1::2] = np.sin(angles)
    return pe


def positions_exponent_i(n_positions, d_model):
    """Exercise 5. Exponent i/d_model instead of 2i/d_model."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(d_model // 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def positions_concatenated(n_positions, d_model):
    """Exercise 5. Puts all sines in the first half and all cosines in the second (not interleaved)."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def positions_from_one(n_positions, d_model):
    """Exercise 5. Positions 1..n instead of 0..n-1."""
    pos = np.arange(1, n_positions + 1)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def positions_float16(n_positions, d_model):
    """Exercise 5. Builds the table in float16 (angles of large positions lose their digits)."""
    pos = np.arange(n_positions, dtype=np.float16)[:, None]
    angles = pos / np.float16(10000) ** (np.arange(0, d_model, 2, dtype=np.float16) / np.float16(d_model))
    pe = np.empty((n_positions, d_model), dtype=np.float16)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


# ---------------------------------------------------------------- correct alternatives (must pass)
def correct_scores_transposed(Q, K):
    """Exercise 2, correct: (K Q^T)^T scaled, a different but equal product."""
    return (K @ Q.T).T * (1.0 / math.sqrt(Q.shape[1]))


def correct_softmax_logsumexp(S):
    """Exercise 3, correct: exp(S - logsumexp(S)) with the log-sum-exp computed stably per row."""
    m = S.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(S - m).sum(axis=-1, keepdims=True))
    return np.exp(S - lse)


def correct_softmax_float32(S):
    """Exercise 3, correct: the whole softmax in float32 (the lab allows float32)."""
    s = S.astype(np.float32)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def correct_attention_loop_free(Q, K, V, causal=False):
    """Exercise 4, correct: mask built with broadcasting of index vectors, einsum for the products."""
    S = np.einsum("id,jd->ij", Q, K) / math.sqrt(Q.shape[1])
    if causal:
        i = np.arange(S.shape[0])[:, None]
        j = np.arange(S.shape[1])[None, :]
        S = np.where(j > i, -np.inf, S)
    m = S.max(axis=1, keepdims=True)
    P = np.exp(S - m)
    return np.einsum("ij,jd->id", P / P.sum(axis=1, keepdims=True), V)


def correct_positions_float32(n_positions, d_model):
    """Exercise 5, correct: a float32 table built with exp/log of the frequencies."""
    freqs = np.exp(-np.log(10000.0) * np.arange(0, d_model, 2) / d_model)
    angles = np.arange(n_positions)[:, None] * freqs[None, :]
    pe = np.zeros((n_positions, d_model), dtype=np.float32)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def correct_by_hand():
    """Exercise 1, correct: the same numbers, typed with other trailing zeros."""
    return [2, 0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1136], [1.0447, 0.4911]


# exercise name -> [functions]; wrong answers and correct ones
WRONG = {
    "by_hand": [by_hand_no_scale, by_hand_scale_by_d, by_hand_unnormalised_weights, by_hand_rounds_twice],
    "scores": [scores_no_scale, scores_sqrt_nk, scores_int_sqrt],
    "softmax": [softmax_global_max, softmax_clip, softmax_columns, softmax_float16, softmax_min_shift],
    "attention": [attention_mask_multiplied, attention_mask_wrong_side, attention_mask_weights_after,
                  attention_scale_by_dv, attention_torch_softmax],
    "positions": [positions_sin_cos_swapped, positions_exponent_i, positions_concatenated, positions_from_one,
                  positions_float16],
}
CORRECT = {
    "by_hand": [correct_by_hand],
    "scores": [correct_scores_transposed],
    "softmax": [correct_softmax_logsumexp, correct_softmax_float32],
    "attention": [correct_attention_loop_free],
    "positions": [correct_positions_float32],
}
