"""RoPE: both modes against a pair-by-pair definition, the relative-position property, the tables."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit.reference.rope import (
    MODES,
    apply_rope,
    inv_frequencies,
    pair_layout,
    rope_angles,
    rope_cache,
    rotation_matrix,
)


def rope_by_pairs(x: np.ndarray, pos: int, mode: str, base: float = 10000.0) -> np.ndarray:
    """One vector, one position, pair by pair from the definition (float64)."""
    d = x.shape[-1]
    out = np.empty(d)
    for j in range(d // 2):
        theta = pos * base ** (-2 * j / d)
        a_i, b_i = (j, j + d // 2) if mode == "half" else (2 * j, 2 * j + 1)
        a, b = x[a_i], x[b_i]
        out[a_i] = a * math.cos(theta) - b * math.sin(theta)
        out[b_i] = b * math.cos(theta) + a * math.sin(theta)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("head_dim", [2, 6, 16])
def test_apply_rope_matches_the_pairwise_definition(mode, head_dim):
    g = torch.Generator().manual_seed(head_dim)
    x = torch.randn(3, 5, head_dim, dtype=torch.float64, generator=g)        # [H, S, D]
    positions = torch.tensor([0, 1, 7, 100, 4095])                          # [S]: broadcast over heads
    got = apply_rope(x, positions, mode=mode).numpy()
    for h in range(3):
        for s, p in enumerate(positions.tolist()):
            np.testing.assert_allclose(got[h, s], rope_by_pairs(x[h, s].numpy(), p, mode), rtol=1e-12, atol=1e-12)


def test_the_two_modes_are_different_rotations_related_by_a_permutation():
    d = 8
    x = torch.randn(4, d, dtype=torch.float64)
    pos = torch.tensor([3, 5, 8, 13])
    half, inter = apply_rope(x, pos, mode="half"), apply_rope(x, pos, mode="interleaved")
    assert not torch.allclose(half, inter)
    # interleaved order (0, 1, 2, 3, ...) -> half-split order (0, 2, 4, ..., 1, 3, ...)
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    assert torch.allclose(apply_rope(x[:, perm], pos, mode="half"), inter[:, perm], atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_position_zero_is_the_identity_and_norms_are_kept(mode):
    x = torch.randn(6, 32, dtype=torch.float64)
    assert torch.equal(apply_rope(x, 0, mode=mode), x)
    rotated = apply_rope(x, torch.arange(6), mode=mode)
    assert torch.allclose(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 5000), n=st.integers(0, 5000), shift=st.integers(0, 5000),
       mode=st.sampled_from(MODES), seed=st.integers(0, 2 ** 16))
def test_scores_depend_only_on_the_relative_position(m, n, shift, mode, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 16, dtype=torch.float64, generator=g)
    score = apply_rope(q, m, mode=mode) @ apply_rope(k, n, mode=mode)
    shifted = apply_rope(q, m + shift, mode=mode) @ apply_rope(k, n + shift, mode=mode)
    assert abs(score - shifted) <= 1e-9 * (q.norm() * k.norm())


def test_the_relative_property_fails_without_the_same_rotation_for_q_and_k():
    """Rotating k but not q (or q in the other mode) breaks it: the test above can fail."""
    q, k = torch.randn(2, 16, dtype=torch.float64)
    a = q @ apply_rope(k, 13)                                   # q at position 10 left unrotated
    b = apply_rope(q, 10, mode="interleaved") @ apply_rope(k, 13, mode="half")
    ref = apply_rope(q, 10) @ apply_rope(k, 13)
    assert abs(a - ref) > 1e-6 and abs(b - ref) > 1e-6


@pytest.mark.parametrize("mode", MODES)
def test_rotation_matrix_is_orthogonal_and_matches_apply_rope(mode):
    r = rotation_matrix(37, 8, mode=mode)
    assert torch.allclose(r @ r.T, torch.eye(8, dtype=torch.float64), atol=1e-12)
    x = torch.randn(8, dtype=torch.float64)
    assert torch.allclose(r @ x, apply_rope(x, 37, mode=mode), atol=1e-12)
    # R(m)ᵀ R(n) = R(n − m): the relative-position property as matrices
    assert torch.allclose(rotation_matrix(5, 8, mode=mode).T @ rotation_matrix(12, 8, mode=mode),
                          rotation_matrix(7, 8, mode=mode), atol=1e-12)


def test_tables_and_pair_layout_agree_with_apply_rope():
    d, base = 12, 500000.0
    theta = inv_frequencies(d, base)
    assert theta[0] == 1.0 and torch.allclose(theta, base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d))
    cos, sin = rope_cache(50, d, base=base, dtype=torch.float64)
    angles = rope_angles(torch.arange(50), d, base)
    assert torch.equal(cos, torch.cos(angles)) and torch.equal(sin, torch.sin(angles))
    x = torch.randn(d, dtype=torch.float64)
    for mode in MODES:
        partner, sign, freq = pair_layout(d, mode)
        by_layout = x * cos[41, freq] + sign * x[partner] * sin[41, freq]
        assert torch.allclose(by_layout, apply_rope(x, 41, mode=mode, base=base), atol=1e-12)


def test_low_precision_inputs_keep_their_dtype_and_device():
    x = torch.randn(2, 3, 4, 8).to(torch.bfloat16)                          # BSNH
    out = apply_rope(x, torch.arange(3)[:, None], mode="half")              # positions [S, 1]
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    ref = apply_rope(x.double(), torch.arange(3)[:, None])
    assert (out.double() - ref).abs().max() < 2e-2


@pytest.mark.parametrize("call, message", [
    (lambda: apply_rope(torch.randn(4, 7), 0), "x: RoPE rotates pairs"),
    (lambda: apply_rope(torch.randn(4, 8), 0, mode="neox"), "mode: expected one of"),
    (lambda: apply_rope(torch.randn(4, 8), torch.tensor([0.5])), "positions: expected integers"),
    (lambda: apply_rope(torch.randn(4, 8), torch.tensor([-1])), "positions: must be >= 0"),
    (lambda: apply_rope(torch.randn(4, 8), torch.arange(3)), "positions: shape (3,) does not broadcast"),
    (lambda: apply_rope(torch.randn(4, 8), 0, base=1.0), "base: expected a finite number > 1"),
    (lambda: apply_rope(torch.arange(8), 0), "x: expected a floating-point tensor"),
    (lambda: rope_cache(0, 8), "max_positions"),
])
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_numpy_integers_and_floats_are_taken_as_sizes_and_bases():
    """A configuration read from NumPy (np.int64 head dims, np.int64 or np.float32 bases) gives the same
    tables as Python numbers; bool, NaN and bases <= 1 stay refused."""
    cos, sin = rope_cache(16, 8, base=10000)
    for base in (np.int64(10000), np.float32(10000.0), np.float64(10000.0)):
        c, s = rope_cache(np.int64(16), np.int32(8), base=base)
        assert torch.equal(c, cos) and torch.equal(s, sin)
    assert torch.equal(inv_frequencies(np.int64(8), np.int64(500000)), inv_frequencies(8, 500000.0))
    x = torch.randn(3, 8, dtype=torch.float64)
    assert torch.equal(apply_rope(x, torch.arange(3)[:, None], base=np.int64(10000)),
                       apply_rope(x, torch.arange(3)[:, None], base=10000.0))
    for bad in (True, np.float64("nan"), np.int64(1)):
        with pytest.raises(ValueError, match="base: expected a finite number > 1"):
            rope_cache(16, 8, base=bad)
