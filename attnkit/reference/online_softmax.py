"""Online softmax and the merge rule for partial attention results, in NumPy (float64).

A *partial state* summarises attention of some query rows over one part of the keys:

    m  [...]       the largest score seen so far in each row
    l  [..., ]     Σ_j exp(s_j − m)              (the softmax denominator, relative to m)
    z  [..., dv]   Σ_j exp(s_j − m) · v_j        (the un-normalised output, relative to m)

Two states over disjoint parts of the keys merge into the state over both parts with ``merge``;
``finalize`` divides z by l. Merging is associative and commutative, so the keys can be split into
blocks in any way and the blocks merged in any order: this is what FlashAttention's inner loop and
split-KV decoding (lesson 8) both rely on.

Rows that have seen no key (or only masked keys, score −inf) have m = −inf, l = 0, z = 0, and
``finalize`` gives 0 for them, like ``attnkit.reference.attention.attention_np`` does for fully masked rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PartialState:
    """(m, l, z) for a batch of query rows. m, l: [...]; z: [..., dv]."""

    m: np.ndarray
    l: np.ndarray
    z: np.ndarray

    def __post_init__(self):
        m, l, z = (np.asarray(x, dtype=np.float64) for x in (self.m, self.l, self.z))
        if m.shape != l.shape:
            raise ValueError(f"l: must have the shape of m {m.shape}, got {l.shape}")
        if z.shape[:-1] != m.shape:
            raise ValueError(f"z: must have shape m.shape + (dv,) = {m.shape} + (dv,), got {z.shape}")
        object.__setattr__(self, "m", m)
        object.__setattr__(self, "l", l)
        object.__setattr__(self, "z", z)

    @property
    def lse(self) -> np.ndarray:
        """log Σ_j exp(s_j) = m + log l, the log-sum-exp that the backward pass (lesson 6) reuses."""
        with np.errstate(divide="ignore"):
            return np.where(self.l > 0, self.m + np.log(np.where(self.l > 0, self.l, 1.0)), -np.inf)


def empty_state(rows: int | tuple, dv: int) -> PartialState:
    """The state of rows that have seen no key yet: m = −inf, l = 0, z = 0."""
    shape = (rows,) if isinstance(rows, int) else tuple(rows)
    if any(s < 0 for s in shape) or dv < 1:
        raise ValueError(f"rows, dv: need rows ≥ 0 and dv ≥ 1, got rows={rows}, dv={dv}")
    return PartialState(np.full(shape, -np.inf), np.zeros(shape), np.zeros(shape + (dv,)))


def block_state(scores, values) -> PartialState:
    """The partial state of one block of keys.

    scores: [..., n] (already scaled and masked; −inf for a masked key); values: [n, dv] or [..., n, dv].
    """
    s = np.asarray(scores, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if v.ndim < 2 or v.shape[-2] != s.shape[-1]:
        raise ValueError(f"values: must be [..., n, dv] with n = scores.shape[-1] = {s.shape[-1]}, "
                         f"got {v.shape}")
    if s.shape[-1] == 0:
        return empty_state(s.shape[:-1], v.shape[-1])
    m = np.max(s, axis=-1)                                           # [...]
    safe_m = np.where(np.isfinite(m), m, 0.0)                        # all-masked rows: exp(−inf) = 0
    p = np.exp(s - safe_m[..., None])                                # [..., n]  un-normalised weights
    return PartialState(m, p.sum(axis=-1), p @ v if v.ndim == 2 else np.einsum("...n,...nd->...d", p, v))


def _rescale(m_old: np.ndarray, m_new: np.ndarray) -> np.ndarray:
    """exp(m_old − m_new), with 0 where m_old = −inf (nothing seen yet), also when m_new = −inf."""
    finite = np.isfinite(m_old)
    return np.where(finite, np.exp(np.where(finite, m_old - np.where(finite, m_new, 0.0), 0.0)), 0.0)


def merge(a: PartialState, b: PartialState) -> PartialState:
    """The state over the keys of ``a`` and of ``b`` together (their key sets must be disjoint).

        m = max(m_a, m_b)
        l = e^(m_a − m) l_a + e^(m_b − m) l_b
        z = e^(m_a − m) z_a + e^(m_b − m) z_b
    """
    if a.m.shape != b.m.shape or a.z.shape != b.z.shape:
        raise ValueError(f"b: must cover the same rows as a: m {a.m.shape} vs {b.m.shape}, "
                         f"z {a.z.shape} vs {b.z.shape}")
    m = np.maximum(a.m, b.m)
    alpha, beta = _rescale(a.m, m), _rescale(b.m, m)
    return PartialState(m, alpha * a.l + beta * b.l, alpha[..., None] * a.z + beta[..., None] * b.z)


def merge_all(states) -> PartialState:
    """Merge a sequence of states from left to right."""
    states = list(states)
    if not states:
        raise ValueError("states: need at least one partial state")
    out = states[0]
    for s in states[1:]:
        out = merge(out, s)
    return out


def finalize(state: PartialState) -> np.ndarray:
    """The attention output z / l, [..., dv]; 0 for rows that saw no key."""
    l = state.l[..., None]
    return np.divide(state.z, l, out=np.zeros_like(state.z), where=l > 0)


# ------------------------------------------------------------------------------- one row of scores
def online_max_sum(row) -> tuple[float, float]:
    """One pass over a row of scores keeping the running (m, ℓ); returns the final (m, ℓ).

    For each score x:  m_new = max(m, x);  ℓ = ℓ · e^(m − m_new) + e^(x − m_new).
    """
    m, l = -math.inf, 0.0
    for x in np.asarray(row, dtype=np.float64).ravel():
        m_new = max(m, x)
        if m_new == -math.inf:           # only masked scores so far
            continue
        l = l * math.exp(m - m_new) + math.exp(x - m_new)
        m = m_new
    return m, l


def online_softmax(row) -> np.ndarray:
    """Softmax of a 1-D row from the streamed (m, ℓ): one pass for (m, ℓ), one to write e^(x − m) / ℓ."""
    row = np.asarray(row, dtype=np.float64)
    if row.ndim != 1:
        raise ValueError(f"row: must be 1-D, got shape {row.shape}")
    m, l = online_max_sum(row)
    if l == 0.0:
        return np.zeros_like(row)
    return np.exp(row - m) / l
