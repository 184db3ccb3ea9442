"""Lab 03's checks accept right answers, say "not implemented yet" for blanks, reject known-wrong ones."""
import math

import numpy as np
import pytest

from attnkit.labs import lab03


def blank(*args, **kwargs):
    raise NotImplementedError


# ------------------------------------------------------------------ right answers, written afresh
def online_softmax_ok(row):
    m, l = -math.inf, 0.0
    for x in row:
        m_new = max(m, x)
        l = l * math.exp(m - m_new) + math.exp(x - m_new)
        m = m_new
    return np.exp(row - m) / l


def merge_ok(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def make_tiled(merge_fn, *, drop_ragged=False, normalise=True):
    def tiled(Q, K, V, block_q, block_k):
        n_q, n_k = len(Q), len(K)
        scale = 1 / math.sqrt(Q.shape[1])
        O = np.zeros((n_q, V.shape[1]))
        stop_q = n_q - n_q % block_q if drop_ragged else n_q
        stop_k = n_k - n_k % block_k if drop_ragged else n_k
        for q0 in range(0, stop_q, block_q):
            Qi = Q[q0:q0 + block_q]
            state = (np.full(len(Qi), -np.inf), np.zeros(len(Qi)), np.zeros((len(Qi), V.shape[1])))
            for k0 in range(0, stop_k, block_k):
                S = Qi @ K[k0:k0 + block_k].T * scale
                m = S.max(axis=1)
                P = np.exp(S - m[:, None])
                state = merge_fn(state, (m, P.sum(axis=1), P @ V[k0:k0 + block_k]))
            O[q0:q0 + block_q] = state[2] / state[1][:, None] if normalise else state[2]
        return O
    return tiled


RIGHT = {"online_softmax": online_softmax_ok, "merge": merge_ok, "tiled_attention": make_tiled(merge_ok)}


# -------------------------------------------------------------------------- known-wrong answers
def online_softmax_no_rescale(row):
    m, l = -math.inf, 0.0
    for x in row:
        m = max(m, x)
        l = l + math.exp(x - m)                  # forgets e^(m_old − m_new) on the old sum
    return np.exp(row - m) / l


def online_softmax_wrong_max(row):
    m, l = -math.inf, 0.0
    for x in row:
        m_new = x                                # the latest score, not the running maximum
        l = l * math.exp(m - m_new) + math.exp(x - m_new) if l else math.exp(x - m_new)
        m = m_new
    return np.exp(row - m) / l


def online_softmax_no_normalisation(row):
    m = -math.inf
    for x in row:
        m = max(m, x)
    return np.exp(row - m)


def online_softmax_unsafe(row):
    l = sum(math.exp(x) if x < 700 else math.inf for x in row)
    return np.exp(np.minimum(row, 700)) / l


def merge_no_rescale(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    return np.maximum(m_a, m_b), l_a + l_b, z_a + z_b


def merge_keeps_first_max(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    beta = np.exp(m_b - m_a)
    m = np.where(np.isfinite(m_a), m_a, m_b)     # keeps a's maximum instead of the larger one
    beta = np.where(np.isfinite(m_a), beta, 1.0)
    alpha = np.where(np.isfinite(m_a), 1.0, 0.0)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def merge_rescales_only_l(a, b):
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, z_a + z_b


def merge_as_list(a, b):
    return list(merge_ok(a, b))[:2]              # forgets z


WRONG = {
    "online_softmax": {
        "missing e^(m_old − m_new) rescale": online_softmax_no_rescale,
        "wrong running max (the last score)": online_softmax_wrong_max,
        "no final normalisation": online_softmax_no_normalisation,
        "no max subtraction (overflows)": online_softmax_unsafe,
    },
    "merge": {
        "missing e^(m_old − m_new) rescale": merge_no_rescale,
        "wrong running max (keeps a's)": merge_keeps_first_max,
        "z not rescaled": merge_rescales_only_l,
        "returns only (m, l)": merge_as_list,
    },
    "tiled_attention": {
        "missing e^(m_old − m_new) rescale": make_tiled(merge_no_rescale),
        "wrong running max": make_tiled(merge_keeps_first_max),
        "no final normalisation": make_tiled(merge_ok, normalise=False),
        "drops the ragged last tiles": make_tiled(merge_ok, drop_ragged=True),
    },
}


@pytest.mark.parametrize("name", list(lab03.EXERCISES))
def test_right_answer_passes(name):
    result = lab03.EXERCISES[name](RIGHT[name])
    assert result.passed, result.report
    assert result.report.startswith("✅")


@pytest.mark.parametrize("name", list(lab03.EXERCISES))
def test_blank_reports_not_implemented(name):
    result = lab03.EXERCISES[name](blank)
    assert result.status == "not implemented" and "not implemented yet" in result.report


@pytest.mark.parametrize("name, wrong", [(n, w) for n in WRONG for w in WRONG[n]])
def test_known_wrong_answer_is_rejected(name, wrong):
    result = lab03.EXERCISES[name](WRONG[name][wrong])
    assert result.status == "failed", f"{name} accepted '{wrong}'"
    assert result.report.startswith("❌") and "hint:" in result.report


def test_package_functions_pass_their_own_checks():
    from attnkit.reference import online_softmax as osm
    from attnkit.reference.tiled_numpy import tiled_attention

    def merge_pkg(a, b):
        s = osm.merge(osm.PartialState(*a), osm.PartialState(*b))
        return s.m, s.l, s.z

    assert lab03.check_online_softmax(osm.online_softmax).passed
    assert lab03.check_merge(merge_pkg).passed
    assert lab03.check_tiled_attention(
        lambda Q, K, V, bq, bk: tiled_attention(Q, K, V, block_q=bq, block_k=bk).out).passed


def test_a_blank_merge_makes_the_tiled_check_say_not_implemented():
    assert lab03.check_tiled_attention(make_tiled(blank)).status == "not implemented"


def test_check_all_summarises_the_three():
    summary = lab03.check_all(online_softmax_ok, merge_ok, make_tiled(merge_ok))
    assert summary.passed and "3 of 3 exercises pass." in repr(summary)
    summary = lab03.check_all(online_softmax_ok, blank, make_tiled(blank))
    assert not summary.passed and "1 of 3 exercises pass." in repr(summary)
