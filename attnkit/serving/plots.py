"""Pictures of a served run: the scheduler's timeline (who waited, prefilled, decoded at each step) and
the pages in use against the pool and a contiguous cache. matplotlib is imported when one is drawn."""
from __future__ import annotations

from .comparison import kv_memory
from .request import ServeResult

TIMELINE_COLORS = {"waiting": "#d9d9d9", "prefill": "#e6862e", "decode": "#3b75af"}


def plot_timeline(result: ServeResult, ax=None):
    """One row per request, one column per scheduler step: waiting (grey), prefill or a prefill chunk
    (orange), decode (blue); a red cross where a request was preempted (its pages freed, its context
    recomputed later). Steps are the scheduler's own numbers: an idle clock jump leaves a gap."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3))
    for s in result.steps:
        for kind in ("waiting", "prefill", "decode"):
            for rid in getattr(s, kind):
                ax.broken_barh([(s.step - 0.5, 1.0)], (rid - 0.4, 0.8), color=TIMELINE_COLORS[kind])
        for rid in s.preempted:
            ax.plot(s.step, rid, marker="x", color="red", markersize=8, ls="")
    for c in result.completions.values():
        ax.plot(c.finished + 0.5, c.request.rid, marker="|", color="black", markersize=12)
    ax.set_xlabel("scheduler step")
    ax.set_ylabel("request id")
    ax.set_yticks(sorted(result.completions))
    steps = [s.step for s in result.steps] or [0]
    ax.set_xlim(min(steps) - 1, max(steps) + 1)
    ax.set_ylim(max(result.completions) + 0.6, -1.6)       # request 0 on top, a free row for the legend
    handles = [Patch(color=c, label=k) for k, c in TIMELINE_COLORS.items()]
    handles += [plt.Line2D([], [], color="black", marker="|", ls="", markersize=12, label="finished, pages freed"),
                plt.Line2D([], [], color="red", marker="x", ls="", label="preempted")]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=5)
    return ax


def plot_pages(engine, result: ServeResult, ax=None):
    """Pages in use after each step, against the pool and a contiguous max-length cache, in KiB."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.5))
    mem = kv_memory(engine, result)
    page_kib = engine.page_size * mem["bytes_per_token"] / 1024
    steps = [s.step for s in result.steps]
    ax.step(steps, [s.pages_in_use * page_kib for s in result.steps], where="mid", label="paged: pages in use")
    ax.step(steps, [s.tokens_cached * mem["bytes_per_token"] / 1024 for s in result.steps], where="mid",
            ls=":", label="tokens actually cached")
    ax.axhline(mem["pool_bytes"] / 1024, color="grey", ls="--", label="page pool")
    ax.axhline(mem["contiguous_bytes"] / 1024, color="red", ls="--",
               label=f"contiguous: {engine.max_batch} × {engine.cfg.max_seq_len} tokens")
    ax.set_xlabel("scheduler step")
    ax.set_ylabel("KV cache (KiB)")
    ax.legend(loc="center right", fontsize=8)
    return ax
