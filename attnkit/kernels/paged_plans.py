"""The paged decode's launch plans: what the first call of a kind decides, kept for every later call of
that kind (``attnkit.kernels.paged``).

A kind of call is everything the shape checks and the launch depend on (``plan_key``: shapes, strides,
dtypes, devices and options). Its first call is checked in full and its launch worked out once
(``make_plan``: splits, block sizes, grid, the kernels' scalar arguments and constexprs) into a ``Plan``,
kept in ``PLANS``, at most ``MAX_PLANS`` of them (the oldest go first); a later call of the kind checks only
the values and launches what its plan says.

Internal API for tests and scripts: ``PLANS`` (the plan cache, ``plan_key(...)`` -> ``Plan``; clear it to
start over) and ``MAX_PLANS``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..device import bf16_computed_in_fp32, ensure_triton_backend, kernel_device, launch_options, triton_interprets
from . import value_checks
from .fp8_cache import FP8
from .paged_dispatch import LaunchConfig, default_config, head_dim_tiles, padded, row_alignment

ensure_triton_backend()

import triton  # noqa: E402

MAX_PLANS = 1024     # kinds of call remembered (a server sees a few per model); beyond, the oldest go
CODE = value_checks.KERNELS.index("paged_decode")
LOG2E = 1.4426950408889634                                       # log2(e): scores in log2 units for exp2


@dataclass(frozen=True)
class Plan:
    """What the first call of a kind decided, for every later call of that kind (``plan_key``)."""

    grid: tuple
    num_splits: int
    out_shape: tuple                 # o: (B, Hq, Dv)
    workspace_shape: tuple           # (B, Hq, S, Dv + 2): z, m, ℓ of each split
    scalars: tuple                   # _paged_kernel's arguments after the pointers, before the strides
    constexprs: tuple                # _paged_kernel's constexprs and options: (without CHECK, with CHECK)
    merge_constexprs: dict
    check_values: object             # "strict", "device" or False
    upcast: bool                     # bf16 computed in fp32 (the interpreter, or a GPU below sm_80)
    num_pages: int
    page_size: int
    direct: bool                     # the inputs go to the kernel as they are (no copy, no conversion)
    input_strides: tuple             # then their strides, in the kernel's order
    state: torch.Tensor | None       # the device's value_checks state (check_values="device")
    runners: dict = field(default_factory=dict, compare=False)   # runners.launch_planned's kept runners


PLANS: dict = {}                     # plan_key(...) -> Plan


def make_plan(q, k_pages, v_pages, block_table, sm_scale: float, num_splits: int, variant: str, window_left: int,
              scaled: bool, check_values, config: LaunchConfig | None = None) -> Plan:
    """The launch of inputs already checked: grid, block sizes, splits and the kernels' scalar arguments."""
    device = kernel_device(q.device)
    batch, n_heads, head_dim = q.shape
    num_pages, page_size, n_kv, dim_v = v_pages.shape
    max_len = block_table.shape[1] * page_size
    upcast = q.dtype == torch.bfloat16 and bf16_computed_in_fp32(device)
    if config is None:
        config = default_config(variant, k_pages.dtype, head_dim, dim_v)
    blocks = -(-max_len // config.block_n)
    tokens_per_split = -(-blocks // num_splits) * config.block_n       # each split: whole blocks of tokens
    grouped = variant == "grouped"
    group = n_heads // n_kv
    constexprs = dict(GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)) if grouped else 1,
                      DIM_QK=head_dim, DIM_V=dim_v, BLOCK_D=head_dim_tiles(head_dim)[0],
                      BLOCK_D2=head_dim_tiles(head_dim)[1], BLOCK_DV=head_dim_tiles(dim_v)[0],
                      BLOCK_DV2=head_dim_tiles(dim_v)[1],
                      PAGE_SIZE=page_size, BLOCK_N=config.block_n, SPLIT=num_splits > 1, GROUPED=grouped,
                      DOT_PRECISION="ieee" if q.dtype == torch.float32 or upcast else "tf32", SCALED=scaled,
                      BLOCK_KV=triton.next_power_of_2(n_kv), CODE=CODE, N_KERNELS=len(value_checks.KERNELS),
                      Q_ALIGN=row_alignment(q), K_ALIGN=row_alignment(k_pages), V_ALIGN=row_alignment(v_pages),
                      **launch_options(num_warps=config.num_warps, num_stages=config.num_stages))
    scalars = (sm_scale * LOG2E, tokens_per_split, num_pages, max_len,
               window_left if window_left >= 0 else max_len, batch, n_kv)
    merge = dict(DIM_V=dim_v, BLOCK_DV=padded(dim_v), BLOCK_S=triton.next_power_of_2(num_splits),
                 **launch_options(num_warps=4))
    direct = device == q.device and not upcast and not (k_pages.dtype == FP8 and triton_interprets())   # fp8_read
    input_strides = (*q.stride(), *k_pages.stride(), *v_pages.stride(), *block_table.stride())
    return Plan(grid=(n_kv if grouped else n_heads, batch, num_splits), num_splits=num_splits,
                out_shape=(batch, n_heads, dim_v), workspace_shape=(batch, n_heads, num_splits, dim_v + 2),
                scalars=scalars, constexprs=({**constexprs, "CHECK": False}, {**constexprs, "CHECK": True}),
                merge_constexprs=merge, check_values=check_values, upcast=upcast, num_pages=num_pages,
                page_size=page_size, direct=direct, input_strides=input_strides,
                state=value_checks.state(device) if check_values == "device" and not value_checks.capturing(q)
                else None)                  # made outside a capture (its first value is a copy to the device)


def _option(value) -> tuple:
    return (type(value), value)


def _layout(t) -> tuple | None:
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def plan_key(q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale, sm_scale, num_splits, variant,
             window, check_values) -> tuple | None:
    """Everything the shape checks and the plan depend on (each option with its type: True is not 1);
    None when an argument is not a tensor or an option cannot be a key (the full checks then decide)."""
    try:
        return (_layout(q), _layout(k_pages), _layout(v_pages), _layout(block_table), _layout(seq_lens),
                _layout(k_scale), _layout(v_scale), _option(sm_scale), _option(num_splits), _option(variant),
                _option(check_values), type(window), tuple(_option(w) for w in window))
    except (AttributeError, TypeError):
        return None
