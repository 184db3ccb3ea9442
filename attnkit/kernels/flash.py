"""FlashAttention in Triton, forward and backward, for [B, H, N, D] tensors.

Public functions
- ``flash_attention(q, k, v, *, causal=False, sm_scale=None) -> o``: differentiable attention
  (a ``torch.autograd.Function``; the backward runs in Triton too).
- ``flash_attention_forward(q, k, v, *, causal=False, sm_scale=None, variant="best") -> (o, lse)``:
  the forward kernel alone; ``lse`` [B, Hq, Nq] fp32 is the natural-log log-sum-exp of each row of
  scaled scores (-inf for a row that sees no key), the one number per row the backward needs.
- ``flash_attention_backward(do, q, k, v, o, lse, *, causal=False, sm_scale=None) -> (dq, dk, dv)``:
  the backward kernels alone (dK, dV summed over the query heads that share a K/V head).
- ``LADDER``: the forward's performance ladder, rung name -> what it adds; each rung is a
  ``variant=`` of ``flash_attention_forward``. ``check_inputs(q, k, v)`` raises the ValueErrors.

Shapes: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] with Hq % Hkv == 0 (query head h reads K/V head
h // (Hq // Hkv): multi-head, grouped-query and multi-query attention without copying K or V);
any Nq, Nk >= 1; D in {16, 32, 64, 128, 256}; fp16, bf16 or fp32, all three the same. Any strides.
Causal attention with Nq != Nk is aligned to the end: query i sees key j when j <= i + Nk - Nq;
a row that sees no key gives 0. ``sm_scale`` defaults to 1/sqrt(D).

Where it runs: as every kernel of the course, by ``attnkit.device.kernel_device``: CUDA tensors run
compiled kernels (block sizes autotuned); on a machine without a GPU, CPU tensors run the same kernels
in Triton's interpreter (one small fixed block size); CPU tensors on a machine with a GPU are
computed on the GPU and copied back. The interpreter's bf16 arithmetic is not faithful, and Triton
cannot compile bf16 below sm_80, so there bf16 is computed in fp32 and rounded.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, replace

import torch

from .. import validation
from ..device import bf16_computed_in_fp32, launch_options, to_kernel_device, triton_interprets
from . import flash_kernels as _kernels

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
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
}


@dataclass(frozen=True)
class Rung:
    """One rung: the constexprs of the one forward kernel ``_attn_fwd`` and how its block sizes are chosen."""

    use_exp2: bool = True            # USE_EXP2
    split: bool = True               # SPLIT
    desc: int = _kernels.POINTERS    # DESC: pointers, descriptors built per program, or built on the host
    tuned: bool = True               # autotuned block sizes (else one fixed configuration)
    rule: bool = False               # host_descriptor_choice decides per shape whether to use ``desc``


VARIANTS = {
    "tiled": Rung(use_exp2=False, split=False, tuned=False),
    "exp2": Rung(split=False, tuned=False),
    "split": Rung(tuned=False),
    "autotuned": Rung(),
    "descriptors": Rung(desc=_kernels.DEVICE_DESCRIPTORS),
    "host_descriptors": Rung(desc=_kernels.HOST_DESCRIPTORS, rule=True),
}
# The rung that "best" means: the fastest one verified on the H100 (docs/flash_notes.md), whose
# full benchmark is recorded in attnkit/bench/results/bench_flash.csv. Where a rung's features are
# missing (CPU interpreter, GPUs below sm_90, Triton without tensor descriptors, strides TMA cannot
# take) it runs with pointer loads, as "autotuned". Variants measured slower on the H100 are kept,
# with their measurements, in experiments/flash_variants/ (outside the package).
BEST = "host_descriptors"


# ------------------------------------------------------------------------------------ input checks
def check_inputs(q, k, v) -> None:
    """Raise ValueError, naming the argument and the rule, unless q, k, v are valid attention inputs."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, 4, "[B, H, N, D]", SUPPORTED_DTYPES)
    validation.same("dtype", q=q, k=k, v=v)
    validation.same("device", q=q, k=k, v=v)
    if k.shape != v.shape:
        raise ValueError(f"k, v: must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q, k: batch sizes differ ({q.shape[0]} vs {k.shape[0]})")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q, k: head dims differ ({q.shape[3]} vs {k.shape[3]})")
    validation.head_groups("q, k", q.shape[1], k.shape[1])
    validation.head_dim("q", q.shape[3], SUPPORTED_HEAD_DIMS)
    validation.kernel_device("q", q)


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
# Candidate configurations (BLOCK_M, BLOCK_N, num_warps, num_stages) for the autotuner on CUDA. Few on
# purpose: each one is compiled per head dim, dtype and causal flag. In the backward, dK/dV programs
# own BLOCK_N keys and loop over BLOCK_M queries; dQ programs own BLOCK_M queries. The descriptor
# forward (sm_90+) takes a wider space, BLOCK_N = 128 included: the four fastest of eight measured at
# D = 128 (docs/flash_notes.md).
# launcher: (kernel, candidate configurations, the configuration used when ATTNKIT_AUTOTUNE=0)
LAUNCHERS = {
    "fwd": ("_attn_fwd", [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)],
            BlockConfig(128, 64, 4, 3)),
    "fwd_desc": ("_attn_fwd", [(128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4)],
                 BlockConfig(128, 64, 4, 3)),
    "bwd_dkdv": ("_bwd_dkdv", [(32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 2)],
                 BlockConfig(32, 64, 4, 3)),
    "bwd_dq": ("_bwd_dq", [(128, 32, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 2)],
               BlockConfig(64, 32, 4, 3)),
}


def _fixed_forward_config(head_dim: int) -> BlockConfig:
    """The untuned ladder rungs' one configuration on a GPU."""
    return BlockConfig(64, 64, 4, 2) if head_dim <= 128 else BlockConfig(64, 32, 4, 2)


def autotune_enabled() -> bool:
    """Autotuning runs on CUDA unless the environment sets ATTNKIT_AUTOTUNE=0 (saves compile time)."""
    return os.environ.get("ATTNKIT_AUTOTUNE", "1") != "0"


def _prune_by_head_dim(configs, named_args, **kwargs):
    """D = 256 tiles need twice the shared memory: keep small tiles and two stages there."""
    import triton

    head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))
    if head_dim is None or head_dim < 256:
        return configs
    small = [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 64 * 64] or configs[-1:]
    return [triton.Config({"BLOCK_M": c.kwargs["BLOCK_M"], "BLOCK_N": min(c.kwargs["BLOCK_N"], 32)},
                          num_warps=4, num_stages=2, pre_hook=c.pre_hook) for c in small[:1]]


_TUNED = {}


def _tuned(name: str):
    """The autotuned CUDA launcher ``name`` of ``LAUNCHERS`` (built once)."""
    if name not in _TUNED:
        import triton

        kernel_name, shapes, _ = LAUNCHERS[name]
        kernel = getattr(_kernels, kernel_name)
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=_set_block_shapes)
                   for m, n, w, s in shapes]
        key = [a for a in ("n_q", "n_k", "HEAD_DIM", "CAUSAL", "DESC") if a in kernel.arg_names]
        options = dict(configs=configs, key=key, prune_configs_by={"early_config_prune": _prune_by_head_dim})
        if "do_bench" in inspect.signature(triton.autotune).parameters:   # shorter trials than the default
            options["do_bench"] = _quick_bench
        _TUNED[name] = triton.autotune(**options)(kernel)
    return _TUNED[name]


def _set_block_shapes(nargs) -> None:
    """Host-built descriptors carry their block shape: set it for the launch's BLOCK_M and BLOCK_N
    (the autotuner's pre-hook, and before a launch with one fixed configuration)."""
    if nargs.get("DESC") != _kernels.HOST_DESCRIPTORS:
        return
    for name, rows in (("Q", "BLOCK_M"), ("O", "BLOCK_M"), ("K", "BLOCK_N"), ("V", "BLOCK_N")):
        nargs[name].block_shape = [1, 1, nargs[rows], nargs["HEAD_DIM"]]


def _quick_bench(kernel_call, quantiles):
    """The autotuner's timing of one candidate: 5 ms of warm-up, 25 ms of repeats."""
    import triton

    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def _launch(name: str, device: torch.device, tuned: bool, fixed: BlockConfig | None, grid_rows: int,
            grid_heads: int, *args, rows_block: str = "BLOCK_M", **constexprs) -> None:
    """Launch ``LAUNCHERS[name]`` on a grid (cdiv(grid_rows, <rows_block>), grid_heads): autotuned
    when ``tuned``, else with ``fixed`` (default: the launcher's own), one small one in the interpreter."""
    import triton

    kernel_name, _, default = LAUNCHERS[name]
    kernel = getattr(_kernels, kernel_name)
    if triton_interprets():
        fixed, tuned = INTERPRETER_CONFIG, False
    elif fixed is None:
        head_dim = constexprs["HEAD_DIM"]      # D = 256: halve the tiles (shared memory)
        fixed = default if head_dim < 256 else BlockConfig(min(default.block_m, 64), min(default.block_n, 32), 4, 2)
    if tuned and autotune_enabled():
        grid = lambda meta: (triton.cdiv(grid_rows, meta[rows_block]), grid_heads)  # noqa: E731
        launcher, meta = _tuned(name), {}
    else:
        meta = fixed.meta()
        grid = (triton.cdiv(grid_rows, meta[rows_block]), grid_heads)
        launcher = kernel
        _set_block_shapes(dict(zip(kernel.arg_names, args), **constexprs, **meta))
    with torch.device(device):
        launcher[grid](*args, **constexprs, **meta)


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


def descriptors_supported(device: torch.device) -> bool:
    """Tensor-descriptor (TMA) kernels run here: a compiled CUDA device of capability >= 9.0 and a
    Triton that has ``tl.make_tensor_descriptor`` (3.4 and newer)."""
    import triton
    import triton.language as tl

    if device.type != "cuda" or not hasattr(tl, "make_tensor_descriptor") or not hasattr(triton, "set_allocator"):
        return False
    return not triton_interprets() and torch.cuda.get_device_capability(device)[0] >= 9


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


def effective_rung(rung: Rung, causal: bool, *tensors) -> Rung:
    """``rung`` for these tensors [B, H, N, D] (q, k, v, o): pointer loads where its rule says so, or
    where this device, Triton or the tensors' strides cannot take descriptors."""
    q, k = tensors[0], tensors[1]
    if rung.rule and not host_descriptor_choice(causal, q.shape[-1], k.shape[2])["desc"]:
        rung = replace(rung, desc=_kernels.POINTERS)
    if rung.desc and not (descriptors_supported(q.device) and _tma_compatible(*tensors)):
        rung = replace(rung, desc=_kernels.POINTERS)
    return rung


def _forward(q, k, v, causal: bool, sm_scale: float, variant: str):
    """o [B, Hq, Nq, D] (q's dtype), lse [B, Hq, Nq] fp32 of the rung ``variant``. Inputs already checked."""
    return _forward_rung(q, k, v, causal, sm_scale, VARIANTS[variant])


def _forward_rung(q, k, v, causal: bool, sm_scale: float, rung: Rung, config: BlockConfig | None = None):
    """The forward of one rung (and, optionally, with one fixed launch configuration)."""
    where, out_dtype = q.device, q.dtype
    q, k, v = _compute_dtype_inputs(*to_kernel_device(q, k, v))
    batch, n_heads, n_q, head_dim = q.shape
    n_heads_kv, n_k = k.shape[1], k.shape[2]
    o = _new_buffer(q.shape, q.dtype, q.device)
    lse = _new_buffer((batch, n_heads, n_q), torch.float32, q.device)
    rung = effective_rung(rung, causal, q, k, v, o)
    tensors = (q, k, v, o)
    if rung.desc == _kernels.HOST_DESCRIPTORS:
        from triton.tools.tensor_descriptor import TensorDescriptor

        tensors = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, head_dim]) for t in tensors]
    elif rung.desc == _kernels.DEVICE_DESCRIPTORS:
        _ensure_allocator()
    fixed = config if config is not None or rung.tuned else _fixed_forward_config(head_dim)
    _launch("fwd_desc" if rung.desc else "fwd", q.device, rung.tuned and config is None, fixed,
            n_q, batch * n_heads, *tensors, lse, sm_scale * LOG2E if rung.use_exp2 else sm_scale,
            *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            batch, n_heads, n_heads // n_heads_kv, n_q, n_k, HEAD_DIM=head_dim, CAUSAL=causal,
            USE_EXP2=rung.use_exp2, SPLIT=rung.split, DESC=rung.desc, DOT_PRECISION=_dot_precision(q.dtype))
    return o.to(where, out_dtype), lse.to(where)


def flash_attention_forward(q, k, v, *, causal: bool = False, sm_scale: float | None = None,
                            variant: str = "best"):
    """The forward kernel: returns (o, lse).

    o: [B, Hq, Nq, D] in q's dtype; lse: [B, Hq, Nq] fp32, log Σ_j exp(sm_scale · q_i·k_j) over the
    keys row i sees (-inf for a row that sees none). ``variant`` picks a rung of ``LADDER``
    ("best" is ``BEST``, the fastest rung verified on the H100; on a device or Triton without its
    features it runs with pointer loads, as "autotuned").
    """
    check_inputs(q, k, v)
    causal = validation.flag("causal", causal)
    sm_scale = validation.softmax_scale(sm_scale, q.shape[-1])
    if variant == "best":
        variant = BEST
    if variant not in VARIANTS:
        raise ValueError(f"variant: expected 'best' or one of {list(VARIANTS)}, got {variant!r}")
    with torch.no_grad():
        return _forward(q, k, v, causal, sm_scale, variant)


# ----------------------------------------------------------------------------------------- backward
def _backward(do, q, k, v, o, lse, causal: bool, sm_scale: float):
    """dq, dk, dv in the inputs' dtypes (dk, dv [B, Hkv, Nk, D]). Inputs already checked."""
    import triton

    where, out_dtype = q.device, q.dtype
    do, q, k, v, o, lse = to_kernel_device(do, q, k, v, o, lse)
    do, q, k, v, o = _compute_dtype_inputs(do, q, k, v, o)
    batch, n_heads, n_q, head_dim = q.shape
    n_heads_kv, n_k = k.shape[1], k.shape[2]
    group = n_heads // n_heads_kv
    device = q.device
    lse = lse.contiguous()

    delta = _new_buffer((batch, n_heads, n_q), torch.float32, device)   # Σ_d do · o: the softmax's row term
    block_m = 16 if triton_interprets() else 64
    with torch.device(device):
        _kernels._bwd_preprocess[(triton.cdiv(n_q, block_m), batch * n_heads)](
            o, do, delta, *o.stride(), *do.stride(), n_heads, n_q, HEAD_DIM=head_dim, BLOCK_M=block_m)
    common = dict(HEAD_DIM=head_dim, CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype))
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    dk = _new_buffer((batch, n_heads_kv, n_k, head_dim), q.dtype, device)
    dv = _new_buffer((batch, n_heads_kv, n_k, head_dim), q.dtype, device)
    _launch("bwd_dkdv", device, True, None, n_k, batch * n_heads_kv, q, k, v, do, lse, delta, dk, dv,
            sm_scale, sm_scale * LOG2E, *strides, n_heads, n_heads_kv, group, n_q, n_k, rows_block="BLOCK_N", **common)
    dq = _new_buffer((batch, n_heads, n_q, head_dim), q.dtype, device)
    _launch("bwd_dq", device, True, None, n_q, batch * n_heads, q, k, v, do, lse, delta, dq,
            sm_scale, sm_scale * LOG2E, *strides, n_heads, group, n_q, n_k, **common)
    return tuple(t.to(where, out_dtype) for t in (dq, dk, dv))


def flash_attention_backward(do, q, k, v, o, lse, *, causal: bool = False, sm_scale: float | None = None):
    """The backward kernels: given dO = ∂L/∂o, returns (dq, dk, dv) = (∂L/∂q, ∂L/∂k, ∂L/∂v).

    o and lse come from ``flash_attention_forward`` with the same causal and sm_scale. dk and dv
    have k's shape: each K/V head's gradient is summed over the query heads that read it.
    """
    check_inputs(q, k, v)
    causal = validation.flag("causal", causal)
    sm_scale = validation.softmax_scale(sm_scale, q.shape[-1])
    for name, t in (("do", do), ("o", o)):
        if not isinstance(t, torch.Tensor) or t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name}: must be a tensor with q's shape, dtype and device")
    expected = (q.shape[0], q.shape[1], q.shape[2])
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != expected or lse.dtype != torch.float32:
        raise ValueError(f"lse: must be a float32 tensor of shape {expected} (from flash_attention_forward)")
    if lse.device != q.device:
        raise ValueError("lse: must be on q's device")
    with torch.no_grad():
        return _backward(do, q, k, v, o, lse, causal, sm_scale)


# ------------------------------------------------------------------------------------------ autograd
class FlashAttentionFunction(torch.autograd.Function):
    """Forward saves (q, k, v, o, lse); backward recomputes the probabilities tile by tile."""

    @staticmethod
    def forward(ctx, q, k, v, causal, sm_scale):
        o, lse = _forward(q, k, v, causal, sm_scale, BEST)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal = causal
        ctx.sm_scale = sm_scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(do, q, k, v, o, lse, ctx.causal, ctx.sm_scale)
        return dq, dk, dv, None, None


def flash_attention(q, k, v, *, causal: bool = False, sm_scale: float | None = None):
    """softmax(q kᵀ · sm_scale [+ causal mask]) v, differentiable. See the module docstring for shapes."""
    check_inputs(q, k, v)
    causal = validation.flag("causal", causal)
    sm_scale = validation.softmax_scale(sm_scale, q.shape[-1])
    return FlashAttentionFunction.apply(q, k, v, causal, sm_scale)


__all__ = ["flash_attention", "flash_attention_forward", "flash_attention_backward", "check_inputs",
           "LADDER", "VARIANTS", "BEST", "Rung", "host_descriptor_choice", "descriptors_supported",
           "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES", "FlashAttentionFunction"]
