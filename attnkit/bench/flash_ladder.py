"""Benchmark: the forward kernel's performance ladder, one rung at a time (attnkit.kernels.flash.LADDER).

``run()`` times ``flash_attention_forward(..., variant=rung)`` for every rung at D = 128, fp16,
B·N = 16k tokens, 16 heads, causal and not, N in (1k, 4k, 16k), beside SDPA's cuDNN and flash
backends on the same inputs. Each rung is checked against the float64 reference (two heads) first.
``plot_ladder(rows)`` returns a matplotlib Figure for the lesson.
"""
from __future__ import annotations

from ..tolerances import rel_error, tolerance
from .flash import TOKENS, _number, _sdpa, attention_flops, reference_slice, tflops

SEQ_LENS = (1024, 4096, 16384)
HEAD_DIM = 128
HEADS = 16
BASELINES = ("sdpa_cudnn", "sdpa_flash")


def _attend(name):
    from ..kernels.flash import flash_attention_forward

    if name in BASELINES:
        return _sdpa(name)
    return lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal, variant=name)[0]


def run(seq_lens=SEQ_LENS, device="cuda") -> list[dict]:
    import torch

    from ..kernels.flash import VARIANTS
    from .recorder import time_ms

    rows = []
    gen = torch.Generator(device=device).manual_seed(1)
    for causal in (False, True):
        for n in seq_lens:
            b = TOKENS // n

            def randn(*size):
                return torch.randn(*size, generator=gen, device=device, dtype=torch.float16)

            q, k, v, do = (randn(b, HEADS, n, HEAD_DIM) for _ in range(4))
            o64 = reference_slice(q, k, v, do, causal)[0]
            for name in (*VARIANTS, *BASELINES):
                attend = _attend(name)
                ms, reason = None, ""
                try:
                    with torch.no_grad():
                        err = rel_error(attend(q, k, v, causal)[:1, :2], o64)
                        if not err <= tolerance(torch.float16, device):
                            reason = f"relative error {err:.2e}"
                        else:
                            ms = time_ms(lambda: attend(q, k, v, causal))
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}"
                flops = attention_flops(b, HEADS, n, n, HEAD_DIM, causal)
                rows.append({"rung": name, "N": n, "B": b, "H": HEADS, "D": HEAD_DIM, "causal": causal,
                             "dtype": "float16", "ms": ms, "tflops": None if ms is None else tflops(flops, ms),
                             "reason": reason})
            q = k = v = do = None  # free the memory before the next size
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def plot_ladder(rows):
    """Forward TFLOP/s of each rung (and the SDPA baselines) for each N; non-causal and causal panels."""
    import matplotlib.pyplot as plt
    import numpy as np

    rungs = list(dict.fromkeys(r["rung"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        sel = [r for r in rows if str(r["causal"]) == str(causal)]
        ns = sorted({int(float(r["N"])) for r in sel})
        width = 0.8 / max(1, len(rungs))
        for i, rung in enumerate(rungs):
            values = []
            for n in ns:
                match = [r for r in sel if r["rung"] == rung and int(float(r["N"])) == n]
                values.append((_number(match[0]["tflops"]) if match else None) or 0.0)
            ax.bar(np.arange(len(ns)) + i * width, values, width, label=rung)
        ax.set_xticks(np.arange(len(ns)) + 0.4 - width / 2, [f"N={n}" for n in ns])
        ax.set_title(f"forward, D={HEAD_DIM}, fp16, {'causal' if causal else 'non-causal'}")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].set_ylabel("TFLOP/s")
    fig.tight_layout()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(rungs), fontsize=8)
    return fig


def recorded_ladder():
    """``figures/flash_ladder.png`` (named in ``attnkit.classroom.figures.diagrams``)."""
    from .recorder import read_results

    return plot_ladder(read_results("flash_ladder"))
