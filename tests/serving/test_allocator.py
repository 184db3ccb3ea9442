"""The paged KV cache (attnkit.serving.allocator): free list, page tables, fork, copy-on-write, running out.

A model of the cache (each sequence's tokens as a plain list) is kept beside it; after every
operation the cache must give back exactly the model's tokens, and the page accounting must hold:
every page is either free or referenced, and its count equals the number of tables holding it.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit.kernels.paged import paged_decode, paged_decode_ref
from attnkit.serving.allocator import BlockAllocator, OutOfPagesError, PagedKVCache, PageTables
from attnkit.tolerances import rel_error, tolerance

HKV, D, LAYERS = 2, 16, 2


def tokens(gen, n):
    """K and V for n tokens in every layer: [LAYERS, n, HKV, D] each."""
    return (torch.randn(LAYERS, n, HKV, D, generator=gen), torch.randn(LAYERS, n, HKV, D, generator=gen))


def assert_consistent(cache: PageTables, model: dict | None = None):
    held = Counter(p for table in cache.tables.values() for p in table)
    alloc = cache.allocator
    for page in range(cache.num_pages):
        assert alloc.refcount(page) == held[page], f"page {page}"
    assert alloc.num_used == len(held) == cache.pages_in_use
    assert sorted(alloc.free_list) == sorted(set(range(cache.num_pages)) - set(held))
    for s, table in cache.tables.items():
        assert len(table) == -(-cache.lengths[s] // cache.page_size)
    if model is not None:
        assert set(model) == set(cache.tables)
        for s, (k, v) in model.items():
            for layer in range(LAYERS):
                got_k, got_v = cache.gather(s, layer)
                assert torch.equal(got_k, k[layer]) and torch.equal(got_v, v[layer])


# ------------------------------------------------------------------------------------- allocator
def test_allocator_free_list_and_refcounts():
    alloc = BlockAllocator(4)
    a = alloc.allocate(3)
    assert a == [0, 1, 2] and alloc.num_free == 1
    alloc.share([1])
    alloc.release(a)                     # 0 and 2 back; 1 still held once
    assert alloc.refcount(1) == 1 and alloc.num_free == 3
    with pytest.raises(OutOfPagesError, match="4 needed, 3 free of 4"):
        alloc.allocate(4)
    assert alloc.num_free == 3           # the failed request changed nothing
    alloc.release([1])
    assert alloc.num_free == 4
    with pytest.raises(ValueError, match="page 1 is already free"):
        alloc.release([1])
    with pytest.raises(ValueError, match="only pages in use can be shared"):
        alloc.share([0])
    with pytest.raises(ValueError, match=r"page: expected an integer in \[0, num_pages\)"):
        alloc.refcount(4)
    with pytest.raises(ValueError, match="num_pages"):
        BlockAllocator(0)


def test_allocator_rejects_duplicate_pages_and_changes_nothing():
    """release([p, p]) on a page held once would push its count to -1 and free it twice; share([p, p])
    would count one holder twice. Both are refused before any count changes."""
    alloc = BlockAllocator(4)
    alloc.allocate(2)                    # pages 0, 1, count 1 each
    state = (alloc.free_list, alloc.refcounts)
    with pytest.raises(ValueError, match="pages: page 0 is listed more than once; each page may appear once"):
        alloc.release([0, 0])
    assert (alloc.free_list, alloc.refcounts) == state
    with pytest.raises(ValueError, match="pages: page 1 is listed more than once"):
        alloc.release([0, 1, 1])         # page 0 is fine, but is not released either
    assert (alloc.free_list, alloc.refcounts) == state
    with pytest.raises(ValueError, match="pages: page 1 is listed more than once"):
        alloc.share([1, 1])
    assert (alloc.free_list, alloc.refcounts) == state
    with pytest.raises(ValueError, match="pages: page 2 is already free"):
        alloc.release([0, 2])            # a bad page anywhere: page 0 keeps its count
    assert (alloc.free_list, alloc.refcounts) == state
    alloc.release(p for p in (0, 1))     # any iterable of distinct pages is fine
    assert alloc.num_free == 4 and alloc.refcounts == (0, 0, 0, 0)


# ---------------------------------------------------------------------------------- page tables
def test_token_to_page_and_offset():
    tables = PageTables(num_pages=8, page_size=4)
    tables.add_sequence("a")
    tables.add_sequence("b")
    tables.reserve("a", 3)
    tables.reserve("b", 6)
    slots = tables.reserve("a", 3)                         # tokens 3, 4, 5 of "a"
    assert tables.pages_of("a") == [0, 3] and tables.pages_of("b") == [1, 2]
    assert slots.pages.tolist() == [0, 3, 3] and slots.offsets.tolist() == [3, 0, 1]
    assert tables.slot("b", 5) == (2, 1)
    assert tables.block_table(["a", "b"]).tolist() == [[0, 3], [1, 2]]
    assert tables.block_table(["a"], width=4).tolist() == [[0, 3, 0, 0]]
    assert tables.block_table(["a"]).dtype == torch.int32
    assert tables.seq_lens(["b", "a"]).tolist() == [6, 6] and tables.seq_lens(["a"]).dtype == torch.int32
    tables.free("a")
    assert tables.pages_in_use == 2 and tables.num_free_pages == 6
    assert_consistent(tables)


def test_bad_arguments():
    tables = PageTables(num_pages=2, page_size=4)
    tables.add_sequence(0)
    with pytest.raises(ValueError, match="seq_id: sequence 0 already exists"):
        tables.add_sequence(0)
    with pytest.raises(ValueError, match="seq_id: no sequence 9"):
        tables.reserve(9, 1)
    with pytest.raises(ValueError, match="n_tokens: expected a non-negative integer"):
        tables.reserve(0, -1)
    with pytest.raises(ValueError, match="dst: sequence 0 already exists"):
        tables.fork(0, 0)
    with pytest.raises(ValueError, match="seq_ids: expected at least one"):
        tables.block_table([])
    tables.reserve(0, 1)
    with pytest.raises(ValueError, match="width: 0 is less than"):
        tables.block_table([0], width=0)
    with pytest.raises(ValueError, match="position: 5 is outside"):
        tables.slot(0, 5)
    with pytest.raises(ValueError, match="page_size"):
        PageTables(4, 0)
    cache = PagedKVCache(4, 4, LAYERS, HKV, D, dtype=torch.float32)
    cache.add_sequence(0)
    with pytest.raises(ValueError, match=r"k: expected shape \[num_layers=2, n, Hkv, D\]"):
        cache.append(0, torch.zeros(1, 3, HKV, D), torch.zeros(1, 3, HKV, D))
    with pytest.raises(ValueError, match=r"k: expected \[.., Hkv, D\]"):
        cache.append(0, torch.zeros(LAYERS, 3, HKV, 8), torch.zeros(LAYERS, 3, HKV, 8))
    slots = cache.reserve(0, 2)
    with pytest.raises(ValueError, match=r"k: expected shape \[n, Hkv, D\] = \[2, 2, 16\]"):
        cache.write(0, slots, torch.zeros(3, HKV, D), torch.zeros(3, HKV, D))
    with pytest.raises(ValueError, match="layer: expected an integer in"):
        cache.write(2, slots, torch.zeros(2, HKV, D), torch.zeros(2, HKV, D))


def test_out_of_pages_changes_nothing():
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVCache(num_pages=5, page_size=4, num_layers=LAYERS, num_kv_heads=HKV, head_dim=D,
                         dtype=torch.float32)
    model = {}
    for s, n in ((0, 6), (1, 9)):                          # 2 + 3 pages: the pool is full
        cache.add_sequence(s)
        model[s] = tokens(gen, n)
        cache.append(s, *model[s])
    before = (cache.k.clone(), cache.v.clone(), {s: list(t) for s, t in cache.tables.items()})
    with pytest.raises(OutOfPagesError, match="out of pages: 1 needed, 0 free of 5"):
        cache.append(0, *tokens(gen, 3))                   # 6 + 3 > 8: a third page
    with pytest.raises(OutOfPagesError, match="2 needed for 2 sequences, 0 free"):
        cache.reserve_many([0, 1], 4)                      # both need a page; neither may get one
    cache.append(0, *tokens(gen, 0))                       # nothing to add: fine
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])
    assert cache.tables == before[2] and cache.seq_lens([0, 1]).tolist() == [6, 9]
    assert_consistent(cache, model)
    # a fork whose first append needs a copy of the shared last page also runs out cleanly
    cache.fork(0, 2)
    model[2] = model[0]
    with pytest.raises(OutOfPagesError):
        cache.append(2, *tokens(gen, 1))
    assert_consistent(cache, model)
    cache.free(1)
    new = tokens(gen, 1)
    cache.append(2, *new)                                  # now there is room: copy-on-write
    model[2] = tuple(torch.cat([m, x], dim=1) for m, x in zip(model[0], new))
    assert_consistent(cache, {s: model[s] for s in (0, 2)})


def test_reserve_many_rejects_duplicate_ids_and_changes_nothing():
    """reserve_many(["a", "a"], 1) would plan each "a" from the same length (0 pages for 3 -> 4 tokens),
    then grow "a" twice and run out half way. Duplicate ids are refused before anything changes."""
    tables = PageTables(num_pages=2, page_size=4)
    tables.add_sequence("a")
    tables.add_sequence("b")
    tables.reserve("a", 3)
    tables.reserve("b", 4)                                 # no free page left

    def state():
        return ({s: list(t) for s, t in tables.tables.items()}, dict(tables.lengths),
                tables.allocator.free_list, tables.allocator.refcounts)

    before = state()
    with pytest.raises(ValueError, match="seq_ids: sequence 'a' is listed more than once; each id may appear once"):
        tables.reserve_many(["a", "a"], 1)
    assert state() == before and tables.length("a") == 3
    with pytest.raises(ValueError, match="seq_ids: sequence 'a' is listed more than once"):
        tables.reserve_many(["a", "b", "a"], 0)
    assert state() == before
    with pytest.raises(ValueError, match="seq_id: no sequence 'c'"):
        tables.reserve_many(["a", "c"], 1)                 # a bad id after a good one: "a" not grown
    assert state() == before
    with pytest.raises(OutOfPagesError, match="1 needed for 2 sequences, 0 free"):
        tables.reserve_many(["a", "b"], 1)                 # "a" fits in its page, "b" needs one
    assert state() == before
    slots = tables.reserve_many(["a"], 1)
    assert slots.pages.tolist() == [0] and slots.offsets.tolist() == [3] and tables.length("a") == 4
    assert_consistent(tables)


def test_fork_shares_pages_and_copies_on_write():
    gen = torch.Generator().manual_seed(1)
    cache = PagedKVCache(num_pages=10, page_size=4, num_layers=LAYERS, num_kv_heads=HKV, head_dim=D,
                         dtype=torch.float32)
    cache.add_sequence("prompt")
    prefix = tokens(gen, 10)                               # pages: full, full, half
    cache.append("prompt", *prefix)
    cache.fork("prompt", "a")
    cache.fork("prompt", "b")
    assert cache.pages_in_use == 3                         # three sequences, three pages
    assert [cache.allocator.refcount(p) for p in cache.pages_of("a")] == [3, 3, 3]
    assert cache.pages_needed("a", 1) == 1                 # the shared half page is copied first
    extra_a, extra_b = tokens(gen, 3), tokens(gen, 5)
    cache.append("a", *extra_a)
    cache.append("b", *extra_b)
    pa, pb, pp = cache.pages_of("a"), cache.pages_of("b"), cache.pages_of("prompt")
    assert pa[:2] == pb[:2] == pp[:2]                       # full prefix pages still shared
    assert len({pa[2], pb[2], pp[2]}) == 3                  # the half page: one copy each
    model = {"prompt": prefix,
             "a": tuple(torch.cat(x, dim=1) for x in zip(prefix, extra_a)),
             "b": tuple(torch.cat(x, dim=1) for x in zip(prefix, extra_b))}
    assert_consistent(cache, model)
    cache.free("prompt")
    assert_consistent(cache, {s: model[s] for s in ("a", "b")})
    cache.free("a")
    cache.free("b")
    assert cache.pages_in_use == 0 and cache.num_free_pages == 10


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "append", "append", "fork", "free"]),
                              st.integers(0, 5), st.integers(0, 7)), min_size=5, max_size=30),
       seed=st.integers(0, 2 ** 31 - 1))
def test_property_random_operations(ops, seed):
    """Any sequence of adds, appends, forks and frees keeps every sequence's tokens and the counts
    right, including when pages run out."""
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(num_pages=6, page_size=3, num_layers=LAYERS, num_kv_heads=HKV, head_dim=D,
                         dtype=torch.float32)
    model, next_id = {}, 0
    for op, pick, n in ops:
        ids = sorted(model)
        if op == "add" or not ids:
            cache.add_sequence(next_id)
            model[next_id] = tokens(gen, 0)
            next_id += 1
            continue
        s = ids[pick % len(ids)]
        if op == "append":
            new = tokens(gen, n)
            try:
                cache.append(s, *new)
            except OutOfPagesError:
                pass
            else:
                model[s] = tuple(torch.cat(x, dim=1) for x in zip(model[s], new))
        elif op == "fork":
            cache.fork(s, next_id)
            model[next_id] = model[s]
            next_id += 1
        elif op == "free":
            cache.free(s)
            del model[s]
        assert_consistent(cache, model)


def test_cache_feeds_paged_decode():
    """block_table / seq_lens / k[layer] of the cache are what paged_decode reads, after forks too."""
    gen = torch.Generator().manual_seed(2)
    cache = PagedKVCache(num_pages=12, page_size=4, num_layers=LAYERS, num_kv_heads=HKV, head_dim=D,
                         dtype=torch.float16)
    for s, n in ((0, 7), (1, 13)):
        cache.add_sequence(s)
        cache.append(s, *tokens(gen, n))
    cache.fork(1, 2)
    cache.append(2, *tokens(gen, 2))
    slots = cache.reserve_many([0, 1, 2], 1)             # one decode step for three sequences
    for layer in range(LAYERS):
        k_new, v_new = (torch.randn(3, HKV, D, generator=gen) for _ in range(2))
        cache.write(layer, slots, k_new, v_new)
    ids = [0, 1, 2]
    q = torch.randn(3, 4, D, generator=gen).half()
    for layer in range(LAYERS):
        args = (q, cache.k[layer], cache.v[layer], cache.block_table(ids), cache.seq_lens(ids))
        o = paged_decode(*args)
        assert rel_error(o, paged_decode_ref(*args)) <= tolerance(torch.float16)
        k0, _ = cache.gather(2, layer)
        assert k0.shape == (16, HKV, D)


# ------------------------------------------------------------------------------------ hostile input
def _cache_with_evictable_pages():
    """4 pages, page size 2: sequence "old" of 4 tokens registered in a PrefixCache, then freed: its two
    pages stay cached and evictable; two pages are free."""
    from attnkit.serving.allocator import PrefixCache

    tables = PageTables(num_pages=4, page_size=2)
    prefix = PrefixCache(tables)
    tables.add_sequence("old")
    tables.reserve("old", 4)
    prefix.register("old", [5, 6, 7, 8])
    tables.free("old")
    assert (tables.num_free_pages, prefix.num_cached, prefix.num_evictable) == (2, 2, 2)
    return tables, prefix


@pytest.mark.parametrize("op", ["reserve", "reserve_many"])
def test_a_reserve_that_runs_out_evicts_nothing(op):
    """OutOfPagesError comes before anything changes: the prefix cache keeps its evictable pages."""
    tables, prefix = _cache_with_evictable_pages()
    tables.add_sequence("new")
    tables.add_sequence("other")
    before = (dict(prefix.page_of), tables.allocator.free_list, tables.allocator.refcounts)
    with pytest.raises(OutOfPagesError, match="out of pages: [56] needed.*2 free and 2 evictable of 4"):
        if op == "reserve":
            tables.reserve("new", 10)                          # 5 pages: more than 2 free + 2 evictable
        else:
            tables.reserve_many(["new", "other"], 5)           # 3 + 3 pages
    assert (dict(prefix.page_of), tables.allocator.free_list, tables.allocator.refcounts) == before
    assert tables.length("new") == 0
    assert prefix.match("new", [5, 6, 7, 8, 9]) == 4           # the cached prefix is still there
    tables.reserve("other", 4)                                 # 2 pages: evicts nothing still held


@pytest.mark.parametrize("ids, message", [
    ([5, 6, 7.0, 8], r"token_ids\[2\] = 7.0"),                 # a float would be truncated: a collision
    ([5, 6, 7.9, 8], r"token_ids\[2\] = 7.9"),
    ([5, 2 ** 31, 7, 8], r"token_ids\[1\] = 2147483648"),
    ([5, -1, 7, 8], r"token_ids\[1\] = -1"),
    ([True, 6, 7, 8], r"token_ids\[0\] = True"),
])
def test_prefix_cache_refuses_token_ids_that_are_not_int32(ids, message):
    tables, prefix = _cache_with_evictable_pages()
    tables.add_sequence("new")
    for call in (lambda: prefix.match("new", ids), lambda: prefix.page_keys(ids)):
        with pytest.raises(ValueError, match=message + r"; each token id must be an integer in \[0, 2\*\*31\)"):
            call()
    assert tables.length("new") == 0 and prefix.lookup_tokens == 0


def test_prefix_cache_takes_numpy_and_tensor_token_ids_as_ints():
    import numpy as np

    tables, prefix = _cache_with_evictable_pages()
    keys = prefix.page_keys([5, 6, 7, 8])
    assert prefix.page_keys(np.array([5, 6, 7, 8])) == keys
    assert prefix.page_keys(torch.tensor([5, 6, 7, 8])) == keys
    tables.add_sequence("new")
    assert prefix.match("new", np.array([5, 6, 7, 8, 1], dtype=np.int64)) == 4


def test_a_second_prefix_cache_on_the_same_tables_is_refused():
    """A second cache would take over eviction and strand the first one's pages (never released)."""
    from attnkit.serving.allocator import PrefixCache

    tables, prefix = _cache_with_evictable_pages()
    with pytest.raises(ValueError, match="tables: already have a PrefixCache"):
        PrefixCache(tables)
    assert tables.prefix_cache is prefix


def test_numpy_integers_are_taken_as_page_ids_layers_and_sizes():
    import numpy as np

    alloc = BlockAllocator(np.int64(4))
    pages = alloc.allocate(np.int32(2))
    alloc.share([np.int64(p) for p in pages])
    assert alloc.refcount(np.int16(pages[0])) == 2
    alloc.release(np.array(pages))
    alloc.release([pages[0], np.int64(pages[1])])
    assert alloc.num_free == 4 and all(type(p) is int for p in alloc.free_list)
    cache = PagedKVCache(num_pages=np.int64(3), page_size=np.int64(2), num_layers=np.int64(LAYERS),
                         num_kv_heads=HKV, head_dim=D, dtype=torch.float32)
    cache.add_sequence(0)
    slots = cache.reserve(0, np.int64(3))
    k, v = tokens(torch.Generator().manual_seed(1), 3)
    cache.write(np.int64(1), slots, k[1], v[1])
    assert torch.equal(cache.gather(0, 1)[0], k[1])
    for bad in (1.0, True, 2.5):
        with pytest.raises(ValueError, match="page: expected an integer"):
            alloc.refcount(bad)
