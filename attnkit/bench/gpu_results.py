"""Summaries and plots of the GPU scripts' recorded results (``recorder.SCRIPT_RESULTS``) and of the
serving features suite, for lessons 5, 6 and 9 and for ``make figures``: each summary returns the
ratios the course's targets name, computed from the recorded rows, never typed.

- ``feature_ratios(rows)``: head dims (attnkit / cuDNN forward speed at each D, and that ratio over
  D = 128's), packed sequences (varlen against the dense kernel on the padded batch, with the ratio of
  padded to useful work it should reach) and the sliding window (against full causal, with 0.8 · N / (2 ·
  window) as its target), from ``bench_flash_features.csv``;
- ``backward_ratios(rows)``: each backward design's speed over cuDNN's, from ``bench_flash_backward.csv``;
- ``fp8_ratios(rows)``: the FP8 forward over the course's fp16 forward and over cuDNN's fp16, and the
  matrix-product ceilings, from ``bench_flash_fp8.csv``;
- ``sweep_summary(rows)``: each kernel's block configurations ranked by their geometric-mean time over
  the sweep's cases, relative to the launcher's old default, from ``bench_flash_sweep.csv``;
- ``profile_table(rows)``: the Nsight Compute numbers per profiled kernel (``bench_flash_profile.csv``),
  and ``profile_totals(rows)``: each profiled call's summed kernel time.
"""
from __future__ import annotations

import math

from .recorder import read_results


def _speed(rows, impl, **match) -> float:
    """1 / ms of the one row of ``impl`` that matches (NaN when there is none)."""
    for r in rows:
        if r["impl"] == impl and all(str(r[k]) == str(v) for k, v in match.items()):
            return 1.0 / r["ms"] if r["ms"] == r["ms"] and r["ms"] else float("nan")
    return float("nan")


def feature_ratios(rows) -> dict:
    head = [r for r in rows if r["suite"] == "head_dim"]
    dims = sorted({int(r["head_dim"]) for r in head})
    out = {"head_dim": {}}
    for causal in ("False", "True"):
        vs_cudnn = {d: _speed(head, "attnkit", head_dim=float(d), causal=causal, pass_="forward")
                    / _speed(head, "sdpa_cudnn", head_dim=float(d), causal=causal, pass_="forward") for d in dims}
        out["head_dim"][causal == "True"] = {d: (r, r / vs_cudnn[128]) for d, r in vs_cudnn.items()}
    varlen = [r for r in rows if r["suite"] == "varlen" and r["pass_"] == "forward"]
    if varlen:
        out["varlen"] = dict(
            speedup=_speed(varlen, "attnkit_varlen") / _speed(varlen, "attnkit_padded"),
            target=varlen[0]["padded_pairs"] / varlen[0]["useful_pairs"],
            vs_cudnn_padded=_speed(varlen, "attnkit_varlen") / _speed(varlen, "sdpa_cudnn_padded"))
    window = [r for r in rows if r["suite"] == "window"]
    if window:
        w, n = window[0]["window"], window[0]["n_q"]
        out["window"] = {p: _speed(window, f"window_{int(w)}", pass_=p) / _speed(window, "full_causal", pass_=p)
                         for p in ("forward", "backward")}
        out["window_target"] = 0.8 * n / (2 * w)
    return out


def backward_ratios(rows) -> dict:
    """{(impl, head_dim, n, causal): speed / cuDNN's} for the backward suite."""
    return {(r["impl"], int(r["head_dim"]), int(r["n"]), r["causal"] == "True"): r["vs_cudnn"]
            for r in rows if r["suite"] == "backward" and r["impl"] not in ("sdpa_cudnn",)}


def hopper_backward_ratios(rows) -> dict:
    """{(impl, head_dim, n, causal): cuDNN's time ÷ the impl's} from bench_flash_hopper_backward.csv."""
    return {(r["impl"], int(r["head_dim"]), int(r["n"]), r["causal"] == "True"): r["vs_cudnn"] for r in rows}


def spread_ratios(rows, impl: str, baseline: str = "sdpa_cudnn") -> dict:
    """{(head_dim, n, causal): [baseline's time ÷ impl's, one per repeat]} from the alternating repeats of
    scripts/gpu_flash_spread.py (bench_flash_spread*.csv); each pair timed one after the other.
    Rows without a head_dim (the forward's first recording) are its D = 128 runs."""
    pairs = {}
    for r in rows:
        key = (int(r.get("head_dim") or 128), int(r["n"]), str(r["causal"]) == "True")
        pairs.setdefault((key, int(r["repeat"])), {})[r["impl"]] = r["ms"]
    out = {}
    for (key, _), ms in sorted(pairs.items()):
        if impl in ms and baseline in ms:
            out.setdefault(key, []).append(ms[baseline] / ms[impl])
    return out


def hopper_ratios(rows) -> dict:
    """{(head_dim, n, causal): {impl: cuDNN's time ÷ the impl's}} from bench_flash_hopper.csv."""
    out = {}
    for r in rows:
        out.setdefault((int(r["D"]), int(r["N"]), r["causal"] == "True"), {})[r["impl"]] = r["vs_cudnn"]
    return out


def fp8_ratios(rows) -> dict:
    out = {}
    for n in sorted({int(r["n"]) for r in rows if r["impl"] == "fp8"}):
        for causal in ("False", "True"):
            fp8 = _speed(rows, "fp8", n=float(n), causal=causal)
            out[(n, causal == "True")] = dict(
                vs_fp16=fp8 / _speed(rows, "fp16_attnkit", n=float(n), causal=causal),
                vs_cudnn_fp16=fp8 / _speed(rows, "fp16_sdpa_cudnn", n=float(n), causal=causal),
                rel_err=next(r["rel_err"] for r in rows if r["impl"] == "fp8" and r["n"] == n
                             and r["causal"] == causal),
                fp16_rel_err=next(r["rel_err"] for r in rows if r["impl"] == "fp16_attnkit" and r["n"] == n
                                  and r["causal"] == causal))
    ceilings = {r["impl"]: r["tflops"] for r in rows if r["impl"].startswith(("matmul", "scaled_mm"))}
    out["ceilings"] = ceilings
    return out


def sweep_summary(rows, head_dim: int = 128) -> dict:
    """{(launcher, desc): [(config, speed relative to the first candidate, cases)]}, fastest first: the
    geometric mean over the sweep's cases (N, causal) at ``head_dim`` of first-candidate time / time.
    A configuration that failed or did not fit in any case is left out."""
    sweep = [r for r in rows if str(r["suite"]).startswith("sweep") and r["launcher"] != "sdpa_cudnn"
             and int(r["head_dim"]) == head_dim]
    out = {}
    for key in sorted({(r["launcher"], str(r["desc"]) == "True") for r in sweep}):
        mine = [r for r in sweep if (r["launcher"], str(r["desc"]) == "True") == key]
        cases = sorted({(r["n"], r["causal"]) for r in mine})
        first = {(r["n"], r["causal"]): r["ms"] for r in mine if r["config"] == mine[0]["config"]}
        ranked = []
        for config in dict.fromkeys(r["config"] for r in mine):
            timed = {(r["n"], r["causal"]): r["ms"] for r in mine
                     if r["config"] == config and r["check"] == "pass" and r["ms"] == r["ms"]}
            if len(timed) == len(cases):
                logs = [math.log(first[c] / timed[c]) for c in cases]
                ranked.append((config, math.exp(sum(logs) / len(logs)), len(cases)))
        out[key] = sorted(ranked, key=lambda item: -item[1])
    return out


PROFILE_COLUMNS = ("duration_us", "registers", "threads_per_block", "grid", "warps_active_pct", "tensor_active_pct",
                   "issue_active_pct", "spill_instructions", "atomic_instructions", "stall_barrier",
                   "stall_long_scoreboard", "stall_lg_throttle")


def profile_table(rows) -> list[dict]:
    """The main kernel of each profiled call (the longest one) with the columns the lessons discuss."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        main = max((r for r in rows if r["case"] == case), key=lambda r: r["duration_us"])
        out.append({"case": case, "kernel": main["kernel"], **{c: main[c] for c in PROFILE_COLUMNS}})
    return out


def profile_totals(rows) -> dict:
    """{case: summed kernel time in µs of the profiled call} (every kernel it launched)."""
    totals = {}
    for r in rows:
        totals[r["case"]] = totals.get(r["case"], 0.0) + r["duration_us"]
    return totals


def plot_sweep(rows=None):
    """Each kernel's block configurations at D = 128, speed relative to the launcher's old default."""
    import matplotlib.pyplot as plt

    summary = sweep_summary(rows if rows is not None else read_results("flash_sweep"))
    panels = [k for k in (("fwd_desc", True), ("fwd", False), ("bwd_dkdv", False), ("bwd_dq", False),
                          ("bwd_atomic", False)) if k in summary]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.8), sharex=True)
    for ax, key in zip(axes, panels):
        ranked = summary[key][::-1]
        ax.barh([c for c, _, _ in ranked], [v for _, v, _ in ranked],
                color=["tab:green" if v >= 1 else "tab:red" for _, v, _ in ranked])
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_title(key[0] + (" (TMA)" if key[1] else ""), fontsize=9)
        ax.tick_params(labelsize=7)
    axes[len(panels) // 2].set_xlabel("speed / the old default's (geometric mean over N and causal)")
    fig.suptitle("block configurations on the H100, D = 128, fp16", fontsize=10)
    fig.tight_layout()
    return fig


def plot_features(rows=None):
    """Left: attnkit / cuDNN forward speed by head dim. Right: the varlen and window speed-ups against
    their targets."""
    import matplotlib.pyplot as plt

    ratios = feature_ratios(rows if rows is not None else read_results("flash_features"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, causal in enumerate((False, True)):
        dims = list(ratios["head_dim"][causal])
        left.bar([x + 0.38 * i for x in range(len(dims))], [ratios["head_dim"][causal][d][0] for d in dims], 0.38,
                 label="causal" if causal else "non-causal")
    left.set_xticks([x + 0.19 for x in range(len(dims))], [f"D = {d}" for d in dims])
    left.set_ylabel("attnkit / cuDNN forward speed")
    left.set_title("head dims (N = 4096, fp16, fixed block sizes)")
    left.legend()
    bars = {"varlen fwd": (ratios["varlen"]["speedup"], ratios["varlen"]["target"]),
            "window fwd": (ratios["window"]["forward"], ratios["window_target"]),
            "window bwd": (ratios["window"]["backward"], ratios["window_target"])}
    right.bar(list(bars), [v[0] for v in bars.values()], color="tab:green", label="measured")
    right.scatter(list(bars), [v[1] for v in bars.values()], color="black", marker="_", s=600, zorder=3,
                  label="target")
    right.set_ylabel("speed-up")
    right.set_title("varlen: over the padded batch; window: over full causal")
    right.legend()
    fig.tight_layout()
    return fig


def plot_backward(rows=None):
    """Each backward design's speed over cuDNN's, by shape."""
    import matplotlib.pyplot as plt

    ratios = backward_ratios(rows if rows is not None else read_results("flash_backward"))
    shapes = sorted({k[1:] for k in ratios})
    impls = [i for i in ("two_kernels", "atomic_dq", "atomic_dq_alt", "sdpa_flash") if any(k[0] == i for k in ratios)]
    fig, ax = plt.subplots(figsize=(11, 3.6))
    width = 0.8 / len(impls)
    labels = {"atomic_dq": "atomic_dq (64×128)", "atomic_dq_alt": "atomic_dq, 64×64", "sdpa_flash": "FlashAttention-2"}
    for j, impl in enumerate(impls):
        ax.bar([x + j * width for x in range(len(shapes))], [ratios.get((impl, *s), float("nan")) for s in shapes],
               width, label=labels.get(impl, impl))
    ax.axhline(0.9, color="black", lw=0.8, ls="--", label="target 0.9")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))],
                  [f"D{d} N{n // 1024}k{' c' if c else ''}" for d, n, c in shapes], fontsize=8)
    ax.set_ylabel("backward speed / cuDNN's")
    ax.set_title("backward designs on the H100 (fp16, each launcher's default tiles; 'c': causal)")
    ax.legend(fontsize=8, ncols=5, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    return fig


def plot_serving_features(rows=None):
    """Throughput, time to first token and time per output token of each engine configuration, as
    ratios to the baseline's (bench_serving_features.csv)."""
    import matplotlib.pyplot as plt

    rows = rows if rows is not None else read_results("serving_features")
    base = next(r for r in rows if r["config"] == "baseline")
    configs = [r for r in rows if r["config"] != "baseline"]
    measures = (("tokens_per_s", "throughput"), ("ttft_mean_ms", "TTFT (mean)"), ("tpot_mean_ms", "TPOT (mean)"))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    width = 0.8 / len(measures)
    for j, (field, label) in enumerate(measures):
        ax.bar([x + j * width for x in range(len(configs))], [r[field] / base[field] for r in configs], width,
               label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(configs))], [r["config"] for r in configs])
    ax.set_ylabel("÷ baseline")
    ax.set_title(f"engine features, 64 requests with a shared prompt ({base['gpu']})")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


__all__ = ["feature_ratios", "backward_ratios", "fp8_ratios", "plot_features", "plot_backward",
           "plot_serving_features"]
