"""Checks for lab 09, the step of a continuous-batching scheduler with a page budget.

The scheduler admits requests optimistically (a request needs pages only for the tokens it has), lets
running requests grow a page at a time, and when the pool runs out **preempts** the most recently
admitted request: its pages go back to the pool and it waits again; when it is admitted again it is
**recomputed** (its prompt and every token it generated are prefilled again).

    check_pages_needed(pages_needed)   exercise 1: fresh pages to hold n tokens, given the pages held
    check_grow(grow)                   exercise 2: room for one more token each, preempting from the end
    check_admit(admit)                 exercise 3: first come, first served, within the batch and the pages
    check_scheduler(scheduler_step)    exercise 4: one whole step, run on workloads token by token
    check_prediction(predict)          exercise 5: the prediction made before the measurement
    serve(scheduler_step, requests, ...)         runs a workload: the ledger model, or the tiny model
    check_lab(seed=None, **functions)            all five, with a summary line

While a student's function runs, this module's functions (the rule written out) refuse to run
(``queue_order`` excepted). Requests are ``Seq`` objects; the pool is
``attnkit.serving.allocator.PageTables`` (``PagedKVCache`` with the tiny model). Every check compares
with the rule written out here (``reference_*``), on fixed adversarial states first (lengths at
k·page_size and k·page_size ± 1, pools exactly full and one page short, victims too small to be enough,
resumed requests, the batch limit binding, running lists and queues whose order is not the order of arrival
nor of ids: an answer that re-sorts what it is given shows only there, since on a workload served from the
start admission order and arrival order agree), then random states drawn from ``seed``. The workloads of
exercise 4 run through a *ledger model*: the cache stores each token at its (page, offset), the model
reads the sequence back through the page table, and the next token is a function of what it read; so a
request whose cache was not recomputed, or whose pages another request took, produces other tokens than
the run without a cache.

Every check also compares the lists it hands over, and the requests in them, before and after each call: a
function that changes the caller's ``running`` or ``waiting`` (an alias popped from, a queue sorted or
extended in place, a request's fields rewritten) fails with the change. ``scheduler_step`` is given
``waiting`` in any order (the lab: the step sorts the queue on every step): single steps with queues out of
order, and in the workloads the waiting list of every step in an order drawn from ``seed``.
"""
from __future__ import annotations

import copy
import sys
from typing import Callable

import numpy as np

from ...serving.allocator import PageTables
from ..checking import (
    PASSED,
    CheckResult,
    Exercise,
    ForbiddenCall,
    check_exercises,
)
from .lab09_model import (  # noqa: F401  (re-exported: lab 09's names, importable from here as before)
    GUARDED_MODULES,
    HINT_INPUTS,
    LEDGER_VOCAB,
    Seq,
    ServeError,
    ServeRecord,
    StepPlan,
    _call,
    _clone,
    _differences,
    _failed,
    _Inputs,
    _pool_state,
    _rids,
    _seed,
    _WatchedStep,
    ledger_next,
    ledger_no_cache,
    queue_order,
    reference_admit,
    reference_grow,
    reference_pages_needed,
    reference_step,
    serve,
)

HINT_PAGES = ("a sequence of n tokens fills ceil(n / page_size) pages; it needs the difference with the "
              "pages it holds, and never a negative number: max(0, ceil(n / page_size) − held).")
HINT_GROW = ("each running request needs room for all its tokens (len(seq.tokens)); while the fresh pages "
             "they need exceed pool.num_free_pages, preempt the LAST request of `running` (the most "
             "recently admitted): pool.free(its rid), and its need no longer counts; then "
             "pool.reserve(rid, 1) for each request kept.")
HINT_ADMIT = ("take `waiting` in order; stop at the first request that does not fit (no skipping): it fits "
              "when a batch slot is free (n_running + admitted < max_batch) and its ceil(len(tokens) / "
              "page_size) pages are free; admitting is pool.add_sequence(rid) then pool.reserve(rid, "
              "len(seq.tokens)): a resumed request is recomputed, prompt AND generated tokens.")
HINT_STEP = ("kept, preempted = grow(running, pool); the queue is waiting + preempted ordered by (arrival, "
             "rid), sorted on every step (`waiting` may come in any order); "
             "admitted = admit(queue, len(kept), pool, max_batch); running is kept + admitted (admission "
             "order), waiting the rest of the queue.")
HINT_PREDICTION = ("a prompt of 21 tokens fills ceil(21 / 8) pages; after step s a request has 21 + s + 1 "
                   "tokens and needs room for them at step s + 1; count the free pages when they all need "
                   "their fourth page at once.")


def _make_pool(num_pages, page_size, held, rng=None):
    """A pool whose sequences hold the given token counts ({rid: n}), with pages scattered over it."""
    pool = PageTables(num_pages, page_size)
    fillers = []
    items = list(held.items())
    for index, (rid, n) in enumerate(items):
        still_needed = sum(-(-m // page_size) for _, m in items[index:])
        if rng is not None and rng.integers(0, 2) and pool.num_free_pages > still_needed:
            filler = ("filler", index)                      # takes a page first, freed afterwards
            pool.add_sequence(filler)
            pool.reserve(filler, 1)
            fillers.append(filler)
        pool.add_sequence(rid)
        pool.reserve(rid, n)
    for filler in fillers:
        pool.free(filler)
    return pool


def _seq(rid, n_prompt, n_generated, arrival=0, max_new=64):
    prompt = [(7 * rid + 3 * i) % 50 for i in range(n_prompt)]
    return Seq(rid, prompt, max_new, arrival, [(5 * rid + i) % 50 for i in range(n_generated)])


_ORDER_RULES = {
    "kept": "kept is `running` in the order given (admission order) less the preempted: not re-sorted",
    "admitted": "admit takes `waiting` in the order given (it is the queue already): no re-sorting",
    "running": "plan.running is the kept requests in the order given (admission order), then the admitted "
               "ones: not sorted by arrival or by id (admission order need not be arrival order)",
}


def _order_note(expected: dict, found: dict, key: str) -> str:
    """The rule in words when the requests under ``key`` are the right ones in another order."""
    want, got = expected.get(key), found.get(key)
    if want != got and isinstance(got, list) and sorted(want, key=str) == sorted(got, key=str):
        return f"\n   the right requests in the wrong order: {_ORDER_RULES[key]}."
    return ""


# ------------------------------------------------------------------------------------ exercise 1
def _pages_cases(rng):
    fixed = [(0, 0, 8), (1, 0, 8), (8, 0, 8), (9, 0, 8), (8, 1, 8), (9, 1, 8), (16, 1, 8), (17, 2, 8),
             (5, 3, 8), (24, 3, 8), (25, 3, 8), (1, 0, 1), (7, 7, 1), (16, 0, 16), (15, 0, 16), (33, 2, 16)]
    drawn = []
    for _ in range(30):
        ps = int(rng.choice([1, 2, 4, 8, 16]))
        k = int(rng.integers(0, 6))
        n = max(0, k * ps + int(rng.integers(-1, 2)))
        drawn.append((n, int(rng.integers(0, k + 2)), ps))
    return [(c, "fixed") for c in fixed] + [(c, "random") for c in drawn]


def check_pages_needed(pages_needed: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 1: pages_needed(n_tokens, pages_held, page_size) -> fresh pages needed (an int ≥ 0)."""
    name = "pages_needed"
    cases = _pages_cases(np.random.default_rng(_seed(seed)))
    for index, ((n, held, ps), kind) in enumerate(cases, start=1):
        where = f"case {index} of {len(cases)} ({kind}), n_tokens={n}, pages_held={held}, page_size={ps}"
        got, fail = _call(name, pages_needed, (n, held, ps), where, HINT_PAGES)
        if fail is not None:
            return fail
        expected = reference_pages_needed(n, held, ps)
        if isinstance(got, bool) or not isinstance(got, (int, np.integer)) or got != expected:
            return _failed(name, where, f"expected {expected}, got {got!r}", HINT_PAGES)
    return CheckResult(name, PASSED, f"✅ {name}: right on {len(cases)} cases.")


# ------------------------------------------------------------------------------------ exercise 2
def _grow_cases(rng):
    """(num_pages, page_size, running seqs) in admission order; each has cached len(tokens) − 1 tokens."""
    cases = [
        # nothing grows: every request has room in its last page, and no page is free
        ("no request needs a page, none free", 4, 8, [_seq(0, 10, 1), _seq(1, 12, 3)]),
        # both need a page, exactly two are free: no preemption
        ("two need a page, two free", 5, 8, [_seq(0, 8, 1), _seq(1, 16, 1)]),
        # three need a page, two free: the last one (rid 2) goes, freeing its page
        ("one page short", 6, 8, [_seq(0, 16, 1), _seq(1, 8, 1), _seq(2, 8, 1)]),
        # the last request's page is not enough: the one before it goes too
        ("the last victim is not enough", 5, 8, [_seq(0, 16, 1), _seq(1, 16, 1), _seq(2, 2, 1)]),
        # 16 tokens fill exactly 2 pages of 8: nobody needs a page, although none is free
        ("every request ends exactly at a page's end", 6, 8, [_seq(0, 15, 1), _seq(1, 9, 7), _seq(2, 14, 2)]),
        # the first request is the longest: the rule still takes the last one
        ("the longest request is the first", 9, 4, [_seq(0, 20, 1), _seq(1, 4, 1), _seq(2, 3, 2)]),
        # a victim that needed no page itself still frees its page
        ("the victim needs no page itself", 4, 4, [_seq(0, 4, 1), _seq(1, 4, 1), _seq(2, 2, 1)]),
        ("page size 1, two pages short", 7, 1, [_seq(0, 1, 1), _seq(1, 2, 1), _seq(2, 1, 2)]),
        # the victim's own need goes with it: after it, the one page freed is enough for the first
        ("the victim's need leaves with it", 3, 8, [_seq(0, 16, 1), _seq(1, 8, 1)]),
        # admission order is neither arrival nor id order: the last of the list goes (rid 2), not the latest
        # arrival (rid 6) nor the largest id (rid 9), and the kept stay in the order given
        ("the last admitted is neither the latest arrival nor the largest id", 6, 4,
         [_seq(6, 8, 1, arrival=5), _seq(9, 4, 1, arrival=0), _seq(2, 4, 1, arrival=1)]),
    ]
    for i in range(6):
        ps = int(rng.choice([1, 2, 4, 8]))
        count = int(rng.integers(1, 6))
        seqs = [_seq(r, int(rng.integers(1, 4 * ps + 2)), int(rng.integers(1, 3 * ps + 1)), max_new=128)
                for r in range(count)]
        held = sum(-(-(len(s.tokens) - 1) // ps) for s in seqs)
        cases.append((f"random {i + 1}", held + int(rng.integers(0, count + 1)), ps, seqs))
    return cases


def check_grow(grow: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 2: grow(running, pool) -> (kept, preempted), with the pool changed in place."""
    name = "grow (room for one more token, preempting from the end)"
    rng = np.random.default_rng(_seed(seed))
    cases = _grow_cases(rng)
    for index, (label, num_pages, ps, seqs) in enumerate(cases, start=1):
        held = {s.rid: len(s.tokens) - 1 for s in seqs}
        pool = _make_pool(num_pages, ps, held, rng)
        ref_pool, ref_seqs = copy.deepcopy(pool), copy.deepcopy(seqs)
        ref_kept, ref_pre = reference_grow(list(ref_seqs), ref_pool)
        lens = ", ".join(f"rid {s.rid} (arrival {s.arrival}): {len(s.tokens)} tokens" for s in seqs)
        where = (f"case {index} of {len(cases)} ({label}): page_size={ps}, {pool.num_free_pages} free pages, "
                 f"running (admission order) {lens}")
        given = list(copy.deepcopy(seqs))
        watch = _Inputs(running=given)
        got, fail = _call(name, grow, (given, pool), where, HINT_GROW)
        if fail is not None:
            return fail
        changed = watch.changed()
        if changed is not None:
            return _failed(name, where, changed, HINT_INPUTS)
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return _failed(name, where, f"expected a pair (kept, preempted), got {got!r}", HINT_GROW)
        kept, pre = got
        expected = {"kept": _rids(ref_kept), "preempted": sorted(_rids(ref_pre)), **_pool_state(ref_pool)}
        try:
            found = {"kept": _rids(kept), "preempted": sorted(_rids(pre)), **_pool_state(pool)}
        except Exception as exc:
            return _failed(name, where, f"could not read the result ({type(exc).__name__}: {exc})", HINT_GROW)
        if found != expected:
            return _failed(name, where, _differences(expected, found) + _order_note(expected, found, "kept"),
                           HINT_GROW)
    return CheckResult(name, PASSED, f"✅ {name}: right on {len(cases)} pool states.")


# ------------------------------------------------------------------------------------ exercise 3
def _admit_cases(rng):
    """(label, num_pages, page_size, running {rid: tokens held}, waiting seqs, max_batch[, idle {rid: tokens
    held}]): ``idle`` sequences hold pages in the pool without running (a finished request, freed after the
    step), so the running requests are counted by n_running, not by the pool's sequences."""
    run2 = {100: 9, 101: 5}                                   # 2 + 1 pages of 8 held by running requests
    cases = [
        ("the batch limit binds first", 20, 8, run2, [_seq(0, 5, 0), _seq(1, 5, 0), _seq(2, 5, 0)], 3),
        ("pages exactly enough (24 tokens = 3 pages)", 6, 8, run2, [_seq(0, 24, 0), _seq(1, 3, 0)], 8),
        ("the first waiting request does not fit", 6, 8, run2, [_seq(0, 30, 0), _seq(1, 3, 0)], 8),
        ("a resumed request: prompt + generated", 8, 8, run2, [_seq(0, 10, 9), _seq(1, 2, 0)], 8),
        ("a resumed request whose prompt alone would fit", 7, 8, run2, [_seq(0, 20, 13), _seq(1, 2, 0)], 8),
        ("the batch is full", 20, 8, run2, [_seq(0, 3, 0)], 2),
        ("nobody waits", 20, 8, run2, [], 4),
        ("the second fits exactly in the last free page", 5, 4, {100: 4}, [_seq(0, 9, 0), _seq(1, 4, 0)], 4),
        ("page size 1", 9, 1, {100: 3}, [_seq(0, 2, 1), _seq(1, 3, 0), _seq(2, 1, 0)], 8),
        # `waiting` is the queue in its order: rid 5 is first although rid 2 arrived earlier and has the
        # smaller id; one page is free, so rid 5 is admitted and rid 2 waits (no re-sorting)
        ("the queue in the order given, not re-sorted", 4, 8, run2,
         [_seq(5, 3, 0, arrival=3), _seq(2, 3, 0, arrival=0)], 8),
        ("the pool also holds a finished request's pages: 2 running, 3 sequences", 20, 8, run2,
         [_seq(0, 5, 0), _seq(1, 5, 0)], 3, {900: 6}),
    ]
    for i in range(6):
        ps = int(rng.choice([1, 2, 4, 8]))
        running = {100 + r: int(rng.integers(1, 3 * ps + 1)) for r in range(int(rng.integers(0, 3)))}
        waiting = [_seq(r, int(rng.integers(1, 3 * ps + 2)), int(rng.integers(0, 2 * ps)) * int(rng.integers(0, 2)))
                   for r in range(int(rng.integers(0, 5)))]
        held = sum(-(-n // ps) for n in running.values())
        max_batch = len(running) + int(rng.integers(0, 4))
        cases.append((f"random {i + 1}", held + int(rng.integers(0, 4 * 3 + 1)) + 1, ps, running, waiting,
                      max(1, max_batch)))
    return cases


def check_admit(admit: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 3: admit(waiting, n_running, pool, max_batch) -> the admitted requests, pool changed in place."""
    name = "admit (first come, first served, within the budget)"
    rng = np.random.default_rng(_seed(seed))
    cases = _admit_cases(rng)
    for index, (label, num_pages, ps, running, waiting, max_batch, *idle) in enumerate(cases, start=1):
        pool = _make_pool(num_pages, ps, {**running, **(idle[0] if idle else {})}, rng)
        ref_pool = copy.deepcopy(pool)
        ref = reference_admit(copy.deepcopy(waiting), len(running), ref_pool, max_batch)
        lens = ", ".join(f"rid {s.rid} (arrival {s.arrival}): {len(s.prompt)} + {len(s.generated)} tokens"
                         for s in waiting) or "nobody"
        where = (f"case {index} of {len(cases)} ({label}): page_size={ps}, {pool.num_free_pages} free pages, "
                 f"{len(running)} running, max_batch={max_batch}, waiting {lens}")
        given = list(copy.deepcopy(waiting))
        watch = _Inputs(waiting=given)
        got, fail = _call(name, admit, (given, len(running), pool, max_batch), where, HINT_ADMIT)
        if fail is not None:
            return fail
        changed = watch.changed()
        if changed is not None:
            return _failed(name, where, changed, HINT_INPUTS)
        expected = {"admitted": _rids(ref), **_pool_state(ref_pool)}
        try:
            found = {"admitted": _rids(got), **_pool_state(pool)}
        except Exception as exc:
            return _failed(name, where, f"could not read the result ({type(exc).__name__}: {exc})", HINT_ADMIT)
        if found != expected:
            return _failed(name, where, _differences(expected, found) + _order_note(expected, found, "admitted"),
                           HINT_ADMIT)
    return CheckResult(name, PASSED, f"✅ {name}: right on {len(cases)} pool states.")


# ------------------------------------------------------------------------------------ exercise 4
def _workloads(rng):
    """(label, requests, num_pages, page_size, max_batch)."""
    def reqs(spec, ids=None):
        # ids: each request's rid, when it should not follow the order of arrival (the queue's order is
        # by arrival, then rid: an answer that sorts by rid alone or keeps list order shows here).
        ids = list(range(len(spec))) if ids is None else [int(r) for r in ids]
        return [Seq(r, [(11 * r + 5 * j) % LEDGER_VOCAB for j in range(p)], m, a)
                for r, (p, m, a) in zip(ids, spec)]

    cases = [
        ("all at once, preemption on growth", reqs([(21, 24, 0)] * 8), 20, 8, 8),
        ("late arrivals wait behind a preempted request", reqs([(14, 20, 0), (14, 20, 0), (6, 12, 0),
                                                                (5, 6, 3), (9, 9, 4)]), 9, 4, 4),
        ("the batch limit binds", reqs([(3, 5, 0)] * 6), 30, 4, 2),
        ("page size 1, tight pool", reqs([(3, 6, 0), (2, 7, 0), (4, 3, 1), (1, 9, 2)]), 12, 1, 3),
        ("short and long mixed", reqs([(30, 3, 0), (2, 30, 0), (9, 16, 1), (17, 4, 1), (1, 20, 5)]), 14, 4, 4),
        ("ids in the reverse order of arrival, preemptions", reqs(
            [(6, 14, 0), (6, 14, 1), (5, 12, 2), (3, 10, 2), (7, 8, 4), (2, 9, 6)], ids=[9, 7, 6, 5, 3, 1]),
         10, 4, 4),
    ]
    for i in range(3):
        ps = int(rng.choice([1, 2, 4, 8]))
        spec = [(int(rng.integers(1, 4 * ps + 1)), int(rng.integers(1, 4 * ps + 1)), int(rng.integers(0, 6)))
                for _ in range(int(rng.integers(2, 8)))]
        largest = max(-(-(p + m - 1) // ps) for p, m, _ in spec)
        ids = rng.permutation(len(spec)) * 3 + 1                  # ids unrelated to the order of arrival
        cases.append((f"random {i + 1}, ids out of arrival order", reqs(spec, ids),
                      largest + int(rng.integers(0, 2 * largest + 1)), ps, int(rng.integers(1, 6))))
    return cases


def _step_cases():
    """(label, page_size, running seqs with their pages, waiting seqs, free pages, max_batch): single steps."""
    def arriving(seq, arrival):
        seq.arrival = arrival
        return seq

    return [
        # growth comes first: the waiting request would take the page the running one needs
        ("admission waits for growth", 4, [_seq(0, 8, 1)], [arriving(_seq(1, 12, 0), 1)], 3, 4),
        # the preempted request (arrived at step 1) goes back before a later arrival (step 3)
        ("a preempted request queues before later arrivals", 4,
         [_seq(0, 8, 1), arriving(_seq(1, 4, 1), 1)], [arriving(_seq(2, 1, 0), 3)], 0, 4),
        # two preempted in one step rejoin the queue in arrival order, the older first
        ("two preempted, oldest first in the queue", 4,
         [_seq(0, 8, 1), arriving(_seq(1, 4, 1), 1), arriving(_seq(2, 4, 1), 2)], [arriving(_seq(3, 1, 0), 5)], 0, 4),
        # an admitted request joins the running ones at the end (the next victim is the newest)
        ("the admitted run after the others", 4, [_seq(0, 5, 2)], [arriving(_seq(1, 3, 0), 1)], 5, 4),
        # the batch limit counts the requests kept
        ("a full batch admits nobody", 8, [_seq(0, 3, 1), arriving(_seq(1, 3, 1), 1)],
         [arriving(_seq(2, 3, 0), 2)], 6, 2),
        # ids against arrival: rid 4 (arrival 2) is preempted and queues before rid 2 (arrival 5), whose
        # one page would fit: a queue sorted by id admits rid 2 ahead of its turn
        ("arrival order is not id order", 4, [_seq(7, 8, 1), arriving(_seq(4, 4, 1), 2)],
         [arriving(_seq(2, 1, 0), 5)], 1, 4),
        # two preempted whose ids run against their arrivals: the queue is by arrival (rid 5, then rid 3)
        ("two preempted, ids against arrival", 4,
         [_seq(9, 8, 1), arriving(_seq(5, 4, 1), 1), arriving(_seq(3, 4, 1), 2)], [], 0, 4),
        # a waiting request that arrived before the victim goes first in the queue, into the pages the
        # victim gave back: an answer that counts free pages itself, before the preemption, misses them
        ("the victim's pages admit an earlier arrival", 4, [_seq(0, 8, 1), arriving(_seq(1, 8, 1), 3)],
         [arriving(_seq(2, 3, 0), 1)], 1, 4),
        # the same with a full batch: the preemption frees a place too, so the earlier arrival is admitted;
        # an answer that counts the running requests before the preemption (not the kept) admits nobody
        ("a preemption frees a place in a full batch", 4, [_seq(0, 8, 1), arriving(_seq(1, 8, 1), 3)],
         [arriving(_seq(2, 3, 0), 1)], 1, 2),
        # `running` comes in admission order, which need not be arrival order (rid 8 arrived before rid 3
        # but was admitted after it): the admitted rid 5 joins at the end, and nothing is re-sorted, so
        # the next preemption takes rid 5, then rid 8
        ("admission order is not arrival order", 4, [arriving(_seq(3, 5, 2), 4), arriving(_seq(8, 3, 1), 1)],
         [arriving(_seq(5, 3, 0), 2)], 1, 4),
        # the same order when a page is short: the last admitted (rid 8) is preempted, not the latest
        # arrival (rid 3)
        ("the last admitted is preempted, not the latest arrival", 4,
         [arriving(_seq(3, 8, 1), 4), arriving(_seq(8, 4, 1), 1)], [], 0, 4),
        # `waiting` comes in any order (a server appends arrivals as they come): the step sorts the queue on
        # every step, also when nothing is preempted; rid 2 (arrival 1) takes the one free page, not rid 4
        ("waiting out of queue order, nothing preempted", 4, [_seq(0, 5, 2)],
         [arriving(_seq(4, 3, 0), 3), arriving(_seq(2, 3, 0), 1)], 1, 4),
        # equal arrivals: the queue is by rid then (rid 3 before rid 6), whatever order `waiting` gives
        ("equal arrivals given out of id order, nobody running", 4, [],
         [arriving(_seq(6, 3, 0), 2), arriving(_seq(3, 3, 0), 2), arriving(_seq(1, 3, 0), 0)], 2, 4),
        # a preemption with `waiting` out of order: merging the preempted into `waiting` as though it were
        # sorted (heapq.merge, bisect.insort) gives [1, 5, 3]; the queue is [3, 1, 5]
        ("waiting out of queue order and a preemption", 4, [_seq(0, 8, 1), arriving(_seq(1, 4, 1), 2)],
         [arriving(_seq(5, 1, 0), 4), arriving(_seq(3, 1, 0), 0)], 0, 4),
    ]


def _check_step_cases(name, scheduler_step):
    cases = _step_cases()
    for index, (label, ps, running, waiting, free, max_batch) in enumerate(cases, start=1):
        held = {s.rid: len(s.tokens) - 1 for s in running}
        pool = _make_pool(sum(-(-n // ps) for n in held.values()) + free, ps, held)
        ref_pool = _clone(pool)
        ref = reference_step(list(running), list(waiting), ref_pool, max_batch)
        desc = "; ".join(f"rid {s.rid} (arrival {s.arrival}): {len(s.tokens)} tokens" for s in running)
        wait = "; ".join(f"rid {s.rid} (arrival {s.arrival}): {len(s.tokens)} tokens" for s in waiting)
        where = (f"step {index} of {len(cases)} ({label}): page_size={ps}, {free} free pages, max_batch="
                 f"{max_batch}, running [{desc}], waiting [{wait}]")
        given_running, given_waiting = copy.deepcopy(running), copy.deepcopy(waiting)
        watch = _Inputs(running=given_running, waiting=given_waiting)
        plan, fail = _call(name, scheduler_step, (given_running, given_waiting, pool, max_batch), where, HINT_STEP)
        if fail is not None:
            return fail
        changed = watch.changed()
        if changed is not None:
            return _failed(name, where, changed, HINT_INPUTS)
        if not isinstance(plan, StepPlan):
            return _failed(name, where, f"expected a StepPlan, got {type(plan).__name__}", HINT_STEP)
        want = {k: _rids(getattr(ref, k)) for k in ("running", "waiting", "admitted")}
        want["preempted"] = sorted(_rids(ref.preempted))
        try:
            got = {k: _rids(getattr(plan, k)) for k in ("running", "waiting", "admitted")}
            got["preempted"] = sorted(_rids(plan.preempted))
        except Exception as exc:
            return _failed(name, where, f"could not read the plan ({type(exc).__name__}: {exc})", HINT_STEP)
        want.update(_pool_state(ref_pool))
        got.update(_pool_state(pool))
        if got != want:
            return _failed(name, where, _differences(want, got) + _order_note(want, got, "running"), HINT_STEP)
    return None


def check_scheduler(scheduler_step: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 4: scheduler_step(running, waiting, pool, max_batch) -> StepPlan, run on whole workloads.

    First single steps from fixed states (growth before admission, the queue order of preempted
    requests, the batch limit, queues given out of order); then workloads run through the ledger model, each
    step's waiting list in an order drawn from ``seed``: every step is compared with the rule and the pool's
    invariants, and every request's tokens with the run without a cache. The caller's lists must come back
    unchanged.
    """
    name = "scheduler_step (single steps, then whole workloads token by token)"
    fail = _check_step_cases(name, scheduler_step)
    if fail is not None:
        return fail
    rng = np.random.default_rng(_seed(seed))
    cases = _workloads(rng)
    for index, (label, requests, num_pages, ps, max_batch) in enumerate(cases, start=1):
        where = (f"workload {index} of {len(cases)} ({label}): {len(requests)} requests, {num_pages} pages of "
                 f"{ps}, max_batch={max_batch}")
        step = _WatchedStep(scheduler_step, rng)
        record, fail = _call(name, lambda: serve(step, requests, num_pages=num_pages, page_size=ps,
                                                 max_batch=max_batch, compare_rule=True, guard=True), (), where,
                             HINT_STEP, guard=False)
        if fail is not None:
            return fail
        for r in requests:
            expected = ledger_no_cache(r.prompt, r.max_new_tokens)
            got = record.generated.get(r.rid)
            if got != expected:
                at = next((i for i, (a, b) in enumerate(zip(got or [], expected)) if a != b), len(got or []))
                return _failed(name, where, f"request {r.rid} generated {got}, the run without a cache "
                                            f"{expected} (first difference at token {at})", HINT_STEP)
    return CheckResult(name, PASSED, f"✅ {name}: {len(_step_cases())} single steps right, {len(cases)} "
                                     f"workloads served, every step by the rule, every token equal to the run "
                                     f"without a cache.")


# ------------------------------------------------------------------------------ prediction, measurement
PREDICTION_WORKLOAD = dict(requests=8, prompt=21, max_new_tokens=24, num_pages=20, page_size=8, max_batch=8)
EXPECTED_PREDICTION = (6, 4, 1)       # admitted at step 0, step of the first preemption, preempted then


def prediction_requests(vocab_size: int = LEDGER_VOCAB, prompts=None) -> list:
    w = PREDICTION_WORKLOAD
    if prompts is None:
        prompts = [[(11 * i + 5 * j) % vocab_size for j in range(w["prompt"])] for i in range(w["requests"])]
    return [Seq(i, list(p), w["max_new_tokens"], 0) for i, p in enumerate(prompts)]


def check_prediction(predict: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 5: predict() -> (requests admitted at step 0, step of the first preemption, requests
    preempted at that step), for PREDICTION_WORKLOAD. Whole numbers: each must be exact."""
    name = "prediction: admissions and the first preemption"
    got, fail = _call(name, predict, (), "predict()", HINT_PREDICTION)
    if fail is not None:
        return fail
    try:
        values = tuple(got)
        ok = len(values) == 3 and all(not isinstance(v, bool) and int(v) == v for v in values)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        return _failed(name, "predict()", f"expected three whole numbers, got {got!r}", HINT_PREDICTION)
    labels = ("admitted at step 0", "step of the first preemption", "preempted at that step")
    wrong = [f"{label}: {v!r} is not right" for label, v, e in zip(labels, values, EXPECTED_PREDICTION) if v != e]
    if wrong:
        return _failed(name, "predict()", "; ".join(wrong) + " (each must be exact)", HINT_PREDICTION)
    return CheckResult(name, PASSED, f"✅ {name}: {EXPECTED_PREDICTION[0]} admitted at step 0, the first "
                                     f"preemption at step {EXPECTED_PREDICTION[1]}, of "
                                     f"{EXPECTED_PREDICTION[2]} request.")


def worst_case_step(running, waiting, pool, max_batch) -> StepPlan:
    """Worst-case reservation as a step (the baseline of the measurement): admit only when the request's
    worst case (prompt + max_new_tokens − 1 cached tokens) fits beside what the running requests may
    still claim; never preempts."""
    ps = pool.page_size

    def worst(s):
        return -(-(len(s.prompt) + s.max_new_tokens - 1) // ps)

    for s in running:
        pool.reserve(s.rid, 1)
    claimed = sum(worst(s) - len(pool.pages_of(s.rid)) for s in running)
    admitted = []
    for s in waiting:
        if len(running) + len(admitted) >= max_batch or pool.num_free_pages - claimed < worst(s):
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        claimed += worst(s) - len(pool.pages_of(s.rid))
        admitted.append(s)
    return StepPlan(list(running) + admitted, [s for s in waiting if s not in admitted], admitted, [])


def measure(scheduler_step: Callable, model=None) -> str:
    """Serve PREDICTION_WORKLOAD with the student's step and with worst-case reservation; the report."""
    w = PREDICTION_WORKLOAD
    prompts = None
    if model is not None:
        text = "the scheduler admits a new request when pages are free"
        prompts = [model.encode(text[i:i + w["prompt"]]) for i in range(w["requests"])]
    sizes = dict(num_pages=w["num_pages"], page_size=w["page_size"], max_batch=w["max_batch"])
    try:
        yours = serve(scheduler_step, prediction_requests(prompts=prompts), model=model, guard=True, **sizes)
    except NotImplementedError:
        return "⏳ measure: needs exercise 4 first."
    except ForbiddenCall as exc:
        return f"❌ measure: {exc}"
    worst = serve(worst_case_step, prediction_requests(prompts=prompts), model=model, **sizes)
    first = next((s for s in yours.steps if s[3]), None)
    lines = [f"your scheduler: {len(yours.steps[0][2])} admitted at step 0; first preemption at step "
             f"{first[0] if first else '-'} ({len(first[3]) if first else 0} preempted)",
             f"{'':>16}{'steps':>7}{'tokens/step':>13}{'preemptions':>13}{'recomputed tokens':>19}"]
    for label, rec in (("yours", yours), ("worst case", worst)):
        lines.append(f"{label:>16}{len(rec.steps):>7}{rec.tokens_generated / len(rec.steps):>13.2f}"
                     f"{rec.preemptions:>13}{rec.recomputed_tokens:>19}")
    if model is not None:
        from ...serving.tinymodel import greedy_no_cache

        same = all(greedy_no_cache(model, r.prompt, r.max_new_tokens)[0] == yours.generated[r.rid]
                   for r in prediction_requests(prompts=prompts))
        lines.append(f"tiny model: every request's tokens equal the run without a cache: {same}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- the lab
EXERCISES = (
    Exercise(function="pages_needed", check=check_pages_needed),
    Exercise(function="grow", check=check_grow, depends=("pages_needed",)),
    Exercise(function="admit", check=check_admit, depends=("pages_needed",)),
    Exercise(function="scheduler_step", check=check_scheduler, depends=("grow", "admit")),
    Exercise(function="predict", check=check_prediction),
)


def check_lab(*, seed: int | None = None, **functions):
    """All five exercises, with a summary line."""
    return check_exercises(EXERCISES, functions, seed=seed)


__all__ = ["Seq", "StepPlan", "queue_order", "serve", "ServeError", "ServeRecord", "ledger_next",
           "ledger_no_cache", "check_pages_needed", "check_grow", "check_admit", "check_scheduler",
           "check_prediction", "measure", "worst_case_step", "check_lab", "EXERCISES", "PREDICTION_WORKLOAD"]


GUARDED_MODULES.append(sys.modules[__name__])   # this module's checks refuse to run inside a student's call
