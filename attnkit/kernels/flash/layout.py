"""How the forward and backward hand tensors to the Triton kernels: output buffers, the compute dtype,
[B, H, N, D] views of packed sequences and their strides, host-built tensor descriptors, the band of a
causal mask or sliding window, the logits' scales.

Internal API for tests and scripts: every function here (``new_buffer`` is the one every output and
scratch buffer comes from: tests fill these with NaN instead).
"""
from __future__ import annotations

import torch

from ...device import bf16_computed_in_fp32
from . import triton_kernels as kernels

UNBOUNDED = 1 << 30      # a window side without bound, as the kernels take it (any N below 2**29)
LOG2E = kernels.LOG2E.value


def new_buffer(shape, dtype, device) -> torch.Tensor:
    """Every output and scratch buffer the kernels write (tests fill these with NaN instead)."""
    return torch.empty(shape, dtype=dtype, device=device)


def pad_head_dim(t: torch.Tensor, width: int) -> torch.Tensor:
    """t with its last dim zero-padded to ``width`` (a new contiguous tensor; ``dispatch.pad_width``)."""
    return torch.nn.functional.pad(t, (0, width - t.shape[-1]))


def pad_head_dims(width: int | None, *tensors) -> tuple:
    """``tensors`` zero-padded to ``width`` in their last dim, or unchanged where ``width`` is None."""
    return tuple(pad_head_dim(t, width) for t in tensors) if width else tensors


def unpad_head_dim(o: torch.Tensor, head_dim: int, width: int | None) -> torch.Tensor:
    """o's first ``head_dim`` columns as a contiguous tensor where it ran padded (``width``), else o."""
    return o[..., :head_dim].contiguous() if width else o


def dot_precision(dtype) -> str:
    """fp32 inputs get true fp32 products: tf32 (10-bit mantissa) scores err by ~1e-3 after exp."""
    return "ieee" if dtype == torch.float32 else "tf32"


def compute_dtype_inputs(*tensors):
    """bf16 goes through the kernels as fp32 where they cannot take it (the interpreter, whose bf16
    arithmetic is not faithful, and GPUs below sm_80, where Triton cannot compile bf16)."""
    if tensors[0].dtype == torch.bfloat16 and bf16_computed_in_fp32(tensors[0].device):
        return tuple(t.float() for t in tensors)
    return tensors


def host_descriptors(*tensors) -> tuple:
    """Host-built tensor descriptors over whole [B, H, N, D] views; their block shape is set per launch
    (``plans.run_plan``, and ``plans.set_block_shapes`` for the autotuner's trials)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, t.shape[-1]]) for t in tensors)


ALLOCATOR_SET = False


def ensure_allocator() -> None:
    """Device-side tensor descriptors need a little global scratch memory, which Triton asks for
    through the allocator set by ``triton.set_allocator`` (set once, on first use)."""
    global ALLOCATOR_SET
    if not ALLOCATOR_SET:
        def alloc(size: int, alignment: int, stream):
            return torch.empty(size, dtype=torch.int8, device="cuda")

        import triton

        triton.set_allocator(alloc)
        ALLOCATOR_SET = True


def band(causal: bool, window) -> tuple[int, int, bool]:
    """(left, right, BAND) for the kernels: a side without bound is UNBOUNDED; causal is right = 0."""
    left, right = window
    if causal:
        right = 0
    bound = lambda side: UNBOUNDED if side < 0 else min(side, UNBOUNDED)  # noqa: E731  (int32 in the kernels)
    return bound(left), bound(right), causal or left >= 0 or right >= 0


def logit_scales(sm_scale: float, softcap, use_exp2: bool) -> tuple[float, float]:
    """(qk_scale, cap_scale): logits are qk · qk_scale, or tanh(qk · cap_scale) · qk_scale with a softcap."""
    unit = LOG2E if use_exp2 else 1.0
    if softcap is None:
        return sm_scale * unit, 0.0
    return softcap * unit, sm_scale / softcap


def heads_view(t: torch.Tensor, packed: bool) -> torch.Tensor:
    """A packed [total, H, D] tensor as a [1, H, total, D] view (no copy); a [B, H, N, D] one as itself."""
    return t.unsqueeze(0).transpose(1, 2) if packed else t


def strides(t: torch.Tensor, packed: bool) -> tuple:
    """The four strides the kernels take; packed sequences start at cu_seqlens, so the batch stride is 0."""
    return (0, *t.stride()[1:]) if packed else tuple(t.stride())


def row_strides(lse: torch.Tensor, packed: bool) -> tuple[int, int]:
    """(per batch, per head) strides of a contiguous lse: [B, H, N], or [H, total] when packed."""
    return (0, lse.stride(0)) if packed else (lse.stride(0), lse.stride(1))


