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
measured faster (``flash_hopper``, ``flash_hopper_backward``); Gluon's API moves between Triton versions,
so where one of them fails to build, one RuntimeWarning says so and the Triton kernels run instead
(``GLUON_FAILED``).
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import numbers
import os
import warnings
from dataclasses import dataclass, replace

import torch

from .. import validation
from ..device import bf16_computed_in_fp32, launch_options, on_device, sm_major, to_kernel_device, triton_interprets
from . import flash_kernels as _kernels
from .runners import RUNNERS, keep_recent

MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
SUPPORTED_HEAD_DIMS = range(MIN_HEAD_DIM, MAX_HEAD_DIM + 1)
UNBOUNDED = 1 << 30      # a window side without bound, as the kernels take it (any N below 2**29)
SUPPORTED_DTYPES = validation.FLOAT_DTYPES
LOG2E = _kernels.LOG2E.value

# The forward's performance ladder: each rung keeps the ones before it and adds one idea.
LADDER = {
    "tiled": "online softmax over key tiles with exp; every tile masked; one fixed block size",
    "exp2": "exp2 with log2(e) folded into the score scale (one MUFU instruction, one multiply less)",
    "split": "key tiles split into unmasked ones and the masked causal diagonal / ragged end",
    "autotuned": "block sizes, warps and pipeline stages autotuned per shape",
    "descriptors": "tiles copied by the TMA engine through tensor descriptors (sm_90+), wider autotune space",
    "host_descriptors": "the descriptors built once per launch on the host and passed as arguments, "
                        "instead of four per program on the device (D = 64 and 128; host_descriptor_choice)",
    "warp_specialized": "on sm_90, where warp_specialized_choice picks it, the warp-specialised Gluon forward "
                        "(attnkit.kernels.flash_hopper: one producer warp, two compute warp groups; persistent "
                        "programs for short calls and non-causal ones at D = 128); host_descriptors elsewhere",
}


@dataclass(frozen=True)
class Rung:
    """One rung: the constexprs of the one forward kernel ``_attn_fwd`` and how its block sizes are chosen."""

    use_exp2: bool = True            # USE_EXP2
    split: bool = True               # SPLIT
    desc: int = _kernels.POINTERS    # DESC: pointers, descriptors built per program, or built on the host
    tuned: bool = True               # autotuned block sizes (else one fixed configuration)
    rule: bool = False               # host_descriptor_choice decides per shape whether to use ``desc``
    longest_first: bool = True       # LONGEST_FIRST where the band is bounded on the right (causal):
                                     # the last query blocks, which read the most keys, start first
    warp_specialized: bool = False   # the Gluon kernel where warp_specialized_choice picks it and it runs


VARIANTS = {
    "tiled": Rung(use_exp2=False, split=False, tuned=False),
    "exp2": Rung(split=False, tuned=False),
    "split": Rung(tuned=False),
    "autotuned": Rung(),
    "descriptors": Rung(desc=_kernels.DEVICE_DESCRIPTORS),
    "host_descriptors": Rung(desc=_kernels.HOST_DESCRIPTORS, rule=True),
    "warp_specialized": Rung(desc=_kernels.HOST_DESCRIPTORS, rule=True, warp_specialized=True),
}
# The rung that "best" means: the fastest one verified on the H100 (docs/flash_notes.md), whose
# full benchmark is recorded in attnkit/bench/results/bench_flash.csv. Where a rung's features are
# missing (CPU interpreter, GPUs below sm_90, Triton without tensor descriptors or Gluon, strides TMA
# cannot take, windows, softcaps, packed sequences) it runs as the rung below it, down to pointer
# loads as "autotuned". BEST_TRITON is the fastest rung of the Triton kernel itself (what "best" runs
# where the Gluon kernel does not; the tools that compile, sweep and profile the Triton kernel use it).
# Variants measured slower on the H100 are kept, with their measurements, in experiments/ (outside the
# package).
BEST = "warp_specialized"
BEST_TRITON = "host_descriptors"


# ------------------------------------------------------------------------------------ input checks
# What check_inputs looks at (each tensor's type, shape, dtype and device) for the last inputs that passed
# it: a short call checked its inputs in about a tenth of its host time (docs/flash_notes.md), and a
# model calls attention with the same shapes again and again.
_PASSED_CHECKS: dict = {}
_PASSED_KEPT = 256


def _checked_metadata(t):
    return (type(t), t.shape, t.dtype, t.device) if isinstance(t, torch.Tensor) else None


def check_inputs(q, k, v, *, packed: bool = False) -> None:
    """Raise ValueError, naming the argument and the rule, unless q, k, v are valid attention inputs
    ([B, H, N, D], or with ``packed`` [total, H, D] as ``flash_attention_varlen`` takes them). The rules
    depend on the tensors' types, shapes, dtypes and devices alone, so inputs like ones that passed
    before pass at once."""
    key = (packed, _checked_metadata(q), _checked_metadata(k), _checked_metadata(v))
    if key in _PASSED_CHECKS:
        return
    _check_inputs(q, k, v, packed)
    keep_recent(_PASSED_CHECKS, key, True, _PASSED_KEPT)


def _check_inputs(q, k, v, packed: bool) -> None:
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


def check_window(window) -> tuple[int, int]:
    """``window`` as (left, right): two integers >= -1, -1 meaning that side is unbounded."""
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or any(isinstance(w, bool) or not isinstance(w, numbers.Integral) for w in window)):
        raise ValueError(f"window: expected (left, right), two integers >= -1 (-1: unbounded), got {window!r}")
    if min(window) < -1:
        raise ValueError(f"window: each side must be >= -1 (-1: unbounded), got {tuple(window)}")
    return int(window[0]), int(window[1])


def check_softcap(softcap) -> float | None:
    """``softcap``: None (off) or a positive finite number."""
    if softcap is None:
        return None
    if (isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not math.isfinite(softcap)
            or softcap <= 0):
        raise ValueError(f"softcap: expected a positive finite number or None (off), got {softcap!r}")
    return float(softcap)


def _options(q, causal, sm_scale, window, softcap):
    """The checked keyword options of every public function."""
    return (validation.flag("causal", causal), validation.softmax_scale(sm_scale, q.shape[-1]),
            check_window(window), check_softcap(softcap))


# ----------------------------------------------------------------------------- kernels and configs
@dataclass(frozen=True)
class BlockConfig:
    """One launch configuration: tile sizes, warps per program, software-pipelining depth."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def meta(self) -> dict:
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n,
                    **launch_options(num_warps=self.num_warps, num_stages=self.num_stages))


INTERPRETER_CONFIG = BlockConfig(16, 16, 1, 1)      # small tiles: ragged sizes span several tiles
# Candidate configurations (BLOCK_M, BLOCK_N, num_warps, num_stages) for the autotuner on CUDA, and the
# configuration each launcher uses without autotuning (ATTNKIT_AUTOTUNE=0), by head dim (the tile's
# padded D: up to 64, up to 128, 256). Few candidates on purpose: each one is compiled per head dim,
# dtype and causal flag; at D = 256 the autotuner tries the D = 256 default alone (twice the shared
# memory per row leaves few configurations that fit). In the backward, dK/dV programs own BLOCK_N keys
# and loop over BLOCK_M queries; dQ programs own BLOCK_M queries.
# The descriptor forward and the three backward launchers hold the four fastest of a sweep of 10-12
# configurations per kernel on the H100 (scripts/gpu_flash_sweep.py, bench_flash_sweep.csv,
# docs/flash_notes.md); the defaults are the sweep's winners (smallest geometric-mean time over its
# cases; the backward's for the tiles its design uses). The forward's old default at D = 128, 128x64
# with 4 warps, was the slowest candidate: 255 registers a thread and 32 spilled, 1.5x the winners' time.
# The pointer forward at D = 64 was not swept. The backward's were swept again on 2026-11-24, after its
# dK/dV kernel became one loop (ptxas had serialised its matrix products; flash_kernels._bwd_dkdv_inner):
# at D = 64 the old dK/dV default, 64x128 with 4 warps, then spilled 1.2 KB a thread and ran at a quarter
# of the winner's speed.
# D = 256 (swept 2026-11-26 among the configurations ptxas compiles without serialising the products,
# ``gpu_flash_sweep.py --head-dim-256``): the forward's 128x64 with 8 warps runs 1.14-1.37x the old
# halved default (64x32, 4 warps); the one pass's 32x32 runs 1.73-1.75x it; the two-kernel design keeps
# 64x32 with 4 warps and pointer tiles (its dK/dV kernel spills about 1 KB a thread with descriptors,
# 24-64 bytes with pointers, dQ too; the backward takes descriptors at D <= 128 only).
# The one-pass backward (_bwd_dkdv with ATOMIC_DQ) also holds a [BLOCK_M, D] fp32 dQ share per query
# block: BLOCK_M = 64 keeps all five products on 64-row wgmma tiles.
# launcher: (kernel, candidate configurations, {padded head dim: the configuration without autotuning})
LAUNCHERS = {
    "fwd": ("_attn_fwd", [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)],
            {64: BlockConfig(128, 64, 4, 3), 128: BlockConfig(128, 128, 8, 3), 256: BlockConfig(128, 64, 8, 2)}),
    "fwd_desc": ("_attn_fwd", [(128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4)],
                 {64: BlockConfig(128, 64, 8, 3), 128: BlockConfig(128, 128, 8, 3),
                  256: BlockConfig(128, 64, 8, 2)}),
    "bwd_dkdv": ("_bwd_dkdv", [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3)],
                 {64: BlockConfig(32, 128, 4, 3), 128: BlockConfig(64, 128, 8, 3),
                  256: BlockConfig(64, 32, 4, 2)}),
    "bwd_dq": ("_bwd_dq", [(64, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)],
               {64: BlockConfig(128, 64, 4, 3), 128: BlockConfig(128, 64, 8, 3), 256: BlockConfig(64, 32, 4, 2)}),
    "bwd_atomic": ("_bwd_dkdv", [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3)],
                   {64: BlockConfig(64, 128, 8, 3), 128: BlockConfig(64, 128, 8, 3),
                    256: BlockConfig(32, 32, 4, 2)}),
}


def default_config(name: str, head_dim: int) -> BlockConfig:
    """The configuration launcher ``name`` uses without autotuning at this padded head dim (the larger
    of q's and v's): its entry for D <= 64, D <= 128 or D = 256."""
    by_head_dim = LAUNCHERS[name][2]
    return by_head_dim[64] if head_dim <= 64 else by_head_dim[128] if head_dim <= 128 else by_head_dim[256]


def _fixed_forward_config(head_dim: int) -> BlockConfig:
    """The untuned ladder rungs' one configuration on a GPU."""
    return BlockConfig(64, 64, 4, 2) if head_dim <= 128 else BlockConfig(64, 32, 4, 2)


def autotune_enabled() -> bool:
    """Autotuning runs on CUDA unless the environment sets ATTNKIT_AUTOTUNE=0 (saves compile time)."""
    return os.environ.get("ATTNKIT_AUTOTUNE", "1") != "0"


def _prune_by_head_dim(name: str, configs, named_args, **kwargs):
    """At D = 256 (twice the shared memory per row) launcher ``name`` tries its D = 256 default alone."""
    import triton

    head_dim = max(kwargs.get(arg, named_args.get(arg)) or 0 for arg in ("HEAD_DIM", "HEAD_DIM_V"))
    if head_dim < 256:
        return configs
    config = default_config(name, head_dim)
    return [triton.Config({"BLOCK_M": config.block_m, "BLOCK_N": config.block_n}, num_warps=config.num_warps,
                          num_stages=config.num_stages, pre_hook=configs[0].pre_hook)]


_TUNED = {}


def _tuned(name: str):
    """The autotuned CUDA launcher ``name`` of ``LAUNCHERS`` (built once)."""
    if name not in _TUNED:
        import triton

        kernel_name, shapes, _ = LAUNCHERS[name]
        kernel = getattr(_kernels, kernel_name)
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=_set_block_shapes)
                   for m, n, w, s in shapes]
        key = [a for a in ("n_q", "n_k", "HEAD_DIM", "HEAD_DIM_V", "DIM_QK", "DIM_V", "CAUSAL", "BAND", "SOFTCAP",
                           "VARLEN", "DESC", "LONGEST_FIRST") if a in kernel.arg_names]
        prune = functools.partial(_prune_by_head_dim, name)
        options = dict(configs=configs, key=key, prune_configs_by={"early_config_prune": prune})
        if name == "bwd_atomic":   # atomic adds: every trial must start from a zeroed dQ buffer
            options["reset_to_zero"] = ["DQ_ACC"]
        if "do_bench" in inspect.signature(triton.autotune).parameters:   # shorter trials than the default
            options["do_bench"] = _quick_bench
        _TUNED[name] = triton.autotune(**options)(kernel)
    return _TUNED[name]


# each kernel argument a host-built descriptor may stand for: (its rows' block size, its head dim)
_DESCRIPTOR_BLOCKS = {"Q": ("BLOCK_M", "HEAD_DIM"), "O": ("BLOCK_M", "HEAD_DIM_V"), "DO": ("BLOCK_M", "HEAD_DIM_V"),
                      "DQ": ("BLOCK_M", "HEAD_DIM"), "K": ("BLOCK_N", "HEAD_DIM"), "V": ("BLOCK_N", "HEAD_DIM_V"),
                      "DK": ("BLOCK_N", "HEAD_DIM"), "DV": ("BLOCK_N", "HEAD_DIM_V")}


def _set_block_shapes(nargs) -> None:
    """Host-built descriptors carry their block shape: set it for the launch's BLOCK_M and BLOCK_N
    (the autotuner's pre-hook, and before a launch with one fixed configuration)."""
    if nargs.get("DESC") != _kernels.HOST_DESCRIPTORS:
        return
    for name, (rows, dim) in _DESCRIPTOR_BLOCKS.items():
        if hasattr(nargs.get(name), "block_shape"):
            nargs[name].block_shape = [1, 1, nargs[rows], nargs[dim]]


def _quick_bench(kernel_call, quantiles):
    """The autotuner's timing of one candidate: 5 ms of warm-up, 25 ms of repeats."""
    import triton

    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def _smaller_configs(config: BlockConfig):
    """``config``, then what a default falls back to where it needs more shared memory than the GPU has
    (fp32 tiles take twice fp16's): two pipeline stages, then smaller tiles with 4 warps."""
    yield config
    if config.num_stages > 2:
        yield replace(config, num_stages=2)
    for block_m, block_n in ((64, 64), (64, 32), (32, 32)):
        if block_m * block_n < config.block_m * config.block_n:
            yield BlockConfig(block_m, block_n, 4, 2)


@dataclass(frozen=True)
class _LaunchPlan:
    """How a launcher runs for one kind of call (``_plan_key``): what ``_launch`` decided on the first
    call of that kind, so that later calls only fill in the tensors."""

    kernel: object            # the @triton.jit kernel (never the autotuner: its choice is in meta)
    meta: dict                # BLOCK_M, BLOCK_N and the compiler options (num_warps, num_stages, ...)
    rows: int                 # rows per program: the grid is (cdiv(grid_rows, rows), *grid_heads)
    descriptor_blocks: tuple  # (argument index, block shape) of each host-built descriptor


_PLANS = {}   # _plan_key(...) -> _LaunchPlan
MAX_PLANS = 4096   # kinds of call remembered (a server sees many lengths); beyond, the plans start over


def _plan_key(name, tuned, fixed, rows_block, args, constexprs) -> tuple:
    """What decides a launch's plan: the launcher, how its configuration is chosen, the tiled inputs'
    dtype, every argument's integer value (sizes and strides: the autotuner's key is among them), dtype
    or type (None, float; float values are left out: no choice depends on them), the constexprs."""
    kinds = tuple(a if type(a) is int else getattr(a, "dtype", None) or type(a) for a in args)
    return name, tuned, fixed, rows_block, getattr(args[0], "base", args[0]).dtype, kinds, tuple(constexprs.items())


def _descriptor_blocks(kernel, args, constexprs, meta) -> tuple:
    """(index, [1, 1, rows, D]) for each argument that is a host-built descriptor (DESC = 2)."""
    if constexprs.get("DESC") != _kernels.HOST_DESCRIPTORS:
        return ()
    sizes = {**constexprs, **meta}
    return tuple((i, [1, 1, sizes[_DESCRIPTOR_BLOCKS[arg][0]], sizes[_DESCRIPTOR_BLOCKS[arg][1]]])
                 for i, arg in enumerate(kernel.arg_names[:len(args)])
                 if arg in _DESCRIPTOR_BLOCKS and hasattr(args[i], "block_shape"))


def _run(plan: _LaunchPlan, device, grid_rows: int, grid_heads: tuple, args, constexprs) -> None:
    import triton

    for index, block in plan.descriptor_blocks:
        args[index].block_shape = block
    with on_device(device):     # through Triton's JIT once per key, then the compiled kernel's runner (runners.py)
        RUNNERS.launch(plan.kernel, (triton.cdiv(grid_rows, plan.rows), *grid_heads), args,
                       {**constexprs, **plan.meta}, device)


def _launch(name: str, device: torch.device, tuned: bool, fixed: BlockConfig | None, grid_rows: int,
            grid_heads: tuple, *args, rows_block: str = "BLOCK_M", **constexprs) -> None:
    """Launch ``LAUNCHERS[name]`` on a grid (cdiv(grid_rows, <rows_block>), heads, sequences), ``grid_heads``
    the last two (each at most 65,535: ``check_inputs`` says so; one axis over B · H would stop there): autotuned
    when ``tuned``, else with ``fixed``, one small one in the interpreter. Without ``fixed``, the
    launcher's default for the head dim, or the first of its ``_smaller_configs`` that fits in shared
    memory (fp32 starts at 64 x 64 tiles); a ``fixed`` that does not fit raises Triton's OutOfResources.
    The first call of each kind (``_plan_key``) decides, autotuning included; later calls of that kind
    reuse its plan and go straight to the kernel (the host's time per call is part of a short call's)."""
    tuned = tuned and autotune_enabled() and not triton_interprets()
    key = _plan_key(name, tuned, fixed, rows_block, args, constexprs)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = _first_launch(name, device, tuned, fixed, grid_rows, grid_heads, args, rows_block, constexprs)
    else:
        _run(plan, device, grid_rows, grid_heads, args, constexprs)


def _first_launch(name, device, tuned, fixed, grid_rows, grid_heads, args, rows_block, constexprs) -> _LaunchPlan:
    """Launch as ``_launch`` says, choosing the configuration; returns the plan that launched. Where the
    autotuner's candidates all need more shared memory than the GPU has, the default and its fallbacks
    decide, as without autotuning."""
    import triton
    from triton.runtime.errors import OutOfResources

    kernel = getattr(_kernels, LAUNCHERS[name][0])
    if tuned:
        grid = lambda meta: (triton.cdiv(grid_rows, meta[rows_block]), *grid_heads)  # noqa: E731
        autotuner = _tuned(name)
        try:
            with on_device(device):
                autotuner[grid](*args, **constexprs)
        except OutOfResources:   # no candidate fits in shared memory (fp32 at D = 256): as without autotuning
            pass
        else:
            meta = {k: v for k, v in autotuner.best_config.all_kwargs().items() if k not in constexprs}
            return _LaunchPlan(kernel, meta, meta[rows_block], _descriptor_blocks(kernel, args, constexprs, meta))
    if triton_interprets():
        choices = [INTERPRETER_CONFIG]
    elif fixed is not None:
        choices = [fixed]
    else:
        choices = list(_smaller_configs(default_config(name, max(constexprs["HEAD_DIM"],
                                                                   constexprs.get("HEAD_DIM_V", 0)))))
        if getattr(args[0], "base", args[0]).dtype.itemsize >= 4:   # fp32 tiles: start at 64 x 64 (compiling
            choices = [c for c in choices if c.block_m * c.block_n <= 64 * 64] or choices[-1:]   # larger is slow)
    for config in choices:
        meta = config.meta()
        plan = _LaunchPlan(kernel, meta, meta[rows_block], _descriptor_blocks(kernel, args, constexprs, meta))
        try:
            _run(plan, device, grid_rows, grid_heads, args, constexprs)
        except OutOfResources:
            if config == choices[-1]:
                raise
            continue
        return plan


# ------------------------------------------------------------------------------------------ forward
def _new_buffer(shape, dtype, device) -> torch.Tensor:
    """Every output and scratch buffer the kernels write (tests fill these with NaN instead)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _dot_precision(dtype) -> str:
    """fp32 inputs get true fp32 products: tf32 (10-bit mantissa) scores err by ~1e-3 after exp."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _compute_dtype_inputs(*tensors):
    """bf16 goes through the kernels as fp32 where they cannot take it (the interpreter, whose bf16
    arithmetic is not faithful, and GPUs below sm_80, where Triton cannot compile bf16)."""
    if tensors[0].dtype == torch.bfloat16 and bf16_computed_in_fp32(tensors[0].device):
        return tuple(t.float() for t in tensors)
    return tensors


@functools.lru_cache(maxsize=None)
def descriptors_supported(device: torch.device) -> bool:
    """Tensor-descriptor (TMA) kernels run here: a compiled CUDA device of capability >= 9.0 and a
    Triton that has ``tl.make_tensor_descriptor`` (3.4 and newer). Asked once per device."""
    import triton
    import triton.language as tl

    if device.type != "cuda" or not hasattr(tl, "make_tensor_descriptor") or not hasattr(triton, "set_allocator"):
        return False
    return not triton_interprets() and torch.cuda.get_device_capability(device)[0] >= 9


def _host_descriptors(*tensors) -> tuple:
    """Host-built tensor descriptors over whole [B, H, N, D] views; their block shape is set per launch
    (``_run``, and ``_set_block_shapes`` for the autotuner's trials)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return tuple(TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, t.shape[-1]]) for t in tensors)


def _tma_compatible(*tensors) -> bool:
    """TMA needs a contiguous last dimension, 16-byte aligned bases and 16-byte multiples as strides."""
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
    return True


_ALLOCATOR_SET = False


def _ensure_allocator() -> None:
    """Device-side tensor descriptors need a little global scratch memory, which Triton asks for
    through the allocator set by ``triton.set_allocator`` (set once, on first use)."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        def alloc(size: int, alignment: int, stream):
            return torch.empty(size, dtype=torch.int8, device="cuda")

        import triton

        triton.set_allocator(alloc)
        _ALLOCATOR_SET = True


def host_descriptor_choice(causal: bool, head_dim: int, n_k: int) -> dict:
    """Where the host_descriptors rung uses its descriptor kernel, from the H100 measurements in
    docs/flash_notes.md: D = 64 and 128, causal at every length and non-causal from 1k keys on
    (at 512 keys the pointer kernel was faster at D = 128); the autotuned pointer kernel elsewhere
    (D = 16, 32 and 256 were not measured)."""
    return dict(desc=head_dim in (64, 128) and (causal or n_k >= 1024))


def warp_specialized_choice(causal: bool, head_dim: int, n_q: int, n_k: int) -> bool:
    """Where the warp_specialized rung runs the Gluon kernel (if these inputs are in its scope), from the
    H100 measurements beside the Triton forward (bench_flash_hopper.csv, bench_flash_persistent.csv,
    docs/flash_notes.md; fp16, N = Nq = Nk): at D = 128 it was faster at every length from 1k (as
    persistent programs up to 2k, and at every length when not causal: flash_hopper.launch_config); at
    D = 64, with three compute groups non-causal, from 4k (causal: from 8k). At D = 64 and 1k its persistent
    programs ran 1.02-1.05x the autotuned Triton forward in three runs, and 0.96-1.02x at 2k: too narrow a
    win to switch kernels. Lengths below those measured keep Triton."""
    shortest = min(n_q, n_k)
    if head_dim == 128:
        return shortest >= 1024
    return head_dim == 64 and shortest >= (8192 if causal else 4096)


# The Gluon modules whose kernels failed to build or launch in this process: Gluon's API moves between
# Triton versions (the kernels are written for 3.6), so on another Triton the Triton kernels run instead.
GLUON_FAILED: set[str] = set()


def _gluon_failed(module_name: str, exc: Exception) -> None:
    """Remember that ``module_name``'s Gluon kernels do not work with this Triton, and say so once."""
    import triton

    GLUON_FAILED.add(module_name)
    first_line = (str(exc).splitlines() or [""])[0][:200]
    warnings.warn(f"{module_name}: the Gluon kernel failed with Triton {triton.__version__} "
                  f"({type(exc).__name__}: {first_line}); the Triton kernels run instead",
                  RuntimeWarning, stacklevel=4)


def _run_gluon(module, launch):
    """launch()'s result, or None (after one RuntimeWarning naming the module, the Triton version and the
    error; the module is not tried again in this process) when it raises anything but running out of GPU
    memory."""
    try:
        return launch()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:            # a Gluon API this Triton does not have, or has with other arguments
        _gluon_failed(module.__name__, exc)
        return None


def _gluon_module(name: str):
    """attnkit.kernels.<name> (a Gluon module), or None with a Triton without Gluon's Hopper API (silently),
    when importing it fails otherwise (with the warning of ``_run_gluon``), or after its kernels failed in
    this process (``GLUON_FAILED``)."""
    module_name = f"{__package__}.{name}"
    if module_name in GLUON_FAILED:
        return None
    try:
        return importlib.import_module(module_name)
    except (ImportError, AttributeError):     # a Triton without Gluon's Hopper API, or an older one of it
        return None
    except Exception as exc:                  # a Gluon whose decorators or layouts take other arguments
        _gluon_failed(module_name, exc)
        return None


def _warp_specialized_forward(q, k, v, causal: bool, sm_scale: float):
    """(o, lse) of the warp-specialised Gluon kernel where its rule picks it and it can run these (plain,
    CUDA, sm_90, contiguous, fp16/bf16) inputs with a Triton that has Gluon's Hopper API; None otherwise."""
    if sm_major(q.device) != 9 or not warp_specialized_choice(causal, q.shape[-1], q.shape[2], k.shape[2]):
        return None
    flash_hopper = _gluon_module("flash_hopper")
    if flash_hopper is None:
        return None
    reason, config = flash_hopper.plan(q, k, v, causal)
    if reason:
        return None
    return _run_gluon(flash_hopper, lambda: flash_hopper._launch(q, k, v, causal, sm_scale, *config))


def effective_rung(rung: Rung, causal: bool, *tensors, plain: bool = True) -> Rung:
    """``rung`` for these tensors [B, H, N, D] (q, k, v, o): pointer loads where its rule says so, or
    where this device, Triton or the tensors' strides cannot take descriptors, or where the shapes are
    not ``plain`` (packed sequences, a head dim that is padded or differs between v and q)."""
    q, k = tensors[0], tensors[1]
    if rung.rule and not host_descriptor_choice(causal, q.shape[-1], k.shape[2])["desc"]:
        rung = replace(rung, desc=_kernels.POINTERS)
    if rung.desc and not (plain and descriptors_supported(q.device) and _tma_compatible(*tensors)):
        rung = replace(rung, desc=_kernels.POINTERS)
    return rung


def _padded(head_dim: int) -> int:
    """A tile's head dim: the next power of two, at least 16 (the smallest inner size of tl.dot)."""
    return max(16, 1 << (head_dim - 1).bit_length())


def _band(causal: bool, window) -> tuple[int, int, bool]:
    """(left, right, BAND) for the kernels: a side without bound is UNBOUNDED; causal is right = 0."""
    left, right = window
    if causal:
        right = 0
    bound = lambda side: UNBOUNDED if side < 0 else min(side, UNBOUNDED)  # noqa: E731  (int32 in the kernels)
    return bound(left), bound(right), causal or left >= 0 or right >= 0


def right_bounded(causal: bool, window) -> bool:
    """The band is bounded on the right (causal, or a window's right side). Query i then sees keys up to
    i + Nk - Nq + right, so a query block reads at least as many keys as the block before it when the
    left side is unbounded (with both sides bounded, as many but for the ends): the forward launches
    its blocks in reverse, the longest first (``Rung.longest_first``)."""
    return causal or window[1] >= 0


def _logit_scales(sm_scale: float, softcap, use_exp2: bool) -> tuple[float, float]:
    """(qk_scale, cap_scale): logits are qk · qk_scale, or tanh(qk · cap_scale) · qk_scale with a softcap."""
    unit = LOG2E if use_exp2 else 1.0
    if softcap is None:
        return sm_scale * unit, 0.0
    return softcap * unit, sm_scale / softcap


def _heads_view(t: torch.Tensor, packed: bool) -> torch.Tensor:
    """A packed [total, H, D] tensor as a [1, H, total, D] view (no copy); a [B, H, N, D] one as itself."""
    return t.unsqueeze(0).transpose(1, 2) if packed else t


def _strides(t: torch.Tensor, packed: bool) -> tuple:
    """The four strides the kernels take; packed sequences start at cu_seqlens, so the batch stride is 0."""
    return (0, *t.stride()[1:]) if packed else tuple(t.stride())


def _row_strides(lse: torch.Tensor, packed: bool) -> tuple[int, int]:
    """(per batch, per head) strides of a contiguous lse: [B, H, N], or [H, total] when packed."""
    return (0, lse.stride(0)) if packed else (lse.stride(0), lse.stride(1))


def _forward(q, k, v, causal: bool, sm_scale: float, variant: str, window=(-1, -1), softcap=None, varlen=None):
    """o [B, Hq, Nq, Dv] (q's dtype), lse [B, Hq, Nq] fp32 of the rung ``variant``. Inputs already checked."""
    return _forward_rung(q, k, v, causal, sm_scale, VARIANTS[variant], window=window, softcap=softcap,
                         varlen=varlen)


def _forward_rung(q, k, v, causal: bool, sm_scale: float, rung: Rung, config: BlockConfig | None = None, *,
                  window=(-1, -1), softcap=None, varlen=None):
    """The forward of one rung (and, optionally, with one fixed launch configuration). ``varlen``:
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) for packed [total, H, D] inputs; o is then
    [total_q, Hq, Dv] and lse [Hq, total_q]."""
    where, out_dtype = q.device, q.dtype
    packed = varlen is not None
    if rung.warp_specialized and config is None and not packed and tuple(window) == (-1, -1) and softcap is None:
        result = _warp_specialized_forward(q, k, v, causal, sm_scale)
        if result is not None:
            return result
    cu_q, cu_k = varlen[:2] if packed else (None, None)
    q, k, v, cu_q, cu_k = to_kernel_device(q, k, v, cu_q, cu_k)
    q, k, v = _compute_dtype_inputs(q, k, v)
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    o = _new_buffer((*q.shape[:-1], head_dim_v), q.dtype, q.device)
    q4, k4, v4, o4 = (_heads_view(t, packed) for t in (q, k, v, o))
    batch, n_heads, n_q = q4.shape[:3]
    n_heads_kv, n_k = k4.shape[1], k4.shape[2]
    if packed:
        batch, n_q, n_k = cu_q.numel() - 1, varlen[2], varlen[3]
        lse = _new_buffer((n_heads, q.shape[0]), torch.float32, q.device)
    else:
        lse = _new_buffer((batch, n_heads, n_q), torch.float32, q.device)
    plain = not packed and head_dim == head_dim_v == _padded(head_dim)
    rung = effective_rung(rung, causal, q4, k4, v4, o4, plain=plain)
    tensors = (q4, k4, v4, o4)
    if rung.desc == _kernels.HOST_DESCRIPTORS:
        tensors = _host_descriptors(*tensors)
    elif rung.desc == _kernels.DEVICE_DESCRIPTORS:
        _ensure_allocator()
    left, right, band = _band(causal, window)
    qk_scale, cap_scale = _logit_scales(sm_scale, softcap, rung.use_exp2)
    fixed = config if config is not None or rung.tuned else _fixed_forward_config(
        max(_padded(head_dim), _padded(head_dim_v)))
    longest_first = rung.longest_first and right_bounded(causal, window)
    _launch("fwd_desc" if rung.desc else "fwd", q.device, rung.tuned and config is None, fixed,
            n_q, (n_heads, batch), *tensors, lse, cu_q, cu_k, qk_scale, cap_scale, left, right,
            *(st for t in (q4, k4, v4, o4) for st in _strides(t, packed)), *_row_strides(lse, packed),
            batch, n_heads, n_heads // n_heads_kv, n_q, n_k, HEAD_DIM=_padded(head_dim), CAUSAL=causal,
            USE_EXP2=rung.use_exp2, SPLIT=rung.split, DESC=rung.desc, DOT_PRECISION=_dot_precision(q.dtype),
            HEAD_DIM_V=_padded(head_dim_v), DIM_QK=head_dim, DIM_V=head_dim_v, BAND=band,
            SOFTCAP=softcap is not None, VARLEN=packed, LONGEST_FIRST=longest_first)
    return o.to(where, out_dtype), lse.to(where)


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
    causal, sm_scale, window, softcap = _options(q, causal, sm_scale, window, softcap)
    if variant == "best":
        variant = BEST
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected 'best' or one of {list(VARIANTS)}, got {variant!r}")
    with torch.no_grad():
        return _forward(q, k, v, causal, sm_scale, variant, window, softcap)


# ----------------------------------------------------------------------------------------- backward
@dataclass(frozen=True)
class _BackwardLaunch:
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
        return tuple(st for t in tensors for st in _strides(t, self.packed))

    def tiles(self, *tensors) -> tuple:
        """The arguments for tensors the kernels move in tiles: host-built descriptors with DESC = 2."""
        return _host_descriptors(*tensors) if self.constexprs["DESC"] == _kernels.HOST_DESCRIPTORS else tensors

    def launch(self, name: str, grid_rows: int, grid_heads: tuple, *args, **options) -> None:
        fixed = self.configs.get(name)
        _launch(name, self.device, fixed is None, fixed, grid_rows, grid_heads, *args, **options, **self.constexprs)


def _backward_two_kernels(plan: _BackwardLaunch) -> None:
    """dK, dV by programs that own key blocks (``_bwd_dkdv``), then dQ by programs that own query
    blocks (``_bwd_dq``): no two programs write the same element, at the price of recomputing the
    scores and dP in both kernels (seven matrix products per pair of blocks)."""
    tiles = plan.tiles(plan.q4, plan.k4, plan.v4, plan.do4)   # one set of descriptors serves both launches
    _launch_dkdv(plan, tiles)
    _launch_dq(plan, tiles)


def _launch_dkdv(plan: _BackwardLaunch, tiles: tuple) -> None:
    """The Triton dK/dV kernel of the two-kernel design; ``tiles``: q, k, v, do as ``plan.tiles`` gives them."""
    batch, n_heads, n_heads_kv, n_q, n_k = plan.sizes
    no_dq_acc = plan.dk4                               # DQ_ACC: not touched without ATOMIC_DQ
    plan.launch("bwd_dkdv", n_k, (n_heads_kv, batch), *tiles, plan.lse, plan.delta,
                *plan.tiles(plan.dk4, plan.dv4), no_dq_acc,
                *plan.scalars, *plan.strides(plan.q4, plan.k4, plan.v4, plan.do4, plan.dk4, plan.dv4), 0, 0, 0, 0,
                *_row_strides(plan.lse, plan.packed),
                n_heads // n_heads_kv, n_q, n_k, rows_block="BLOCK_N", ATOMIC_DQ=False)


def _launch_dq(plan: _BackwardLaunch, tiles: tuple) -> None:
    """The Triton dQ kernel of the two-kernel design; ``tiles`` as for ``_launch_dkdv``."""
    batch, n_heads, n_heads_kv, n_q, n_k = plan.sizes
    dq4 = _heads_view(plan.dq, plan.packed)
    plan.launch("bwd_dq", n_q, (n_heads, batch), *tiles, plan.lse, plan.delta, *plan.tiles(dq4),
                *plan.scalars, *plan.strides(plan.q4, plan.k4, plan.v4, plan.do4, dq4),
                *_row_strides(plan.lse, plan.packed), n_heads // n_heads_kv, n_q, n_k)


def _backward_atomic_dq(plan: _BackwardLaunch) -> None:
    """One pass over key blocks (``_bwd_dkdv`` with ATOMIC_DQ): dK, dV stored as in the two-kernel design,
    dQ added with fp32 atomic adds into a zeroed fp32 buffer of q's shape, then converted to the inputs'
    dtype (five matrix products per pair of blocks; two extra passes over an fp32 copy of dQ: the zeroing
    and the conversion)."""
    batch, n_heads, n_heads_kv, n_q, n_k = plan.sizes
    dq_acc = torch.zeros(plan.dq.shape, dtype=torch.float32, device=plan.device)   # q's shape, fp32
    acc4 = _heads_view(dq_acc, plan.packed)
    inputs = (plan.q4, plan.k4, plan.v4, plan.do4)
    plan.launch("bwd_atomic", n_k, (n_heads_kv, batch), *plan.tiles(*inputs), plan.lse, plan.delta,
                *plan.tiles(plan.dk4, plan.dv4), acc4,
                *plan.scalars, *plan.strides(*inputs, plan.dk4, plan.dv4, acc4), *_row_strides(plan.lse, plan.packed),
                n_heads // n_heads_kv, n_q, n_k, rows_block="BLOCK_N", ATOMIC_DQ=True)
    plan.dq.copy_(dq_acc)


def _gluon_backward(plan: _BackwardLaunch):
    """The module of the warp-specialised Gluon backward (``flash_hopper_backward``) where it can run this
    plan: an sm_90 GPU, a Triton with Gluon's Hopper API, plain inputs in its scope, no window or softcap;
    None elsewhere."""
    c = plan.constexprs
    left, right = plan.scalars[5:7]
    windowed = left != UNBOUNDED or (right != UNBOUNDED and not c["CAUSAL"])
    if plan.packed or windowed or c["SOFTCAP"] or sm_major(plan.device) != 9:
        return None
    flash_hopper_backward = _gluon_module("flash_hopper_backward")
    if (flash_hopper_backward is None or not plan.do4.is_contiguous()
            or flash_hopper_backward.unsupported(plan.q4, plan.k4, plan.v4, c["CAUSAL"])):
        return None
    return flash_hopper_backward


def _gluon_dkdv(gluon, plan: _BackwardLaunch, dq_acc: torch.Tensor | None = None) -> bool:
    """dK, dV into the plan's buffers by the Gluon kernel; with ``dq_acc`` (zeroed fp32 of q's shape) dQ too.
    False (nothing written) when the kernel failed with this Triton (``_run_gluon``)."""
    def launch():
        gluon.dkdv(plan.q4, plan.k4, plan.v4, plan.do4, plan.lse, plan.delta, plan.constexprs["CAUSAL"],
                   plan.scalars[2], dk=plan.dk4, dv=plan.dv4, dq_acc=dq_acc)
        return True
    return bool(_run_gluon(gluon, launch))


def warp_specialized_backward_choice(head_dim: int, n_q: int, n_k: int) -> bool:
    """Where the warp_specialized backward design runs the Gluon dK/dV kernel (if the inputs are in its
    scope), from the H100 measurements beside the Triton two-kernel design (bench_flash_hopper_backward.csv,
    docs/flash_notes.md; fp16, N = Nq = Nk): from 2k the whole backward was 1.02-1.11x as fast at D = 64
    and 1.03-1.12x at D = 128, causal or not; at 1k 0.97-1.03x (recorded again 2026-11-27: 1.03-1.14x,
    1.06-1.10x, at 1k 0.98-1.02x)."""
    return head_dim in (64, 128) and min(n_q, n_k) >= 2048


def _backward_warp_specialized(plan: _BackwardLaunch) -> None:
    """The two-kernel design with its dK/dV kernel warp-specialised in Gluon where
    ``warp_specialized_backward_choice`` picks it and it can run (else the Triton one), then the Triton
    dQ kernel."""
    tiles = plan.tiles(plan.q4, plan.k4, plan.v4, plan.do4)
    _, _, _, n_q, n_k = plan.sizes
    gluon = _gluon_backward(plan) if warp_specialized_backward_choice(plan.q4.shape[-1], n_q, n_k) else None
    if not (gluon and _gluon_dkdv(gluon, plan)):
        _launch_dkdv(plan, tiles)
    _launch_dq(plan, tiles)


def _backward_warp_specialized_atomic(plan: _BackwardLaunch) -> None:
    """One warp-specialised Gluon pass (dK, dV stored, dQ added atomically into a zeroed fp32 buffer, then
    converted) where it can run; the two-kernel design elsewhere."""
    gluon = _gluon_backward(plan)
    dq_acc = None if gluon is None else torch.zeros(plan.dq.shape, dtype=torch.float32, device=plan.device)
    if dq_acc is None or not _gluon_dkdv(gluon, plan, dq_acc):
        _backward_two_kernels(plan)
        return
    plan.dq.copy_(dq_acc)


@dataclass(frozen=True)
class BackwardDesign:
    """One way to compute the backward: matrix products per (query block, key block) pair, and how."""

    products: int
    summary: str
    run: object          # run(plan: _BackwardLaunch) -> None, after the shared DELTA pre-pass
    descriptors: bool    # tiles through host-built tensor descriptors (TMA) where the inputs allow
    gluon: bool = False  # a Gluon kernel on sm_90 (flash_hopper_backward); "two_kernels" wherever it cannot run
    reproducible: bool = True   # the same gradients bit for bit on every run (no additions in a racing order)


# The backward designs, selected by ``backward=`` (or the environment variable ATTNKIT_FLASH_BACKWARD).
BACKWARDS = {
    "two_kernels": BackwardDesign(7, "dK/dV kernel over key blocks, then a dQ kernel over query blocks; "
                                     "no atomics, S and dP computed twice", _backward_two_kernels, True),
    "atomic_dq": BackwardDesign(5, "one kernel over key blocks: dK, dV stored, dQ accumulated with fp32 "
                                   "atomic adds, then converted (FlashAttention-2/3)", _backward_atomic_dq, False,
                              reproducible=False),
    "warp_specialized": BackwardDesign(7, "two kernels, the dK/dV one warp-specialised in Gluon on sm_90 "
                                          "(FlashAttention-3's layout) where it was measured faster, the "
                                          "Triton one elsewhere",
                                       _backward_warp_specialized, True, gluon=True),
    "warp_specialized_atomic": BackwardDesign(5, "one warp-specialised Gluon kernel on sm_90, dQ added by "
                                                 "TMA bulk reductions from a writer warp; two_kernels elsewhere",
                                              _backward_warp_specialized_atomic, True, gluon=True, reproducible=False),
}
# Designs whose kernels run on every machine (the interpreter, any GPU); the Gluon ones fall back to two_kernels.
TRITON_BACKWARDS = tuple(name for name, design in BACKWARDS.items() if not design.gluon)
# The default: the one pass, on the H100 0.933-1.072x cuDNN's backward by medians of seven alternating repeats
# (D = 64 and 128, N = 1k-16k, causal and not; experiments/flash_hopper_gluon/spread.py --backward,
# bench_flash_spread_backward.csv), where the deterministic design below ran at 0.743-0.980x; everywhere
# else both are the two-kernel design. Its dQ additions land in no fixed order, so with
# torch.use_deterministic_algorithms(True) the default is DETERMINISTIC_BACKWARD (the dK/dV kernel in
# Gluon, dQ by the Triton dQ kernel: no additions race).
DEFAULT_BACKWARD = "warp_specialized_atomic"
DETERMINISTIC_BACKWARD = "warp_specialized"
# Each design's ``descriptors``: whether its tiles move through host-built tensor descriptors (TMA) where
# they can (sm_90+, unpacked inputs, a power-of-two head dim shared by q and v, TMA-compatible strides);
# ``desc=`` of ``_backward`` overrides it. Measured on the H100 (scripts/gpu_flash_sweep.py,
# docs/flash_notes.md), speed over the pointer tiles: two kernels 1.00-1.13x (0.79x at D = 64, N = 1024,
# causal); one pass 0.90-0.97x at D = 128, whose dK/dV kernel then spills 100 registers instead of 38
# (0.99-1.15x at D = 64).
BACKWARD_ENV = "ATTNKIT_FLASH_BACKWARD"


def check_backward(backward) -> str:
    """The backward design's name: ``backward`` if given, else $ATTNKIT_FLASH_BACKWARD, else
    ``DEFAULT_BACKWARD`` (``DETERMINISTIC_BACKWARD`` while torch.use_deterministic_algorithms is on);
    ValueError unless it names one of ``BACKWARDS``, or if it names a design that is not reproducible while
    deterministic algorithms are required (with ``warn_only=True``: a UserWarning, as PyTorch's own)."""
    where = "backward"
    deterministic = torch.are_deterministic_algorithms_enabled()
    if backward is None:
        backward = os.environ.get(BACKWARD_ENV) or (DETERMINISTIC_BACKWARD if deterministic else DEFAULT_BACKWARD)
        where = f"backward (from ${BACKWARD_ENV})" if os.environ.get(BACKWARD_ENV) else where
    if not isinstance(backward, str) or backward not in BACKWARDS:
        raise ValueError(f"{where}: expected one of {list(BACKWARDS)}, got {backward!r}")
    if deterministic and not BACKWARDS[backward].reproducible:
        why = (f"{where}: {backward!r} adds dQ in no fixed order, so its gradients are not reproducible, and "
               f"torch.use_deterministic_algorithms(True) is on; use one of "
               f"{[name for name, design in BACKWARDS.items() if design.reproducible]}")
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            raise ValueError(why)
        warnings.warn(why, UserWarning, stacklevel=3)
    return backward


def _backward_descriptors(desc, design: str, packed: bool, *tensors) -> int:
    """DESC for the backward kernels: HOST_DESCRIPTORS where asked (``desc``; None: the design's own
    choice, at D <= 128: at D = 256 pointer tiles were faster in 5 of 6 cases on the H100) and possible
    for these [B, H, N, D] views (q, k, v, do, dq, dk, dv), else POINTERS."""
    q, v = tensors[0], tensors[2]
    wanted = BACKWARDS[design].descriptors and q.shape[-1] <= 128 if desc is None else desc
    plain = not packed and q.shape[-1] == v.shape[-1] == _padded(q.shape[-1])
    if wanted and plain and descriptors_supported(q.device) and _tma_compatible(*tensors):
        return _kernels.HOST_DESCRIPTORS
    return _kernels.POINTERS


def _backward(do, q, k, v, o, lse, causal: bool, sm_scale: float, window=(-1, -1), softcap=None, varlen=None,
              design: str = DEFAULT_BACKWARD, configs: dict | None = None, desc: bool | None = None):
    """dq, dk, dv in the inputs' dtypes and shapes, by the backward ``design`` (a key of BACKWARDS).
    Inputs already checked. ``configs``: launcher name -> BlockConfig, fixed instead of autotuned.
    ``desc``: tiles through tensor descriptors where possible (None: the design's ``descriptors``)."""
    import triton

    where, out_dtype = q.device, q.dtype
    packed = varlen is not None
    cu_q, cu_k = varlen[:2] if packed else (None, None)
    do, q, k, v, o, lse, cu_q, cu_k = to_kernel_device(do, q, k, v, o, lse, cu_q, cu_k)
    do, q, k, v, o = _compute_dtype_inputs(do, q, k, v, o)
    device = q.device
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    lse = lse.contiguous()
    delta = _new_buffer(lse.shape, torch.float32, device)              # Σ_d do · o: the softmax's row term
    dq, dk, dv = (_new_buffer(t.shape, q.dtype, device) for t in (q, k, v))
    q4, k4, v4, o4, do4, dk4, dv4 = (_heads_view(t, packed) for t in (q, k, v, o, do, dk, dv))
    batch, n_heads, n_q = q4.shape[:3]
    n_heads_kv, n_k = k4.shape[1], k4.shape[2]
    if packed:
        batch, n_q, n_k = cu_q.numel() - 1, varlen[2], varlen[3]
    block_m = 16 if triton_interprets() else 64
    dims = dict(HEAD_DIM_V=_padded(head_dim_v), DIM_V=head_dim_v, VARLEN=packed)
    with on_device(device):     # through Triton's JIT once per key, then the compiled kernel's runner
        RUNNERS.launch(_kernels._bwd_preprocess, (triton.cdiv(n_q, block_m), n_heads, batch),
                       (o4, do4, delta, cu_q, *_strides(o4, packed), *_strides(do4, packed),
                        *_row_strides(lse, packed), n_q), dict(BLOCK_M=block_m, **dims), device)
    left, right, band = _band(causal, window)
    qk_scale, cap_scale = _logit_scales(sm_scale, softcap, True)
    desc = _backward_descriptors(desc, design, packed, q4, k4, v4, do4, _heads_view(dq, packed), dk4, dv4)
    plan = _BackwardLaunch(
        device, q4, k4, v4, do4, dq, dk4, dv4, lse, delta, packed, (batch, n_heads, n_heads_kv, n_q, n_k),
        (cu_q, cu_k, sm_scale, qk_scale, cap_scale, left, right),
        dict(HEAD_DIM=_padded(head_dim), CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype), DIM_QK=head_dim,
             BAND=band, SOFTCAP=softcap is not None, DESC=desc, **dims), dict(configs or {}))
    BACKWARDS[design].run(plan)
    return tuple(t.to(where, out_dtype) for t in (dq, dk, dv))


def flash_attention_backward(do, q, k, v, o, lse, *, causal: bool = False, sm_scale: float | None = None,
                             window=(-1, -1), softcap: float | None = None, backward: str | None = None):
    """The backward kernels: given dO = ∂L/∂o, returns (dq, dk, dv) = (∂L/∂q, ∂L/∂k, ∂L/∂v).

    o and lse come from ``flash_attention_forward`` with the same causal, sm_scale, window and softcap.
    dk and dv have k's and v's shapes: each K/V head's gradient is summed over the query heads that read it.
    ``backward`` names the design (a key of ``BACKWARDS``; None: $ATTNKIT_FLASH_BACKWARD or ``DEFAULT_BACKWARD``).
    """
    check_inputs(q, k, v)
    causal, sm_scale, window, softcap = _options(q, causal, sm_scale, window, softcap)
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
        return _backward(do, q, k, v, o, lse, causal, sm_scale, window, softcap, design=design)


# ------------------------------------------------------------------------------------------ autograd
class FlashAttentionFunction(torch.autograd.Function):
    """Forward saves (q, k, v, o, lse); backward recomputes the probabilities tile by tile."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale, window=(-1, -1), softcap=None, varlen=None, design=DEFAULT_BACKWARD):
        o, lse = _forward(q, k, v, causal, sm_scale, BEST, window, softcap, varlen)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.options = (causal, sm_scale, window, softcap, varlen, design)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        with torch.no_grad():
            dq, dk, dv = _backward(do, q, k, v, o, lse, *ctx.options)
        if torch.is_grad_enabled():       # create_graph=True: the gradients may be differentiated again
            dq, dk, dv = _NoSecondDerivative.apply(dq, dk, dv, q, k, v, do)
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
    causal, sm_scale, window, softcap = _options(q, causal, sm_scale, window, softcap)
    design = check_backward(backward)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return _forward(q, k, v, causal, sm_scale, BEST, window, softcap)[0]   # no graph to record
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale, window, softcap, None, design)


# ------------------------------------------------------------------------------- packed sequences
def check_cu_seqlens(name: str, cu_seqlens, total: int, device) -> int:
    """Raise ValueError unless ``cu_seqlens`` is a contiguous int32 [B + 1] tensor on ``device`` of offsets
    that start at 0, never decrease and end at ``total``; return the longest sequence. (Contiguous: the
    kernels read entry b at cu_seqlens + b; FlashAttention-2 refuses other strides too.)"""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D int32 tensor of B + 1 offsets (B >= 1), got "
                         f"{getattr(cu_seqlens, 'shape', type(cu_seqlens).__name__)}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(f"{name}: dtype {cu_seqlens.dtype} is not supported; use torch.int32")
    if cu_seqlens.device != device:
        raise ValueError(f"{name}: must be on q's device {device}, got {cu_seqlens.device}")
    if cu_seqlens.stride(0) != 1:
        # the kernels read entry b at cu_seqlens + b (as FlashAttention-2, which refuses them too)
        raise ValueError(f"{name}: must be contiguous (stride 1), got stride {cu_seqlens.stride(0)} (a strided "
                         f"view or a column of a larger tensor); pass {name}.contiguous()")
    offsets = cu_seqlens.cpu().long()
    if offsets[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {int(offsets[0])}")
    lengths = offsets[1:] - offsets[:-1]
    if (lengths < 0).any():
        raise ValueError(f"{name}: must not decrease (entry {int(torch.nonzero(lengths < 0)[0, 0]) + 1} is "
                         "smaller than the one before)")
    if offsets[-1] != total:
        raise ValueError(f"{name}: its last entry must be the total number of tokens {total}, got {int(offsets[-1])}")
    validation.grid_axis(name, "sequences B", len(lengths))
    return int(lengths.max())


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
    causal, sm_scale, window, softcap = _options(q, causal, sm_scale, window, softcap)
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


__all__ = ["flash_attention", "flash_attention_varlen", "flash_attention_forward", "flash_attention_backward",
           "check_inputs", "check_window", "check_softcap", "check_cu_seqlens",
           "LADDER", "VARIANTS", "BEST", "BEST_TRITON", "Rung", "host_descriptor_choice", "warp_specialized_choice",
           "warp_specialized_backward_choice",
           "descriptors_supported",
           "BACKWARDS", "TRITON_BACKWARDS", "DEFAULT_BACKWARD", "DETERMINISTIC_BACKWARD", "GLUON_FAILED",
           "default_config", "BackwardDesign",
           "check_backward", "right_bounded",
           "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES", "FlashAttentionFunction"]
