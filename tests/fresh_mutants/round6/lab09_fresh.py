"""Round 6 of fresh wrong answers for lab 09 (a scheduler that pages on demand), written from the lab's text
and its solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in round 5. New classes
here: a count allowed to go negative, a victim's need still counted after it is preempted, room for one token
more than the rule, the free-page count read once and never updated (in grow and in admit), an admitted
request given room for all but its last token, a queue sorted by arrival alone (ties kept in the list's
order), the preempted put at the front of the queue (as lesson 9's engine does), the batch count taken
before preemption, the admitted placed before the kept, a step counted from 1, and a batch filled by the
batch limit alone. The correct answers: pages by math.ceil, a grow that recomputes the sum of needs after
each victim, and a queue sorted with an explicit (arrival, rid) key."""
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


def pn_negative_allowed(n_tokens, pages_held, page_size):
    """Exercise 1. The clamp at 0 left out ('a sequence never holds more than it needs'): a sequence holding
    more pages than its tokens fill gets a negative count; the lab says never negative."""
    return -(-n_tokens // page_size) - pages_held


# ---------------------------------------------------------------- exercise 2


def gr_victim_need_still_counted(running, pool):
    """Exercise 2. The victim popped from kept but its need left in the sum ('needs is only for the test'):
    its pages are freed but its need still counts, so more requests are preempted than the rule asks."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs[:len(kept)] + needs[len(kept):]) > pool.num_free_pages:
        victim = kept.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def gr_need_one_token_more(running, pool):
    """Exercise 2. Each need counted for len(tokens) + 1 tokens ('room for the next token too'): a request
    whose last page is exactly full is charged a page it does not need yet, and others are preempted."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens) + 1, len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def gr_free_read_once(running, pool):
    """Exercise 2. The free-page count read once before the loop ('it is a number'): the pages a victim gives
    back are never counted, so one preemption short leads to preempting every request."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    free = pool.num_free_pages
    while kept and sum(needs) > free:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# ---------------------------------------------------------------- exercise 3


def ad_free_read_once(waiting, n_running, pool, max_batch):
    """Exercise 3. The free-page count read once before the loop: every request is compared with the pages
    free at the start, so a second one is admitted into pages the first already took (reserve then raises)."""
    admitted = []
    free = pool.num_free_pages
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > free:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


def ad_reserve_all_but_last(waiting, n_running, pool, max_batch):
    """Exercise 3. An admitted request given room for len(tokens) − 1 tokens ('a running request has cached all
    its tokens but the last'): after the step the lab wants room for all of them."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens) - 1)
        admitted.append(s)
    return admitted


# ---------------------------------------------------------------- exercise 4


def ss_sorted_by_arrival_only(running, waiting, pool, max_batch):
    """Exercise 4. The queue sorted by arrival alone ('first come, first served'): requests that arrived at the
    same step keep the shuffled order of the lists, not the order of their ids."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=lambda s: s.arrival)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def ss_preempted_first(running, waiting, pool, max_batch):
    """Exercise 4. The preempted put at the front of the queue, then the waiting ones by arrival (as lesson 9's
    engine does): this lab orders them all together by arrival."""
    kept, preempted = grow(running, pool)
    queue = preempted + sorted(waiting, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def ss_count_before_preemption(running, waiting, pool, max_batch):
    """Exercise 4. admit given len(running) ('the requests that were running'): after a preemption the freed
    batch slots are not offered to the queue."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(running), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def ss_admitted_before_kept(running, waiting, pool, max_batch):
    """Exercise 4. running = admitted + kept ('new requests first'): the plan's running is no longer in admission
    order, so the next preemption takes an old request instead of the newest."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=admitted + kept, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# ---------------------------------------------------------------- exercise 5


def pr_step_counted_from_one():
    """Exercise 5. The first preemption's step counted from 1 ('the fifth step'): 5 where steps start at 0."""
    return 6, 5, 1


def pr_admitted_by_batch_only():
    """Exercise 5. Step 0 admits max_batch = 8 ('eight slots, eight requests'): 8 prompts need 24 pages of 20."""
    return 8, 4, 1


# ---------------------------------------------------------------- correct alternatives


def pages_needed_math_ceil(n_tokens, pages_held, page_size):
    """Exercise 1, correct: math.ceil of the true division (exact for any realistic count of tokens)."""
    return max(0, math.ceil(n_tokens / page_size) - pages_held)


def grow_recount(running, pool):
    """Exercise 2, correct: the needs of the kept requests recomputed after each preemption (the pool's count
    read again each time)."""
    kept, preempted = list(running), []

    def short():
        need = sum(pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept)
        return need > pool.num_free_pages

    while kept and short():
        victim = kept[-1]
        kept = kept[:-1]
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def step_explicit_key(running, waiting, pool, max_batch):
    """Exercise 4, correct: the queue sorted with the key (arrival, rid) written out."""
    kept, preempted = grow(running, pool)
    queue = sorted([*waiting, *preempted], key=lambda s: (s.arrival, s.rid))
    admitted = admit(queue, len(kept), pool, max_batch)
    left = [s for s in queue if all(s is not a for a in admitted)]
    return StepPlan(running=[*kept, *admitted], waiting=left, admitted=admitted, preempted=preempted)


WRONG = {
    "pages_needed": [pn_negative_allowed],
    "grow": [gr_victim_need_still_counted, gr_need_one_token_more, gr_free_read_once],
    "admit": [ad_free_read_once, ad_reserve_all_but_last],
    "scheduler": [ss_sorted_by_arrival_only, ss_preempted_first, ss_count_before_preemption, ss_admitted_before_kept],
    "prediction": [pr_step_counted_from_one, pr_admitted_by_batch_only],
}
CORRECT = {"pages_needed": [pages_needed, pages_needed_math_ceil], "grow": [grow, grow_recount],
           "scheduler": [scheduler_step, step_explicit_key]}


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


def _w_grow_fit(f):
    """Three running requests of 12, 8 and 4 cached tokens (page size 4), the newest the smallest: every last
    page exactly full, each needs a fresh page, with 1 to 3 pages free."""
    out = []
    for extra in (1, 2, 3):
        pool = PageTables(num_pages=2 + 1 + 3 + extra, page_size=4)
        seqs = _running(pool, [_seq(1, 12, 1, arrival=0), _seq(2, 8, 1, arrival=1), _seq(3, 4, 1, arrival=2)])
        kept, pre = f(seqs, pool)
        out.append(([s.rid for s in kept], [s.rid for s in pre], _pool_summary(pool)))
    return out


def _w_grow_one_more(f):
    """Requests of 8 tokens that cached 7 (page size 4): the 8th fits their second page, a 9th would not."""
    pool = PageTables(num_pages=7, page_size=4)
    seqs = _running(pool, [_seq(1, 7, 1, arrival=0), _seq(2, 7, 1, arrival=1), _seq(3, 7, 1, arrival=2)])
    kept, pre = f(seqs, pool)
    return [s.rid for s in kept], [s.rid for s in pre], _pool_summary(pool)


def _w_admit_catch(f):
    try:
        return _w_admit(f)
    except Exception as exc:  # an admit that overruns the pool raises where the solution does not
        return type(exc).__name__


def _w_sched_ties(f):
    """Waiting requests that arrived at the same step, listed with their ids out of order."""
    pool = PageTables(num_pages=8, page_size=4)
    running = _running(pool, [_seq(5, 8, 1, arrival=0)])
    waiting = [_seq(9, 4, 0, arrival=1), _seq(4, 4, 0, arrival=1), _seq(7, 4, 0, arrival=1)]
    plan = f(running, waiting, pool, 3)
    return [s.rid for s in plan.running], [s.rid for s in plan.waiting], _pool_summary(pool)


def _w_sched_preempt(f):
    """A preempted request (arrival 5) and a waiting one that arrived before it (arrival 1); one batch slot
    freed by the preemption."""
    pool = PageTables(num_pages=4, page_size=4)
    running = _running(pool, [_seq(1, 8, 1, arrival=0), _seq(2, 4, 1, arrival=5)])
    waiting = [_seq(3, 2, 0, arrival=1)]
    plan = f(running, waiting, pool, 2)
    return ([s.rid for s in plan.running], [s.rid for s in plan.waiting], [s.rid for s in plan.admitted],
            _pool_summary(pool))


WITNESS = {
    "pn_negative_allowed": lambda f: [f(n, h, 4) for n in range(0, 13) for h in range(0, 4)],
    "gr_victim_need_still_counted": _w_grow_fit, "gr_need_one_token_more": _w_grow_one_more,
    "gr_free_read_once": _w_grow_fit,
    "ad_free_read_once": _w_admit_catch, "ad_reserve_all_but_last": _w_admit,
    "ss_sorted_by_arrival_only": _w_sched_ties, "ss_preempted_first": _w_sched_preempt,
    "ss_count_before_preemption": _w_sched_preempt, "ss_admitted_before_kept": _w_sched,
    "pr_step_counted_from_one": lambda f: f(), "pr_admitted_by_batch_only": lambda f: f(),
}
