"""Round 4 of fresh wrong answers for lab 09 (a scheduler that pages on demand), written from the lab's text
and its solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: a boundary at zero tokens, a function that changes the caller's list (by aliasing it, by
removing from it while iterating, by sorting it in place), a page test that refuses an exact fit, and a queue
sorted only on the steps that preempt."""
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


def pn_at_least_one_page(n_tokens, pages_held, page_size):
    """Exercise 1. max(1, ceil(n / page_size)) pages ('every sequence needs at least one page'): a sequence of
    0 tokens holding no page is said to need one."""
    return max(0, max(1, -(-n_tokens // page_size)) - pages_held)


# ---------------------------------------------------------------- exercise 2


def gr_aliases_running(running, pool):
    """Exercise 2. kept = running (no copy): the pops that preempt shorten the caller's own list of running
    requests."""
    kept, preempted = running, []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# ---------------------------------------------------------------- exercise 3


def ad_remove_while_iterating(waiting, n_running, pool, max_batch):
    """Exercise 3. Removes each admitted request from `waiting` inside the `for s in waiting` loop ('the queue
    should shrink'): the loop then skips the request after each one admitted, so later requests overtake it,
    and the caller's queue is changed."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
        waiting.remove(s)
    return admitted


def ad_exact_fit_refused(waiting, n_running, pool, max_batch):
    """Exercise 3. Stops when the pages needed are >= the free pages ('keep one spare'): a request whose pages
    are exactly the free ones is not admitted."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) >= pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


# ---------------------------------------------------------------- exercise 4


def ss_sorts_callers_queue(running, waiting, pool, max_batch):
    """Exercise 4. waiting.extend(preempted); waiting.sort(...) ('no copy'): the plan is right, but the caller's
    waiting list is changed (it now holds the preempted requests, and the admitted ones stay in it)."""
    kept, preempted = grow(running, pool)
    waiting.extend(preempted)
    waiting.sort(key=queue_order)
    queue = waiting
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def ss_sorts_only_on_preemption(running, waiting, pool, max_batch):
    """Exercise 4. Sorts the queue only when something was preempted ('otherwise it is already in order'): a
    waiting list that arrives out of order is served in the order given."""
    kept, preempted = grow(running, pool)
    queue = waiting + preempted
    if preempted:
        queue = sorted(queue, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# ---------------------------------------------------------------- correct alternatives


def pages_from_tokens_left(n_tokens, pages_held, page_size):
    """Exercise 1, correct: the tokens the held pages do not cover, rounded up to pages, never below 0."""
    uncovered = n_tokens - pages_held * page_size
    return 0 if uncovered <= 0 else (uncovered + page_size - 1) // page_size


def grow_need_from_length(running, pool):
    """Exercise 2, correct: each need from the cached length plus the one token to add, victims taken from a
    copy with index arithmetic."""
    kept = running[:]
    needs = [pages_needed(pool.length(s.rid) + 1, len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    n = len(kept)
    while n > 0 and sum(needs[:n]) > pool.num_free_pages:
        n -= 1
        pool.free(kept[n].rid)
    preempted = kept[n:][::-1]
    kept = kept[:n]
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


WRONG = {
    "pages_needed": [pn_at_least_one_page],
    "grow": [gr_aliases_running],
    "admit": [ad_remove_while_iterating, ad_exact_fit_refused],
    "scheduler": [ss_sorts_callers_queue, ss_sorts_only_on_preemption],
}
CORRECT = {"pages_needed": [pages_needed, pages_from_tokens_left], "grow": [grow, grow_need_from_length]}


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


def _w_grow_caller(f):
    pool = PageTables(num_pages=7, page_size=4)
    seqs = _running(pool, [_seq(i, p, g) for i, (p, g) in enumerate([(8, 1), (4, 5), (2, 7)])])
    kept, pre = f(seqs, pool)
    return [s.rid for s in kept], [s.rid for s in pre], [s.rid for s in seqs], _pool_summary(pool)


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
    for pages, max_batch in ((6, 4), (20, 6)):
        pool = PageTables(num_pages=pages, page_size=4)
        running = _running(pool, [_seq(5, 8, 1, arrival=2), _seq(2, 4, 1, arrival=0)])
        waiting = [_seq(7, 2, 0, arrival=3), _seq(3, 2, 0, arrival=1)]
        plan = f(running, waiting, pool, max_batch)
        out.append(([s.rid for s in plan.running], [s.rid for s in plan.waiting], [s.rid for s in plan.admitted],
                    sorted(s.rid for s in plan.preempted), [s.rid for s in waiting], _pool_summary(pool)))
    return out


WITNESS = {
    "pn_at_least_one_page": lambda f: [f(n, h, 4) for n in range(0, 13) for h in range(0, 4)],
    "gr_aliases_running": _w_grow_caller,
    "ad_remove_while_iterating": _w_admit, "ad_exact_fit_refused": _w_admit,
    "ss_sorts_callers_queue": _w_sched, "ss_sorts_only_on_preemption": _w_sched,
}
