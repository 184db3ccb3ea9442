"""The forward's launch: one rung of the ladder on checked inputs, the warp-specialised Gluon kernel where
``dispatch`` picks it, else the Triton kernel ``_attn_fwd`` through ``plans.launch``.

Internal API for tests and scripts: ``forward`` (a rung by name), ``forward_rung`` (a ``Rung``, optionally
with one fixed launch configuration), ``warp_specialized_forward`` (the Gluon forward where it runs, else
None).
"""
from __future__ import annotations

import torch

from ...device import to_kernel_device
from . import dispatch, layout, plans
from . import triton_kernels as kernels
from .dispatch import VARIANTS, BlockConfig, Rung


def warp_specialized_forward(q, k, v, causal: bool, sm_scale: float):
    """(o, lse) of the warp-specialised Gluon kernel where ``dispatch.gluon_forward_plan`` picks it and it can
    run these inputs; None otherwise (and where its kernel fails with this Triton: ``dispatch.run_gluon``)."""
    hopper, config = dispatch.gluon_forward_plan(q, k, v, causal)
    if hopper is None:
        return None
    return dispatch.run_gluon(hopper, lambda: hopper.launch(q, k, v, causal, sm_scale, *config,
                                                            head_group=dispatch.HEAD_GROUP[causal]))


def forward(q, k, v, causal: bool, sm_scale: float, variant: str, window=(-1, -1), softcap=None, varlen=None):
    """o [B, Hq, Nq, Dv] (q's dtype), lse [B, Hq, Nq] fp32 of the rung ``variant``. Inputs already checked."""
    return forward_rung(q, k, v, causal, sm_scale, VARIANTS[variant], window=window, softcap=softcap,
                         varlen=varlen)


def forward_rung(q, k, v, causal: bool, sm_scale: float, rung: Rung, config: BlockConfig | None = None, *,
                  window=(-1, -1), softcap=None, varlen=None):
    """The forward of one rung (and, optionally, with one fixed launch configuration). ``varlen``:
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) for packed [total, H, D] inputs; o is then
    [total_q, Hq, Dv] and lse [Hq, total_q]."""
    where, out_dtype = q.device, q.dtype
    packed = varlen is not None
    if rung.warp_specialized and config is None and not packed and tuple(window) == (-1, -1) and softcap is None:
        result = warp_specialized_forward(q, k, v, causal, sm_scale)
        if result is not None:
            return result
    cu_q, cu_k = varlen[:2] if packed else (None, None)
    q, k, v, cu_q, cu_k = to_kernel_device(q, k, v, cu_q, cu_k)
    q, k, v = layout.compute_dtype_inputs(q, k, v)
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    o = layout.new_buffer((*q.shape[:-1], head_dim_v), q.dtype, q.device)
    q4, k4, v4, o4 = (layout.heads_view(t, packed) for t in (q, k, v, o))
    batch, n_heads, n_q = q4.shape[:3]
    n_heads_kv, n_k = k4.shape[1], k4.shape[2]
    if packed:
        batch, n_q, n_k = cu_q.numel() - 1, varlen[2], varlen[3]
        lse = layout.new_buffer((n_heads, q.shape[0]), torch.float32, q.device)
    else:
        lse = layout.new_buffer((batch, n_heads, n_q), torch.float32, q.device)
    plain = not packed and head_dim == head_dim_v == dispatch.padded(head_dim)
    rung = dispatch.effective_rung(rung, causal, q4, k4, v4, o4, plain=plain)
    tensors = (q4, k4, v4, o4)
    if rung.desc == kernels.HOST_DESCRIPTORS:
        tensors = layout.host_descriptors(*tensors)
    elif rung.desc == kernels.DEVICE_DESCRIPTORS:
        layout.ensure_allocator()
    left, right, band = layout.band(causal, window)
    qk_scale, cap_scale = layout.logit_scales(sm_scale, softcap, rung.use_exp2)
    fixed = config if config is not None or rung.tuned else dispatch.untuned_forward_config(
        max(head_dim, head_dim_v))
    longest_first = rung.longest_first and dispatch.right_bounded(causal, window)
    plans.launch("fwd_desc" if rung.desc else "fwd", q.device, rung.tuned and config is None, fixed,
                 n_q, (n_heads, batch), *tensors, lse, cu_q, cu_k, qk_scale, cap_scale, left, right,
            *(st for t in (q4, k4, v4, o4) for st in layout.strides(t, packed)), *layout.row_strides(lse, packed),
            batch, n_heads, n_heads // n_heads_kv, n_q, n_k, HEAD_DIM=dispatch.padded(head_dim), CAUSAL=causal,
            USE_EXP2=rung.use_exp2, SPLIT=rung.split, DESC=rung.desc, DOT_PRECISION=layout.dot_precision(q.dtype),
            HEAD_DIM_V=dispatch.padded(head_dim_v), DIM_QK=head_dim, DIM_V=head_dim_v, BAND=band,
            SOFTCAP=softcap is not None, VARLEN=packed, LONGEST_FIRST=longest_first)
    return o.to(where, out_dtype), lse.to(where)


