"""Lab 09's checks: the solution passes, the blank lab says "not implemented yet", and a catalogue of
wrong answers, each the solution with one or two lines changed as a student would change them, is
rejected on every one of 50 seeds; several correct variants are accepted on every seed."""
from __future__ import annotations

import nbformat
import pytest
from mutation import SEEDS, assert_accepted, assert_rejected_on_every_seed, catalogue_params

from attnkit.classroom.checking import NOT_IMPLEMENTED
from attnkit.classroom.labchecks import lab09
from attnkit.classroom.notebooks import ROOT

SOLUTION = "solutions/lab09_capstone_serving.ipynb"
LAB = "labs/lab09_capstone_serving.ipynb"


def _cells(relpath: str) -> list[str]:
    """The code cells that define things: no setup cell, no checks, no measurement, no demonstration."""
    nb = nbformat.read(ROOT / relpath, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"][1:]
    return [s for s in code if "lab09." not in s and "PageTables(" not in s]


def _namespace(cells: list[str]) -> dict:
    namespace: dict = {}
    for source in cells:
        exec(compile(source, "<lab09>", "exec"), namespace)
    return namespace


def variant(function: str, replacements: list[tuple[str, str]], tag: str):
    """The solution with each (old, new) replacement made once inside ``def function``."""
    cells = _cells(SOLUTION)
    index = next(i for i, s in enumerate(cells) if f"def {function}(" in s)
    for old, new in replacements:
        assert cells[index].count(old) == 1, f"{tag}: {old!r} must occur once in {function}"
        cells[index] = cells[index].replace(old, new)
    fn = _namespace(cells)[function]
    fn.__name__ = tag
    return fn


# ------------------------------------------------------------------------------ exercise 1: pages
PAGES = "return max(0, -(-n_tokens // page_size) - pages_held)"
PAGES_WRONG = {
    "floor + 1": "return max(0, n_tokens // page_size + 1 - pages_held)",
    "floor": "return max(0, n_tokens // page_size - pages_held)",
    "room for one more token": "return max(0, -(-(n_tokens + 1) // page_size) - pages_held)",
    "no clamp at 0": "return -(-n_tokens // page_size) - pages_held",
    "pages held ignored": "return max(0, -(-n_tokens // page_size))",
    "round": "return max(0, round(n_tokens / page_size) - pages_held)",
    "(n + page_size) // page_size": "return max(0, (n_tokens + page_size) // page_size - pages_held)",
    "one spare page": "return max(0, -(-n_tokens // page_size) - pages_held + 1)",
    "at least one page": "return max(1, -(-n_tokens // page_size) - pages_held)",
    "a float from true division": "return max(0, (n_tokens + page_size - 1) / page_size - pages_held)",
}
PAGES_RIGHT = {
    "solution": PAGES,
    "math.ceil": "import math\n    return max(0, math.ceil(n_tokens / page_size) - pages_held)",
    "(n + ps - 1) // ps": "return max(0, (n_tokens + page_size - 1) // page_size - pages_held)",
    "a loop": ("pages = 0\n    while pages * page_size < n_tokens:\n        pages += 1\n"
               "    return pages - pages_held if pages > pages_held else 0"),
}

# ------------------------------------------------------------------------------- exercise 2: grow
POP = "victim = kept.pop()                      # the most recently admitted\n        needs.pop()"
RESERVE = "pool.reserve(s.rid, 1)"
NEEDS = "needs = [pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), pool.page_size) for s in kept]"
GROW_WRONG = {
    "oldest preempted first": [(POP, "victim = kept.pop(0)\n        needs.pop(0)")],
    "pages not freed": [("pool.free(victim.rid)", "pass")],
    ">= instead of >": [("sum(needs) > pool.num_free_pages", "sum(needs) >= pool.num_free_pages")],
    "needs not updated": [(POP, "victim = kept.pop()")],
    "room for one token too many": [(NEEDS, NEEDS.replace("len(s.tokens)", "len(s.tokens) + 1"))],
    "no reserve for the kept": [(RESERVE, "pass")],
    "longest preempted first": [(POP, "i = max(range(len(kept)), key=lambda i: len(kept[i].tokens))\n"
                                      "        victim = kept.pop(i)\n        needs.pop(i)")],
    "reserve all tokens again": [(RESERVE, "pool.reserve(s.rid, len(s.tokens))")],
    "pages held from the length": [(NEEDS, NEEDS.replace("len(pool.pages_of(s.rid))",
                                                         "pool.length(s.rid) // pool.page_size"))],
    "reserve first, preempt whoever fails": [
        ("kept, preempted = list(running), []", "from attnkit.serving.allocator import OutOfPagesError\n"
                                                "    kept, preempted = [], []\n    for s in running:\n"
                                                "        try:\n            pool.reserve(s.rid, 1)\n"
                                                "            kept.append(s)\n        except OutOfPagesError:\n"
                                                "            pool.free(s.rid)\n            preempted.append(s)\n"
                                                "    return kept, preempted")],
    "reserve one by one, preempt and retry on failure (not all or nothing)": [
        ("kept, preempted = list(running), []", "from attnkit.serving.allocator import OutOfPagesError\n"
                                                "    kept, preempted = list(running), []\n    while kept:\n"
                                                "        try:\n            for s in kept:\n"
                                                "                pool.reserve(s.rid, 1)\n"
                                                "            return kept, preempted\n"
                                                "        except OutOfPagesError:\n            v = kept.pop()\n"
                                                "            pool.free(v.rid)\n            preempted.append(v)\n"
                                                "    return kept, preempted")],
    "latest arrival preempted first": [(POP, "i = max(range(len(kept)), key=lambda i: kept[i].arrival)\n"
                                             "        victim = kept.pop(i)\n        needs.pop(i)")],
    # admission order taken for arrival or id order (round 3's class: running ordered by arrival)
    "last in queue order preempted first": [(POP, "i = max(range(len(kept)), key=lambda i: queue_order(kept[i]))\n"
                                                  "        victim = kept.pop(i)\n        needs.pop(i)")],
    "largest id preempted first": [(POP, "i = max(range(len(kept)), key=lambda i: kept[i].rid)\n"
                                         "        victim = kept.pop(i)\n        needs.pop(i)")],
    "running sorted by arrival first": [("kept, preempted = list(running), []",
                                         "kept, preempted = sorted(running, key=queue_order), []")],
    "kept returned sorted by arrival": [("return kept, preempted", "return sorted(kept, key=queue_order), preempted")],
    # inputs changed in place (round 4's class): the result is right, the caller's list is not
    "kept aliases running (the victims popped from the caller's list)": [
        ("kept, preempted = list(running), []", "kept, preempted = running, []")],
    "the victims also removed from the caller's list": [
        ("preempted.append(victim)", "preempted.append(victim)\n        running.remove(victim)")],
    "running sorted in place before the loop": [
        ("kept, preempted = list(running), []",
         "running.sort(key=queue_order)\n    kept, preempted = list(running), []")],
}
GROW_RIGHT = {
    "solution": [],
    "needs recounted each time": [
        (NEEDS, "def need():\n        return sum(pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), "
                "pool.page_size) for s in kept)"),
        ("while kept and sum(needs) > pool.num_free_pages:", "while kept and need() > pool.num_free_pages:"),
        ("        needs.pop()\n", "")],
    "victims counted first, then freed": [
        ("while kept and sum(needs) > pool.num_free_pages:",
         "free = pool.num_free_pages\n    cut = len(kept)\n    while cut and sum(needs[:cut]) > free:\n"
         "        cut -= 1\n        free += len(pool.pages_of(kept[cut].rid))\n"
         "    while len(kept) > cut:")],
    "reserve_many, all or nothing, preempt on failure": [
        ("kept, preempted = list(running), []", "from attnkit.serving.allocator import OutOfPagesError\n"
                                                "    kept, preempted = list(running), []\n    while kept:\n"
                                                "        try:\n"
                                                "            pool.reserve_many([s.rid for s in kept], 1)\n"
                                                "            return kept, preempted\n"
                                                "        except OutOfPagesError:\n            v = kept.pop()\n"
                                                "            pool.free(v.rid)\n            preempted.append(v)\n"
                                                "    return kept, preempted")],
}

# ------------------------------------------------------------------------------ exercise 3: admit
FITS = "if pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:"
ADD = "pool.reserve(s.rid, len(s.tokens))"
BATCH = "if n_running + len(admitted) >= max_batch:"
ADMIT_WRONG = {
    "resumed without recomputing": [(FITS, FITS.replace("s.tokens", "s.prompt")),
                                    (ADD, ADD.replace("s.tokens", "s.prompt"))],
    "overtaking": [("break                                # first come",
                    "continue                             # first come")],
    "max_batch ignored": [(BATCH + "\n            break\n        ", "")],
    "max_batch off by one": [(BATCH, BATCH.replace(">=", ">"))],
    "an exact fit refused": [(FITS, FITS.replace(">", ">="))],
    "budget against all pages": [(FITS, FITS.replace("pool.num_free_pages", "pool.num_pages"))],
    "floor page count": [(FITS, "if len(s.tokens) // pool.page_size > pool.num_free_pages:")],
    "no add_sequence": [("pool.add_sequence(s.rid)", "pass")],
    "running requests ignored": [(BATCH, "if len(admitted) >= max_batch:")],
    "from the back of the queue": [("for s in waiting:", "for s in reversed(waiting):")],
    "room for one token more": [(ADD, ADD.replace("len(s.tokens)", "len(s.tokens) + 1"))],
    "tries to reserve, stops on failure without freeing (the pool changed part-way)": [
        (FITS + "\n            break                                # first come, first served: no overtaking\n"
                "        pool.add_sequence(s.rid)\n        " + ADD,
         "pool.add_sequence(s.rid)\n        try:\n            " + ADD + "\n        except Exception:\n"
         "            break")],
    "one page kept spare": [(FITS, FITS.replace("pool.num_free_pages", "pool.num_free_pages - 1"))],
    "the queue sorted again by arrival": [("for s in waiting:", "for s in sorted(waiting, key=queue_order):")],
    "the queue sorted again by id": [("for s in waiting:", "for s in sorted(waiting, key=lambda s: s.rid):")],
    # inputs changed in place: the admitted taken off the front of the caller's queue
    "pops the admitted from the caller's queue": [
        ("for s in waiting:", "while waiting:\n        s = waiting[0]"),
        ("admitted.append(s)", "admitted.append(s)\n        waiting.pop(0)")],
    "the caller's queue sorted in place": [
        ("admitted = []", "waiting.sort(key=queue_order)\n    admitted = []")],
    # the running requests counted from the pool rather than by n_running (the pool may hold others)
    "running counted as the pool's sequences": [(BATCH, "if len(pool.sequences) >= max_batch:")],
    "running counted once, as the pool's sequences before the loop": [
        ("admitted = []", "admitted, n_held = [], len(pool.sequences)"),
        (BATCH, "if n_held + len(admitted) >= max_batch:")],
}
ADMIT_RIGHT = {
    "solution": [],
    "while loop on an index": [
        ("admitted = []\n    for s in waiting:",
         "admitted, i = [], 0\n    while i < len(waiting):\n        s = waiting[i]\n        i += 1"),
    ],
    "pages counted by hand": [(FITS, "if (len(s.tokens) + pool.page_size - 1) // pool.page_size "
                                     "> pool.num_free_pages:")],
}

# ---------------------------------------------------------------------------- exercise 4: the step
QUEUE = "queue = sorted(waiting + preempted, key=queue_order)"
STEP = ("kept, preempted = grow(running, pool)\n    " + QUEUE
        + "\n    admitted = admit(queue, len(kept), pool, max_batch)")
_OWN_ADMIT = ("\n    admitted = []\n    for s in queue:\n        if len(kept) + len(admitted) >= max_batch:\n"
              "            break\n        need = pages_needed(len(s.tokens), 0, pool.page_size)\n"
              "        if need > free:\n            break\n        pool.add_sequence(s.rid)\n"
              "        pool.reserve(s.rid, len(s.tokens))\n        free -= need\n        admitted.append(s)")
STEP_WRONG = {
    "queue ordered by id": [(QUEUE, "queue = sorted(waiting + preempted, key=lambda s: s.rid)")],
    "queue ordered by arrival alone": [(QUEUE, "queue = sorted(waiting + preempted, key=lambda s: s.arrival)")],
    "preempted at the front, by id": [(QUEUE, "queue = sorted(preempted, key=lambda s: s.rid) + waiting")],
    "its own free-page count, taken before grow": [
        (STEP, "free = pool.num_free_pages\n    kept, preempted = grow(running, pool)\n    " + QUEUE + _OWN_ADMIT)],
    "its own free-page count, without the victims' pages": [
        (STEP, "free = pool.num_pages - sum(len(pool.pages_of(s.rid)) for s in running)\n"
               "    kept, preempted = grow(running, pool)\n"
               "    free -= sum(1 for s in kept if pool.length(s.rid) % pool.page_size == 1 or pool.page_size == 1)"
               "\n    " + QUEUE + _OWN_ADMIT)],
    "preempted at the back of the queue": [(QUEUE, "queue = waiting + preempted")],
    "preempted at the front, newest first": [(QUEUE, "queue = preempted + waiting")],
    "preempted dropped": [(QUEUE, "queue = sorted(waiting, key=queue_order)")],
    "admitted before running": [("running=kept + admitted", "running=admitted + kept")],
    "admitted still waiting": [("waiting=[s for s in queue if s not in admitted]", "waiting=queue")],
    "waiting without the preempted": [("waiting=[s for s in queue if s not in admitted]",
                                       "waiting=[s for s in waiting if s not in admitted]")],
    "free slots passed as max_batch": [("admit(queue, len(kept), pool, max_batch)",
                                        "admit(queue, len(kept), pool, max_batch - len(kept))")],
    "batch counted before the preemption": [("admit(queue, len(kept), pool, max_batch)",
                                             "admit(queue, len(running), pool, max_batch)")],
    # round 3: running kept in arrival order (the order agrees with admission on every reachable workload)
    "running sorted by arrival": [("running=kept + admitted", "running=sorted(kept + admitted, key=queue_order)")],
    "running sorted by arrival alone": [("running=kept + admitted",
                                         "running=sorted(kept + admitted, key=lambda s: s.arrival)")],
    "running sorted by id": [("running=kept + admitted", "running=sorted(kept + admitted, key=lambda s: s.rid)")],
    "running sorted by arrival before grow": [("kept, preempted = grow(running, pool)",
                                               "kept, preempted = grow(sorted(running, key=queue_order), pool)")],
    "the admitted sorted by id": [("running=kept + admitted", "running=kept + sorted(admitted, key=lambda s: s.rid)")],
    "admit before grow": [
        ("kept, preempted = grow(running, pool)\n    " + QUEUE
         + "\n    admitted = admit(queue, len(kept), pool, max_batch)",
         "queue = sorted(waiting, key=queue_order)\n    admitted = admit(queue, len(running), pool, max_batch)\n"
         "    kept, preempted = grow(running, pool)\n    queue = sorted(queue + preempted, key=queue_order)")],
    # inputs changed in place (round 4's class)
    "the caller's waiting list extended and sorted in place": [
        (QUEUE, "waiting.extend(preempted)\n    waiting.sort(key=queue_order)\n    queue = waiting")],
    "the admitted appended to the caller's running list": [
        ("return StepPlan(running=kept + admitted,",
         "running.extend(admitted)\n    return StepPlan(running=kept + admitted,")],
    "a preempted request's generated tokens dropped in place": [
        (QUEUE, "for s in preempted:\n        s.generated.clear()\n    " + QUEUE)],
    # `waiting` assumed already in queue order (round 4's class: the step sorts on every step)
    "sorts only when something was preempted": [
        (QUEUE, "queue = waiting + preempted\n    if preempted:\n        queue = sorted(queue, key=queue_order)")],
    "preempted merged into waiting as though it were sorted (heapq.merge)": [
        (QUEUE, "import heapq\n    queue = list(heapq.merge(waiting, sorted(preempted, key=queue_order), "
                "key=queue_order))")],
    "preempted inserted by bisect into waiting as given": [
        (QUEUE, "import bisect\n    queue = list(waiting)\n    for s in preempted:\n"
                "        bisect.insort(queue, s, key=queue_order)")],
    "waiting sorted only when it has more than two requests": [
        (QUEUE, "queue = waiting + preempted\n    if len(queue) > 2:\n        queue = sorted(queue, key=queue_order)")],
}
STEP_RIGHT = {
    "solution": [],
    "its own free-page count, kept right": [
        (STEP, "kept, preempted = grow(running, pool)\n    free = pool.num_free_pages\n    " + QUEUE + _OWN_ADMIT)],
    "sort in place, by fields": [
        (QUEUE, "queue = list(waiting) + list(preempted)\n    queue.sort(key=lambda s: (s.arrival, s.rid))"),
        ("waiting=[s for s in queue if s not in admitted]", "waiting=queue[len(admitted):]")],
}

# ------------------------------------------------------------------------- exercise 5: prediction
PREDICTION_WRONG = {"pages ignored": (8, 4, 1), "first preemption one step early": (6, 3, 1),
                    "one step late": (6, 5, 1), "two preempted": (6, 4, 2), "all preempted": (6, 4, 6),
                    "worst-case admission": (3, 0, 0), "21 // 3 requests": (7, 4, 1), "no preemption": (6, 4, 0),
                    "page of 8 counted as 7 tokens": (6, 3, 2), "not three numbers": (6, 4)}
PREDICTION_RIGHT = {"tuple": (6, 4, 1), "list": [6, 4, 1], "floats that are whole": (6.0, 4.0, 1.0)}


def _prediction(value):
    def predict():
        return value
    return predict


CATALOGUES = {
    "pages_needed": (lab09.check_pages_needed, {k: [(PAGES, v)] for k, v in PAGES_WRONG.items()},
                     {k: [(PAGES, v)] if v != PAGES else [] for k, v in PAGES_RIGHT.items()}),
    "grow": (lab09.check_grow, GROW_WRONG, GROW_RIGHT),
    "admit": (lab09.check_admit, ADMIT_WRONG, ADMIT_RIGHT),
    "scheduler_step": (lab09.check_scheduler, STEP_WRONG, STEP_RIGHT),
}
WRONG = [pytest.param(f, n, id=f"{f}: {n}") for f, (_, wrong, _) in CATALOGUES.items() for n in wrong]
RIGHT = [pytest.param(f, n, id=f"{f}: {n}") for f, (_, _, right) in CATALOGUES.items() for n in right]


@pytest.mark.parametrize("function, name", WRONG)
def test_wrong_answer_rejected_on_every_seed(function, name):
    check, wrong, _ = CATALOGUES[function]
    assert_rejected_on_every_seed(check, variant(function, wrong[name], name), SEEDS)


@pytest.mark.parametrize("function, name", RIGHT)
def test_correct_variant_accepted_on_every_seed(function, name):
    check, _, right = CATALOGUES[function]
    assert_accepted(check, variant(function, right[name], name), SEEDS)


@pytest.mark.parametrize("predict", catalogue_params({k: _prediction(v) for k, v in PREDICTION_WRONG.items()}))
def test_wrong_prediction_rejected(predict):
    assert_rejected_on_every_seed(lab09.check_prediction, predict, SEEDS)


@pytest.mark.parametrize("predict", catalogue_params({k: _prediction(v) for k, v in PREDICTION_RIGHT.items()}))
def test_prediction_accepted(predict):
    assert_accepted(lab09.check_prediction, predict, SEEDS)


def test_the_prediction_is_what_the_rule_does():
    record = lab09.serve(lab09.reference_step, lab09.prediction_requests(), num_pages=20, page_size=8, max_batch=8)
    first = next(s for s in record.steps if s[3])
    assert (len(record.steps[0][2]), first[0], len(first[3])) == lab09.EXPECTED_PREDICTION


def test_a_cache_that_was_not_recomputed_changes_the_tokens():
    """The ledger model sees through a plan that readmits a request without listing it as admitted."""
    def hide_readmissions(running, waiting, pool, max_batch):
        plan = lab09.reference_step(running, waiting, pool, max_batch)
        return lab09.StepPlan(plan.running, plan.waiting, [s for s in plan.admitted if not s.generated],
                              plan.preempted)

    with pytest.raises(lab09.ServeError, match="was not recomputed"):
        lab09.serve(hide_readmissions, lab09.prediction_requests(), num_pages=20, page_size=8, max_batch=8)


def test_the_rule_itself_is_refused_while_a_student_function_runs():
    for check, borrowed in ((lab09.check_grow, lambda running, pool: lab09.reference_grow(running, pool)),
                            (lab09.check_admit, lab09.reference_admit),
                            (lab09.check_scheduler, lab09.reference_step)):
        result = check(borrowed, seed=0)
        assert not result.passed and "course's own implementation" in result.report, result.report
    assert lab09.reference_pages_needed(9, 0, 8) == 2          # restored afterwards


def test_blank_lab_reports_not_implemented():
    ns = _namespace([s for s in _cells(LAB)])
    summary = lab09.check_lab(seed=0, **{e.function: ns[e.function] for e in lab09.EXERCISES})
    assert [r.status for r in summary.results] == [NOT_IMPLEMENTED] * 5, summary
    assert lab09.measure(ns["scheduler_step"]).startswith("⏳")
