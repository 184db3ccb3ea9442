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

Where it runs: CUDA tensors run compiled kernels (block sizes autotuned); CPU tensors run the same
kernels in Triton's interpreter (one small fixed block size), also on a machine with a GPU. The
interpreter's bf16 arithmetic is not faithful, and Triton cannot compile bf16 below sm_80, so there
bf16 is computed in fp32 and rounded.
"""
from __future__ import annotations

import atexit
import inspect
import os
from dataclasses import dataclass

import torch

from .. import validation
from ..device import bf16_computed_in_fp32
from . import flash_kernels as _compiled_kernels

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128, 256)
SUPPORTED_DTYPES = validation.FLOAT_DTYPES
LOG2E = 1.4426950408889634

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
_BASE = dict(use_exp2=True, split=True, tuned=True, desc=False, warp_spec=False, halves=False, ping_pong=False,
             pipeline=False, host_desc=False, host_rule=False)
VARIANTS = {  # rung -> kernel switches
    "tiled": dict(_BASE, use_exp2=False, split=False, tuned=False),
    "exp2": dict(_BASE, split=False, tuned=False),
    "split": dict(_BASE, tuned=False),
    "autotuned": dict(_BASE),
    "descriptors": dict(_BASE, desc=True),
    "host_descriptors": dict(_BASE, desc=True, host_desc=True, host_rule=True),
}
# Switch sets explored on the GPU (scripts/gpu_flash_tuning.py) outside the ladder (see
# docs/flash_notes.md): "halves" computes every query tile as two interleaved halves;
# "ping_pong" takes halves for non-causal D = 128 from 1k keys on and whole descriptor tiles for
# causal D = 128 from 2k keys on (ping_pong_choice), faster than "descriptors" but slower than
# "host_descriptors"; "warp_specialized" did not compile on Hopper with Triton 3.6; "pipelined"
# issues the next tile's score product before the current tile's softmax (FlashAttention-3's
# intra-warpgroup overlap by hand), measured slower at every size; "host_halves" is "halves" with
# host-built descriptors, slower than "host_descriptors".
CANDIDATES = {
    "ping_pong": dict(_BASE, desc=True, ping_pong=True),
    "halves": dict(_BASE, desc=True, halves=True),
    "warp_specialized": dict(_BASE, desc=True, warp_spec=True),
    "pipelined": dict(_BASE, desc=True, pipeline=True),
    "host_halves": dict(_BASE, desc=True, host_desc=True, halves=True),
}
# The rung that "best" means: the fastest one verified on the H100 (docs/flash_notes.md), whose
# full benchmark is recorded in attnkit/bench/results/bench_flash.csv. Where a rung's features are missing (CPU
# interpreter, GPUs below sm_90, Triton without tensor descriptors, strides TMA cannot take) it
# falls back to the rung below it.
BEST = "host_descriptors"


# ------------------------------------------------------------------------------------ input checks
def check_inputs(q, k, v) -> None:
    """Raise ValueError, naming the argument and the rule, unless q, k, v are valid attention inputs."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        validation.tensor(name, t, 4, "[B, H, N, D]", SUPPORTED_DTYPES)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v: must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v: must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k, v: must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q, k: batch sizes differ ({q.shape[0]} vs {k.shape[0]})")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q, k: head dims differ ({q.shape[3]} vs {k.shape[3]})")
    if q.shape[1] % k.shape[1] != 0:
        raise ValueError(f"q, k: the query heads Hq={q.shape[1]} must be a multiple of the key/value "
                         f"heads Hkv={k.shape[1]} (Hq % Hkv == 0)")
    if q.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: head dim D={q.shape[3]} is not supported; D must be one of {SUPPORTED_HEAD_DIMS}")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"q: device {q.device} is not supported; use a CUDA GPU or the CPU")


# ----------------------------------------------------------------------------- kernels and configs
def _is_interpreted(module) -> bool:
    """True when ``module``'s kernels were decorated in interpreter mode."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(module._attn_fwd, InterpretedFunction)


def _kernels(device: torch.device):
    """The kernel module (compiled on a GPU machine, interpreted on a CPU-only one)."""
    return _compiled_kernels


def _needs_interpreter_process(device: torch.device) -> bool:
    """CPU tensors on a machine whose Triton compiles kernels (it has a GPU).

    ``triton.jit`` and Triton's own standard library (tl.max, tl.sum, ...) choose compiled or
    interpreted functions once, at import, from TRITON_INTERPRET (Triton 3.4 to 3.9). So CPU tensors
    there run in a helper process that imported Triton with TRITON_INTERPRET=1.
    """
    return device.type == "cpu" and not _is_interpreted(_compiled_kernels)


_INTERPRETER_POOL = None


def _interpreter_pool():
    """One spawned helper process whose Triton runs kernels in the interpreter (started once)."""
    global _INTERPRETER_POOL
    if _INTERPRETER_POOL is None:
        import multiprocessing

        saved = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"          # inherited by the process started now
        try:
            _INTERPRETER_POOL = multiprocessing.get_context("spawn").Pool(1)
            atexit.register(_INTERPRETER_POOL.terminate)
        finally:
            if saved is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = saved
    return _INTERPRETER_POOL


def _in_interpreter_process(fn_name: str, *args):
    """Run ``_forward`` or ``_backward`` on CPU tensors in the interpreter helper process."""
    return _interpreter_pool().apply(_call_here, (fn_name, *args))


def _call_here(fn_name: str, *args):
    return {"_forward": _forward, "_forward_switches": _forward_switches, "_backward": _backward}[fn_name](*args)


@dataclass(frozen=True)
class BlockConfig:
    """One launch configuration: tile sizes, warps per program, software-pipelining depth."""

    block_m: int
    block_n: int
    num_warps: int = 4
    num_stages: int = 2

    def meta(self) -> dict:
        return dict(BLOCK_M=self.block_m, BLOCK_N=self.block_n, num_warps=self.num_warps,
                    num_stages=self.num_stages)


INTERPRETER_CONFIG = BlockConfig(16, 16, 1, 1)      # small tiles: ragged sizes span several tiles


def _fixed_forward_config(head_dim: int) -> BlockConfig:
    """The untuned ladder rungs' one configuration on a GPU."""
    return BlockConfig(64, 64, 4, 2) if head_dim <= 128 else BlockConfig(64, 32, 4, 2)


# Candidate configurations (BLOCK_M, BLOCK_N, num_warps, num_stages) for the autotuner on CUDA. Few on
# purpose: each one is compiled per head dim, dtype and causal flag. In the backward, dK/dV programs
# own BLOCK_N keys and loop over BLOCK_M queries; dQ programs own BLOCK_M queries.
FWD_CONFIGS = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)]
BWD_DKDV_CONFIGS = [(32, 128, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 2)]
BWD_DQ_CONFIGS = [(128, 32, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 2)]
# The tensor-descriptor forward (sm_90+): a wider space, BLOCK_N = 128 and deeper pipelines included.
# The four fastest of eight measured at D = 128 (docs/flash_notes.md).
FWD_DESC_CONFIGS = [(128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4)]
# Two interleaved halves (HALVES=True): 256-row query tiles, 128 rows each half (the two fastest
# configurations measured at D = 128).
FWD_HALVES_CONFIGS = [(256, 64, 8, 3), (256, 64, 8, 4)]
# Used instead when ATTNKIT_AUTOTUNE=0 (and as the first guess for each head dim).
DEFAULT_CONFIGS = {"_attn_fwd": BlockConfig(128, 64, 4, 3), "_attn_fwd_desc": BlockConfig(128, 64, 4, 3),
                   "_attn_fwd_desc_halves": BlockConfig(256, 64, 8, 3),
                   "_attn_fwd_host_desc": BlockConfig(128, 64, 4, 3),
                   "_attn_fwd_host_desc_halves": BlockConfig(256, 64, 8, 3),
                   "_bwd_dkdv": BlockConfig(32, 64, 4, 3), "_bwd_dq": BlockConfig(64, 32, 4, 3)}


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
                          num_warps=4, num_stages=2) for c in small[:1]]


_TUNED = {}


def _tuned(name: str):
    """The autotuned CUDA launcher of kernel ``name`` (built once)."""
    if name not in _TUNED:
        import triton

        shapes = {"_attn_fwd": FWD_CONFIGS, "_attn_fwd_desc": FWD_DESC_CONFIGS,
                  "_attn_fwd_desc_halves": FWD_HALVES_CONFIGS,
                  "_attn_fwd_host_desc": FWD_DESC_CONFIGS, "_attn_fwd_host_desc_halves": FWD_HALVES_CONFIGS,
                  "_bwd_dkdv": BWD_DKDV_CONFIGS, "_bwd_dq": BWD_DQ_CONFIGS}[name]
        hook = _set_block_shapes if name.startswith("_attn_fwd_host_desc") else None
        configs = [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s, pre_hook=hook)
                   for m, n, w, s in shapes]
        key = ["n_q", "n_k", "HEAD_DIM", "CAUSAL"]
        if name.startswith("_attn_fwd_desc"):
            key += ["WARP_SPEC", "HALVES", "PIPELINE"]
        if name.startswith("_attn_fwd_host_desc"):
            key += ["HALVES"]
        options = dict(configs=configs, key=key,
                       prune_configs_by={"early_config_prune": _prune_by_head_dim})
        if "do_bench" in inspect.signature(triton.autotune).parameters:   # shorter trials than the default
            options["do_bench"] = _quick_bench
        _TUNED[name] = triton.autotune(**options)(getattr(_compiled_kernels, _kernel_name(name)))
    return _TUNED[name]


def _kernel_name(name: str) -> str:
    """The jit function behind a launcher name ("_attn_fwd_desc_halves" is "_attn_fwd_desc" with
    its own configurations)."""
    for kernel in ("_attn_fwd_desc", "_attn_fwd_host_desc"):
        if name.startswith(kernel):
            return kernel
    return name


def _set_block_shapes(nargs) -> None:
    """Host-built descriptors carry their block shape: set it for the launch's BLOCK_M and BLOCK_N
    (the autotuner's pre-hook, and before a launch with one fixed configuration)."""
    rows = nargs["BLOCK_M"] // (2 if nargs.get("HALVES") else 1)
    head_dim = nargs["HEAD_DIM"]
    for name, block in (("desc_q", rows), ("desc_o", rows), ("desc_k", nargs["BLOCK_N"]), ("desc_v", nargs["BLOCK_N"])):
        nargs[name].block_shape = [1, 1, block, head_dim]


def _quick_bench(kernel_call, quantiles):
    """The autotuner's timing of one candidate: 5 ms of warm-up, 25 ms of repeats."""
    import triton

    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def _untuned_config(name: str, head_dim: int) -> BlockConfig:
    config = DEFAULT_CONFIGS[name]
    if head_dim >= 256:   # shared memory: halve the tiles
        return BlockConfig(min(config.block_m, 64), min(config.block_n, 32), 4, 2)
    return config


def _launch(name: str, device: torch.device, tuned: bool, fixed: BlockConfig, grid_rows: int,
            grid_heads: int, *args, rows_block: str = "BLOCK_M", **constexprs) -> None:
    """Launch kernel ``name`` on a grid (cdiv(grid_rows, <rows_block>), grid_heads)."""
    import triton

    kernels = _kernels(device)
    host_desc = name.startswith("_attn_fwd_host_desc")
    if _is_interpreted(kernels):
        if host_desc:
            _set_block_shapes(dict(zip(("desc_q", "desc_k", "desc_v", "desc_o"), args), **constexprs,
                                   **INTERPRETER_CONFIG.meta()))
        grid = (triton.cdiv(grid_rows, INTERPRETER_CONFIG.meta()[rows_block]), grid_heads)
        getattr(kernels, _kernel_name(name))[grid](*args, **constexprs, **INTERPRETER_CONFIG.meta())
        return
    if fixed is None:
        fixed = _untuned_config(name, constexprs["HEAD_DIM"])
    with torch.cuda.device(device):
        if tuned and autotune_enabled():
            grid = lambda meta: (triton.cdiv(grid_rows, meta[rows_block]), grid_heads)  # noqa: E731
            _tuned(name)[grid](*args, **constexprs)
        else:
            if host_desc:
                _set_block_shapes(dict(zip(("desc_q", "desc_k", "desc_v", "desc_o"), args), **constexprs,
                                       **fixed.meta()))
            grid = (triton.cdiv(grid_rows, fixed.meta()[rows_block]), grid_heads)
            getattr(kernels, _kernel_name(name))[grid](*args, **constexprs, **fixed.meta())


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
    if _is_interpreted(_compiled_kernels):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def warp_specialize_supported() -> bool:
    """The installed Triton's ``tl.range`` takes ``warp_specialize=`` (3.4 and newer)."""
    import triton.language as tl

    try:
        return "warp_specialize" in inspect.signature(tl.range).parameters
    except (TypeError, ValueError):
        return False


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


def effective_switches(switches: dict, *tensors) -> dict:
    """``switches`` with the features this device, Triton or these tensors lack turned off."""
    switches = dict(switches)
    if switches.get("desc") and not (descriptors_supported(tensors[0].device) and _tma_compatible(*tensors)):
        switches.update(desc=False, warp_spec=False, halves=False, ping_pong=False, pipeline=False, host_desc=False,
                        host_rule=False)
    if switches.get("warp_spec") and not warp_specialize_supported():
        switches["warp_spec"] = False
    return switches


def ping_pong_choice(causal: bool, head_dim: int, n_k: int) -> dict:
    """The kernel switches the ping_pong candidate uses for one shape, from the H100 measurements in
    docs/flash_notes.md: two half tiles for non-causal D = 128 from 1k keys on, descriptor tiles
    for causal D = 128 from 2k keys on, and the autotuned pointer kernel elsewhere (at D = 64, and for
    short sequences, where each program's few key tiles do not repay building its descriptors)."""
    if head_dim != 128:
        return dict(desc=False, halves=False)
    if causal:
        return dict(desc=n_k >= 2048, halves=False)
    return dict(desc=n_k >= 1024, halves=n_k >= 1024)


def host_descriptor_choice(causal: bool, head_dim: int, n_k: int) -> dict:
    """Where the host_descriptors rung uses its descriptor kernel, from the H100 measurements in
    docs/flash_notes.md: D = 64 and 128, causal at every length and non-causal from 1k keys on
    (at 512 keys the pointer kernel was faster at D = 128); the autotuned pointer kernel elsewhere
    (D = 16, 32 and 256 were not measured)."""
    return dict(desc=head_dim in (64, 128) and (causal or n_k >= 1024))


def _forward(q, k, v, causal: bool, sm_scale: float, variant: str):
    """o [B, Hq, Nq, D] (q's dtype), lse [B, Hq, Nq] fp32. Inputs already checked."""
    switches = VARIANTS[variant] if variant in VARIANTS else CANDIDATES[variant]
    return _forward_switches(q, k, v, causal, sm_scale, switches)


def _forward_switches(q, k, v, causal: bool, sm_scale: float, switches: dict, config: BlockConfig | None = None):
    """The forward with explicit kernel switches (and, optionally, one fixed launch configuration)."""
    if _needs_interpreter_process(q.device):
        return _in_interpreter_process("_forward_switches", q, k, v, causal, sm_scale, switches, config)
    out_dtype = q.dtype
    q, k, v = _compute_dtype_inputs(q, k, v)
    batch, n_heads, n_q, head_dim = q.shape
    n_heads_kv, n_k = k.shape[1], k.shape[2]
    o = _new_buffer(q.shape, q.dtype, q.device)
    lse = _new_buffer((batch, n_heads, n_q), torch.float32, q.device)
    if switches["ping_pong"]:
        switches = dict(switches, **ping_pong_choice(causal, head_dim, n_k))
    if switches["host_rule"]:
        switches = dict(switches, **host_descriptor_choice(causal, head_dim, n_k))
    switches = effective_switches(switches, q, k, v, o)
    qk_scale = sm_scale * LOG2E if switches["use_exp2"] else sm_scale
    tuned = switches["tuned"] and config is None
    fixed = config if config is not None else (None if switches["tuned"] else _fixed_forward_config(head_dim))
    if switches["desc"] and switches["host_desc"]:
        from triton.tools.tensor_descriptor import TensorDescriptor

        descs = [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, head_dim]) for t in (q, k, v, o)]
        name = "_attn_fwd_host_desc_halves" if switches["halves"] and config is None else "_attn_fwd_host_desc"
        _launch(name, q.device, tuned, fixed, n_q, batch * n_heads, *descs, lse, qk_scale,
                n_heads, n_heads // n_heads_kv, n_q, n_k, HEAD_DIM=head_dim, CAUSAL=causal,
                HALVES=switches["halves"], DOT_PRECISION=_dot_precision(q.dtype))
    elif switches["desc"]:
        _ensure_allocator()
        name = "_attn_fwd_desc_halves" if switches["halves"] and config is None else "_attn_fwd_desc"
        _launch(name, q.device, tuned, fixed, n_q, batch * n_heads,
                q, k, v, o, lse, qk_scale,
                *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                n_heads, n_heads // n_heads_kv, n_q, n_k,
                HEAD_DIM=head_dim, CAUSAL=causal, WARP_SPEC=switches["warp_spec"],
                HALVES=switches["halves"], PIPELINE=switches["pipeline"], DOT_PRECISION=_dot_precision(q.dtype))
    else:
        _launch("_attn_fwd", q.device, tuned, fixed, n_q, batch * n_heads,
                q, k, v, o, lse, qk_scale,
                *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                n_heads, n_heads // n_heads_kv, n_q, n_k,
                HEAD_DIM=head_dim, CAUSAL=causal,
                USE_EXP2=switches["use_exp2"], SPLIT=switches["split"], DOT_PRECISION=_dot_precision(q.dtype))
    return o.to(out_dtype), lse


def flash_attention_forward(q, k, v, *, causal: bool = False, sm_scale: float | None = None,
                            variant: str = "best"):
    """The forward kernel: returns (o, lse).

    o: [B, Hq, Nq, D] in q's dtype; lse: [B, Hq, Nq] fp32, log Σ_j exp(sm_scale · q_i·k_j) over the
    keys row i sees (-inf for a row that sees none). ``variant`` picks a rung of ``LADDER``
    ("best" is ``BEST``, the fastest rung verified on the H100; on a device or Triton without its
    features it falls back to the rung below, down to "autotuned").
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
def _preprocess(o, do, delta) -> None:
    """delta[b, h, i] = Σ_d do · o: the row term of the softmax gradient."""
    import triton

    batch, n_heads, n_q, head_dim = o.shape
    block_m = 16 if _is_interpreted(_kernels(o.device)) else 64
    grid = (triton.cdiv(n_q, block_m), batch * n_heads)
    with torch.device(o.device):
        _kernels(o.device)._bwd_preprocess[grid](o, do, delta, *o.stride(), *do.stride(), n_heads, n_q,
                                                 HEAD_DIM=head_dim, BLOCK_M=block_m)


def _backward(do, q, k, v, o, lse, causal: bool, sm_scale: float):
    """dq, dk, dv in the inputs' dtypes (dk, dv [B, Hkv, Nk, D]). Inputs already checked."""
    if _needs_interpreter_process(q.device):
        return _in_interpreter_process("_backward", do, q, k, v, o, lse, causal, sm_scale)
    out_dtype = q.dtype
    do, q, k, v, o = _compute_dtype_inputs(do, q, k, v, o)
    batch, n_heads, n_q, head_dim = q.shape
    n_heads_kv, n_k = k.shape[1], k.shape[2]
    group = n_heads // n_heads_kv
    device = q.device
    qk_scale = sm_scale * LOG2E
    lse = lse.contiguous()

    delta = _new_buffer((batch, n_heads, n_q), torch.float32, device)
    _preprocess(o, do, delta)

    dk = _new_buffer((batch, n_heads_kv, n_k, head_dim), q.dtype, device)
    dv = _new_buffer((batch, n_heads_kv, n_k, head_dim), q.dtype, device)
    _launch("_bwd_dkdv", device, True, None, n_k, batch * n_heads_kv,
            q, k, v, do, lse, delta, dk, dv, sm_scale, qk_scale,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(),
            n_heads, n_heads_kv, group, n_q, n_k,
            rows_block="BLOCK_N", HEAD_DIM=head_dim, CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype))

    dq = _new_buffer((batch, n_heads, n_q, head_dim), q.dtype, device)
    _launch("_bwd_dq", device, True, None, n_q, batch * n_heads,
            q, k, v, do, lse, delta, dq, sm_scale, qk_scale,
            *q.stride(), *k.stride(), *v.stride(), *do.stride(),
            n_heads, group, n_q, n_k,
            HEAD_DIM=head_dim, CAUSAL=causal, DOT_PRECISION=_dot_precision(q.dtype))
    return dq.to(out_dtype), dk.to(out_dtype), dv.to(out_dtype)


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
           "LADDER", "VARIANTS", "BEST", "ping_pong_choice", "host_descriptor_choice", "descriptors_supported", "warp_specialize_supported", "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES", "FlashAttentionFunction"]
