"""The engine's decode step on padded static buffers (the step a CUDA graph replays): padded rows change
no real row and no sequence's cache, the served tokens stay exact with every scheduler feature on, and
one step reads nothing back to the host. GPU tests capture ``paged_decode`` and the engine's step."""
import random

import pytest
import torch
from host_syncs import HostSyncs

from attnkit.kernels import paged
from attnkit.serving.engine import (
    Engine,
    Request,
    compare_with_no_cache,
    graph_batch_sizes,
    kernel_backend,
    paged_decode_torch,
    torch_backend,
)
from attnkit.serving.tinymodel import CORPUS_PATH, load_model, tiny_model
from attnkit.tolerances import assert_close


@pytest.fixture(autouse=True)
def one_thread_and_no_pending_checks():
    """One thread (the model is tiny); afterwards the device-side value checks of the decode steps
    are read: a bad length or page id in any step fails the test."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
    paged.raise_pending_errors()


# ------------------------------------------------------------------------------------- set-up
PROMPTS = ["the kernel reads", "a page", "the gpu keeps hot tiles", "online softmax", "the decoder predicts",
           "paged attention", "the kv cache grows"]


def engine_with_sequences(batch: int, *, max_batch: int = 8, backend=None, kv_dtype="model", device="cpu"):
    """An engine whose cache holds ``batch`` prefilled sequences of different lengths, and the inputs of
    their next decode step: (engine, tokens [B], positions [B], block_table [B, pages], slots)."""
    model = tiny_model() if device == "cpu" else load_model().to(device)
    engine = Engine(model, num_pages=40, page_size=4, max_batch=max_batch, backend=backend, kv_dtype=kv_dtype)
    ids = list(range(batch))
    last = []
    for rid in ids:
        prompt = model.encode(PROMPTS[rid])
        engine.cache.add_sequence(rid)
        engine.prefill(rid, prompt[:-1])
        last.append(prompt[-1])
    slots = engine.cache.reserve_many(ids, 1)                       # the slot of each last prompt token
    positions = torch.tensor([engine.cache.length(rid) - 1 for rid in ids])
    return engine, torch.tensor(last), positions, engine.cache.block_table(ids), slots


def reference_step(engine, tokens, positions, block_table, slots):
    """The decode step written plainly (the reference RoPE, cache.write, paged_decode_torch) → logits [B, vocab]."""
    model = engine.model
    seq_lens = (positions + 1).to(torch.int32)
    x = model.embed(tokens[:, None])
    for layer, block in enumerate(model.blocks):
        q, k, v = block.project_qkv(x, positions[:, None])
        engine.cache.write(layer, slots, k[:, :, 0], v[:, :, 0])
        attn = paged_decode_torch(q[:, :, 0], engine.cache.k[layer], engine.cache.v[layer], block_table, seq_lens)
        x = block.finish(x, attn[:, :, None])
    return model.logits(x[:, 0])


def blas_rows_independent(model, rows: int, size: int) -> bool:
    """Whether this machine's matrix product gives the first ``rows`` rows of a [size, d] product the
    same bits as a [rows, d] product (MKL computes fewer than 4 rows by another kernel: not always)."""
    w = model.blocks[0].up.weight
    x = torch.randn(size, w.shape[1], generator=torch.Generator().manual_seed(0))
    return torch.equal(torch.nn.functional.linear(x[:rows], w), torch.nn.functional.linear(x, w)[:rows])


# ------------------------------------------------------------------------------- padded step
def test_padded_sizes_are_powers_of_two_up_to_max_batch():
    assert graph_batch_sizes(8) == (1, 2, 4, 8)
    assert graph_batch_sizes(5) == (1, 2, 4, 5)
    assert graph_batch_sizes(1) == (1,)
    engine = Engine(tiny_model(), num_pages=8, page_size=4, max_batch=8)
    assert [engine.padded_batch(b) for b in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]


@pytest.mark.parametrize("batch, size", [(1, 1), (3, 4), (5, 8)])
@torch.no_grad()
def test_the_padded_step_gives_the_logits_of_the_unpadded_step(batch, size):
    engine, tokens, positions, table, slots = engine_with_sequences(batch)
    rows = engine.pack_rows(tokens, positions, table, slots)
    assert rows.shape[0] == engine.padded_batch(batch) == size
    unpadded = engine.decode_step(rows[:batch].clone())
    padded = engine.decode(tokens, positions, table, slots)          # the step on the padded static buffer
    assert padded.shape == (batch, engine.cfg.vocab_size)
    if blas_rows_independent(engine.model, batch, size):
        assert torch.equal(padded, unpadded)
    else:                           # the matrix product of < 4 rows rounds differently: within float32
        assert_close(padded, unpadded, torch.float32, what="padded logits")
        assert torch.equal(padded.argmax(-1), unpadded.argmax(-1))
    # whatever the padding rows hold, the real rows get the same bits (same shapes, same kernels)
    other = rows.clone()
    other[batch:, 0] = 7                                             # other tokens in the padding rows
    assert torch.equal(engine.decode_step(other)[:batch], engine.decode_step(rows)[:batch])
    # and the step is the plain decode step
    assert_close(padded, reference_step(engine, tokens, positions, table, slots), torch.float32,
                 what="decode step")


@torch.no_grad()
def test_the_padded_step_over_an_fp8_cache_gives_the_logits_of_the_unpadded_step():
    engine, tokens, positions, table, slots = engine_with_sequences(5, kv_dtype="fp8")
    rows = engine.pack_rows(tokens, positions, table, slots)
    unpadded = engine.decode_step(rows[:5].clone())
    padded = engine.decode(tokens, positions, table, slots)
    if blas_rows_independent(engine.model, 5, 8):
        assert torch.equal(padded, unpadded)
    else:
        assert_close(padded, unpadded, torch.float32, what="padded logits over the fp8 cache")
    scratch = engine.cache.k[:, engine.scratch_page].float()                   # written by the 3 padding rows
    assert engine.cache.k.dtype == torch.float8_e4m3fn and bool(scratch.abs().sum() > 0)


@torch.no_grad()
def test_padded_rows_write_only_the_scratch_page():
    """Every page a sequence may own is the same after a padded step as after an unpadded one."""
    padded_engine, tokens, positions, table, slots = engine_with_sequences(3)
    plain_engine = engine_with_sequences(3)[0]
    padded_engine.decode(tokens, positions, table, slots)           # 4 rows: one padding row
    plain_engine.decode_step(plain_engine.pack_rows(tokens, positions, table, slots)[:3].clone())
    scratch = padded_engine.scratch_page
    assert scratch == padded_engine.cache.num_pages == padded_engine.cache.k.shape[1] - 1
    for name in ("k", "v"):
        a, b = getattr(padded_engine.cache, name), getattr(plain_engine.cache, name)
        assert_close(a[:, :scratch], b[:, :scratch], torch.float32, what=f"cache.{name} outside the scratch page")
        assert bool(a[:, scratch, 0].abs().sum() > 0) and bool(b[:, scratch].abs().sum() == 0)
    all_pages = padded_engine.cache.allocator.allocate(padded_engine.cache.num_free_pages)
    assert scratch not in all_pages                                   # the allocator never hands it out


def test_bad_decode_inputs_are_named():
    engine, tokens, positions, table, slots = engine_with_sequences(3, max_batch=4)
    with pytest.raises(ValueError, match="block_table"):
        engine.decode(tokens, positions, torch.zeros(3, engine.table_width + 1, dtype=torch.int32), slots)
    with pytest.raises(ValueError, match="positions"):
        engine.decode(tokens, positions[:2], table, slots)
    big = engine_with_sequences(5, max_batch=8)
    with pytest.raises(ValueError, match="max_batch=4"):
        engine.decode(*big[1:])
    with pytest.raises(ValueError, match="cuda_graphs"):
        Engine(tiny_model(), num_pages=8, cuda_graphs="yes")
    assert Engine(tiny_model(), num_pages=8, cuda_graphs=True).cuda_graphs is False     # no graphs on the CPU


# -------------------------------------------------------------------------------- no read-back
@pytest.mark.parametrize("backend", ["kernels", "torch"])
@torch.no_grad()
def test_a_decode_step_reads_nothing_back_to_the_host(monkeypatch, backend):
    engine, tokens, positions, table, slots = engine_with_sequences(
        3, backend=kernel_backend() if backend == "kernels" else torch_backend())
    syncs = HostSyncs(monkeypatch)
    logits = engine.decode(tokens, positions, table, slots)
    calls = list(syncs.calls)
    monkeypatch.undo()
    assert calls == [], f"one decode step read {calls} back to the host"
    assert logits.shape == (3, engine.cfg.vocab_size)


def test_the_counter_sees_a_read_back(monkeypatch):
    """The reference RoPE checks its positions on the host: the counter sees it (it can fail)."""
    model = tiny_model()
    x = model.embed(torch.tensor([[1], [2]]))
    syncs = HostSyncs(monkeypatch)
    model.blocks[0].project_qkv(x, torch.tensor([[3], [4]]))
    calls = list(syncs.calls)
    monkeypatch.undo()
    assert calls


# ---------------------------------------------------------------------------- exact serving
def shared_prefix_workload(seed: int, n_requests: int = 7) -> list[Request]:
    """A shared system prompt, then each request's own words; mixed output limits and arrivals."""
    rng = random.Random(seed)
    system = "the kernel reads the "
    lines = CORPUS_PATH.read_text().splitlines()
    return [Request(i, system + rng.choice(lines)[:rng.randint(2, 9)], rng.randint(4, 9), arrival=rng.randint(0, 3))
            for i in range(n_requests)]


def count_padding(engine) -> list:
    """Wrap the engine's step to record (rows, padded size) of every decode step."""
    sizes, step = [], engine.decode_step

    def recording(static):
        sizes.append(static.shape[0])
        return step(static)

    engine.decode_step = recording
    return sizes


@pytest.mark.parametrize("backend, seed", [("kernels", 0), ("torch", 1), ("torch", 2)])
def test_the_padded_step_serves_the_no_cache_tokens_with_chunks_prefix_caching_and_preemption(backend, seed):
    model = tiny_model()
    engine = Engine(model, num_pages=16, page_size=4, max_batch=8, prefix_caching=True,
                    backend=kernel_backend() if backend == "kernels" else torch_backend())
    sizes = count_padding(engine)
    result = engine.run(shared_prefix_workload(seed), max_tokens_per_step=10)
    check = compare_with_no_cache(model, result)
    assert check.all_equal, f"tokens differ for requests {[r for r, ok in check.equal.items() if not ok]}"
    assert sum(len(s.preempted) for s in result.steps) > 0, "the pool should be too small: preemption"
    assert sum(c.reused for c in result.completions.values()) > 0, "the shared prompt should hit the cache"
    assert max(s.prefill_tokens for s in result.steps) <= 10 and any(0 < s.prefill_tokens < 10 for s in result.steps)
    decoded = [len(s.decode) for s in result.steps if s.decode]
    assert sizes == [engine.padded_batch(n) for n in decoded]
    assert any(size > n for size, n in zip(sizes, decoded)), "some step should be padded"
    assert [s.seconds for s in result.steps] == sorted(s.seconds for s in result.steps)
    for c in result.completions.values():
        assert c.admitted <= c.first_token <= c.finished


# ------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_the_default_paged_decode_call_is_captured_and_replayed_with_new_inputs():
    gen = torch.Generator(device="cuda").manual_seed(0)
    num_pages, page, hkv, d, batch = 24, 16, 2, 64, 3
    k_pages, v_pages = (torch.randn(num_pages, page, hkv, d, device="cuda", generator=gen, dtype=torch.float16)
                        for _ in range(2))
    q = torch.randn(batch, 8, d, device="cuda", generator=gen, dtype=torch.float16)
    table = torch.randint(0, num_pages, (batch, 6), device="cuda", generator=gen, dtype=torch.int32)
    lens = torch.tensor([5, 70, 96], dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        paged.paged_decode(q, k_pages, v_pages, table, lens)          # warm-up: compiles
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged.paged_decode(q, k_pages, v_pages, table, lens)    # the default: checks on the device
    for new_lens in ([1, 33, 17], [96, 2, 50]):
        q.copy_(torch.randn(q.shape, device="cuda", generator=gen, dtype=q.dtype))
        table.copy_(torch.randint(0, num_pages, table.shape, device="cuda", generator=gen, dtype=torch.int32))
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        graph.replay()
        expected = paged.paged_decode_ref(q, k_pages, v_pages, table, lens)
        assert_close(out.double().cpu(), expected, torch.float16, "cuda", what="replayed paged_decode")


@pytest.mark.gpu
@pytest.mark.filterwarnings("error::RuntimeWarning")       # a failed capture (eager fallback) fails the test
@pytest.mark.parametrize("kv_dtype", ["model", "fp8"])
def test_cuda_graphs_on_and_off_serve_the_same_tokens(kv_dtype):
    model = load_model().to("cuda")
    results = {}
    for graphs in (True, False):
        engine = Engine(model, num_pages=16, page_size=4, max_batch=8, prefix_caching=True, kv_dtype=kv_dtype,
                        cuda_graphs=graphs)
        assert engine.cuda_graphs is graphs
        results[graphs] = engine.run(shared_prefix_workload(0), max_tokens_per_step=10)
        if graphs:
            assert engine.graphs and all(g is not None for g in engine.graphs.values())
    tokens = {g: {rid: c.tokens for rid, c in r.completions.items()} for g, r in results.items()}
    assert tokens[True] == tokens[False]
    if kv_dtype == "model":
        assert compare_with_no_cache(model, results[True]).all_equal


@pytest.mark.gpu
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_replayed_step_equals_the_eager_step():
    engine, tokens, positions, table, slots = engine_with_sequences(5, device="cuda")
    assert engine.cuda_graphs
    replayed = engine.decode(tokens.cuda(), positions.cuda(), table.cuda(), slots)
    assert 8 in engine.graphs and engine.graphs[8] is not None
    eager = engine.decode_step(engine.load_rows(engine.pack_rows(tokens, positions, table, slots)))[:5]
    assert_close(replayed, eager, torch.float32, "cuda", what="replayed step")
    assert torch.equal(replayed.argmax(-1), eager.argmax(-1))


# ------------------------------------------------------------------------------------- benchmark
def test_the_features_benchmark_runs_on_the_cpu():
    """run_features at its CPU size: every row measured, the prefix cache saves prefill, fp8 agrees."""
    from attnkit.bench import serving

    configs = {name: serving.FEATURE_CONFIGS[name] for name in ("baseline", "fp8_cache", "all_features")}
    rows = {r["config"]: r for r in serving.run_features("cpu", configs=configs, verbose=False)}
    assert list(rows) == ["baseline", "fp8_cache", "all_features"]
    assert all(r["error"] == "" for r in rows.values()), rows
    w = serving.CPU_WORKLOAD
    for r in rows.values():
        assert r["requests"] == w.n_requests and r["tokens_per_s"] > 0 and r["seconds"] > 0
        assert r["ttft_mean_ms"] > 0 and r["ttft_p90_ms"] > 0 and r["tpot_p90_ms"] > 0
        assert w.new_tokens[0] * w.n_requests <= r["new_tokens"] <= w.new_tokens[1] * w.n_requests
        assert r["tpot_mean_ms"] > 0 and r["decode_steps"] <= r["steps"]
    base, fp8, every = rows["baseline"], rows["fp8_cache"], rows["all_features"]
    assert base["preemptions"] > 0, "the CPU workload's pool should preempt without prefix caching"
    assert base["token_agreement_with_baseline"] == 1.0 and fp8["kv_dtype"] == "float8_e4m3fn"
    assert fp8["token_agreement_with_baseline"] >= 0.9
    assert every["prefix_caching"] and every["max_tokens_per_step"] == w.max_tokens_per_step
    assert every["prefill_tokens_saved"] >= w.prefix_tokens // w.page_size * w.page_size
    assert every["prefill_tokens"] < base["prefill_tokens"] and 0 < every["prefix_hit_rate"] < 1
    assert every["token_agreement_with_baseline"] == 1.0          # float32: chunks and cached pages change nothing


def test_feature_latencies_follow_the_step_clock():
    """Time to first token counts from the start of the arrival step; a bad configuration is named."""
    from attnkit.bench import serving
    from attnkit.serving.engine import Completion, ServeResult, StepRecord

    steps = [StepRecord(s, (), (), (), (), 0, 0, seconds=t) for s, t in [(0, 1.0), (1, 3.0), (5, 4.0), (6, 10.0)]]
    c = Completion(Request(0, "the", 3, arrival=2), [1], tokens=[1, 2, 3], first_token=5, finished=6)
    ttft, tpot = serving.request_latencies(ServeResult({0: c}, steps))
    assert ttft == [4.0 - 3.0] and tpot == [(10.0 - 4.0) / 2]
    with pytest.raises(ValueError, match="configs"):
        serving.run_features("cpu", configs={"x": {"page_size": 8}})
