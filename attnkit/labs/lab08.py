"""Checks for lab 08, paged attention.

    check_slots(token_slots)          exercise 1: token position -> (physical page, offset)
    check_pool(PagePool)              exercise 2: a page pool (free list, page tables, append, free)
    check_paged_decode(paged_decode)  exercise 3: the paged decode kernel (grouped query heads)
    check_merge(merge_splits)         exercise 4: merging split-KV partial results
    check_lab(...)                    all four, with a summary line

Every check uses fresh random inputs (the pool check runs one scripted workload first): page tables
are random permutations of the pool, lengths end inside a page, and the slots past each sequence's end
hold stale values from an earlier sequence (as in a real cache), so reading them changes the answer.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..classroom.checking import FAILED, PASSED, CheckResult, case, not_implemented, run_check, summarize, unwrapped
from ..device import runtime
from ..tolerances import tolerance

HINT_SLOTS = ("token t lives in page block_table[t // page_size] at offset t % page_size "
              "(the page id comes from the table; the offset is the position inside the page).")
HINT_POOL = ("append: a sequence of length n holds ceil(n / page_size) pages; take a new page from the "
             "free list only when position n is the first slot of a page; check that enough pages are "
             "free BEFORE changing anything; free: return every page of the sequence to the free list.")
HINT_DECODE = ("tokens of sequence b are 0 .. seq_lens[b]-1 only (mask the rest of the last page); "
               "token t is at page block_table[b, t // PAGE_SIZE], offset t % PAGE_SIZE; the query heads "
               "of KV head kv are kv·GROUP .. kv·GROUP+GROUP-1 (h // GROUP, not h % Hkv).")
HINT_MERGE = ("rescale each split to the common maximum M = max_s m_s: "
              "o = Σ_s e^(m_s − M)·z_s / Σ_s e^(m_s − M)·ℓ_s; a split with m = −inf has weight 0.")


def _seed(seed):
    return int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed


def _require_callable(name: str, fn) -> None:
    if not callable(fn):
        raise ValueError(f"{name}: expected your function (or class), got {type(fn).__name__}")


# ----------------------------------------------------------------------------- exercise 1: slots
def _reference_slots(block_table_row, seq_len, page_size):
    import torch

    t = torch.arange(seq_len)
    return torch.stack([block_table_row.long()[t // page_size], t % page_size])   # [2, seq_len]


def check_slots(token_slots: Callable, *, seed: int | None = None) -> CheckResult:
    """``token_slots(block_table_row, seq_len, page_size) -> (pages, offsets)``, int tensors [seq_len]."""
    import torch

    _require_callable("token_slots", token_slots)
    gen = torch.Generator().manual_seed(_seed(seed))
    cases = []
    for seq_len, page_size in ((11, 4), (1, 8), (16, 16), (23, 5)):
        pages = -(-seq_len // page_size)
        row = torch.randperm(40, generator=gen)[: pages + 1].int()
        cases.append(case(row, seq_len, page_size, label=f"seq_len={seq_len}, page_size={page_size}, "
                                                         f"block_table_row={row.tolist()}"))

    def student(row, seq_len, page_size):
        got = token_slots(row, seq_len, page_size)
        if got is None:
            return None
        pages, offsets = got
        return torch.stack([torch.as_tensor(pages).long(), torch.as_tensor(offsets).long()])

    return run_check("token → (page, offset)", student, _reference_slots, cases, tol=0.0, hint=HINT_SLOTS,
                     compare=lambda got, exp: got.shape == exp.shape and bool(torch.equal(got, exp)))


# ------------------------------------------------------------------------------ exercise 2: pool
class _Fail(Exception):
    pass


def _pool_state(pool, model: dict, page_size: int, num_pages: int) -> None:
    """Raise _Fail unless the pool holds exactly the model's tokens in distinct, consistent slots."""
    seen = {}
    for seq, slots in model.items():
        table = pool.tables.get(seq)
        if table is None:
            raise _Fail(f"sequence {seq} has no page table")
        want_pages = -(-len(slots) // page_size)
        if len(table) != want_pages:
            raise _Fail(f"sequence {seq} holds {len(slots)} tokens in {len(table)} pages; "
                        f"expected ceil({len(slots)} / {page_size}) = {want_pages}")
        for pos, slot in enumerate(slots):
            expected = (table[pos // page_size], pos % page_size)
            if tuple(slot) != expected:
                raise _Fail(f"sequence {seq}, token {pos}: append returned slot {tuple(slot)}, but its page "
                            f"table puts it at {expected}")
            if slot in seen:
                raise _Fail(f"slot {tuple(slot)} holds token {pos} of sequence {seq} and token "
                            f"{seen[slot][1]} of sequence {seen[slot][0]}")
            seen[slot] = (seq, pos)
    in_tables = [p for seq in model for p in pool.tables[seq]]
    if len(set(in_tables)) != len(in_tables):
        raise _Fail("a page appears in two page tables (or twice in one)")
    if any(not 0 <= p < num_pages for p in in_tables):
        raise _Fail("a page table holds a page id outside [0, num_pages)")
    free = list(pool.free)
    if set(free) & set(in_tables):
        raise _Fail("a page is both in the free list and in a page table")
    if len(free) + len(in_tables) != num_pages:
        raise _Fail(f"{num_pages - len(free) - len(in_tables)} pages are neither free nor in a page table "
                    "(a leak: were the pages of a freed sequence returned?)")


def _snapshot(pool) -> tuple:
    return sorted(pool.free), {s: list(t) for s, t in pool.tables.items()}


def _pool_append(pool, model: dict, seq, n: int, page_size: int, num_pages: int) -> tuple[str | None, bool]:
    """``pool.append(seq, n)`` judged against the model: (what went wrong or None, whether it ran out).

    A request needing more pages than are free must raise RuntimeError (or MemoryError) and leave the
    pool as it was; any other request must succeed and return the (page, offset) of each new token.
    """
    held = -(-len(model[seq]) // page_size)
    need = -(-(len(model[seq]) + n) // page_size) - held
    free = num_pages - sum(-(-len(slots) // page_size) for slots in model.values())
    before = _snapshot(pool)
    if need > free:
        try:
            pool.append(seq, n)
        except NotImplementedError:                  # a blank (a RuntimeError too)
            raise
        except (RuntimeError, MemoryError):
            if _snapshot(pool) != before:
                return (f"out of pages ({need} needed, {free} free): raised an error but changed the pool "
                        f"first (free list or page tables differ from before the call)"), True
            return None, True
        return (f"needs {need} pages but only {free} are free; expected a RuntimeError (or MemoryError) "
                "and no change"), True
    try:
        slots = pool.append(seq, n)
    except NotImplementedError:
        raise
    except (RuntimeError, MemoryError) as exc:
        return (f"needs {need} new page{'s' if need != 1 else ''} and {free} are free, so it must succeed, "
                f"but it raised {type(exc).__name__}: {exc}"), False
    if slots is None:
        return "returned None (return the (page, offset) of each new token)", False
    slots = [tuple(int(x) for x in s) for s in slots]
    if len(slots) != n:
        return f"returned {len(slots)} slots for {n} tokens", False
    model[seq] = model[seq] + slots
    return None, False


def _run_pool_scenario(PagePool, gen, num_pages: int, page_size: int, steps: int) -> str | None:
    """Random adds, appends and frees; returns what went wrong, or None."""
    pool = PagePool(num_pages, page_size)
    model: dict = {}
    next_id = 0
    for step in range(steps):
        r = gen.random()
        if r < 0.2 or not model:
            pool.add(next_id)
            model[next_id] = []
            what = f"add({next_id})"
            next_id += 1
        elif r < 0.8:
            seq = sorted(model)[gen.integers(len(model))]
            n = int(gen.integers(1, 2 * page_size + 2))
            what = f"append({seq}, {n})"
            problem, _ = _pool_append(pool, model, seq, n, page_size, num_pages)
            if problem:
                return f"step {step}, {what}: {problem}"
        else:
            seq = sorted(model)[gen.integers(len(model))]
            pool.free_sequence(seq)
            del model[seq]
            what = f"free_sequence({seq})"
        try:
            _pool_state(pool, model, page_size, num_pages)
        except _Fail as fail:
            return f"step {step}, after {what}: {fail}"
    return None


# The scripted workload (8 pages of 4 slots): it runs out of pages while some are still free (so a pool
# that takes the pages it can before failing is caught), fills a partly used last page, takes the last
# free pages exactly, appends into a partly filled page with none free, runs out with none free, and
# frees a sequence. (operation, sequence, tokens)
SCRIPTED_POOL = (8, 4, (("add", 0, 0), ("append", 0, 5),      # seq 0: 2 pages; 6 free
                        ("add", 1, 0), ("append", 1, 9),      # seq 1: 3 pages; 3 free
                        ("append", 0, 19),                    # needs 4 more pages, 3 free: out of pages
                        ("append", 0, 3),                     # fills seq 0's second page: no new page
                        ("append", 0, 12),                    # takes the last 3 pages
                        ("append", 1, 3),                     # fills seq 1's third page with 0 free
                        ("append", 1, 1),                     # needs 1 page, none free: out of pages
                        ("free", 0, 0),                       # 5 pages back
                        ("append", 1, 1)))                    # a new page for seq 1


def _run_scripted_pool(PagePool) -> str | None:
    """The scripted workload; returns what went wrong, or None."""
    num_pages, page_size, ops = SCRIPTED_POOL
    pool = PagePool(num_pages, page_size)
    model: dict = {}
    for step, (op, seq, n) in enumerate(ops):
        if op == "add":
            pool.add(seq)
            model[seq] = []
            what = f"add({seq})"
        elif op == "free":
            pool.free_sequence(seq)
            del model[seq]
            what = f"free_sequence({seq})"
        else:
            what = f"append({seq}, {n})"
            problem, _ = _pool_append(pool, model, seq, n, page_size, num_pages)
            if problem:
                return f"step {step}, {what}: {problem}"
        try:
            _pool_state(pool, model, page_size, num_pages)
        except _Fail as fail:
            return f"step {step}, after {what}: {fail}"
    return None


def check_pool(PagePool, *, seed: int | None = None) -> CheckResult:
    """Exercise 2: a scripted workload that runs out of pages while some are free, then random workloads
    of add / append / free_sequence."""
    _require_callable("PagePool", PagePool)
    name = "page pool (append, free, out of pages)"
    gen = np.random.default_rng(_seed(seed))
    num_pages, page_size, _ = SCRIPTED_POOL
    scenarios = [(f"the scripted workload (num_pages={num_pages}, page_size={page_size}, it runs out of "
                  "pages while some are free)", lambda: _run_scripted_pool(PagePool))]
    random_sizes = ((12, 4, 60), (6, 3, 60), (20, 8, 80))
    for index, (pages, size, steps) in enumerate(random_sizes, start=1):
        scenarios.append((f"random workload {index} of {len(random_sizes)} (num_pages={pages}, page_size={size})",
                          lambda pages=pages, size=size, steps=steps:
                          _run_pool_scenario(PagePool, gen, pages, size, steps)))
    for where, run in scenarios:
        try:
            problem = run()
        except NotImplementedError:
            return not_implemented(name)
        except Exception as exc:
            return CheckResult(name, FAILED, f"❌ {name}: {where}: your class raised {type(exc).__name__}: "
                                             f"{exc}\n   hint: {HINT_POOL}")
        if problem:
            return CheckResult(name, FAILED, f"❌ {name}: {where}, {problem}\n   hint: {HINT_POOL}")
    return CheckResult(name, PASSED, f"✅ {name}: a scripted workload and {len(random_sizes)} random ones keep "
                                     "every token in its own slot, leak no page, and run out of pages "
                                     "cleanly (no change to the pool).")


# --------------------------------------------------------------------------- exercise 3: decode
def make_paged_case(gen, lens, hq, hkv, d, page_size, dtype, device, spare_pages=4):
    """A random decode step: permuted pages; stale random K/V in every slot no sequence owns."""
    import torch

    batch = len(lens)
    per_seq = [-(-n // page_size) for n in lens]
    num_pages = sum(per_seq) + spare_pages
    q = torch.randn(batch, hq, d, generator=gen)
    k_pages = torch.randn(num_pages, page_size, hkv, d, generator=gen) * 3      # stale data everywhere
    v_pages = torch.randn(num_pages, page_size, hkv, d, generator=gen) * 3
    order = torch.randperm(num_pages, generator=gen)
    table = torch.zeros(batch, max(per_seq) + 1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        table[b, : per_seq[b]] = order[used: used + per_seq[b]].int()
        used += per_seq[b]
    lengths = torch.tensor(lens, dtype=torch.int32)
    return (q.to(device, dtype), k_pages.to(device, dtype), v_pages.to(device, dtype), table.to(device),
            lengths.to(device))


# (lens, Hq, Hkv, D, page_size): partial last pages, seq_len 1, group sizes 1, 2, 4 and MQA
DECODE_SHAPES = (([13, 6], 4, 2, 16, 4), ([21, 1, 9], 4, 1, 16, 8), ([19], 2, 2, 32, 4), ([10, 17], 8, 2, 16, 8))


def check_paged_decode(paged_decode: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 3: ``paged_decode(q, k_pages, v_pages, block_table, seq_lens) -> o`` against float64."""
    import torch

    from ..kernels.paged import paged_decode_ref

    _require_callable("paged_decode", paged_decode)
    gen = torch.Generator().manual_seed(_seed(seed))
    device = runtime().device
    cases = []
    for lens, hq, hkv, d, page in DECODE_SHAPES:
        args = make_paged_case(gen, lens, hq, hkv, d, page, torch.float16, device)
        cases.append(case(*args, label=f"seq_lens={lens}, Hq={hq}, Hkv={hkv}, D={d}, page_size={page}"))
    return run_check("paged decode kernel", unwrapped(paged_decode), paged_decode_ref, cases,
                     tol=tolerance("float16", device), hint=HINT_DECODE)


# ---------------------------------------------------------------------------- exercise 4: merge
def _partials(gen, rows: int, keys: int, d: int, cuts):
    """float64 (m, ℓ, z) of consecutive chunks of the keys ([rows, S], [rows, S], [rows, S, d])."""
    import torch

    scores = torch.randn(rows, keys, generator=gen, dtype=torch.float64) * 5
    values = torch.randn(keys, d, generator=gen, dtype=torch.float64)
    bounds = list(zip((0, *cuts), (*cuts, keys)))
    ms, ls, zs = [], [], []
    for lo, hi in bounds:
        if hi == lo:
            ms.append(torch.full((rows,), -math.inf, dtype=torch.float64))
            ls.append(torch.zeros(rows, dtype=torch.float64))
            zs.append(torch.zeros(rows, d, dtype=torch.float64))
            continue
        s = scores[:, lo:hi]
        m = s.amax(dim=1)
        p = torch.exp(s - m[:, None])
        ms.append(m), ls.append(p.sum(dim=1)), zs.append(p @ values[lo:hi])
    return torch.stack(ms, 1), torch.stack(ls, 1), torch.stack(zs, 1)


def _reference_merge(m, l, z):
    from ..kernels.paged import merge_partials

    return merge_partials(m.double(), l.double(), z.double())


def check_merge(merge_splits: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 4: ``merge_splits(m, l, z) -> o`` for m, l [rows, S] and z [rows, S, D]."""
    import torch

    _require_callable("merge_splits", merge_splits)
    gen = torch.Generator().manual_seed(_seed(seed))
    cases = []
    for rows, keys, d, cuts in ((3, 40, 8, (10, 25)), (2, 17, 4, (5, 5, 12)), (4, 64, 16, (16, 32, 48))):
        m, l, z = (t.float() for t in _partials(gen, rows, keys, d, cuts))
        cases.append(case(m, l, z, label=f"{len(cuts) + 1} splits of {keys} keys"
                                         f"{' (one empty)' if len(set(cuts)) < len(cuts) else ''}, D={d}"))
    return run_check("split-KV merge", merge_splits, _reference_merge, cases, tol=tolerance("float32"),
                     hint=HINT_MERGE)


def check_lab(token_slots, PagePool, paged_decode, merge_splits, *, seed: int | None = None):
    """All four checks, with a summary line."""
    return summarize([check_slots(token_slots, seed=seed), check_pool(PagePool, seed=seed),
                      check_paged_decode(paged_decode, seed=seed), check_merge(merge_splits, seed=seed)])
