"""Round 6 of fresh wrong answers for lab 01 (attention by hand), written from the lab's text and its
solution only (the checks unread). WRONG maps an exercise to wrong answers; CORRECT to right ones;
WITNESS names, for each wrong answer, a call on which it differs from the solution
(tests/fresh_mutants/round6/verify.py runs it). Each wrong answer is one edit of the solution. New classes
here: an output computed from already rounded weights (the lab says round once, at the end), the scale
taken from d_v, an input scaled in place, floor division, a shift by the row's mean, a softmax that shifts its
input in place, a mask multiplied by infinity (0 · inf = NaN), the mask applied after the softmax, positions
in int16 (wrapping past 32767), and angles computed in float32 returned as a float64 table. The correct
answers: an einsum, a softmax through the log-sum-exp, a mask of the most negative finite float64, and
frequencies as exp(-2i ln(10000)/d)."""
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


def by_hand_output_from_rounded_weights():
    """Exercise 1. The output computed from the weights already rounded to 4 decimals ('use the numbers I
    wrote down'): o = (1.0448, 0.4912); the lab says round once, at the end (1.0447, 0.4911)."""
    return [2.0, 0.0, 1.5, 0.5], [0.5089, 0.0689, 0.3087, 0.1136], [1.0448, 0.4912]


def by_hand_scale_by_sqrt_dv():
    """Exercise 1. The scores divided by √d_v = √2 ('the values' width') instead of √d = 2: scores
    (2.8284, 0, 2.1213, 0.7071) and the weights and output that follow."""
    return [2.8284, 0.0, 2.1213, 0.7071], [0.5981, 0.0353, 0.2949, 0.0717], [1.0363, 0.4019]


# ---------------------------------------------------------------- exercise 2: scores


def scores_q_scaled_in_place(Q, K):
    """Exercise 2. Q divided by √d in place before the product ('scale the smaller matrix'): the scores are
    right, the caller's Q is changed (and an integer Q raises)."""
    Q /= math.sqrt(Q.shape[1])
    return Q @ K.T


def scores_floor_division(Q, K):
    """Exercise 2. `//` typed for `/` ('divide by √d'): every score rounded down to a whole number."""
    return Q @ K.T // math.sqrt(Q.shape[1])


# ---------------------------------------------------------------- exercise 3: softmax


def softmax_shift_by_row_mean(S):
    """Exercise 3. Each row shifted by its mean ('centre the row'): exact while the row's maximum lies
    within 709 of its mean, inf/inf = NaN on a row such as (0, 0, 0, 2000)."""
    shifted = S - S.mean(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def softmax_shifts_input_in_place(S):
    """Exercise 3. The shift done in place, S -= max ('no copy'): the weights are right, the caller's S is
    changed."""
    S -= S.max(axis=-1, keepdims=True)
    weights = np.exp(S)
    return weights / weights.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------- exercise 4: attention


def attention_mask_times_inf(Q, K, V, causal=False):
    """Exercise 4. The mask added as -inf · triu(ones) ('an additive mask'): 0 · (-inf) is NaN, so every
    visible score becomes NaN."""
    S = scores(Q, K)
    if causal:
        S = S + (-np.inf) * np.triu(np.ones(S.shape), k=1)
    return softmax_rows(S) @ V


def attention_mask_after_softmax(Q, K, V, causal=False):
    """Exercise 4. The softmax over every key, then hidden weights zeroed and each row renormalised ('mask the
    probabilities'): equal in exact arithmetic, but a hidden key scoring 800 above the visible ones underflows
    their weights to 0 and the row to 0/0."""
    P = softmax_rows(scores(Q, K))
    if causal:
        P = np.where(np.triu(np.ones(P.shape, dtype=bool), k=1), 0.0, P)
        P = P / P.sum(axis=-1, keepdims=True)
    return P @ V


# ---------------------------------------------------------------- exercise 5: positions


def positions_int16(n_positions, d_model):
    """Exercise 5. Positions made int16 ('a few thousand positions at most'): past 32767 they wrap to
    negative numbers."""
    pos = np.arange(n_positions, dtype=np.int16)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def positions_angles_float32(n_positions, d_model):
    """Exercise 5. The angles computed in float32 ('a float32 table is allowed') and stored into a float64
    table: the table claims float64 but holds float32 angles (an error of about pos · 6e-8)."""
    pos = np.arange(n_positions, dtype=np.float32)[:, None]
    angles = pos / np.float32(10000) ** (np.arange(0, d_model, 2, dtype=np.float32) / np.float32(d_model))
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


# ---------------------------------------------------------------- correct alternatives


def scores_einsum(Q, K):
    """Exercise 2, correct: the product as an einsum over d."""
    return np.einsum("id,jd->ij", Q, K) / np.sqrt(K.shape[1])


def softmax_via_logsumexp(S):
    """Exercise 3, correct: exp(S - logsumexp(S)) with the log-sum-exp shifted by the row maximum."""
    m = S.max(axis=-1, keepdims=True)
    lse = m + np.log(np.exp(S - m).sum(axis=-1, keepdims=True))
    return np.exp(S - lse)


def attention_finfo_min(Q, K, V, causal=False):
    """Exercise 4, correct: hidden scores set to the most negative finite float64 (-1.8e308): no score lies
    that far above a visible one, so its weight is exactly 0 like -inf's."""
    S = scores(Q, K)
    if causal:
        S = np.where(np.triu(np.ones(S.shape, dtype=bool), k=1), np.finfo(np.float64).min, S)
    return softmax_rows(S) @ V


def positions_exp_log(n_positions, d_model):
    """Exercise 5, correct: the frequencies as exp(-2i · ln(10000) / d_model), multiplied by the positions."""
    freq = np.exp(-np.arange(0, d_model, 2) * (math.log(10000.0) / d_model))
    angles = np.arange(n_positions)[:, None] * freq[None, :]
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


WRONG = {
    "by_hand": [by_hand_output_from_rounded_weights, by_hand_scale_by_sqrt_dv],
    "scores": [scores_q_scaled_in_place, scores_floor_division],
    "softmax": [softmax_shift_by_row_mean, softmax_shifts_input_in_place],
    "attention": [attention_mask_times_inf, attention_mask_after_softmax],
    "positions": [positions_int16, positions_angles_float32],
}
CORRECT = {"scores": [scores, scores_einsum], "softmax": [softmax_rows, softmax_via_logsumexp],
           "attention": [attention, attention_finfo_min], "positions": [sinusoidal_positions, positions_exp_log]}


def _rng():
    return np.random.default_rng(6)


def _w_scores(f):
    r = _rng()
    Q, K = r.standard_normal((3, 5)) * 3, r.standard_normal((4, 5)) * 3
    S = f(Q, K)
    return [S, Q]


def _w_softmax(f):
    S = np.array([[0.0, 0.0, 0.0, 2000.0], [1.0, 2.0, 3.0, 4.0]])
    P = f(S)
    return [P, S]


def _w_attention(f):
    r = _rng()
    Q, K, V = r.standard_normal((4, 4)), r.standard_normal((4, 4)), r.standard_normal((4, 3))
    K[3] = Q[0] * 800.0            # key 3, hidden from query 0, scores about 800 · |q0|² / 2 above the others
    return f(Q, K, V, causal=True)


WITNESS = {
    "by_hand_output_from_rounded_weights": lambda f: f(),
    "by_hand_scale_by_sqrt_dv": lambda f: f(),
    "scores_q_scaled_in_place": _w_scores,
    "scores_floor_division": _w_scores,
    "softmax_shift_by_row_mean": _w_softmax,
    "softmax_shifts_input_in_place": _w_softmax,
    "attention_mask_times_inf": _w_attention,
    "attention_mask_after_softmax": _w_attention,
    "positions_int16": lambda f: f(40000, 4),
    "positions_angles_float32": lambda f: f(2000, 8),
}
