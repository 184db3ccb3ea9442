"""Float64 references that every kernel, lesson and lab check is compared with.

Two flavours of the same math:
- NumPy, for the lessons that build attention by hand (one head, [N, d] matrices);
- PyTorch, for the kernels ([B, H, N, D] tensors, grouped-query heads, causal with Nq ≠ Nk).
"""
from __future__ import annotations

import math

import numpy as np


# ----------------------------------------------------------------------------------------- NumPy
def softmax_np(scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """Safe softmax: subtract the row maximum before exponentiating. Rows of only -inf give 0; a row
    holding a NaN gives NaN (as NumPy's and PyTorch's own arithmetic would)."""
    scores = np.asarray(scores, dtype=np.float64)
    row_max = np.max(scores, axis=axis, keepdims=True)                 # NaN if the row holds one
    row_max = np.where(row_max == -np.inf, 0.0, row_max)               # a row that sees nothing
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - row_max)
    total = np.sum(weights, axis=axis, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total != 0)


def causal_mask_np(n_q: int, n_k: int) -> np.ndarray:
    """Boolean [n_q, n_k]: True where query i may see key j, i.e. j ≤ i + n_k − n_q (aligned to the end)."""
    return np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + (n_k - n_q)


def attention_np(Q, K, V, *, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """softmax(Q Kᵀ · scale) V for one head, in float64. Q: [Nq, d], K: [Nk, d], V: [Nk, dv]."""
    Q, K, V = (np.asarray(x, dtype=np.float64) for x in (Q, K, V))
    scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else scale
    scores = Q @ K.T * scale                                   # [Nq, Nk]
    if causal:
        scores = np.where(causal_mask_np(Q.shape[0], K.shape[0]), scores, -np.inf)
    return softmax_np(scores) @ V                               # [Nq, dv]


# --------------------------------------------------------------------------------------- PyTorch
def attention_ref(q, k, v, *, causal: bool = False, sm_scale: float | None = None):
    """Exact attention in float64 on the CPU, the reference for every kernel.

    q: [B, Hq, Nq, D]; k, v: [B, Hkv, Nk, D] with Hq % Hkv == 0. Query head h reads KV head
    h // (Hq // Hkv). With ``causal``, query i sees keys j ≤ i + Nk − Nq; a row that sees no key gives 0.
    NaN propagates as in PyTorch's SDPA (its math backend): a NaN in a row's query or in a key the row
    sees makes the row NaN; a NaN in a value makes that column NaN in the rows that see its key. Keys a
    row does not see are never read (docs/semantics.md). Returns float64 [B, Hq, Nq, D] on the CPU.
    """
    import torch

    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    return _attention64(q64, k64, v64, causal, sm_scale)


def attention_grads_ref(q, k, v, do, *, causal: bool = False, sm_scale: float | None = None):
    """(dq, dk, dv) of ``attention_ref`` for the output gradient ``do``, by float64 autograd on the CPU, in
    q's, k's and v's shapes (a KV head's gradient summed over the query heads that read it)."""
    import torch

    leaves = [t.detach().to("cpu", torch.float64).requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out = _attention64(*leaves, causal, sm_scale)
        return torch.autograd.grad(out, leaves, do.detach().to("cpu", torch.float64))


def _attention64(q64, k64, v64, causal: bool, sm_scale: float | None):
    """``attention_ref``'s math on float64 CPU tensors, differentiable."""
    import torch

    group = q64.shape[1] // k64.shape[1]
    k64 = k64.repeat_interleave(group, dim=1)                  # [B, Hq, Nk, D]
    v64 = v64.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q64.shape[-1]) if sm_scale is None else sm_scale
    scores = q64 @ k64.transpose(-1, -2) * scale               # [B, Hq, Nq, Nk]
    visible = None
    if causal:
        n_q, n_k = scores.shape[-2:]
        visible = torch.from_numpy(causal_mask_np(n_q, n_k))
        scores = scores.masked_fill(~visible, -math.inf)
    # A row that sees no key (all -inf) gives 0; a NaN anywhere in a row's scores gives a NaN row, as
    # PyTorch's SDPA and every kernel do (amax and the sum propagate it; only total == 0 is replaced).
    row_max = scores.amax(dim=-1, keepdim=True)
    row_max = torch.where(row_max == -math.inf, torch.zeros_like(row_max), row_max)
    weights = torch.exp(scores - row_max)
    total = weights.sum(dim=-1, keepdim=True)
    probs = torch.where(total == 0, torch.zeros_like(weights), weights / total.clamp_min(1e-300))
    # A NaN in a value reaches the rows that see its key (a row never reads a key it does not see;
    # probs @ v alone would spread it to every row through 0 · NaN).
    bad_v = torch.isnan(v64)
    if not bad_v.any():
        return probs @ v64
    seen = torch.ones(probs.shape[-2:], dtype=torch.float64) if visible is None else visible.double()
    reached = (seen @ bad_v.double()) > 0                       # [B, Hq, Nq, Dv]
    out = probs @ torch.where(bad_v, torch.zeros_like(v64), v64)
    return torch.where(reached, torch.full_like(out, math.nan), out)


def lse_ref(q, k, *, causal: bool = False, sm_scale: float | None = None):
    """float64 log Σ_j exp(scale · q_i·k_j) over the keys row i sees (-inf for a row that sees none), on the
    CPU: the log-sum-exp every forward kernel saves for its backward. Shapes and masking as
    ``attention_ref``; returns [B, Hq, Nq]."""
    import torch

    q64, k64 = q.detach().to("cpu", torch.float64), k.detach().to("cpu", torch.float64)
    k64 = k64.repeat_interleave(q64.shape[1] // k64.shape[1], dim=1)
    scale = 1.0 / math.sqrt(q64.shape[-1]) if sm_scale is None else sm_scale
    scores = q64 @ k64.transpose(-1, -2) * scale
    if causal:
        visible = torch.from_numpy(causal_mask_np(q64.shape[2], k64.shape[2]))
        scores = scores.masked_fill(~visible, -math.inf)
    return torch.logsumexp(scores, dim=-1)
