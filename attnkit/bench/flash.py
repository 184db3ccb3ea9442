"""Benchmark: attnkit's FlashAttention against PyTorch's SDPA backends (flash, cuDNN, efficient).

``run()`` returns one row per (shape, implementation, pass) with the forward or backward time and
TFLOP/s, at B·N = 16k tokens and H·D = 2048 (D = 64 and 128), N from 512 to 16k, causal and not,
fp16 and bf16, plus grouped-query attention with 32 query heads and 8 K/V heads (SDPA with
``enable_gqa=True``). Every implementation is first checked against a float64 reference on the same
shape (two heads); one that fails the check or does not run gets an empty time and a reason.

FLOPs = 4·B·Hq·Nq·Nk·D (the two matrix products), halved for causal; the backward counts 2.5 times
that (five matrix products instead of two), whatever an implementation actually recomputes.

Plots for the lesson: ``plot_tflops(rows, ...)`` and ``plot_ratios(rows, ...)`` return matplotlib Figures.
"""
from __future__ import annotations

import math

from ..tolerances import rel_error, tolerance

TOKENS = 16 * 1024
MODEL_WIDTH = 2048                      # H · D
SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128)
DTYPES = ("float16", "bfloat16")
GQA_HEADS = (32, 8)                     # query heads, K/V heads (D = 64)
IMPLS = ("attnkit", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")


def attention_flops(batch, heads, n_q, n_k, head_dim, causal, backward=False) -> float:
    """4·B·H·Nq·Nk·D, halved for causal, × 2.5 for the backward."""
    flops = 4.0 * batch * heads * n_q * n_k * head_dim
    if causal:
        flops /= 2
    return flops * 2.5 if backward else flops


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12


# ------------------------------------------------------------------------------ implementations
def _sdpa(backend_name: str):
    """SDPA pinned to one backend; K/V heads shared through enable_gqa."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
               "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION}[backend_name]

    def attend(q, k, v, causal):
        with sdpa_kernel(backend):
            if q.shape[1] != k.shape[1]:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                        enable_gqa=True)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return attend


def implementation(name: str):
    """attend(q, k, v, causal) -> o for ``name`` in IMPLS."""
    if name == "attnkit":
        from ..kernels.flash import flash_attention

        return lambda q, k, v, causal: flash_attention(q, k, v, causal=causal)
    return _sdpa(name)


def reference_slice(q, k, v, do, causal, heads=2):
    """float64 output and gradients of the first batch element's first ``heads`` query heads (on the GPU)."""
    import torch

    group = q.shape[1] // k.shape[1]
    kv_heads = max(1, heads // group)
    q64 = q[:1, :heads].double().requires_grad_()
    k64 = k[:1, :kv_heads].double().requires_grad_()
    v64 = v[:1, :kv_heads].double().requires_grad_()
    scores = q64 @ k64.repeat_interleave(group, 1)[:, :heads].transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:   # aligned to the end: query i sees key j <= i + Nk - Nq
        n_q, n_k = scores.shape[-2:]
        rows = torch.arange(n_q, device=q.device)[:, None]
        visible = torch.arange(n_k, device=q.device)[None, :] <= rows + (n_k - n_q)
        scores = scores.masked_fill(~visible, -math.inf)
    o64 = torch.softmax(scores, dim=-1).nan_to_num(0.0) @ v64.repeat_interleave(group, 1)[:, :heads]
    o64.backward(do[:1, :heads].double())
    return o64.detach(), q64.grad, k64.grad, v64.grad


def check(name, q, k, v, do, causal, expected) -> str | None:
    """None when ``name`` matches the float64 reference slice on this shape, else the reason."""
    import torch

    o64, dq64, dk64, dv64 = expected
    heads, kv_heads = o64.shape[1], dk64.shape[1]
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = implementation(name)(q, k, v, causal)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    if q.shape[1] != k.shape[1]:   # the K/V head also receives gradients from heads outside the slice
        got = [("o", o[:1, :heads], o64), ("dq", dq[:1, :heads], dq64)]
    else:
        got = [("o", o[:1, :heads], o64), ("dq", dq[:1, :heads], dq64), ("dk", dk[:1, :kv_heads], dk64),
               ("dv", dv[:1, :kv_heads], dv64)]
    bound = tolerance(q.dtype, q.device.type)
    for what, out, ref in got:
        err = rel_error(out, ref)
        if not err <= bound:
            return f"{what} relative error {err:.2e} > {bound:.1e}"
    return None


def _time(fn) -> float:
    from .recorder import time_ms

    return time_ms(fn)


def measure(name, q, k, v, do, causal, expected) -> dict:
    """Forward and backward milliseconds of ``name``, or a reason why there are none."""
    import torch

    attend = implementation(name)
    try:
        reason = check(name, q, k, v, do, causal, expected)
        if reason is not None:
            return {"fwd_ms": None, "bwd_ms": None, "reason": reason}
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.no_grad():
            fwd_ms = _time(lambda: attend(q, k, v, causal))
        o = attend(q, k, v, causal)
        bwd_ms = _time(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    except Exception as exc:   # a backend that does not support this shape, or runs out of memory
        first_line = (str(exc).splitlines() or [""])[0][:160]
        return {"fwd_ms": None, "bwd_ms": None, "reason": f"{type(exc).__name__}: {first_line}"}
    return {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "reason": ""}


def shapes():
    """(suite, B, Hq, Hkv, N, D, causal, dtype) for every measured configuration."""
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            for causal in (False, True):
                for n in SEQ_LENS:
                    heads = MODEL_WIDTH // head_dim
                    yield ("mha", TOKENS // n, heads, heads, n, head_dim, causal, dtype)
    hq, hkv = GQA_HEADS
    for causal in (False, True):
        for n in SEQ_LENS:
            yield ("gqa", TOKENS // n, hq, hkv, n, MODEL_WIDTH // hq, causal, "float16")


def run(impls=IMPLS, only=None, device="cuda") -> list[dict]:
    """Measure every shape (or those for which ``only(shape)`` is true); one row per shape, impl and pass."""
    import torch

    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for shape in shapes():
        if only is not None and not only(shape):
            continue
        suite, b, hq, hkv, n, d, causal, dtype_name = shape
        dtype = getattr(torch, dtype_name)

        def randn(*size):
            return torch.randn(*size, generator=gen, device=device, dtype=dtype)

        q, k, v, do = randn(b, hq, n, d), randn(b, hkv, n, d), randn(b, hkv, n, d), randn(b, hq, n, d)
        expected = reference_slice(q, k, v, do, causal)
        for name in impls:
            result = measure(name, q, k, v, do, causal, expected)
            for pass_ in ("fwd", "bwd"):
                ms = result[f"{pass_}_ms"]
                flops = attention_flops(b, hq, n, n, d, causal, backward=pass_ == "bwd")
                rows.append({"suite": suite, "impl": name, "pass": pass_, "B": b, "Hq": hq, "Hkv": hkv,
                             "N": n, "D": d, "causal": causal, "dtype": dtype_name, "ms": ms,
                             "tflops": None if ms is None else tflops(flops, ms), "reason": result["reason"]})
        q = k = v = do = expected = None  # free the memory before the next size
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------ plots
def _select(rows, **where):
    """Rows whose fields equal ``where`` (compared as text, so recorded CSV rows work too;
    ``pass_`` stands for the column "pass")."""
    where = {("pass" if k == "pass_" else k): v for k, v in where.items()}

    def same(a, b):
        fa, fb = _number(a), _number(b)
        return fa == fb if fa is not None and fb is not None else str(a) == str(b)
    return [r for r in rows if all(same(r.get(k), w) for k, w in where.items())]


def _number(x):
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def plot_tflops(rows, *, pass_="fwd", dtype="float16", head_dim=128, suite="mha"):
    """TFLOP/s against N for each implementation; one panel for non-causal, one for causal."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        for impl in IMPLS:
            sel = _select(rows, suite=suite, impl=impl, pass_=pass_, dtype=dtype, D=head_dim, causal=causal)
            points = [(int(r["N"]), _number(r["tflops"])) for r in sel if _number(r["tflops"]) is not None]
            if points:
                xs, ys = zip(*sorted(points))
                ax.plot(xs, ys, marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (tokens; B·N = 16k)")
        ax.set_title(f"{'causal' if causal else 'non-causal'}, {pass_}, D={head_dim}, {dtype}")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    return fig


def ratios(rows, *, against="sdpa_cudnn", pass_="fwd", dtype="float16", head_dim=128, suite="mha"):
    """{(causal, N): attnkit TFLOP/s ÷ ``against`` TFLOP/s} where both have a number."""
    out = {}
    for causal in (False, True):
        ours = {int(r["N"]): _number(r["tflops"]) for r in _select(rows, suite=suite, impl="attnkit",
                pass_=pass_, dtype=dtype, D=head_dim, causal=causal)}
        base = {int(r["N"]): _number(r["tflops"]) for r in _select(rows, suite=suite, impl=against,
                pass_=pass_, dtype=dtype, D=head_dim, causal=causal)}
        for n in sorted(ours):
            if ours[n] and base.get(n):
                out[(causal, n)] = ours[n] / base[n]
    return out


def plot_ratios(rows, *, pass_="fwd", dtype="float16", head_dim=128, suite="mha"):
    """attnkit's speed relative to each SDPA backend (1.0 = as fast), against N."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        for against in IMPLS[1:]:
            r = ratios(rows, against=against, pass_=pass_, dtype=dtype, head_dim=head_dim, suite=suite)
            points = sorted((n, x) for (c, n), x in r.items() if c == causal)
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o", label=f"vs {against}")
        ax.axhline(1.0, color="gray", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sequence length N (tokens; B·N = 16k)")
        ax.set_title(f"{'causal' if causal else 'non-causal'}, {pass_}, D={head_dim}, {dtype}")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("attnkit speed ÷ SDPA backend speed")
    axes[0].legend()
    fig.tight_layout()
    return fig


def summary(rows, *, dtype="float16", head_dim=128, suite="mha") -> str:
    """A short text table of the ratios that the targets speak of."""
    lines = [f"{suite} D={head_dim} {dtype}: attnkit ÷ SDPA backend (TFLOP/s ratio)"]
    for pass_, against in (("fwd", "sdpa_cudnn"), ("fwd", "sdpa_flash"), ("bwd", "sdpa_flash"),
                           ("bwd", "sdpa_cudnn")):
        r = ratios(rows, against=against, pass_=pass_, dtype=dtype, head_dim=head_dim, suite=suite)
        cells = " ".join(f"{'causal' if c else 'N'}={n}:{x:.2f}" for (c, n), x in sorted(r.items()))
        lines.append(f"  {pass_} vs {against}: {cells}")
    return "\n".join(lines)


# ------------------------------------------------------------------ figures from the recorded results


def _recorded():
    from .recorder import read_results

    return read_results("flash")


def recorded_forward_tflops():
    """``figures/flash_fwd_tflops.png`` (named in ``attnkit.classroom.figures.diagrams``)."""
    return plot_tflops(_recorded(), pass_="fwd")


def recorded_backward_tflops():
    """``figures/flash_bwd_tflops.png`` (named in ``attnkit.classroom.figures.diagrams``)."""
    return plot_tflops(_recorded(), pass_="bwd")


def recorded_forward_ratios():
    """``figures/flash_fwd_ratios.png`` (named in ``attnkit.classroom.figures.diagrams``)."""
    return plot_ratios(_recorded(), pass_="fwd")
