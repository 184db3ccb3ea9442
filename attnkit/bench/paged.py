"""Paged decode against the copy bandwidth and PyTorch's SDPA on a contiguous cache (GPU only).

Two shapes, fp16, 32 query heads, 8 KV heads, D = 128, pages of 16 tokens scattered at random:
- "batch": B = 64 sequences of 4096 tokens (B·Hkv = 512 programs: enough to fill the GPU);
- "long": B = 1 sequence of 32768 tokens (8 programs unless the tokens are split: split-KV).

Bytes counted = the K and V cache bytes read (B · N · Hkv · D · 2 bytes · 2); GB/s = bytes / time.
The ceiling is a device-to-device copy of 1 GiB measured in the same run (bytes read + written).
Timings are medians of CUDA-graph replays (``graph_ms``), as a serving loop runs its decode steps:
at B = 1 one step's GPU work (about 50 µs) is shorter than launching it from Python, so eager timing
would measure the host. The eager median (``eager_ms``) is recorded beside it. Inputs are checked
once beforehand (the check's small host copy is not part of the kernel). The long shape rotates
through three copies of its cache (3 × 134 MB) so that the 50 MB L2 cache cannot hold it. SDPA runs
on the same cache stored contiguously as [B, Hkv, N, D], each backend pinned with
``torch.nn.attention.sdpa_kernel``; the query heads that share a KV head are passed as the query
rows of that head (q as [B, Hkv, Hq/Hkv, D]), which is the same non-causal attention and needs no
copy of K or V.

``run() -> rows`` (one dict per measurement); ``make bench`` writes attnkit/bench/results/bench_paged.csv.
"""
from __future__ import annotations

import torch

from .recorder import time_ms

HQ, HKV, HEAD_DIM, PAGE = 32, 8, 128, 16
SHAPES = {"batch": (64, 4096), "long": (1, 32768)}     # name -> (B, context)
ROTATE = {"batch": 1, "long": 3}                        # copies of the cache timed in turn


def kv_bytes(batch: int, context: int, n_kv: int = HKV, head_dim: int = HEAD_DIM, itemsize: int = 2) -> int:
    """K and V bytes a decode step must read: the byte floor."""
    return 2 * batch * context * n_kv * head_dim * itemsize


def graph_ms(fn) -> float:
    """Median time of fn() in ms, replayed from a CUDA graph (no host launch overhead)."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of nbytes (bytes read + bytes written)."""
    src = torch.randn(nbytes // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    ms = graph_ms(lambda: dst.copy_(src))
    return 2 * nbytes / ms / 1e6


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
    return (lambda: paged._launch(*args, scale, splits, variant, config)), splits


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
    """Time every variant on each shape; one row per (shape, method)."""
    rows = []
    copy_gbps = copy_bandwidth()
    rows.append(dict(shape="copy", method="device copy 1 GiB", B=0, context=0, num_splits=0,
                     ms=(1 << 31) / copy_gbps / 1e6, eager_ms=float("nan"), bytes=1 << 31, gbps=copy_gbps,
                     frac_copy=1.0, note="bytes read + written"))
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
                rows.append(dict(shape=name, method=method, B=batch, context=context, num_splits=splits,
                                 ms=float("nan"), eager_ms=float("nan"), bytes=nbytes, gbps=float("nan"),
                                 frac_copy=float("nan"),
                                 note=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"))
                return
            gbps = nbytes / ms / 1e6
            rows.append(dict(shape=name, method=method, B=batch, context=context, num_splits=splits, ms=ms,
                             eager_ms=eager, bytes=nbytes, gbps=gbps, frac_copy=gbps / copy_gbps, note=note))

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
    """The headline ratios of one run: paged vs copy bandwidth, vs SDPA-cuDNN, grouped vs per-head."""
    def best(shape, prefix):
        times = [r["ms"] for r in rows if r["shape"] == shape and str(r["method"]).startswith(prefix)
                 and r["ms"] == r["ms"]]
        return min(times) if times else float("nan")

    def frac(shape, method):
        return next(r["frac_copy"] for r in rows if r["shape"] == shape and r["method"] == method)

    out = {}
    for shape in ("batch", "long"):
        if not any(r["shape"] == shape for r in rows):
            continue
        auto = next(r for r in rows if r["shape"] == shape and r["method"] == "paged grouped (auto splits)")
        out[f"{shape}: paged / copy bandwidth"] = frac(shape, auto["method"])
        out[f"{shape}: SDPA-cuDNN time / paged time"] = best(shape, "sdpa cudnn") / auto["ms"]
        out[f"{shape}: per-head time / grouped time"] = best(shape, "paged per-head") / auto["ms"]
    return out


__all__ = ["run", "ratios", "make_problem", "kv_bytes", "copy_bandwidth", "SHAPES"]
