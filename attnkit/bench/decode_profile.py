"""Where the time of one decode step of lesson 9's engine goes, by torch.profiler (GPU only).

For B sequences of ``CONTEXT`` cached tokens (set up as ``attnkit.bench.serving.decode_step_row`` does),
one ``Engine.decode`` call is timed by CUDA events, then ``STEPS`` calls are profiled with CPU and CUDA
activities. Rows: the step's time; the GPU's busy time (the sum of its kernels' times); kernel launches,
device-to-host copies and synchronisations per step; and the host operations that take the most time.
Each batch size is measured twice, with the engine's decode step run eagerly and replayed from CUDA
graphs (column ``cuda_graphs``).

    python -m attnkit.bench.recorder decode_profile
"""
from __future__ import annotations

import torch

from .recorder import time_ms

BATCHES = (1, 64)
CONTEXT = 64
PAGE_SIZE = 16
STEPS = 20


def _engine_step(model, batch, cuda_graphs: bool):
    from ..serving.engine import Engine

    engine = Engine(model, num_pages=batch * (CONTEXT // PAGE_SIZE + 1), page_size=PAGE_SIZE, max_batch=batch,
                    cuda_graphs=cuda_graphs)
    prompt = model.encode(("the kv cache stores the keys and values of every token. " * 3)[:CONTEXT])
    for rid in range(batch):
        engine.cache.add_sequence(rid)
        engine.prefill(rid, prompt)
    ids = list(range(batch))
    slots = engine.cache.reserve_many(ids, 1)
    tokens = torch.full((batch,), prompt[-1], device=model.head.weight.device)
    positions = torch.full((batch,), CONTEXT, device=tokens.device)
    table = engine.cache.block_table(ids, tokens.device)
    return lambda: engine.decode(tokens, positions, table, slots)


def run(batches=BATCHES, graphs=(False, True)) -> list[dict]:
    from torch.profiler import ProfilerActivity, profile

    from ..serving.tinymodel import load_model

    model = load_model().to("cuda")
    rows = []
    for batch, cuda_graphs in ((b, g) for b in batches for g in graphs):
        step = _engine_step(model, batch, cuda_graphs)
        step_ms = time_ms(step)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
        events = prof.key_averages()
        rows_before = len(rows)
        gpu_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
        count = lambda *names: sum(e.count for e in events if any(n in e.key for n in names)) / STEPS  # noqa: E731
        rows.append({"batch": batch, "what": "step (CUDA events, median)", "ms_per_step": step_ms, "calls_per_step": 1})
        rows.append({"batch": batch, "what": "GPU busy (sum of kernel times)", "ms_per_step": gpu_us / STEPS / 1e3,
                     "calls_per_step": count("cudaLaunchKernel", "cuLaunchKernel")})
        rows.append({"batch": batch, "what": "device-to-host copies", "ms_per_step": float("nan"),
                     "calls_per_step": count("Memcpy DtoH")})
        rows.append({"batch": batch, "what": "host synchronisations", "ms_per_step": float("nan"),
                     "calls_per_step": count("cudaStreamSynchronize", "cudaDeviceSynchronize")})
        host = sorted((e for e in events if e.self_cpu_time_total > 0), key=lambda e: -e.self_cpu_time_total)[:8]
        for e in host:
            rows.append({"batch": batch, "what": f"host: {e.key}", "ms_per_step": e.self_cpu_time_total / STEPS / 1e3,
                         "calls_per_step": e.count / STEPS})
        for row in rows[rows_before:]:
            row["cuda_graphs"] = cuda_graphs
    return rows
