"""Lab 01's checks accept right answers, say "not implemented yet" for blanks, reject known-wrong ones."""
import math

import numpy as np
import pytest

from attnkit.labs import lab01
from attnkit.reference.attention import attention_np, softmax_np


def blank(*args, **kwargs):
    raise NotImplementedError


# Right answers, written differently from the references on purpose.
def scores_ok(Q, K):
    return np.einsum("id,jd->ij", Q, K) / np.sqrt(K.shape[1])


def softmax_ok(S):
    e = np.exp(S - S.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def attention_ok(Q, K, V, causal=False):
    S = scores_ok(Q, K)
    if causal:
        S = np.where(np.tril(np.ones_like(S, dtype=bool)), S, -np.inf)
    return softmax_ok(S) @ V


def positions_ok(n, d):
    pe = np.empty((n, d))
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            pe[pos, 2 * i], pe[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe


RIGHT = {"scores": scores_ok, "softmax_rows": softmax_ok, "attention": attention_ok,
         "sinusoidal_positions": positions_ok}

WRONG = {
    "scores": {
        "no scaling": lambda Q, K: Q @ K.T,
        "scaled by d instead of √d": lambda Q, K: Q @ K.T / Q.shape[1],
        "keys and queries swapped": lambda Q, K: K @ Q.T / math.sqrt(Q.shape[1]),
    },
    "softmax_rows": {
        "normalised over columns": lambda S: softmax_np(S.T).T,
        "no max subtraction (overflows)": lambda S: np.exp(S) / np.exp(S).sum(-1, keepdims=True),
        "exp without normalising": lambda S: np.exp(S - S.max(-1, keepdims=True)),
    },
    "attention": {
        "mask on the wrong side": lambda Q, K, V, causal=False: attention_np(Q[::-1], K[::-1], V[::-1],
                                                                             causal=causal)[::-1],
        "mask after softmax, no renormalising": lambda Q, K, V, causal=False: (
            (softmax_ok(scores_ok(Q, K)) * (np.tril(np.ones((len(Q), len(K)))) if causal else 1)) @ V),
        "causal ignored": lambda Q, K, V, causal=False: attention_np(Q, K, V),
        "scaled by d": lambda Q, K, V, causal=False: attention_np(Q, K, V, causal=causal, scale=1 / Q.shape[1]),
    },
    "sinusoidal_positions": {
        "sin and cos swapped": lambda n, d: positions_ok(n, d)[:, [i ^ 1 for i in range(d)]],
        "exponent i/d instead of 2i/d": lambda n, d: np.stack(
            [f(p / 10000 ** (i / d)) for p in range(n) for i in range(d // 2) for f in (np.sin, np.cos)]
        ).reshape(n, d),
    },
}


@pytest.mark.parametrize("name", list(lab01.EXERCISES))
def test_right_answer_passes(name):
    assert lab01.EXERCISES[name](RIGHT[name]).passed


@pytest.mark.parametrize("name", list(lab01.EXERCISES))
def test_blank_reports_not_implemented(name):
    result = lab01.EXERCISES[name](blank)
    assert result.status == "not implemented" and "not implemented yet" in result.report


@pytest.mark.parametrize("name, label", [(n, l) for n in WRONG for l in WRONG[n]])
def test_known_wrong_answer_is_rejected(name, label):
    result = lab01.EXERCISES[name](WRONG[name][label])
    assert result.status == "failed", f"{label} slipped through"
    assert "hint:" in result.report


# Right answers that write into their inputs: each is judged on what it returns, against the reference
# on the untouched inputs.
def scores_scaling_q_in_place(Q, K):
    Q /= math.sqrt(Q.shape[1])
    return Q @ K.T


def softmax_in_place(S):
    S -= S.max(axis=1, keepdims=True)
    np.exp(S, out=S)
    S /= S.sum(axis=1, keepdims=True)
    return S


def attention_in_place(Q, K, V, causal=False):
    S = scores_scaling_q_in_place(Q, K)
    if causal:
        S[np.triu_indices_from(S, k=1)] = -np.inf
    out = softmax_in_place(S) @ V
    V[:] = 0                                         # scribbles on an input after using it
    return out


@pytest.mark.parametrize("name, fn", [("scores", scores_scaling_q_in_place), ("softmax_rows", softmax_in_place),
                                      ("attention", attention_in_place)])
def test_a_right_answer_that_modifies_its_inputs_passes(name, fn):
    result = lab01.EXERCISES[name](fn)
    assert result.passed, result.report


# Wrong answers that overwrite the inputs so that a reference run on them afterwards would agree.
MUTATING_WRONG = {
    "scores": lambda Q, K: (Q.fill(0), np.zeros((len(Q), len(K))))[1],
    "softmax_rows": lambda S: (S.fill(0), np.full(S.shape, 1 / S.shape[1]))[1],
    "attention": lambda Q, K, V, causal=False: (V.fill(0), np.zeros((len(Q), V.shape[1])))[1],
}


@pytest.mark.parametrize("name", list(MUTATING_WRONG))
def test_an_answer_that_zeroes_its_inputs_and_returns_matching_garbage_fails(name):
    result = lab01.EXERCISES[name](MUTATING_WRONG[name])
    assert result.status == "failed", result.report
    assert "differs from the float64 reference" in result.report and "hint:" in result.report


def test_positions_are_checked_on_fresh_random_sizes():
    seen = []

    def recording(n, d):
        seen.append((n, d))
        return positions_ok(n, d)

    first = lab01.check_positions(recording)
    sizes_first = list(seen)
    second = lab01.check_positions(recording)
    assert first.passed and second.passed
    assert first.report == "✅ sinusoidal_positions: matches the float64 reference on 4 random inputs."
    assert len(sizes_first) == 4 and seen[4:] != sizes_first     # two draws of 4 sizes: practically never equal
    assert all(n >= 2 and d >= 4 and d % 2 == 0 for n, d in seen)
