# ruff: noqa: E501, B007, F841
"""Round 2 of fresh wrong answers for lab 09 (a scheduler that pages on demand), written from the lab's
text and its solution only. Each wrong answer is the solution with one student's edit (its docstring
says which). WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
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


# pages_needed: pn_floor
def pn_floor(n_tokens, pages_held, page_size):
    """Floor instead of ceiling."""
    """Fresh pages a sequence holding `pages_held` pages needs to hold `n_tokens` tokens (never < 0)."""
    return max(0, n_tokens // page_size - pages_held)


# pages_needed: pn_negative
def pn_negative(n_tokens, pages_held, page_size):
    """No max(0, ·)."""
    """Fresh pages a sequence holding `pages_held` pages needs to hold `n_tokens` tokens (never < 0)."""
    return -(-n_tokens // page_size) - pages_held


# pages_needed: pn_floor_plus_one
def pn_floor_plus_one(n_tokens, pages_held, page_size):
    """n // page_size + 1 (one too many when it divides)."""
    """Fresh pages a sequence holding `pages_held` pages needs to hold `n_tokens` tokens (never < 0)."""
    return max(0, n_tokens // page_size + 1 - pages_held)


# pages_needed: pn_held_ignored
def pn_held_ignored(n_tokens, pages_held, page_size):
    """Ignored the pages held."""
    """Fresh pages a sequence holding `pages_held` pages needs to hold `n_tokens` tokens (never < 0)."""
    return -(-n_tokens // page_size)


# pages_needed: pn_last_token_cached
def pn_last_token_cached(n_tokens, pages_held, page_size):
    """Counted n − 1 tokens (the last one is not cached yet)."""
    """Fresh pages a sequence holding `pages_held` pages needs to hold `n_tokens` tokens (never < 0)."""
    return max(0, -(-(n_tokens - 1) // page_size) - pages_held)


# grow: gr_preempt_oldest
def gr_preempt_oldest(running, pool):
    """Preempted the first (oldest) request."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop(0)                      # the most recently admitted
        needs.pop(0)
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# grow: gr_preempt_longest
def gr_preempt_longest(running, pool):
    """Preempted the request holding the most pages."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        i = max(range(len(kept)), key=lambda j: len(pool.pages_of(kept[j].rid)))
        victim = kept.pop(i)
        needs.pop(i)
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# grow: gr_victim_not_freed
def gr_victim_not_freed(running, pool):
    """Forgot pool.free(victim): its pages leak."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()                      # the most recently admitted
        needs.pop()
        pass                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# grow: gr_needs_not_popped
def gr_needs_not_popped(running, pool):
    """needs not updated after a preemption."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()                      # the most recently admitted
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# grow: gr_preempt_on_exact_fit
def gr_preempt_on_exact_fit(running, pool):
    """>= instead of >: preempts when the pages fit exactly."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) >= pool.num_free_pages:
        victim = kept.pop()                      # the most recently admitted
        needs.pop()
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# grow: gr_one_page_each
def gr_one_page_each(running, pool):
    """Assumed every request needs one fresh page."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [1 for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()                      # the most recently admitted
        needs.pop()
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# grow: gr_room_for_next_token
def gr_room_for_next_token(running, pool):
    """Counted room for len(tokens) + 1 tokens."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens) + 1, len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()                      # the most recently admitted
        needs.pop()
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# grow: gr_free_pages_own_counter
def gr_free_pages_own_counter(running, pool):
    """Kept its own free count, not updated by the frees."""
    """Room for one more token for each running request, preempting the most recent ones if the pool
    is short. Returns (kept, preempted); kept keeps the admission order."""
    kept, preempted = list(running), []
    needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    free = pool.num_free_pages
    while kept and sum(needs) > free:
        victim = kept.pop()                      # the most recently admitted
        needs.pop()
        pool.free(victim.rid)                    # its pages go back; it will be recomputed
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# admit: ad_overtaking
def ad_overtaking(waiting, n_running, pool, max_batch):
    """Skips a request that does not fit and admits later ones."""
    """Admit requests from the front of `waiting` while a batch slot and their pages are free."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            continue
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))       # prompt + generated: a resumed request is recomputed
        admitted.append(s)
    return admitted


# admit: ad_batch_off_by_one
def ad_batch_off_by_one(waiting, n_running, pool, max_batch):
    """> instead of >=: one request past max_batch."""
    """Admit requests from the front of `waiting` while a batch slot and their pages are free."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) > max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break                                # first come, first served: no overtaking
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))       # prompt + generated: a resumed request is recomputed
        admitted.append(s)
    return admitted


# admit: ad_prompt_only
def ad_prompt_only(waiting, n_running, pool, max_batch):
    """Pages for the prompt only (a resumed request's generated tokens forgotten)."""
    """Admit requests from the front of `waiting` while a batch slot and their pages are free."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.prompt), 0, pool.page_size) > pool.num_free_pages:
            break                                # first come, first served: no overtaking
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.prompt))       # prompt + generated: a resumed request is recomputed
        admitted.append(s)
    return admitted


# admit: ad_reserve_one_less
def ad_reserve_one_less(waiting, n_running, pool, max_batch):
    """Reserved len(tokens) − 1 (as if the last token were cached later)."""
    """Admit requests from the front of `waiting` while a batch slot and their pages are free."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens) - 1, 0, pool.page_size) > pool.num_free_pages:
            break                                # first come, first served: no overtaking
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens) - 1)       # prompt + generated: a resumed request is recomputed
        admitted.append(s)
    return admitted


# admit: ad_running_ignored
def ad_running_ignored(waiting, n_running, pool, max_batch):
    """Batch limit on the admitted only."""
    """Admit requests from the front of `waiting` while a batch slot and their pages are free."""
    admitted = []
    for s in waiting:
        if len(admitted) >= max_batch:
            break
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break                                # first come, first served: no overtaking
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))       # prompt + generated: a resumed request is recomputed
        admitted.append(s)
    return admitted


# admit: ad_added_before_check
def ad_added_before_check(waiting, n_running, pool, max_batch):
    """add_sequence before the page check: a request that does not fit stays in the pool."""
    """Admit requests from the front of `waiting` while a batch slot and their pages are free."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        pool.add_sequence(s.rid)
        if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.reserve(s.rid, len(s.tokens))       # prompt + generated: a resumed request is recomputed
        admitted.append(s)
    return admitted


# scheduler: ss_preempted_first
def ss_preempted_first(running, waiting, pool, max_batch):
    """Preempted requests put at the front of the queue."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = preempted + sorted(waiting, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# scheduler: ss_sorted_by_rid
def ss_sorted_by_rid(running, waiting, pool, max_batch):
    """Queue sorted by request id."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=lambda s: s.rid)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# scheduler: ss_arrival_ties_by_position
def ss_arrival_ties_by_position(running, waiting, pool, max_batch):
    """Sorted by arrival only (ties keep list order, not rid)."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=lambda s: s.arrival)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# scheduler: ss_n_running_before_grow
def ss_n_running_before_grow(running, waiting, pool, max_batch):
    """Admitted with the count before preemption."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(running), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# scheduler: ss_admitted_first
def ss_admitted_first(running, waiting, pool, max_batch):
    """running = admitted + kept."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=admitted + kept, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# scheduler: ss_preempted_dropped
def ss_preempted_dropped(running, waiting, pool, max_batch):
    """Preempted requests never requeued."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# scheduler: ss_admit_then_grow
def ss_admit_then_grow(running, waiting, pool, max_batch):
    """Admitted before growing."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    queue = sorted(waiting, key=queue_order)
    admitted = admit(queue, len(running), pool, max_batch)
    kept, preempted = grow(running, pool)
    queue = sorted(queue + preempted, key=queue_order)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# prediction: pd_floor_pages
def pd_floor_pages():
    """21 // 8 = 2 pages a prompt."""
    """(requests admitted at step 0, step of the first preemption, requests preempted at that step)."""
    pages_per_prompt = 21 // 8               # 3 pages for 21 tokens
    admitted = min(8, 20 // pages_per_prompt)    # 6 requests, 18 pages, 2 left
    # after step s a request has 21 + s + 1 tokens; at step s it needs room for 21 + s of them:
    # 25 tokens (a 4th page) at s = 4, for all six at once, with 2 pages free
    first_step = 25 - 21
    preempted = 1                                # the last one frees 3 pages: 5 needed, 5 free
    return admitted, first_step, preempted


# prediction: pd_step_off_by_one
def pd_step_off_by_one():
    """First preemption one step late."""
    """(requests admitted at step 0, step of the first preemption, requests preempted at that step)."""
    pages_per_prompt = -(-21 // 8)               # 3 pages for 21 tokens
    admitted = min(8, 20 // pages_per_prompt)    # 6 requests, 18 pages, 2 left
    # after step s a request has 21 + s + 1 tokens; at step s it needs room for 21 + s of them:
    # 25 tokens (a 4th page) at s = 4, for all six at once, with 2 pages free
    first_step = 25 - 21 + 1
    preempted = 1                                # the last one frees 3 pages: 5 needed, 5 free
    return admitted, first_step, preempted


# prediction: pd_two_preempted
def pd_two_preempted():
    """Two preempted."""
    """(requests admitted at step 0, step of the first preemption, requests preempted at that step)."""
    pages_per_prompt = -(-21 // 8)               # 3 pages for 21 tokens
    admitted = min(8, 20 // pages_per_prompt)    # 6 requests, 18 pages, 2 left
    # after step s a request has 21 + s + 1 tokens; at step s it needs room for 21 + s of them:
    # 25 tokens (a 4th page) at s = 4, for all six at once, with 2 pages free
    first_step = 25 - 21
    preempted = 2                                # the last one frees 3 pages: 5 needed, 5 free
    return admitted, first_step, preempted


# prediction: pd_step_at_page_end
def pd_step_at_page_end():
    """Preemption when a request reaches 24 tokens."""
    """(requests admitted at step 0, step of the first preemption, requests preempted at that step)."""
    pages_per_prompt = -(-21 // 8)               # 3 pages for 21 tokens
    admitted = min(8, 20 // pages_per_prompt)    # 6 requests, 18 pages, 2 left
    # after step s a request has 21 + s + 1 tokens; at step s it needs room for 21 + s of them:
    # 25 tokens (a 4th page) at s = 4, for all six at once, with 2 pages free
    first_step = 24 - 21
    preempted = 1                                # the last one frees 3 pages: 5 needed, 5 free
    return admitted, first_step, preempted


# scheduler: ss_admitted_left_waiting
def ss_admitted_left_waiting(running, waiting, pool, max_batch):
    """Admitted requests left in the waiting list."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=queue,
                    admitted=admitted, preempted=preempted)


# scheduler: ss_admitted_not_running
def ss_admitted_not_running(running, waiting, pool, max_batch):
    """running = kept (admitted forgotten)."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# scheduler: ss_preempted_still_running
def ss_preempted_still_running(running, waiting, pool, max_batch):
    """running = the old list + admitted (preempted kept in it)."""
    """One step: grow (preempting if needed), requeue the preempted by arrival, admit."""
    kept, preempted = grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=running + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


WRONG = {
    "pages_needed": [pn_floor, pn_negative, pn_floor_plus_one, pn_held_ignored, pn_last_token_cached],
    "grow": [gr_preempt_oldest, gr_preempt_longest, gr_victim_not_freed, gr_needs_not_popped, gr_preempt_on_exact_fit, gr_one_page_each, gr_room_for_next_token, gr_free_pages_own_counter],
    "admit": [ad_overtaking, ad_batch_off_by_one, ad_prompt_only, ad_reserve_one_less, ad_running_ignored, ad_added_before_check],
    "scheduler": [ss_preempted_first, ss_sorted_by_rid, ss_arrival_ties_by_position, ss_n_running_before_grow, ss_admitted_first, ss_preempted_dropped, ss_admit_then_grow, ss_admitted_left_waiting, ss_admitted_not_running, ss_preempted_still_running],
    "prediction": [pd_floor_pages, pd_step_off_by_one, pd_two_preempted, pd_step_at_page_end],
}
SOLUTION = {"pages_needed": pages_needed, "grow": grow, "admit": admit, "scheduler": scheduler_step,
            "prediction": predict}
CORRECT = {k: [v] for k, v in SOLUTION.items()}


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
    # (pages, sequences): short by 2 pages; an exact fit; requests that need 0 pages beside ones that need 1
    for pages, shapes in ((7, [(8, 1), (4, 5), (2, 7)]), (9, [(8, 1), (4, 5), (2, 7)]),
                          (8, [(5, 1), (8, 1), (3, 0), (6, 3)]), (8, [(12, 1), (3, 1), (4, 1)]),
                          (6, [(8, 1), (4, 5), (2, 7)]), (9, [(5, 1), (8, 1), (3, 0), (6, 3)]), (5, [(7, 1), (6, 2)])):
        pool = PageTables(num_pages=pages, page_size=4)
        seqs = _running(pool, [_seq(i, p, g) for i, (p, g) in enumerate(shapes)])
        kept, pre = f(seqs, pool)
        out.append(([s.rid for s in kept], sorted(s.rid for s in pre), _pool_summary(pool)))
    return out


def _w_admit(f):
    out = []
    for pages, n_running, max_batch in ((6, 0, 8), (6, 1, 3), (12, 2, 4)):
        pool = PageTables(num_pages=pages, page_size=4)
        waiting = [_seq(10, 5, 0), _seq(11, 6, 3), _seq(12, 9, 0), _seq(13, 2, 0)]
        adm = f(waiting, n_running, pool, max_batch)
        out.append(([s.rid for s in adm], _pool_summary(pool)))
    return out


def _w_sched(f):
    out = []
    for pages, max_batch in ((6, 4), (6, 3), (8, 4)):
        pool = PageTables(num_pages=pages, page_size=4)
        running = _running(pool, [_seq(5, 8, 1, arrival=0), _seq(2, 4, 1, arrival=1), _seq(9, 4, 1, arrival=2)])
        waiting = [_seq(7, 2, 0, arrival=1), _seq(3, 2, 0, arrival=3), _seq(1, 2, 0, arrival=3)]
        plan = f(running, waiting, pool, max_batch)
        out.append(([s.rid for s in plan.running], [s.rid for s in plan.waiting], [s.rid for s in plan.admitted],
                    sorted(s.rid for s in plan.preempted), _pool_summary(pool)))
    return out


WITNESS = {
    **{n.__name__: (lambda f: [f(n, h, 4) for n in range(0, 13) for h in range(0, 4)]) for n in WRONG["pages_needed"]},
    **{n.__name__: _w_grow for n in WRONG["grow"]},
    **{n.__name__: _w_admit for n in WRONG["admit"]},
    **{n.__name__: _w_sched for n in WRONG["scheduler"]},
    **{n.__name__: (lambda f: f()) for n in WRONG["prediction"]},
}
