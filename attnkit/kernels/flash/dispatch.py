"""Every rule that picks FlashAttention's kernel, backward design and launch configuration, in one place.

The rest of ``attnkit.kernels.flash`` asks this module and runs what it says:

- ``HEAD_DIMS``, the head-dim table: per head dim, each Triton launcher's configuration without
  autotuning, whether the autotuner may choose, where host-built tensor descriptors pay, and the head
  dims the Gluon kernels and the FP8 forward take with their configurations. A launch takes the row
  of the smallest listed head dim at or above its own (``head_dim_rules``, by the larger of q's and v's:
  ``launch_head_dim``); the Gluon and FP8 kernels run only at a listed head dim itself (``exact_rules``).
  docs/adding_a_head_dim.md says how to add a row.
- the forward: the default rung (``BEST``, ``BEST_TRITON``), what a rung becomes on these
  tensors (``effective_rung``: ``host_descriptor_choice``, ``descriptors_supported``, ``tma_compatible``),
  where the warp-specialised Gluon forward runs (``warp_specialized_choice``, ``hopper_plan``:
  ``hopper_unsupported`` and ``hopper_launch_config`` with its persistent programs).
- the backward: the default design (``DEFAULT_BACKWARD``) and ``check_backward``; which tiles
  it moves by descriptors (``backward_descriptors``); where the Gluon backward runs
  (``warp_specialized_backward_choice``, ``gluon_backward_module``); how dO is laid out (``backward_do``).
- the launchers' autotuning candidates and defaults (``LAUNCHERS``, ``default_config``,
  ``untuned_configs`` and ``smaller_configs``, ``autotune_enabled``, ``preprocess_rows``).
- the FP8 forward's head dims and configurations (``FP8_GPU_CONFIGS``, ``fp8_config``,
  ``fp8_descriptors_usable``).
- loading the Gluon modules (``gluon_module``, the one import that may fail: Gluon's Hopper API is
  missing from older Triton) and falling back to the Triton kernels when one fails (``run_gluon``,
  ``GLUON_FAILED``).

What the rules choose among, the forward's rungs (``LADDER``, ``Rung``, ``VARIANTS``) and the backward's
designs (``BackwardDesign``, ``BACKWARDS``, ``TRITON_BACKWARDS``), is defined in ``designs`` and re-exported
here.

One fallback stays below this module: a kept runner that raises sends that launcher back to Triton's JIT
for the rest of the process (``runners.Runners``), because the Gluon modules, which this module imports,
launch through the runners too.

Each rule's comment names the recorded results and the subsection "Rule: ..." of docs/flash_notes.md behind
it (measured figures, dates and tuning histories are kept there).
"""
from __future__ import annotations

import functools
import math
import os
import warnings
from dataclasses import dataclass, replace

import torch

from ...device import launch_options, sm_count, sm_major, triton_interprets
from . import triton_kernels as kernels
from .designs import (  # noqa: F401  (re-exported: dispatch.LADDER, dispatch.BACKWARDS, ...)
    BACKWARDS,
    LADDER,
    TRITON_BACKWARDS,
    VARIANTS,
    BackwardDesign,
    Rung,
)
from .runners import keep_recent


# ------------------------------------------------------------------------------------ configurations
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


@dataclass(frozen=True)
class HeadDimRules:
    """What one head dim runs. The Triton launchers' configurations (``LAUNCHERS``' names) serve every head
    dim above the row before and up to this one; the fields from ``host_descriptors_from`` on apply at this
    head dim only, for q, k and v alike. None: that kernel does not run here."""

    fwd: BlockConfig                          # the pointer forward without autotuning
    fwd_desc: BlockConfig                     # the descriptor forward without autotuning
    bwd_dkdv: BlockConfig                     # the two-kernel backward's dK/dV kernel (BLOCK_N keys a program)
    bwd_dq: BlockConfig                       # its dQ kernel (BLOCK_M queries a program)
    bwd_atomic: BlockConfig                   # the one-pass backward (dQ added atomically)
    untuned: BlockConfig                      # the ladder's untuned rungs ("tiled", "exp2", "split")
    autotune: bool = True                     # False: each launcher runs its default (``untuned_configs``)
    pad_from: int | None = None               # sm_90+: a head dim from this up to the row's runs zero-padded to it
    backward_descriptors: bool = True         # the backward designs may move tiles by descriptors
    host_descriptors_from: int | None = None  # host_descriptors rung: descriptors causal, and non-causal from Nk
    host_descriptors_itemsize: int = 4        # ... for elements of at most this many bytes
    gluon_forward: dict | None = None         # {causal: (HALF_M, BLOCK_N, STAGES, compute groups)}
    gluon_forward_from: dict | None = None    # {causal: shortest N at which "best" runs the Gluon forward}
    persistent_non_causal: bool = False       # non-causal Gluon forward: persistent programs at every length
    gluon_backward: tuple | None = None       # (BLOCK_M, PART_N, STAGES, compute groups) of the Gluon backward
    gluon_backward_from: int | None = None    # shortest N at which "warp_specialized" runs the Gluon dK/dV
    fp8: bool = False                         # the FP8 forward takes this head dim


# The head-dim table. Every configuration is the fastest of its sweep on the H100 (bench_flash_sweep.csv,
# scripts/gpu_flash_sweep.py; docs/flash_notes.md, "Rule: block sizes"); the thresholds are where a kernel was
# measured faster (docs/flash_notes.md, sections named per field in the rules below).
HEAD_DIMS = {
    64: HeadDimRules(
        fwd=BlockConfig(128, 64, 4, 3), fwd_desc=BlockConfig(128, 64, 8, 3), bwd_dkdv=BlockConfig(32, 128, 4, 3),
        bwd_dq=BlockConfig(128, 64, 4, 3), bwd_atomic=BlockConfig(64, 128, 8, 3), untuned=BlockConfig(64, 64, 4, 2),
        host_descriptors_from=1024, gluon_forward={False: (64, 128, 2, 3), True: (64, 128, 2, 2)},
        gluon_forward_from={False: 4096, True: 8192}, gluon_backward=(64, 64, 2, 2), gluon_backward_from=2048,
        fp8=True),
    128: HeadDimRules(
        fwd=BlockConfig(128, 128, 8, 3), fwd_desc=BlockConfig(128, 128, 8, 3), bwd_dkdv=BlockConfig(64, 128, 8, 3),
        bwd_dq=BlockConfig(128, 64, 8, 3), bwd_atomic=BlockConfig(64, 128, 8, 3), untuned=BlockConfig(64, 64, 4, 2),
        host_descriptors_from=1024, gluon_forward={False: (64, 128, 2, 2), True: (64, 128, 2, 2)},
        gluon_forward_from={False: 1024, True: 1024}, persistent_non_causal=True, gluon_backward=(64, 64, 2, 2),
        gluon_backward_from=2048, fp8=True, pad_from=65),
    # D = 192 (Dv = 128, DeepSeek's) and D = 256: twice the shared memory a row; swept among the
    # configurations ptxas compiles without serialising the products (docs/flash_notes.md, "Rule: D = 256");
    # each launcher's default without the autotuner, and at D = 256 the forward's tiles by host-built
    # descriptors, for 2-byte elements as checked (bench_flash_headdims_sweep.csv, D = 192 and 256 forward: the
    # fixed configurations beat the autotuned launch; docs/head_dims.md, "Rule: head dims above 128"); the
    # backward's tiles by pointers
    192: HeadDimRules(
        fwd=BlockConfig(128, 64, 8, 3), fwd_desc=BlockConfig(128, 64, 8, 2), bwd_dkdv=BlockConfig(64, 32, 4, 2),
        bwd_dq=BlockConfig(64, 32, 4, 2), bwd_atomic=BlockConfig(32, 32, 4, 2), untuned=BlockConfig(64, 32, 4, 2),
        autotune=False, backward_descriptors=False),
    256: HeadDimRules(
        fwd=BlockConfig(128, 64, 8, 2), fwd_desc=BlockConfig(128, 64, 8, 2), bwd_dkdv=BlockConfig(64, 32, 4, 2),
        bwd_dq=BlockConfig(64, 32, 4, 2), bwd_atomic=BlockConfig(32, 32, 4, 2), untuned=BlockConfig(64, 32, 4, 2),
        autotune=False, backward_descriptors=False, host_descriptors_from=0, host_descriptors_itemsize=2),
}
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, max(HEAD_DIMS)
SUPPORTED_HEAD_DIMS = range(MIN_HEAD_DIM, MAX_HEAD_DIM + 1)


def head_dim_rules(head_dim: int) -> HeadDimRules:
    """The row of the smallest listed head dim at or above ``head_dim`` (the Triton launchers' row)."""
    return HEAD_DIMS[min(d for d in HEAD_DIMS if d >= head_dim)]


def exact_rules(head_dim: int) -> HeadDimRules | None:
    """The row of exactly this head dim, or None (the Gluon and FP8 kernels run only there)."""
    return HEAD_DIMS.get(head_dim)


def head_dims_with(field: str) -> tuple[int, ...]:
    """The listed head dims whose row sets ``field`` (e.g. "gluon_forward", "fp8")."""
    return tuple(sorted(d for d, rules in HEAD_DIMS.items() if getattr(rules, field)))


def autotuned(head_dim: int, itemsize: int = 2) -> bool:
    """Whether a launch at this head dim (``launch_head_dim``) may autotune: on CUDA unless the environment
    says ATTNKIT_AUTOTUNE=0 (``autotune_enabled``) and where its row does not set ``autotune=False``; not fp32
    (``itemsize`` 4) tiles wider than 64, where every candidate is past ``FP32_TILE_PRODUCT``."""
    if itemsize >= 4 and padded(head_dim) > 64:
        return False
    return autotune_enabled() and head_dim_rules(head_dim).autotune


def pad_width(q: torch.Tensor, v: torch.Tensor, packed: bool = False, causal_forward_alone: bool = False) -> int | None:
    """The head dim q, k and v run zero-padded to, or None. Where a row sets ``pad_from`` (D = 128: from
    65), a head dim from there up to the row's own, with Dv = D and not packed, runs as the row's on sm_90+:
    its tiles are that wide anyway (``padded``), and the row's fast paths (the Gluon kernels, host-built
    descriptors) need the head dim exactly. Zero columns change no score (q.k) and give o zero columns;
    sm_scale stays 1/sqrt(the true D) (bench_flash_headdims_sweep.csv, impl pad128 at D = 80, 96, 112;
    docs/head_dims.md, "Rule: pad 65-127 to 128"). Not a causal forward alone (no backward to follow): padded,
    it ran slower (bench_flash_headdims.csv, causal forward rows after the rule)."""
    head_dim = q.shape[-1]
    if packed or causal_forward_alone or v.shape[-1] != head_dim or head_dim > MAX_HEAD_DIM:
        return None
    width = min(d for d in HEAD_DIMS if d >= head_dim)
    start = HEAD_DIMS[width].pad_from
    if start is None or not start <= head_dim < width or not descriptors_supported(q.device):
        return None
    return width


def padded(head_dim: int) -> int:
    """A tile's head dim: the next power of two, at least 16 (the smallest inner size of tl.dot)."""
    return max(16, 1 << (head_dim - 1).bit_length())


# -------------------------------------------------------------------------- the Triton launchers
# launcher: (kernel, candidate configurations (BLOCK_M, BLOCK_N, num_warps, num_stages) for the autotuner
# on CUDA, {listed head dim: the configuration without autotuning}). Few candidates on purpose: each one is
# compiled per head dim, dtype and causal flag. The candidates are the four fastest of the sweep
# (docs/flash_notes.md, "Rule: block sizes"; the pointer forward's were not swept). In the backward, dK/dV
# programs own BLOCK_N keys and loop over BLOCK_M queries; dQ programs own BLOCK_M queries. The one pass
# (_bwd_dkdv with ATOMIC_DQ) holds a [BLOCK_M, D] fp32 dQ share a query block: BLOCK_M = 64 keeps its
# five products on 64-row wgmma tiles.
_CANDIDATES = {
    "fwd": ("attn_fwd", [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3)]),
    "fwd_desc": ("attn_fwd", [(128, 128, 8, 3), (64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4)]),
    "bwd_dkdv": ("bwd_dkdv", [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3)]),
    "bwd_dq": ("bwd_dq", [(64, 32, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3)]),
    "bwd_atomic": ("bwd_dkdv", [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3)]),
}
LAUNCHERS = {name: (kernel, shapes, {d: getattr(rules, name) for d, rules in HEAD_DIMS.items()})
             for name, (kernel, shapes) in _CANDIDATES.items()}


def default_config(name: str, head_dim: int) -> BlockConfig:
    """The configuration launcher ``name`` uses without autotuning at this head dim (the larger of q's and
    v's, ``launch_head_dim``): its ``HEAD_DIMS`` row's."""
    return getattr(head_dim_rules(head_dim), name)


def launch_head_dim(constexprs: dict) -> int:
    """The head dim a Triton launch looks its row up by: the larger of q's and v's (the constexprs DIM_QK
    and DIM_V; the tiles' padded HEAD_DIM and HEAD_DIM_V where those are not given)."""
    return max(constexprs.get("DIM_QK") or constexprs.get("HEAD_DIM") or 0,
               constexprs.get("DIM_V") or constexprs.get("HEAD_DIM_V") or 0)


def untuned_forward_config(head_dim: int) -> BlockConfig:
    """The untuned ladder rungs' one configuration on a GPU."""
    return head_dim_rules(head_dim).untuned


def autotune_enabled() -> bool:
    """Autotuning runs on CUDA unless the environment sets ATTNKIT_AUTOTUNE=0 (saves compile time)."""
    return os.environ.get("ATTNKIT_AUTOTUNE", "1") != "0"


def smaller_configs(config: BlockConfig):
    """``config``, then what a default falls back to where it needs more shared memory than the GPU has
    (fp32 tiles take twice fp16's): two pipeline stages, then smaller tiles with 4 warps."""
    yield config
    if config.num_stages > 2:
        yield replace(config, num_stages=2)
    for block_m, block_n in ((64, 64), (64, 32), (32, 32)):
        if block_m * block_n < config.block_m * config.block_n:
            yield BlockConfig(block_m, block_n, 4, 2)


# fp32 tiles multiply in "ieee" precision: FMA code unrolled over BLOCK_M x BLOCK_N x the tile's head dim, whose
# compile time grows with that product (docs/head_dims.md, "Rule: fp32 tiles"). Their tiles stay within 64 x 64,
# and within 64 x 64 x 64 with the head dim (32 x 32 at 256).
FP32_TILE = 64 * 64
FP32_TILE_PRODUCT = FP32_TILE * 64


def untuned_configs(name: str, head_dim: int, itemsize: int) -> list[BlockConfig]:
    """The configurations launcher ``name`` tries in turn without autotuning, at this head dim and element
    size: its default, then ``smaller_configs``, the first that fits in shared memory running;
    4-byte (fp32) tiles within ``FP32_TILE`` and ``FP32_TILE_PRODUCT`` (larger ones are slow to compile)."""
    choices = list(smaller_configs(default_config(name, head_dim)))
    if itemsize >= 4:
        width = padded(head_dim)
        choices = [c for c in choices if c.block_m * c.block_n <= FP32_TILE
                   and c.block_m * c.block_n * width <= FP32_TILE_PRODUCT] or choices[-1:]
    return choices


def preprocess_rows() -> int:
    """Query rows a program of the backward's pre-pass (δ = rowsum(dO ∘ O)) takes: 64, 16 in the interpreter."""
    return INTERPRETER_CONFIG.block_m if triton_interprets() else 64


# ------------------------------------------------------------------------------ the forward's ladder
# "best": the fastest rung verified on the H100 (bench_flash.csv; docs/flash_notes.md). Where a rung's
# features are missing (the interpreter, GPUs below sm_90, a Triton without tensor descriptors or Gluon,
# strides TMA cannot take, windows, softcaps, packed sequences) it runs as the rung below it, down to
# pointer loads as "autotuned". BEST_TRITON: the fastest rung of the Triton kernel itself (what "best" runs
# where the Gluon kernel does not; the tools that compile, sweep and profile the Triton kernel use it).
BEST = "warp_specialized"
BEST_TRITON = "host_descriptors"


@functools.lru_cache(maxsize=None)
def descriptors_supported(device: torch.device) -> bool:
    """Tensor-descriptor (TMA) kernels run here: a compiled CUDA device of capability >= 9.0 and a
    Triton that has ``tl.make_tensor_descriptor`` (3.4 and newer). Asked once per device."""
    import triton
    import triton.language as tl

    if device.type != "cuda" or not hasattr(tl, "make_tensor_descriptor") or not hasattr(triton, "set_allocator"):
        return False
    return not triton_interprets() and torch.cuda.get_device_capability(device)[0] >= 9


def tma_compatible(*tensors) -> bool:
    """TMA needs a contiguous last dimension, 16-byte aligned bases and 16-byte multiples as strides."""
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
    return True


def host_descriptor_choice(causal: bool, head_dim: int, n_k: int, itemsize: int = 2) -> dict:
    """Where the host_descriptors rung uses its descriptor kernel: at a head dim whose row sets
    ``host_descriptors_from``, for elements of at most ``host_descriptors_itemsize`` bytes, causal at every
    length and non-causal from that many keys (docs/flash_notes.md, "Rule: descriptors built on the host");
    the autotuned pointer kernel elsewhere."""
    rules = exact_rules(head_dim)
    if rules is None or rules.host_descriptors_from is None or itemsize > rules.host_descriptors_itemsize:
        return dict(desc=False)
    return dict(desc=causal or n_k >= rules.host_descriptors_from)


def right_bounded(causal: bool, window) -> bool:
    """The band is bounded on the right (causal, or a window's right side). Query i then sees keys up to
    i + Nk - Nq + right, so a query block reads at least as many keys as the block before it when the
    left side is unbounded (with both sides bounded, as many but for the ends): the forward launches
    its blocks in reverse, the longest first (``Rung.longest_first``)."""
    return causal or window[1] >= 0


def effective_rung(rung: Rung, causal: bool, *tensors, plain: bool = True) -> Rung:
    """``rung`` for these tensors [B, H, N, D] (q, k, v, o): pointer loads where its rule says so, or
    where this device, Triton or the tensors' strides cannot take descriptors, or where the shapes are
    not ``plain`` (packed sequences, a head dim that is padded or differs between v and q)."""
    q, k = tensors[0], tensors[1]
    if rung.rule and not host_descriptor_choice(causal, q.shape[-1], k.shape[2], q.element_size())["desc"]:
        rung = replace(rung, desc=kernels.POINTERS)
    if rung.desc and not (plain and descriptors_supported(q.device) and tma_compatible(*tensors)):
        rung = replace(rung, desc=kernels.POINTERS)
    return rung


# ------------------------------------------------------------------- the warp-specialised Gluon forward
# The tiles' order (``hopper.tile_of``): (batch, head) pairs a group, by causal; head by head (1) measured
# fastest (bench_flash_tile_order.csv; docs/flash_notes.md, "Rule: tile order").
HEAD_GROUP = {False: 1, True: 1}
# Persistent programs where Nq and Nk are at most this (bench_flash_persistent.csv; docs/flash_notes.md,
# "Rule: persistent programs"); at every length non-causal at a head dim whose row sets persistent_non_causal
# (bench_flash_spread_persistent.csv).
PERSISTENT_UP_TO = 2048
PERSISTENT_CONFIG = (64, 128, 2, 2)      # (HALF_M, BLOCK_N, STAGES, groups): persistent programs run two groups


def warp_specialized_choice(causal: bool, head_dim: int, n_q: int, n_k: int) -> bool:
    """Where the warp_specialized rung runs the Gluon kernel (if these inputs are in its scope): from the
    shortest length of its row's ``gluon_forward_from`` on, where it was measured faster than the Triton
    forward (bench_flash_hopper.csv, bench_flash_persistent.csv; docs/flash_notes.md, "Rule: where the
    Gluon forward runs"). Lengths below those measured keep Triton."""
    rules = exact_rules(head_dim)
    if rules is None or rules.gluon_forward_from is None:
        return False
    return min(n_q, n_k) >= rules.gluon_forward_from[causal]


def hopper_unsupported(q, k, v, causal: bool, kernel: str = "warp-specialised forward") -> str | None:
    """Why the Gluon kernels cannot run these (already valid) inputs, naming the argument and the rule, or
    None: fp16/bf16, a head dim with a ``gluon_forward`` row for q, k and v, contiguous [B, H, N, D]
    tensors, causal with Nq <= Nk, an sm_90 GPU."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"q: dtype {q.dtype} is not supported by the {kernel}; use float16 or bfloat16"
    dims = head_dims_with("gluon_forward")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[-1] not in dims:
            return (f"{name}: head dim {t.shape[-1]} is not supported by the {kernel}; use "
                    f"{' or '.join(map(str, dims))}")
        if not t.is_contiguous():
            return f"{name}: the {kernel} needs a contiguous [B, H, N, D] tensor"
    if v.shape[-1] != q.shape[-1]:
        return f"v: head dim {v.shape[-1]} differs from q's {q.shape[-1]}; the {kernel} needs them equal"
    if causal and q.shape[2] > k.shape[2]:
        return f"q, k: causal attention here needs Nq <= Nk, got Nq = {q.shape[2]}, Nk = {k.shape[2]}"
    if sm_major(q.device) != 9:
        return f"q: the {kernel} runs on an sm_90 GPU (H100, H200), got device {q.device}"
    return None


def hopper_launch_config(q, k, causal: bool) -> tuple[int, int, int, int, bool]:
    """(half_m, block_n, stages, groups, persistent) for these inputs: persistent programs
    (``PERSISTENT_CONFIG``) where every tile is short (Nq and Nk up to PERSISTENT_UP_TO) or, not causal, at
    a head dim whose row sets persistent_non_causal, and there are more tiles than SMs, so that some
    program has a next tile to overlap; else one program a tile, the row's ``gluon_forward``."""
    batch, n_heads, n_q, head_dim = q.shape
    rules = HEAD_DIMS[head_dim]
    n_tiles = math.ceil(n_q / (2 * 64)) * batch * n_heads
    even_tiles = not causal and rules.persistent_non_causal
    if (max(n_q, k.shape[2]) <= PERSISTENT_UP_TO or even_tiles) and n_tiles > (sm_count(q.device) or n_tiles):
        return (*PERSISTENT_CONFIG, True)
    return (*rules.gluon_forward[causal], False)


HOPPER_PLANS: dict = {}      # hopper_plan's answers for the last kinds of inputs seen
HOPPER_PLANS_KEPT = 256


def hopper_plan(q, k, v, causal: bool) -> tuple[str | None, tuple | None]:
    """(``hopper_unsupported``'s reason, ``hopper_launch_config``'s configuration or None) for these
    (already valid) inputs, worked out once per kind of input: both depend only on the key below and on
    the device's compute capability and SM count (each read once per GPU)."""
    key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, q.is_contiguous(), k.is_contiguous(),
           v.is_contiguous(), causal)
    found = HOPPER_PLANS.get(key)
    if found is None:
        reason = hopper_unsupported(q, k, v, causal)
        found = (reason, None if reason else hopper_launch_config(q, k, causal))
        keep_recent(HOPPER_PLANS, key, found, HOPPER_PLANS_KEPT)
    return found


def gluon_forward_plan(q, k, v, causal: bool):
    """(the Gluon forward's module, its configuration) where ``warp_specialized_choice`` picks it and it can
    run these inputs (plain, CUDA, sm_90, contiguous, fp16/bf16) with a Triton that has Gluon's Hopper API;
    (None, None) otherwise."""
    if sm_major(q.device) != 9 or not warp_specialized_choice(causal, q.shape[-1], q.shape[2], k.shape[2]):
        return None, None
    hopper = gluon_module("hopper")
    if hopper is None:
        return None, None
    reason, config = hopper_plan(q, k, v, causal)
    return (None, None) if reason else (hopper, config)


# ------------------------------------------------------------------------------------ the backward
# The default: the one pass, the fastest design against cuDNN's backward on the H100
# (bench_flash_spread_backward.csv; docs/flash_notes.md, "Rule: the default backward"); everywhere else both
# defaults are the two-kernel design. Its dQ additions land in no fixed order, so with
# torch.use_deterministic_algorithms(True) the default is DETERMINISTIC_BACKWARD (the dK/dV kernel in
# Gluon, dQ by the Triton dQ kernel: no additions race).
DEFAULT_BACKWARD = "warp_specialized_atomic"
DETERMINISTIC_BACKWARD = "warp_specialized"
BACKWARD_ENV = "ATTNKIT_FLASH_BACKWARD"
# The Gluon backward: how the one pass adds dQ ("tma": a writer warp's TMA bulk reductions; docs/flash_notes.md,
# "Rule: dQ by TMA reductions") and whether a program walks its query blocks from the last down
# (docs/flash_notes.md, "Rule: query-block order").
GLUON_DQ_WRITER = "tma"
GLUON_DESCENDING = True


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


def backward_do(do: torch.Tensor) -> torch.Tensor:
    """dO as the backward's kernels take it: contiguous. The fast paths (the Gluon kernels' TMA, the Triton
    kernels' host-built descriptors) need a contiguous dO, and a dO from ``o.sum().backward()`` is expanded
    (stride 0): copying its B · H · N · Dv elements costs far less than the pointer kernels it would otherwise
    run (docs/flash_notes.md, "Rule: broadcast output gradients")."""
    return do if do.is_contiguous() else do.contiguous()


def backward_descriptors(desc, design: str, packed: bool, *tensors) -> int:
    """DESC for the backward kernels: HOST_DESCRIPTORS where asked (``desc``; None: the design's own
    ``descriptors`` where the head dim's row allows them) and possible for these [B, H, N, D] views
    (q, k, v, do, dq, dk, dv), else POINTERS."""
    q, v = tensors[0], tensors[2]
    wanted = BACKWARDS[design].descriptors and head_dim_rules(q.shape[-1]).backward_descriptors if desc is None \
        else desc
    plain = not packed and q.shape[-1] == v.shape[-1] == padded(q.shape[-1])
    if wanted and plain and descriptors_supported(q.device) and tma_compatible(*tensors):
        return kernels.HOST_DESCRIPTORS
    return kernels.POINTERS


def warp_specialized_backward_choice(head_dim: int, n_q: int, n_k: int) -> bool:
    """Where the warp_specialized backward design runs the Gluon dK/dV kernel (if the inputs are in its
    scope): from its row's ``gluon_backward_from`` on, where the whole backward was measured faster than
    with the Triton two-kernel design (bench_flash_hopper_backward.csv; docs/flash_notes.md, "Rule: where
    the Gluon backward runs")."""
    rules = exact_rules(head_dim)
    return rules is not None and rules.gluon_backward_from is not None and min(n_q, n_k) >= rules.gluon_backward_from


def gluon_backward_unsupported(q, k, v, causal: bool) -> str | None:
    """Why the Gluon backward cannot run these (already valid) inputs, or None: the forward's scope."""
    return hopper_unsupported(q, k, v, causal, kernel="warp-specialised backward")


def gluon_backward_config(head_dim: int) -> tuple | None:
    """(BLOCK_M, PART_N, STAGES, groups) of the Gluon backward at this head dim (its row's), or None."""
    rules = exact_rules(head_dim)
    return rules and rules.gluon_backward


def gluon_backward_module(q4, k4, v4, do4, causal: bool, windowed: bool, softcap: bool, packed: bool):
    """The Gluon backward's module where it can run these [B, H, N, D] views: an sm_90 GPU, a Triton with
    Gluon's Hopper API, plain contiguous inputs in its scope, no window, softcap or packed sequences; None
    elsewhere."""
    if packed or windowed or softcap or sm_major(q4.device) != 9 or not do4.is_contiguous():
        return None
    module = gluon_module("hopper_backward")
    if module is None or gluon_backward_unsupported(q4, k4, v4, causal):
        return None
    return module


# ------------------------------------------------------------------------------------ the FP8 forward
# The descriptor kernel's configuration by causal flag, the fastest of the sweep (bench_flash_fp8_sweep.csv,
# scripts/gpu_flash_fp8.py --sweep; docs/flash_notes.md, "Rule: FP8 configurations"); pointer loads need more
# registers, hence larger tiles with 8 warps there (not swept).
FP8_GPU_CONFIGS = {False: BlockConfig(64, 128, 4, 2), True: BlockConfig(64, 128, 4, 3)}
FP8_POINTER_CONFIG = BlockConfig(128, 64, 8, 3)


def fp8_config(causal: bool, descriptors: bool, config: BlockConfig | None = None) -> BlockConfig:
    """The FP8 forward's launch configuration: ``config`` if given, else ``FP8_GPU_CONFIGS[causal]`` with
    descriptors and ``FP8_POINTER_CONFIG`` without; in the interpreter always ``INTERPRETER_CONFIG``."""
    if triton_interprets():
        return INTERPRETER_CONFIG
    if config is not None:
        return config
    return FP8_GPU_CONFIGS[causal] if descriptors else FP8_POINTER_CONFIG


def fp8_descriptors_usable(q8, k8, n_k: int) -> bool:
    """Host-built tensor descriptors (TMA) for the FP8 forward: compiled CUDA of capability >= 9.0, a Triton
    that has them, q8 and k8 with a contiguous head dim and 16-byte aligned strides, and Nk a multiple of 16
    (the row stride of V transposed is Nk bytes)."""
    import triton.language as tl

    if q8.device.type != "cuda" or triton_interprets() or not hasattr(tl, "make_tensor_descriptor"):
        return False
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    if torch.cuda.get_device_capability(q8.device)[0] < 9 or n_k % 16:
        return False
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(st % 16 == 0 for st in t.stride()[:-1])
               for t in (q8, k8))


# ------------------------------------------------------------------------------ loading Gluon's kernels
# The Gluon modules whose kernels failed to build or launch in this process: Gluon's API moves between
# Triton versions (the kernels are written for 3.6), so on another Triton the Triton kernels run instead.
GLUON_FAILED: set[str] = set()


def gluon_failed(module_name: str, exc: Exception) -> None:
    """Remember that ``module_name``'s Gluon kernels do not work with this Triton, and say so once."""
    import triton

    GLUON_FAILED.add(module_name)
    first_line = (str(exc).splitlines() or [""])[0][:200]
    warnings.warn(f"{module_name}: the Gluon kernel failed with Triton {triton.__version__} "
                  f"({type(exc).__name__}: {first_line}); the Triton kernels run instead",
                  RuntimeWarning, stacklevel=4)


def run_gluon(module, launch):
    """launch()'s result, or None (after one RuntimeWarning naming the module, the Triton version and the
    error; the module is not tried again in this process) when it raises anything but running out of GPU
    memory."""
    try:
        return launch()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:            # a Gluon API this Triton does not have, or has with other arguments
        gluon_failed(module.__name__, exc)
        return None


GLUON_MODULES = ("hopper", "hopper_backward")


def gluon_module(name: str):
    """attnkit.kernels.flash.<name>, one of ``GLUON_MODULES``, imported here on first use: the package's one
    import that may fail, since older Triton has no Gluon Hopper API (then None, silently). None too when
    importing it fails otherwise (with ``run_gluon``'s warning), or after its kernels failed in this process
    (``GLUON_FAILED``)."""
    if name not in GLUON_MODULES:
        raise ValueError(f"name: expected one of {GLUON_MODULES}, got {name!r}")
    module_name = f"{__package__}.{name}"
    if module_name in GLUON_FAILED:
        return None
    try:
        if name == "hopper":
            from . import hopper as module
        else:
            from . import hopper_backward as module
    except (ImportError, AttributeError):     # a Triton without Gluon's Hopper API, or an older one of it
        return None
    except Exception as exc:                  # a Gluon whose decorators or layouts take other arguments
        gluon_failed(module_name, exc)
        return None
    return module
