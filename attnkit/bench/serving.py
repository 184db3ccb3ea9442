"""Tokens per second of the tiny model served over the paged cache, against the batch size (GPU only).

Two measures, each at several batch sizes B:

- ``decode_step``: one decode step for B sequences that each hold ``CONTEXT`` cached tokens (the
  model's 2 layers with ``paged_decode``), timed by ``time_ms`` (CUDA events, median).
  tokens/s = B / step time.
- ``engine``: ``Engine.run`` end to end on a workload of 2·B requests with at most B running at once,
  prompts and output lengths (16 to 64 tokens, no stop character) mixed; wall-clock time of the whole
  run (scheduler, prefills, decodes, host synchronisation), median of 3 runs after a warm-up.
  tokens/s = new tokens / time.

    python -m attnkit.bench.recorder serving      # writes attnkit/bench/results/bench_serving.csv
"""
from __future__ import annotations

import random
import statistics
import time

import torch

from ..serving.engine import Engine, Request
from ..serving.tinymodel import load_model
from .recorder import time_ms

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXT = 64          # cached tokens per sequence in the decode-step measure
PAGE_SIZE = 16


def _model(device: str):
    return load_model().to(device)


def decode_step_row(model, batch: int, context: int = CONTEXT) -> dict:
    """Time one decode step of ``batch`` sequences with ``context`` cached tokens each."""
    engine = Engine(model, num_pages=batch * (context // PAGE_SIZE + 1), page_size=PAGE_SIZE,
                    max_batch=batch)
    prompt = model.encode(("the kv cache stores the keys and values of every token. " * 3)[:context])
    for rid in range(batch):                       # fill each sequence's pages by a real prefill
        engine.cache.add_sequence(rid)
        engine.prefill(rid, prompt)
    ids = list(range(batch))
    slots = engine.cache.reserve_many(ids, 1)      # the slot of position `context` in each sequence
    tokens = torch.full((batch,), prompt[-1], device=model.head.weight.device)
    positions = torch.full((batch,), context, device=tokens.device)
    table = engine.cache.block_table(ids, tokens.device)
    ms = time_ms(lambda: engine.decode(tokens, positions, table, slots))
    return {"measure": "decode_step", "batch": batch, "context": context, "ms": ms,
            "tokens_per_s": batch / (ms / 1e3), "new_tokens": batch}


def workload(n_requests: int, seed: int = 0) -> list[Request]:
    """Mixed prompts (sentence beginnings) and output limits, all arriving at step 0."""
    rng = random.Random(seed)
    starts = ["the kernel", "the scheduler", "a new request", "paged attention", "the kv cache",
              "online softmax", "the gpu", "the block allocator", "grouped query attention", "the decoder"]
    return [Request(i, rng.choice(starts), rng.randint(16, 64)) for i in range(n_requests)]


def engine_row(model, batch: int, repeats: int = 3) -> dict:
    """Wall-clock tokens/s of Engine.run on 2·batch requests with at most ``batch`` running."""
    requests = workload(2 * batch)
    pages = batch * (-(-(max(len(r.prompt) + r.max_new_tokens for r in requests)) // PAGE_SIZE))

    def serve():
        result = Engine(model, num_pages=pages, page_size=PAGE_SIZE, max_batch=batch, stop=None).run(requests)
        torch.cuda.synchronize()
        return result

    result = serve()                              # warm-up: compiles and autotunes the kernels
    new_tokens = sum(len(c.tokens) for c in result.completions.values())
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        serve()
        seconds.append(time.perf_counter() - start)
    s = statistics.median(seconds)
    return {"measure": "engine", "batch": batch, "context": "", "ms": s * 1e3,
            "tokens_per_s": new_tokens / s, "new_tokens": new_tokens, "steps": len(result.steps)}


def run(batches=BATCHES, measures=("decode_step", "engine")) -> list[dict]:
    """Rows of tokens/s against batch size for ``measures``; needs a CUDA GPU."""
    if not torch.cuda.is_available():
        raise ValueError("run: the serving benchmark needs a CUDA GPU; attnkit/bench/results/bench_serving.csv holds "
                         "recorded results")
    unknown = set(measures) - {"decode_step", "engine"}
    if unknown:
        raise ValueError(f"measures: unknown {sorted(unknown)}; use 'decode_step' and/or 'engine'")
    model = _model("cuda")
    rows = []
    for batch in batches:
        if "decode_step" in measures:
            rows.append(decode_step_row(model, batch))
        if "engine" in measures:
            rows.append(engine_row(model, batch))
    return rows


__all__ = ["run", "decode_step_row", "engine_row", "workload", "BATCHES", "CONTEXT"]
