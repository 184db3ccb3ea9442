"""Paged decode against the bandwidth ceilings and PyTorch's SDPA on a contiguous cache (GPU only).

Two shapes, fp16, 32 query heads, 8 KV heads, D = 128, pages of 16 tokens scattered at random:
- "batch": B = 64 sequences of 4096 tokens (B·Hkv = 512 programs: enough to fill the GPU);
- "long": B = 1 sequence of 32768 tokens (8 programs unless the tokens are split: split-KV).

Bytes counted = the K and V cache bytes read (B · N · Hkv · D · 2 bytes · 2); GB/s = bytes / time.
Timings are medians of CUDA-graph replays (``graph_ms``), as a serving loop runs its decode steps:
at B = 1 one step's GPU work (about 50 µs) is shorter than launching it from Python, so eager timing
would measure the host. The eager median (``eager_ms``) is recorded beside it. Inputs are checked
once beforehand (the check's small host copy is not part of the kernel). The long shape rotates
through three copies of its cache (3 × 134 MB) so that the 50 MB L2 cache cannot hold it. SDPA runs
on the same cache stored contiguously as [B, Hkv, N, D], each backend pinned with
``torch.nn.attention.sdpa_kernel``; the query heads that share a KV head are passed as the query
rows of that head (q as [B, Hkv, Hq/Hkv, D]), which is the same non-causal attention and needs no
copy of K or V.

The ceilings come from the course's one harness, ``streams.ceilings(timing="graph")``: a 1 GiB
device copy (bytes read + written) and the read-only stream ``read_stream`` (bytes read), both timed
from CUDA graphs like the kernels here. Every row carries them, the datasheet figure, and its
``fraction_of_copy``, ``fraction_of_read`` and ``fraction_of_datasheet``. A decode step only reads
the cache, so the read-only stream is its ceiling (``fraction_of_read``); a copy also writes, and
decode can beat it (``fraction_of_copy`` > 1 says nothing more).

``run() -> rows`` (one dict per measurement); ``make bench`` writes attnkit/bench/results/bench_paged.csv.

An FP8 (e4m3) cache, issue 16's target of 1.7× the fp16 cache's speed at the batch shape:
``run_fp8() -> rows`` times ``paged_decode`` on an fp16 and on an fp8 cache (read through
``k_scale``, ``v_scale``, one per KV head, dequantised in registers), then ``paged_extend`` with one
new token per sequence on both, and records the max error of the fp8 output against the fp16 output
and against float64 (of the fp16 cache, and of the dequantised fp8 cache). Bytes counted for the fp8
cache: one per element.

    python -m attnkit.bench.paged fp8 OUTDIR [--decode-only]   # OUTDIR/bench_paged_fp8.csv (GPU only)
"""
from __future__ import annotations

import math
import sys
import time

import torch

from .recorder import time_ms
from .streams import graph_ms  # median of CUDA-graph replays (no host launch overhead)

HQ, HKV, HEAD_DIM, PAGE = 32, 8, 128, 16
SHAPES = {"batch": (64, 4096), "long": (1, 32768)}     # name -> (B, context)
ROTATE = {"batch": 1, "long": 3}                        # copies of the cache timed in turn
CEILING_TIMING = "graph"                                # the kernels are timed from CUDA graphs
FP8_TARGET = 1.7                                        # fp16 time / fp8 time wanted (issue 16)
FP8_ACCURACY_SHAPE = (4, 4096)                          # (B, context) of the float64 comparison


def kv_bytes(batch: int, context: int, n_kv: int = HKV, head_dim: int = HEAD_DIM, itemsize: int = 2) -> int:
    """K and V bytes a decode step must read: the byte floor."""
    return 2 * batch * context * n_kv * head_dim * itemsize


def ceiling_rows(ceils: dict) -> list[dict]:
    """The two measured ceilings as rows of the table (shape "ceiling"), each with its fractions."""
    from .streams import with_ceilings

    nbytes = ceils["ceiling_bytes"]
    rows = []
    for method, gbps, moved, note in (
            ("device copy 1 GiB", ceils["copy_GBps"], 2 * nbytes, "bytes read + written"),
            ("read-only stream 1 GiB (read_stream)", ceils["read_GBps"], nbytes, "bytes read: decode's ceiling")):
        rows.append(with_ceilings(dict(shape="ceiling", method=method, B=0, context=0, num_splits=0,
                                       ms=moved / gbps / 1e6, eager_ms=float("nan"), bytes=moved, gbps=gbps,
                                       note=note), gbps, ceils))
    return rows


def measured_row(ceils: dict, *, shape: str, method: str, batch: int, context: int, splits: int, ms: float,
                 eager_ms: float, nbytes: int, note: str = "") -> dict:
    """One row of the table: bytes / ms as GB/s, with the ceilings and the three fractions."""
    from .streams import with_ceilings

    gbps = nbytes / ms / 1e6
    return with_ceilings(dict(shape=shape, method=method, B=batch, context=context, num_splits=splits, ms=ms,
                              eager_ms=eager_ms, bytes=nbytes, gbps=gbps, note=note), gbps, ceils)


def failed_note(exc: Exception) -> str:
    return f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"


def make_problem(batch: int, context: int, *, dtype=torch.float16, seed: int = 0, device="cuda"):
    """q [B, Hq, D]; a paged cache with each sequence's pages at random places; the same K/V dense
    as [B, Hkv, N, D]; block_table int32 [B, N / PAGE]; seq_lens int32 [B]."""
    if context % PAGE:
        raise ValueError(f"context: must be a multiple of the page size {PAGE}, got {context}")
    gen = torch.Generator(device=device).manual_seed(seed)
    pages_per_seq = context // PAGE
    num_pages = batch * pages_per_seq
    k_dense = torch.randn(batch, HKV, context, HEAD_DIM, device=device, dtype=dtype, generator=gen)
    v_dense = torch.randn(batch, HKV, context, HEAD_DIM, device=device, dtype=dtype, generator=gen)
    q = torch.randn(batch, HQ, HEAD_DIM, device=device, dtype=dtype, generator=gen)
    table = torch.randperm(num_pages, device=device, generator=gen).reshape(batch, pages_per_seq).int()
    k_pages = torch.empty(num_pages, PAGE, HKV, HEAD_DIM, device=device, dtype=dtype)
    v_pages = torch.empty_like(k_pages)
    # token t of sequence b -> page table[b, t // PAGE], offset t % PAGE
    k_pages[table.long()] = k_dense.transpose(1, 2).reshape(batch, pages_per_seq, PAGE, HKV, HEAD_DIM)
    v_pages[table.long()] = v_dense.transpose(1, 2).reshape(batch, pages_per_seq, PAGE, HKV, HEAD_DIM)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return dict(q=q, k_pages=k_pages, v_pages=v_pages, block_table=table, seq_lens=seq_lens,
                k_dense=k_dense, v_dense=v_dense)


def sdpa_call(p, backend_name: str, mode: str):
    """A zero-argument function running SDPA with one backend on the contiguous cache.

    mode "rows": q as [B, Hkv, Hq/Hkv, D] (a group's query heads as query rows of its KV head);
    mode "enable_gqa": q as [B, Hq, 1, D] with enable_gqa=True.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = getattr(SDPBackend, backend_name)
    q, k, v = p["q"], p["k_dense"], p["v_dense"]
    batch, n_heads, d = q.shape
    if mode == "rows":
        qq = q.view(batch, HKV, n_heads // HKV, d)

        def fn():
            with sdpa_kernel([backend]):
                return sdpa(qq, k, v).reshape(batch, n_heads, d)
    else:
        qq = q[:, :, None, :]

        def fn():
            with sdpa_kernel([backend]):
                return sdpa(qq, k, v, enable_gqa=True)[:, :, 0, :]
    return fn


def paged_call(p, variant: str, num_splits: int | None, config=None):
    from ..kernels import paged

    args = (p["q"], p["k_pages"], p["v_pages"], p["block_table"], p["seq_lens"])
    paged.check_paged_inputs(*args)
    splits = num_splits or paged.choose_num_splits(p["q"].shape[0], HKV, p["block_table"].shape[1] * PAGE,
                                                   p["q"].device)
    scale = HEAD_DIM ** -0.5
    return (lambda: paged.launch(*args, scale, splits, variant, config)), splits


def gathered_sdpa_call(p, backend_name: str):
    """Gather the pages into a dense cache, then SDPA: what a server without a paged kernel does."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = getattr(SDPBackend, backend_name)
    q, table = p["q"], p["block_table"].long()
    batch, n_heads, d = q.shape
    qq = q.view(batch, HKV, n_heads // HKV, d)

    def fn():
        k = p["k_pages"][table].reshape(batch, -1, HKV, d).transpose(1, 2)     # [B, Hkv, N, D] view
        v = p["v_pages"][table].reshape(batch, -1, HKV, d).transpose(1, 2)
        with sdpa_kernel([backend]):
            return sdpa(qq, k, v).reshape(batch, n_heads, d)
    return fn


def run(shapes=SHAPES, sdpa_backends=("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")) -> list[dict]:
    """Time every variant on each shape; one row per (shape, method), the ceilings first."""
    from .streams import ceilings

    ceils = ceilings(timing=CEILING_TIMING)
    rows = ceiling_rows(ceils)
    for name, (batch, context) in shapes.items():
        copies = [make_problem(batch, context, seed=i) for i in range(ROTATE[name])]
        p = copies[0]
        nbytes = kv_bytes(batch, context)

        def add(method, fn, splits=0, note=""):
            """fn(problem) -> o; timed over the rotating copies, per call."""
            calls = [(lambda c=c: fn(c)) for c in copies]

            def step():
                for call in calls:
                    call()
            try:
                step()
                torch.cuda.synchronize()
                eager = time_ms(step) / len(calls)
                ms = graph_ms(step) / len(calls)
            except Exception as exc:  # a backend that refuses this shape: say which and why
                rows.append(measured_row(ceils, shape=name, method=method, batch=batch, context=context,
                                         splits=splits, ms=float("nan"), eager_ms=float("nan"), nbytes=nbytes,
                                         note=failed_note(exc)))
                return
            rows.append(measured_row(ceils, shape=name, method=method, batch=batch, context=context, splits=splits,
                                     ms=ms, eager_ms=eager, nbytes=nbytes, note=note))

        def each(make):
            """fn(copy) calling, for each copy, the launcher ``make(copy)`` built (and checked) once."""
            built = {id(c): make(c) for c in copies}
            return lambda c: built[id(c)]()

        _, splits = paged_call(p, "grouped", None)
        add("paged grouped (auto splits)", each(lambda c: paged_call(c, "grouped", None)[0]), splits)
        for s in ((1, 16, 32, 64, 128) if name == "long" else (1, 2)):
            if s != splits:
                add(f"paged grouped {s} splits", each(lambda c, s=s: paged_call(c, "grouped", s)[0]), s)
        add("paged per-head", each(lambda c: paged_call(c, "per_head", 1)[0]), 1)
        if name == "long":
            add("paged per-head (auto splits)", each(lambda c: paged_call(c, "per_head", None)[0]), splits)
        for backend in sdpa_backends:
            for mode in ("rows", "enable_gqa"):
                add(f"sdpa {backend.split('_')[0].lower()} ({mode})",
                    each(lambda c, b=backend, m=mode: sdpa_call(c, b, m)), note="contiguous cache [B, Hkv, N, D]")
        add("gather + sdpa flash", each(lambda c: gathered_sdpa_call(c, "FLASH_ATTENTION")),
            note="pages gathered each call")
        p = copies = None  # free the memory before the next size
        torch.cuda.empty_cache()
    return rows


def ratios(rows: list[dict]) -> dict:
    """The headline ratios of one run: paged vs the read-only stream (its ceiling) and vs the copy,
    vs SDPA-cuDNN, grouped vs per-head."""
    def best(shape, prefix):
        times = [r["ms"] for r in rows if r["shape"] == shape and str(r["method"]).startswith(prefix)
                 and r["ms"] == r["ms"]]
        return min(times) if times else float("nan")

    def frac(shape, method, ceiling):
        return next(r[f"fraction_of_{ceiling}"] for r in rows if r["shape"] == shape and r["method"] == method)

    out = {}
    for shape in ("batch", "long"):
        if not any(r["shape"] == shape for r in rows):
            continue
        auto = next(r for r in rows if r["shape"] == shape and r["method"] == "paged grouped (auto splits)")
        out[f"{shape}: paged / read-only stream bandwidth"] = frac(shape, auto["method"], "read")
        out[f"{shape}: paged / copy bandwidth"] = frac(shape, auto["method"], "copy")
        out[f"{shape}: SDPA-cuDNN time / paged time"] = best(shape, "sdpa cudnn") / auto["ms"]
        out[f"{shape}: per-head time / grouped time"] = best(shape, "paged per-head") / auto["ms"]
    return out


# ------------------------------------------------------------------------------------ an FP8 cache
def fp8_cache(p) -> dict:
    """Problem ``p`` with its cache quantised to e4m3, one scale per KV head (``fp8_scales``: amax / 448),
    and cu_seqlens_q for one new token per sequence (decode as paged_extend's one-token case)."""
    from ..kernels.fp8_cache import fp8_scales, quantize_fp8

    k_scale, v_scale = fp8_scales(p["k_pages"]), fp8_scales(p["v_pages"])      # fp32 [Hkv]
    batch = p["q"].shape[0]
    return dict(p, k8=quantize_fp8(p["k_pages"], k_scale), v8=quantize_fp8(p["v_pages"], v_scale),
                k_scale=k_scale, v_scale=v_scale,
                cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32, device=p["q"].device))


def cache_of(p, cache: str) -> tuple:
    """(k_pages, v_pages, {k_scale, v_scale} or {}) of p's "fp16" or "fp8" cache."""
    if cache == "fp8":
        return p["k8"], p["v8"], dict(k_scale=p["k_scale"], v_scale=p["v_scale"])
    if cache == "fp16":
        return p["k_pages"], p["v_pages"], {}
    raise ValueError(f"cache: expected 'fp16' or 'fp8', got {cache!r}")


def decode_call(p, cache: str):
    """A zero-argument paged_decode (grouped, one split: B·Hkv = 512 programs fill the GPU) over p's
    cache, inputs checked once here and not again per call (as ``paged_call``)."""
    from ..kernels import paged

    k, v, scales = cache_of(p, cache)
    args = (p["q"], k, v, p["block_table"], p["seq_lens"])
    paged.check_paged_inputs(*args, **scales)
    return lambda: paged.launch(*args, HEAD_DIM ** -0.5, 1, "grouped", **scales)


def extend_call(p, cache: str):
    """A zero-argument paged_extend over p's cache, one new token per sequence. The inputs are checked
    once here; the call checks shapes only (no host synchronisation, capturable)."""
    from ..kernels.paged_extend import paged_extend

    k, v, scales = cache_of(p, cache)
    args = (p["q"], k, v, p["block_table"], p["seq_lens"], p["cu_seqlens_q"])
    paged_extend(*args, **scales, max_q_len=1, check_values=True)
    return lambda: paged_extend(*args, **scales, max_q_len=1, check_values=False)


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def max_abs_error(out, ref) -> float:
    return float((out.detach().double().cpu() - ref.detach().double().cpu()).abs().max())


def fp8_accuracy_rows(batch: int, context: int, *, seed: int = 11, device="cuda",
                      with_extend: bool = True) -> list[dict]:
    """Max error of paged_decode's output over the fp8 cache on random inputs: against its output
    over the fp16 cache, against float64 of the fp16 cache (what a user sees) and of the dequantised
    fp8 cache (the kernel's arithmetic alone); with ``with_extend``, paged_extend's one-token case too."""
    from ..kernels.paged_extend import paged_extend_ref
    from ..tolerances import rel_error

    p = fp8_cache(make_problem(batch, context, seed=seed, device=device))
    o8, o16 = decode_call(p, "fp8")(), decode_call(p, "fp16")()
    index = (p["block_table"], p["seq_lens"], p["cu_seqlens_q"])
    ref16 = paged_extend_ref(p["q"], p["k_pages"], p["v_pages"], *index)
    ref8 = paged_extend_ref(p["q"], p["k8"], p["v8"], *index, k_scale=p["k_scale"], v_scale=p["v_scale"])
    cases = [("paged_decode: fp8 cache vs fp16 cache", o8, o16),
             ("paged_decode: fp8 cache vs float64 of the fp16 cache", o8, ref16),
             ("paged_decode: fp8 cache vs float64 of the dequantised fp8 cache", o8, ref8),
             ("paged_decode: fp16 cache vs float64 of the fp16 cache", o16, ref16)]
    if with_extend:
        e8, e16 = extend_call(p, "fp8")(), extend_call(p, "fp16")()
        cases += [("paged_extend: fp8 cache vs paged_decode fp8 cache", e8, o8),
                  ("paged_extend: fp8 cache vs float64 of the dequantised fp8 cache", e8, ref8),
                  ("paged_extend: fp16 cache vs float64 of the fp16 cache", e16, ref16)]
    return [dict(kind="accuracy", method=what, B=batch, context=context, max_abs_error=max_abs_error(out, ref),
                 rel_error=float(rel_error(out, ref)), max_abs_reference=float(ref.double().abs().max()))
            for what, out, ref in cases]


FP8_CASES = {  # method -> (kernel, cache)
    "paged_decode grouped, fp16 cache": ("decode", "fp16"),
    "paged_decode grouped, fp8 cache": ("decode", "fp8"),
    "paged_extend 1 token, fp16 cache": ("extend", "fp16"),
    "paged_extend 1 token, fp8 cache": ("extend", "fp8"),
}


def fp8_ratios(rows: list[dict]) -> dict:
    """fp16-cache time / fp8-cache time of each kernel, from CUDA graphs and eager; target FP8_TARGET."""
    out = {}
    for timing, key in (("graph", "ms"), ("eager", "eager_ms")):
        ms = {r["method"]: r[key] for r in rows if r.get("kind") == "timing"}
        for kernel in ("paged_decode grouped", "paged_extend 1 token"):
            fp16, fp8 = (ms.get(f"{kernel}, {c} cache", float("nan")) for c in ("fp16", "fp8"))
            out[f"{kernel}: fp16 / fp8 time ({timing})"] = fp16 / fp8
    out["target"] = FP8_TARGET
    return out


def time_case(fn, device) -> tuple[float, float, str]:
    """(graph ms, eager ms, note) of fn; a failure is a note, never an exception."""
    try:
        fn()
        synchronize(device)
        eager = time_ms(fn)
    except Exception as exc:
        return float("nan"), float("nan"), failed_note(exc)
    try:
        return graph_ms(fn), eager, ""
    except Exception as exc:  # not capturable: the eager time is still recorded
        return float("nan"), eager, "CUDA graph " + failed_note(exc)


def run_fp8(outdir=None, *, shape=SHAPES["batch"], accuracy_shape=FP8_ACCURACY_SHAPE, with_extend: bool = True,
            log=print, device="cuda") -> list[dict]:
    """The FP8 cache at the batch shape (B = 64, context 4k, Hq = 32, Hkv = 8, D = 128): paged_decode
    on the fp16 and the fp8 cache timed from CUDA graphs, the ceilings timed the same way, the accuracy
    on a smaller random problem; then (``with_extend``) paged_extend's one-token case on both caches.
    Each case that fails is recorded with its error. With ``outdir``, bench_paged_fp8.csv is rewritten
    after every stage, so a run cut short keeps what it measured. Compiles paged_decode twice,
    read_stream once, and with_extend paged_extend twice."""
    from .recorder import write_results

    start = time.perf_counter()
    rows: list[dict] = []

    def say(*args):
        log(f"[{time.perf_counter() - start:6.1f} s]", *args, flush=True)

    def save():
        if outdir is not None and rows:
            write_results("paged_fp8", rows, outdir)

    batch, context = shape
    p = fp8_cache(make_problem(batch, context, device=device))
    say(f"problem B={batch} context={context} Hq={HQ} Hkv={HKV} D={HEAD_DIM}: fp16 cache "
        f"{kv_bytes(batch, context) / 1e6:.0f} MB, fp8 cache {kv_bytes(batch, context, itemsize=1) / 1e6:.0f} MB")
    decode_timed, decode_diff = _fp8_measure(p, ("decode",), device, say)
    extend_p = p if with_extend else None
    p = None  # free the memory before the ceilings
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    ceils = _fp8_ceilings(say)
    rows += _fp8_timing_rows(decode_timed, decode_diff, ceils, shape)
    save()
    say(f"paged_decode fp16 / fp8 time: {fp8_ratios(rows)['paged_decode grouped: fp16 / fp8 time (graph)']:.3f} "
        f"(target {FP8_TARGET}); fp8 output vs fp16 output: max abs error {decode_diff:.2e}")
    rows += _fp8_accuracy(accuracy_shape, device, False, say)
    save()
    if with_extend:
        extend_timed, extend_diff = _fp8_measure(extend_p, ("extend",), device, say)
        extend_p = None
        rows += _fp8_timing_rows(extend_timed, extend_diff, ceils, shape)
        rows += _fp8_accuracy(accuracy_shape, device, True, say)
        save()
    for name, value in fp8_ratios(rows).items():
        say(f"{name}: {value:.3f}")
    say("done")
    return rows


def _fp8_measure(p, kernels, device, say) -> tuple[list[tuple], float]:
    """run_fp8's timings of the cases of ``FP8_CASES`` whose kernel is in ``kernels``, on both caches of
    ``p``: [(method, cache, graph ms, eager ms, note)], and the largest difference of the two outputs."""
    timed, outputs = [], {}
    for method, (kernel, cache) in FP8_CASES.items():
        if kernel not in kernels:
            continue
        try:
            fn = (decode_call if kernel == "decode" else extend_call)(p, cache)
            outputs[cache] = fn()
        except Exception as exc:
            timed.append((method, cache, float("nan"), float("nan"), failed_note(exc)))
            say(f"{method}: {failed_note(exc)}")
            continue
        timed.append((method, cache, *time_case(fn, device)))
        say(f"{method}: {timed[-1][2]:.4f} ms (graph), {timed[-1][3]:.4f} ms (eager) {timed[-1][4]}")
    diff = (max_abs_error(outputs["fp8"], outputs["fp16"]) if len(outputs) == 2 else float("nan"))
    return timed, diff


def _fp8_ceilings(say) -> dict:
    """run_fp8's bandwidth ceilings (``streams.ceilings``), or NaNs and the error when they fail."""
    try:
        from . import streams

        ceils = streams.ceilings(timing=CEILING_TIMING)
        say(f"ceilings ({ceils['ceiling_timing']}): copy {ceils['copy_GBps']:.0f} GB/s, "
            f"read {ceils['read_GBps']:.0f} GB/s, datasheet {ceils['datasheet_GBps']:.0f} GB/s")
    except Exception as exc:
        nan = float("nan")
        ceils = dict(copy_GBps=nan, read_GBps=nan, datasheet_GBps=nan, ceiling_timing=failed_note(exc),
                     ceiling_bytes=0)
        say(f"ceilings: {failed_note(exc)}")
    return ceils


def _fp8_timing_rows(timed, diff, ceils, shape) -> list[dict]:
    """run_fp8's rows of the timings ``_fp8_measure`` returned, at the batch ``shape`` (B, context)."""
    batch, context = shape
    rows = []
    for method, cache, ms, eager, note in timed:
        row = measured_row(ceils, shape="batch", method=method, batch=batch, context=context, splits=1, ms=ms,
                           eager_ms=eager, nbytes=kv_bytes(batch, context, itemsize=1 if cache == "fp8" else 2),
                           note=note)
        rows.append(dict(kind="timing", cache="fp8 e4m3" if cache == "fp8" else "fp16", **row,
                         max_abs_error_vs_fp16=diff if cache == "fp8" else float("nan")))
    return rows


def _fp8_accuracy(accuracy_shape, device, with_extend: bool, say) -> list[dict]:
    """run_fp8's accuracy rows: paged_decode's (``with_extend`` False) or paged_extend's, or one row with
    the error when they fail."""
    rows = []
    try:
        acc = fp8_accuracy_rows(*accuracy_shape, device=device, with_extend=with_extend)
        acc = acc[4:] if with_extend else acc
        rows.extend(acc)
        for r in acc:
            say(f"{r['method']}: max abs error {r['max_abs_error']:.2e}, rel error {r['rel_error']:.2e}")
    except Exception as exc:
        if with_extend:
            rows.append(dict(kind="accuracy", method="paged_extend accuracy", note=failed_note(exc)))
            say(f"paged_extend accuracy: {failed_note(exc)}")
        else:
            rows.append(dict(kind="accuracy", method="paged_decode accuracy", B=accuracy_shape[0],
                             context=accuracy_shape[1], note=failed_note(exc)))
            say(f"accuracy: {failed_note(exc)}")
    return rows


def main(argv=None) -> int:
    """``python -m attnkit.bench.paged fp8 OUTDIR``: run_fp8, writing OUTDIR/bench_paged_fp8.csv."""
    import os

    argv = sys.argv[1:] if argv is None else argv
    decode_only = "--decode-only" in argv
    argv = [a for a in argv if a != "--decode-only"]
    if len(argv) != 2 or argv[0] != "fp8":
        print("usage: python -m attnkit.bench.paged fp8 OUTDIR [--decode-only]")
        return 2
    if not torch.cuda.is_available():
        print("the FP8 benchmark needs a CUDA GPU")
        return 1
    os.environ.setdefault("ATTNKIT_AUTOTUNE", "0")
    rows = run_fp8(argv[1], with_extend=not decode_only)
    failed = [r for r in rows if "failed" in str(r.get("note", ""))]
    headline = fp8_ratios(rows)["paged_decode grouped: fp16 / fp8 time (graph)"]
    return 1 if failed or math.isnan(headline) else 0


__all__ = ["run", "run_fp8", "ratios", "fp8_ratios", "make_problem", "kv_bytes", "ceiling_rows", "measured_row",
           "SHAPES"]


if __name__ == "__main__":
    sys.exit(main())
