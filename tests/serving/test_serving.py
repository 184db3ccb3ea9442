"""Lesson 9's serving engine: greedy tokens equal the plain no-cache forward pass, and the scheduler
batches continuously (interleaves prefill and decode, frees pages at once, reuses them)."""
import random

import pytest
import torch

from attnkit.reference.attention import attention_ref
from attnkit.serving.engine import (
    Backend,
    Engine,
    Request,
    compare_with_no_cache,
    kernel_backend,
    kv_memory,
    paged_decode_torch,
    torch_backend,
)
from attnkit.serving.tinymodel import CORPUS_PATH, load_model, tiny_model
from attnkit.tolerances import assert_close


@pytest.fixture(autouse=True)
def one_thread():
    """The model is tiny: one thread avoids the cost of sharing two busy cores."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def workload(seed: int, n_requests: int = 4, max_new: int = 14) -> list[Request]:
    """Prompts cut from corpus lines at random, mixed output limits and arrival steps."""
    rng = random.Random(seed)
    lines = CORPUS_PATH.read_text().splitlines()
    requests = []
    for rid in range(n_requests):
        line = rng.choice(lines)
        prompt = line[:rng.randint(3, min(30, len(line)))]
        requests.append(Request(rid, prompt, rng.randint(4, max_new), arrival=rng.randint(0, 4)))
    return requests


# ----------------------------------------------------------------------------------- exact tokens
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_served_tokens_equal_the_no_cache_forward_pass(seed):
    """flash_attention prefill + paged_decode over the paged cache, against recomputing everything."""
    model = tiny_model()
    engine = Engine(model, num_pages=8, page_size=8, max_batch=3, backend=kernel_backend())
    result = engine.run(workload(seed))
    check = compare_with_no_cache(model, result)
    assert check.all_equal, f"tokens differ for requests {[r for r, ok in check.equal.items() if not ok]}"
    assert len(check.equal) == 4
    assert_close(torch.cat(check.served_logits), torch.cat(check.reference_logits), torch.float32,
                 what="served logits")
    assert check.max_logit_diff < check.min_margin / 2, "a near-tie: equality would be luck"


@pytest.mark.gpu
def test_served_tokens_on_the_gpu_equal_the_no_cache_forward_pass():
    """Compiled kernels on CUDA tensors, against the plain forward pass on the GPU.

    Tokens only: paged_decode computes fp32 scores with tf32 products on a GPU, which puts about 1e-3
    of relative error into the logits (8.8e-4 seen on an H100), above the float32 bound.
    """
    model = load_model().to("cuda")
    engine = Engine(model, num_pages=8, page_size=8, max_batch=3)
    check = compare_with_no_cache(model, engine.run(workload(0)))
    assert check.all_equal, check.equal


@pytest.mark.parametrize("seed", range(10, 16))
def test_torch_served_tokens_equal_the_no_cache_forward_pass(seed):
    model = tiny_model()
    engine = Engine(model, num_pages=16, page_size=4, max_batch=4, backend=torch_backend())
    check = compare_with_no_cache(model, engine.run(workload(seed, n_requests=6, max_new=30)))
    assert check.all_equal
    assert_close(torch.cat(check.served_logits), torch.cat(check.reference_logits), torch.float32)


def test_a_wrong_cache_is_caught():
    """The check can fail: a decode that attends to one token too few changes the tokens."""
    model = tiny_model()
    plain = torch_backend()

    def decode_missing_last(q, k_pages, v_pages, block_table, seq_lens):
        return paged_decode_torch(q, k_pages, v_pages, block_table, (seq_lens - 1).clamp_min(1))

    engine = Engine(model, num_pages=12, page_size=4, max_batch=4,
                    backend=Backend("broken", plain.prefill, decode_missing_last))
    check = compare_with_no_cache(model, engine.run(workload(3)))
    assert not check.all_equal


# ------------------------------------------------------------------------------------- scheduling
def _run(seed=4, **kw):
    model = tiny_model()
    engine = Engine(model, **{"num_pages": 14, "page_size": 4, "max_batch": 3, "backend": torch_backend(), **kw})
    requests = [Request(i, p, n, arrival=a) for i, (p, n, a) in enumerate([
        ("the kernel", 12, 0), ("the gpu", 20, 0), ("online softmax", 6, 1), ("the decoder", 16, 2),
        ("paged attention", 10, 2), ("a new request", 8, 5)])]
    return engine, requests, engine.run(requests)


def test_every_request_is_prefilled_then_decoded_every_step_until_it_finishes_or_is_preempted():
    engine, requests, result = _run()
    assert sorted(result.completions) == [r.rid for r in requests]
    preempted = {rid for s in result.steps for rid in s.preempted}
    assert preempted and preempted != set(result.completions), "the workload should preempt some requests"
    for rid, c in result.completions.items():
        prefills = [s.step for s in result.steps if rid in s.prefill]
        decodes = [s.step for s in result.steps if rid in s.decode]
        assert prefills[0] == c.admitted >= c.request.arrival
        assert len(prefills) >= 1 + c.preemptions                  # a prefill per admission, in chunks when pages lack
        assert c.preemptions == sum(rid in s.preempted for s in result.steps)
        if not c.preemptions:
            assert decodes == list(range(c.admitted + 1, c.finished + 1))
        # a token per decode, and one per prefill that reached the end of the context before a preemption
        assert 1 <= len(c.tokens) - len(decodes) <= 1 + c.preemptions
        assert c.finish_reason == ("stop" if c.tokens[-1] == engine.stop_token else "length")
        assert c.finish_reason == "stop" or len(c.tokens) == c.request.max_new_tokens


@pytest.mark.parametrize("seed", range(20, 26))
@pytest.mark.parametrize("num_pages, budget", [(13, None), (13, 6), (30, 4)])
def test_preemption_and_chunked_prefill_keep_the_tokens_exact(seed, num_pages, budget):
    """A pool too small for every request at once, prompts cut into chunks: the same tokens."""
    model = tiny_model()
    engine = Engine(model, num_pages=num_pages, page_size=4, max_batch=4, backend=torch_backend())
    result = engine.run(workload(seed, n_requests=6, max_new=20), max_tokens_per_step=budget)
    assert compare_with_no_cache(model, result).all_equal
    for s in result.steps:
        assert len(s.decode) + s.prefill_tokens <= (budget or 10 ** 9)
        assert s.pages_in_use <= num_pages
    assert engine.cache.pages_in_use == 0


def test_kernels_with_preemption_and_chunks_keep_the_tokens_exact():
    """flash_attention on a chunk after a cached prefix (causal aligned to the end) and paged_decode."""
    model = tiny_model()
    engine = Engine(model, num_pages=11, page_size=4, max_batch=3, backend=kernel_backend())
    result = engine.run(workload(10, n_requests=4, max_new=12), max_tokens_per_step=5)
    assert sum(len(s.preempted) for s in result.steps) > 0 and max(s.prefill_tokens for s in result.steps) <= 5
    assert compare_with_no_cache(model, result).all_equal


def shared_prompt_workload(n_requests: int = 6) -> list[Request]:
    """A system prompt of 20 characters shared by every request, then each request's own words."""
    system = "the kernel reads the"
    tails = [" tile", " page", " cache", " queue", " gpu", " scheduler", " block", " token"]
    return [Request(i, system + tails[i % len(tails)], 6, arrival=i) for i in range(n_requests)]


@pytest.mark.parametrize("num_pages, budget", [(40, None), (12, 6)])
def test_prefix_caching_reuses_shared_pages_and_keeps_the_tokens_exact(num_pages, budget):
    model = tiny_model()
    plain = Engine(model, num_pages=num_pages, page_size=4, max_batch=3, backend=torch_backend())
    cached = Engine(model, num_pages=num_pages, page_size=4, max_batch=3, backend=torch_backend(),
                    prefix_caching=True)
    requests = shared_prompt_workload()
    without = plain.run(requests, max_tokens_per_step=budget)
    with_cache = cached.run(requests, max_tokens_per_step=budget)
    assert compare_with_no_cache(model, with_cache).all_equal
    assert {r: c.tokens for r, c in with_cache.completions.items()} == \
           {r: c.tokens for r, c in without.completions.items()}
    reused = sum(c.reused for c in with_cache.completions.values())
    assert reused >= 16 * (len(requests) - 3)              # 4 full pages of the system prompt, most requests
    prefilled = [sum(s.prefill_tokens for s in r.steps) for r in (without, with_cache)]
    assert prefilled[1] == prefilled[0] - reused
    assert cached.prefix.hit_tokens == reused and cached.prefix.lookup_tokens > reused
    for s in with_cache.steps:
        assert s.pages_in_use <= num_pages


def test_prefix_cache_evicts_least_recently_used_pages_no_sequence_holds():
    from attnkit.serving.allocator import PageTables, PrefixCache

    tables = PageTables(num_pages=4, page_size=2)
    cache = PrefixCache(tables)
    for seq, tokens in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])):
        tables.add_sequence(seq)
        tables.reserve(seq, 4)
        cache.register(seq, tokens)
        tables.free(seq)
    assert tables.num_free_pages == 0 and cache.num_evictable == 4 and tables.num_available_pages == 4
    tables.add_sequence("c")
    assert cache.match("c", [1, 2, 3, 4, 9]) == 4          # a's two pages, now most recently used
    tables.reserve("c", 3)                                  # two fresh pages: b's pages are evicted
    assert cache.num_cached == 2 and set(tables.pages_of("c")[:2]) == set(cache.page_of.values())
    with pytest.raises(ValueError, match="token_ids"):
        cache.register("c", [1, 2])


def test_an_idle_engine_jumps_to_the_next_arrival():
    engine = Engine(tiny_model(), num_pages=8, page_size=4, backend=torch_backend())
    result = engine.run([Request(0, "the", 3), Request(1, "a", 3, arrival=10 ** 6)])
    assert len(result.steps) <= 8
    assert result.completions[1].admitted == 10 ** 6


def test_batch_and_pages_stay_within_limits_and_are_all_freed():
    engine, _, result = _run()
    for s in result.steps:
        assert len(s.prefill) + len(s.decode) <= engine.max_batch
        assert s.pages_in_use <= engine.cache.num_pages
        assert s.pages_in_use * engine.page_size >= s.tokens_cached
    assert engine.cache.pages_in_use == 0 and engine.cache.num_free_pages == engine.cache.num_pages


def test_prefill_and_decode_interleave_and_freed_pages_are_reused_at_once():
    _, _, result = _run()
    assert any(s.prefill and s.decode for s in result.steps)
    assert any(s.waiting for s in result.steps), "the workload should make some request wait"
    reused = False
    for c in result.completions.values():
        for later in result.completions.values():
            if later.admitted > c.finished and set(later.pages) & set(c.pages):
                reused = True
    assert reused
    # A request that waited, and was never preempted, was admitted right after pages or a slot came free.
    for c in result.completions.values():
        if c.admitted > c.request.arrival and not c.preemptions:
            assert any(s.finished or s.preempted for s in result.steps if s.step == c.admitted - 1)


def test_kv_memory_counts_pages_against_a_contiguous_cache():
    engine, _, result = _run()
    mem = kv_memory(engine, result)
    per_token = 2 * 2 * 2 * 16 * 4                      # K and V · layers · Hkv · D · fp32 bytes
    assert mem["bytes_per_token"] == per_token
    assert mem["contiguous_bytes"] == 3 * 128 * per_token
    assert mem["peak_pages"] == max(s.pages_in_use for s in result.steps) <= 14
    assert mem["peak_bytes"] == mem["peak_pages"] * 4 * per_token < mem["contiguous_bytes"]


def test_paged_decode_torch_matches_the_float64_reference():
    gen = torch.Generator().manual_seed(0)
    k_pages, v_pages = (torch.randn(9, 4, 2, 16, generator=gen) for _ in range(2))
    q = torch.randn(2, 4, 16, generator=gen)
    table = torch.tensor([[3, 7, 1], [8, 0, 0]], dtype=torch.int32)
    lens = torch.tensor([10, 3], dtype=torch.int32)
    out = paged_decode_torch(q, k_pages, v_pages, table, lens)
    for b in range(2):
        k = k_pages[table[b].long()].reshape(-1, 2, 16)[:lens[b]].transpose(0, 1)[None]   # [1, Hkv, L, D]
        v = v_pages[table[b].long()].reshape(-1, 2, 16)[:lens[b]].transpose(0, 1)[None]
        assert_close(out[b], attention_ref(q[b][None, :, None], k, v)[0, :, 0], torch.float32)


# --------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("requests, rule", [
    ([Request(0, "", 5)], r"requests\[0\]\.prompt: expected a non-empty string"),
    ([Request(0, "the", 0)], r"requests\[0\]\.max_new_tokens: expected an integer >= 1"),
    ([Request(0, "the", "5")], r"requests\[0\]\.max_new_tokens: expected an integer >= 1, got '5'"),
    ([Request(0, "the", 5), Request(1, "a", 5, arrival=-1)], r"requests\[1\]\.arrival"),
    ([Request("a", "the", 5)], r"requests\[0\]\.rid"),
    ([Request(0, "the", 200)], "max_seq_len=128"),
    ([Request(0, "THE", 5)], "not in the model's vocabulary"),
    ([Request(0, "the", 5), Request(0, "a", 5)], "distinct"),
    ([Request(0, "the kernel reads each tile", 100)], "more than the cache's 8"),
    (["the kernel"], "expected Request objects"),
])
def test_bad_requests_are_named(requests, rule):
    engine = Engine(tiny_model(), num_pages=8, page_size=4, backend=torch_backend())
    with pytest.raises(ValueError, match=rule):
        engine.run(requests)


@pytest.mark.parametrize("budget", [0, 2, 4.5, True])
def test_a_step_budget_below_the_batch_is_refused(budget):
    engine = Engine(tiny_model(), num_pages=8, page_size=4, max_batch=3, backend=torch_backend())
    with pytest.raises(ValueError, match="max_tokens_per_step"):
        engine.run([Request(0, "the", 3)], max_tokens_per_step=budget)


@pytest.mark.parametrize("kw", [{"num_pages": 0}, {"page_size": -1}, {"max_batch": 1.5}])
def test_bad_engine_sizes_are_named(kw):
    with pytest.raises(ValueError, match=list(kw)[0]):
        Engine(tiny_model(), **{"num_pages": 8, **kw}, backend=torch_backend())


def test_an_fp8_cache_agrees_with_the_full_precision_cache():
    """float8_e4m3fn K and V (scales per layer and KV head), read through paged_extend: the greedy
    tokens agree with the model-precision cache's (all of them on this workload), in a quarter of the
    bytes of the float32 cache."""
    model = tiny_model()
    requests = workload(3, n_requests=4, max_new=20)
    full = Engine(model, num_pages=30, page_size=8, max_batch=4)
    fp8 = Engine(model, num_pages=30, page_size=8, max_batch=4, kv_dtype="fp8")
    a, b = full.run(requests, max_tokens_per_step=8), fp8.run(requests, max_tokens_per_step=8)
    pairs = [(x, y) for rid in a.completions for x, y in zip(a.completions[rid].tokens, b.completions[rid].tokens)]
    assert sum(x == y for x, y in pairs) == len(pairs) > 30
    assert fp8.cache.bytes_per_page * 4 == full.cache.bytes_per_page
    assert fp8.kv_scales.shape == (model.cfg.n_layers, 2, model.cfg.n_kv_heads) and bool((fp8.kv_scales > 0).all())


def test_fp8_needs_the_kernel_backend():
    with pytest.raises(ValueError, match="kv_dtype"):
        Engine(tiny_model(), num_pages=8, backend=torch_backend(), kv_dtype="fp8")
    with pytest.raises(ValueError, match="kv_dtype"):
        Engine(tiny_model(), num_pages=8, kv_dtype="int4")


def test_a_step_prefills_all_its_chunks_in_one_pass_per_layer():
    """First chunks of a step go together through flash_attention_varlen, later chunks together
    through paged_extend: one call of each kind per layer per step, and the tokens stay exact."""
    model = tiny_model()
    kernels = kernel_backend()
    calls = {"packed": [], "extend": []}

    def packed(q, k, v, cu):
        calls["packed"].append(len(cu) - 1)
        return kernels.prefill_packed(q, k, v, cu)

    def extend(q, k_pages, v_pages, table, lens, cu, **kw):
        calls["extend"].append(len(cu) - 1)
        return kernels.extend(q, k_pages, v_pages, table, lens, cu, **kw)

    counting = Backend("counting", kernels.prefill, kernels.decode, extend, packed)
    requests = [Request(i, p, 6, arrival=0) for i, p in enumerate(["the kernel", "a page", "the gpu"])]
    engine = Engine(model, num_pages=20, page_size=4, max_batch=3, backend=counting)
    result = engine.run(requests, max_tokens_per_step=14)
    assert compare_with_no_cache(model, result).all_equal
    layers = model.cfg.n_layers
    assert calls["packed"][:layers] == [2] * layers          # step 0: two prompts fit the budget, together
    assert calls["extend"] and all(n >= 1 for n in calls["extend"])
    first_steps = sum(1 for s in result.steps if s.prefill)
    assert len(calls["packed"]) + len(calls["extend"]) <= 2 * layers * first_steps


def test_a_request_without_room_for_its_first_chunk_is_not_admitted():
    """With prefix caching, a request whose matched pages leave no page for its first chunk goes back
    to the queue: it is never preempted before running, and its lookup is not counted as a hit."""
    from attnkit.serving.engine import Engine, Request, compare_with_no_cache, torch_backend
    from attnkit.serving.tinymodel import load_model

    model = load_model()
    system = "the scheduler admits a new request"
    tails = [" when pages are free", " and the kernel", " in one step", " of keys", " for each head", " once"]
    requests = [Request(i, system + tail, max_new_tokens=n, arrival=a)
                for i, (tail, n, a) in enumerate(zip(tails, (24, 20, 28, 16, 24, 20), (0, 0, 2, 3, 5, 6)))]
    engine = Engine(model, num_pages=14, page_size=8, max_batch=4, prefix_caching=True, backend=torch_backend())
    result = engine.run(requests, max_tokens_per_step=16)
    ran = set()
    for s in result.steps:
        for rid in s.preempted:
            assert rid in ran, f"request {rid} preempted at step {s.step} before it computed anything"
            ran.discard(rid)
        ran |= set(s.prefill) | set(s.decode)
    assert sum(c.reused for c in result.completions.values()) == engine.prefix.hit_tokens
    assert compare_with_no_cache(model, result).all_equal


def test_the_timeline_spans_the_scheduler_steps_and_marks_preemptions():
    """After an idle clock jump the steps are not 0..len-1: the x axis follows the step numbers, and
    every preemption of the run is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    from attnkit.serving.engine import Engine, Request, plot_timeline, torch_backend
    from attnkit.serving.tinymodel import load_model

    model = load_model()
    requests = [Request(0, "the kernel", max_new_tokens=4), Request(1, "a page", max_new_tokens=4, arrival=50)]
    result = Engine(model, num_pages=8, page_size=8, max_batch=2, backend=torch_backend()).run(requests)
    assert result.steps[-1].step >= 50 > len(result.steps)
    ax = plot_timeline(result)
    assert ax.get_xlim()[1] >= result.steps[-1].step
    preempting = [Request(i, "the scheduler admits a new request", max_new_tokens=20) for i in range(4)]
    busy = Engine(model, num_pages=10, page_size=8, max_batch=4, backend=torch_backend()).run(preempting)
    crosses = [line for line in plot_timeline(busy).lines if line.get_marker() == "x" and len(line.get_xdata())]
    assert len(crosses) == sum(len(s.preempted) for s in busy.steps) > 0


# ------------------------------------------------------------------------------------ hostile input
@pytest.mark.parametrize("stop", ["xy", "", 7])
def test_a_stop_that_is_not_one_token_is_refused(stop):
    """The model's tokens are characters: "xy" used to stop on "x" alone."""
    with pytest.raises(ValueError, match="stop: expected None or one character"):
        Engine(tiny_model(), num_pages=8, page_size=4, backend=torch_backend(), stop=stop)


def test_step_records_hold_a_snapshot_of_the_queue_not_a_copy():
    """A queue of thousands of waiting requests is logged once (one entry per time a request enters);
    each step's record keeps three references; its ``waiting`` reads back exactly what the queue held."""
    import random as rnd

    from attnkit.serving.engine import WaitingQueue, WaitingSnapshot

    class Item:
        def __init__(self, rid):
            self.request = Request(rid, "a", 1)

    rng = rnd.Random(0)
    queue, plain, snapshots, entered = WaitingQueue(), [], [], 0
    items = [Item(i) for i in range(3000)]
    for item in items:                                     # every request arrives at once
        queue.append(item)
        plain.append(item)
        entered += 1
    for _ in range(400):                                   # admissions, preemptions, snapshots
        op = rng.random()
        if op < 0.5 and plain:
            c = plain[rng.randrange(min(4, len(plain)))]
            queue.remove(c)
            plain.remove(c)
        elif op < 0.7:
            c = rng.choice([i for i in items[:50] if i not in plain] or [None])
            if c is not None:
                queue.insert_front(c)
                plain.insert(0, c)
                entered += 1
        snapshots.append((queue.snapshot(), tuple(i.request.rid for i in plain)))
    assert queue.entries == entered                      # not 400 copies of a 3,000-long queue
    for snap, expected in snapshots[::37]:
        assert isinstance(snap, WaitingSnapshot) and len(snap) == len(expected) and snap == expected
        assert tuple(snap) == expected and list(snap)[:3] == list(expected[:3])
    assert repr(snapshots[-1][0]) == repr(snapshots[-1][1])
    engine, _, result = _run()
    assert all(isinstance(s.waiting, WaitingSnapshot) for s in result.steps)
    assert any(len(s.waiting) for s in result.steps)
