"""Tokens per second of the tiny model served over the paged cache, against the batch size (GPU only).

Two measures, each at several batch sizes B:

- ``decode_step``: one decode step for B sequences that each hold ``CONTEXT`` cached tokens (the
  model's 2 layers with ``paged_decode``), timed by ``time_ms`` (CUDA events, median).
  tokens/s = B / step time.
- ``engine``: ``Engine.run`` end to end on a workload of 2·B requests with at most B running at once,
  prompts and output lengths (16 to 64 tokens, no stop character) mixed; wall-clock time of the whole
  run (scheduler, prefills, decodes, host synchronisation), median of 3 runs after a warm-up.
  tokens/s = new tokens / time.

    python -m attnkit.bench.suites serving         # writes attnkit/bench/results/bench_serving.csv

``run_features`` (suite ``serving_features``) serves one workload with a shared system prompt under
several engine configurations and measures each by the wall clock: tokens/s, time to first token and
time per output token (mean, p90), steps, preemptions, prefix-cache hits and the prefill they saved, and
the agreement of each configuration's tokens with the baseline's (see ``FEATURE_CONFIGS``). Its
requests stay inside the 128 positions the tiny model was trained on (``longest_positions`` and
``trained_positions`` in each row): past them the model's best and second-best characters are often
near ties, and token agreement measures rounding noise rather than a feature. It runs on the CPU too,
at a tiny size (``device="cpu"``).

    python -m attnkit.bench.suites serving_features      # writes bench_serving_features.csv

``step_breakdown`` serves the same workload once per configuration and splits the wall clock of the
engine's steps into the decode step (``Engine.decode``, replayed from a CUDA graph where it can be),
the prefill chunks (``Engine.prefill_chunks``) and the rest (the scheduler, the allocator and the
prefix cache on the host), each call followed by a synchronisation so that the GPU's work is counted
in the phase that launched it:

python -c "from attnkit.bench import recorder as r, serving as s; r.write_results('serving_steps', s.step_breakdown())"
"""
from __future__ import annotations

import dataclasses
import os
import random
import statistics
import time

import torch

from ..serving.engine import Engine, Request
from ..serving.tinymodel import CORPUS_PATH, TinyModel, load_model
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

    def ready_engine():               # built and its decode graphs captured before the clock starts
        engine = Engine(model, num_pages=pages, page_size=PAGE_SIZE, max_batch=batch, stop=None)
        engine.capture_graphs()
        torch.cuda.synchronize()
        return engine

    result = ready_engine().run(requests)         # warm-up: compiles and autotunes the kernels
    new_tokens = sum(len(c.tokens) for c in result.completions.values())
    seconds = []
    for _ in range(repeats):
        engine = ready_engine()
        start = time.perf_counter()
        engine.run(requests)
        torch.cuda.synchronize()
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


# ------------------------------------------------------------------------------ engine features
# Each configuration changes the baseline (unchunked prefill, the model's dtype in the cache, no prefix
# caching, CUDA graphs on) in one way, except "all_features".
FEATURE_CONFIGS = {
    "baseline": {},
    "chunked_256": {"max_tokens_per_step": 256},
    "fp8_cache": {"kv_dtype": "fp8"},
    "prefix_caching": {"prefix_caching": True},
    "no_cuda_graphs": {"cuda_graphs": False},
    "all_features": {"max_tokens_per_step": 256, "prefix_caching": True},
}


@dataclasses.dataclass(frozen=True)
class FeatureWorkload:
    """Sizes of the shared-prompt workload and of the engine that serves it."""

    n_requests: int = 64
    prefix_tokens: int = 64           # the system prompt every request starts with
    question_tokens: tuple = (8, 24)  # each request's own words after it (min, max characters)
    new_tokens: tuple = (16, 32)      # max_new_tokens (min, max); no stop token, so exactly this many
    arrivals_per_step: int = 4        # request i arrives at scheduler step i // arrivals_per_step
    max_batch: int = 32
    page_size: int = 16
    num_pages: int = 192              # below max_batch full sequences: some preemption without sharing
    max_tokens_per_step: int = 256    # the budget of the chunked configurations
    # 64 + 24 + 32 = 120 positions at most: inside the tiny model's 128 trained positions


GPU_WORKLOAD = FeatureWorkload()
CPU_WORKLOAD = FeatureWorkload(n_requests=4, prefix_tokens=12, question_tokens=(2, 5), new_tokens=(4, 6),
                               arrivals_per_step=2, max_batch=4, page_size=4, num_pages=10,
                               max_tokens_per_step=8)


def feature_requests(w: FeatureWorkload, seed: int = 0) -> list[Request]:
    """``w.n_requests`` requests: the first ``w.prefix_tokens`` characters of the corpus (lines joined by
    spaces), then distinct words cut from corpus lines; arrivals spread over the first steps."""
    rng = random.Random(seed)
    lines = CORPUS_PATH.read_text().splitlines()
    system = " ".join(lines)[:w.prefix_tokens]
    questions: set[str] = set()
    requests = []
    for rid in range(w.n_requests):
        question = ""
        while not question or question in questions:
            line = rng.choice(lines)
            question = " " + line[rng.randrange(len(line) // 2):][:rng.randint(*w.question_tokens)]
        questions.add(question)
        requests.append(Request(rid, system + question, rng.randint(*w.new_tokens),
                                arrival=rid // w.arrivals_per_step))
    return requests


def serving_model(device, dtype, max_seq_len: int) -> TinyModel:
    """The tiny model's weights on ``device`` in ``dtype``, served up to ``max_seq_len`` positions
    (RoPE has no table to outgrow; past the 128 positions it was trained on, its text is worse, its
    work per token the same)."""
    base = load_model()
    if max_seq_len > base.cfg.max_seq_len:
        model = TinyModel(dataclasses.replace(base.cfg, max_seq_len=max_seq_len), base.vocab)
        model.load_state_dict(base.state_dict())
        base = model.eval().requires_grad_(False)
    return base.to(device=device, dtype=dtype)


def _percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    return float(torch.tensor(values, dtype=torch.float64).quantile(q / 100))


def request_latencies(result) -> tuple[list[float], list[float]]:
    """(time to first token, time per output token) of each request, in seconds, from the steps' wall
    clock: a request arrives when step ``arrival`` begins (the end of the step before it)."""
    end_of = {s.step: s.seconds for s in result.steps}
    ordered = sorted(end_of)

    def arrived(step: int) -> float:
        before = [end_of[s] for s in ordered if s < step]
        return before[-1] if before else 0.0

    ttft, tpot = [], []
    for c in result.completions.values():
        first = end_of[c.first_token]
        ttft.append(first - arrived(c.request.arrival))
        if len(c.tokens) > 1:
            tpot.append((end_of[c.finished] - first) / (len(c.tokens) - 1))
    return ttft, tpot


def token_agreement(result, reference) -> float:
    """Fraction of new-token positions where ``result`` has the token of ``reference`` (same requests)."""
    pairs = [(x, y) for rid, c in reference.completions.items()
             for x, y in zip(c.tokens, result.completions[rid].tokens)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def serve_config(model, w: FeatureWorkload, requests: list[Request], config: dict, *, warmup: bool):
    """(result, engine, wall seconds, graph-capture seconds) of one configuration on ``requests``.

    With ``warmup``, a separate engine first serves the first few requests with a few tokens (compiling
    every kernel this configuration uses); the timed engine captures its decode graphs before the clock
    starts, as a server does at start-up."""
    engine_kw = {k: v for k, v in config.items() if k != "max_tokens_per_step"}
    budget = config.get("max_tokens_per_step")

    def new_engine():
        return Engine(model, num_pages=w.num_pages, page_size=w.page_size, max_batch=w.max_batch, stop=None,
                      **engine_kw)

    if warmup:
        few = [dataclasses.replace(r, max_new_tokens=min(4, r.max_new_tokens), arrival=0) for r in requests[:8]]
        new_engine().run(few, max_tokens_per_step=budget)
    engine = new_engine()
    start = time.perf_counter()
    engine.capture_graphs()
    _synchronize(engine.device)
    capture_s = time.perf_counter() - start
    start = time.perf_counter()
    result = engine.run(requests, max_tokens_per_step=budget)
    _synchronize(engine.device)
    return result, engine, time.perf_counter() - start, capture_s


def feature_row(name: str, config: dict, result, engine, seconds: float, capture_s: float, baseline,
                positions: tuple[int, int] = (0, 0)) -> dict:
    """One row of ``run_features`` from a served result; ``positions``: (the longest request's prompt and
    new tokens, the positions the model was trained on)."""
    ttft, tpot = request_latencies(result)
    new_tokens = sum(len(c.tokens) for c in result.completions.values())
    prefix = engine.prefix
    return {
        "config": name, "max_tokens_per_step": config.get("max_tokens_per_step", ""),
        "kv_dtype": str(engine.cache.k.dtype).replace("torch.", ""), "prefix_caching": prefix is not None,
        "cuda_graphs": engine.cuda_graphs, "requests": len(result.completions), "new_tokens": new_tokens,
        "seconds": seconds, "tokens_per_s": new_tokens / seconds,
        "ttft_mean_ms": 1e3 * statistics.fmean(ttft), "ttft_p90_ms": 1e3 * _percentile(ttft, 90),
        "tpot_mean_ms": 1e3 * statistics.fmean(tpot) if tpot else float("nan"),
        "tpot_p90_ms": 1e3 * _percentile(tpot, 90),
        "steps": len(result.steps), "decode_steps": sum(1 for s in result.steps if s.decode),
        "preemptions": sum(c.preemptions for c in result.completions.values()),
        "prefill_tokens": sum(s.prefill_tokens for s in result.steps),
        "prefill_tokens_saved": sum(c.reused for c in result.completions.values()),
        "prefix_hit_rate": prefix.hit_tokens / max(1, prefix.lookup_tokens) if prefix else 0.0,
        "token_agreement_with_baseline": token_agreement(result, baseline) if baseline else float("nan"),
        "graph_capture_s": capture_s, "longest_positions": positions[0], "trained_positions": positions[1],
        "error": "",
    }


def run_features(device: str | None = None, *, workload: FeatureWorkload | None = None,
                 configs: dict | None = None, dtype=None, seed: int = 0, verbose: bool = True,
                 budget_s: float = 110.0) -> list[dict]:
    """One row per configuration of ``FEATURE_CONFIGS`` (or ``configs``) serving the shared-prompt
    workload (``GPU_WORKLOAD`` on CUDA, ``CPU_WORKLOAD`` on the CPU) with the tiny model in ``dtype``
    (float16 on CUDA, float32 on the CPU). "baseline" runs first: the others' tokens are compared
    with its. A configuration that fails gives a row with its error instead of stopping the run; once
    ``budget_s`` seconds have passed, the configurations left give rows that say they were skipped."""
    os.environ.setdefault("ATTNKIT_AUTOTUNE", "0")                 # one kernel configuration: few compiles
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = device.type == "cuda"
    w = workload or (GPU_WORKLOAD if on_gpu else CPU_WORKLOAD)
    configs = dict(configs or FEATURE_CONFIGS)
    for name, config in configs.items():
        unknown = set(config) - {"max_tokens_per_step", "kv_dtype", "prefix_caching", "cuda_graphs"}
        if unknown:
            raise ValueError(f"configs: {name!r} sets unknown options {sorted(unknown)}")
    configs = {name: {**c, **({"max_tokens_per_step": w.max_tokens_per_step} if "max_tokens_per_step" in c
                              else {})} for name, c in configs.items()}
    requests = feature_requests(w, seed)
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    trained = load_model().cfg.max_seq_len
    model = serving_model(device, dtype or (torch.float16 if on_gpu else torch.float32), longest)
    rows, baseline, began = [], None, time.perf_counter()
    for name in sorted(configs, key=lambda n: n != "baseline"):   # the baseline first
        if time.perf_counter() - began > budget_s:
            rows.append({"config": name, "error": f"skipped: the run's {budget_s:g} s were spent"})
            continue
        try:
            result, engine, seconds, capture_s = serve_config(model, w, requests, configs[name], warmup=on_gpu)
            baseline = result if name == "baseline" else baseline    # None while the baseline failed
            rows.append(feature_row(name, configs[name], result, engine, seconds, capture_s, baseline,
                                    (longest, trained)))
        except Exception as exc:  # noqa: BLE001 - recorded in the row, the other configurations still run
            rows.append({"config": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
        if verbose:
            row = rows[-1]
            print(f"[{time.perf_counter() - began:6.1f} s] {name}: "
                  + (row["error"] or f"{row['tokens_per_s']:.0f} tokens/s, ttft {row['ttft_mean_ms']:.1f} ms, "
                     f"tpot {row['tpot_mean_ms']:.2f} ms, {row['steps']} steps, {row['preemptions']} preemptions, "
                     f"agreement {row['token_agreement_with_baseline']:.3f}"), flush=True)
    return rows


def step_breakdown(device: str | None = None, *, workload: FeatureWorkload | None = None,
                   configs: dict | None = None, dtype=None, seed: int = 0) -> list[dict]:
    """Where the wall clock of the engine's steps goes, per configuration (default: "baseline" and
    "no_cuda_graphs" of ``FEATURE_CONFIGS``): one row per phase, ``decode`` (``Engine.decode``: packing,
    the step itself, replayed from a CUDA graph when the engine captured one), ``prefill``
    (``Engine.prefill_chunks``) and ``host`` (everything else in ``Engine.run``: scheduling, the
    allocator, the prefix cache, choosing tokens), with ms per step, calls per step and share of the
    steps' time. Each timed call is followed by a synchronisation, so the GPU work a phase launches
    counts in that phase (the engine reads each call's result back at once anyway)."""
    os.environ.setdefault("ATTNKIT_AUTOTUNE", "0")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    on_gpu = device.type == "cuda"
    w = workload or (GPU_WORKLOAD if on_gpu else CPU_WORKLOAD)
    configs = dict(configs or {name: FEATURE_CONFIGS[name] for name in ("baseline", "no_cuda_graphs")})
    requests = feature_requests(w, seed)
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    model = serving_model(device, dtype or (torch.float16 if on_gpu else torch.float32), longest)
    rows = []
    for name, config in configs.items():
        unknown = set(config) - {"max_tokens_per_step", "kv_dtype", "prefix_caching", "cuda_graphs"}
        if unknown:
            raise ValueError(f"configs: {name!r} sets unknown options {sorted(unknown)}")
        config = {**config, **({"max_tokens_per_step": w.max_tokens_per_step} if "max_tokens_per_step" in config
                               else {})}
        if on_gpu:                                      # compile every kernel this configuration uses
            serve_config(model, w, requests[:8], config, warmup=True)
        engine_kw = {k: v for k, v in config.items() if k != "max_tokens_per_step"}
        engine = Engine(model, num_pages=w.num_pages, page_size=w.page_size, max_batch=w.max_batch, stop=None,
                        **engine_kw)
        engine.capture_graphs()
        _synchronize(device)
        spent = {"decode": [0.0, 0], "prefill": [0.0, 0]}

        def timed(phase, fn, spent=spent):
            def call(*args, **kwargs):
                start = time.perf_counter()
                out = fn(*args, **kwargs)
                _synchronize(device)
                spent[phase][0] += time.perf_counter() - start
                spent[phase][1] += 1
                return out
            return call

        engine.decode = timed("decode", engine.decode)                 # run() calls both through self
        engine.prefill_chunks = timed("prefill", engine.prefill_chunks)
        start = time.perf_counter()
        result = engine.run(requests, max_tokens_per_step=config.get("max_tokens_per_step"))
        _synchronize(device)
        total = time.perf_counter() - start
        n = len(result.steps)
        phases = {"decode": spent["decode"][0], "prefill": spent["prefill"][0]}
        phases["host"] = total - phases["decode"] - phases["prefill"]
        for phase, seconds in phases.items():
            rows.append({"config": name, "phase": phase, "steps": n, "ms_per_step": 1e3 * seconds / n,
                         "calls_per_step": spent[phase][1] / n if phase in spent else 1.0,
                         "share": seconds / total, "step_ms": 1e3 * total / n, "max_batch": w.max_batch,
                         "requests": len(requests), "cuda_graphs": engine.cuda_graphs})
    return rows


__all__ = ["run", "decode_step_row", "step_breakdown", "engine_row", "workload", "BATCHES", "CONTEXT", "run_features",
           "FEATURE_CONFIGS", "FeatureWorkload", "GPU_WORKLOAD", "CPU_WORKLOAD", "feature_requests",
           "request_latencies", "token_agreement", "serving_model"]
