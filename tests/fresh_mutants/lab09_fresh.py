"""Fresh wrong answers (and alternative correct answers) for lab 09, written from the student notebook
and the solutions only. Each function's docstring names the exercise it answers and the mistake."""
from attnkit.classroom.labchecks.lab09 import StepPlan, queue_order


def _need(n_tokens, pages_held, page_size):
    return max(0, -(-n_tokens // page_size) - pages_held)


def _grow(running, pool):
    kept, preempted = list(running), []
    needs = [_need(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def _admit(waiting, n_running, pool, max_batch):
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if _need(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


# ---------------------------------------------------------------- exercise 1: pages_needed
def pages_floor(n_tokens, pages_held, page_size):
    """Exercise 1. Floor division: a partly filled page is not counted."""
    return max(0, n_tokens // page_size - pages_held)


def pages_can_be_negative(n_tokens, pages_held, page_size):
    """Exercise 1. Forgets the max(0, ...): a sequence holding spare pages 'needs' a negative number."""
    return -(-n_tokens // page_size) - pages_held


def pages_plus_one_token(n_tokens, pages_held, page_size):
    """Exercise 1. Counts room for n_tokens + 1 (one token too many)."""
    return max(0, -(-(n_tokens + 1) // page_size) - pages_held)


def pages_float_ceil(n_tokens, pages_held, page_size):
    """Exercise 1. Returns a float (n / page_size rounded up with math.ceil on a float, minus held, as float)."""
    import math
    return max(0.0, math.ceil(n_tokens / page_size) - pages_held * 1.0)


# ---------------------------------------------------------------- exercise 2: grow
def grow_preempts_oldest(running, pool):
    """Exercise 2. Preempts the first (oldest) request instead of the most recent."""
    kept, preempted = list(running), []
    needs = [_need(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop(0)
        needs.pop(0)
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def grow_keeps_victim_need(running, pool):
    """Exercise 2. Pops the victim but leaves its need in the sum (preempts more than necessary)."""
    kept, preempted = list(running), []
    needs = [_need(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        pool.free(victim.rid)
        preempted.append(victim)
        if not kept:
            break
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def grow_preempts_once(running, pool):
    """Exercise 2. `if` instead of `while`: preempts at most one request per step."""
    kept, preempted = list(running), []
    needs = [_need(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    if kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        if _need(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) <= pool.num_free_pages:
            pool.reserve(s.rid, 1)
    return kept, preempted


def grow_counts_next_token(running, pool):
    """Exercise 2. Counts room for len(tokens) + 1 tokens (the token after next)."""
    kept, preempted = list(running), []
    needs = [_need(len(s.tokens) + 1, len(pool.pages_of(s.rid)), pool.page_size) for s in kept]
    while kept and sum(needs) > pool.num_free_pages:
        victim = kept.pop()
        needs.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def grow_preempts_longest(running, pool):
    """Exercise 2. Preempts the request holding the most pages (frees most) instead of the newest."""
    kept, preempted = list(running), []
    while kept and sum(_need(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size)
                       for s in kept) > pool.num_free_pages:
        victim = max(kept, key=lambda s: len(pool.pages_of(s.rid)))
        kept.remove(victim)
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


# ---------------------------------------------------------------- exercise 3: admit
def admit_overtakes(waiting, n_running, pool, max_batch):
    """Exercise 3. `continue` past a request that does not fit (a later, smaller one overtakes)."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if _need(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            continue
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


def admit_batch_off_by_one(waiting, n_running, pool, max_batch):
    """Exercise 3. Admits while n_running + admitted <= max_batch (one request too many)."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) > max_batch:
            break
        if _need(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


def admit_prompt_only(waiting, n_running, pool, max_batch):
    """Exercise 3. Reserves the prompt only (a resumed request's generated tokens are not recomputed)."""
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if _need(len(s.prompt), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.prompt))
        admitted.append(s)
    return admitted


def admit_ignores_running(waiting, n_running, pool, max_batch):
    """Exercise 3. Counts only the newly admitted against max_batch (ignores n_running)."""
    admitted = []
    for s in waiting:
        if len(admitted) >= max_batch:
            break
        if _need(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


# ---------------------------------------------------------------- exercise 4: scheduler_step
def step_no_requeue_order(running, waiting, pool, max_batch):
    """Exercise 4. Appends the preempted to the end of the queue (no queue_order sort)."""
    kept, preempted = _grow(running, pool)
    queue = waiting + preempted
    admitted = _admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def step_preempted_first(running, waiting, pool, max_batch):
    """Exercise 4. Puts the preempted at the front of the queue (the engine's rule, not this lab's)."""
    kept, preempted = _grow(running, pool)
    queue = preempted + waiting
    admitted = _admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def step_admitted_before_kept(running, waiting, pool, max_batch):
    """Exercise 4. running = admitted + kept (the next preemption takes an old request)."""
    kept, preempted = _grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = _admit(queue, len(kept), pool, max_batch)
    return StepPlan(running=admitted + kept, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def step_counts_old_running(running, waiting, pool, max_batch):
    """Exercise 4. Admits with len(running) (before preemption) as the number running."""
    kept, preempted = _grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = _admit(queue, len(running), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


def step_readmits_same_step(running, waiting, pool, max_batch):
    """Exercise 4. Sorts the queue, but a request preempted this step may not be admitted: it filters the
    preempted out of the admission and keeps them waiting (a rule the lab does not state)."""
    kept, preempted = _grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    candidates = [s for s in queue if s not in preempted]
    admitted = _admit(candidates, len(kept), pool, max_batch)
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s not in admitted],
                    admitted=admitted, preempted=preempted)


# ---------------------------------------------------------------- exercise 5: predict
def predict_one_step_late():
    """Exercise 5. First preemption one step late (counts 21 + s + 1 tokens at step s)."""
    return 6, 5, 1


def predict_two_preempted():
    """Exercise 5. Two requests preempted (thinks six need 6 pages with 2 free: frees until 'fits')."""
    return 6, 4, 2


def predict_batch_limit():
    """Exercise 5. Admits all 8 (looks at max_batch only)."""
    return 8, 4, 1


# ---------------------------------------------------------------- correct alternatives
def correct_pages_needed(n_tokens, pages_held, page_size):
    """Exercise 1, correct: ceil of the tokens not yet covered by held pages."""
    uncovered = n_tokens - pages_held * page_size
    return 0 if uncovered <= 0 else (uncovered + page_size - 1) // page_size


def correct_grow_recount(running, pool):
    """Exercise 2, correct: recounts the needs of the kept requests after each preemption."""
    kept, preempted = list(running), []

    def total():
        return sum(_need(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept)

    while kept and total() > pool.num_free_pages:
        victim = kept[-1]
        kept = kept[:-1]
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def correct_step_by_rid(running, waiting, pool, max_batch):
    """Exercise 4, correct: filters the queue by request id."""
    kept, preempted = _grow(running, pool)
    queue = sorted(waiting + preempted, key=queue_order)
    admitted = _admit(queue, len(kept), pool, max_batch)
    taken = {s.rid for s in admitted}
    return StepPlan(running=kept + admitted, waiting=[s for s in queue if s.rid not in taken],
                    admitted=admitted, preempted=preempted)


WRONG = {
    "pages_needed": [pages_floor, pages_can_be_negative, pages_plus_one_token, pages_float_ceil],
    "grow": [grow_preempts_oldest, grow_keeps_victim_need, grow_preempts_once, grow_counts_next_token,
             grow_preempts_longest],
    "admit": [admit_overtakes, admit_batch_off_by_one, admit_prompt_only, admit_ignores_running],
    "scheduler": [step_no_requeue_order, step_preempted_first, step_admitted_before_kept, step_counts_old_running,
                  step_readmits_same_step],
    "prediction": [predict_one_step_late, predict_two_preempted, predict_batch_limit],
}
CORRECT = {
    "pages_needed": [correct_pages_needed],
    "grow": [correct_grow_recount],
    "scheduler": [correct_step_by_rid],
}
