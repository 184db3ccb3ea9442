"""Naive attention timed: four separate kernels (QK^T, scale and mask, softmax, PV) against N, and
torch.profiler's split of their time; lesson 2 sets these against the cost model of
``attnkit.analysis.iomodel``.

    measure_naive_scaling(Ns, d=..., heads=...)   -> one row per N: total and per-step ms, fused SDPA beside
    profile_naive(N, d=..., heads=...)            -> one row per step: its time per call and share
    quadratic_fit(Ns, ms), scaling_exponent(Ns, ms)
    python -m attnkit.bench.suites naive_attention naive_profile      # on a GPU: the recorded CSVs
"""
from __future__ import annotations

import contextlib
import math
import os
import re

NAIVE_STEPS = ("QK^T", "scale+mask", "softmax", "PV")      # profiler labels and CSV names


def naive_attention_torch(q, k, v, mask):
    """Standard attention as four separate kernels, each labelled for the profiler.

    q, k, v: [B, H, N, d]; mask: [N, N] bool, True where a query may see a key. Returns [B, H, N, d].
    """
    from torch.profiler import record_function

    scale = 1.0 / math.sqrt(q.shape[-1])
    with record_function("QK^T"):
        s = q @ k.transpose(-1, -2)                                   # [B, H, N, N] to HBM
    with record_function("scale+mask"):
        s = (s * scale).masked_fill(~mask, float("-inf"))             # read S, write S
    with record_function("softmax"):
        p = s.softmax(dim=-1)                                         # read S, write P
    with record_function("PV"):
        return p @ v                                                  # read P and V, write O


def _inputs(N, d, heads, dtype, device, seed=0):
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(1, heads, N, d, generator=g).to(device=device, dtype=dtype) for _ in range(3))
    mask = torch.ones(N, N, dtype=torch.bool, device=device).tril()
    return q, k, v, mask


CPU_TIMING = dict(threads=1, warmup=2, min_rounds=7, min_seconds=2.0)


def cpu_best_ms(fns: dict, *, threads: int = 1, warmup: int = 2, min_rounds: int = 7,
                min_seconds: float = 2.0) -> dict:
    """Best (smallest) milliseconds of one call of each function in ``fns``, timed on the CPU.

    Robust on a small, shared machine: torch runs on ``threads`` threads (a parallel region of two
    threads stalls whenever another process takes one of two cores); every function runs ``warmup``
    times first; then rounds call each function once in turn, interleaved, until at least
    ``min_rounds`` rounds and ``min_seconds`` have passed. A burst of load from elsewhere slows a few
    rounds of every function alike, and the minimum over the rounds leaves it out.
    """
    import time

    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        best = dict.fromkeys(fns, math.inf)
        start, rounds = time.perf_counter(), 0
        while rounds < min_rounds or time.perf_counter() - start < min_seconds:
            for key, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                best[key] = min(best[key], (time.perf_counter() - t0) * 1e3)
            rounds += 1
    finally:
        torch.set_num_threads(saved)
    return best


def _timer(device):
    """Milliseconds of fn(): median by CUDA events (do_bench) on a GPU, best of rounds on the CPU."""
    if device == "cuda":
        from .recorder import time_ms

        return lambda fn: time_ms(fn)
    return lambda fn: cpu_best_ms({"fn": fn}, **{**CPU_TIMING, "min_seconds": 0.2})["fn"]


def _sdpa_flash_runs(q, k, v) -> bool:
    """Whether PyTorch's FlashAttention backend takes these inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sdpa(q, k, v, is_causal=True)
    except RuntimeError:
        return False
    return True


def _naive_step_fns(q, k, v, mask) -> dict:
    """The calls timed at one N: the whole naive attention, each of its steps, and fused SDPA.

    Time them inside ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``, which pins SDPA's backend.
    """
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-1, -2)
    sm = (s * scale).masked_fill(~mask, float("-inf"))
    p = sm.softmax(-1)
    fns = {"total_ms": lambda: naive_attention_torch(q, k, v, mask),
           "QK^T_ms": lambda: q @ k.transpose(-1, -2),
           "scale+mask_ms": lambda: (s * scale).masked_fill(~mask, float("-inf")),
           "softmax_ms": lambda: sm.softmax(-1),
           "PV_ms": lambda: p @ v}
    if _sdpa_flash_runs(q, k, v):
        fns["sdpa_flash_ms"] = lambda: sdpa(q, k, v, is_causal=True)
    return fns


def measure_naive_scaling(Ns, *, d: int, heads: int, dtype=None, device: str | None = None) -> list[dict]:
    """Time naive attention (four kernels, causal mask) at each N: one row per N with total ms and per step.

    On a GPU each call is timed by ``time_ms`` (median, CUDA events), one N after the other. On the CPU
    every call at every N is timed by ``cpu_best_ms`` in the same interleaved rounds (``CPU_TIMING``:
    one thread, best of at least 7 rounds and 2 s), so that load from elsewhere cannot make a larger N
    look faster than a smaller one. PyTorch's fused SDPA is pinned to its FlashAttention backend (NaN
    where that backend cannot run).
    """
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    keys = ("total_ms", "QK^T_ms", "scale+mask_ms", "softmax_ms", "PV_ms", "sdpa_flash_ms")

    def row(N, times):
        return {"N": N, "d": d, "heads": heads, "dtype": str(dtype).replace("torch.", ""), "device": device,
                **{key: times.get(key, float("nan")) for key in keys}}

    if device != "cuda":
        fns = {}
        for N in Ns:
            fns.update({(N, key): fn for key, fn in _naive_step_fns(*_inputs(N, d, heads, dtype, device)).items()})
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            best = cpu_best_ms(fns, **CPU_TIMING)
        return [row(N, {key: ms for (n, key), ms in best.items() if n == N}) for N in Ns]

    timer = _timer(device)
    rows = []
    for N in Ns:
        fns = _naive_step_fns(*_inputs(N, d, heads, dtype, device))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            rows.append(row(N, {key: timer(fn) for key, fn in fns.items()}))
        del fns
        torch.cuda.empty_cache()
    return rows


# A line of the profiler's own log (Kineto, written by C++ to file descriptor 2), such as
# "USDT:<date> <time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start" (the pattern below).
_PROFILER_LOG = re.compile(r"^[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def without_profiler_log():
    """Drop the profiler's log lines from stderr; pass every other line written meanwhile through."""
    import sys
    import tempfile

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):           # no file descriptor 2 to redirect: leave stderr alone
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            text = captured.read().decode(errors="replace")
            kept = "".join(line for line in text.splitlines(keepends=True) if not _PROFILER_LOG.match(line))
            if kept:
                sys.stderr.write(kept)


def profile_naive(N: int, *, d: int, heads: int, dtype=None, device: str | None = None, reps: int = 3) -> list[dict]:
    """torch.profiler breakdown of naive attention's four steps: one row per step with its time and share."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype or (torch.float16 if device == "cuda" else torch.float32)
    q, k, v, mask = _inputs(N, d, heads, dtype, device)
    naive_attention_torch(q, k, v, mask)                               # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with without_profiler_log(), profile(activities=activities) as prof:
        for _ in range(reps):
            naive_attention_torch(q, k, v, mask)
        if device == "cuda":
            torch.cuda.synchronize()
    totals = {}
    for event in prof.key_averages():
        if event.key in NAIVE_STEPS:
            if device == "cuda":
                us = getattr(event, "device_time_total", None)
                if us is None:
                    us = event.cuda_time_total
            else:
                us = event.cpu_time_total
            totals[event.key] = max(totals.get(event.key, 0.0), float(us))
    whole = sum(totals.values())
    return [{"step": name, "N": N, "d": d, "heads": heads, "dtype": str(dtype).replace("torch.", ""),
             "device": device, "ms_per_call": totals.get(name, 0.0) / reps / 1e3,
             "share": totals.get(name, 0.0) / whole if whole else 0.0} for name in NAIVE_STEPS]


def quadratic_fit(Ns, ms):
    """Least-squares t(N) = a·N² + b·N + c; returns (a, b, c)."""
    import numpy as np

    a, b, c = np.polyfit(np.asarray(Ns, dtype=float), np.asarray(ms, dtype=float), 2)
    return float(a), float(b), float(c)


def scaling_exponent(Ns, ms, last: int = 3) -> float:
    """The slope of log t against log N over the ``last`` largest N: 2 means t ∝ N²."""
    import numpy as np

    Ns, ms = np.asarray(Ns, dtype=float)[-last:], np.asarray(ms, dtype=float)[-last:]
    return float(np.polyfit(np.log(Ns), np.log(ms), 1)[0])


def run_naive_scaling() -> list[dict]:
    """The recorded suite of lesson 2: naive attention's time against N on this GPU."""
    return measure_naive_scaling((512, 1024, 2048, 4096, 8192), d=128, heads=32)


def run_naive_profile() -> list[dict]:
    """The recorded suite of lesson 2: torch.profiler's split of naive attention into its steps."""
    return profile_naive(4096, d=128, heads=32)
