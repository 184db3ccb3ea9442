"""Round 3 of fresh wrong answers for lab 09 (a scheduler that pages on demand), written from the lab's text
and its solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py."""
import math

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


def pn_abs(n_tokens, pages_held, page_size):
    """Exercise 1. abs(...) to keep it 'never negative': a sequence holding spare pages is said to need some."""
    return abs(-(-n_tokens // page_size) - pages_held)


# ---------------------------------------------------------------- exercise 2


def gr_double_free(running, pool):
    """Exercise 2. Frees each victim in the loop, then 'cleans up' by freeing every preempted request again."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    for s in preempted:
        pool.free(s.rid)
    return kept, preempted


def gr_reserve_all_tokens(running, pool):
    """Exercise 2. pool.reserve(rid, len(s.tokens)) ('room for all its tokens') where reserve takes the number
    of MORE tokens: each kept request's length doubles."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, len(s.tokens))
    return kept, preempted


def gr_kept_reversed(running, pool):
    """Exercise 2. Walks the requests newest first to pick victims and builds `kept` as it goes: kept comes
    back newest first, not in admission order."""
    kept, preempted = [], []
    needs = {s.rid: pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in running}
    total = sum(needs.values())
    for s in reversed(running):
        if total > pool.num_free_pages:
            total -= needs[s.rid]
            pool.free(s.rid)
            preempted.append(s)
        else:
            kept.append(s)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# ---------------------------------------------------------------- exercise 3


def ad_room_for_next(waiting, n_running, pool, max_batch):
    """Exercise 3. Reserves len(tokens) + 1 ('and the token it will generate')."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens) + 1, 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens) + 1)
        admitted.append(s)
    return admitted


def ad_batch_ignores_admitted(waiting, n_running, pool, max_batch):
    """Exercise 3. Batch test n_running >= max_batch: the requests admitted in this call are not counted."""
    admitted = []
    for s in waiting:
        if n_running >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


# ---------------------------------------------------------------- exercise 4


def ss_running_by_arrival(running, waiting, pool, max_batch):
    """Exercise 4. running sorted by queue_order (arrival) instead of kept + admitted in admission order:
    the next preemption may take an old request."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=sorted(kept + admitted, key=queue_order), waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# ---------------------------------------------------------------- exercise 5


def pr_worst_case_admission():
    """Exercise 5. Admits by prompt + max_new_tokens (45 tokens, 6 pages: 3 requests), the worst-case rule."""
    return 20 // math.ceil((21 + 24) / 8), 25 - 21, 1


# ---------------------------------------------------------------- correct alternatives


def pages_needed_ceil(n_tokens, pages_held, page_size):
    """Exercise 1, correct: math.ceil of the exact quotient, clamped at 0."""
    return max(0, math.ceil(n_tokens / page_size) - pages_held)


WRONG = {
    "pages_needed": [pn_abs],
    "grow": [gr_double_free, gr_reserve_all_tokens, gr_kept_reversed],
    "admit": [ad_room_for_next, ad_batch_ignores_admitted],
    "scheduler": [ss_running_by_arrival],
    "prediction": [pr_worst_case_admission],
}
CORRECT = {"pages_needed": [pages_needed, pages_needed_ceil]}


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
    out = []
    for pages, shapes in ((7, [(8, 1), (4, 5), (2, 7)]), (9, [(8, 1), (4, 5), (2, 7)]), (12, [(3, 1), (5, 2), (7, 1)])):
        pool = PageTables(num_pages=pages, page_size=4)
        seqs = _running(pool, [_seq(i, p, g) for i, (p, g) in enumerate(shapes)])
        try:
            kept, pre = f(seqs, pool)
        except ValueError as exc:
            out.append(("ValueError", str(exc)))
            continue
        out.append(([s.rid for s in kept], sorted(s.rid for s in pre), _pool_summary(pool)))
    return out


def _w_admit(f):
    out = []
    for pages, n_running, max_batch in ((6, 0, 8), (6, 1, 3), (12, 2, 4), (40, 1, 3)):
        pool = PageTables(num_pages=pages, page_size=4)
        waiting = [_seq(10, 5, 0), _seq(11, 6, 2), _seq(12, 9, 0), _seq(13, 2, 0)]
        adm = f(waiting, n_running, pool, max_batch)
        out.append(([s.rid for s in adm], _pool_summary(pool)))
    return out


def _w_sched(f):
    out = []
    for pages, max_batch in ((6, 4), (20, 6)):
        pool = PageTables(num_pages=pages, page_size=4)
        running = _running(pool, [_seq(5, 8, 1, arrival=2), _seq(2, 4, 1, arrival=0)])
        waiting = [_seq(7, 2, 0, arrival=1), _seq(3, 2, 0, arrival=3)]
        plan = f(running, waiting, pool, max_batch)
        out.append(([s.rid for s in plan.running], [s.rid for s in plan.waiting], [s.rid for s in plan.admitted],
                    sorted(s.rid for s in plan.preempted), _pool_summary(pool)))
    return out


WITNESS = {
    "pn_abs": lambda f: [f(n, h, 4) for n in range(0, 13) for h in range(0, 4)],
    "gr_double_free": _w_grow, "gr_reserve_all_tokens": _w_grow, "gr_kept_reversed": _w_grow,
    "ad_room_for_next": _w_admit, "ad_batch_ignores_admitted": _w_admit,
    "ss_running_by_arrival": _w_sched,
    "pr_worst_case_admission": lambda f: f(),
}
