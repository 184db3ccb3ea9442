"""The backward's launch: the shared pre-pass (δ = rowsum(dO ∘ O)), then the kernels of one backward design
(``dispatch.BACKWARDS``): the Triton two-kernel and one-pass designs, and the Gluon ones where
``dispatch`` says they run (the two-kernel design elsewhere, and wherever a Gluon kernel fails with this
Triton).

Internal API for tests and scripts: ``backward`` (dq, dk, dv of checked inputs by one design, optionally
with fixed configurations or descriptors forced on or off), ``DESIGNS`` (design name -> the function that
runs it), ``BackwardLaunch`` (what each design launches with).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...device import on_device, to_kernel_device
from . import dispatch, layout, plans
from . import triton_kernels as kernels
from .dispatch import DEFAULT_BACKWARD
from .runners import RUNNERS


@dataclass(frozen=True)
class BackwardLaunch:
    """What every backward design launches with: [B, H, N, D] views (packed ones as [1, H, total, D]),
    the kernels' shared scalar arguments and constexprs. Built by ``_backward``."""

    device: torch.device
    q4: torch.Tensor            # [B, Hq, Nq, D]
    k4: torch.Tensor            # [B, Hkv, Nk, D]
    v4: torch.Tensor            # [B, Hkv, Nk, Dv]
    do4: torch.Tensor           # [B, Hq, Nq, Dv]
    dq: torch.Tensor            # q's shape and dtype (the output buffer, written by every design)
    dk4: torch.Tensor
    dv4: torch.Tensor
    lse: torch.Tensor           # [B, Hq, Nq] fp32 (packed: [Hq, total])
    delta: torch.Tensor         # laid out as lse: Σ_d dO · O per row
    packed: bool
    sizes: tuple                # (batch, n_heads, n_heads_kv, n_q, n_k); packed: the longest n_q, n_k
    scalars: tuple              # (cu_q, cu_k, sm_scale, qk_scale, cap_scale, left, right)
    constexprs: dict
    configs: dict               # launcher name -> BlockConfig to use instead of the autotuner / default

    def strides(self, *tensors) -> tuple:
        return tuple(st for t in tensors for st in layout.strides(t, self.packed))

    def tiles(self, *tensors) -> tuple:
        """The arguments for tensors the kernels move in tiles: host-built descriptors with DESC = 2."""
        return layout.host_descriptors(*tensors) if self.constexprs["DESC"] == kernels.HOST_DESCRIPTORS else tensors

    def launch(self, name: str, grid_rows: int, grid_heads: tuple, *args, **options) -> None:
        fixed = self.configs.get(name)
        plans.launch(name, self.device, fixed is None, fixed, grid_rows, grid_heads, *args, **options,
                     **self.constexprs)


def two_kernels(plan: BackwardLaunch) -> None:
    """dK, dV by programs that own key blocks (``_bwd_dkdv``), then dQ by programs that own query
    blocks (``_bwd_dq``): no two programs write the same element, at the price of recomputing the
    scores and dP in both kernels (seven matrix products per pair of blocks)."""
    tiles = plan.tiles(plan.q4, plan.k4, plan.v4, plan.do4)   # one set of descriptors serves both launches
    launch_dkdv(plan, tiles)
    launch_dq(plan, tiles)


def launch_dkdv(plan: BackwardLaunch, tiles: tuple) -> None:
    """The Triton dK/dV kernel of the two-kernel design; ``tiles``: q, k, v, do as ``plan.tiles`` gives them."""
    batch, n_heads, n_heads_kv, n_q, n_k = plan.sizes
    no_dq_acc = plan.dk4                               # DQ_ACC: not touched without ATOMIC_DQ
    plan.launch("bwd_dkdv", n_k, (n_heads_kv, batch), *tiles, plan.lse, plan.delta,
                *plan.tiles(plan.dk4, plan.dv4), no_dq_acc,
                *plan.scalars, *plan.strides(plan.q4, plan.k4, plan.v4, plan.do4, plan.dk4, plan.dv4), 0, 0, 0, 0,
                *layout.row_strides(plan.lse, plan.packed),
                n_heads // n_heads_kv, n_q, n_k, rows_block="BLOCK_N", ATOMIC_DQ=False)


def launch_dq(plan: BackwardLaunch, tiles: tuple) -> None:
    """The Triton dQ kernel of the two-kernel design; ``tiles`` as for ``launch_dkdv``."""
    batch, n_heads, n_heads_kv, n_q, n_k = plan.sizes
    dq4 = layout.heads_view(plan.dq, plan.packed)
    plan.launch("bwd_dq", n_q, (n_heads, batch), *tiles, plan.lse, plan.delta, *plan.tiles(dq4),
                *plan.scalars, *plan.strides(plan.q4, plan.k4, plan.v4, plan.do4, dq4),
                *layout.row_strides(plan.lse, plan.packed), n_heads // n_heads_kv, n_q, n_k)


def atomic_dq(plan: BackwardLaunch) -> None:
    """One pass over key blocks (``_bwd_dkdv`` with ATOMIC_DQ): dK, dV stored as in the two-kernel design,
    dQ added with fp32 atomic adds into a zeroed fp32 buffer of q's shape, then converted to the inputs'
    dtype (five matrix products per pair of blocks; two extra passes over an fp32 copy of dQ: the zeroing
    and the conversion)."""
    batch, n_heads, n_heads_kv, n_q, n_k = plan.sizes
    dq_acc = torch.zeros(plan.dq.shape, dtype=torch.float32, device=plan.device)   # q's shape, fp32
    acc4 = layout.heads_view(dq_acc, plan.packed)
    inputs = (plan.q4, plan.k4, plan.v4, plan.do4)
    plan.launch("bwd_atomic", n_k, (n_heads_kv, batch), *plan.tiles(*inputs), plan.lse, plan.delta,
                *plan.tiles(plan.dk4, plan.dv4), acc4,
                *plan.scalars, *plan.strides(*inputs, plan.dk4, plan.dv4, acc4),
                *layout.row_strides(plan.lse, plan.packed),
                n_heads // n_heads_kv, n_q, n_k, rows_block="BLOCK_N", ATOMIC_DQ=True)
    plan.dq.copy_(dq_acc)


def gluon_backward(plan: BackwardLaunch):
    """The Gluon backward's module where ``dispatch.gluon_backward_module`` says it runs this plan, else None."""
    c = plan.constexprs
    left, right = plan.scalars[5:7]
    windowed = left != layout.UNBOUNDED or (right != layout.UNBOUNDED and not c["CAUSAL"])
    return dispatch.gluon_backward_module(plan.q4, plan.k4, plan.v4, plan.do4, c["CAUSAL"], windowed, c["SOFTCAP"],
                                          plan.packed)


def gluon_dkdv(gluon, plan: BackwardLaunch, dq_acc: torch.Tensor | None = None) -> bool:
    """dK, dV into the plan's buffers by the Gluon kernel; with ``dq_acc`` (zeroed fp32 of q's shape) dQ too.
    False (nothing written) when the kernel failed with this Triton (``dispatch.run_gluon``)."""
    def launch():
        gluon.dkdv(plan.q4, plan.k4, plan.v4, plan.do4, plan.lse, plan.delta, plan.constexprs["CAUSAL"],
                   plan.scalars[2], config=dispatch.gluon_backward_config(plan.q4.shape[-1]),
                   dq_writer=dispatch.GLUON_DQ_WRITER, descending=dispatch.GLUON_DESCENDING, dk=plan.dk4, dv=plan.dv4,
                   dq_acc=dq_acc)
        return True
    return bool(dispatch.run_gluon(gluon, launch))


def warp_specialized(plan: BackwardLaunch) -> None:
    """The two-kernel design with its dK/dV kernel warp-specialised in Gluon where
    ``warp_specialized_backward_choice`` picks it and it can run (else the Triton one), then the Triton
    dQ kernel."""
    tiles = plan.tiles(plan.q4, plan.k4, plan.v4, plan.do4)
    _, _, _, n_q, n_k = plan.sizes
    chosen = dispatch.warp_specialized_backward_choice(plan.q4.shape[-1], n_q, n_k)
    gluon = gluon_backward(plan) if chosen else None
    if not (gluon and gluon_dkdv(gluon, plan)):
        launch_dkdv(plan, tiles)
    launch_dq(plan, tiles)


def warp_specialized_atomic(plan: BackwardLaunch) -> None:
    """One warp-specialised Gluon pass (dK, dV stored, dQ added atomically into a zeroed fp32 buffer, then
    converted) where it can run; the two-kernel design elsewhere."""
    gluon = gluon_backward(plan)
    dq_acc = None if gluon is None else torch.zeros(plan.dq.shape, dtype=torch.float32, device=plan.device)
    if dq_acc is None or not gluon_dkdv(gluon, plan, dq_acc):
        two_kernels(plan)
        return
    plan.dq.copy_(dq_acc)


def backward(do, q, k, v, o, lse, causal: bool, sm_scale: float, window=(-1, -1), softcap=None, varlen=None,
             design: str = DEFAULT_BACKWARD, configs: dict | None = None, desc: bool | None = None):
    """dq, dk, dv in the inputs' dtypes and shapes, by the backward ``design`` (a key of ``DESIGNS``).
    Inputs already checked; dO laid out as ``dispatch.backward_do`` says. ``configs``: launcher name ->
    BlockConfig, fixed instead of autotuned. ``desc``: tiles through tensor descriptors where possible
    (None: the design's ``descriptors``)."""
    import triton

    where, out_dtype = q.device, q.dtype
    packed = varlen is not None
    cu_q, cu_k = varlen[:2] if packed else (None, None)
    do, q, k, v, o, lse, cu_q, cu_k = to_kernel_device(do, q, k, v, o, lse, cu_q, cu_k)
    do, q, k, v, o = layout.compute_dtype_inputs(dispatch.backward_do(do), q, k, v, o)
    device = q.device
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    lse = lse.contiguous()
    delta = layout.new_buffer(lse.shape, torch.float32, device)     # Σ_d do · o: the softmax's row term
    dq, dk, dv = (layout.new_buffer(t.shape, q.dtype, device) for t in (q, k, v))
    q4, k4, v4, o4, do4, dk4, dv4 = (layout.heads_view(t, packed) for t in (q, k, v, o, do, dk, dv))
    batch, n_heads, n_q = q4.shape[:3]
    n_heads_kv, n_k = k4.shape[1], k4.shape[2]
    if packed:
        batch, n_q, n_k = cu_q.numel() - 1, varlen[2], varlen[3]
    block_m = dispatch.preprocess_rows()
    dims = dict(HEAD_DIM_V=dispatch.padded(head_dim_v), DIM_V=head_dim_v, VARLEN=packed)
    with on_device(device):     # through Triton's JIT once per key, then the compiled kernel's runner
        RUNNERS.launch(kernels._bwd_preprocess, (triton.cdiv(n_q, block_m), n_heads, batch),
                       (o4, do4, delta, cu_q, *layout.strides(o4, packed), *layout.strides(do4, packed),
                        *layout.row_strides(lse, packed), n_q), dict(BLOCK_M=block_m, **dims), device)
    left, right, band = layout.band(causal, window)
    qk_scale, cap_scale = layout.logit_scales(sm_scale, softcap, True)
    desc = dispatch.backward_descriptors(desc, design, packed, q4, k4, v4, do4, layout.heads_view(dq, packed), dk4,
                                         dv4)
    plan = BackwardLaunch(
        device, q4, k4, v4, do4, dq, dk4, dv4, lse, delta, packed, (batch, n_heads, n_heads_kv, n_q, n_k),
        (cu_q, cu_k, sm_scale, qk_scale, cap_scale, left, right),
        dict(HEAD_DIM=dispatch.padded(head_dim), CAUSAL=causal, DOT_PRECISION=layout.dot_precision(q.dtype),
             DIM_QK=head_dim, BAND=band, SOFTCAP=softcap is not None, DESC=desc, **dims), dict(configs or {}))
    DESIGNS[design](plan)
    return tuple(t.to(where, out_dtype) for t in (dq, dk, dv))



# design name (a key of ``dispatch.BACKWARDS``) -> the function that runs it, after the shared pre-pass
DESIGNS = {"two_kernels": two_kernels, "atomic_dq": atomic_dq, "warp_specialized": warp_specialized,
           "warp_specialized_atomic": warp_specialized_atomic}
