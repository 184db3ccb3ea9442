"""The FP8 (e4m3) FlashAttention forward on the GPU, beside the course's fp16 forward, SDPA's cuDNN
backend and the fp16 / fp8 matrix-product ceilings. Rows go through attnkit.bench.recorder.write_results
to OUTDIR/bench_flash_fp8.csv.

    python scripts/gpu_flash_fp8.py OUTDIR            # on the H100: 70-95 s, 5 kernel compilations
    python scripts/gpu_flash_fp8.py OUTDIR --smoke    # tiny sizes; on a CPU in Triton's interpreter
    python scripts/gpu_flash_fp8.py OUTDIR --sweep    # the descriptor kernel's configurations

Cases: D = 128, H = 16, B · N = 16k tokens, N = 4096 and 16384, causal and not, fp16 N(0, 1) inputs.
- fp8: ``quantize_for_attention`` once (its time is its own row, fp8_quantize), then
  ``flash_attention_fp8`` (host tensor descriptors on sm_90; if that launch fails, the error is
  recorded and the pointer-load kernel is timed as fp8_pointers);
- fp16_attnkit: ``attnkit.flash_attention`` with ATTNKIT_AUTOTUNE=0 (its one fixed configuration);
- fp16_sdpa_cudnn: torch's scaled_dot_product_attention pinned to cuDNN.
Accuracy: max abs error (and relative error ‖o − ref‖ / ‖ref‖) of each output on heads 0 and 1 of
batch 0 against float32 attention of the fp16 inputs (TF32 off), so fp8's error includes quantisation.
Ceilings: torch.matmul fp16 and torch._scaled_mm e4m3 (with and without fast accumulation), 8192³.
Last, one trade-off (one more compilation): fp8_acc_in_product, N = 16384 non-causal, the accumulator
passed into the P · V product (Triton's tutorial) instead of adding each tile's product in fp32: fewer
registers, but sm_90's fp8 tensor cores then sum all key tiles in reduced precision.
The CSV is rewritten after every case, so a run cut short keeps what it measured.
TFLOP/s count 4 · D per visible (query, key) pair. Printed at the end: fp8 / fp16 speed (target
>= 1.4 at N >= 4k) and fp8 / cuDNN.
Rows: impl, n, causal, ms, tflops, max_err, rel_err, batch, heads, head_dim, tiles, note.

--sweep: the descriptor kernel at each of ``SWEEP_CONFIGS`` (those ptxas compiles for sm_90a without
spilling or serialising its matrix products, Triton 3.6) on the same four cases, each
checked as above, beside the fp16 kernel; rows (impl fp8, note the configuration) go to
OUTDIR/bench_flash_fp8_sweep.csv, and the configuration with the smallest geometric-mean time is printed.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["ATTNKIT_AUTOTUNE"] = "0"      # each autotuned variant would compile several kernels

import torch  # noqa: E402

import attnkit  # noqa: E402
from attnkit.bench.flash import implementation  # noqa: E402
from attnkit.bench.recorder import time_ms, write_results  # noqa: E402
from attnkit.kernels.flash import dispatch, fp8  # noqa: E402

FULL = dict(heads=16, head_dim=128, tokens=16384, lengths=(4096, 16384), matmul=8192)
SMOKE = dict(heads=2, head_dim=64, tokens=140, lengths=(40, 70), matmul=64)
REF_HEADS = 2                              # the float32 reference covers heads 0 and 1 of batch 0
TARGET = 1.4                               # fp8 / fp16 forward speed at N >= 4k
Fp8Config = dispatch.BlockConfig
SWEEP_CONFIGS = [Fp8Config(128, 128, 8, 3), Fp8Config(128, 128, 8, 4), Fp8Config(128, 256, 8, 2),
                 Fp8Config(64, 128, 4, 3), Fp8Config(64, 128, 4, 4), Fp8Config(128, 64, 8, 3),
                 Fp8Config(64, 128, 4, 2), Fp8Config(64, 256, 4, 2), Fp8Config(64, 256, 4, 3),
                 Fp8Config(64, 64, 4, 3), Fp8Config(64, 64, 4, 4)]
START = time.perf_counter()


def log(*args) -> None:
    print(f"[{time.perf_counter() - START:6.1f} s]", *args, flush=True)


def timed(fn, device) -> float:
    """Median ms: triton.testing.do_bench on a GPU, three wall-clock runs on a CPU."""
    if device.type == "cuda":
        return time_ms(fn)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


def reference_fp32(q, k, v, causal: bool, heads: int = REF_HEADS, chunk: int = 4096) -> torch.Tensor:
    """float32 attention of batch 0, heads [0, heads) of q, k, v [B, H, N, D] ([heads, N, D]), rows in
    chunks so that one [chunk, N] block of scores exists at a time."""
    heads = min(heads, q.shape[1])
    n_q, n_k = q.shape[2], k.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty((heads, n_q, v.shape[-1]), dtype=torch.float32, device=q.device)
    for h in range(heads):
        kh, vh = k[0, h].float(), v[0, h].float()
        for r0 in range(0, n_q, chunk):
            qh = q[0, h, r0:r0 + chunk].float()
            s = (qh @ kh.T) * scale                                        # [rows, Nk]
            if causal:
                rows = torch.arange(r0, r0 + qh.shape[0], device=q.device)[:, None]
                s = s.masked_fill(torch.arange(n_k, device=q.device)[None, :] > rows + n_k - n_q, -math.inf)
            out[h, r0:r0 + chunk] = torch.softmax(s, dim=-1).nan_to_num(0.0) @ vh
    return out


def errors(o, ref) -> tuple[float, float]:
    """(max abs error, relative error) of o's batch 0, first heads, against ref."""
    got = o[0, :ref.shape[0]].float()
    diff = got - ref
    return float(diff.abs().max()), float(diff.norm() / ref.norm())


def measure(impl, fn, flops, ref, device, **fields) -> dict:
    """One row: run fn once (compiles), check it against ref, time it; an exception is recorded."""
    row = dict(impl=impl, ms=float("nan"), tflops=float("nan"), max_err=float("nan"), rel_err=float("nan"),
               note="", **fields)
    try:
        out = fn()
        if ref is not None:
            row["max_err"], row["rel_err"] = errors(out, ref)
        row["ms"] = timed(fn, device)
        row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12 if flops else float("nan")
    except Exception as exc:  # recorded, and the next case runs
        row["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    log(f"{impl:18s} n={fields.get('n')} causal={fields.get('causal')} ms={row['ms']:.3f} "
        f"TFLOP/s={row['tflops']:.1f} max_err={row['max_err']:.2e} rel_err={row['rel_err']:.2e} {row['note']}")
    return row


def attention_rows(n: int, causal: bool, device, heads: int, head_dim: int, tokens: int) -> list[dict]:
    batch = max(1, tokens // n)
    gen = torch.Generator(device=device).manual_seed(n + causal)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, generator=gen, dtype=torch.float16)
               for _ in range(3))
    ref = reference_fp32(q, k, v, causal)
    flops = fp8.attention_flops(batch, heads, n, n, head_dim, causal)
    fields = dict(n=n, causal=causal, batch=batch, heads=heads, head_dim=head_dim)
    rows = [measure("fp8_quantize", lambda: fp8.quantize_for_attention(q, k, v), 0, None, device,
                    tiles="", **fields)]
    quantised = fp8.quantize_for_attention(q, k, v)
    q8, k8 = quantised[:2]
    tiles = "descriptors" if dispatch.fp8_descriptors_usable(q8, k8, n) else "pointers"
    rows.append(measure("fp8", lambda: fp8.flash_attention_fp8(*quantised, causal=causal), flops, ref,
                        device, tiles=tiles, **fields))
    if rows[-1]["note"] and tiles == "descriptors":
        sm_scale = 1.0 / math.sqrt(head_dim)
        rows.append(measure("fp8_pointers", lambda: fp8.forward(*quantised, causal, sm_scale, torch.float16,
                                                                        desc=False), flops, ref, device,
                            tiles="pointers", **fields))
    with torch.no_grad():
        rows.append(measure("fp16_attnkit", lambda: attnkit.flash_attention(q, k, v, causal=causal), flops, ref,
                            device, tiles="", **fields))
        cudnn = implementation("sdpa_cudnn")
        rows.append(measure("fp16_sdpa_cudnn", lambda: cudnn(q, k, v, causal), flops, ref, device, tiles="",
                            **fields))
    return rows


def matmul_rows(size: int, device) -> list[dict]:
    """fp16 and e4m3 matrix-product ceilings, size³ (2 · size³ operations)."""
    flops = 2.0 * size ** 3
    fields = dict(n=size, causal="", batch=1, heads=1, head_dim=size, tiles="")
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, device=device, generator=gen, dtype=torch.float16) for _ in range(2))
    rows = [measure("matmul_fp16", lambda: a @ b, flops, None, device, **fields)]
    try:
        a8 = a.to(fp8.FP8)
        b8 = b.to(fp8.FP8).T.contiguous().T                           # column-major, as cuBLASLt wants it
        one = torch.ones((), device=device)
    except Exception as exc:  # no fp8 on this device or torch
        rows.append(dict(impl="scaled_mm_fp8", ms=float("nan"), note=f"{type(exc).__name__}: {exc}", **fields))
        return rows
    for impl, fast in (("scaled_mm_fp8", False), ("scaled_mm_fp8_fast_accum", True)):
        rows.append(measure(impl, lambda f=fast: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16,
                                                                  use_fast_accum=f),
                            flops, None, device, **fields))
    return rows


def variant_rows(n: int, device, heads: int, head_dim: int, tokens: int) -> list[dict]:
    """The fp8 kernel with the accumulator inside the P · V product (promote=False), non-causal."""
    batch = max(1, tokens // n)
    gen = torch.Generator(device=device).manual_seed(n)                 # attention_rows' inputs
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, generator=gen, dtype=torch.float16)
               for _ in range(3))
    ref = reference_fp32(q, k, v, False)
    quantised = fp8.quantize_for_attention(q, k, v)
    tiles = "descriptors" if dispatch.fp8_descriptors_usable(quantised[0], quantised[1], n) else "pointers"
    fn = lambda: fp8.forward(*quantised, False, 1.0 / math.sqrt(head_dim), torch.float16,  # noqa: E731
                                    promote=False)
    return [measure("fp8_acc_in_product", fn, fp8.attention_flops(batch, heads, n, n, head_dim, False), ref,
                    device, n=n, causal=False, batch=batch, heads=heads, head_dim=head_dim, tiles=tiles)]


def config_name(config) -> str:
    return f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}"


def sweep_rows(n: int, causal: bool, device, heads: int, head_dim: int, tokens: int) -> list[dict]:
    """The descriptor fp8 kernel at each of SWEEP_CONFIGS, then the fp16 kernel, on one case."""
    batch = max(1, tokens // n)
    gen = torch.Generator(device=device).manual_seed(n + causal)       # attention_rows' inputs
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, generator=gen, dtype=torch.float16)
               for _ in range(3))
    ref = reference_fp32(q, k, v, causal)
    flops = fp8.attention_flops(batch, heads, n, n, head_dim, causal)
    fields = dict(n=n, causal=causal, batch=batch, heads=heads, head_dim=head_dim)
    quantised = fp8.quantize_for_attention(q, k, v)
    sm_scale = 1.0 / math.sqrt(head_dim)
    rows = []
    for config in SWEEP_CONFIGS:
        fn = lambda c=config: fp8.forward(*quantised, causal, sm_scale, torch.float16, config=c)  # noqa: E731
        rows.append(measure("fp8", fn, flops, ref, device, tiles="descriptors", config=config_name(config), **fields))
    with torch.no_grad():
        rows.append(measure("fp16_attnkit", lambda: attnkit.flash_attention(q, k, v, causal=causal), flops, ref,
                            device, tiles="", config="", **fields))
    return rows


def sweep_winner(rows) -> None:
    """Each configuration's fp8 / fp16 speed per case, then the one with the smallest geometric-mean
    time over the cases (among those that ran in every case)."""
    fp16 = {(r["n"], r["causal"]): r["ms"] for r in rows if r["impl"] == "fp16_attnkit"}
    scores = {}
    for config in map(config_name, SWEEP_CONFIGS):
        timed_rows = [r for r in rows if r["impl"] == "fp8" and r["config"] == config and r["ms"] == r["ms"]]
        for r in timed_rows:
            log(f"{config}: N={r['n']} causal={r['causal']} fp8 / fp16 {fp16[(r['n'], r['causal'])] / r['ms']:.2f}x, "
                f"max_err {r['max_err']:.2e}")
        if timed_rows and len(timed_rows) == len(fp16):
            scores[config] = math.exp(sum(math.log(r["ms"]) for r in timed_rows) / len(timed_rows))
    if scores:
        log("fastest (geometric mean):", min(scores, key=scores.get))


def summary(rows) -> None:
    """fp8 / fp16 and fp8 / cuDNN speed (ratios of times) per case, and the ceilings' ratio."""
    def ms(impl, n, causal):
        found = [r["ms"] for r in rows if r["impl"] == impl and r["n"] == n and r["causal"] == causal]
        return found[0] if found else float("nan")
    for n, causal in sorted({(r["n"], r["causal"]) for r in rows if r["causal"] != ""}):
        fp8 = ms("fp8", n, causal)
        if math.isnan(fp8):
            fp8 = ms("fp8_pointers", n, causal)
        vs_fp16, vs_cudnn = ms("fp16_attnkit", n, causal) / fp8, ms("fp16_sdpa_cudnn", n, causal) / fp8
        verdict = "meets" if vs_fp16 >= TARGET else "misses"
        log(f"N={n} causal={causal}: fp8 / fp16 attnkit {vs_fp16:.2f}x ({verdict} the {TARGET}x target), "
            f"fp8 / cuDNN fp16 {vs_cudnn:.2f}x")
    for variant in (r for r in rows if r["impl"] == "fp8_acc_in_product"):
        base = [r for r in rows if r["impl"] == "fp8" and r["n"] == variant["n"] and r["causal"] is False]
        if base:
            log(f"N={variant['n']} accumulator in the product: {base[0]['ms'] / variant['ms']:.2f}x the speed of "
                f"fp32 sums per tile, max_err {variant['max_err']:.2e} vs {base[0]['max_err']:.2e}")
    matmuls = {r["impl"]: r["ms"] for r in rows if r["causal"] == ""}
    if matmuls.get("matmul_fp16") and matmuls.get("scaled_mm_fp8"):
        log(f"matrix-product ceiling fp8 / fp16: {matmuls['matmul_fp16'] / matmuls['scaled_mm_fp8']:.2f}x "
            f"(fast accumulation {matmuls['matmul_fp16'] / matmuls.get('scaled_mm_fp8_fast_accum', math.nan):.2f}x)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    outdir, smoke = Path(argv[0]), "--smoke" in argv[1:]
    sizes = SMOKE if smoke else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False                  # a true float32 reference
        log(f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}, "
            f"fp8 configs: descriptors {fp8.GPU_CONFIGS} (by causal), pointers {fp8.POINTER_CONFIG}")
    heads, head_dim, tokens = sizes["heads"], sizes["head_dim"], sizes["tokens"]
    if "--sweep" in argv[1:]:
        rows = []
        for n in sizes["lengths"]:
            for causal in (False, True):
                rows += sweep_rows(n, causal, device, heads, head_dim, tokens)
                write_results("flash_fp8_sweep", rows, outdir)
        sweep_winner(rows)
        return 0
    steps = [(f"N={n} causal={causal}", lambda n=n, c=causal: attention_rows(n, c, device, heads, head_dim, tokens))
             for n in sizes["lengths"] for causal in (False, True)]
    steps.append(("matmul ceilings", lambda: matmul_rows(sizes["matmul"], device)))
    longest = max(sizes["lengths"])
    steps.append(("accumulator in the product", lambda: variant_rows(longest, device, heads, head_dim, tokens)))
    rows = []
    for label, step in steps:
        try:
            rows += step()
        except Exception as exc:  # inputs or reference failed: recorded, the next step runs
            note = f"{label}: {type(exc).__name__}: {exc}"
            rows.append(dict(impl="failed", n="", causal="", ms=float("nan"), note=note))
            log(f"{label} failed: {type(exc).__name__}: {exc}")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        path = write_results("flash_fp8", rows, outdir)              # what is measured so far
    summary(rows)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
