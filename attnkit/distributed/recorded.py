"""The recorded context-parallel runs, read for lesson 10 and lab 10.

``scripts/gpu_context_parallel.py`` writes two CSVs (``attnkit.bench.recorder.SCRIPT_RESULTS``):
``bench_context_parallel.csv`` (``kind=check``: every scheme's errors against one GPU; ``kind=time``: the
slowest rank's median ms per scheme, pass and N, one GPU's ms on the whole sequence, the speed-up, the
bytes each rank receives) and ``bench_context_parallel_pingpong.csv`` (one-way µs per message size between
ranks 0 and 1, and the least-squares α, β in the ``kind=fit`` row). This module reads them:

- ``load()``: (time rows, check rows, ping-pong rows); ``load(gpu="H100")`` keeps the rows of the GPUs whose
  name contains ``gpu`` (a recording may merge the runs of several machines; each row names its GPU);
  ``gpus(rows)`` names them; ``describe_runs`` names the GPUs, the link, NCCL and the library versions
  (``describe_each_world``: one line per world size, which may be another machine);
  ``fitted(pingpong, world)``: α in seconds, β in bytes/s;
- ``speedups(rows)`` and ``measured_crossover``: the smallest recorded N from which a scheme beats one GPU;
  these, ``overlap`` and ``predicted_speedups`` set rows of different N side by side, so they refuse rows of
  more than one GPU (a ``ValueError``): a series over N must come from one machine;
- ``overlap(rows)``: the overlap fraction per scheme, pass and N, the scheme's time ÷ its compute alone (the
  same blocks timed with no communication, ``context_parallel.no_communication``): 1 when every transfer
  hides behind compute; ``has_overlap(rows)`` says whether a recording has it (runs before it did not);
- ``predicted_ms`` and ``predicted_speedups``: the α–β model of the same runs (``crossover`` reads either).
  Compute is one GPU's recorded time on the whole sequence times the slowest rank's share of the attention, at every
  step (``step_shares``); a message costs α + bytes/β. The ring's forward overlaps each step's transfer with
  its compute (a step costs the larger); its backward sends after computing (the two add); an all-gather
  or reduce-scatter costs W − 1 messages (NCCL's ring algorithm), an all-to-all one message per call
  (every peer at once), before or after the compute. Nothing else is counted: not the host's time per
  kernel call, not the merges, not the lower rate of a short block.

``scripts/gpu_tensor_parallel.py`` writes ``bench_tensor_parallel_decode.csv``: one row per tensor-parallel
size (tp = 1 is the split code on one GPU), whether its tokens equal one GPU's plain model, where they
first differ, ms per token. ``load_tp_decode()`` reads it; ``describe_tp(rows)`` names where it ran.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..results import RESULTS, read_results
from . import context_parallel as cp

SCHEMES = {("ring", "contiguous"): "ring", ("ring", "zigzag"): "zig-zag ring",
           ("all_gather_kv", "zigzag"): "all-gather K/V", ("ulysses", "zigzag"): "Ulysses"}
PASSES = ("fwd", "fwd+bwd")
GRAD_ITEMSIZE = 4          # the ring's and the all-gather's dK, dV travel in float32 (comm_bytes)
ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


def load(directory: Path = RESULTS, gpu: str | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """(time rows, check rows, ping-pong rows) of the recorded context-parallel runs; with ``gpu``, only the
    rows whose GPU name contains it (``"H100"``, ``"H200"``), a ``ValueError`` if no row's does."""
    rows = read_results("context_parallel", directory)
    pingpong = read_results("context_parallel_pingpong", directory)
    if gpu is not None:
        if not isinstance(gpu, str) or not gpu.strip():
            raise ValueError(f"gpu: expected a non-empty part of a GPU name such as 'H100', got {gpu!r}")
        recorded = gpus(rows, pingpong)
        rows, pingpong = ([r for r in t if str(gpu) in str(r["gpu"])] for t in (rows, pingpong))
        if not rows and not pingpong:
            raise ValueError(f"gpu: no recorded row's GPU name contains {gpu!r}; recorded: {', '.join(recorded)}")
    return ([r for r in rows if r["kind"] == "time"], [r for r in rows if r["kind"] == "check"], pingpong)


def gpus(*tables: list[dict]) -> list[str]:
    """The GPU names of the rows, sorted (a row without a ``gpu`` column names none)."""
    return sorted({str(r["gpu"]) for t in tables for r in t if r.get("gpu") not in (None, "")})


def _one_gpu(rows: list[dict]) -> list[dict]:
    """``rows``, if they come from one GPU: a series over N compares rows of one machine only."""
    names = gpus(rows)
    if len(names) > 1:
        raise ValueError(f"rows: recorded on more than one GPU ({'; '.join(names)}); a series over N compares one "
                         "machine's rows: pass load(gpu=...)'s rows")
    return rows


def load_tp_decode(directory: Path = RESULTS) -> list[dict]:
    """The recorded tensor-parallel decode rows, one per tp (``scripts/gpu_tensor_parallel.py``)."""
    return read_results("tensor_parallel_decode", directory)


def describe_tp(rows: list[dict]) -> str:
    """Where the tensor-parallel decode rows were measured: GPU, link, NCCL, torch, Triton, CUDA, date."""
    if not rows:
        raise ValueError("rows: no recorded rows")

    def values(key):
        return ", ".join(sorted({str(r[key]) for r in rows}))

    return (f"{values('gpu')}, tp = {', '.join(str(int(r['tp'])) for r in rows)}, link "
            + "; ".join(describe_link(x) for x in sorted({str(r['link']) for r in rows}))
            + f"; NCCL {values('nccl')}, torch {values('torch')}, Triton {values('triton')}, CUDA {values('cuda')};"
            f" recorded {values('date')}")


def describe_link(link: str) -> str:
    """``nvidia-smi topo -m``'s entry for GPU0–GPU1 in words (NV18: 18 NVLinks; PIX … SYS: PCIe paths)."""
    m = re.fullmatch(r"NV(\d+)", str(link))
    if m:
        return f"{link}: {m.group(1)} NVLinks between each pair of GPUs"
    pcie = {"PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "a PCIe host bridge",
            "NODE": "PCIe through one CPU socket", "SYS": "PCIe across CPU sockets"}
    return f"{link}: {pcie[link]}" if link in pcie else str(link)


def _where(rows: list[dict]) -> str:
    """The link, NCCL, library versions and dates of ``rows``."""
    def values(key):
        return ", ".join(sorted({f"{r[key]:g}" if isinstance(r[key], float) else str(r[key]) for r in rows}))

    return ("link " + "; ".join(describe_link(x) for x in sorted({str(r['link']) for r in rows}))
            + f"; NCCL {values('nccl')}, torch {values('torch')}, Triton {values('triton')}, CUDA {values('cuda')};"
            f" recorded {values('date')}")


def describe_runs(*tables: list[dict]) -> str:
    """Where the rows were measured: GPU, world sizes, link, NCCL, torch, Triton, CUDA, date(s)."""
    rows = [r for t in tables for r in t]
    if not rows:
        raise ValueError("tables: no recorded rows")
    gpus = ", ".join(sorted({str(r["gpu"]) for r in rows}))
    worlds = " and ".join(str(w) for w in sorted({int(r["world"]) for r in rows}))
    return f"{gpus} × {worlds} (world sizes), " + _where(rows)


def describe_each_world(*tables: list[dict]) -> list[str]:
    """Where the rows of each world size were measured, one line each ("W = 2: <GPU>, link …"): the runs of
    different world sizes may come from different machines."""
    rows = [r for t in tables for r in t]
    if not rows:
        raise ValueError("tables: no recorded rows")
    lines = []
    for w in sorted({int(r["world"]) for r in rows}):
        mine = [r for r in rows if int(r["world"]) == w]
        lines.append(f"W = {w}: {', '.join(sorted({str(r['gpu']) for r in mine}))}, " + _where(mine))
    return lines


def fitted(pingpong: list[dict], world: int) -> tuple[float, float]:
    """(α in seconds, β in bytes/s) of the ping-pong recorded with ``world`` ranks."""
    fits = [r for r in pingpong if r["kind"] == "fit" and int(r["world"]) == world]
    if len(fits) != 1:
        raise ValueError(f"world: expected one fitted row for world size {world}, found {len(fits)}")
    return fits[0]["one_way_us"] * 1e-6, fits[0]["gb_per_s"] * 1e9


def speedups(rows: list[dict]) -> dict:
    """{(variant, layout, world, pass): {N: one GPU's ms ÷ the scheme's ms}} from the time rows."""
    out = {}
    for r in _one_gpu(rows):
        key = (r["variant"], r["layout"], int(r["world"]), r["pass_"])
        out.setdefault(key, {})[int(r["N"])] = r["speedup"]
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def has_overlap(rows: list[dict]) -> bool:
    """Whether every time row carries the compute-alone time (recordings before it had none)."""
    return bool(rows) and all(isinstance(r.get("compute_ms"), float) and r["compute_ms"] > 0 for r in rows)


def overlap(rows: list[dict]) -> dict:
    """{(variant, layout, world, pass): {N: the scheme's ms ÷ its compute alone}} from the time rows."""
    if not has_overlap(rows):
        raise ValueError("rows: recorded without the compute-alone time (no compute_ms column): rerun "
                         "scripts/gpu_context_parallel.py")
    out = {}
    for r in _one_gpu(rows):
        out.setdefault((r["variant"], r["layout"], int(r["world"]), r["pass_"]), {})[int(r["N"])] = (
            r["ms"] / r["compute_ms"])
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def crossover(speedup_by_n: dict) -> int | None:
    """The smallest N from which every recorded N beats one GPU (speed-up > 1); None if the longest does not."""
    first = None
    for n in sorted(speedup_by_n, reverse=True):
        if not speedup_by_n[n] > 1:
            break
        first = n
    return first


def measured_crossover(rows: list[dict], variant: str, layout: str, world: int, pass_: str) -> int | None:
    return crossover(speedups(rows)[(variant, layout, world, pass_)])


def step_shares(world: int, layout: str, causal: bool = True) -> list[float]:
    """The slowest rank's share of the whole attention's work at each ring step (one K/V shard each)."""
    c = cp.num_chunks(world, layout)
    total = c * c / 2 if causal else c * c                 # in chunk × chunk blocks
    shares = []
    for step in range(world):
        per_rank = []
        for rank in range(world):
            mine, theirs = cp.chunks_of_rank(rank, world, layout), cp.chunks_of_rank((rank - step) % world, world,
                                                                                    layout)
            per_rank.append(sum(1.0 if not causal or j < i else 0.5 if j == i else 0.0
                                for i in mine for j in theirs))
        shares.append(max(per_rank) / total)
    return shares


def _shape(row) -> dict:
    return dict(batch=int(row["B"]), q_heads=int(row["Hq"]), kv_heads=int(row["Hkv"]), seq_len=int(row["N"]),
                head_dim=int(row["D"]), world_size=int(row["world"]), itemsize=ITEMSIZE[row["dtype"]])


def predicted_ms(variant: str, layout: str, *, world: int, one_fwd_ms: float, one_bwd_ms: float | None,
                 alpha: float, beta: float, batch: int, q_heads: int, kv_heads: int, seq_len: int, head_dim: int,
                 itemsize: int = 2, causal: bool = True) -> float:
    """The α–β model's ms for one layer (module doc); ``one_bwd_ms`` None: the forward alone.

    ``one_fwd_ms``, ``one_bwd_ms``: one GPU's forward and backward on the whole sequence (the backward is
    the recorded forward+backward minus the forward); ``alpha`` in s, ``beta`` in bytes/s."""
    if (variant, layout) not in SCHEMES:
        raise ValueError(f"variant, layout: expected one of {list(SCHEMES)}, got {(variant, layout)}")
    if alpha < 0 or beta <= 0:
        raise ValueError(f"alpha, beta: need alpha >= 0 s and beta > 0 bytes/s, got {alpha}, {beta}")
    if one_fwd_ms <= 0 or (one_bwd_ms is not None and one_bwd_ms <= 0):
        raise ValueError("one_fwd_ms, one_bwd_ms: one GPU's times must be positive")
    w, e, g_e = world, itemsize, GRAD_ITEMSIZE
    shard = 2 * batch * kv_heads * (seq_len // w) * head_dim          # one rank's K and V, elements
    t_f, t_b = one_fwd_ms * 1e-3, (one_bwd_ms or 0.0) * 1e-3

    def msg(nbytes, messages=1):
        return messages * alpha + nbytes / beta

    if variant == "ring":
        shares = step_shares(w, layout, causal)
        seconds = sum(max(t_f * s, msg(shard * e) if i < w - 1 else 0.0) for i, s in enumerate(shares))
        if one_bwd_ms is not None:                    # compute, then send K, V, dK, dV (the last step: dK, dV)
            seconds += sum(t_b * s + msg(shard * (e + g_e) if i < w - 1 else shard * g_e)
                           for i, s in enumerate(shares))
    elif variant == "all_gather_kv":
        share = sum(step_shares(w, layout, causal))
        seconds = msg((w - 1) * shard * e, w - 1) + t_f * share
        if one_bwd_ms is not None:                    # gather again, compute, reduce-scatter dK, dV
            seconds += msg((w - 1) * shard * e, w - 1) + t_b * share + msg((w - 1) * shard * g_e, w - 1)
    else:                                             # four all-to-alls (q, k, v in; o out), heads split evenly
        nbytes = cp.comm_bytes("ulysses", batch=batch, q_heads=q_heads, kv_heads=kv_heads, seq_len=seq_len,
                               head_dim=head_dim, world_size=w, itemsize=e)
        seconds = msg(nbytes, 4) + t_f / w
        if one_bwd_ms is not None:
            seconds += msg(nbytes, 4) + t_b / w
    return seconds * 1e3


def predicted_speedups(rows: list[dict], fits: dict) -> dict:
    """{(variant, layout, world, pass): {N: one GPU's recorded ms ÷ the model's ms}} for every time row;
    ``fits``: {world: (α in s, β in bytes/s)}, each run modelled with the link fitted on its own machine."""
    # each run timed its own one-GPU reference, and ``fits`` are the link of that one machine
    one = {(int(r["world"]), int(r["N"]), r["pass_"]): r["one_device_ms"] for r in _one_gpu(rows)}
    out = {}
    for r in rows:
        n, w = int(r["N"]), int(r["world"])
        bwd = one[(w, n, "fwd+bwd")] - one[(w, n, "fwd")] if r["pass_"] == "fwd+bwd" else None
        alpha, beta = fits[w]
        ms = predicted_ms(r["variant"], r["layout"], one_fwd_ms=one[(w, n, "fwd")], one_bwd_ms=bwd, alpha=alpha,
                          beta=beta, causal=str(r["causal"]) == "True", **{k: v for k, v in _shape(r).items()
                                                                            if k != "world_size"},
                          world=int(r["world"]))
        out.setdefault((r["variant"], r["layout"], int(r["world"]), r["pass_"]), {})[n] = r["one_device_ms"] / ms
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def bytes_agree(rows: list[dict]) -> list[dict]:
    """The time rows whose recorded bytes per rank differ from ``comm_bytes`` of their shape (none expected)."""
    bad = []
    for r in rows:
        expected = cp.comm_bytes(r["variant"], backward=r["pass_"] == "fwd+bwd",
                                 grad_itemsize=ITEMSIZE[r["dtype"]] if r["variant"] == "ulysses" else GRAD_ITEMSIZE,
                                 **_shape(r))
        if int(r["bytes_per_rank"]) != expected:
            bad.append({**r, "expected_bytes": expected})
    return bad


__all__ = ["SCHEMES", "PASSES", "load", "gpus", "load_tp_decode", "describe_tp", "describe_link", "describe_runs",
           "describe_each_world", "fitted",
           "speedups", "has_overlap", "overlap", "crossover", "measured_crossover", "step_shares", "predicted_ms",
           "predicted_speedups", "bytes_agree"]
