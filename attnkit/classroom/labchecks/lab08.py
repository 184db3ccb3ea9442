"""Checks for lab 08, paged attention.

    check_slots(token_slots)          exercise 1: token position -> (physical page, offset)
    check_pool(PagePool)              exercise 2: a page pool (free list, page tables, append, free)
    check_paged_decode(paged_decode)  exercise 3: the paged decode kernel (grouped query heads)
    check_merge(merge_splits)         exercise 4: merging split-KV partial results
    check_lab(token_slots=..., PagePool=..., paged_decode=..., merge_splits=...)   all four, summed up

Each check runs fixed adversarial cases first, the same on every run, then cases drawn from ``seed``
(fresh ones when None). Page tables are permutations of the pool, lengths end inside a page and at its
edges (k·16 and k·16 ± 1 tokens for the kernel's 16-token blocks), every sequence of the kernel's fixed
cases spans three blocks or more, and the slots past each sequence's end hold stale values from an
earlier sequence (as in a real cache), or NaN in the rest of its last page, so reading them changes the
answer (relying on p = 0 to cancel an unmasked value gives 0 · NaN). One fixed case of the kernel and
one of the merge have score gaps of hundreds: without a per-row running maximum, rescaled at every
block, exp overflows or underflows. A 33-block case puts almost all the weight on one token, so fp16
running sums (ℓ or the accumulator) drop the rest. Another merge case has every score near −300 and an
empty split (``nan_to_num(m, neginf=0)`` makes the empty split's weight the largest: 0/0). Most of the
kernel's fixed cases (and drawn ones) come in a server's layouts (``lab08_cases.laid_out``): a block
table cut from the rows and first columns of a wider preallocated one (its row stride is not its
width), q's and K's rows padded with NaN, V stored in another order than K. The kernel's
cases run in a child process where kernels are interpreted, with sentinels around the tensors the
launch function allocates (a store without its mask is named, a crash fails with its case). Slots must
be two int64 tensors of shape [seq_len], append's slots pairs of ints, an append that runs out of pages
raises RuntimeError (the lab's rule; not MemoryError) and changes nothing, a freed sequence keeps no
pages in the pool's page tables, and the kernel's output comes back in q's dtype (judged on every case,
before its values). While the student's function runs, the course's
own paged kernels, merge and references raise (see ``attnkit.classroom.labchecks.course_code.course_code_forbidden``),
and so do PyTorch's matrix products, softmax and exp while the student's decode function runs.

Internal API for tests and scripts: ``run_scripted_pool(PagePool)``, the fixed workload ``check_pool``
runs first (``SCRIPTED_POOL``), None when the pool follows it.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...device import runtime
from ...tolerances import tolerance
from ..checking import (
    FAILED,
    PASSED,
    CheckResult,
    Exercise,
    WrongResult,
    case,
    check_exercises,
    not_implemented,
    unwrapped,
    wrong_kind,
)
from .course_code import guarded_check
from .lab08_cases import (  # noqa: F401  (BLOCK_N, make_paged_case: re-exported, as tests and scripts name them)
    BLOCK_N,
    DECODE_FIXED,
    DECODE_LAYOUTS,
    decode_cases,
    make_paged_case,
    random_decode,
)

HINT_SLOTS = ("token t lives in page block_table[t // page_size] at offset t % page_size "
              "(the page id comes from the table; the offset is the position inside the page).")
HINT_POOL = ("append: a sequence of length n holds ceil(n / page_size) pages; take a new page from the "
             "free list only when position n is the first slot of a page; check that enough pages are "
             "free BEFORE changing anything (raise RuntimeError if not); free: return every page of the "
             "sequence to the free list.")
HINT_DECODE = ("tokens of sequence b are 0 .. seq_lens[b]-1 only (mask the rest of the last page); "
               "token t is at page block_table[b, t // PAGE_SIZE], offset t % PAGE_SIZE; the query heads "
               "of KV head kv are kv·GROUP .. kv·GROUP+GROUP-1 (h // GROUP, not h % Hkv); keep a running "
               "max per row (from −inf) and rescale l and acc by exp(m_old − m_new) at every block.")
HINT_MERGE = ("rescale each split to the row's common maximum M = max_s m_s: "
              "o = Σ_s e^(m_s − M)·z_s / Σ_s e^(m_s − M)·ℓ_s; a split with m = −inf has weight 0.")


def _seed(seed):
    return int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed


def _require_callable(name: str, fn) -> None:
    if not callable(fn):
        raise ValueError(f"{name}: expected your function (or class), got {type(fn).__name__}")


# ----------------------------------------------------------------------------- exercise 1: slots
class WrongSlots(WrongResult):
    """token_slots returned something other than the two int64 tensors of shape [seq_len] the lab asks for."""


def _reference_slots(block_table_row, seq_len, page_size):
    import torch

    t = torch.arange(seq_len)
    return torch.stack([block_table_row.long()[t // page_size], t % page_size])   # [2, seq_len]


# (seq_len, page_size, block_table_row): a partial last page, one token, exactly one page, exactly
# three pages, page size 1, and rows whose entry i is never i.
SLOTS_FIXED = ((11, 4, (7, 2, 9, 0)), (1, 8, (5, 1)), (16, 16, (3, 0)), (12, 4, (6, 4, 1, 8)),
               (23, 5, (2, 9, 7, 0, 3, 8)), (5, 1, (4, 3, 0, 6, 2, 9)))


def check_slots(token_slots: Callable, *, seed: int | None = None) -> CheckResult:
    """``token_slots(block_table_row, seq_len, page_size) -> (pages, offsets)``, int tensors [seq_len]."""
    import torch

    _require_callable("token_slots", token_slots)
    cases = [case(torch.tensor(row, dtype=torch.int32), seq_len, page_size,
                  label=f"seq_len={seq_len}, page_size={page_size}, block_table_row={list(row)}")
             for seq_len, page_size, row in SLOTS_FIXED]
    # state: the first two cases' lengths and page sizes again with other page tables (nothing may be kept
    # from an earlier call, e.g. the slots looked up by seq_len and page_size)
    cases += [case(torch.tensor(row[::-1], dtype=torch.int32), seq_len, page_size,
                   label=f"seq_len={seq_len}, page_size={page_size} again, with the page table {list(row[::-1])}")
              for seq_len, page_size, row in SLOTS_FIXED[:2]]
    gen = torch.Generator().manual_seed(_seed(seed))
    rng = np.random.default_rng(_seed(seed))
    for _ in range(3):
        seq_len, page_size = int(rng.integers(1, 40)), int(rng.integers(1, 9))
        pages = -(-seq_len // page_size)
        row = torch.randperm(48, generator=gen)[: pages + 1].int()
        cases.append(case(row, seq_len, page_size, label=f"seq_len={seq_len}, page_size={page_size}, "
                                                         f"block_table_row={row.tolist()}"))

    def student(row, seq_len, page_size):
        got = token_slots(row, seq_len, page_size)
        if got is None:
            return None
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            problem = f"token_slots must return a pair (pages, offsets), got {type(got).__name__}"
        elif not all(isinstance(x, torch.Tensor) for x in got):
            problem = (f"pages and offsets must be int64 tensors (the lab asks for two tensors), got "
                       f"{type(got[0]).__name__} and {type(got[1]).__name__}")
        elif got[0].dtype != torch.int64 or got[1].dtype != torch.int64:
            problem = (f"pages and offsets must be int64 tensors (torch.long, as the docstring says: they index the "
                       f"page pool), got {str(got[0].dtype).replace('torch.', '')} and "
                       f"{str(got[1].dtype).replace('torch.', '')}")
        elif tuple(got[0].shape) != (seq_len,) or tuple(got[1].shape) != (seq_len,):
            problem = (f"pages and offsets must each have shape [seq_len] = [{seq_len}] (one entry per token), got "
                       f"{list(got[0].shape)} and {list(got[1].shape)}")
        else:
            return torch.stack([got[0], got[1]])
        raise WrongSlots(wrong_kind(problem))

    def same(got, exp):
        return tuple(got.shape) == tuple(exp.shape) and bool(torch.equal(got, exp))

    return guarded_check("token → (page, offset)", student, _reference_slots, cases, tol=0.0,
                         hint=f"{HINT_SLOTS} Row 0 of the result is the pages, row 1 the offsets.", compare=same,
                         fixed=len(SLOTS_FIXED) + 2)


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
    for seq, table in pool.tables.items():
        if seq not in model:
            raise _Fail(f"sequence {seq} was freed (or never added to this pool), but pool.tables still has an "
                        f"entry for it ({list(table)}): forget a freed sequence (pop its table; keep page tables "
                        "per pool, set in __init__, not shared by the class)")
    lengths = getattr(pool, "lengths", None)
    if isinstance(lengths, dict) and any(seq not in model for seq in lengths):
        seq = next(seq for seq in lengths if seq not in model)
        raise _Fail(f"sequence {seq} was freed, but pool.lengths still holds its length: forget it too")
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


def _slot(pair) -> tuple[int, int]:
    """One (page, offset) of append's answer as two ints; TypeError unless it is a pair of integers (a
    Python or NumPy int, or an integer 0-d tensor: anything ``operator.index`` takes, a bool excepted)."""
    import operator

    try:
        items = tuple(pair)
    except TypeError:
        raise TypeError(f"each slot must be a (page, offset) pair of ints, got {type(pair).__name__} {pair!r}") \
            from None
    if len(items) != 2:
        raise ValueError(f"each slot must be a (page, offset) pair, got {len(items)} numbers: {pair!r}")
    out = []
    for x in items:
        if isinstance(x, (bool, np.bool_)):
            raise TypeError(f"a page id and an offset are ints, got bool {x!r}")
        try:
            out.append(operator.index(x))
        except TypeError:
            raise TypeError(f"a page id and an offset are ints, got {type(x).__name__} {x!r} (a float page "
                            "number cannot index the pool)") from None
    return out[0], out[1]


def _preview_slots(slots) -> str:
    text = repr(slots)
    return text if len(text) <= 80 else text[:77] + "..."


def _snapshot(pool) -> tuple:
    return sorted(pool.free), {s: list(t) for s, t in pool.tables.items()}


def _pool_append(pool, model: dict, seq, n: int, page_size: int, num_pages: int) -> tuple[str | None, bool]:
    """``pool.append(seq, n)`` judged against the model: (what went wrong or None, whether it ran out).

    A request needing more pages than are free must raise RuntimeError, as the lab says (a subclass of
    it too; not MemoryError, ValueError, an assert, ...), and leave the pool as it was; any other request
    must succeed and return the (page, offset) of each new token, a pair of ints.
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
        except RuntimeError:
            if _snapshot(pool) != before:
                return (f"out of pages ({need} needed, {free} free): raised an error but changed the pool "
                        f"first (free list or page tables differ from before the call)"), True
            return None, True
        except Exception as exc:                     # the lab asks for RuntimeError: a server catches that one
            return (f"needs {need} pages but only {free} are free: append must raise RuntimeError (the lab's "
                    f"rule: a server catches it, frees or preempts a sequence and retries), but it raised "
                    f"{type(exc).__name__}: {exc}"), True
        return (f"needs {need} pages but only {free} are free; expected a RuntimeError and no change"), True
    try:
        slots = pool.append(seq, n)
    except NotImplementedError:
        raise
    except Exception as exc:
        return (f"needs {need} new page{'s' if need != 1 else ''} and {free} are free, so it must succeed, "
                f"but it raised {type(exc).__name__}: {exc}"), False
    if slots is None:
        return "returned None (return the (page, offset) of each new token)", False
    if not isinstance(slots, (list, tuple)):          # a generator or map is used up after one pass
        return (f"returned a {type(slots).__name__} where a list [(page, offset), ...] belongs (as the docstring "
                f"says: a caller may read it more than once)"), False
    try:
        slots = [_slot(s) for s in slots]
    except (TypeError, ValueError) as exc:
        return f"returned {_preview_slots(slots)}: {exc}", False
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


def run_scripted_pool(PagePool) -> str | None:
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
                  "pages while some are free)", lambda: run_scripted_pool(PagePool))]
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
# The cases (and their layouts: a block table cut from a wider one, padded pages, V stored apart) are
# built in lab08_cases.
_FIXED_DECODE: dict = {}


def check_paged_decode(paged_decode: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 3: ``paged_decode(q, k_pages, v_pages, block_table, seq_lens) -> o`` against float64."""
    import torch

    from ...kernels.paged import paged_decode_ref

    _require_callable("paged_decode", paged_decode)
    device = runtime().device
    if device not in _FIXED_DECODE:                  # the fixed cases, built once (the check copies them)
        _FIXED_DECODE[device] = decode_cases(DECODE_FIXED, DECODE_LAYOUTS, torch.Generator().manual_seed(80_803),
                                             device)
    cases = _FIXED_DECODE[device] + decode_cases(*random_decode(np.random.default_rng(_seed(seed))),
                                                 torch.Generator().manual_seed(_seed(seed)), device)
    tol = tolerance("float16", device)
    hint = f"{HINT_DECODE} (passes at a relative error ≤ {tol:.0e}, the float16 bound)"
    student_fn = unwrapped(paged_decode)

    def student(q, *rest):
        # o comes back in q's dtype; judged here, inside the check (which may run in a child process)
        out = student_fn(q, *rest)
        if isinstance(out, torch.Tensor) and out.dtype != q.dtype:
            dtypes = [str(t).replace("torch.", "") for t in (out.dtype, q.dtype)]
            raise WrongResult(wrong_kind(f"o is {dtypes[0]}; expected {dtypes[1]}, the dtype of q (allocate o with "
                                         f"torch.empty_like(q): the next layer reads it in q's dtype)"))
        return out

    return guarded_check("paged decode kernel", student, paged_decode_ref, cases, tol=tol, hint=hint,
                         fixed=len(DECODE_FIXED), kernel=True)


# ---------------------------------------------------------------------------- exercise 4: merge
def _partials(rng, rows: int, keys: int, d: int, cuts, scale=5.0, offset=0.0):
    """float32 (m, ℓ, z) of consecutive chunks of the keys ([rows, S], [rows, S], [rows, S, d]), computed
    in float64 (NumPy: these arrays are tiny). ``scale``: the scores' scale, one number or one per row;
    ``offset`` is added to every score."""
    import torch

    scores = rng.standard_normal((rows, keys)) * np.reshape(np.asarray(scale, dtype=np.float64), (-1, 1)) + offset
    values = rng.standard_normal((keys, d))
    bounds = list(zip((0, *cuts), (*cuts, keys)))
    m = np.full((rows, len(bounds)), -np.inf)
    l = np.zeros((rows, len(bounds)))
    z = np.zeros((rows, len(bounds), d))
    for s, (lo, hi) in enumerate(bounds):
        if hi > lo:                                  # an empty split keeps m = −inf, ℓ = 0, z = 0
            m[:, s] = scores[:, lo:hi].max(axis=1)
            p = np.exp(scores[:, lo:hi] - m[:, s:s + 1])
            l[:, s], z[:, s] = p.sum(axis=1), p @ values[lo:hi]
    return tuple(torch.from_numpy(a.astype(np.float32)) for a in (m, l, z))


def _reference_merge(m, l, z):
    from ...kernels.paged import merge_partials

    return merge_partials(m.double(), l.double(), z.double())


# (rows, keys, D, cuts, score scale per row or for all, what the case is for)
MERGE_FIXED = (
    (3, 40, 8, (10, 25), 5.0, "3 rows, 3 splits"),
    (2, 17, 4, (0, 5, 5, 12), 5.0, "5 splits, the first and the third empty"),
    (4, 64, 16, (16, 32, 48), (1.0, 200.0, 0.01, 120.0), "score scales 1, 200, 0.01, 120: maxima hundreds apart"),
    (1, 9, 4, (3, 6), 5.0, "one row"),
    (2, 24, 8, (0, 12), 5.0, "every score near −300 and an empty split: its m = −inf must not count as 0"),
    # boundaries: S = 1 (nothing to merge, yet z is still divided by ℓ), and one split holding every key
    (2, 20, 8, (), 5.0, "a single split: o is its z / ℓ"),
    (3, 20, 4, (0, 0), 5.0, "three splits, only the last holds keys"),
    # state: the first case's shapes again with other values (nothing may be kept from an earlier call)
    (3, 40, 8, (10, 25), 5.0, "case 1's shapes, other values"),
)
MERGE_OFFSETS = {4: -300.0}        # MERGE_FIXED index -> the offset of its scores


def _splits(cuts) -> str:
    return "1 split" if not cuts else f"{len(cuts) + 1} splits"


def check_merge(merge_splits: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 4: ``merge_splits(m, l, z) -> o`` for m, l [rows, S] and z [rows, S, D]."""

    _require_callable("merge_splits", merge_splits)
    fixed_rng = np.random.default_rng(80_804)
    cases = []
    for index, (rows, keys, d, cuts, scale, note) in enumerate(MERGE_FIXED):
        m, l, z = _partials(fixed_rng, rows, keys, d, cuts, scale, MERGE_OFFSETS.get(index, 0.0))
        cases.append(case(m, l, z, label=f"{_splits(cuts)} of {keys} keys, D={d} ({note})"))
    rng = np.random.default_rng(_seed(seed))
    for _ in range(3):
        rows, keys, d = int(rng.integers(1, 5)), int(rng.integers(3, 60)), int(rng.choice([4, 8, 16]))
        cuts = tuple(sorted(int(c) for c in rng.integers(0, keys + 1, size=int(rng.integers(0, 5)))))
        m, l, z = _partials(rng, rows, keys, d, cuts, float(rng.choice([1.0, 5.0, 50.0])))
        empty = sum(hi == lo for lo, hi in zip((0, *cuts), (*cuts, keys)))
        cases.append(case(m, l, z, label=f"{_splits(cuts)} of {keys} keys"
                                         f"{f' ({empty} empty)' if empty else ''}, D={d}"))
    tol = tolerance("float32")
    return guarded_check("split-KV merge", merge_splits, _reference_merge, cases, tol=tol,
                         hint=f"{HINT_MERGE} (passes at a relative error ≤ {tol:.0e}, the float32 bound)",
                         fixed=len(MERGE_FIXED))


EXERCISES = (
    Exercise(function="token_slots", check=check_slots),
    Exercise(function="PagePool", check=check_pool),
    Exercise(function="paged_decode", check=check_paged_decode),
    Exercise(function="merge_splits", check=check_merge),
)


def check_lab(*, seed: int | None = None, **functions):
    """All four checks, with a summary line:
    ``check_lab(token_slots=..., PagePool=..., paged_decode=..., merge_splits=...)``."""
    return check_exercises(EXERCISES, functions, seed=seed)
