"""The α–β model of a link, and when a ring step hides its transfer behind its block's attention.

Sending b bytes costs α + b/β (α: the latency of one message; β: bytes per second). One ring step
computes one block of n query rows against n keys while the next K/V block moves:

- forward: compute 4·B·Hq·n²·D FLOPs at the rate R_f(n) measured for blocks of n tokens; move one K
  and V shard, 2·B·Hkv·n·D·e bytes, as one message pair (α once: the two sends are posted together);
- backward: compute 2.5× the forward's FLOPs at R_b(n); move K, V (e bytes each) and dK, dV (g_e bytes
  each, accumulated in float32): (2e + 2g_e)·B·Hkv·n·D bytes, 3× the forward's for e = 2, g_e = 4.

A step hides its transfer when compute ≥ transfer; ``hide_threshold`` finds the smallest n where it
does, with R read at n itself (``rate_at``), never extrapolated past the recorded block sizes.
"""
from __future__ import annotations

import math

import numpy as np


def fit_alpha_beta(sizes_bytes, seconds) -> tuple[float, float]:
    """(α in seconds, β in bytes/s) of the least-squares line t = α + b/β through one-way times."""
    b, t = np.asarray(sizes_bytes, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    if b.shape != t.shape or b.size < 2:
        raise ValueError("sizes_bytes, seconds: expected two sequences of the same length, at least 2")
    if np.any(b <= 0) or np.any(t <= 0):
        raise ValueError("sizes_bytes, seconds: every size and time must be positive")
    slope, alpha = np.polyfit(b, t, 1)
    if slope <= 0:
        raise ValueError("seconds: the times do not grow with the size; no bandwidth can be fitted")
    return float(alpha), float(1.0 / slope)


def rate_at(rows, n_key: str = "N", rate_key: str = "tflops"):
    """R(n) in FLOP/s from recorded rows (one per block size): log-linear between recorded sizes, and
    None outside them (a rate is never extrapolated)."""
    pts = sorted((float(r[n_key]), float(r[rate_key]) * 1e12) for r in rows)
    if len({n for n, _ in pts}) != len(pts):
        raise ValueError("rows: expected one row per block size")
    ns, rs = np.log([n for n, _ in pts]), [r for _, r in pts]

    def rate(n: float):
        if not pts[0][0] <= n <= pts[-1][0]:
            return None
        return float(np.interp(math.log(n), ns, rs))
    rate.range = (pts[0][0], pts[-1][0])
    return rate


def step_times(n: float, *, rate: float, alpha: float, beta: float, batch: int, q_heads: int, kv_heads: int,
               head_dim: int, itemsize: int = 2, grad_itemsize: int = 4, backward: bool = False):
    """(compute seconds, transfer seconds) of one ring step with n tokens per rank (module doc)."""
    flops = 4 * batch * q_heads * n * n * head_dim * (2.5 if backward else 1.0)
    per_elem = 2 * itemsize + (2 * grad_itemsize if backward else 0)
    return flops / rate, alpha + per_elem * batch * kv_heads * n * head_dim / beta


def hide_threshold(rate_of_n, *, alpha: float, beta: float, backward: bool = False, **shape) -> float | None:
    """The smallest n (tokens per rank) in the recorded range where a step's compute covers its
    transfer; the range's low end if it already does there, None if it never does in the range."""
    lo, hi = rate_of_n.range

    def margin(n):
        compute, transfer = step_times(n, rate=rate_of_n(n), alpha=alpha, beta=beta, backward=backward, **shape)
        return compute - transfer

    if margin(lo) >= 0:
        return lo
    if margin(hi) < 0:
        return None
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):                         # bisection in log n
        mid = (a + b) / 2
        a, b = (a, mid) if margin(math.exp(mid)) >= 0 else (mid, b)
    return math.exp(b)


__all__ = ["fit_alpha_beta", "rate_at", "step_times", "hide_threshold"]
