"""FlashAttention in Triton, forward and backward, for [B, H, N, D] tensors.

Public functions
- ``flash_attention(q, k, v, *, causal=False, sm_scale=None, window=(-1, -1), softcap=None, backward=None) -> o``:
  differentiable attention (a ``torch.autograd.Function``; the backward runs in Triton too).
- ``flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, ...)``:
  the same for packed sequences of different lengths, as ``flash_attn_varlen_func`` takes them.
- ``flash_attention_forward(q, k, v, *, causal=False, sm_scale=None, window=(-1, -1), softcap=None,
  variant="best") -> (o, lse)``:
  the forward kernel alone; ``lse`` [B, Hq, Nq] fp32 is the natural-log log-sum-exp of each row of
  scaled scores (-inf for a row that sees no key), the one number per row the backward needs.
- ``flash_attention_backward(do, q, k, v, o, lse, *, causal=False, sm_scale=None, window=(-1, -1),
  softcap=None, backward=None) -> (dq, dk, dv)``:
  the backward kernels alone (dK, dV summed over the query heads that share a K/V head).
- ``BACKWARDS``: the backward designs, name -> ``BackwardDesign``: "two_kernels" (dK/dV, then dQ; seven
  matrix products per pair of tiles, no atomics), "atomic_dq" (one pass, five products, dQ by fp32
  atomic adds), and their warp-specialised Gluon versions on the H100, "warp_specialized" and
  "warp_specialized_atomic" (the default: one pass, dQ added by TMA's bulk reductions; both "two_kernels"
  wherever their kernel cannot run). ``backward=`` picks one; None means $ATTNKIT_FLASH_BACKWARD, else
  ``DEFAULT_BACKWARD``, or ``DETERMINISTIC_BACKWARD`` under ``torch.use_deterministic_algorithms(True)``.
- ``LADDER``: the forward's performance ladder, rung name -> what it adds; each rung is a
  ``variant=`` of ``flash_attention_forward``. ``check_inputs(q, k, v)`` raises the ValueErrors.

Shapes: q [B, Hq, Nq, D]; k [B, Hkv, Nk, D]; v [B, Hkv, Nk, Dv] with Hq % Hkv == 0 (query head h
reads K/V head h // (Hq // Hkv): multi-head, grouped-query and multi-query attention without copying
K or V); any Nq, Nk >= 1; any D and Dv from 8 to 256 (the kernels pad a tile's head dim to a power of
two in registers, with masked loads and stores); the output has v's head dim Dv. fp16, bf16 or fp32,
all three the same. Any strides (``cu_seqlens`` of packed sequences excepted: contiguous). Causal
attention with Nq != Nk is aligned to the end: query i sees key j when j <= i + Nk - Nq (as
FlashAttention-2; PyTorch SDPA's ``is_causal`` is aligned to the start: docs/semantics.md); a row that
sees no key gives 0. ``sm_scale`` defaults to 1/sqrt(D). The gradients are not differentiable again: a
second derivative raises RuntimeError.

Masks and logits: ``window=(left, right)`` is a sliding window: query i sees keys j with
i + Nk - Nq - left <= j <= i + Nk - Nq + right (-1: that side unbounded; with ``causal`` right is 0);
key blocks wholly outside it are skipped, not masked, so the work is O(N · window).
``softcap`` replaces each logit s = sm_scale · q·k by softcap · tanh(s / softcap) before the softmax.

Where it runs: as every kernel of the course, by ``attnkit.device.kernel_device``: CUDA tensors run
compiled kernels (block sizes autotuned); on a machine without a GPU, CPU tensors run the same kernels
in Triton's interpreter (one small fixed block size); CPU tensors on a machine with a GPU are
computed on the GPU and copied back. The interpreter's bf16 arithmetic is not faithful, and Triton
cannot compile bf16 below sm_80, so there bf16 is computed in fp32 and rounded. On an sm_90 GPU (H100,
H200) the forward ("best") and the default backward run warp-specialised Gluon kernels where they were
measured faster (``hopper``, ``hopper_backward``, where ``dispatch`` says); Gluon's API moves between
Triton versions, so where one of them fails to build, one RuntimeWarning says so and the Triton kernels run
instead (``GLUON_FAILED``).

The sub-package, from the top down: this module is the public face (the entry points above, autograd,
packed sequences, input checks); ``dispatch`` holds every rule that picks a kernel, backward design and
configuration (the head-dim table ``HEAD_DIMS`` among them); ``forward`` and ``backward`` launch what it
picks, through ``plans`` (autotuning and the launch-plan cache) and ``layout`` (how tensors reach the
kernels); ``triton_kernels`` holds the Triton kernels, ``hopper`` and ``hopper_backward`` the Gluon ones,
``fp8`` the FP8 forward, ``runners`` the launches that skip Triton's JIT. No module imports one above it.
The options shared with the paged kernels are checked in ``attnkit.kernels.input_checks``.
"""
from __future__ import annotations

import torch

from ... import validation
from ..input_checks import check_cu_seqlens, check_softcap, check_window
from . import backward as _backward_launch
from . import dispatch, forward, layout
from .dispatch import (
    BACKWARD_ENV,
    BACKWARDS,
    BEST,
    BEST_TRITON,
    DEFAULT_BACKWARD,
    DETERMINISTIC_BACKWARD,
    GLUON_FAILED,
    HEAD_DIMS,
    LADDER,
    LAUNCHERS,
    MAX_HEAD_DIM,
    MIN_HEAD_DIM,
    SUPPORTED_HEAD_DIMS,
    TRITON_BACKWARDS,
    VARIANTS,
    BackwardDesign,
    BlockConfig,
    Rung,
    check_backward,
    default_config,
    descriptors_supported,
    effective_rung,
    host_descriptor_choice,
    right_bounded,
    warp_specialized_backward_choice,
    warp_specialized_choice,
)
from .layout import UNBOUNDED
from .runners import keep_recent

SUPPORTED_DTYPES = validation.FLOAT_DTYPES


# ------------------------------------------------------------------------------------ input checks
# What check_inputs looks at (each tensor's type, shape, dtype and device) for the last inputs that passed
# it: a model calls attention with the same shapes again and again (docs/flash_notes.md, "Rule: input checks
# remembered").
PASSED_CHECKS: dict = {}
PASSED_KEPT = 256


def _checked_metadata(t):
    return (type(t), t.shape, t.dtype, t.device) if isinstance(t, torch.Tensor) else None


def check_inputs(q, k, v, *, packed: bool = False) -> None:
    """Raise ValueError, naming the argument and the rule, unless q, k, v are valid attention inputs
    ([B, H, N, D], or with ``packed`` [total, H, D] as ``flash_attention_varlen`` takes them). The rules
    depend on the tensors' types, shapes, dtypes and devices alone, so inputs like ones that passed
    before pass at once."""
    key = (packed, _checked_metadata(q), _checked_metadata(k), _checked_metadata(v))
    if key in PASSED_CHECKS:
        return
    check_inputs_uncached(q, k, v, packed)
    keep_recent(PASSED_CHECKS, key, True, PASSED_KEPT)


def check_inputs_uncached(q, k, v, packed: bool) -> None:
    """``check_inputs`` without its memory of inputs that passed."""
    dims, layout = (3, "[total, H, D]") if packed else (4, "[B, H, N, D]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, dims, layout, SUPPORTED_DTYPES)
    validation.same("dtype", q=q, k=k, v=v)
    validation.same("device", q=q, k=k, v=v)
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k, v: must have the same shape but for the head dim, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if not packed and q.shape[0] != k.shape[0]:
        raise ValueError(f"q, k: batch sizes differ ({q.shape[0]} vs {k.shape[0]})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k: head dims differ ({q.shape[-1]} vs {k.shape[-1]})")
    validation.head_groups("q, k", q.shape[1], k.shape[1])
    validation.grid_axis("q", "heads H", q.shape[-2 if packed else 1])
    if not packed:
        validation.grid_axis("q", "batch B", q.shape[0])
    for name, t in (("q", q), ("v", v)):
        if not MIN_HEAD_DIM <= t.shape[-1] <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: head dim D={t.shape[-1]} is not supported; D must be between "
                             f"{MIN_HEAD_DIM} and {MAX_HEAD_DIM}")
    validation.kernel_device("q", q)


def check_options(q, causal, sm_scale, window, softcap):
    """The checked keyword options of every public function."""
    return (validation.flag("causal", causal), validation.softmax_scale(sm_scale, q.shape[-1]),
            check_window(window), check_softcap(softcap))


# ------------------------------------------------------------------------------- forward and backward
def flash_attention_forward(q, k, v, *, causal: bool = False, sm_scale: float | None = None,
                            window=(-1, -1), softcap: float | None = None, variant: str = "best"):
    """The forward kernel: returns (o, lse).

    o: [B, Hq, Nq, Dv] in q's dtype; lse: [B, Hq, Nq] fp32, log Σ_j exp(logit_ij) over the keys row i
    sees (-inf for a row that sees none). ``variant`` picks a rung of ``LADDER``
    ("best" is ``BEST``, the fastest rung verified on the H100: the warp-specialised Gluon kernel where
    ``warp_specialized_choice`` picks it and it runs the inputs, else the Triton kernel's rung below it;
    on a device or Triton without its features that rung runs with pointer loads, as "autotuned").
    """
    check_inputs(q, k, v)
    causal, sm_scale, window, softcap = check_options(q, causal, sm_scale, window, softcap)
    if variant == "best":
        variant = BEST
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected 'best' or one of {list(VARIANTS)}, got {variant!r}")
    with torch.no_grad():
        return forward.forward(q, k, v, causal, sm_scale, variant, window, softcap)


def flash_attention_backward(do, q, k, v, o, lse, *, causal: bool = False, sm_scale: float | None = None,
                             window=(-1, -1), softcap: float | None = None, backward: str | None = None):
    """The backward kernels: given dO = ∂L/∂o, returns (dq, dk, dv) = (∂L/∂q, ∂L/∂k, ∂L/∂v).

    o and lse come from ``flash_attention_forward`` with the same causal, sm_scale, window and softcap.
    dk and dv have k's and v's shapes: each K/V head's gradient is summed over the query heads that read it.
    ``backward`` names the design (a key of ``BACKWARDS``; None: $ATTNKIT_FLASH_BACKWARD or ``DEFAULT_BACKWARD``).
    """
    check_inputs(q, k, v)
    causal, sm_scale, window, softcap = check_options(q, causal, sm_scale, window, softcap)
    design = check_backward(backward)
    o_shape = (*q.shape[:-1], v.shape[-1])
    for name, t in (("do", do), ("o", o)):
        if not isinstance(t, torch.Tensor) or t.shape != o_shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name}: must be a tensor of shape {o_shape} (q's, with v's head dim), q's dtype "
                             "and device")
    expected = (q.shape[0], q.shape[1], q.shape[2])
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != expected or lse.dtype != torch.float32:
        raise ValueError(f"lse: must be a float32 tensor of shape {expected} (from flash_attention_forward)")
    if lse.device != q.device:
        raise ValueError("lse: must be on q's device")
    with torch.no_grad():
        return _backward_launch.backward(do, q, k, v, o, lse, causal, sm_scale, window, softcap, design=design)


# ------------------------------------------------------------------------------------------ autograd
class FlashAttentionFunction(torch.autograd.Function):
    """Forward saves (q, k, v, o, lse); backward recomputes the probabilities tile by tile. Where
    ``dispatch.pad_width`` says so, both run on q, k, v zero-padded to a listed head dim (saved padded)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, window=(-1, -1), softcap=None, varlen=None, design=DEFAULT_BACKWARD):
        width = dispatch.pad_width(q, v, packed=varlen is not None)
        head_dim, inputs = q.shape[-1], (q, k, v)
        q, k, v = layout.pad_head_dims(width, *inputs)
        o, lse = forward.forward(q, k, v, causal, sm_scale, BEST, window, softcap, varlen)
        ctx.save_for_backward(q, k, v, o, lse, *(inputs if width else ()))
        ctx.options = (causal, sm_scale, window, softcap, varlen, design)
        ctx.unpadded = head_dim if width else None
        return layout.unpad_head_dim(o, head_dim, width)

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, *inputs = ctx.saved_tensors
        with torch.no_grad():
            do_run = layout.pad_head_dim(do, o.shape[-1]) if ctx.unpadded else do
            dq, dk, dv = _backward_launch.backward(do_run, q, k, v, o, lse, *ctx.options)
            if ctx.unpadded:
                dq, dk, dv = (t[..., :ctx.unpadded] for t in (dq, dk, dv))
        if torch.is_grad_enabled():       # create_graph=True: the gradients may be differentiated again
            dq, dk, dv = _NoSecondDerivative.apply(dq, dk, dv, *(inputs or (q, k, v)), do)
        return dq, dk, dv, None, None, None, None, None, None


class _NoSecondDerivative(torch.autograd.Function):
    """dq, dk, dv unchanged, joined in the graph to q, k, v and dO, so that differentiating them again (a
    gradient penalty) raises instead of silently contributing zero. (torch.autograd.function's
    ``once_differentiable`` alone is not enough: its error node hangs off detached copies, so
    ``torch.autograd.grad(penalty, q)`` never reaches it and returns the penalty's term as 0.)"""

    @staticmethod
    def forward(ctx, dq, dk, dv, *inputs):
        return dq.clone(), dk.clone(), dv.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("flash_attention: second derivatives (differentiating its gradients again, as a "
                           "gradient penalty does) are not implemented: the backward kernels are not "
                           "differentiable")


def flash_attention(q, k, v, *, causal: bool = False, sm_scale: float | None = None, window=(-1, -1),
                    softcap: float | None = None, backward: str | None = None):
    """softmax(logits [+ causal mask, sliding window]) v, differentiable. See the module docstring.
    ``backward`` picks the backward design (a key of ``BACKWARDS``; None: $ATTNKIT_FLASH_BACKWARD or
    ``DEFAULT_BACKWARD``), checked here, before the forward runs."""
    check_inputs(q, k, v)
    causal, sm_scale, window, softcap = check_options(q, causal, sm_scale, window, softcap)
    design = check_backward(backward)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return _forward_no_graph(q, k, v, causal, sm_scale, window, softcap)
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale, window, softcap, None, design)


def _forward_no_graph(q, k, v, causal, sm_scale, window, softcap):
    """o where there is no graph to record (no gradient wanted), padded where ``dispatch.pad_width`` says."""
    width = dispatch.pad_width(q, v, causal_forward_alone=causal)
    o = forward.forward(*layout.pad_head_dims(width, q, k, v), causal, sm_scale, BEST, window, softcap)[0]
    return layout.unpad_head_dim(o, q.shape[-1], width)


# ------------------------------------------------------------------------------- packed sequences
def flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                           causal: bool = False, sm_scale: float | None = None, window=(-1, -1),
                           softcap: float | None = None, backward: str | None = None):
    """Attention over a batch of packed sequences of different lengths, differentiable.

    q [total_q, Hq, D]; k [total_k, Hkv, D]; v [total_k, Hkv, Dv]. Sequence b is rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] of q and cu_seqlens_k[b]:cu_seqlens_k[b + 1] of k and v
    (cu_seqlens: contiguous int32 [B + 1], starting at 0; a sequence may be empty). max_seqlen_q, max_seqlen_k:
    at least the longest sequence. causal and window are aligned to each sequence's end, as in
    ``flash_attention``; no padding is read or computed. Returns o [total_q, Hq, Dv]. ``backward``: as
    in ``flash_attention``.
    """
    check_inputs(q, k, v, packed=True)
    causal, sm_scale, window, softcap = check_options(q, causal, sm_scale, window, softcap)
    design = check_backward(backward)
    longest_q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    longest_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q, cu_seqlens_k: must have the same length B + 1, got "
                         f"{tuple(cu_seqlens_q.shape)} and {tuple(cu_seqlens_k.shape)}")
    for name, value, longest in (("max_seqlen_q", max_seqlen_q, longest_q), ("max_seqlen_k", max_seqlen_k, longest_k)):
        value = validation.positive_int(name, value)
        if value < longest:
            raise ValueError(f"{name}: must be at least the longest sequence ({longest}), got {value}")
    varlen = (cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k))
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale, window, softcap, varlen, design)




# ------------------------------------------------------------------------- the Gluon forward alone
def flash_attention_hopper(q, k, v, *, causal: bool = False, sm_scale: float | None = None):
    """(o, lse) of the warp-specialised Gluon forward (``hopper``) alone: o [B, Hq, Nq, D] in q's dtype, lse
    [B, Hq, Nq] fp32 (natural log), as ``flash_attention_forward`` returns them. ValueError outside its
    scope (``dispatch.hopper_unsupported``); ImportError with a Triton without Gluon's Hopper API."""
    check_inputs(q, k, v)
    causal = validation.flag("causal", causal)
    sm_scale = validation.softmax_scale(sm_scale, q.shape[-1])
    reason, config = dispatch.hopper_plan(q, k, v, causal)
    if reason:
        raise ValueError(reason)
    hopper = dispatch.gluon_module("hopper")
    if hopper is None:
        raise ImportError("flash_attention_hopper: this Triton has no Gluon Hopper API (Triton 3.6 and later)")
    return hopper.launch(q, k, v, causal, sm_scale, *config, head_group=dispatch.HEAD_GROUP[causal])


__all__ = ["flash_attention", "flash_attention_varlen", "flash_attention_forward", "flash_attention_backward",
           "flash_attention_hopper", "FlashAttentionFunction",
           "check_inputs", "check_inputs_uncached", "check_options", "check_window", "check_softcap",
           "check_cu_seqlens",
           "LADDER", "VARIANTS", "BEST", "BEST_TRITON", "Rung", "host_descriptor_choice", "warp_specialized_choice",
           "warp_specialized_backward_choice", "descriptors_supported", "effective_rung", "right_bounded",
           "BACKWARDS", "TRITON_BACKWARDS", "DEFAULT_BACKWARD", "DETERMINISTIC_BACKWARD", "BACKWARD_ENV",
           "BackwardDesign", "check_backward", "GLUON_FAILED",
           "HEAD_DIMS", "LAUNCHERS", "BlockConfig", "default_config",
           "SUPPORTED_HEAD_DIMS", "MIN_HEAD_DIM", "MAX_HEAD_DIM", "SUPPORTED_DTYPES", "UNBOUNDED"]
