"""One GPU session for paged decode: tune, check every variant, then time against the ceilings.

    PYTHONPATH=. python scripts/gpu_paged.py [OUTDIR]

1. sweeps launch configurations (tokens per iteration, warps, pipeline stages) of both kernels and the
   split count of the long shape, and keeps the fastest of each for this run;
2. checks every variant, split count and dtype against the float64 reference on fresh random inputs
   with permuted page tables, ragged lengths (seq_len 1, partial last pages), GQA group sizes 1, 4, 8
   and MQA, NaN in every slot a sequence does not own and NaN-poisoned outputs; and CPU tensors on
   this GPU machine;
3. records the suite paged into OUTDIR with attnkit.bench.recorder.record (what
   ``python -m attnkit.bench.recorder --out OUTDIR paged`` does): every row with the copy and
   read-only-stream ceilings of ``streams.ceilings(timing="graph")``, timed from CUDA graphs like
   the kernels, and its fractions of each and of the datasheet figure;
4. prints the ratios last.

The FP8 cache is measured on its own: ``python -m attnkit.bench.paged fp8 OUTDIR`` (about a minute).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from attnkit.bench import paged as bench_paged
from attnkit.bench.recorder import provenance, read_results, record
from attnkit.kernels import paged
from attnkit.tolerances import rel_error, tolerance


def log(*args):
    print(*args, flush=True)


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
                        ms = bench_paged.graph_ms(lambda: paged._launch(*args, 0.088, 1, variant, config))
                    except Exception as exc:
                        log(f"sweep {variant} {config}: failed {type(exc).__name__}")
                        continue
                    results.append((ms, config))
                    log(f"sweep {variant} {config}: {ms:.4f} ms  {nbytes / ms / 1e6:.0f} GB/s")
        results.sort(key=lambda r: r[0])
        best[variant] = results[0][1]
    p = args = None  # free the memory before the next size
    torch.cuda.empty_cache()
    paged.GPU_CONFIGS.update(best)
    p = bench_paged.make_problem(*bench_paged.SHAPES["long"])
    args = (p["q"], p["k_pages"], p["v_pages"], p["block_table"], p["seq_lens"])
    nbytes = bench_paged.kv_bytes(*bench_paged.SHAPES["long"])
    splits = []
    for s in (8, 16, 24, 32, 48, 64, 96, 128):
        ms = bench_paged.graph_ms(lambda: paged._launch(*args, 0.088, s, "grouped"))
        splits.append((ms, s))
        log(f"sweep long grouped splits={s}: {ms:.4f} ms  {nbytes / ms / 1e6:.0f} GB/s")
    p = args = None  # free the memory before the next size
    torch.cuda.empty_cache()
    return best, min(splits)[1]


# ------------------------------------------------------------------------------------------ checks
def make_case(gen, lens, hq, hkv, d, page_size, dtype, device):
    """Like tests/test_paged.py: permuted pages, NaN where no sequence writes, garbage past tables."""
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
    saved = paged._new_buffer
    paged._new_buffer = lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
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
    paged._new_buffer = saved
    return failures


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "."))
    log(provenance())
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
    log(f"configs used: {paged.GPU_CONFIGS}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
