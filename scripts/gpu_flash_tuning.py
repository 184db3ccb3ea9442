"""One GPU session that explores the forward's top rungs: check every candidate, then time it.

    python scripts/gpu_flash_tuning.py [OUTDIR] [--budget SECONDS] [--record]

Candidates are rungs of attnkit.kernels.flash.VARIANTS (a ``Rung``: the forward kernel's constexprs)
crossed with fixed launch configurations, plus their autotuned forms and SDPA's cuDNN and flash
backends on the same inputs. To try a new idea, add a constexpr to the kernel and a Rung here.

1. correctness: every candidate rung (fixed default configuration) against float64 references on
   ragged shapes (odd N, causal with Nq != Nk, GQA/MQA, fp16/bf16/fp32, D = 16 ... 256), outputs
   poisoned with NaN, o and lse both compared; a switch set that fails is not timed;
2. the sweep: D = 128, fp16, B·N = 16k, 16 heads, N in (2k, 4k, 16k), causal and not; each
   candidate is checked against the float64 reference slice on the same inputs, then timed;
3. writes bench_tuning.csv and tuning_log.txt under OUTDIR and prints a short table last (TFLOP/s and the
   ratio to cuDNN and to SDPA flash of the fastest verified configuration of each switch set).

A time budget (default 370 s) stops the sweep early; what was measured is still written and printed.

With --record (after a sweep has chosen the rungs): checks the ladder's descriptor rungs as in
step 1, then records bench_flash_ladder.csv and bench_flash.csv into OUTDIR with
attnkit.bench.suites.record, as ``python -m attnkit.bench.suites --out OUTDIR flash_ladder flash``.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from attnkit.bench.flash import TOKENS, attention_flops, implementation, reference_slice, tflops  # noqa: E402
from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import (  # noqa: E402
    BlockConfig,
    Rung,
    layout,  # noqa: E402
    plans,  # noqa: E402
)
from attnkit.kernels.flash import forward as forward_launch  # noqa: E402
from attnkit.reference.attention import attention_ref  # noqa: E402
from attnkit.tolerances import rel_error, tolerance  # noqa: E402

HEADS, HEAD_DIM = 16, 128
SEQ_LENS = (1024, 2048, 4096, 16384)
LOG_LINES: list[str] = []

# Candidate rungs beyond the ladder (none now: the variants that lost are in experiments/flash_variants).
CANDIDATES: dict[str, Rung] = {}
# (rung, [(BLOCK_M, BLOCK_N, num_warps, num_stages), ...]) explored at D = 128: each rung's fixed
# configurations beside the autotuned forms in TUNED.
SWEEP = {
    "host_descriptors": [(128, 128, 8, 3), (128, 64, 8, 3)],
}
TUNED = ("autotuned", "descriptors", "host_descriptors")


def log(*args):
    line = " ".join(str(a) for a in args)
    LOG_LINES.append(line)
    print(line, flush=True)


def rung_of(name: str) -> Rung:
    return flash.VARIANTS[name] if name in flash.VARIANTS else CANDIDATES[name]


def candidates(sweep=SWEEP, tuned=TUNED) -> list[tuple[str, BlockConfig | None]]:
    """(switch set, configuration) pairs; None = the switch set's own autotuning."""
    out = [(name, None) for name in tuned]
    for name, configs in sweep.items():
        out += [(name, BlockConfig(*c)) for c in configs]
    return out


def label(name: str, config: BlockConfig | None) -> str:
    if config is None:
        return f"{name}[tuned]"
    return f"{name}[{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}]"


def _poison(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def check_shapes():
    """(B, Hq, Hkv, Nq, Nk, D, causal, dtype): odd sizes, every head dim, GQA/MQA, both causal cases."""
    return [(2, 8, 2, 1000, 1031, 128, True, torch.float16), (1, 4, 4, 777, 777, 64, False, torch.float16),
            (1, 8, 1, 300, 129, 128, True, torch.bfloat16), (1, 4, 1, 301, 517, 64, True, torch.float32),
            (1, 2, 1, 200, 333, 16, False, torch.float16), (1, 2, 1, 200, 333, 32, True, torch.bfloat16),
            (1, 2, 1, 200, 333, 256, True, torch.float16), (1, 4, 2, 1025, 4099, 128, False, torch.bfloat16)]


def reference_lse(q, k, causal):
    q64, k64 = q.double(), k.double().repeat_interleave(q.shape[1] // k.shape[1], 1)
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        vis = torch.arange(nk, device=q.device)[None, :] <= torch.arange(nq, device=q.device)[:, None] + nk - nq
        s = s.masked_fill(~vis, -math.inf)
    return torch.logsumexp(s, -1)


def check_switch_sets(names, device="cuda", shapes=None) -> dict[str, list[str]]:
    """{switch set: failures} on fresh random inputs with NaN-poisoned outputs (fixed configurations)."""
    failures = {name: [] for name in names}
    saved, layout.new_buffer = layout.new_buffer, _poison
    gen = torch.Generator(device=device).manual_seed(int(time.time()) % 2**31)   # fresh inputs every run
    try:
        for b, hq, hkv, nq, nk, d, causal, dtype in shapes or check_shapes():
            q = torch.randn(b, hq, nq, d, device=device, dtype=dtype, generator=gen)
            k = torch.randn(b, hkv, nk, d, device=device, dtype=dtype, generator=gen)
            v = torch.randn(b, hkv, nk, d, device=device, dtype=dtype, generator=gen)
            ref = attention_ref(q, k, v, causal=causal)
            ref_lse = reference_lse(q, k, causal)
            seen = torch.isfinite(ref_lse)
            bound = tolerance(dtype, device)
            what = f"{(b, hq, hkv, nq, nk, d)} causal={causal} {str(dtype)[6:]}"
            for name in names:
                rung = replace(rung_of(name), tuned=False)
                try:
                    o, lse = forward_launch.forward_rung(q, k, v, causal, 1 / math.sqrt(d), rung)
                    torch.cuda.synchronize() if device == "cuda" else None
                    err = rel_error(o, ref)
                    lse_ok = (torch.equal(torch.isfinite(lse), seen)
                              and rel_error(lse[seen], ref_lse[seen]) <= bound)
                    if not (err <= bound and lse_ok):
                        failures[name].append(f"{what}: o error {err:.2e}, lse ok {lse_ok}")
                except Exception as exc:
                    failures[name].append(f"{what}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
            log(f"checked {what}: " + ", ".join(f"{n} {'ok' if not failures[n] else 'FAIL'}" for n in names))
    finally:
        layout.new_buffer = saved
    return failures


def _timer(device):
    if device == "cuda":
        from attnkit.bench.recorder import time_ms

        return lambda fn: time_ms(fn, warmup=10, rep=60)

    def cpu_ms(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return cpu_ms


def sweep(cands, *, seq_lens=SEQ_LENS, heads=HEADS, head_dim=HEAD_DIM, tokens=TOKENS, device="cuda",
          deadline=math.inf, baselines=("sdpa_cudnn", "sdpa_flash")) -> list[dict]:
    """One row per (causal, N, candidate): verified TFLOP/s, or a reason. Stops at ``deadline``."""
    time_ms = _timer(device)
    rows = []
    gen = torch.Generator(device=device).manual_seed(int(time.time()) % 2**31)
    for causal in (False, True):
        for n in seq_lens:
            b = max(1, tokens // n)
            q, k, v, do = (torch.randn(b, heads, n, head_dim, device=device, dtype=torch.float16, generator=gen)
                           for _ in range(4))
            o64 = reference_slice(q, k, v, do, causal)[0]
            flops = attention_flops(b, heads, n, n, head_dim, causal)
            entries = [(base, None) for base in (baselines if device == "cuda" else ())] + list(cands)
            for name, config in entries:
                tag = name if name in baselines else label(name, config)
                if time.time() > deadline:
                    rows.append(dict(candidate=tag, causal=causal, N=n, ms=None, tflops=None, reason="budget"))
                    continue
                if name in baselines:
                    attend = implementation(name)
                    fn = lambda: attend(q, k, v, causal)  # noqa: E731
                else:
                    rung = rung_of(name)
                    fn = lambda: forward_launch.forward_rung(q, k, v, causal, 1 / math.sqrt(head_dim), rung, config)[0]  # noqa: E731,B023
                ms, reason = None, ""
                t0 = time.time()
                try:
                    with torch.no_grad():
                        err = rel_error(fn()[:1, :2], o64)
                        if not err <= tolerance(torch.float16, device):
                            reason = f"relative error {err:.2e}"
                        else:
                            ms = time_ms(fn)
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
                row = dict(candidate=tag, causal=causal, N=n, ms=ms,
                           tflops=None if ms is None else tflops(flops, ms), reason=reason)
                rows.append(row)
                log(f"  {tag:>40} causal={causal!s:5} N={n:>5} "
                    f"{(row['tflops'] or 0):7.1f} TFLOP/s ({time.time() - t0:4.1f} s) {reason}")
            q = k = v = do = None  # free the memory before the next size
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def best_by_switch_set(rows) -> dict:
    """{(switch set, causal, N): best verified row} (the switch set is the label before '[')."""
    best = {}
    for r in rows:
        if r["tflops"] is None:
            continue
        key = (r["candidate"].split("[")[0], r["causal"], r["N"])
        if key not in best or r["tflops"] > best[key]["tflops"]:
            best[key] = r
    return best


def table(rows) -> str:
    """Per switch set: best verified TFLOP/s and ratios to cuDNN / SDPA flash, each (causal, N)."""
    best = best_by_switch_set(rows)
    names = list(dict.fromkeys(k[0] for k in best))
    cols = sorted({(k[1], k[2]) for k in best})
    head = f"{'switch set':>18} | " + " | ".join(f"{'c' if c else 'nc'} {n:>5}" + " " * 14 for c, n in cols)
    lines = ["best verified forward, D=128 fp16: TFLOP/s  (x cuDNN, x flash)  [config]", head]
    for name in names:
        cells = []
        for c, n in cols:
            r = best.get((name, c, n))
            cud, fla = best.get(("sdpa_cudnn", c, n)), best.get(("sdpa_flash", c, n))
            if r is None:
                cells.append(" " * 22)
                continue
            x1 = r["tflops"] / cud["tflops"] if cud else float("nan")
            x2 = r["tflops"] / fla["tflops"] if fla else float("nan")
            cells.append(f"{r['tflops']:6.1f} ({x1:4.2f},{x2:4.2f})   ")
        lines.append(f"{name:>18} | " + " | ".join(cells))
    for name in names:
        configs = sorted({best[(name, c, n)]["candidate"] for c, n in cols if (name, c, n) in best})
        lines.append(f"  {name}: winners {configs}")
    return "\n".join(lines)


def write_csv(rows, path: Path) -> None:
    if rows:
        from attnkit.bench.recorder import write_results

        write_results(path.stem.removeprefix("bench_"), rows, path.parent)


def record(out: Path, start: float) -> int:
    """Check the descriptor rungs, then record the ladder and the full benchmark with the suites' table."""
    from attnkit.bench.suites import record as record_suites

    names = [n for n, rung in flash.VARIANTS.items() if rung.desc]
    failures = check_switch_sets(names)
    for name, fails in failures.items():
        for f in fails:
            log("  FAIL", name, f)
    log(f"correctness: {sum(map(len, failures.values()))} failures in {time.time() - start:.0f} s")
    for path in record_suites(["flash_ladder", "flash"], out):
        log(f"wrote {path} at {time.time() - start:.0f} s")
    for name, tuned in plans.TUNED.items():
        for key, config in list(tuned.cache.items())[:30]:
            log(f"  tuned {name} {key[:5]}: {config}")
    log(f"correctness failures: {failures}")
    (out / "record_log.txt").write_text("\n".join(LOG_LINES) + "\n")
    return 0


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = Path(args[0] if args else os.environ.get("OUT", "."))
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 370.0
    start = time.time()
    from attnkit.bench.recorder import provenance

    log(provenance())
    log(f"capability {torch.cuda.get_device_capability()}, "
        f"descriptors {flash.descriptors_supported(torch.device('cuda'))}")
    if "--record" in sys.argv:
        return record(out, start)
    names = list(dict.fromkeys([*SWEEP, *(t for t in TUNED if t != "autotuned")]))
    failures = check_switch_sets(names)
    for name, fails in failures.items():
        for f in fails:
            log("  FAIL", name, f)
    log(f"correctness: {sum(map(len, failures.values()))} failures in {time.time() - start:.0f} s")
    sweep_plan = {name: configs for name, configs in SWEEP.items() if not failures[name]}
    tuned_plan = tuple(t for t in TUNED if not failures.get(t))
    rows = []
    try:
        rows = sweep(candidates(sweep_plan, tuned_plan), deadline=start + budget)
    finally:
        write_csv(rows, out / "bench_tuning.csv")
        log(f"total {time.time() - start:.0f} s; correctness failures: "
            + ", ".join(f"{n}={len(f)}" for n, f in failures.items()))
        log(table(rows))
        (out / "tuning_log.txt").write_text("\n".join(LOG_LINES) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
