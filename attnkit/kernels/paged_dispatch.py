"""Every rule that picks the paged decode's launch (``attnkit.kernels.paged``), in one place: the register
tiles of a head dim (``padded``, ``head_dim_tiles``), the launch configurations (``LaunchConfig``, one table
``GPU_CONFIGS`` keyed by variant, cache and head-dim class: ``head_dim_class``, ``default_config``;
``INTERPRETER_CONFIG`` in Triton's interpreter) and the row alignment the kernels are told
(``row_alignment``). The number of splits a call gets is ``paged.choose_num_splits`` (it reads the GPU's
SM count). Each configuration's comment names the recorded sweep behind it (attnkit/bench/results/;
docs/paged_notes.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..device import ensure_triton_backend, triton_interprets
from .fp8_cache import FP8

ensure_triton_backend()

import triton  # noqa: E402


def padded(head_dim: int) -> int:
    """A tile's head dim: the next power of two (tl.arange's sizes), at least 16 (tl.dot's smallest K)."""
    return max(16, triton.next_power_of_2(head_dim))


def head_dim_tiles(head_dim: int) -> tuple[int, int]:
    """The register tiles of a head dim: (``padded(head_dim)``, 0), or two powers of two (first, second)
    that cover it with fewer padded columns: the largest power of two below it, then the rest padded to
    at least 32 (80 and 96: 64 + 32; 192: 128 + 64; 112 and 120 stay one tile of 128, as 64 + 64 would
    be). At least 32: a tile of 16 columns gave p·v a product that every warp computed whole, and ptxas
    for sm_90 ran out of registers (docs/paged_notes.md, "What the compiled code showed")."""
    whole = padded(head_dim)
    first = whole // 2
    second = max(32, padded(head_dim - first))
    return (first, second) if first + second < whole else (whole, 0)


@dataclass(frozen=True)
class LaunchConfig:
    """Tokens per loop iteration, warps per program and software-pipelining depth."""

    block_n: int
    num_warps: int
    num_stages: int


INTERPRETER_CONFIG = LaunchConfig(16, 1, 1)   # small blocks: ragged lengths span several blocks

# Every launch configuration on a GPU, in this one table: (variant, cache, head-dim class) -> config.
# cache: "fp8" for a float8_e4m3fn cache, "16" for fp16/bf16/fp32 ones; the head-dim class of (D, Dv) is
# ``head_dim_class``. Each entry is the fastest configuration of the recorded sweep named beside it
# (attnkit/bench/results/; for a class of several head sizes, the one whose slowest head size is the
# fastest), or, where nothing was swept, the rule named beside it. ``scripts/gpu_paged.py`` re-runs
# every sweep: ``--mode record`` (fp16, D = 128), ``--mode fp8``, ``--mode headdims``.
GPU_CONFIGS = {
    # bench_paged_headdims.csv, rows D = Dv = 64 and 128 (B = 64, context 4096): block_n 128, 4 warps
    ("grouped", "16", "narrow"): LaunchConfig(128, 4, 3),
    # bench_paged_headdims.csv, rows D = Dv = 80, 96, 112, 120: block_n 64, 4 warps is the fastest at each
    ("grouped", "16", "narrow_padded"): LaunchConfig(64, 4, 3),
    # bench_paged_headdims.csv, rows D = 192, Dv = 128: block_n 128, 4 warps
    ("grouped", "16", "wide_qk"): LaunchConfig(128, 4, 3),
    # bench_paged_headdims.csv, rows D = Dv = 192: block_n 128, 4 warps; D = Dv = 256: block_n 64, 4 warps
    ("grouped", "16", "wide"): LaunchConfig(128, 4, 3),
    ("grouped", "16", "widest"): LaunchConfig(64, 4, 3),
    # bench_paged_fp8_ratio.csv, kind "sweep" (B = 64, context 4096): block_n 128, 4 warps
    ("grouped", "fp8", "narrow"): LaunchConfig(128, 4, 3),
    # not swept with an fp8 cache: the fp16 cache's (an fp8 tile holds fewer bytes, the same registers)
    ("grouped", "fp8", "narrow_padded"): LaunchConfig(64, 4, 3),
    ("grouped", "fp8", "wide_qk"): LaunchConfig(128, 4, 3),
    ("grouped", "fp8", "wide"): LaunchConfig(128, 4, 3),
    ("grouped", "fp8", "widest"): LaunchConfig(64, 4, 3),
    # the sweep of scripts/gpu_paged.py --mode record on the H100 (docs/paged_notes.md, "Sweeps")
    ("per_head", "16", "narrow"): LaunchConfig(128, 4, 2),
    ("per_head", "fp8", "narrow"): LaunchConfig(128, 4, 2),
    # not swept: the narrow entries' (the same tile width)
    ("per_head", "16", "narrow_padded"): LaunchConfig(128, 4, 2),
    ("per_head", "fp8", "narrow_padded"): LaunchConfig(128, 4, 2),
    # not swept: the rule of the wide grouped entries (no spills at 32 tokens; tests/kernels/test_paged_host.py)
    ("per_head", "16", "wide_qk"): LaunchConfig(32, 4, 2),
    ("per_head", "16", "wide"): LaunchConfig(32, 4, 2),
    ("per_head", "16", "widest"): LaunchConfig(32, 4, 2),
    ("per_head", "fp8", "wide_qk"): LaunchConfig(32, 4, 2),
    ("per_head", "fp8", "wide"): LaunchConfig(32, 4, 2),
    ("per_head", "fp8", "widest"): LaunchConfig(32, 4, 2),
}


def head_dim_class(head_dim: int, head_dim_v: int | None = None) -> str:
    """"narrow": D and Dv padded to at most 128, both powers of two; "narrow_padded": the same but one of them
    padded (80-120: their sweep's fastest tiles differ); "wide_qk": D padded past 128, Dv not (DeepSeek's
    192/128); "wide": Dv padded past 128, at most 192; "widest": Dv above 192 (``padded``: the next power of
    two, at least 16; 192 and 256 share a padded tile but not their fastest configuration)."""
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    if padded(head_dim_v) > 128:
        return "wide" if head_dim_v <= 192 else "widest"
    if padded(head_dim) > 128:
        return "wide_qk"
    return "narrow" if (head_dim, head_dim_v) == (padded(head_dim), padded(head_dim_v)) else "narrow_padded"


def default_config(variant: str, cache_dtype, head_dim: int = 128, head_dim_v: int | None = None) -> LaunchConfig:
    """The launch configuration of ``variant`` for a cache of ``cache_dtype`` and head dims D = ``head_dim``,
    Dv = ``head_dim_v`` (None: D) where the kernels run now: ``GPU_CONFIGS`` on a GPU."""
    if triton_interprets():
        return INTERPRETER_CONFIG
    return GPU_CONFIGS[(variant, "fp8" if cache_dtype == FP8 else "16", head_dim_class(head_dim, head_dim_v))]


def row_alignment(t: torch.Tensor) -> int:
    """The largest power of two, at most 16, that divides every stride of ``t`` but its last, and every one
    ``t`` would have if copied contiguously (a launch that copies its inputs first passes such a copy): every
    row offset the kernels compute (index · stride, summed) is a multiple of it. 16 when all are 0."""
    g = 0
    shape = t.shape
    contiguous = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        contiguous[i] = contiguous[i + 1] * shape[i + 1]
    for stride in (*t.stride()[:-1], *contiguous[:-1]):
        g = math.gcd(g, stride)
    return 16 if g == 0 else min(16, g & -g)
