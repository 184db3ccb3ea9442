"""How a Triton launcher of ``dispatch.LAUNCHERS`` runs: autotuning, fixed configurations and the plan cache.

A call's first launch of a kind (``plan_key``) decides the configuration (the autotuner on CUDA where
``dispatch.autotuned``; else the head dim's default and, where it needs more shared memory than the
GPU has, ``dispatch.smaller_configs``; one small configuration in the interpreter) and keeps that decision
as a ``LaunchPlan``; later calls of the kind reuse it and go straight to the kernel through
``runners.RUNNERS`` (the host's time per call is part of a short call's).

Internal API for tests and scripts: ``launch`` (one launch by launcher name), ``PLANS`` and ``MAX_PLANS``
(the plan cache), ``tuned_launcher`` and ``TUNED`` (the autotuned launchers), ``set_block_shapes`` (host
descriptors' block shapes).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from ...device import on_device, triton_interprets
from . import dispatch
from . import triton_kernels as kernels
from .dispatch import INTERPRETER_CONFIG, LAUNCHERS, BlockConfig
from .runners import RUNNERS

TUNED = {}


def tuned_launcher(name: str):
    """The autotuned CUDA launcher ``name`` of ``LAUNCHERS`` (built once)."""
    if name not in TUNED:
        import triton

        kernel_name, shapes, _ = LAUNCHERS[name]
        kernel = getattr(kernels, kernel_name)
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=set_block_shapes)
                   for m, n, w, s in shapes]
        key = [a for a in ("n_q", "n_k", "HEAD_DIM", "HEAD_DIM_V", "DIM_QK", "DIM_V", "CAUSAL", "BAND", "SOFTCAP",
                           "VARLEN", "DESC", "LONGEST_FIRST") if a in kernel.arg_names]
        options = dict(configs=configs, key=key)
        if name == "bwd_atomic":   # atomic adds: every trial must start from a zeroed dQ buffer
            options["reset_to_zero"] = ["DQ_ACC"]
        if "do_bench" in inspect.signature(triton.autotune).parameters:   # shorter trials than the default
            options["do_bench"] = _quick_bench
        TUNED[name] = triton.autotune(**options)(kernel)
    return TUNED[name]


# each kernel argument a host-built descriptor may stand for: (its rows' block size, its head dim)
_DESCRIPTOR_BLOCKS = {"Q": ("BLOCK_M", "HEAD_DIM"), "O": ("BLOCK_M", "HEAD_DIM_V"), "DO": ("BLOCK_M", "HEAD_DIM_V"),
                      "DQ": ("BLOCK_M", "HEAD_DIM"), "K": ("BLOCK_N", "HEAD_DIM"), "V": ("BLOCK_N", "HEAD_DIM_V"),
                      "DK": ("BLOCK_N", "HEAD_DIM"), "DV": ("BLOCK_N", "HEAD_DIM_V")}


def set_block_shapes(nargs) -> None:
    """Host-built descriptors carry their block shape: set it for the launch's BLOCK_M and BLOCK_N
    (the autotuner's pre-hook, and before a launch with one fixed configuration)."""
    if nargs.get("DESC") != kernels.HOST_DESCRIPTORS:
        return
    for name, (rows, dim) in _DESCRIPTOR_BLOCKS.items():
        if hasattr(nargs.get(name), "block_shape"):
            nargs[name].block_shape = [1, 1, nargs[rows], nargs[dim]]


def _quick_bench(kernel_call, quantiles):
    """The autotuner's timing of one candidate: 5 ms of warm-up, 25 ms of repeats."""
    import triton

    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


@dataclass(frozen=True)
class LaunchPlan:
    """How a launcher runs for one kind of call (``plan_key``): what ``launch`` decided on the first
    call of that kind, so that later calls only fill in the tensors."""

    kernel: object            # the @triton.jit kernel (never the autotuner: its choice is in meta)
    meta: dict                # BLOCK_M, BLOCK_N and the compiler options (num_warps, num_stages, ...)
    rows: int                 # rows per program: the grid is (cdiv(grid_rows, rows), *grid_heads)
    descriptor_blocks: tuple  # (argument index, block shape) of each host-built descriptor


PLANS = {}   # plan_key(...) -> LaunchPlan
MAX_PLANS = 4096   # kinds of call remembered (a server sees many lengths); beyond, the plans start over


def plan_key(name, tuned, fixed, rows_block, args, constexprs) -> tuple:
    """What decides a launch's plan: the launcher, how its configuration is chosen, the tiled inputs'
    dtype, every argument's integer value (sizes and strides: the autotuner's key is among them), dtype
    or type (None, float; float values are left out: no choice depends on them), the constexprs."""
    kinds = tuple(a if type(a) is int else getattr(a, "dtype", None) or type(a) for a in args)
    return name, tuned, fixed, rows_block, getattr(args[0], "base", args[0]).dtype, kinds, tuple(constexprs.items())


def _descriptor_blocks(kernel, args, constexprs, meta) -> tuple:
    """(index, [1, 1, rows, D]) for each argument that is a host-built descriptor (DESC = 2)."""
    if constexprs.get("DESC") != kernels.HOST_DESCRIPTORS:
        return ()
    sizes = {**constexprs, **meta}
    return tuple((i, [1, 1, sizes[_DESCRIPTOR_BLOCKS[arg][0]], sizes[_DESCRIPTOR_BLOCKS[arg][1]]])
                 for i, arg in enumerate(kernel.arg_names[:len(args)])
                 if arg in _DESCRIPTOR_BLOCKS and hasattr(args[i], "block_shape"))


def run_plan(plan: LaunchPlan, device, grid_rows: int, grid_heads: tuple, args, constexprs) -> None:
    import triton

    for index, block in plan.descriptor_blocks:
        args[index].block_shape = block
    with on_device(device):     # through Triton's JIT once per key, then the compiled kernel's runner (runners.py)
        RUNNERS.launch(plan.kernel, (triton.cdiv(grid_rows, plan.rows), *grid_heads), args,
                       {**constexprs, **plan.meta}, device)


def launch(name: str, device: torch.device, tuned: bool, fixed: BlockConfig | None, grid_rows: int,
           grid_heads: tuple, *args, rows_block: str = "BLOCK_M", **constexprs) -> None:
    """Launch ``LAUNCHERS[name]`` on a grid (cdiv(grid_rows, <rows_block>), heads, sequences), ``grid_heads``
    the last two (each at most 65,535: ``check_inputs`` says so; one axis over B · H would stop there): autotuned
    when ``tuned``, else with ``fixed``, one small one in the interpreter. Without ``fixed``, the
    launcher's default for the head dim, or the first of its ``dispatch.smaller_configs`` that fits in shared
    memory (fp32 starts at 64 x 64 tiles); a ``fixed`` that does not fit raises Triton's OutOfResources.
    The first call of each kind (``plan_key``) decides, autotuning included; later calls of that kind
    reuse its plan and go straight to the kernel (the host's time per call is part of a short call's)."""
    itemsize = getattr(args[0], "base", args[0]).dtype.itemsize
    tuned = tuned and dispatch.autotuned(dispatch.launch_head_dim(constexprs), itemsize) and not triton_interprets()
    key = plan_key(name, tuned, fixed, rows_block, args, constexprs)
    plan = PLANS.get(key)
    if plan is None:
        if len(PLANS) >= MAX_PLANS:
            PLANS.clear()
        PLANS[key] = first_launch(name, device, tuned, fixed, grid_rows, grid_heads, args, rows_block, constexprs)
    else:
        run_plan(plan, device, grid_rows, grid_heads, args, constexprs)


def first_launch(name, device, tuned, fixed, grid_rows, grid_heads, args, rows_block, constexprs) -> LaunchPlan:
    """Launch as ``_launch`` says, choosing the configuration; returns the plan that launched. Where the
    autotuner's candidates all need more shared memory than the GPU has, the default and its fallbacks
    decide, as without autotuning."""
    import triton
    from triton.runtime.errors import OutOfResources

    kernel = getattr(kernels, LAUNCHERS[name][0])
    if tuned:
        grid = lambda meta: (triton.cdiv(grid_rows, meta[rows_block]), *grid_heads)  # noqa: E731
        autotuner = tuned_launcher(name)
        try:
            with on_device(device):
                autotuner[grid](*args, **constexprs)
        except OutOfResources:   # no candidate fits in shared memory (fp32 at D = 256): as without autotuning
            pass
        else:
            meta = {k: v for k, v in autotuner.best_config.all_kwargs().items() if k not in constexprs}
            return LaunchPlan(kernel, meta, meta[rows_block], _descriptor_blocks(kernel, args, constexprs, meta))
    if triton_interprets():
        choices = [INTERPRETER_CONFIG]
    elif fixed is not None:
        choices = [fixed]
    else:
        choices = dispatch.untuned_configs(name, dispatch.launch_head_dim(constexprs),
                                           getattr(args[0], "base", args[0]).dtype.itemsize)
    for config in choices:
        meta = config.meta()
        plan = LaunchPlan(kernel, meta, meta[rows_block], _descriptor_blocks(kernel, args, constexprs, meta))
        try:
            run_plan(plan, device, grid_rows, grid_heads, args, constexprs)
        except OutOfResources:
            if config == choices[-1]:
                raise
            continue
        return plan


