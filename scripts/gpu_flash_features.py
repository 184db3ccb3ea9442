"""One GPU session for FlashAttention's model features: head dims that are not powers of two, packed
variable-length sequences, sliding windows and softcapping. Checks first, then times; rows are
written through attnkit.bench.recorder.write_results as OUTDIR/bench_flash_features.csv.

    python scripts/gpu_flash_features.py OUTDIR [--check-only [--case I] | --no-check] [--bf16] [--backward]
                                                [--autotune]

1. checks, with NaN-poisoned outputs, forward and backward on GPU-sized shapes: head dims 80, 96, 192
   and (192, Dv = 128); varlen with empty and length-1 sequences; a window of 256 with softcap; fp32
   against float64 (attnkit.tolerances), fp16 and bf16 by FlashAttention-2's criterion (max error
   against fp32 at most 2x that of plain PyTorch in the same precision);
2. head dims 80, 96, 128, 192 (B = 4, H = 16, N = 4096, causal and not; fp16, bf16 too with --bf16;
   the forward, the backward too with --backward): attnkit against SDPA's cuDNN and flash backends;
   target: attnkit / cuDNN at each D within 10% of that at D = 128;
3. varlen, 64 sequences of 128-4096 tokens (uniform, seed 0), H = 16, D = 128, causal, fp16: the varlen
   kernel against the dense kernel and SDPA (cuDNN, flash) on the batch padded to the longest
   (forward; the backward too with --backward);
   target: speed-up over the dense kernel >= the ratio of padded to useful work;
4. sliding window 4096 at N = 32768 (B = 1, H = 16, D = 128, causal, fp16) against full causal;
   target: speed-up >= 0.8 x N / (2 x window) = 3.2, forward and backward.
Block sizes are the launchers' fixed defaults (ATTNKIT_AUTOTUNE=0) unless --autotune is given: every
kernel variant compiles once (about 10 s each on the GPU's host) instead of once per candidate.
FLOPs are 4·H·D per visible (query, key) pair (the pairs counted exactly), x 2.5 for the backward.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import torch

from attnkit.bench.flash import implementation
from attnkit.bench.recorder import time_ms, write_results
from attnkit.kernels import flash
from attnkit.kernels.flash import layout
from attnkit.tolerances import rel_error, tolerance

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


START = time.perf_counter()


def log(*args):
    print(f"[{time.perf_counter() - START:6.1f} s]", *args, flush=True)


def reference(q, k, v, *, causal=False, window=(-1, -1), softcap=None):
    """Plain PyTorch attention in the inputs' dtype (softmax in fp32), [B, H, N, D] tensors."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    diagonal = (torch.arange(n_k, device=q.device)[None, :] - torch.arange(n_q, device=q.device)[:, None]
                - (n_k - n_q))
    right = 0 if causal else window[1]
    visible = torch.ones_like(diagonal, dtype=torch.bool)
    if right >= 0:
        visible &= diagonal <= right
    if window[0] >= 0:
        visible &= diagonal >= -window[0]
    p = torch.softmax(s.float().masked_fill(~visible, -math.inf), -1).nan_to_num(0.0)
    return p.to(q.dtype) @ v


def _grads(fn, tensors, do, dtype):
    leaves = [t.detach().to(dtype).requires_grad_() for t in tensors]
    out = fn(*leaves)
    return (out, *torch.autograd.grad(out, leaves, do.to(dtype)))


def check_case(label, kernel, ref, tensors, failures):
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = ref(*tensors).shape
    do = torch.randn(shape, device="cuda", generator=gen)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        got = _grads(kernel, tensors, do, dtype)
        if dtype == torch.float32:
            for name, g, r in zip(("out", "dq", "dk", "dv"), got, _grads(ref, tensors, do, torch.float64)):
                err = rel_error(g, r)
                if not err <= tolerance(dtype, "cuda"):
                    failures.append(f"{label} fp32 {name}: {err:.2e}")
            continue
        exact = _grads(ref, [t.to(dtype) for t in tensors], do.to(dtype), torch.float32)
        plain = _grads(ref, tensors, do, dtype)
        for name, g, p, r in zip(("out", "dq", "dk", "dv"), got, plain, exact):
            err, plain_err = ((x.float() - r).abs().max().item() for x in (g, p))
            if not err <= 2 * plain_err:
                failures.append(f"{label} {dtype} {name}: {err:.3g} > 2 x {plain_err:.3g}")
    log(f"checked {label}: {len(failures)} failures so far")


CHECK_CASES = 6     # head dims 80, 96, 192, (192, Dv 128); window + softcap; varlen


def check_all(only: int | None = None) -> list[str]:
    """Every check case, or case ``only`` alone (0 .. CHECK_CASES - 1: cases can run in parallel
    processes, each compiling its own kernels)."""
    failures = []
    layout.new_buffer = lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=gen)

    def wanted(index):
        return only is None or only == index

    for index, (d, dv, causal) in enumerate(((80, 80, True), (96, 96, False), (192, 192, True), (192, 128, True))):
        tensors = (randn(2, 8, 1000, d), randn(2, 2, 1031, d), randn(2, 2, 1031, dv))
        if wanted(index):
            check_case(f"D={d} Dv={dv} causal={causal}",
                       lambda q, k, v, c=causal: flash.flash_attention(q, k, v, causal=c),
                       lambda q, k, v, c=causal: reference(q, k, v, causal=c), tensors, failures)
    options = dict(causal=True, window=(256, -1), softcap=30.0)
    tensors = (randn(1, 8, 1500, 128) * 3, randn(1, 4, 1500, 128), randn(1, 4, 1500, 128))
    if wanted(4):
        check_case(f"{options}", lambda q, k, v: flash.flash_attention(q, k, v, **options),
                   lambda q, k, v: reference(q, k, v, **options), tensors, failures)
    lens = [0, 1, 700, 129, 1000, 17]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    tensors = (randn(sum(lens), 8, 96), randn(sum(lens), 2, 96), randn(sum(lens), 2, 96))

    def varlen(q, k, v):
        return flash.flash_attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)

    def per_sequence(q, k, v):
        outs = [reference(*(t[a:b].transpose(0, 1)[None] for t in (q, k, v)), causal=True)[0].transpose(0, 1)
                for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())]
        return torch.cat(outs, 0)
    if wanted(5):
        check_case("varlen causal", varlen, per_sequence, tensors, failures)
    layout.new_buffer = lambda shape, dtype, device: torch.empty(shape, dtype=dtype, device=device)
    return failures


# ----------------------------------------------------------------------------------- benchmarks
def _time(fn, tensors, backward):
    """(forward or backward time in ms, reason it did not run or '')."""
    try:
        if not backward:
            with torch.no_grad():
                return time_ms(lambda: fn(*tensors)), ""
        leaves = [t.detach().requires_grad_() for t in tensors]
        out = fn(*leaves)
        do = torch.randn_like(out)
        return time_ms(lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)), ""
    except Exception as exc:  # a backend that refuses the shape: recorded with its reason
        return float("nan"), f"{type(exc).__name__}: {str(exc)[:120]}"


def _row(suite, impl, pass_, ms, reason, pairs, heads, head_dim, **shape):
    flops = 4.0 * heads * head_dim * pairs * (2.5 if pass_ == "backward" else 1.0)
    return dict(suite=suite, impl=impl, pass_=pass_, ms=ms, tflops=flops / (ms * 1e-3) / 1e12 if ms == ms else "",
                reason=reason, heads=heads, head_dim=head_dim, **shape)


def causal_pairs(n_q, n_k, left=-1):
    """Visible (query, key) pairs of causal attention aligned to the end, with a left window if >= 0."""
    seen = torch.arange(n_q, dtype=torch.float64) + (n_k - n_q) + 1
    if left >= 0:
        seen = seen.clamp(max=left + 1)
    return float(seen.clamp(min=0).sum())


def bench_head_dims(dtypes=("float16",), passes=("forward",)):
    rows = []
    b, h, n = 4, 16, 4096
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for d in (80, 96, 128, 192):
            for causal in (False, True):
                tensors = [torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3)]
                pairs = b * (causal_pairs(n, n) if causal else n * n)
                impls = {"attnkit": lambda q, k, v, c=causal: flash.flash_attention(q, k, v, causal=c),
                         "sdpa_cudnn": implementation("sdpa_cudnn"), "sdpa_flash": implementation("sdpa_flash")}
                for impl, fn in impls.items():
                    for pass_ in passes:
                        if impl == "attnkit":
                            ms, why = _time(fn, tensors, pass_ == "backward")
                        else:
                            ms, why = _time(lambda q, k, v, f=fn, c=causal: f(q, k, v, c), tensors, pass_ == "backward")
                        rows.append(_row("head_dim", impl, pass_, ms, why, pairs, h, d, batch=b, n_q=n, n_k=n,
                                         causal=causal, dtype=dtype_name))
                        log(rows[-1])
    return rows


def bench_varlen(passes=("forward",)):
    rows = []
    gen = torch.Generator().manual_seed(0)
    lens = torch.randint(128, 4097, (64,), generator=gen).tolist()
    h, d, dtype, longest = 16, 128, torch.float16, max(lens)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    packed = [torch.randn(sum(lens), h, d, device="cuda", dtype=dtype) for _ in range(3)]
    padded = [torch.zeros(len(lens), h, longest, d, device="cuda", dtype=dtype) for _ in range(3)]
    for p, t in zip(padded, packed):
        for i, (a, z) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
            p[i, :, : z - a] = t[a:z].transpose(0, 1)
    useful = sum(causal_pairs(n, n) for n in lens)
    padded_pairs = len(lens) * causal_pairs(longest, longest)
    shape = dict(batch=len(lens), n_q=longest, n_k=longest, causal=True, dtype="float16",
                 tokens=sum(lens), padded_tokens=len(lens) * longest, useful_pairs=useful, padded_pairs=padded_pairs)
    impls = {"attnkit_varlen": (lambda q, k, v: flash.flash_attention_varlen(q, k, v, cu, cu, longest, longest,
                                                                           causal=True), packed),
             "attnkit_padded": (lambda q, k, v: flash.flash_attention(q, k, v, causal=True), padded),
             "sdpa_cudnn_padded": (lambda q, k, v: implementation("sdpa_cudnn")(q, k, v, True), padded),
             "sdpa_flash_padded": (lambda q, k, v: implementation("sdpa_flash")(q, k, v, True), padded)}
    for impl, (fn, tensors) in impls.items():
        for pass_ in passes:
            ms, why = _time(fn, tensors, pass_ == "backward")
            rows.append(_row("varlen", impl, pass_, ms, why, useful, h, d, **shape))   # TFLOP/s of useful work
            log(rows[-1])
    return rows


def bench_window():
    rows = []
    b, h, n, d, window = 1, 16, 32768, 128, 4096
    tensors = [torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(3)]
    cases = {"full_causal": (-1, -1), f"window_{window}": (window - 1, -1)}
    for impl, win in cases.items():
        fn = lambda q, k, v, w=win: flash.flash_attention(q, k, v, causal=True, window=w)  # noqa: E731
        for pass_ in ("forward", "backward"):
            ms, why = _time(fn, tensors, pass_ == "backward")
            rows.append(_row("window", impl, pass_, ms, why, b * causal_pairs(n, n, win[0]), h, d, batch=b,
                             n_q=n, n_k=n, causal=True, dtype="float16", window=window))
            log(rows[-1])
    return rows


def summary(rows):
    """The ratios the targets name."""
    def ms(suite, impl, pass_, **match):
        for r in rows:
            if (r["suite"], r["impl"], r["pass_"]) == (suite, impl, pass_) and all(r[k] == v for k, v in match.items()):
                return r["ms"]
        return float("nan")
    for dtype in sorted({r["dtype"] for r in rows if r["suite"] == "head_dim"}):
        for causal in (False, True):
            ratios = {d: ms("head_dim", "sdpa_cudnn", "forward", head_dim=d, causal=causal, dtype=dtype)
                      / ms("head_dim", "attnkit", "forward", head_dim=d, causal=causal, dtype=dtype)
                      for d in (80, 96, 128, 192)}
            log(f"attnkit / cuDNN forward speed, {dtype} causal={causal}: "
                + ", ".join(f"D={d} {r:.2f} ({r / ratios[128]:.2f} of D=128's)" for d, r in ratios.items()))
    v = [r for r in rows if r["suite"] == "varlen"]
    if v:
        need = v[0]["padded_pairs"] / v[0]["useful_pairs"]
        for pass_ in ("forward", "backward"):
            gain = ms("varlen", "attnkit_padded", pass_) / ms("varlen", "attnkit_varlen", pass_)
            log(f"varlen {pass_}: {gain:.2f}x the dense kernel on the padded batch (target >= {need:.2f}); "
                f"{ms('varlen', 'sdpa_cudnn_padded', pass_) / ms('varlen', 'attnkit_varlen', pass_):.2f}x cuDNN padded")
    for pass_ in ("forward", "backward"):
        gain = ms("window", "full_causal", pass_) / ms("window", "window_4096", pass_)
        log(f"window 4096 at N=32k, {pass_}: {gain:.2f}x full causal (target >= {0.8 * 32768 / (2 * 4096):.1f})")


def main(argv) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out = Path(argv[0])
    # one block configuration per kernel (each variant compiles in ~10 s on the GPU's host); --autotune
    # times the autotuned kernels instead
    os.environ["ATTNKIT_AUTOTUNE"] = "1" if "--autotune" in argv else "0"
    only = int(argv[argv.index("--case") + 1]) if "--case" in argv else None
    failures = [] if "--no-check" in argv else check_all(only)
    for f in failures:
        log("FAIL", f)
    log(f"{len(failures)} check failures" if "--no-check" not in argv else "checks skipped (--no-check)")
    if "--check-only" in argv:
        return 1 if failures else 0
    dtypes = ("float16", "bfloat16") if "--bf16" in argv else ("float16",)
    passes = ("forward", "backward") if "--backward" in argv else ("forward",)
    rows = bench_head_dims(dtypes, passes) + bench_varlen(passes) + bench_window()
    log("wrote", write_results("flash_features", rows, out))
    summary(rows)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
