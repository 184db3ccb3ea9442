"""Online softmax, the merge rule (associative, any split, any order) and the tiled NumPy attention."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.reference import example_4x4 as examples
from attnkit.reference.attention import attention_np, softmax_np
from attnkit.reference.online_softmax import (
    PartialState,
    block_state,
    empty_state,
    finalize,
    merge,
    merge_all,
    online_max_sum,
    online_softmax,
)
from attnkit.reference.tiled_numpy import (
    blocks_for_sram,
    naive_attention,
    naive_traffic_bytes,
    sram_bytes_needed,
    tiled_attention,
    tiled_traffic_bytes,
)
from attnkit.tolerances import assert_close

F64 = "float64"


def _qkv(rng, n_q, n_k, d, dv, spread=1.0):
    return (rng.standard_normal((n_q, d)) * spread, rng.standard_normal((n_k, d)) * spread,
            rng.standard_normal((n_k, dv)))


# --------------------------------------------------------------------------------- online softmax
def test_online_softmax_matches_reference_and_survives_overflow():
    rng = np.random.default_rng()
    for row in (rng.standard_normal(17), rng.standard_normal(9) * 50 + 1000, np.array([3.0])):
        assert_close(online_softmax(row), softmax_np(row), F64, what="online softmax")
    m, l = online_max_sum(np.array([1.0, 3.0, 2.0]))
    assert m == 3.0 and l == pytest.approx(math.exp(-2) + 1 + math.exp(-1), rel=1e-15)


def test_online_softmax_rejects_a_matrix():
    with pytest.raises(ValueError, match="row"):
        online_softmax(np.zeros((2, 3)))


# ------------------------------------------------------------------------------------- merge rule
def _states_for_split(S, V, cuts):
    edges = [0, *cuts, S.shape[1]]
    return [block_state(S[:, a:b], V[a:b]) for a, b in zip(edges[:-1], edges[1:])]


@settings(max_examples=60, deadline=None)
@given(n_k=st.integers(1, 40), rows=st.integers(1, 4), dv=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       data=st.data())
def test_merge_any_split_any_order_gives_exact_attention(n_k, rows, dv, seed, data):
    rng = np.random.default_rng(seed)
    S = rng.standard_normal((rows, n_k)) * data.draw(st.sampled_from([1.0, 10.0, 300.0]))
    V = rng.standard_normal((n_k, dv))
    cuts = sorted(data.draw(st.sets(st.integers(1, max(n_k - 1, 1)), max_size=6))) if n_k > 1 else []
    states = _states_for_split(S, V, cuts)
    order = data.draw(st.permutations(range(len(states))))
    expected = softmax_np(S) @ V
    # left to right in a shuffled order
    assert_close(finalize(merge_all([states[i] for i in order])), expected, F64, what="shuffled merge")
    # as a balanced tree (another bracketing)
    level = [states[i] for i in order]
    while len(level) > 1:
        level = [merge(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    assert_close(finalize(level[0]), expected, F64, what="tree merge")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_merge_is_associative_and_commutative_on_states(seed):
    rng = np.random.default_rng(seed)
    a, b, c = (block_state(rng.standard_normal((3, k)) * 5, rng.standard_normal((k, 2))) for k in (2, 5, 3))
    left, right = merge(merge(a, b), c), merge(a, merge(b, c))
    for x, y in ((left.m, right.m), (left.l, right.l), (left.z, right.z)):
        assert_close(x, y, F64)
    swapped = merge(b, a)
    assert np.array_equal(merge(a, b).m, swapped.m)
    assert_close(merge(a, b).z, swapped.z, F64)


def test_empty_state_is_the_identity_and_masked_rows_give_zero():
    rng = np.random.default_rng()
    s = block_state(rng.standard_normal((2, 4)), rng.standard_normal((4, 3)))
    for merged in (merge(empty_state(2, 3), s), merge(s, empty_state(2, 3))):
        assert np.array_equal(merged.m, s.m) and np.array_equal(merged.l, s.l) and np.array_equal(merged.z, s.z)
    masked = block_state(np.full((2, 3), -np.inf), rng.standard_normal((3, 2)))
    both = merge(masked, empty_state(2, 2))
    assert np.all(both.l == 0) and np.all(finalize(both) == 0) and not np.any(np.isnan(both.z))


def test_lse_is_log_sum_exp():
    rng = np.random.default_rng()
    S = rng.standard_normal((3, 7)) * 20
    s = merge_all(_states_for_split(S, rng.standard_normal((7, 2)), [2, 5]))
    expected = np.log(np.exp(S - S.max(1, keepdims=True)).sum(1)) + S.max(1)
    assert_close(s.lse, expected, F64, what="lse")


def test_states_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="z"):
        PartialState(np.zeros(3), np.ones(3), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="b: must cover the same rows"):
        merge(empty_state(3, 2), empty_state(4, 2))
    with pytest.raises(ValueError, match="values"):
        block_state(np.zeros((2, 3)), np.zeros((4, 2)))


# --------------------------------------------------------------------------------- tiled attention
def test_worked_example_tiled_2x2_equals_lesson_1_exactly():
    ref = attention_np(examples.Q, examples.K, examples.V, scale=examples.SCALE)
    out = tiled_attention(examples.Q, examples.K, examples.V, block_q=2, block_k=2, scale=examples.SCALE).out
    assert np.allclose(out, ref, rtol=0, atol=4 * np.finfo(np.float64).eps)


@settings(max_examples=30, deadline=None)
@given(n_q=st.integers(1, 37), n_k=st.integers(1, 37), d=st.sampled_from([2, 4, 8]), dv=st.integers(1, 5),
       block_q=st.integers(1, 9), block_k=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_tiled_attention_is_exact_and_its_counters_match_the_closed_form(n_q, n_k, d, dv, block_q, block_k, seed):
    Q, K, V = _qkv(np.random.default_rng(seed), n_q, n_k, d, dv, spread=2.0)
    r = tiled_attention(Q, K, V, block_q=block_q, block_k=block_k, itemsize=2)
    assert_close(r.out, attention_np(Q, K, V), F64, what="tiled attention")
    assert (r.traffic.bytes_read, r.traffic.bytes_written) == tiled_traffic_bytes(n_q, n_k, d, dv, r.block_q, 2)
    # Q read once, O written once, no S or P in HBM
    assert r.traffic.read["Q"] == 2 * n_q * d and r.traffic.written == {"O": 2 * n_q * dv}


@pytest.mark.parametrize("n_q, n_k, d, dv, itemsize", [(50, 50, 8, 8, 2), (33, 70, 16, 4, 4), (1, 9, 4, 4, 2)])
def test_naive_counters_match_the_closed_form(n_q, n_k, d, dv, itemsize):
    Q, K, V = _qkv(np.random.default_rng(), n_q, n_k, d, dv)
    out, t = naive_attention(Q, K, V, itemsize=itemsize)
    assert_close(out, attention_np(Q, K, V), F64)
    assert (t.bytes_read, t.bytes_written) == naive_traffic_bytes(n_q, n_k, d, dv, itemsize)
    assert t.written["S"] == t.read["S"] == itemsize * n_q * n_k


def test_source_table_fp16_n4096_d128():
    # One head, N = 4096, d = 128, fp16: 138,412,032 bytes through HBM.
    read, written = naive_traffic_bytes(4096, 4096, 128, 128, 2)
    assert read + written == 2 * (4 * 4096**2 + 4 * 4096 * 128) == 138_412_032
    # and the fp32 estimate of the second source, 16N² + 16Nd bytes
    read, written = naive_traffic_bytes(4096, 4096, 128, 128, 4)
    assert read + written == 16 * 4096**2 + 16 * 4096 * 128


def test_blocks_for_sram_fit_and_give_the_n2_d2_over_m_law():
    d = dv = 16
    previous = None
    for sram in (4_096, 8_192, 16_384, 32_768):
        bq, bk = blocks_for_sram(sram, d, dv, 2)
        assert sram_bytes_needed(bq, bk, d, dv, 2) <= sram < sram_bytes_needed(bq + 1, bk, d, dv, 2)
        read, written = tiled_traffic_bytes(2048, 2048, d, dv, bq, 2)
        if previous is not None:   # doubling M roughly halves the K/V re-reads
            assert 0.4 < (read - 2 * 2048 * d) / previous < 0.6
        previous = read - 2 * 2048 * d
    counted = tiled_attention(*_qkv(np.random.default_rng(), 300, 300, d, dv), sram_bytes=8_192)
    assert counted.sram_bytes <= 8_192
    assert counted.traffic.bytes_read == tiled_traffic_bytes(300, 300, d, dv, counted.block_q, 2)[0]


def test_tiled_attention_rejects_bad_arguments():
    Q, K, V = _qkv(np.random.default_rng(), 4, 4, 4, 2)
    with pytest.raises(ValueError, match="block_q, block_k, sram_bytes"):
        tiled_attention(Q, K, V)
    with pytest.raises(ValueError, match="block_q, block_k: both must be"):
        tiled_attention(Q, K, V, block_q=0, block_k=2)
    with pytest.raises(ValueError, match="sram_bytes: tiles of"):
        tiled_attention(Q, K, V, block_q=4, block_k=4, sram_bytes=10)
    with pytest.raises(ValueError, match="sram_bytes: 8 bytes cannot hold"):
        tiled_attention(Q, K, V, sram_bytes=8)
    with pytest.raises(ValueError, match="K: must have the head dim"):
        tiled_attention(Q, K[:, :3], V, block_q=2, block_k=2)
    with pytest.raises(ValueError, match="V: must have one row per key"):
        naive_attention(Q, K, V[:3])
