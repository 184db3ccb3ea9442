"""Round 3 of fresh wrong answers for lab 01 (attention by hand), written from the lab's text and its
solution only (the checks unread). WRONG maps an exercise to wrong answers; CORRECT to right ones;
WITNESS names, for each wrong answer, a call on which it differs from the solution
(tests/fresh_mutants/round3/verify.py runs it). Each wrong answer is one edit of the solution."""
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


def by_hand_sqrt_dv():
    """Exercise 1. Scaled by sqrt(d_v) = sqrt(2) (V's width) instead of sqrt(d) = 2: scores (4, 0, 3, 1)/1.4142."""
    return [2.8284, 0.0, 2.1213, 0.7071], [0.5981, 0.0353, 0.2949, 0.0717], [1.0363, 0.4019]



def by_hand_v4_misread():
    """Exercise 1. Read the last value row v_4 = (2, 1) as (1, 2) when forming the output."""
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1136], [0.9311, 0.6046]


# ---------------------------------------------------------------- exercise 2: scores


def scores_fp16_scale(Q, K):
    """Exercise 2. The scale 1/sqrt(d) kept as a float16 constant (rounded to 11 bits); the product in float64."""
    return Q @ K.T * np.float16(1 / math.sqrt(Q.shape[1]))


def scores_rounded(Q, K):
    """Exercise 2. Rounded the scores to 4 decimals, as the lesson prints them."""
    return np.round(Q @ K.T / math.sqrt(Q.shape[1]), 4)


# ---------------------------------------------------------------- exercise 3: softmax


def softmax_axis1(S):
    """Exercise 3. axis=1 instead of axis=-1: right for a 2-D S only; a batch [B, N, N] normalises columns."""
    shifted = S - S.max(axis=1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=1, keepdims=True)



# ---------------------------------------------------------------- exercise 4: attention


def attention_softmax_transposed(Q, K, V, causal=False):
    """Exercise 4. Softmax of Sᵀ, transposed back (normalises over the queries): invisible when S is
    symmetric (Q = K, no mask)."""
    S = scores(Q, K)
    if causal:
        future = np.triu(np.ones(S.shape, dtype=bool), k=1)
        S = np.where(future, -np.inf, S)
    return softmax_rows(S.T).T @ V


def attention_mask_from_values(Q, K, V, causal=False):
    """Exercise 4. Built the mask from the values, np.triu(S, 1) != 0: a future key whose score is exactly 0
    stays visible."""
    S = scores(Q, K)
    if causal:
        future = np.triu(S, k=1) != 0
        S = np.where(future, -np.inf, S)
    return softmax_rows(S) @ V



# ---------------------------------------------------------------- exercise 5: positions


def pe_base_10e4(n_positions, d_model):
    """Exercise 5. Wrote the base 10000 as 10e4 (which is 100000)."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10e4 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def pe_linspace_exponent(n_positions, d_model):
    """Exercise 5. Exponents 2i/d_model from np.linspace(0, 1, d_model // 2): the endpoint 1 is included, so
    the exponents are i/(d/2 - 1), not 2i/d."""
    pos = np.arange(n_positions)[:, None]
    angles = pos / 10000 ** np.linspace(0, 1, d_model // 2)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def pe_log10_frequencies(n_positions, d_model):
    """Exercise 5. Frequencies as exp(-2i·log(10000)/d) with math.log10 in place of the natural log."""
    pos = np.arange(n_positions)[:, None]
    angles = pos * np.exp(-np.arange(0, d_model, 2) * math.log10(10000) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


# ---------------------------------------------------------------- correct alternatives


def attention_finfo_min(Q, K, V, causal=False):
    """Exercise 4, correct: hidden scores replaced by the most negative float64 (not -inf, but no score can lie
    that far above it), the product by einsum."""
    S = np.einsum("id,jd->ij", Q, K) / np.sqrt(Q.shape[-1])
    if causal:
        i = np.arange(S.shape[0])[:, None]
        j = np.arange(S.shape[1])[None, :]
        S = np.where(j > i, np.finfo(np.float64).min, S)
    return softmax_rows(S) @ V


def positions_stacked(n_positions, d_model):
    """Exercise 5, correct: sines and cosines stacked on a last axis and reshaped (interleaves them)."""
    angles = np.arange(n_positions)[:, None] * 10000.0 ** (-np.arange(d_model // 2) * 2 / d_model)
    return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(n_positions, d_model)


WRONG = {
    "by_hand": [by_hand_sqrt_dv, by_hand_v4_misread],
    "scores": [scores_fp16_scale, scores_rounded],
    "softmax": [softmax_axis1],
    "attention": [attention_softmax_transposed, attention_mask_from_values],
    "positions": [pe_base_10e4, pe_linspace_exponent, pe_log10_frequencies],
}
CORRECT = {"attention": [attention, attention_finfo_min], "positions": [sinusoidal_positions, positions_stacked]}

_rng = np.random.default_rng(3)
_Q, _K, _V = _rng.normal(size=(3, 5)), _rng.normal(size=(4, 5)), _rng.normal(size=(4, 2))
_Qs, _Ks, _Vs = _rng.normal(size=(4, 5)), _rng.normal(size=(4, 5)), _rng.normal(size=(4, 3))
_Qz = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
_Kz = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 3.0]])       # q0·k2 = 0: a future key of query 0 scores exactly 0
_S3 = _rng.normal(size=(2, 3, 3)) * 3

WITNESS = {
    **{f.__name__: (lambda f: f()) for f in WRONG["by_hand"]},
    "scores_fp16_scale": lambda f: f(_Q, _K), "scores_rounded": lambda f: f(_Q, _K),
    "softmax_axis1": lambda f: f(_S3),
    "attention_softmax_transposed": lambda f: f(_Qs, _Ks, _Vs),
    "attention_mask_from_values": lambda f: f(_Qz, _Kz, _Vs[:3], True),
    **{f.__name__: (lambda f: f(50, 8)) for f in WRONG["positions"]},
}
