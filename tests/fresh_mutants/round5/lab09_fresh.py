"""Round 5 of fresh wrong answers for lab 09 (a scheduler that pages on demand), written from the lab's text
and its solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: pages and tokens mixed up (pages held subtracted as tokens, a page count passed where reserve
takes tokens), the victim chosen by arrival instead of admission, the running count taken from the pool
instead of the argument, requests changed in place (a preempted request given a new arrival), a plan whose
waiting list is not the queue it admitted from, and a float where a whole number is asked."""
import math

import numpy as np

from attnkit.classroom.labchecks.lab09 import Seq, StepPlan, queue_order
from attnkit.serving.allocator import PageTables

# ---------------------------------------------------------------- the solution


def pages_needed(n_tokens, pages_held, page_size):
    """Fresh pages a sequence holding `pages_held` pages needs to hold `n_tokens` tokens (never < 0)."""
    return max(0, -(-n_tokens // page_size) - pages_held)


def grow(running, pool):
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()                      # the most recently admitted
        needs.pop()
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def admit(waiting, n_running, pool, max_batch):
    """Admit requests from the front of `waiting` while a batch slot and their pages are free."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break                                # first come, first served: no overtaking
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))       # prompt + generated: a resumed request is recomputed
        admitted.append(s)
    return admitted


def scheduler_step(running, waiting, pool, max_batch):
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def predict():
    """(requests admitted at step 0, step of the first preemption, requests preempted at that step)."""
    pages_per_prompt = -(-21 // 8)               # 3 pages for 21 tokens
    admitted = min(8, 20 // pages_per_prompt)    # 6 requests, 18 pages, 2 left
    # after step s a request has 21 + s + 1 tokens; at step s it needs room for 21 + s of them:
    # 25 tokens (a 4th page) at s = 4, for all six at once, with 2 pages free
    first_step = 25 - 21
    preempted = 1                                # the last one frees 3 pages: 5 needed, 5 free
    return admitted, first_step, preempted


SOLUTION = {"pages_needed": pages_needed, "grow": grow, "admit": admit, "scheduler": scheduler_step,
            "prediction": predict}

# ---------------------------------------------------------------- exercise 1


def pn_held_as_tokens(n_tokens, pages_held, page_size):
    """Exercise 1. Subtracts the pages held from the tokens, ceil((n_tokens − pages_held) / page_size) ('what
    is not held yet'): pages counted as if they were tokens."""
    return max(0, -(-(n_tokens - pages_held) // page_size))


# ---------------------------------------------------------------- exercise 2


def gr_victim_latest_arrival(running, pool):
    """Exercise 2. Preempts the request with the latest arrival ('the newest request'), not the last one
    admitted: a request that arrived early but was admitted again after a preemption is protected, and an
    older admission is preempted in its place."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        i = max(range(len(kept)), key=lambda j: queue_order(kept[j]))
        victim = kept.pop(i)
        needs.pop(i)
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def gr_reserve_pages_needed(running, pool):
    """Exercise 2. pool.reserve(rid, need) with the request's page need ('reserve what it needs'): reserve
    takes tokens, so a request that needs no fresh page reserves no room for its token."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s, need in zip(kept, needs):
        pool.reserve(s.rid, need)
    return kept, preempted


# ---------------------------------------------------------------- exercise 3


def ad_running_from_pool(waiting, n_running, pool, max_batch):
    """Exercise 3. Counts the running requests as the sequences in the pool, len(pool.sequences) ('the pool
    knows who runs'), instead of the n_running argument."""
    admitted = []
    for s in waiting:
        if len(pool.sequences) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


def admit_slots_counted_down(waiting, n_running, pool, max_batch):
    """Exercise 3, correct: the free batch slots counted down from max_batch − n_running, the pages of each
    request by math.ceil."""
    slots = max_batch - n_running
    admitted = []
    for s in waiting:
        if slots <= 0 or math.ceil(len(s.tokens) / pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
        slots -= 1
    return admitted


# ---------------------------------------------------------------- exercise 4


def ss_preempted_rearrive(running, waiting, pool, max_batch):
    """Exercise 4. Gives each preempted request a new arrival, one past the latest ('it arrives again now'):
    the preempted requests go to the back of the queue, and the caller's requests are changed."""
    kept, preempted = grow(running, pool)
    latest = max((s.arrival for s in list(running) + list(waiting)), default=0)
    for s in preempted:
        s.arrival = latest + 1
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def ss_plan_waiting_unsorted(running, waiting, pool, max_batch):
    """Exercise 4. Admits from the sorted queue, but returns as the plan's waiting list the caller's order
    with the preempted appended, [s for s in waiting + preempted if s not in admitted]: not in queue order."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in waiting + preempted if s not in admitted],
                    admitted=admitted, preempted=preempted)


def step_budget_shifted(running, waiting, pool, max_batch):
    """Exercise 4, correct: admits with no request counted as running and the batch limit lowered by the
    kept ones instead."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, 0, pool, max_batch - len(kept))
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# ---------------------------------------------------------------- exercise 5


def pr_float_admitted():
    """Exercise 5. Pages per prompt from np.ceil(21 / 8) ('NumPy rounds up'): 3.0, so the count admitted
    is 20 // 3.0 = 6.0, a float where the lab asks for a whole number (an int)."""
    pages_per_prompt = np.ceil(21 / 8)
    admitted = min(8, 20 // pages_per_prompt)
    first_step = 25 - 21
    preempted = 1
    return admitted, first_step, preempted


WRONG = {
    "pages_needed": [pn_held_as_tokens],
    "grow": [gr_victim_latest_arrival, gr_reserve_pages_needed],
    "admit": [ad_running_from_pool],
    "scheduler": [ss_preempted_rearrive, ss_plan_waiting_unsorted],
    "prediction": [pr_float_admitted],
}
CORRECT = {"admit": [admit, admit_slots_counted_down], "scheduler": [scheduler_step, step_budget_shifted]}


def _seq(rid, n_prompt, n_gen, arrival=0):
    return Seq(rid=rid, prompt=list(range(n_prompt)), max_new_tokens=50, arrival=arrival,
               generated=list(range(100, 100 + n_gen)))


def _pool_summary(pool):
    return {"free": pool.num_free_pages,
            "seqs": {rid: (pool.length(rid), len(pool.pages_of(rid))) for rid in sorted(pool.sequences)}}


def _running(pool, seqs):
    """Running requests: each has cached all its tokens but the last one."""
    for s in seqs:
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens) - 1)
    return seqs


def _w_grow(f):
    """Admission order 5, 2, 8, where 5 arrived last and 8, admitted last, arrived early (it was admitted again
    after a preemption); each needs a fresh page, with 0 to 4 pages free."""
    out = []
    for pages in (5, 6, 7, 9):
        pool = PageTables(num_pages=pages, page_size=4)
        seqs = _running(pool, [_seq(5, 8, 1, arrival=4), _seq(2, 4, 1, arrival=0), _seq(8, 8, 1, arrival=1)])
        kept, pre = f(seqs, pool)
        out.append(([s.rid for s in kept], [s.rid for s in pre], _pool_summary(pool)))
    return out


def _w_grow_no_fresh_page(f):
    """Requests whose next token fits in their last page (no fresh page needed) beside one that needs a page."""
    pool = PageTables(num_pages=8, page_size=4)
    seqs = _running(pool, [_seq(1, 2, 1, arrival=0), _seq(4, 8, 1, arrival=1), _seq(6, 5, 1, arrival=2)])
    kept, pre = f(seqs, pool)
    return [s.rid for s in kept], [s.rid for s in pre], _pool_summary(pool)


def _w_admit(f):
    out = []
    for pages, n_running, max_batch in ((6, 0, 8), (2, 0, 8), (40, 1, 3)):
        pool = PageTables(num_pages=pages, page_size=4)
        waiting = [_seq(10, 5, 0), _seq(11, 6, 2), _seq(12, 9, 0), _seq(13, 2, 0)]
        adm = f(waiting, n_running, pool, max_batch)
        out.append(([s.rid for s in adm], [s.rid for s in waiting], _pool_summary(pool)))
    return out


def _w_sched(f):
    out = []
    for pages, max_batch in ((4, 4), (6, 4), (20, 6)):
        pool = PageTables(num_pages=pages, page_size=4)
        running = _running(pool, [_seq(5, 8, 1, arrival=2), _seq(2, 4, 1, arrival=0)])
        waiting = [_seq(7, 12, 0, arrival=3), _seq(3, 2, 0, arrival=1), _seq(9, 30, 0, arrival=0)]
        plan = f(running, waiting, pool, max_batch)
        out.append(([s.rid for s in plan.running], [s.rid for s in plan.waiting], [s.rid for s in plan.admitted],
                    sorted(s.rid for s in plan.preempted), [(s.rid, s.arrival) for s in running + waiting],
                    _pool_summary(pool)))
    return out


WITNESS = {
    "pn_held_as_tokens": lambda f: [f(n, h, 4) for n in range(0, 13) for h in range(0, 4)],
    "gr_victim_latest_arrival": _w_grow, "gr_reserve_pages_needed": _w_grow_no_fresh_page,
    "ad_running_from_pool": _w_admit,
    "ss_preempted_rearrive": _w_sched, "ss_plan_waiting_unsorted": _w_sched,
    "pr_float_admitted": lambda f: [type(x).__name__ for x in f()],
}
