"""Head dims other than 64 and 128 on the GPU (issue 40, items 1, 4 and 5): the course's FlashAttention as
dispatched today beside cuDNN, then a sweep of the Triton kernels' launch configurations for the head dims
that stay below 0.9x cuDNN, the FP8 forward beside fp16, and packed sequences beside cuDNN on the padded
batch. One process times everything side by side; parallel processes compile and check first.

    python scripts/gpu_flash_headdims.py OUTDIR                  # H100: under 8 minutes (--budget, default 450 s)
    python scripts/gpu_flash_headdims.py OUTDIR --quick          # fp16, N = 4096 alone, fewer candidates: 5 min
    python scripts/gpu_flash_headdims.py OUTDIR --cpu --tiny     # the same logic in Triton's interpreter, tiny
    python scripts/gpu_flash_headdims.py OUTDIR --report         # markdown tables from OUTDIR's CSVs
    python scripts/gpu_flash_headdims.py OUTDIR --ptxas          # no GPU: registers and spills of the candidates
    options: --budget S  --workers K  --dims 80,96,192  --dtypes float16  --sweep-all | --no-sweep  --rounds R

What runs where. On an sm_90 GPU the dispatch sends D = 64 and 128 (q, k and v alike) to the warp-specialised
Gluon kernels, forward and backward; every other head dim runs the Triton kernels, each tile's head dim
padded in registers to the next power of two (D = 80, 96, 112 compute as 128; D = 192 as 256, its v at 128)
with masked loads, pointer tiles (tensor descriptors only at a power-of-two head dim shared by q and v), the
forward autotuned among the pointer launcher's candidates (D = 256 tiles: its one default), the backward the
two-kernel design, autotuned the same way. ``dispatch_path`` writes that into every row.

Phases (each rewrites its CSVs when a case is done, so a run cut short keeps what it measured):
1. prepare (``--workers`` processes, default one per core but one, up to 15): every work item compiled and
   checked once, highest priority first, until half the budget is spent: the dispatched forward and backward
   per (dtype, D, causal) (and, for the Gluon head dims, once at each timed N: the Gluon forward's kernel
   depends on N); the FP8 forward; the packed forward; each sweep candidate. A check compares o (and dq, dk,
   dv) with torch's math SDPA in float32 on B = 2, H = 16, N = 1008 (ragged against every tile; the same
   compiled specialisation as the timed shapes: B > 1 and not a multiple of 16, H = 16, N a multiple of 16)
   with every output buffer of the kernels poisoned with NaN: relative error ‖out − ref‖ / ‖ref‖ within
   ``attnkit.tolerances.tolerance`` of the dtype. Where the kernel depends on N (the Gluon forward at D = 128,
   for the dispatch and "pad128"; the FP8 forward) it is also checked at every timed N with B = 2: o and dq
   of the last 128 queries of batch 0, heads 0-1. Only what passed is timed; the main process then finds
   every kernel in Triton's on-disk cache.
2. baseline (suite "baseline"): D in (80, 96, 112, 128, (192, Dv = 128), 256), causal and not, N in (2048,
   4096, 16384) with B = 8, 4, 2 and H = 16 (2048-4096 programs of 128 queries: every SM busy), fp16 then
   bf16 (bf16 last: it is timed only if the budget allows). Forward under no_grad and backward through
   autograd (torch.autograd.grad with a random dO), the course's ``flash_attention`` and SDPA pinned to
   cuDNN, in ``rounds`` interleaved rounds: each round times each of the four once with
   triton.testing.do_bench (median); a row's time is the median of its rounds, ``spread`` (max - min) / median.
3. FP8 (suite "fp8"): D = 128, N = 4096 and 16384, causal and not: ``flash_attention_fp8`` on inputs
   quantised once beforehand (the quantisation timed alone: impl "fp8_quantize") beside the course's fp16
   forward and cuDNN's; rel_err against float32 attention of the fp16 inputs (the last 128 queries of batch 0,
   heads 0-1, against every key).
4. packed (suite "varlen"): 64 sequences of 128-4096 tokens (torch.randint, seed 0: the lengths of
   scripts/gpu_flash_features.py), H = 16, D = 128, causal, fp16, forward: ``flash_attention_varlen`` beside
   cuDNN and the course's dense kernel on the batch padded to the longest, and cuDNN on a nested (jagged)
   tensor where this torch takes one. ``bound`` = padded pairs / useful pairs; issue 40's target: varlen
   >= 0.85 x bound x cuDNN padded's speed. TFLOP/s count the useful pairs.
5. sweep (suites "sweep_fwd", "sweep_bwd"; fp16): for each head dim whose fp16 baseline is below 0.9x cuDNN
   anywhere (or every non-Gluon one with --sweep-all), at each N and causal flag, interleaved (``sweep_rounds``
   rounds): cuDNN, the dispatched path, and every candidate that passed its check. Forward: the pointer
   launcher "fwd" at each configuration of ``FULL_CANDIDATES`` (--quick: ``QUICK_CANDIDATES``), descriptor
   tiles "fwd_desc" at D = 256, and "pad128": q, k, v zero-padded to 128 on the host (sm_scale 1/sqrt(D)
   kept), the D = 128 dispatch run on them (the Gluon kernel on the H100), the output sliced back, the copies
   included. Backward: "bwd_dkdv" candidates with the dQ kernel at its default and "bwd_dq" candidates with
   dK/dV at its default (design two_kernels), "bwd_atomic" (design atomic_dq), "pad128" through autograd,
   and last "two_kernels_best", the fastest dK/dV and dQ together. The backward's o and lse come from the
   dispatched forward; its candidates and "dispatch" are timed as the backward kernels alone (no autograd),
   cuDNN through autograd.
Printed last: per (D, causal, N, direction) the fastest verified candidate with its ratio to cuDNN, and per
(D, direction) the candidate with the smallest geometric-mean time over the cases (``headdims_best.json``).

FLOPs: 2·B·H·Nq·Nk·(D + Dv) (4·B·H·N²·D when Dv = D), halved for causal, x 2.5 for the backward. vs_cudnn is
cuDNN's time ÷ this row's time (above 1: faster than cuDNN) on the same inputs in the same round robin.
Files in OUTDIR (through attnkit.bench.recorder.write_results: GPU, date, torch, Triton, CUDA and cuDNN
versions on every row): bench_flash_headdims.csv (baseline, fp8, varlen), bench_flash_headdims_sweep.csv,
bench_flash_headdims_checks.csv (each work item's check and its seconds in phase 1: the next run's budget),
headdims_best.json, headdims_log.txt.

--cpu --tiny: tiny shapes in Triton's interpreter, checks and the whole pipeline without cuDNN (its rows say
why), wall-clock times (meaningless as speeds; the interpreter also ignores block configurations, running
one small fixed one): tests/bench/test_gpu_flash_headdims.py runs it.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

if "--cpu" in sys.argv:                        # decided before Triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
elif "--ptxas" in sys.argv:                    # compiles for sm_90a on any machine: never the interpreter
    os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attnkit  # noqa: E402
from attnkit.bench.recorder import provenance, time_ms, write_results  # noqa: E402
from attnkit.kernels import flash  # noqa: E402
from attnkit.tolerances import rel_error, tolerance  # noqa: E402

BELOW = 0.9                                    # issue 40's target: >= 0.9x cuDNN; a head dim below is swept
GLUON_HEAD_DIMS = (64, 128)                    # D = Dv that the sm_90 dispatch sends to the Gluon kernels
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
DESIGN_OF = {"bwd_dkdv": "two_kernels", "bwd_dq": "two_kernels", "bwd_atomic": "atomic_dq"}
PARTNER = {"bwd_dkdv": "bwd_dq", "bwd_dq": "bwd_dkdv"}
START = time.perf_counter()
LOG: list[str] = []


def log(*args) -> None:
    line = f"[{time.perf_counter() - START:6.1f} s] " + " ".join(str(a) for a in args)
    LOG.append(line)
    print(line, flush=True)


# ------------------------------------------------------------------------------ the kernels' internals
# Every call into the flash package's internal API (documented there for tests and scripts) is in this section:
# a forward with one fixed launch configuration, a backward design with fixed configurations, the output
# buffers the checks poison. Each is looked up in the sub-package's modules (attnkit/kernels/flash/) first and
# in the single module the package replaced second, so the script runs on either layout.
def _internal(*paths):
    """The first of ``paths`` ("module:name", module relative to attnkit.kernels.flash, "" for the package
    itself) that exists, as (module, name, object)."""
    for path in paths:
        module_name, name = path.split(":")
        try:
            module = importlib.import_module("attnkit.kernels.flash" + ("." + module_name if module_name else ""))
        except ImportError:
            continue
        if hasattr(module, name):
            return module, name, getattr(module, name)
    raise AttributeError(f"none of {paths} exists: update the internal entry points of scripts/gpu_flash_headdims.py")


def block_config(m, n, warps, stages):
    return _internal("dispatch:BlockConfig", ":BlockConfig")[2](m, n, warps, stages)


def default_config(launcher: str, d: int, dv: int):
    """The launcher's configuration without autotuning at these head dims (the larger one's row decides)."""
    return _internal("dispatch:default_config", ":default_config")[2](launcher, max(d, dv))


def forward_with_config(q, k, v, causal: bool, config, desc: bool = False):
    """(o, lse) of the Triton forward with one fixed launch configuration: pointer tiles, or host-built
    descriptors where ``desc`` and the tensors allow (D = Dv a power of two, sm_90)."""
    variants = _internal("dispatch:VARIANTS", ":VARIANTS")[2]
    rung = replace(variants["host_descriptors" if desc else "autotuned"], rule=False)
    run = _internal("forward:forward_rung", ":_forward_rung")[2]
    return run(q, k, v, causal, 1 / math.sqrt(q.shape[-1]), rung, config)


def backward_with_configs(do, q, k, v, o, lse, causal: bool, design: str, configs: dict):
    """(dq, dk, dv) of the backward ``design`` with each launcher in ``configs`` fixed (the others autotuned);
    tiles as the dispatch moves them."""
    run = _internal("backward:backward", ":_backward")[2]
    return run(do, q, k, v, o, lse, causal, 1 / math.sqrt(q.shape[-1]), design=design, configs=configs)


class poisoned_outputs:
    """Within it every buffer the flash kernels write starts as NaN: an element left unwritten fails a check."""

    def __enter__(self):
        self.module, self.name, self.saved = _internal("layout:new_buffer", ":_new_buffer")
        setattr(self.module, self.name,
                lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.saved)


# ------------------------------------------------------------------------------------------- the plan
def padded(d: int) -> int:
    """A tile's head dim in the Triton kernels: the next power of two, at least 16."""
    return max(16, 1 << (d - 1).bit_length())


def dispatch_path(d: int, dv: int, device: str) -> str:
    """What the dispatch runs at these head dims (module docstring), for the rows."""
    if device == "cuda" and d == dv and d in GLUON_HEAD_DIMS and torch.cuda.get_device_capability()[0] == 9:
        return f"gluon D={d} (Triton below the Gluon thresholds)"
    tiles = "descriptors" if d == dv == padded(d) and d in GLUON_HEAD_DIMS else "pointers"
    return f"triton {tiles}, tile D={padded(d)}" + (f" Dv={padded(dv)}" if dv != d else "") + ", autotuned"


# Sweep candidates (BLOCK_M, BLOCK_N, num_warps, num_stages) by the tiles' padded (D, Dv); each launcher's
# first is its default without autotuning (the backward checks' forward uses "fwd"'s first). At 128 the
# forward's are four of today's autotuning candidates (compiled for the baseline anyway) and the two next
# fastest of the D = 128 pointer sweep (bench_flash_sweep.csv); the backward's, the fastest of that sweep per
# kernel. At 256 the configurations ptxas compiles without serialising products (scripts/gpu_flash_sweep.py,
# CANDIDATES_D256) and, for Dv = 128 (half of v's shared memory), deeper pipelines and wider key tiles.
FULL_CANDIDATES = {
    (128, 128): {"fwd": [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 3), (128, 128, 8, 2),
                         (128, 32, 4, 4)],
                 "bwd_dkdv": [(64, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 4)],
                 "bwd_dq": [(128, 64, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3)],
                 "bwd_atomic": [(64, 128, 8, 3), (64, 128, 8, 2)]},
    (256, 128): {"fwd": [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3)],
                 "bwd_dkdv": [(64, 32, 4, 2), (32, 32, 4, 2), (64, 64, 4, 2)],
                 "bwd_dq": [(64, 32, 4, 2), (64, 64, 8, 2), (32, 64, 4, 2)],
                 "bwd_atomic": [(32, 32, 4, 2), (64, 32, 8, 2)]},
    (256, 256): {"fwd": [(128, 64, 8, 2), (128, 32, 8, 2), (64, 64, 4, 2), (64, 32, 4, 2)],
                 "fwd_desc": [(128, 64, 8, 2), (64, 64, 4, 2)],
                 "bwd_dkdv": [(64, 32, 4, 2), (32, 32, 4, 2), (64, 32, 8, 2)],
                 "bwd_dq": [(64, 32, 4, 2), (64, 64, 8, 2), (32, 64, 4, 2)],
                 "bwd_atomic": [(32, 32, 4, 2), (64, 32, 8, 2)]},
}
QUICK_CANDIDATES = {
    (128, 128): {"fwd": [(128, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3)],
                 "bwd_dkdv": [(64, 128, 8, 3), (32, 64, 4, 3)], "bwd_dq": [(128, 64, 8, 3), (64, 32, 4, 3)],
                 "bwd_atomic": [(64, 128, 8, 3)]},
    (256, 128): {"fwd": [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2)], "bwd_dkdv": [(64, 32, 4, 2)],
                 "bwd_dq": [(64, 32, 4, 2)], "bwd_atomic": [(32, 32, 4, 2)]},
    (256, 256): {"fwd": [(128, 64, 8, 2), (128, 32, 8, 2)], "fwd_desc": [(128, 64, 8, 2)],
                 "bwd_dkdv": [(64, 32, 4, 2)], "bwd_dq": [(64, 32, 4, 2)], "bwd_atomic": [(32, 32, 4, 2)]},
}
TINY_CANDIDATES = {key: {"fwd": [(16, 16, 1, 1), (32, 16, 1, 1)], "bwd_dkdv": [(16, 16, 1, 1)],
                         "bwd_dq": [(16, 16, 1, 1)], "bwd_atomic": [(16, 16, 1, 1)]}
                   for key in ((128, 128), (256, 128), (256, 256))}


@dataclass(frozen=True)
class Plan:
    """Sizes, candidates and budget of one run."""

    device: str
    head_dims: tuple                   # ((D, Dv), ...)
    dtypes: tuple                      # dtype names, in timing order
    lengths: tuple                     # N of the baseline
    sweep_lengths: tuple               # N of the sweep
    batch: dict                        # N -> B
    heads: int
    check: tuple                       # (B, H, N) of the checks
    candidates: dict                   # (padded D, padded Dv) -> launcher -> [(m, n, warps, stages)]
    rounds: int
    sweep_rounds: int
    fp8_lengths: tuple
    varlen: tuple                      # (sequences, shortest, longest)
    budget_s: float
    workers: int
    warmup_ms: float = 5.0
    rep_ms: float = 25.0
    sweep: str = "below"               # "below" (head dims under BELOW), "all", "none"
    prepare_share: float = 0.5         # of the budget, at most, for phase 1 (--quick: 0.6)
    stall_s: float = 90.0              # phase 1 stops when no item finishes for this long
    tasks_per_worker: int = 12         # items a phase 1 process checks before a fresh one replaces it

    def batch_of(self, n: int) -> int:
        return self.batch[n]


def make_plan(kind: str, *, budget=None, workers=None, dims=None, rounds=None, sweep="below", dtypes=None) -> Plan:
    """The plan of a run: "full", "quick" (GPU) or "tiny" (CPU interpreter)."""
    if kind not in ("full", "quick", "tiny"):
        raise ValueError(f"kind: expected 'full', 'quick' or 'tiny', got {kind!r}")
    head_dims = ((80, 80), (96, 96), (112, 112), (128, 128), (192, 128), (256, 256))
    if dims:
        known = {d: (d, dv) for d, dv in head_dims}
        unknown = [d for d in dims if d not in known]
        if unknown:
            raise ValueError(f"dims: each must be one of {sorted(known)}, got {unknown}")
        head_dims = tuple(known[d] for d in dims)
    cores = os.cpu_count() or 2
    if kind == "tiny":
        plan = Plan(device="cpu", head_dims=head_dims, dtypes=("float16", "bfloat16"), lengths=(32,),
                    sweep_lengths=(32,), batch={32: 2, 48: 2}, heads=2, check=(1, 2, 24),
                    candidates=TINY_CANDIDATES, rounds=1, sweep_rounds=1, fp8_lengths=(48,), varlen=(3, 5, 24),
                    budget_s=600.0, workers=0)
    else:
        quick = kind == "quick"
        plan = Plan(device="cuda", head_dims=head_dims, dtypes=("float16",) if quick else ("float16", "bfloat16"),
                    lengths=(4096,) if quick else (2048, 4096, 16384),
                    sweep_lengths=(4096,) if quick else (2048, 4096, 16384),
                    batch={2048: 8, 4096: 4, 16384: 2}, heads=16, check=(2, 16, 1008),
                    candidates=QUICK_CANDIDATES if quick else FULL_CANDIDATES, rounds=3, sweep_rounds=2,
                    fp8_lengths=(4096, 16384), varlen=(64, 128, 4096), budget_s=300.0 if quick else 450.0,
                    workers=max(1, min(15, cores - 1)), prepare_share=0.6 if quick else 0.5)
    changes = dict(sweep=sweep)
    if dtypes:
        unknown = [x for x in dtypes if x not in DTYPES]
        if unknown or "float16" not in dtypes:
            raise ValueError(f"dtypes: each must be one of {list(DTYPES)}, float16 among them (the sweep's), "
                             f"got {list(dtypes)}")
        changes["dtypes"] = ("float16", *(x for x in dtypes if x != "float16"))
    if budget is not None:
        changes["budget_s"] = float(budget)
    if workers is not None:
        changes["workers"] = int(workers)
    if rounds is not None:
        changes["rounds"] = changes["sweep_rounds"] = int(rounds)
    for n in plan.lengths + plan.sweep_lengths + plan.fp8_lengths:
        b = plan.batch.get(n)
        # the check's kernels must be the ones timed: Triton specialises an integer argument equal to 1 or
        # divisible by 16, so every timed B is neither (as the check's B = 2)
        if b is None or b == 1 or b % 16 == 0:
            raise ValueError(f"batch: B for N = {n} must be given, above 1 and not a multiple of 16, got {b}")
    return replace(plan, **changes)


# --------------------------------------------------------------------------------------- work items
@dataclass(frozen=True)
class Item:
    """One thing to compile and check (phase 1) and later time: ``kind`` "dispatch" and "dispatch_bwd" (the
    public forward and backward, two items so that two processes compile their autotuning candidates),
    "fp8", "varlen", "pad128" (the D = 128 dispatch on zero-padded inputs), or a launcher of the sweep
    ("fwd", "fwd_desc", "bwd_dkdv", "bwd_dq", "bwd_atomic") with ``config``."""

    kind: str
    d: int
    dv: int
    causal: bool
    dtype: str
    config: tuple | None = None

    @property
    def key(self) -> str:
        cfg = "" if self.config is None else " " + config_name(self.config)
        return f"{self.kind} D={self.d} Dv={self.dv} causal={self.causal} {self.dtype}{cfg}"

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(data: dict) -> Item:
        config = data.get("config")
        return Item(**{**data, "config": None if config is None else tuple(config)})


def config_name(config) -> str:
    m, n, w, s = config
    return f"{m}x{n} w{w} s{s}"


# The order phase 1 prepares the sweep's head dims in, so that a budget cut leaves out the least needed: the
# lowest forward ratio to cuDNN first, as issue 40 quotes them (docs/head_dims.md); 112 was not quoted.
SWEEP_PRIORITY = (192, 80, 256, 96, 112)


def sweep_dims(plan: Plan) -> list:
    """The head dims a sweep may cover: those the dispatch does not send to the Gluon kernels, in
    ``SWEEP_PRIORITY`` order."""
    dims = [(d, dv) for d, dv in plan.head_dims if not (d == dv and d in GLUON_HEAD_DIMS)]
    return sorted(dims, key=lambda dims: SWEEP_PRIORITY.index(dims[0]) if dims[0] in SWEEP_PRIORITY else 99)


def sweep_items(plan: Plan, d: int, dv: int, causal: bool) -> list:
    """The candidates of one (D, causal) sweep, fp16."""
    items = []
    for launcher, configs in plan.candidates[(padded(d), padded(dv))].items():
        items += [Item(launcher, d, dv, causal, "float16", tuple(c)) for c in configs]
    if d == dv and d < 128:
        items.append(Item("pad128", d, dv, causal, "float16"))
    return items


def work_items(plan: Plan) -> list:
    """Every item, highest priority first: the fp16 dispatch, FP8, packed, the sweep, the other dtypes."""
    first, *others = plan.dtypes
    dispatch = {dtype: [Item(kind, d, dv, c, dtype) for d, dv in plan.head_dims for c in (False, True)
                        for kind in ("dispatch", "dispatch_bwd")] for dtype in plan.dtypes}
    items = list(dispatch[first])
    items += [Item("fp8", 128, 128, c, "float16") for c in (False, True)]
    items.append(Item("varlen", 128, 128, True, "float16"))
    if plan.sweep != "none":      # forward candidates of every head dim first, then the backward's
        swept = [it for d, dv in sweep_dims(plan) for c in (False, True) for it in sweep_items(plan, d, dv, c)]
        items += sorted(swept, key=lambda it: it.kind.startswith("bwd"))        # stable: the order kept
    for dtype in others:
        items += dispatch[dtype]
    return items


# ------------------------------------------------------------------------------------------ the checks
def _generator(device, seed):
    return torch.Generator(device=device).manual_seed(seed)


def random_qkv(b, h, n, d, dv, dtype, device, seed=0, grad=False):
    gen = _generator(device, seed)
    q, k = (torch.randn(b, h, n, d, device=device, generator=gen).to(dtype) for _ in range(2))
    v = torch.randn(b, h, n, dv, device=device, generator=gen).to(dtype)
    do = torch.randn(b, h, n, dv, device=device, generator=gen).to(dtype)
    if grad:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    return q, k, v, do


def math_reference(q, k, v, do, causal, sm_scale=None):
    """(o, dq, dk, dv) of torch's math SDPA in float32 (TF32 off). Causal with Nq = Nk: both alignments agree."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(*leaves, is_causal=causal, scale=sm_scale)
        grads = torch.autograd.grad(o, leaves, do.float()) if do is not None else (None, None, None)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return (o.detach(), *grads)


def compare(got: dict, ref: dict, dtype, device) -> list:
    """Failures: each named output's relative error against the reference above the dtype's bound."""
    bound = tolerance(dtype, device)
    failures = []
    for name, value in got.items():
        err = rel_error(value.float(), ref[name])
        if not err <= bound:
            failures.append(f"{name} relative error {err:.2e} > {bound:.1e}")
    return failures


def pad_to(width: int):
    """attend(q, k, v, causal) that zero-pads q, k, v's head dim to ``width``, runs the course's attention at
    that head dim with the original sm_scale and slices the output back (differentiable)."""
    def attend(q, k, v, causal):
        d, dv = q.shape[-1], v.shape[-1]
        qp, kp = F.pad(q, (0, width - d)), F.pad(k, (0, width - d))
        o = attnkit.flash_attention(qp, kp, F.pad(v, (0, width - dv)), causal=causal, sm_scale=1 / math.sqrt(d))
        return o[..., :dv]
    return attend


def course(q, k, v, causal):
    return attnkit.flash_attention(q, k, v, causal=causal)


def run_forward(item: Item, q, k, v):
    """o of ``item``'s forward (for dispatch and pad128 through the public functions)."""
    if item.kind == "dispatch":
        return course(q, k, v, item.causal)
    if item.kind == "pad128":
        return pad_to(128)(q, k, v, item.causal)
    return forward_with_config(q, k, v, item.causal, block_config(*item.config), desc=item.kind == "fwd_desc")[0]


def backward_configs(item: Item) -> dict:
    """Every launcher of the item's design fixed: its config, the partner kernel at its default."""
    configs = {item.kind: block_config(*item.config)}
    if item.kind in PARTNER:
        configs[PARTNER[item.kind]] = default_config(PARTNER[item.kind], item.d, item.dv)
    return configs


def check_attention(item: Item, plan: Plan, b=None, n=None) -> list:
    """Failures of ``item`` (a dispatch, pad128 or sweep item) on the check shape against math SDPA."""
    b0, h, n0 = plan.check
    dtype = DTYPES[item.dtype]
    q, k, v, do = random_qkv(b or b0, h, n or n0, item.d, item.dv, dtype, plan.device, seed=item.d + item.causal)
    o_ref, dq_ref, dk_ref, dv_ref = math_reference(q, k, v, do, item.causal)
    refs = dict(o=o_ref, dq=dq_ref, dk=dk_ref, dv=dv_ref)
    with poisoned_outputs():
        if item.kind == "pad128":
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            o = run_forward(item, *leaves)
            got = dict(zip(("o", "dq", "dk", "dv"), (o, *torch.autograd.grad(o, leaves, do))))
        elif item.kind == "dispatch" or item.kind.startswith("fwd"):
            with torch.no_grad():
                got = dict(o=run_forward(item, q, k, v))
        else:       # o and lse from one fixed forward (the autotuned one would compile all its candidates here)
            o, lse = forward_with_config(q, k, v, item.causal, default_config("fwd", item.d, item.dv))
            if item.kind == "dispatch_bwd":
                grads = flash.flash_attention_backward(do, q, k, v, o, lse, causal=item.causal)
            else:
                grads = backward_with_configs(do, q, k, v, o, lse, item.causal, DESIGN_OF[item.kind],
                                              backward_configs(item))
            got = dict(zip(("dq", "dk", "dv"), grads))
    return compare(got, refs, dtype, plan.device)


def varlen_lengths(plan: Plan) -> list:
    count, shortest, longest = plan.varlen
    return torch.randint(shortest, longest + 1, (count,), generator=torch.Generator().manual_seed(0)).tolist()


def varlen_inputs(plan: Plan):
    """Packed q, k, v [total, H, 128], cu_seqlens, the lengths and the padded [B, H, longest, 128] copies."""
    lens = varlen_lengths(plan)
    h, d, device = plan.heads, 128, plan.device
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    gen = _generator(device, 0)
    packed = [torch.randn(sum(lens), h, d, device=device, generator=gen).half() for _ in range(3)]
    padded_batch = [torch.zeros(len(lens), h, max(lens), d, device=device, dtype=torch.float16) for _ in range(3)]
    for p, t in zip(padded_batch, packed):
        for i, (a, z) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            p[i, :, : z - a] = t[a:z].transpose(0, 1)
    return packed, cu, lens, padded_batch


def varlen_impls(plan: Plan, packed, cu, lens, padded_batch) -> dict:
    """name -> (function of no arguments returning the output, how to read sequence i of it)."""
    longest = max(lens)
    starts = cu.tolist()

    def packed_seq(o, i):                       # [total, H, D] -> [H, len, D]
        return o[starts[i]:starts[i + 1]].transpose(0, 1)

    def padded_seq(o, i):                       # [B, H, longest, D] -> [H, len, D]
        return o[i, :, :lens[i]]

    impls = {"attnkit_varlen": (lambda: attnkit.flash_attention_varlen(*packed, cu, cu, longest, longest,
                                                                       causal=True), packed_seq),
             "attnkit_padded": (lambda: course(*padded_batch, True), padded_seq)}
    if plan.device == "cuda":
        impls["sdpa_cudnn_padded"] = (lambda: sdpa_cudnn(*padded_batch, True), padded_seq)
        nested = {}         # built on the first call: a torch without jagged tensors raises where it is recorded

        def cudnn_nested():
            if not nested:
                nested["qkv"] = nested_inputs(packed, cu)
            return sdpa_cudnn(*nested["qkv"], True)
        impls["sdpa_cudnn_nested"] = (cudnn_nested, lambda o, i: packed_seq(o.transpose(1, 2).values(), i))
    return impls


def nested_inputs(packed, cu):
    """q, k, v as nested (jagged) [B, H, j, D] tensors over the packed storage, as SDPA takes them."""
    offsets = cu.to(torch.int64)
    return [torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in packed]


def check_varlen(plan: Plan) -> list:
    """Each implementation's sequences 0, 1 and the longest against math SDPA on that sequence alone."""
    packed, cu, lens, padded_batch = varlen_inputs(plan)
    picks = sorted({0, 1, max(range(len(lens)), key=lens.__getitem__)})
    refs = {i: math_reference(*(t[cu[i]:cu[i + 1]].transpose(0, 1)[None] for t in packed), None, True)[0][0]
            for i in picks}
    failures = []
    for name, (fn, seq) in varlen_impls(plan, packed, cu, lens, padded_batch).items():
        try:
            with torch.no_grad(), poisoned_outputs():
                out = fn()
            for i in picks:
                failures += [f"{name} sequence {i}: {f}" for f in compare({"o": seq(out, i)}, {"o": refs[i]},
                                                                            torch.float16, plan.device)]
        except Exception as exc:        # a backend that does not take this case: its timing says why too
            if name.startswith("attnkit"):
                failures.append(f"{name}: {type(exc).__name__}: {first_line(exc)}")
    return failures


def fp8_module():
    """The FP8 forward's module (for REL_TOL_QUANTISED), inside the flash package or beside it."""
    try:
        from attnkit.kernels.flash import fp8
    except ImportError:
        from attnkit.kernels import flash_fp8 as fp8
    return fp8


def check_fp8(item: Item, plan: Plan, n=None) -> list:
    """The FP8 forward's relative error against float32 attention of the fp16 inputs: within REL_TOL_QUANTISED.
    On the check shape, or at B = 2, N = ``n`` on the last 128 rows of batch 0, heads 0-1."""
    b0, h, n0 = plan.check
    q, k, v, _ = random_qkv(2 if n else b0, h, n or n0, 128, 128, torch.float16, plan.device, seed=7 + item.causal)
    o = attnkit.flash_attention_fp8(*attnkit.quantize_for_attention(q, k, v), causal=item.causal)
    if n:
        err = rel_error(o[:1, :2, n - 128:].float(), rows_reference(q, k, v, item.causal, n - 128))
    else:
        err = rel_error(o.float(), math_reference(q, k, v, None, item.causal)[0])
    bound = fp8_module().REL_TOL_QUANTISED
    return [] if err <= bound else [f"o relative error {err:.2e} > {bound:.1e}"]


def first_line(exc) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def prepare(item: Item, plan: Plan) -> dict:
    """Phase 1 for one item: compile and check it ("pass" or the failures); where its kernel depends on N
    (``n_dependent``, the FP8 forward) check it again at every timed N, so that the timing finds it compiled."""
    t0 = time.perf_counter()
    try:
        if item.kind == "varlen":
            failures = check_varlen(plan)
        elif item.kind == "fp8":
            failures = check_fp8(item, plan)
            if plan.device == "cuda":
                for n in plan.fp8_lengths:
                    failures += [f"N={n}: {f}" for f in check_fp8(item, plan, n=n)]
        else:
            failures = check_attention(item, plan)
            if plan.device == "cuda" and n_dependent(item):
                for n in sorted(set(plan.lengths + (plan.sweep_lengths if item.kind == "pad128" else ()))):
                    failures += [f"N={n}: {f}" for f in check_rows(item, plan, n)]
        status = "pass" if not failures else "FAIL: " + "; ".join(failures)
    except Exception as exc:      # out of shared memory, a compile error: recorded, never timed
        status = f"ERROR: {type(exc).__name__}: {first_line(exc)}"
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return dict(item=item.to_json(), status=status, seconds=time.perf_counter() - t0)


def n_dependent(item: Item) -> bool:
    """The dispatch picks another kernel by N here (the Gluon forward at D = 128: from 1k keys, persistent
    programs up to 2k), so the check shape's kernel is not the timed one."""
    runs_at = 128 if item.kind == "pad128" else item.d
    return item.kind in ("dispatch", "pad128") and item.d == item.dv and runs_at in GLUON_HEAD_DIMS


def check_rows(item: Item, plan: Plan, n: int, rows: int = 128) -> list:
    """Failures of the item's forward and backward at B = 2, H = 16, N = n (the kernels the timing runs):
    o and dq of the last ``rows`` queries of batch 0, heads 0-1, against math SDPA on those rows alone (a row's
    o and dq depend on its own q and dO and on every key it sees, nothing else)."""
    dtype = DTYPES[item.dtype]
    q, k, v, do = random_qkv(2, plan.heads, n, item.d, item.dv, dtype, plan.device, seed=n + item.causal)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with poisoned_outputs():
        o = run_forward(item, *leaves)
        dq = torch.autograd.grad(o, leaves, do)[0]
    first = n - rows
    o_ref, dq_ref = rows_reference(q, k, v, item.causal, first, do)
    return compare(dict(o=o[:1, :2, first:], dq=dq[:1, :2, first:]), dict(o=o_ref, dq=dq_ref), dtype, plan.device)


def rows_reference(q, k, v, causal: bool, first: int, do=None):
    """Math SDPA in float32 for queries [first, N) of batch 0, heads 0-1 against every key (Nq = Nk: causal row
    i sees keys j <= i): o, and with ``do`` also (o, dq) of those rows."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    n = q.shape[2]
    mask = None
    if causal:
        mask = torch.arange(n, device=q.device)[None, :] <= torch.arange(first, n, device=q.device)[:, None]
    qs = q[:1, :2, first:].detach().float().requires_grad_()
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with sdpa_kernel(SDPBackend.MATH):
            o = F.scaled_dot_product_attention(qs, k[:1, :2].detach().float(), v[:1, :2].detach().float(),
                                               attn_mask=mask)
        if do is None:
            return o.detach()
        return o.detach(), torch.autograd.grad(o, qs, do[:1, :2, first:].float())[0]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


_WORKER_PLAN: dict = {}


def _init_worker(plan_json: str) -> None:
    _WORKER_PLAN["plan"] = plan_from_json(plan_json)


def _prepare_remote(item_json: dict) -> dict:
    return prepare(Item.from_json(item_json), _WORKER_PLAN["plan"])


def plan_to_json(plan: Plan) -> str:
    data = asdict(plan)
    data["batch"] = sorted(plan.batch.items())
    data["candidates"] = [[list(key), value] for key, value in plan.candidates.items()]
    return json.dumps(data)


def plan_from_json(text: str) -> Plan:
    data = json.loads(text)
    data["batch"] = {int(n): b for n, b in data["batch"]}
    data["candidates"] = {tuple(key): {name: [tuple(c) for c in configs] for name, configs in value.items()}
                          for key, value in data["candidates"]}
    for name in ("head_dims",):
        data[name] = tuple(tuple(x) for x in data[name])
    for name in ("dtypes", "lengths", "sweep_lengths", "check", "fp8_lengths", "varlen"):
        data[name] = tuple(data[name])
    return Plan(**data)


def prepare_all(items: list, plan: Plan, deadline: float) -> dict:
    """item.key -> prepare()'s result, for the items done before ``deadline`` (in ``plan.workers`` processes,
    or in this one with 0 workers)."""
    results = {}
    if plan.workers <= 0:
        for item in items:
            if time.perf_counter() > deadline:
                break
            results[item.key] = prepare(item, plan)
            log(f"prepared {item.key}: {results[item.key]['status'][:120]} ({results[item.key]['seconds']:.1f} s)")
        return results
    context = multiprocessing.get_context("spawn")
    # a fresh process every few items: a kernel that faults the GPU leaves its process's CUDA context unusable
    pool = context.Pool(plan.workers, initializer=_init_worker, initargs=(plan_to_json(plan),),
                        maxtasksperchild=plan.tasks_per_worker)
    try:
        pending = pool.imap_unordered(_prepare_remote, [item.to_json() for item in items])
        for _ in items:
            wait = min(deadline - time.perf_counter(), plan.stall_s)
            if wait <= 0:
                break
            try:
                result = pending.next(timeout=wait)
            except multiprocessing.TimeoutError:
                log(f"phase 1 stopped: nothing finished in {wait:.0f} s")
                break
            item = Item.from_json(result["item"])
            results[item.key] = result
            log(f"prepared {item.key}: {result['status'][:120]} ({result['seconds']:.1f} s)")
    finally:
        pool.terminate()
        pool.join()
    return results


# ------------------------------------------------------------------------------------------- timing
def flops(b, h, n, d, dv, causal, backward=False) -> float:
    """2·B·H·N²·(D + Dv), halved for causal, x 2.5 for the backward."""
    total = 2.0 * b * h * n * n * (d + dv) * (0.5 if causal else 1.0)
    return total * (2.5 if backward else 1.0)


def tflops(work: float, ms: float) -> float:
    return work / (ms * 1e-3) / 1e12 if ms == ms and ms > 0 else float("nan")


def sdpa_cudnn(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def make_timer(plan: Plan):
    """timer(name, fn) -> ms of one call of fn: triton.testing.do_bench's median on a GPU, the median of 3
    wall-clock calls on a CPU (``name`` is for timers that tests inject)."""
    if plan.device == "cuda":
        return lambda name, fn: time_ms(fn, warmup=plan.warmup_ms, rep=plan.rep_ms)

    def wall(name, fn):
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(runs)
    return wall


def interleaved(fns: dict, rounds: int, timer) -> dict:
    """name -> (median ms over ``rounds`` rounds, spread, reason): each round times every function once, in
    turn, so slow drift of the GPU's clocks lands on all of them alike. A function that raises gets nan and
    its reason and is not timed again."""
    times = {name: [] for name in fns}
    reasons = {name: "" for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if reasons[name]:
                continue
            try:
                times[name].append(timer(name, fn))
            except Exception as exc:    # a backend that refuses the shape, out of memory
                reasons[name] = f"{type(exc).__name__}: {first_line(exc)}"
    out = {}
    for name, ts in times.items():
        if ts and not reasons[name]:
            med = statistics.median(ts)
            out[name] = (med, (max(ts) - min(ts)) / med if med > 0 else float("nan"), "")
        else:
            out[name] = (float("nan"), float("nan"), reasons[name])
    return out


def no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()
    return run


def grad_of(attend, q, k, v, do, causal):
    """A function of no arguments: the backward of attend(q, k, v, causal) through autograd, its graph built
    on the first call (so that a backend refusing the shape raises where the timing records it) and kept."""
    graph = {}

    def run():
        if "out" not in graph:
            graph["out"] = attend(q, k, v, causal)
        return torch.autograd.grad(graph["out"], (q, k, v), do, retain_graph=True)
    return run


class Run:
    """The state of one run: plan, phase 1 results, rows, output files, deadline."""

    def __init__(self, plan: Plan, out: Path, timer=None):
        self.plan, self.out = plan, Path(out)
        self.timer = timer or make_timer(plan)
        self.deadline = START + plan.budget_s
        self.prepared: dict = {}
        self.rows: list = []
        self.sweep_rows: list = []
        self.check_rows: list = []
        self.out.mkdir(parents=True, exist_ok=True)

    def status(self, item: Item) -> str:
        result = self.prepared.get(item.key)
        return result["status"] if result else "not prepared (phase 1 ran out of budget)"

    def out_of_time(self) -> bool:
        return time.perf_counter() > self.deadline

    def save(self) -> None:
        for name, rows in (("flash_headdims", self.rows), ("flash_headdims_sweep", self.sweep_rows),
                           ("flash_headdims_checks", self.check_rows)):
            if rows:
                write_results(name, rows, self.out)
        (self.out / "headdims_log.txt").write_text("\n".join(LOG) + "\n")

    # ------------------------------------------------------------------------------------ baseline
    def baseline_case(self, dtype: str, d: int, dv: int, causal: bool, n: int) -> list:
        plan = self.plan
        b, h = plan.batch_of(n), plan.heads
        status = {direction: self.status(Item(kind, d, dv, causal, dtype))
                  for direction, kind in (("fwd", "dispatch"), ("bwd", "dispatch_bwd"))}
        if status["fwd"] != "pass":               # the backward through autograd runs the forward too
            status["bwd"] = status["fwd"]
        q, k, v, do = random_qkv(b, h, n, d, dv, DTYPES[dtype], plan.device, seed=n + d, grad=True)
        fns, skipped = {}, {}
        if status["fwd"] == "pass":
            fns["attnkit fwd"] = no_grad(lambda: course(q, k, v, causal))
        if status["bwd"] == "pass":
            fns["attnkit bwd"] = grad_of(course, q, k, v, do, causal)
        for direction, why in status.items():
            if why != "pass":
                skipped[f"attnkit {direction}"] = f"not timed: check {why}"
        if plan.device == "cuda":
            fns["sdpa_cudnn fwd"] = no_grad(lambda: sdpa_cudnn(q, k, v, causal))
            fns["sdpa_cudnn bwd"] = grad_of(sdpa_cudnn, q, k, v, do, causal)
        else:
            skipped["sdpa_cudnn"] = "cuDNN needs a CUDA GPU"
        timed = interleaved(fns, plan.rounds, self.timer)
        rows = []
        for impl in ("attnkit", "sdpa_cudnn"):
            for direction in ("fwd", "bwd"):
                ms, spread, reason = timed.get(f"{impl} {direction}", (float("nan"), float("nan"), ""))
                reason = reason or skipped.get(f"{impl} {direction}") or skipped.get(impl, "")
                rows.append(dict(suite="baseline", impl=impl, direction=direction, dtype=dtype, head_dim=d,
                                 head_dim_v=dv, causal=causal, n=n, batch=b, heads=h, ms=ms,
                                 tflops=tflops(flops(b, h, n, d, dv, causal, direction == "bwd"), ms),
                                 vs_cudnn=float("nan"), spread=spread, rounds=plan.rounds,
                                 path=dispatch_path(d, dv, plan.device) if impl == "attnkit" else "cuDNN",
                                 check=status[direction] if impl == "attnkit" else "", reason=reason))
        with_ratio(rows, "sdpa_cudnn", ("direction",))
        return rows

    def baseline(self, dtypes) -> None:
        plan = self.plan
        for dtype in dtypes:
            for d, dv in plan.head_dims:
                for causal in (False, True):
                    for n in plan.lengths:
                        if self.out_of_time():
                            self.rows.append(budget_row("baseline", dtype=dtype, head_dim=d, head_dim_v=dv,
                                                        causal=causal, n=n))
                            continue
                        rows = self.baseline_case(dtype, d, dv, causal, n)
                        self.rows += rows
                        log(f"baseline {dtype} D={d} Dv={dv} causal={causal} N={n}: " + ", ".join(
                            f"{r['impl']} {r['direction']} {r['ms']:.3f} ms ({r['vs_cudnn']:.2f}x)" for r in rows))
                        free(plan)
                self.save()

    # ---------------------------------------------------------------------------------- fp8, varlen
    def fp8(self) -> None:
        plan = self.plan
        for causal in (False, True):
            item = Item("fp8", 128, 128, causal, "float16")
            status = self.status(item)
            for n in plan.fp8_lengths:
                b, h = plan.batch_of(n), plan.heads
                base = dict(suite="fp8", direction="fwd", dtype="float16", head_dim=128, head_dim_v=128,
                            causal=causal, n=n, batch=b, heads=h)
                if self.out_of_time():
                    self.rows.append(budget_row(**base))
                    continue
                q, k, v, _ = random_qkv(b, h, n, 128, 128, torch.float16, plan.device, seed=n + causal)
                first = max(0, n - 128)
                ref = rows_reference(q, k, v, causal, first)
                quantised = attnkit.quantize_for_attention(q, k, v)
                fns = {"fp8_quantize": lambda: attnkit.quantize_for_attention(q, k, v)}
                if status == "pass":
                    fns["fp8"] = lambda: attnkit.flash_attention_fp8(*quantised, causal=causal)
                fns["attnkit"] = no_grad(lambda: course(q, k, v, causal))
                if plan.device == "cuda":
                    fns["sdpa_cudnn"] = no_grad(lambda: sdpa_cudnn(q, k, v, causal))
                timed = interleaved(fns, plan.rounds, self.timer)
                rows = []
                for impl in ("fp8", "fp8_quantize", "attnkit", "sdpa_cudnn"):
                    ms, spread, reason = timed.get(impl, (float("nan"), float("nan"), ""))
                    if impl not in fns:
                        reason = f"not timed: check {status}" if impl == "fp8" else "cuDNN needs a CUDA GPU"
                    err = float("nan")
                    if impl != "fp8_quantize" and impl in fns and not reason:
                        err = rel_error(fns[impl]()[:1, :2, first:].float(), ref)
                    rows.append(dict(base, impl=impl, ms=ms, spread=spread, rounds=plan.rounds, rel_err=err,
                                     tflops=tflops(flops(b, h, n, 128, 128, causal), ms) if impl != "fp8_quantize"
                                     else float("nan"), vs_cudnn=float("nan"), vs_fp16=float("nan"),
                                     check=status if impl == "fp8" else "", reason=reason))
                with_ratio(rows, "sdpa_cudnn", ())
                with_ratio(rows, "attnkit", (), column="vs_fp16")
                for r in rows:
                    if r["impl"] == "fp8_quantize":        # no attention: no ratio
                        r["vs_cudnn"] = r["vs_fp16"] = float("nan")
                self.rows += rows
                log(f"fp8 N={n} causal={causal}: " + ", ".join(
                    f"{r['impl']} {r['ms']:.3f} ms ({r['vs_fp16']:.2f}x fp16, {r['vs_cudnn']:.2f}x cuDNN)"
                    for r in rows))
                free(plan)
        self.save()

    def varlen(self) -> None:
        plan = self.plan
        item = Item("varlen", 128, 128, True, "float16")
        status = self.status(item)
        packed, cu, lens, padded_batch = varlen_inputs(plan)
        useful = sum(causal_pairs(n) for n in lens)
        padded_pairs = len(lens) * causal_pairs(max(lens))
        base = dict(suite="varlen", direction="fwd", dtype="float16", head_dim=128, head_dim_v=128, causal=True,
                    n=max(lens), batch=len(lens), heads=plan.heads, tokens=sum(lens),
                    padded_tokens=len(lens) * max(lens), useful_pairs=useful, padded_pairs=padded_pairs,
                    bound=padded_pairs / useful)
        if self.out_of_time():
            self.rows.append(budget_row(**base))
            return
        impls = varlen_impls(plan, packed, cu, lens, padded_batch)
        fns = {name: no_grad(fn) for name, (fn, _) in impls.items()
               if status == "pass" or not name.startswith("attnkit")}
        timed = interleaved(fns, plan.rounds, self.timer)
        rows = []
        for name in impls:
            ms, spread, reason = timed.get(name, (float("nan"), float("nan"), f"not timed: check {status}"))
            rows.append(dict(base, impl=name, ms=ms, spread=spread, rounds=plan.rounds,
                             tflops=tflops(4.0 * plan.heads * 128 * useful, ms), vs_cudnn=float("nan"),
                             target=0.85 * padded_pairs / useful if name == "attnkit_varlen" else float("nan"),
                             check=status if name.startswith("attnkit") else "", reason=reason))
        if plan.device != "cuda":
            rows.append(dict(base, impl="sdpa_cudnn_padded", ms=float("nan"), reason="cuDNN needs a CUDA GPU"))
        with_ratio(rows, "sdpa_cudnn_padded", ())
        self.rows += rows
        log("varlen: " + ", ".join(f"{r['impl']} {r['ms']:.3f} ms ({r.get('vs_cudnn', float('nan')):.2f}x cuDNN "
                                    f"padded)" for r in rows) + f"; bound {padded_pairs / useful:.2f}")
        free(plan)
        self.save()

    # ----------------------------------------------------------------------------------- the sweep
    def sweep_case(self, d: int, dv: int, causal: bool, n: int) -> None:
        plan = self.plan
        b, h = plan.batch_of(n), plan.heads
        q, k, v, do = random_qkv(b, h, n, d, dv, torch.float16, plan.device, seed=n + d, grad=True)
        base = dict(dtype="float16", head_dim=d, head_dim_v=dv, causal=causal, n=n, batch=b, heads=h)
        items = sweep_items(plan, d, dv, causal)
        passed = [it for it in items if self.status(it) == "pass"]
        cuda = plan.device == "cuda"
        # forward
        fwd = {}
        if cuda:
            fwd["sdpa_cudnn"] = no_grad(lambda: sdpa_cudnn(q, k, v, causal))
        dispatched = {kind: self.status(Item(kind, d, dv, causal, "float16")) == "pass"
                      for kind in ("dispatch", "dispatch_bwd")}       # else compiled here, autotuning and all
        if dispatched["dispatch"]:
            fwd["dispatch"] = no_grad(lambda: course(q, k, v, causal))
        for it in passed:
            if it.kind.startswith("fwd") or it.kind == "pad128":
                fwd[it.key] = no_grad(lambda it=it: run_forward(it, q, k, v))
        self.sweep_rows += self.sweep_rows_of("sweep_fwd", interleaved(fwd, plan.sweep_rounds, self.timer), items,
                                              base, b, h, n, d, dv, causal, backward=False)
        # backward: the kernels alone, on o and lse of the forward with its default configuration
        with torch.no_grad():
            o, lse = forward_with_config(q, k, v, causal, default_config("fwd", d, dv))
        bwd = {}
        if cuda:
            bwd["sdpa_cudnn"] = grad_of(sdpa_cudnn, q, k, v, do, causal)
        if dispatched["dispatch_bwd"]:
            bwd["dispatch"] = no_grad(lambda: flash.flash_attention_backward(do, q, k, v, o, lse, causal=causal))
        for it in passed:
            if it.kind.startswith("bwd"):
                configs = backward_configs(it)
                bwd[it.key] = no_grad(lambda it=it, c=configs: backward_with_configs(
                    do, q, k, v, o, lse, causal, DESIGN_OF[it.kind], c))
            elif it.kind == "pad128":
                bwd[it.key] = grad_of(pad_to(128), q, k, v, do, causal)
        timed = interleaved(bwd, plan.sweep_rounds, self.timer)
        case_rows = self.sweep_rows_of("sweep_bwd", timed, items, base, b, h, n, d, dv, causal, backward=True)
        best = {name: fastest(case_rows, impl=name) for name in ("bwd_dkdv", "bwd_dq")}
        if all(best.values()):       # the fastest dK/dV and dQ kernels together: what a table row would run
            configs = {name: block_config(*parse_config(r["config"])) for name, r in best.items()}
            extra = {"two_kernels_best": no_grad(lambda: backward_with_configs(do, q, k, v, o, lse, causal,
                                                                                "two_kernels", configs))}
            if cuda:
                extra["sdpa_cudnn"] = bwd["sdpa_cudnn"]
            timed2 = interleaved(extra, plan.sweep_rounds, self.timer)
            ms, spread, reason = timed2["two_kernels_best"]
            cudnn_ms = timed2.get("sdpa_cudnn", (float("nan"),))[0]
            dispatch_ms = next((r["ms"] for r in case_rows if r["impl"] == "dispatch"), float("nan"))
            case_rows.append(dict(base, suite="sweep_bwd", impl="two_kernels_best", design="two_kernels",
                                  config=" + ".join(f"{name} {r['config']}" for name, r in best.items()), ms=ms,
                                  tflops=tflops(flops(b, h, n, d, dv, causal, True), ms), spread=spread,
                                  vs_cudnn=cudnn_ms / ms, vs_dispatch=dispatch_ms / ms, check="pass", reason=reason,
                                  prepare_s=float("nan")))
        self.sweep_rows += case_rows

    def sweep_rows_of(self, suite, timed, items, base, b, h, n, d, dv, causal, backward) -> list:
        rows = []
        work = flops(b, h, n, d, dv, causal, backward)
        direction = "bwd" if backward else "fwd"
        for it in items:       # every candidate of the direction gets a row, timed or not
            if (it.kind.startswith("bwd") or it.kind == "pad128") if backward else not it.kind.startswith("bwd"):
                timed.setdefault(it.key, (float("nan"), float("nan"),
                                          "" if self.status(it) == "pass" else f"not timed: check {self.status(it)}"))
        by_key = {it.key: it for it in items}
        for name, (ms, spread, reason) in timed.items():
            it = by_key.get(name)
            impl = it.kind if it else name
            design = DESIGN_OF.get(impl, "dispatch" if impl == "dispatch" else "") if backward else ""
            if impl == "pad128":
                design = "pad to 128, dispatch" if backward else ""
            prepared = self.prepared.get(name, {})
            rows.append(dict(base, suite=suite, impl=impl, design=design,
                             config=config_name(it.config) if it and it.config else "", ms=ms, tflops=tflops(work, ms),
                             spread=spread, vs_cudnn=float("nan"), vs_dispatch=float("nan"),
                             check=self.status(it) if it else "", reason=reason,
                             prepare_s=prepared.get("seconds", float("nan"))))
        with_ratio(rows, "sdpa_cudnn", ())
        with_ratio(rows, "dispatch", (), column="vs_dispatch")
        b_ = fastest(rows)
        if b_:
            log(f"{suite} D={d} Dv={dv} causal={causal} N={n}: best {b_['impl']} {b_['config']} {b_['ms']:.3f} ms, "
                f"{b_['vs_cudnn']:.2f}x cuDNN, {b_['vs_dispatch']:.2f}x the dispatch ({direction})")
        return rows

    def sweep(self) -> None:
        plan = self.plan
        for d, dv in self.dims_to_sweep():
            for causal in (False, True):
                for n in plan.sweep_lengths:
                    if self.out_of_time():
                        self.sweep_rows.append(budget_row("sweep", head_dim=d, head_dim_v=dv, causal=causal, n=n))
                        continue
                    self.sweep_case(d, dv, causal, n)
                    free(plan)
                self.save()

    def dims_to_sweep(self) -> list:
        """Head dims whose fp16 baseline is below BELOW x cuDNN in any case (no ratio: swept), worst first."""
        if self.plan.sweep == "none":
            return []
        worst = {}
        for d, dv in sweep_dims(self.plan):
            ratios = [r["vs_cudnn"] for r in self.rows if r["suite"] == "baseline" and r["impl"] == "attnkit"
                      and r["dtype"] == "float16" and r["head_dim"] == d and r["head_dim_v"] == dv]
            known = [x for x in ratios if x == x]
            worst[(d, dv)] = min(known) if known else float("-inf")
        chosen = [dims for dims, w in worst.items() if self.plan.sweep == "all" or not w >= BELOW]
        log("sweep: " + ", ".join(f"D={d} Dv={dv} (worst {worst[(d, dv)]:.2f}x cuDNN)" for d, dv in chosen)
            + (f"; not swept (>= {BELOW}x everywhere): {[dims for dims in worst if dims not in chosen]}"
               if len(chosen) < len(worst) else ""))
        return sorted(chosen, key=worst.get)


def causal_pairs(n: int) -> int:
    return n * (n + 1) // 2


def budget_row(suite, **fields) -> dict:
    return dict(dict(suite=suite, impl=""), **fields, ms=float("nan"), reason="budget: not timed")


def with_ratio(rows: list, against: str, match: tuple, column: str = "vs_cudnn") -> None:
    """Fill ``column`` = the ``against`` row's ms / this row's ms, among rows equal on ``match``."""
    for r in rows:
        peer = [p for p in rows if p["impl"] == against and all(p.get(m) == r.get(m) for m in match)]
        if peer and r["ms"] == r["ms"] and r["ms"] > 0:
            r[column] = peer[0]["ms"] / r["ms"]


def fastest(rows: list, **where):
    """The fastest timed candidate row (not cuDNN, not the dispatch) matching ``where``, or None."""
    ok = [r for r in rows if r["impl"] not in ("sdpa_cudnn", "dispatch") and r.get("check") == "pass"
          and r["ms"] == r["ms"] and all(r.get(k) == v for k, v in where.items())]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def parse_config(name: str) -> tuple:
    """'128x64 w8 s3' -> (128, 64, 8, 3)."""
    tiles, warps, stages = name.split()
    m, n = tiles.split("x")
    return int(m), int(n), int(warps[1:]), int(stages[1:])


def free(plan: Plan) -> None:
    if plan.device == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------ summary
def best_per_case(sweep_rows: list) -> list:
    """Per (D, Dv, causal, N, direction): the fastest verified candidate, with its ratios."""
    cases = sorted({(r["head_dim"], r["head_dim_v"], r["causal"], r["n"], r["suite"])
                    for r in sweep_rows if r.get("suite", "").startswith("sweep_")})
    out = []
    for d, dv, causal, n, suite in cases:
        b = fastest([r for r in sweep_rows if r.get("suite") == suite], head_dim=d, head_dim_v=dv, causal=causal, n=n)
        if b:
            out.append(b)
    return out


def best_overall(sweep_rows: list) -> dict:
    """Per (D, Dv) and launcher (and "pad128", "two_kernels_best"): the configuration with the smallest geometric
    mean time over every (causal, N) case of that head dim where it was timed in every case, with its geometric
    mean ratio to cuDNN and to the dispatch."""
    out = {}
    for d, dv in sorted({(r["head_dim"], r["head_dim_v"]) for r in sweep_rows if "impl" in r}):
        mine = [r for r in sweep_rows if r.get("head_dim") == d and r.get("head_dim_v") == dv and "impl" in r]
        for suite in ("sweep_fwd", "sweep_bwd"):
            rows = [r for r in mine if r["suite"] == suite]
            cases = {(r["causal"], r["n"]) for r in rows}
            for impl in sorted({r["impl"] for r in rows} - {"sdpa_cudnn", "dispatch"}):
                scores = {}
                for config in sorted({r["config"] for r in rows if r["impl"] == impl}):
                    timed = [r for r in rows if r["impl"] == impl and r["config"] == config and r["check"] == "pass"
                             and r["ms"] == r["ms"]]
                    if timed and len({(r["causal"], r["n"]) for r in timed}) == len(cases):
                        scores[config] = (geomean([r["ms"] for r in timed]), geomean([r["vs_cudnn"] for r in timed]),
                                          geomean([r["vs_dispatch"] for r in timed]))
                if scores:
                    config = min(scores, key=lambda c: scores[c][0])
                    out[f"D={d} Dv={dv} {suite[6:]} {impl}"] = dict(config=config, vs_cudnn=scores[config][1],
                                                                   vs_dispatch=scores[config][2], cases=len(cases))
    return out


def geomean(xs) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summarise(run: Run) -> None:
    baseline = [r for r in run.rows if r.get("suite") == "baseline" and r.get("impl") == "attnkit"]
    for r in baseline:
        if r["vs_cudnn"] == r["vs_cudnn"]:
            flag = "" if r["vs_cudnn"] >= BELOW else f"  below {BELOW}"
            log(f"baseline {r['dtype']} D={r['head_dim']} Dv={r['head_dim_v']} causal={r['causal']} N={r['n']} "
                f"{r['direction']}: {r['tflops']:.0f} TFLOP/s, {r['vs_cudnn']:.2f}x cuDNN{flag}")
    for r in best_per_case(run.sweep_rows):
        log(f"best {r['suite'][6:]} D={r['head_dim']} Dv={r['head_dim_v']} causal={r['causal']} N={r['n']}: "
            f"{r['impl']} {r['config']} {r['tflops']:.0f} TFLOP/s, {r['vs_cudnn']:.2f}x cuDNN, "
            f"{r['vs_dispatch']:.2f}x the dispatch")
    overall = best_overall(run.sweep_rows)
    for name, b in overall.items():
        log(f"overall {name}: {b['config']} (geometric mean over {b['cases']} cases: {b['vs_cudnn']:.2f}x cuDNN, "
            f"{b['vs_dispatch']:.2f}x the dispatch)")
    (run.out / "headdims_best.json").write_text(json.dumps(
        dict(per_case=[{k: r[k] for k in ("suite", "head_dim", "head_dim_v", "causal", "n", "impl", "config", "ms",
                                          "vs_cudnn", "vs_dispatch")} for r in best_per_case(run.sweep_rows)],
             overall=overall), indent=1, default=str))


# ------------------------------------------------------------------------------------ --ptxas (no GPU)
def ptxas_rows(plan: Plan, causal: bool = True) -> list:
    """ptxas's report (registers a thread, bytes spilled, wgmma serialised) on every sweep candidate of the
    plan's head dims, and on D = 128's through the same Triton kernels, compiled for sm_90a on this machine as
    the dispatch launches them for contiguous fp16 tensors (pointer tiles; descriptors for "fwd_desc")."""
    try:
        from attnkit.analysis import compiled
    except ImportError:
        from attnkit.bench import compiled
    try:
        from attnkit.kernels.flash import triton_kernels as kernels
    except ImportError:
        from attnkit.kernels import flash_kernels as kernels
    import triton

    names = {"fwd": "_attn_fwd", "fwd_desc": "_attn_fwd", "bwd_dkdv": "_bwd_dkdv", "bwd_dq": "_bwd_dq",
             "bwd_atomic": "_bwd_dkdv"}
    rows = []
    for d, dv in plan.head_dims:
        for launcher, configs in plan.candidates[(padded(d), padded(dv))].items():
            for config in configs:
                m, n, warps, stages = config
                desc = launcher == "fwd_desc"
                constexprs = dict(HEAD_DIM=padded(d), HEAD_DIM_V=padded(dv), DIM_QK=d, DIM_V=dv, BAND=causal,
                                  CAUSAL=causal, SOFTCAP=False, VARLEN=False, DOT_PRECISION="tf32", BLOCK_M=m,
                                  BLOCK_N=n, DESC=2 if desc else 0)
                if launcher.startswith("fwd"):
                    constexprs.update(USE_EXP2=True, SPLIT=True, LONGEST_FIRST=causal)
                elif launcher != "bwd_dq":
                    constexprs["ATOMIC_DQ"] = launcher == "bwd_atomic"
                row = dict(suite="ptxas", impl=launcher, head_dim=d, head_dim_v=dv, causal=causal,
                           config=config_name(config), registers=float("nan"), spill_bytes=float("nan"),
                           wgmma_serialised="", reason="")
                t0 = time.perf_counter()
                try:
                    ptx = compiled.compile_ptx(getattr(kernels, names[launcher]), constexprs, warps, stages, desc)
                    report = compiled.ptxas_report(ptx)
                    row.update(registers=report.registers, spill_bytes=report.spill_bytes,
                               wgmma_serialised=report.wgmma_serialised)
                except Exception as exc:     # out of shared memory at compile time, a compile error
                    row["reason"] = f"{type(exc).__name__}: {first_line(exc)}"
                row["seconds"] = time.perf_counter() - t0
                rows.append(row)
                log(f"ptxas D={d} Dv={dv} {launcher} {row['config']}: {row['registers']} registers, "
                    f"{row['spill_bytes']} B spilled, serialised {row['wgmma_serialised']} {row['reason']}"
                    f" (Triton {triton.__version__})")
    return rows


# ------------------------------------------------------------------------------- report (docs/head_dims.md)
def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return float("nan")


def _int(x) -> str:
    return str(int(_num(x))) if _num(x) == _num(x) else "–"


def _cell(ratio, tf=None) -> str:
    if ratio != ratio:
        return "–"
    return f"{ratio:.2f}" + (f" ({tf:.0f})" if tf is not None and tf == tf else "")


def report(directory: Path) -> str:
    """Markdown tables computed from a run's CSVs (docs/head_dims.md quotes them): the baseline per dtype and
    direction (attnkit ÷ cuDNN speed, attnkit's TFLOP/s), the sweep's best per case and overall, FP8, varlen."""
    from attnkit.bench.recorder import describe_source, read_results

    out = []
    if (Path(directory) / "bench_flash_headdims_ptxas.csv").exists():
        compiled = read_results("flash_headdims_ptxas", directory)
        out += [f"**ptxas, sm_90a, causal, fp16** (Triton {compiled[0]['triton']}): registers a thread / bytes "
                "spilled; * where ptxas serialised the matrix products", "",
                "| D, Dv | launcher | " + " | ".join(f"c{i + 1}" for i in range(7)) + " |", "|---" * 9 + "|"]
        for key in dict.fromkeys((int(r["head_dim"]), int(r["head_dim_v"]), r["impl"]) for r in compiled):
            cells = [f"{r['config']}: {_int(r['registers'])}/{_int(r['spill_bytes'])}"
                     + ("*" if str(r["wgmma_serialised"]) == "True" else "")
                     for r in compiled if (int(r["head_dim"]), int(r["head_dim_v"]), r["impl"]) == key]
            out.append(f"| {key[0]}, {key[1]} | {key[2]} | " + " | ".join(cells + [""] * (7 - len(cells))) + " |")
        out.append("")
    if not (Path(directory) / "bench_flash_headdims.csv").exists():
        return "\n".join(out)
    rows = read_results("flash_headdims", directory)
    out += [f"Source: `bench_flash_headdims.csv`, {describe_source(rows)}.", ""]
    base = [r for r in rows if r["suite"] == "baseline" and r["impl"] in ("attnkit", "sdpa_cudnn")]
    lengths = sorted({int(r["n"]) for r in base if r["n"] == r["n"]})
    for dtype in sorted({r["dtype"] for r in base}, key=lambda x: x != "float16"):
        for direction in ("fwd", "bwd"):
            out += [f"**{dtype}, {'forward' if direction == 'fwd' else 'backward'}**: attnkit ÷ cuDNN speed "
                    "(attnkit's TFLOP/s; cuDNN's in the last columns)", ""]
            cols = [(c, n) for c in ("False", "True") for n in lengths]
            head = [f"{'causal' if c == 'True' else 'non-causal'} {n // 1024 if n >= 1024 else n}{'k' * (n >= 1024)}"
                    for c, n in cols]
            out += ["| D, Dv | " + " | ".join(head) + " | cuDNN TFLOP/s |",
                    "|---" * (len(cols) + 2) + "|"]
            for d, dv in sorted({(int(r["head_dim"]), int(r["head_dim_v"])) for r in base}):
                cells, peers = [], []
                for c, n in cols:
                    mine = [r for r in base if (int(r["head_dim"]), int(r["head_dim_v"]), str(r["causal"]), int(r["n"]),
                                                r["dtype"], r["direction"]) == (d, dv, c, n, dtype, direction)]
                    ours = next((r for r in mine if r["impl"] == "attnkit"), {})
                    peer = next((r for r in mine if r["impl"] == "sdpa_cudnn"), {})
                    cells.append(_cell(_num(ours.get("vs_cudnn")), _num(ours.get("tflops"))))
                    peers.append(_num(peer.get("tflops")))
                known = [p for p in peers if p == p]
                span = f"{min(known):.0f}-{max(known):.0f}" if known else "–"
                out.append(f"| {d}, {dv} | " + " | ".join(cells) + f" | {span} |")
            out.append("")
    try:
        sweep = read_results("flash_headdims_sweep", directory)
    except FileNotFoundError:
        sweep = []
    for r in sweep:
        for key in ("head_dim", "head_dim_v", "n"):
            r[key] = int(_num(r.get(key))) if _num(r.get(key)) == _num(r.get(key)) else r.get(key)
        r["causal"] = str(r.get("causal")) == "True"
    best = best_per_case([r for r in sweep if r.get("impl")])
    if best:
        out += ["**Sweep, fastest verified candidate per case** (fp16; ratios: cuDNN's time ÷ its time, the "
                "dispatch's time ÷ its time)", "",
                "| D, Dv | causal | N | direction | candidate | configuration | TFLOP/s | × cuDNN | × dispatch |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in best:
            out.append(f"| {r['head_dim']}, {r['head_dim_v']} | {r['causal']} | {r['n']} | {r['suite'][6:]} | "
                       f"{r['impl']} | {r['config'] or '–'} | {_num(r['tflops']):.0f} | {_num(r['vs_cudnn']):.2f} | "
                       f"{_num(r['vs_dispatch']):.2f} |")
        out.append("")
        out += ["**Sweep, per head dim and launcher: the configuration with the smallest geometric-mean time over "
                "every case** (geometric means of the ratios)", "",
                "| head dims, direction, candidate | configuration | × cuDNN | × dispatch | cases |",
                "|---|---|---|---|---|"]
        for name, b in best_overall([r for r in sweep if r.get("impl")]).items():
            out.append(f"| {name} | {b['config'] or '–'} | {b['vs_cudnn']:.2f} | {b['vs_dispatch']:.2f} "
                       f"| {b['cases']} |")
        out.append("")
    fp8 = [r for r in rows if r["suite"] == "fp8" and r["impl"]]
    if fp8:
        out += ["**FP8 forward, D = 128** (ms; TFLOP/s; fp8 ÷ fp16 and ÷ cuDNN fp16 speed; rel_err against fp32)", "",
                "| causal | N | fp8 ms | fp8 TFLOP/s | × attnkit fp16 | × cuDNN fp16 | fp8 rel_err | quantise ms |",
                "|---|---|---|---|---|---|---|---|"]
        for c in ("False", "True"):
            for n in sorted({int(r["n"]) for r in fp8}):
                case = {r["impl"]: r for r in fp8 if str(r["causal"]) == c and int(r["n"]) == n}
                f8, qz = case.get("fp8", {}), case.get("fp8_quantize", {})
                out.append(f"| {c} | {n} | {_num(f8.get('ms')):.3f} | {_num(f8.get('tflops')):.0f} | "
                           f"{_num(f8.get('vs_fp16')):.2f} | {_num(f8.get('vs_cudnn')):.2f} | "
                           f"{_num(f8.get('rel_err')):.3f} | {_num(qz.get('ms')):.3f} |")
        out.append("")
    varlen = [r for r in rows if r["suite"] == "varlen" and r["impl"]]
    if varlen:
        v0 = varlen[0]
        out += [f"**Packed sequences** ({int(_num(v0['batch']))} sequences, {int(_num(v0['tokens']))} tokens, "
                f"padded to {int(_num(v0['n']))}: padded ÷ useful pairs = {_num(v0['bound']):.2f}; the target "
                f"0.85 × that = {0.85 * _num(v0['bound']):.2f} × cuDNN padded)", "",
                "| implementation | ms | useful TFLOP/s | × cuDNN padded |", "|---|---|---|---|"]
        for r in varlen:
            out.append(f"| {r['impl']} | {_num(r['ms']):.3f} | {_num(r['tflops']):.0f} | {_num(r['vs_cudnn']):.2f} |"
                       + (f" {r['reason'][:80]}" if r.get("reason") else ""))
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- main
def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python scripts/gpu_flash_headdims.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the CSVs, the log and headdims_best.json")
    parser.add_argument("--quick", action="store_true", help="fp16, N = 4096 alone, fewer candidates")
    parser.add_argument("--report", action="store_true", help="print markdown tables from the CSVs in OUTDIR")
    parser.add_argument("--ptxas", action="store_true", help="no GPU needed: ptxas's registers and spills for "
                        "every sweep candidate, compiled for sm_90a (--dims to choose; --quick: fewer candidates)")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (with --cpu: Triton's interpreter)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU in Triton's interpreter (needs --tiny)")
    parser.add_argument("--budget", type=float, help="seconds for the whole run (default 450; --quick 300)")
    parser.add_argument("--workers", type=int, help="processes compiling and checking in phase 1 (0: this one)")
    parser.add_argument("--dims", help="comma-separated head dims among 80,96,112,128,192,256 (192 has Dv = 128)")
    parser.add_argument("--dtypes", help="comma-separated, float16 among them (default float16,bfloat16)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per case (default 3; sweep 2)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--sweep-all", action="store_true", help="sweep every non-Gluon head dim")
    group.add_argument("--no-sweep", action="store_true", help="no sweep: baseline, fp8 and varlen only")
    args = parser.parse_args(argv)
    if args.cpu != args.tiny:
        parser.error("--cpu and --tiny go together (the interpreter runs tiny sizes only; the GPU full or --quick)")
    if args.quick and args.tiny:
        parser.error("--quick and --tiny: choose one")
    return args


def main(argv=None, *, timer=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.report:
        print(report(args.out))
        return 0
    if args.ptxas:
        plan = make_plan("quick" if args.quick else "full", dims=[int(x) for x in args.dims.split(",")]
                         if args.dims else None)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_results("flash_headdims_ptxas", ptxas_rows(plan), args.out)
        return 0
    if not args.cpu and not torch.cuda.is_available():
        print("this script times kernels on a CUDA GPU; on a CPU run it with --cpu --tiny (checks only)")
        return 1
    dims = [int(x) for x in args.dims.split(",")] if args.dims else None
    plan = make_plan("tiny" if args.tiny else "quick" if args.quick else "full", budget=args.budget,
                     workers=args.workers, dims=dims, rounds=args.rounds,
                     dtypes=args.dtypes.split(",") if args.dtypes else None,
                     sweep="all" if args.sweep_all else "none" if args.no_sweep else "below")
    if plan.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    run = Run(plan, args.out, timer)
    log(provenance(), f"budget {plan.budget_s:.0f} s, {plan.workers} workers")
    items = work_items(plan)
    log(f"phase 1: {len(items)} items to compile and check")
    run.prepared = prepare_all(items, plan, START + plan.prepare_share * plan.budget_s)
    run.check_rows = [dict(item=it.key, kind=it.kind, head_dim=it.d, head_dim_v=it.dv, causal=it.causal,
                           dtype=it.dtype, config=config_name(it.config) if it.config else "",
                           status=run.status(it), seconds=run.prepared.get(it.key, {}).get("seconds", float("nan")))
                      for it in items]
    failed = [r for r in run.check_rows if r["status"] != "pass"]
    log(f"phase 1 done: {len(items) - len(failed)} of {len(items)} passed; "
        f"{sum(r['status'].startswith('not prepared') for r in failed)} not reached")
    for r in failed:
        log("  ", r["item"], r["status"][:160])
    run.save()
    run.baseline(plan.dtypes[:1])
    run.fp8()
    run.varlen()
    run.sweep()
    run.baseline(plan.dtypes[1:])
    run.save()
    summarise(run)
    run.save()
    log(f"done in {time.perf_counter() - START:.0f} s (budget {plan.budget_s:.0f} s)")
    run.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
