"""GPU sessions for paged decode: tune and record, or time the eager host path, the FP8 cache and the head dims.

    PYTHONPATH=. python scripts/gpu_paged.py OUTDIR                       # --mode record (as before)
    PYTHONPATH=. python scripts/gpu_paged.py --out OUTDIR --mode eager fp8 headdims

--mode record (the default with a positional OUTDIR):
1. sweeps launch configurations (tokens per iteration, warps, pipeline stages) of both kernels and the
   split count of the long shape, and keeps the fastest of each for this run;
2. checks every variant, split count and dtype against the float64 reference on fresh random inputs
   with permuted page tables, ragged lengths (seq_len 1, partial last pages), GQA group sizes 1, 4, 8
   and MQA, NaN in every slot a sequence does not own and NaN-poisoned outputs; and CPU tensors on
   this GPU machine;
3. records the suite paged into OUTDIR with attnkit.bench.suites.record (what
   ``python -m attnkit.bench.suites --out OUTDIR paged`` does): every row with the copy and
   read-only-stream ceilings of ``streams.ceilings(timing="graph")``, timed from CUDA graphs like
   the kernels, and its fractions of each and of the datasheet figure;
4. prints the ratios last.

--mode eager (OUTDIR/bench_paged_eager.csv): ``paged_decode`` called eagerly as a user calls it (its
default device-side value check; and with check_values=False) against cuDNN's SDPA called eagerly on the
same cache stored contiguously ([B, Hkv, N, D], a group's query heads as query rows), side by side in
one process, at B = 1 (4k, 32k) and B = 64 (4k); Hq = 32, Hkv = 8, D = 128, fp16. Each call is timed
three ways: back to back (200 calls, wall clock between two synchronisations: a decode loop's time per
step, the larger of host and GPU time), by do_bench (median, CUDA events) and replayed from a CUDA graph
(the GPU's time alone); torch.profiler counts one call's kernel launches and host synchronisations.
Ratios: paged / cuDNN per shape, target 1.5 at B = 1 (issue 40).

--mode fp8 (OUTDIR/bench_paged_fp8_ratio.csv): fp16-cache time / fp8-cache time of ``paged_decode``
(grouped, the default split count, CUDA graphs) at (B, context) = (64, 4k), (16, 16k), (1, 32k); first
checks against float64 of the dequantised cache (D = 128 and 80, both variants, 1 and 3 splits), then a
sweep of the fp8 cache's launch configurations at (64, 4k) (tokens per iteration, warps, stages), then of
the split count at the fastest, which are used for the three shapes (the split count at (64, 4k) only) and
recorded beside the default's time. Bytes halve, so ~1.9 is the bound; the target is 1.6 at (64, 4k).

--mode headdims (OUTDIR/bench_paged_headdims.csv): GB/s of ``paged_decode`` (grouped, CUDA graphs) at
B = 64, 4k, fp16, pages of 16, for every head size of vLLM's grid (64, 80, 96, 112, 120, 128, 192, 256;
and (D, Dv) = (192, 128)), each checked against float64 on a small problem first, at its default launch
configuration and at the candidates ``HEADDIM_CANDIDATES``; bandwidth as a fraction of D = 128's
(target: at least 0.9 of it, issue 40).

Each mode ends with lines ``BEFORE/AFTER <what>: before X (GPU, date) -> now Y  target T  met / NOT met``:
before is the shipped CSV of attnkit/bench/results/ (the run recorded before this one), now this run's.

The FP8 cache's accuracy and paged_extend: ``python -m attnkit.bench.paged fp8 OUTDIR`` (about a minute).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from attnkit.bench import paged as bench_paged
from attnkit.bench.recorder import provenance, read_results, time_ms, write_results
from attnkit.bench.streams import graph_ms
from attnkit.bench.suites import record
from attnkit.kernels import paged
from attnkit.tolerances import rel_error, tolerance


def log(*args):
    print(*args, flush=True)


def recorded(name: str) -> list[dict]:
    """The rows of the shipped ``bench_<name>.csv`` (attnkit/bench/results/: the run before this one), or []."""
    try:
        return read_results(name)
    except FileNotFoundError:
        return []


def before_after(label: str, before: float | None, now: float, target: str = "", met: bool | None = None,
                 source: list[dict] | None = None) -> None:
    """One line: the shipped CSV's value (its GPU and date), this run's, and the target with met / NOT met."""
    stamp = f" ({source[0]['gpu']}, {source[0]['date']})" if source else ""
    was = f"{before:.3f}{stamp}" if before is not None and before == before else "not recorded"
    verdict = "" if met is None else ("  met" if met else "  NOT met")
    log(f"BEFORE/AFTER {label}: before {was} -> now {now:.3f}" + (f"  target {target}{verdict}" if target else ""))


# ------------------------------------------------------------------------------------------- sweep
def sweep():
    """Fastest LaunchConfig per variant at the batch shape, and the best split count at the long one."""
    p = bench_paged.make_problem(*bench_paged.SHAPES["batch"])
    args = (p["q"], p["k_pages"], p["v_pages"], p["block_table"], p["seq_lens"])
    nbytes = bench_paged.kv_bytes(*bench_paged.SHAPES["batch"])
    best = {}
    for variant, block_ns in (("grouped", (32, 64, 128)), ("per_head", (32, 64, 128))):
        results = []
        for block_n in block_ns:
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    config = paged.LaunchConfig(block_n, warps, stages)
                    try:
                        ms = bench_paged.graph_ms(lambda: paged.launch(*args, 0.088, 1, variant, config))
                    except Exception as exc:
                        log(f"sweep {variant} {config}: failed {type(exc).__name__}")
                        continue
                    results.append((ms, config))
                    log(f"sweep {variant} {config}: {ms:.4f} ms  {nbytes / ms / 1e6:.0f} GB/s")
        results.sort(key=lambda r: r[0])
        best[variant] = results[0][1]
    p = args = None  # free the memory before the next size
    torch.cuda.empty_cache()
    for variant, config in best.items():      # this run's timings use this run's fastest (fp16, D = 128)
        paged.GPU_CONFIGS[variant, "16", paged.head_dim_class(bench_paged.HEAD_DIM)] = config
    p = bench_paged.make_problem(*bench_paged.SHAPES["long"])
    args = (p["q"], p["k_pages"], p["v_pages"], p["block_table"], p["seq_lens"])
    nbytes = bench_paged.kv_bytes(*bench_paged.SHAPES["long"])
    splits = []
    for s in (8, 16, 24, 32, 48, 64, 96, 128):
        ms = bench_paged.graph_ms(lambda: paged.launch(*args, 0.088, s, "grouped"))
        splits.append((ms, s))
        log(f"sweep long grouped splits={s}: {ms:.4f} ms  {nbytes / ms / 1e6:.0f} GB/s")
    p = args = None  # free the memory before the next size
    torch.cuda.empty_cache()
    return best, min(splits)[1]


# ------------------------------------------------------------------------------------------ checks
def make_case(gen, lens, hq, hkv, d, page_size, dtype, device):
    """Like tests/kernels/test_paged.py: permuted pages, NaN where no sequence writes, garbage past tables."""
    batch = len(lens)
    per_seq = [-(-n // page_size) for n in lens]
    num_pages = sum(per_seq) + 5
    q = torch.randn(batch, hq, d, generator=gen, device=device).to(dtype)
    k_pages = torch.full((num_pages, page_size, hkv, d), float("nan"), device=device, dtype=dtype)
    v_pages = torch.full_like(k_pages, float("nan"))
    order = torch.randperm(num_pages, generator=gen, device=device)
    table = torch.full((batch, max(per_seq) + 2), 10 ** 7, dtype=torch.int32, device=device)
    used = 0
    for b, n in enumerate(lens):
        pages = order[used: used + per_seq[b]]
        used += per_seq[b]
        table[b, : len(pages)] = pages.int()
        t = torch.arange(n, device=device)
        k_pages[pages[t // page_size], t % page_size] = torch.randn(n, hkv, d, generator=gen, device=device).to(dtype)
        v_pages[pages[t // page_size], t % page_size] = torch.randn(n, hkv, d, generator=gen, device=device).to(dtype)
    return q, k_pages, v_pages, table, torch.tensor(lens, dtype=torch.int32, device=device)


def check_all() -> list[str]:
    failures = []
    saved = paged.new_buffer
    paged.new_buffer = lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    gen = torch.Generator(device="cuda").manual_seed(2024)
    cases = [  # (lens, Hq, Hkv, D, page_size, dtype)
        ([1000, 1, 517, 64], 32, 8, 128, 16, torch.float16),
        ([3001, 17], 8, 8, 64, 16, torch.bfloat16),
        ([777, 300, 5], 32, 4, 128, 16, torch.float32),
        ([2049, 33], 32, 1, 128, 5, torch.float16),         # MQA, page size not a power of two
        ([129, 64, 1], 8, 1, 256, 1, torch.float16),        # D = 256, one token per page
        ([4100], 16, 2, 32, 32, torch.bfloat16),
    ]
    for lens, hq, hkv, d, page, dtype in cases:
        case = make_case(gen, lens, hq, hkv, d, page, dtype, "cuda")
        ref = paged.paged_decode_ref(*case)
        bound = tolerance(dtype, "cuda")
        for variant in paged.VARIANTS:
            for splits in (None, 1, 3, 17):
                o = paged.paged_decode(*case, variant=variant, num_splits=splits)
                err = rel_error(o, ref)
                label = f"{variant} splits={splits} lens={lens} Hq={hq} Hkv={hkv} D={d} page={page} {str(dtype)[6:]}"
                if not err <= bound or o.dtype != dtype:
                    failures.append(f"{label}: {err:.2e}")
        log(f"checked lens={lens} Hq={hq} Hkv={hkv} D={d} page={page} {str(dtype)[6:]}")
    # the bench shape itself, against float64
    p = bench_paged.make_problem(2, 4096, seed=7)
    args = (p["q"], p["k_pages"], p["v_pages"], p["block_table"], p["seq_lens"])
    ref = paged.paged_decode_ref(*args)
    for variant in paged.VARIANTS:
        for splits in (None, 1, 32):
            err = rel_error(paged.paged_decode(*args, variant=variant, num_splits=splits), ref)
            if not err <= tolerance(torch.float16, "cuda"):
                failures.append(f"bench shape {variant} splits={splits}: {err:.2e}")
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION"):
        for mode in ("rows", "enable_gqa"):
            try:
                err = rel_error(bench_paged.sdpa_call(p, backend, mode)(), ref)
                log(f"sdpa {backend} {mode} vs float64: {err:.2e}")
            except Exception as exc:
                log(f"sdpa {backend} {mode}: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
    # CPU tensors on a GPU machine: computed on the GPU and copied back
    cpu_case = make_case(torch.Generator().manual_seed(1), [37, 3], 4, 2, 16, 8, torch.float16, "cpu")
    err = rel_error(paged.paged_decode(*cpu_case, num_splits=2), paged.paged_decode_ref(*cpu_case))
    if not err <= tolerance(torch.float16, "cpu"):
        failures.append(f"cpu tensors: {err:.2e}")
    paged.new_buffer = saved
    return failures


def record_mode(out: Path) -> int:
    best, best_splits = sweep()
    log(f"best configs {best}; best long splits {best_splits}; "
        f"heuristic picks {paged.choose_num_splits(1, 8, 32768, 'cuda')}")
    failures = check_all()
    log("CHECKS:", "all passed" if not failures else f"{len(failures)} FAILED")
    for f in failures:
        log("  FAIL", f)
    (path,) = record(["paged"], out)
    log(f"wrote {path}")
    rows = read_results("paged", out)
    log(f"ceilings timed as {rows[0]['ceiling_timing']}: copy {rows[0]['copy_GBps']:.0f} GB/s, "
        f"read-only {rows[0]['read_GBps']:.0f} GB/s, datasheet {rows[0]['datasheet_GBps']:.0f} GB/s")
    log(f"{'shape':7} {'method':36} {'splits':>6} {'ms':>8} {'GB/s':>7} {'of read':>8} {'of copy':>8} {'of sheet':>8}")
    for r in rows:
        log(f"{r['shape']:7} {r['method']:36} {r['num_splits']:>6} {r['ms']:8.4f} {r['gbps']:7.0f} "
            f"{r['fraction_of_read']:8.2%} {r['fraction_of_copy']:8.2%} {r['fraction_of_datasheet']:8.2%} "
            f"{r['note'] if str(r['note']).startswith('failed') else ''}")
    for name, value in bench_paged.ratios(rows).items():
        log(f"{name}: {value:.3f}")
    log(f"configs used: {[(key, c) for key, c in paged.GPU_CONFIGS.items() if key[1:] == ('16', 'narrow')]}")
    return 1 if failures else 0


# ------------------------------------------------------------------------------------------- eager
EAGER_SHAPES = ((1, 4096), (1, 32768), (64, 4096))      # (B, context)
EAGER_TARGET = 1.5                                      # paged eager time / cuDNN eager time at B = 1 (issue 40)
LOOP_CALLS = 200


def loop_us(fn, calls: int = LOOP_CALLS) -> float:
    """Microseconds per call of ``calls`` back-to-back calls, wall clock between two synchronisations:
    what a decode loop pays per step (the larger of the host's and the GPU's time per call)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):                                  # the best of three runs: the least disturbed
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def per_call_counts(fn, calls: int = 20) -> tuple[float, float]:
    """(kernel launches, host synchronisations) per call of fn, by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()

    def count(*names):
        return sum(e.count for e in events if any(n in e.key for n in names)) / calls
    syncs = count("cudaStreamSynchronize", "cudaDeviceSynchronize") - 1 / calls   # less the final one
    return count("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"), max(syncs, 0.0)


def eager_mode(out: Path) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    rows = []
    for batch, context in EAGER_SHAPES:
        p = bench_paged.make_problem(batch, context)
        args = (p["q"], p["k_pages"], p["v_pages"], p["block_table"], p["seq_lens"])
        q_rows = p["q"].view(batch, bench_paged.HKV, -1, bench_paged.HEAD_DIM)
        ref = sdpa(q_rows.float(), p["k_dense"].float(), p["v_dense"].float()).reshape(p["q"].shape)
        methods = {
            "paged_decode eager (default: check_values='device')": lambda: paged.paged_decode(*args),
            "paged_decode eager (check_values=False)": lambda: paged.paged_decode(*args, check_values=False),
            "sdpa cudnn eager (contiguous cache)": lambda: sdpa(q_rows, p["k_dense"], p["v_dense"]),
        }
        times, bench_times = {}, {}
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):      # entered once: the call alone is timed
            for method, fn in methods.items():
                row = dict(B=batch, context=context, Hq=bench_paged.HQ, Hkv=bench_paged.HKV, D=bench_paged.HEAD_DIM,
                           method=method, num_splits=paged.choose_num_splits(batch, bench_paged.HKV, context, "cuda"))
                try:
                    err = rel_error(fn().reshape(p["q"].shape).float(), ref)
                    paged.raise_pending_errors()
                    row.update(rel_error_vs_fp32=err, loop_us=loop_us(fn), do_bench_us=time_ms(fn) * 1e3,
                               graph_us=graph_ms(fn) * 1e3)
                    row["launches_per_call"], row["host_syncs_per_call"] = per_call_counts(fn)
                    paged.raise_pending_errors()
                except Exception as exc:
                    row["note"] = bench_paged.failed_note(exc)
                rows.append(row)
                times[method] = row.get("loop_us", float("nan"))
                bench_times[method] = row.get("do_bench_us", float("nan"))
                log(f"B={batch:3} ctx={context:6} {method:52} " + " ".join(
                    f"{k}={row[k]:.4g}" for k in ("loop_us", "do_bench_us", "graph_us", "launches_per_call",
                                                  "host_syncs_per_call", "rel_error_vs_fp32") if k in row)
                    + (f" {row['note']}" if "note" in row else ""))
        cudnn = "sdpa cudnn eager (contiguous cache)"
        shipped = recorded("paged_eager")
        for method in list(methods)[:2]:
            for timing, measured in (("loop_us", times), ("do_bench_us", bench_times)):
                ratio = measured[method] / measured[cudnn]
                name = f"ratio: {method} / {cudnn} ({timing})"
                rows.append(dict(B=batch, context=context, method=name,
                                 ratio=ratio, target=EAGER_TARGET if batch == 1 else float("nan")))
                log(f"B={batch:3} ctx={context:6} {method} / cuDNN eager ({timing}): {ratio:.3f}"
                    + (f" (target <= {EAGER_TARGET})" if batch == 1 else ""))
                was = [r["ratio"] for r in shipped
                       if r["method"] == name and r["B"] == batch and r["context"] == context]
                before_after(f"eager B={batch} ctx={context} {method} / cuDNN ({timing})", was[0] if was else None,
                             ratio, f"<= {EAGER_TARGET}" if batch == 1 else "", ratio <= EAGER_TARGET if batch == 1
                             else None, shipped)
        p = args = q_rows = ref = methods = None
        torch.cuda.empty_cache()
    log(f"wrote {write_results('paged_eager', rows, out)}")
    return rows


# --------------------------------------------------------------------------------------------- fp8
FP8_SHAPES = ((64, 4096), (16, 16384), (1, 32768))
FP8_TARGET = 1.6                                        # fp16-cache time / fp8-cache time at (64, 4k), issue 40
# the gathered K/V rows are copied asynchronously (cp.async) into a num_stages-deep pipeline
FP8_SWEEP = [paged.LaunchConfig(n, w, s) for n in (64, 128, 256) for w in (4, 8) for s in (2, 3)]
# splits per sequence at (64, 4k): 512 programs leave the last wave of resident programs part-empty
FP8_SPLITS = (1, 2, 3, 4)


def fp8_checks() -> list[dict]:
    """The FP8 cache against float64 of the dequantised cache on small problems (ragged lengths, permuted
    pages): D = 128 and D = 80 (two register tiles), grouped and per-head, one split and three."""
    from attnkit.kernels.fp8_cache import fp8_scales, quantize_fp8

    rows = []
    for d in (128, 80):
        q, k, v, table, lens = paged_problem(3, 640, d, d, seed=d)
        lens[:2] = torch.tensor([1, 333], dtype=torch.int32)
        k_scale, v_scale = fp8_scales(k), fp8_scales(v)
        case = (q, quantize_fp8(k, k_scale), quantize_fp8(v, v_scale), table, lens)
        ref = paged.paged_decode_ref(*case, k_scale=k_scale, v_scale=v_scale)
        for variant in paged.VARIANTS:
            for splits in (1, 3):
                err = rel_error(paged.paged_decode(*case, variant=variant, num_splits=splits, k_scale=k_scale,
                                                   v_scale=v_scale), ref)
                bound = tolerance(torch.float16, "cuda")
                rows.append(dict(kind="check", B=3, context=640, D=d, method=f"{variant} splits={splits}",
                                 rel_error_small=err, bound=bound))
                log(f"fp8 check D={d} {variant} splits={splits}: {err:.2e} against float64"
                    + ("" if err <= bound else "  FAILED"))
    return rows


def fp8_mode(out: Path) -> list[dict]:
    rows = fp8_checks()
    p = bench_paged.fp8_cache(bench_paged.make_problem(*FP8_SHAPES[0]))
    scales = dict(k_scale=p["k_scale"], v_scale=p["v_scale"])
    args8 = (p["q"], p["k8"], p["v8"], p["block_table"], p["seq_lens"])
    swept = []
    default = paged.default_config("grouped", paged.FP8, bench_paged.HEAD_DIM)
    for config in FP8_SWEEP:
        try:
            ms = graph_ms(lambda c=config: paged.launch(*args8, bench_paged.HEAD_DIM ** -0.5, 1, "grouped", c,
                                                        **scales))
        except Exception as exc:
            log(f"fp8 sweep {config}: {bench_paged.failed_note(exc)}")
            continue
        swept.append((ms, config))
        rows.append(dict(kind="sweep", B=FP8_SHAPES[0][0], context=FP8_SHAPES[0][1], cache="fp8 e4m3",
                         block_n=config.block_n, num_warps=config.num_warps, num_stages=config.num_stages,
                         num_splits=1, ms=ms))
        log(f"fp8 sweep {config}{' (default)' if config == default else ''}: {ms * 1e3:.1f} us")
    best = min(swept, key=lambda r: r[0])[1]
    log(f"fastest fp8 config {best}; default {default}")
    best_splits = []
    for splits in FP8_SPLITS:
        ms = graph_ms(lambda s=splits: paged.launch(*args8, bench_paged.HEAD_DIM ** -0.5, s, "grouped", best, **scales))
        best_splits.append((ms, splits))
        rows.append(dict(kind="sweep", B=FP8_SHAPES[0][0], context=FP8_SHAPES[0][1], cache="fp8 e4m3",
                         block_n=best.block_n, num_warps=best.num_warps, num_stages=best.num_stages,
                         num_splits=splits, ms=ms))
        log(f"fp8 sweep {best} splits={splits}: {ms * 1e3:.1f} us")
    best_split = min(best_splits)[1]
    log(f"fastest split count at B={FP8_SHAPES[0][0]} ctx={FP8_SHAPES[0][1]}: {best_split} (the heuristic picks "
        f"{paged.choose_num_splits(*FP8_SHAPES[0][:1], bench_paged.HKV, FP8_SHAPES[0][1], 'cuda')})")
    p = args8 = scales = None
    torch.cuda.empty_cache()
    shipped = recorded("paged_fp8_ratio")
    for batch, context in FP8_SHAPES:
        p = bench_paged.fp8_cache(bench_paged.make_problem(batch, context))
        splits = paged.choose_num_splits(batch, bench_paged.HKV, context, "cuda")
        fastest_splits = best_split if (batch, context) == FP8_SHAPES[0] else splits
        index = (p["block_table"], p["seq_lens"])
        scale = bench_paged.HEAD_DIM ** -0.5
        runs = {
            "fp16 cache (default config)": lambda: paged.launch(p["q"], p["k_pages"], p["v_pages"], *index, scale,
                                                                splits, "grouped"),
            "fp8 cache (default config)": lambda: paged.launch(p["q"], p["k8"], p["v8"], *index, scale, splits,
                                                               "grouped", k_scale=p["k_scale"], v_scale=p["v_scale"]),
            "fp8 cache (fastest of the sweep)": lambda: paged.launch(p["q"], p["k8"], p["v8"], *index, scale,
                                                                     fastest_splits, "grouped", best,
                                                                     k_scale=p["k_scale"], v_scale=p["v_scale"]),
        }
        ref = paged.launch(p["q"], p["k_pages"], p["v_pages"], *index, scale, splits, "grouped").float()
        ms = {}
        for method, fn in runs.items():
            nbytes = bench_paged.kv_bytes(batch, context, itemsize=1 if "fp8" in method else 2)
            ms[method] = graph_ms(fn)
            diff = float((fn().float() - ref).abs().max())
            used = fastest_splits if "fastest" in method else splits
            rows.append(dict(kind="timing", B=batch, context=context, method=method, num_splits=used, ms=ms[method],
                             gbps=nbytes / ms[method] / 1e6, max_abs_diff_vs_fp16=diff))
            log(f"B={batch:3} ctx={context:6} {method:34} {ms[method] * 1e3:8.1f} us {rows[-1]['gbps']:6.0f} GB/s")
        for method in list(runs)[1:]:
            ratio = ms["fp16 cache (default config)"] / ms[method]
            name = f"fp16 cache time / {method} time"
            targeted = (batch, context) == FP8_SHAPES[0]
            rows.append(dict(kind="ratio", B=batch, context=context, method=name,
                             ratio=ratio, target=FP8_TARGET if targeted else float("nan")))
            log(f"B={batch:3} ctx={context:6} fp16 / {method}: {ratio:.3f}")
            was = [r["ratio"] for r in shipped if r["kind"] == "ratio" and r["method"] == name and r["B"] == batch
                   and r["context"] == context]
            before_after(f"fp8 B={batch} ctx={context} {name}", was[0] if was else None, ratio,
                         f">= {FP8_TARGET}" if targeted else "", ratio >= FP8_TARGET if targeted else None, shipped)
        p = runs = ref = None
        torch.cuda.empty_cache()
    log(f"wrote {write_results('paged_fp8_ratio', rows, out)}")
    return rows


# ---------------------------------------------------------------------------------------- head dims
HEAD_DIMS = ((64, 64), (80, 80), (96, 96), (112, 112), (120, 120), (128, 128), (192, 192), (256, 256), (192, 128))


def paged_problem(batch, context, d, dv, page=16, dtype=torch.float16, seed=0):
    """q [B, Hq, d]; a cache of fp16 pages in random order; the table and lengths (every sequence full)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pages = batch * context // page
    q = torch.randn(batch, bench_paged.HQ, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(pages, page, bench_paged.HKV, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(pages, page, bench_paged.HKV, dv, device="cuda", generator=gen).to(dtype)
    table = torch.randperm(pages, device="cuda", generator=gen).reshape(batch, -1).int()
    return q, k, v, table, torch.full((batch,), context, dtype=torch.int32, device="cuda")


HEADDIM_SHAPE = (64, 4096)                              # (B, context) of the bandwidth comparison
HEADDIM_CANDIDATES = [paged.LaunchConfig(n, w, 3) for n, w in ((32, 8), (64, 4), (64, 8), (128, 4), (128, 8))]
HEADDIM_TARGET = 0.9                                    # fraction of D = 128's GB/s (issue 40)


def headdims_mode(out: Path) -> list[dict]:
    """Each head size's default configuration checked against float64 and timed, then the candidates."""
    rows = []
    batch, context = HEADDIM_SHAPE
    for d, dv in HEAD_DIMS:
        small = paged_problem(3, 640, d, dv, seed=d + dv)
        small[4][:2] = torch.tensor([1, 333], dtype=torch.int32)
        err = rel_error(paged.paged_decode(*small, num_splits=3), paged.paged_decode_ref(*small))
        args = paged_problem(batch, context, d, dv)
        nbytes = batch * context * bench_paged.HKV * (d + dv) * 2
        default = paged.default_config("grouped", torch.float16, d, dv)
        for config in [default, *(c for c in HEADDIM_CANDIDATES if c != default)]:
            row = dict(B=batch, context=context, D=d, Dv=dv, default=config == default, block_n=config.block_n,
                       num_warps=config.num_warps, num_stages=config.num_stages)
            try:
                ms = graph_ms(lambda a=args, c=config: paged.launch(*a, d ** -0.5, 1, "grouped", c))
                row.update(ms=ms, gbps=nbytes / ms / 1e6)
            except Exception as exc:
                row["note"] = bench_paged.failed_note(exc)
            if config == default:
                row.update(rel_error_small=err, bound=tolerance(torch.float16, "cuda"))
            rows.append(row)
            log(f"D={d:3} Dv={dv:3} {config}{' (default)' if config == default else ''}: "
                + (f"{row['ms'] * 1e3:8.1f} us {row['gbps']:6.0f} GB/s" if "ms" in row else row["note"])
                + (f"; float64 check {err:.2e}" + ("" if err <= row["bound"] else "  FAILED")
                   if config == default else ""))
        args = small = None
        torch.cuda.empty_cache()
    at_128 = next(r["gbps"] for r in rows if r["D"] == r["Dv"] == 128 and r["default"])
    for r in rows:
        r["fraction_of_D128_gbps"] = r.get("gbps", float("nan")) / at_128
    shipped = recorded("paged_headdims")
    for r in rows:
        if r["default"]:
            best = max((x for x in rows if x["D"] == r["D"] and x["Dv"] == r["Dv"] and "gbps" in x),
                       key=lambda x: x["gbps"])
            log(f"D={r['D']:3} Dv={r['Dv']:3}: default ({r['block_n']}, {r['num_warps']}) "
                f"{r['fraction_of_D128_gbps']:.3f} of D = 128's GB/s, fastest candidate ({best['block_n']}, "
                f"{best['num_warps']}) {best['fraction_of_D128_gbps']:.3f} (target >= {HEADDIM_TARGET})")
            was = [x for x in shipped if x["D"] == r["D"] and x["Dv"] == r["Dv"] and str(x["default"]) == "True"]
            before_after(f"head dims D={r['D']} Dv={r['Dv']} default's fraction of D = 128's GB/s",
                         was[0]["fraction_of_D128_gbps"] if was else None, r["fraction_of_D128_gbps"],
                         f">= {HEADDIM_TARGET}", r["fraction_of_D128_gbps"] >= HEADDIM_TARGET, shipped)
            if was:
                before_after(f"head dims D={r['D']} Dv={r['Dv']} default's GB/s (absolute)", was[0]["gbps"],
                             r["gbps"], source=shipped)
    log(f"wrote {write_results('paged_headdims', rows, out)}")
    return rows


MODES = {"eager": eager_mode, "fp8": fp8_mode, "headdims": headdims_mode}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", help="where the CSVs go (as --out)")
    parser.add_argument("--out", help="where the CSVs go")
    parser.add_argument("--mode", nargs="+", choices=["record", *MODES], help="default: record")
    options = parser.parse_args(argv)
    out = Path(options.out or options.outdir or ".")
    log(provenance())
    status = 0
    for mode in options.mode or ["record"]:
        log(f"---- {mode}")
        if mode == "record":
            status |= record_mode(out)
        else:
            rows = MODES[mode](out)
            status |= int(any("note" in r and str(r["note"]).startswith("failed") for r in rows))
            status |= int(any(r.get("rel_error_small", 0) > r.get("bound", 1) for r in rows))
    return status


if __name__ == "__main__":
    sys.exit(main())
