"""Lab 08's checks: correct answers (the solution and others written differently) pass on every seed,
a blank is "not implemented yet", and a catalogue of wrong answers a student writes fails on every
seed: 50 seeds for the Python exercises, 10 for the Triton kernel, whose wrong versions (the solution's
kernel with one mistake each) must already fail on the fixed adversarial cases that come first.

A wrong kernel's output on the fixed cases is the same for every seed, so each kernel's launcher
remembers its outputs by input (``_memo``): ten seeds cost about one run of the interpreter.
"""
from __future__ import annotations

import hashlib
import linecache
import math
import re

import nbformat
import pytest
import torch
from mutation import FEW_SEEDS, SEEDS, assert_accepted, assert_rejected_on_every_seed, catalogue_params

from attnkit.classroom import checking
from attnkit.classroom.labchecks import lab08
from attnkit.classroom.notebooks import ROOT
from attnkit.device import ensure_triton_backend, runtime

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SOLUTION, LAB = "solutions/lab08_paged_attention.ipynb", "labs/lab08_paged_attention.ipynb"
ACCEPT_SEEDS = FEW_SEEDS[:3]          # correct kernels run the seeded cases too: three seeds of them
# Every wrong kernel must fail at a fixed case (asserted below), whose inputs do not depend on the seed:
# four seeds show it, and keep the interpreter's time down.
WRONG_SEEDS = FEW_SEEDS[:4]


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """The checks run here, not in a child process, so that a kernel's outputs cached by ``_memo`` serve
    every seed; the crash test switches the child process back on."""
    monkeypatch.setattr(checking, "ISOLATE", False)


def caught_at(report: str) -> int:
    where = re.search(r"case (\d+) of \d+", report)
    return int(where.group(1)) if where else 0


# ------------------------------------------------------------------------------- exercise 1: slots
def slots_right(row, seq_len, page_size):
    t = torch.arange(seq_len)
    return row.long()[t // page_size], t % page_size


def slots_loops(row, seq_len, page_size):
    pairs = [divmod(t, page_size) for t in range(seq_len)]
    return torch.tensor([int(row[p]) for p, _ in pairs]), torch.tensor([o for _, o in pairs])


def slots_repeat(row, seq_len, page_size):
    pages = row.long().repeat_interleave(page_size)[:seq_len]
    return pages, torch.arange(page_size).repeat(len(row))[:seq_len]


WRONG_SLOTS = {
    "page and offset swapped": lambda row, n, ps: (row.long()[torch.arange(n) % ps], torch.arange(n) // ps),
    "logical page, no table": lambda row, n, ps: (torch.arange(n) // ps, torch.arange(n) % ps),
    "ceil instead of floor": lambda row, n, ps: (row.long()[(torch.arange(n) + ps - 1) // ps],
                                                 torch.arange(n) % ps),
    "pages counted from 1": lambda row, n, ps: (row.long()[torch.arange(n) // ps + 1], torch.arange(n) % ps),
    "offset t // page_size": lambda row, n, ps: (row.long()[torch.arange(n) // ps], torch.arange(n) // ps),
    "a page per token": lambda row, n, ps: (row.long()[torch.arange(n)], torch.arange(n) % ps),
    "tokens 1 .. seq_len": lambda row, n, ps: (row.long()[torch.arange(1, n + 1) // ps],
                                               torch.arange(1, n + 1) % ps),
    "one token short": lambda row, n, ps: (row.long()[torch.arange(n - 1) // ps], torch.arange(n - 1) % ps),
    "table index by offset": lambda row, n, ps: (row.long()[torch.arange(n) % ps], torch.arange(n) % ps),
    "float pages and offsets": lambda row, n, ps: (row.float()[torch.arange(n) // ps], (torch.arange(n) % ps).float()),
    "pages in the table's int32": lambda row, n, ps: (row[torch.arange(n) // ps], torch.arange(n) % ps),
    "page and offset by bit masks (page sizes of 2ᵏ only)": lambda row, n, ps: (
        row.long()[torch.arange(n) >> int(math.log2(ps))], torch.arange(n) & (ps - 1)),
    # the right numbers, not the two int64 tensors the lab asks for
    "lists of ints": lambda row, n, ps: ([int(row[t // ps]) for t in range(n)], [t % ps for t in range(n)]),
    "NumPy arrays": lambda row, n, ps: tuple(x.numpy() for x in slots_right(row, n, ps)),
    "one stacked [2, seq_len] tensor": lambda row, n, ps: torch.stack(slots_right(row, n, ps)),
    "offsets one token short": lambda row, n, ps: (row.long()[torch.arange(n) // ps], torch.arange(n - 1) % ps),
}
RIGHT_SLOTS = {"vectorised": slots_right, "loops with divmod": slots_loops, "repeat_interleave": slots_repeat}


@pytest.mark.parametrize("mutant", catalogue_params(WRONG_SLOTS))
def test_slots_rejects_on_every_seed_at_a_fixed_case(mutant):
    assert_rejected_on_every_seed(lab08.check_slots, mutant, SEEDS, contains="hint:")
    assert caught_at(lab08.check_slots(mutant, seed=0).report) <= len(lab08.SLOTS_FIXED)


@pytest.mark.parametrize("mutant, rule", [
    ("lists of ints", "pages and offsets must be int64 tensors (the lab asks for two tensors), got list and list"),
    ("one stacked [2, seq_len] tensor", "token_slots must return a pair (pages, offsets), got Tensor"),
    ("pages in the table's int32", "pages and offsets must be int64 tensors (torch.long, as the docstring says: "
                                   "they index the page pool), got int32 and int64"),
    ("offsets one token short", "pages and offsets must each have shape [seq_len] = [11] (one entry per token), "
                                "got [11] and [10]"),
])
def test_slots_of_the_wrong_kind_are_reported_as_what_came_back(mutant, rule):
    """The check's verdict names the rule and what came back, never "your function raised" nor its own line."""
    report = lab08.check_slots(WRONG_SLOTS[mutant], seed=0).report
    assert f"case 1 of 11, seq_len=11, page_size=4, block_table_row=[7, 2, 9, 0]: your function returned the " \
           f"wrong kind of result: {rule}\n   hint:" in report, report
    assert "raised" not in report and "(line" not in report, report


def _slots_kept_by(key):
    """token_slots with the result kept between calls, looked up by ``key(seq_len, page_size)`` alone."""
    kept = {}

    def token_slots(row, n, ps):
        return kept.setdefault(key(n, ps), slots_right(row, n, ps))
    return token_slots


STATE_SLOTS = {"slots kept by (seq_len, page_size)": _slots_kept_by(lambda n, ps: (n, ps)),
               "slots kept by seq_len": _slots_kept_by(lambda n, ps: n)}


@pytest.mark.parametrize("mutant", catalogue_params(STATE_SLOTS))
def test_slots_kept_between_calls_are_rejected_on_every_seed(mutant):
    """The first cases' lengths and page sizes come again with other page tables."""
    assert_rejected_on_every_seed(lab08.check_slots, mutant, SEEDS, contains="again, with the page table")


@pytest.mark.parametrize("correct", catalogue_params(RIGHT_SLOTS))
def test_slots_accepts(correct):
    assert_accepted(lab08.check_slots, correct, SEEDS)


# -------------------------------------------------------------------------------- exercise 2: pool
class PoolRight:
    def __init__(self, num_pages, page_size):
        self.page_size, self.free, self.tables, self.lengths = page_size, list(range(num_pages)), {}, {}

    def add(self, seq):
        self.tables[seq], self.lengths[seq] = [], 0

    def needed(self, seq, n):
        return -(-(self.lengths[seq] + n) // self.page_size) - len(self.tables[seq])

    def append(self, seq, n):
        if self.needed(seq, n) > len(self.free):
            raise RuntimeError("out of pages")
        return self._take(seq, n)

    def _take(self, seq, n):
        table, length = self.tables[seq], self.lengths[seq]
        for _ in range(self.needed(seq, n)):
            table.append(self.free.pop())
        self.lengths[seq] = length + n
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n)]

    def free_sequence(self, seq):
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


class OutOfPages(RuntimeError):
    """A RuntimeError of the pool's own: what the lab asks for."""


class PoolFifo:
    """Another correct pool: a FIFO free list, math.ceil, one token at a time, its own RuntimeError."""

    def __init__(self, num_pages, page_size):
        self.page_size, self.free, self.tables, self.lengths = page_size, list(range(num_pages)), {}, {}

    def add(self, seq):
        self.tables[seq], self.lengths[seq] = [], 0

    def append(self, seq, n):
        need = math.ceil((self.lengths[seq] + n) / self.page_size) - len(self.tables[seq])
        if need > len(self.free):
            raise OutOfPages(f"{need} pages needed, {len(self.free)} free")
        slots = []
        for _ in range(n):
            pos = self.lengths[seq]
            if pos % self.page_size == 0:
                self.tables[seq].append(self.free.pop(0))
            slots.append((self.tables[seq][-1], pos % self.page_size))
            self.lengths[seq] = pos + 1
        return slots

    def free_sequence(self, seq):
        self.free += self.tables[seq]
        del self.tables[seq], self.lengths[seq]


class PoolPartialOnFailure(PoolRight):
    """Takes the pages it can, then fails: the pool is corrupted by the failed request."""

    def append(self, seq, n):
        if self.needed(seq, n) > len(self.free):
            while self.free:
                self.tables[seq].append(self.free.pop())
            raise RuntimeError("out of pages")
        return self._take(seq, n)


class PoolLeaks(PoolRight):
    def free_sequence(self, seq):                    # forgets the sequence, never returns its pages
        del self.tables[seq], self.lengths[seq]


class PoolPageEveryToken(PoolRight):
    def needed(self, seq, n):                        # a new page for every token
        return n


class PoolSwapped(PoolRight):
    def _take(self, seq, n):                         # reports (offset, page) instead of (page, offset)
        return [(o, p) for p, o in super()._take(seq, n)]


class PoolBlank(PoolRight):
    def append(self, seq, n):
        raise NotImplementedError


class PoolNeverRunsOut(PoolRight):
    """Takes the pages it can and returns without an error when there are not enough."""

    def append(self, seq, n):
        return self._take(seq, n) if self.needed(seq, n) <= len(self.free) else []


class PoolRefusesExactFit(PoolRight):
    def append(self, seq, n):                        # >= instead of >: refuses to take the last free pages
        if self.needed(seq, n) >= len(self.free) and self.needed(seq, n) > 0:
            raise RuntimeError("out of pages")
        return self._take(seq, n)


class PoolCountsFailedTokens(PoolRight):
    def append(self, seq, n):                        # counts the refused tokens as stored
        if self.needed(seq, n) > len(self.free):
            self.lengths[seq] += n
            raise RuntimeError("out of pages")
        return self._take(seq, n)


class PoolFloorPlusOne(PoolRight):
    def needed(self, seq, n):                        # (length + n) // page_size + 1: one page too many at a fit
        return (self.lengths[seq] + n) // self.page_size + 1 - len(self.tables[seq])


class PoolIgnoresPartialPage(PoolRight):
    def needed(self, seq, n):                        # ceil(n / page_size) new pages, room in the last one ignored
        return -(-n // self.page_size)


class PoolForgetsLength(PoolRight):
    def _take(self, seq, n):                         # never records the new length: slots are handed out twice
        length = self.lengths[seq]
        slots = super()._take(seq, n)
        self.lengths[seq] = length
        return slots


class PoolKeepsFreedTable(PoolRight):
    def free_sequence(self, seq):                    # returns the pages but keeps the table that names them
        self.free.extend(self.tables[seq])


class PoolClassTables(PoolRight):
    tables: dict = {}                                # one dict for every pool: shared by the class

    def __init__(self, num_pages, page_size):
        self.page_size, self.free, self.lengths = page_size, list(range(num_pages)), {}


class PoolKeepsAnEmptyTable(PoolRight):
    def free_sequence(self, seq):                    # returns the pages, keeps an empty table and the length
        self.free.extend(self.tables[seq])
        self.tables[seq] = []


class PoolRaisesMemoryError(PoolRight):
    def append(self, seq, n):                        # MemoryError, where the lab asks for RuntimeError
        if self.needed(seq, n) > len(self.free):
            raise MemoryError("out of pages")
        return self._take(seq, n)


class PoolAsserts(PoolRight):
    def append(self, seq, n):                        # an assert: AssertionError (and none under python -O)
        assert self.needed(seq, n) <= len(self.free), "out of pages"
        return self._take(seq, n)


class PoolRaisesValueError(PoolRight):
    def append(self, seq, n):
        if self.needed(seq, n) > len(self.free):
            raise ValueError("out of pages")
        return self._take(seq, n)


class PoolPopsFromEmpty(PoolRight):
    def append(self, seq, n):                        # no check: free.pop() raises IndexError when it runs dry
        return self._take(seq, n)


class PoolFloatSlots(PoolRight):
    def _take(self, seq, n):                         # (page, offset) as floats: a float cannot index the pool
        return [(float(p), float(o)) for p, o in super()._take(seq, n)]


class PoolSlotTriples(PoolRight):
    def _take(self, seq, n):                         # (page, offset, token) where the lab asks for pairs
        length = self.lengths[seq]
        return [(p, o, length + i) for i, (p, o) in enumerate(super()._take(seq, n))]


class PoolGeneratorSlots(PoolRight):
    def _take(self, seq, n):                         # a generator: used up after one pass
        return (slot for slot in super()._take(seq, n))


class PoolMapSlots(PoolRight):
    def _take(self, seq, n):                         # map(tuple, ...): an iterator too
        return map(tuple, super()._take(seq, n))


RAISE_RUNTIME = "append must raise RuntimeError"
WRONG_POOLS = {PoolPartialOnFailure: "raised an error but changed the pool first", PoolLeaks: "leak",
               PoolPageEveryToken: "pages; expected ceil(", PoolSwapped: "but its page table puts it at",
               PoolNeverRunsOut: "expected a RuntimeError and no change",
               PoolRaisesMemoryError: f"{RAISE_RUNTIME} (the lab's rule: a server catches it, frees or preempts "
                                      "a sequence and retries), but it raised MemoryError",
               PoolAsserts: f"{RAISE_RUNTIME}", PoolRaisesValueError: f"{RAISE_RUNTIME}",
               PoolPopsFromEmpty: "but it raised IndexError", PoolFloatSlots: "a page id and an offset are ints",
               PoolSlotTriples: "each slot must be a (page, offset) pair",
               PoolRefusesExactFit: "so it must succeed, but it raised RuntimeError",
               PoolCountsFailedTokens: "so it must succeed, but it raised RuntimeError",
               PoolFloorPlusOne: "pages; expected ceil(", PoolIgnoresPartialPage: "pages; expected ceil(",
               PoolForgetsLength: "slot", PoolKeepsFreedTable: "pool.tables still has an entry for it",
               PoolClassTables: "pool.tables still has an entry for it",
               PoolKeepsAnEmptyTable: "pool.tables still has an entry for it",
               PoolGeneratorSlots: "returned a generator where a list [(page, offset), ...] belongs",
               PoolMapSlots: "returned a map where a list [(page, offset), ...] belongs"}
RIGHT_POOLS = {"LIFO free list": PoolRight, "FIFO free list, a token at a time": PoolFifo}


@pytest.mark.parametrize("wrong", list(WRONG_POOLS), ids=lambda cls: cls.__name__)
def test_pool_rejects_a_wrong_pool_on_every_seed(wrong):
    assert_rejected_on_every_seed(lab08.check_pool, wrong, SEEDS, contains=WRONG_POOLS[wrong])
    report = lab08.check_pool(wrong, seed=0).report
    assert "hint:" in report and "the scripted workload" in report     # the fixed case already fails it


@pytest.mark.parametrize("correct", catalogue_params(RIGHT_POOLS))
def test_pool_accepts(correct):
    assert_accepted(lab08.check_pool, correct, SEEDS)
    assert lab08.check_pool(correct, seed=0).report == (
        "✅ page pool (append, free, out of pages): a scripted workload and 3 random ones keep every token "
        "in its own slot, leak no page, and run out of pages cleanly (no change to the pool).")


def test_pool_reports_a_blank():
    assert lab08.check_pool(PoolBlank).status == "not implemented"


def test_a_partial_grab_is_caught_where_the_pool_runs_out_with_pages_free():
    report = lab08.check_pool(PoolPartialOnFailure, seed=0).report
    assert "the scripted workload" in report and "step 4, append(0, 19): out of pages (4 needed, 3 free)" in report


def test_the_scripted_workload_runs_out_with_pages_free_and_with_none_free():
    """What the scripted workload is for: an append that needs more pages than are free while some are
    free (a partial grab would change the pool), and one with none free."""
    free_at_refusal = []

    class Recording(PoolRight):
        def append(self, seq, n):
            if self.needed(seq, n) > len(self.free):
                free_at_refusal.append(len(self.free))
            return super().append(seq, n)

    assert lab08.run_scripted_pool(Recording) is None
    assert free_at_refusal == [3, 0]


# ------------------------------------------------------------------------------ exercise 3: kernel
def _kernel_cell(relpath: str) -> str:
    cells = nbformat.read(ROOT / relpath, as_version=4).cells
    (source,) = [c.source for c in cells if c.cell_type == "code" and "def paged_decode_kernel" in c.source]
    return source


def _memo(fn, name: str):
    """``fn`` remembering its output for each input it has seen (inputs are read, never written)."""
    seen: dict = {}

    def key(t):              # the layout too: one case's values in two layouts are two inputs
        return (tuple(t.shape), tuple(t.stride()), str(t.dtype),
                hashlib.sha1(t.detach().cpu().numpy().tobytes()).hexdigest())

    def call(*args):
        at = tuple(key(t) for t in args)
        if at not in seen:
            seen[at] = fn(*args)
        return seen[at].clone()
    call.__name__ = name
    return call


def build(name: str, *replacements: tuple[str, str], relpath: str = SOLUTION, memo: bool = True):
    """The lab's kernel cell from ``relpath`` (kernel and launcher), each ``old`` replaced by ``new``."""
    source = _kernel_cell(relpath)
    for old, new in replacements:
        assert source.count(old) == 1, f"{name}: {old!r} occurs {source.count(old)} times in the kernel"
        source = source.replace(old, new)
    namespace = {"math": math, "torch": torch, "triton": triton, "tl": tl}
    # Triton reads a kernel's source through `inspect`: register the cell like IPython does.
    filename = f"<lab08 {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)
    launcher = namespace["paged_decode"]
    return _memo(launcher, name) if memo else launcher


HEADS = "heads = kv * GROUP + offs_g"
VALID = "valid = tok < seq_len"
PAGE = "page = tl.load(bt_ptr + b * stride_btb + tok // PAGE_SIZE, mask=valid, other=0)"
SLOT = "slot = tok % PAGE_SIZE"
S_DOT = "s = tl.dot(q, tl.trans(k)) * sm_scale"
S_MASK = 's = tl.where(valid[None, :], s, float("-inf"))'
M_NEW = "m_new = tl.maximum(m_i, tl.max(s, 1))"
ALPHA = "alpha = tl.exp(m_i - m_new)"
P = "p = tl.exp(s - m_new[:, None])"
L = "l_i = l_i * alpha + tl.sum(p, 1)"
ACC = "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)"
SEQ_LEN = "seq_len = tl.load(lens_ptr + b)"
M_INIT = 'm_i = tl.full([BLOCK_G], float("-inf"), tl.float32)'
LOG2E = "1.4426950408889634"
V_LOAD = "v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)"
CONTIGUOUS = "q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()"

WRONG_DECODE = {
    "no rescale of acc": [(ACC, "acc = acc + tl.dot(p.to(v.dtype), v)")],
    "no rescale of l": [(L, "l_i = l_i + tl.sum(p, 1)")],
    "no maximum (exp of the raw scores)": [(M_NEW, "m_new = tl.zeros([BLOCK_G], tl.float32)")],
    "running max starts at 0": [(M_INIT, "m_i = tl.zeros([BLOCK_G], tl.float32)")],
    "the block's row max, not the running one": [(M_NEW, "m_new = tl.max(s, 1)")],
    "one max for the whole tile": [(M_NEW, "m_new = tl.maximum(m_i, tl.max(tl.max(s, 1), 0))")],
    "page and offset swapped": [(PAGE, PAGE.replace("tok // PAGE_SIZE", "tok % PAGE_SIZE")),
                                (SLOT, "slot = tok // PAGE_SIZE")],
    "reads the whole last page": [(SEQ_LEN, SEQ_LEN + "\n    seq_len = (seq_len + PAGE_SIZE - 1) // PAGE_SIZE"
                                                      " * PAGE_SIZE")],
    "h % Hkv": [(HEADS, "heads = kv + offs_g * tl.num_programs(0)")],
    "valid = tok <= seq_len": [(VALID, "valid = tok <= seq_len")],
    "logical page, no table": [(PAGE, "page = tok // PAGE_SIZE")],
    "sequence 0's page table for all": [(PAGE, PAGE.replace("b * stride_btb + ", ""))],
    "no softmax scale": [(S_DOT, "s = tl.dot(q, tl.trans(k))")],
    "no score mask (loads masked only)": [(S_MASK, "s = s")],
    "o allocated in float32": [("o = torch.empty_like(q)", "o = torch.empty_like(q, dtype=torch.float32)")],
    "sequence 0's length for all": [(SEQ_LEN, "seq_len = tl.load(lens_ptr)")],
    "scale 1/D, not 1/sqrt(D)": [("1.0 / math.sqrt(head_dim)", "1.0 / head_dim")],
    "blocks up to seq_len - 1": [("range(0, seq_len, BLOCK_N)", "range(0, seq_len - 1, BLOCK_N)")],
    # poison: V loaded without its mask (relying on p = 0), or masked without other=
    "V loaded unmasked, relying on p = 0": [(V_LOAD, "v = tl.load(v_ptr + rows[:, None] + offs_d[None, :])")],
    "V masked without other=": [(V_LOAD, "v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None])")],
    # precision: fp16 running sums, log2(e) cut short
    "acc kept in fp16": [(ACC, "acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v))"
                               ".to(tl.float16).to(tl.float32)")],
    "l kept in fp16": [(L, "l_i = (l_i * alpha + tl.sum(p, 1)).to(tl.float16).to(tl.float32)")],
    "exp2 with log2(e) cut to 1.44": [(S_DOT, "s = tl.dot(q, tl.trans(k)) * (sm_scale * 1.44)"),
                                      (ALPHA, "alpha = tl.exp2(m_i - m_new)"),
                                      (P, "p = tl.exp2(s - m_new[:, None])")],
    # sentinels: the store without its row mask
    "o stored without the row mask": [("out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])",
                                       "out.to(o_ptr.dtype.element_ty))")],
    # page sizes assumed to be powers of two (round 4's class; the lab takes any page size)
    "offset tok & (PAGE_SIZE - 1)": [(SLOT, "slot = tok & (PAGE_SIZE - 1)")],
    "page and offset by a shift of log2(page_size)": [
        ("PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):",
         "PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SHIFT: tl.constexpr):"),
        (PAGE, PAGE.replace("tok // PAGE_SIZE", "(tok >> SHIFT)")),
        (SLOT, "slot = tok - (tok >> SHIFT) * PAGE_SIZE"),
        ("PAGE_SIZE=page_size, BLOCK_N=16)", "PAGE_SIZE=page_size, BLOCK_N=16, SHIFT=page_size.bit_length() - 1)")],
    "page size rounded up to a power of two in the launcher": [
        ("PAGE_SIZE=page_size", "PAGE_SIZE=triton.next_power_of_2(page_size)")],
    # layouts never varied (round 6's class): a tensor's strides taken from its shape or from a sibling's
    "block table row stride from its shape (round 6's pd6_bt_stride_from_shape)": [
        ("block_table.stride(0), o.stride(0)", "block_table.shape[1], o.stride(0)")],
    "pages left as given, V read through K's strides": [(CONTIGUOUS, "q = q.contiguous()")],
    "pages left as given, page strides from the shape": [
        (CONTIGUOUS, "q = q.contiguous()"),
        ("k_pages.stride(0), k_pages.stride(1), k_pages.stride(2)",
         "page_size * n_kv * head_dim, n_kv * head_dim, head_dim")],
    "q left as given, its head stride taken as D": [
        (CONTIGUOUS, "k_pages, v_pages = k_pages.contiguous(), v_pages.contiguous()"),
        ("q.stride(0), q.stride(1), k_pages", "q.stride(0), head_dim, k_pages")],
}
RIGHT_DECODE = {
    "the solution": [],
    "exp2 with log2(e) in the scale": [(S_DOT, f"s = tl.dot(q, tl.trans(k)) * (sm_scale * {LOG2E})"),
                                       (ALPHA, "alpha = tl.exp2(m_i - m_new)"),
                                       (P, "p = tl.exp2(s - m_new[:, None])")],
    "sums of products instead of tl.dot": [
        (S_DOT, "s = tl.sum(q.to(tl.float32)[:, None, :] * k.to(tl.float32)[None, :, :], 2) * sm_scale"),
        (ACC, "acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], 1)")],
    "mask on p, finite masked scores": [(S_MASK, "s = tl.where(valid[None, :], s, -1.0e30)"),
                                        (P, "p = tl.where(valid[None, :], tl.exp(s - m_new[:, None]), 0.0)")],
}
_BUILT: dict = {}


def built(catalogue: dict, name: str):
    if name not in _BUILT:
        _BUILT[name] = build(name, *catalogue[name])
    return _BUILT[name]


@pytest.mark.slow
@pytest.mark.parametrize("mutant", list(WRONG_DECODE))
def test_paged_decode_rejects_on_every_seed_at_a_fixed_case(mutant):
    kernel = built(WRONG_DECODE, mutant)
    assert_rejected_on_every_seed(lab08.check_paged_decode, kernel, WRONG_SEEDS, contains="hint:")
    report = lab08.check_paged_decode(kernel, seed=0).report
    assert 1 <= caught_at(report) <= len(lab08.DECODE_FIXED), report


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(RIGHT_DECODE))
def test_paged_decode_accepts(variant):
    assert_accepted(lab08.check_paged_decode, built(RIGHT_DECODE, variant), ACCEPT_SEEDS)


@pytest.mark.parametrize("isolate", [False, True], ids=["in process", "in a child process"])
def test_an_output_in_another_dtype_fails_where_the_check_runs(monkeypatch, isolate):
    """o allocated in float32 fails at the first case, in the child process that runs the cases as here
    (the dtype is judged inside the check, not afterwards in the parent)."""
    monkeypatch.setattr(checking, "ISOLATE", isolate)
    if isolate and not checking.can_isolate():
        pytest.skip("this process has started CUDA: the check runs in process")
    report = lab08.check_paged_decode(built(WRONG_DECODE, "o allocated in float32"), seed=0).report
    assert "case 1 of" in report and "your function returned the wrong kind of result: o is float32; expected " \
                                     "float16, the dtype of q" in report, report
    assert "raised" not in report and "(line" not in report, report


def test_no_rescale_fails_at_the_score_gap_case():
    report = lab08.check_paged_decode(built(WRONG_DECODE, "no rescale of acc"), seed=0).report
    assert "case 1 of" in report and "scores ±192 over three blocks" in report


def test_fixed_decode_cases_vary_every_tensor_s_layout_that_may_vary():
    """The block table's row stride (not its width), q's and K's row strides (padded), and V's order
    (unlike K's) each differ from the contiguous layout in some fixed case with two sequences or more;
    the table's columns and seq_lens stay contiguous (the given kernel reads them so)."""
    device = runtime().device
    cases = lab08.decode_cases(lab08.DECODE_FIXED, lab08.DECODE_LAYOUTS, torch.Generator().manual_seed(80_803),
                               device)
    seen = set()
    for c in cases:
        q, k_pages, v_pages, table, lens = c.args
        assert table.stride(1) == 1 and lens.is_contiguous()
        if table.shape[0] > 1 and table.stride(0) != table.shape[1]:
            seen.add("table")
        if q.stride(1) != q.shape[2] and k_pages.stride(2) != k_pages.shape[3]:
            seen.add("padded")
        if v_pages.stride() != k_pages.stride():
            seen.add("v apart")
    assert seen == {"table", "padded", "v apart"}


def test_every_fixed_decode_sequence_spans_three_blocks_but_one_token():
    for lens, *_ in lab08.DECODE_FIXED:
        assert all(n == 1 or n > 2 * lab08.BLOCK_N for n in lens), lens


def test_paged_decode_must_not_call_the_course_kernel():
    def uses_the_course_kernel(q, k_pages, v_pages, block_table, seq_lens):
        from attnkit import paged_decode
        return paged_decode(q, k_pages, v_pages, block_table, seq_lens)

    report = lab08.check_paged_decode(uses_the_course_kernel, seed=0).report
    assert "your function called attnkit.kernels.paged.paged_decode, the course's own" in report


def test_paged_decode_must_not_compute_with_torch():
    def gathers_and_multiplies(q, k_pages, v_pages, block_table, seq_lens):
        out = torch.empty_like(q)
        group = q.shape[1] // k_pages.shape[2]
        for b, n in enumerate(seq_lens.tolist()):
            t = torch.arange(n)
            pages, slots = block_table[b].long()[t // k_pages.shape[1]], t % k_pages.shape[1]
            k = k_pages[pages, slots].float().repeat_interleave(group, 1)          # [n, Hq, D]
            v = v_pages[pages, slots].float().repeat_interleave(group, 1)
            s = torch.einsum("hd,nhd->hn", q[b].float(), k) / math.sqrt(q.shape[-1])
            out[b] = torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v).half()
        return out

    report = lab08.check_paged_decode(gathers_and_multiplies, seed=0).report
    assert "a computation outside your kernel" in report, report
    assert lab08.check_merge(merge_right, seed=0).passed          # a PyTorch exercise: torch allowed there


# ------------------------------------------------------------------------------- exercise 4: merge
def merge_right(m, l, z):
    w = torch.exp(m - m.amax(dim=1, keepdim=True))
    return (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True)


def merge_pairwise(m, l, z):
    """Lesson 3's rule, one split at a time."""
    m_run, l_run, z_run = m[:, 0], l[:, 0], z[:, 0]
    for s in range(1, m.shape[1]):
        m_new = torch.maximum(m_run, m[:, s])
        safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        a, b = torch.exp(m_run - safe), torch.exp(m[:, s] - safe)
        m_run, l_run, z_run = m_new, a * l_run + b * l[:, s], a[:, None] * z_run + b[:, None] * z[:, s]
    return z_run / l_run[:, None]


def merge_lse(m, l, z):
    """Weights from each split's log-sum-exp m + log ℓ."""
    lse = m + torch.log(l)                           # −inf for an empty split
    w = torch.softmax(lse, dim=1)
    out = torch.where(l[:, :, None] > 0, z / l[:, :, None].clamp_min(1e-30), torch.zeros_like(z))
    return (w[:, :, None] * out).sum(1)


def merge_one_split_z(m, l, z):
    """'One split: nothing to merge' (round 4): z is the unnormalised sum; it needs dividing by ℓ."""
    return z[:, 0] if m.shape[1] == 1 else merge_right(m, l, z)


def merge_lone_split_z(m, l, z):
    """When only one split of every row holds keys, that split's z, taken as its output."""
    full = l > 0
    if bool((full.sum(1) == 1).all()):
        return (z * full[:, :, None]).sum(1)
    return merge_right(m, l, z)


def merge_one_split_first_row(m, l, z):
    """One split: z / ℓ with the first row's ℓ for every row."""
    return z[:, 0] / l[0, 0] if m.shape[1] == 1 else merge_right(m, l, z)


_WEIGHTS: dict = {}


def merge_cached_by_shape(m, l, z):
    """The weights exp(m − M) computed once per shape of m and kept ('they only depend on the layout')."""
    if tuple(m.shape) not in _WEIGHTS:
        _WEIGHTS[tuple(m.shape)] = torch.exp(m - m.amax(dim=1, keepdim=True))
    w = _WEIGHTS[tuple(m.shape)]
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


WRONG_MERGE = {
    "no rescale": lambda m, l, z: z.sum(1) / l.sum(1, keepdim=True),
    "average of the splits' outputs": lambda m, l, z: (z / l[:, :, None].clamp_min(1e-30)).mean(1),
    "weights exp(M − m)": lambda m, l, z: (
        lambda w: (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True))(torch.exp(m.amax(1, keepdim=True) - m)),
    "denominator not rescaled": lambda m, l, z: (
        lambda w: (w[:, :, None] * z).sum(1) / l.sum(1, keepdim=True))(torch.exp(m - m.amax(1, keepdim=True))),
    "z / ℓ per split (0/0 when empty)": lambda m, l, z: (
        lambda w: (w[:, :, None] * l[:, :, None] * (z / l[:, :, None])).sum(1) / (w * l).sum(1, keepdim=True))(
        torch.exp(m - m.amax(1, keepdim=True))),
    "one maximum for all rows": lambda m, l, z: (
        lambda w: (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True))(torch.exp(m - m.max())),
    "softmax of m, ℓ ignored": lambda m, l, z: (
        torch.softmax(m, 1)[:, :, None] * z / l[:, :, None].clamp_min(1e-30)).sum(1),
    "rescaled to the minimum": lambda m, l, z: (
        lambda w: (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True))(torch.exp(m - m.amin(1, keepdim=True))),
    "numerator not rescaled": lambda m, l, z: z.sum(1) / (torch.exp(m - m.amax(1, keepdim=True)) * l).sum(
        1, keepdim=True),
    "exp(m) without a maximum": lambda m, l, z: (
        lambda w: (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True))(torch.exp(m)),
    "the first split's maximum": lambda m, l, z: (
        lambda w: (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True))(torch.exp(m - m[:, :1])),
    "nan_to_num(m, neginf=0)": lambda m, l, z: (
        lambda mm: (lambda w: (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True))(
            torch.exp(mm - mm.amax(1, keepdim=True))))(torch.nan_to_num(m, neginf=0.0)),
    "max without keepdim": lambda m, l, z: (
        lambda w: (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True))(torch.exp(m - m.amax(1))),
    # boundaries (round 4's class): one split, one split that holds every key
    "one split: its z returned ('nothing to merge')": merge_one_split_z,
    "the only split with keys: its z returned": merge_lone_split_z,
    "one split: z divided by the first row's ℓ": merge_one_split_first_row,
    # state kept between calls: weights cached by the inputs' shapes
    "weights cached by the shapes": merge_cached_by_shape,
}
RIGHT_MERGE = {"rescale to the max": merge_right, "pairwise, lesson 3's rule": merge_pairwise,
               "log-sum-exp weights": merge_lse}


@pytest.mark.parametrize("mutant", catalogue_params(WRONG_MERGE))
def test_merge_rejects_on_every_seed_at_a_fixed_case(mutant):
    assert_rejected_on_every_seed(lab08.check_merge, mutant, SEEDS, contains="hint:")
    assert 1 <= caught_at(lab08.check_merge(mutant, seed=0).report) <= len(lab08.MERGE_FIXED)


@pytest.mark.parametrize("correct", catalogue_params(RIGHT_MERGE))
def test_merge_accepts(correct):
    assert_accepted(lab08.check_merge, correct, SEEDS)


def test_merge_must_not_call_the_course_merge():
    from attnkit.kernels.paged import merge_partials

    report = lab08.check_merge(lambda m, l, z: merge_partials(m, l, z), seed=0).report
    assert "your function called attnkit.kernels.paged.merge_partials" in report


def test_catalogues_are_large_enough():
    for wrong, right in ((WRONG_SLOTS, RIGHT_SLOTS), (WRONG_POOLS, RIGHT_POOLS), (WRONG_DECODE, RIGHT_DECODE),
                         (WRONG_MERGE, RIGHT_MERGE)):
        assert len(wrong) >= 8 and len(right) >= 2


# ---------------------------------------------------------------------------- notebooks and blanks
def _functions(relpath: str) -> dict:
    """The exercise functions of a lab notebook, its Triton kernel read through linecache."""
    cells = [c.source for c in nbformat.read(ROOT / relpath, as_version=4).cells if c.cell_type == "code"]
    namespace: dict = {"math": math, "torch": torch, "triton": triton, "tl": tl}
    for index, source in enumerate(cells[2:]):            # [0] setup, [1] imports
        if "check_" in source:
            continue
        filename = f"<{relpath} cell {index}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return {e.function: namespace[e.function] for e in lab08.EXERCISES}


def test_solution_passes_check_lab():
    summary = lab08.check_lab(seed=3, **_functions(SOLUTION))
    assert summary.passed and repr(summary).endswith("4 of 4 exercises pass."), repr(summary)


def test_blank_lab_is_not_implemented_yet():
    summary = lab08.check_lab(seed=3, **_functions(LAB))
    assert [r.status for r in summary.results] == ["not implemented"] * 4, repr(summary)
    assert "Traceback" not in repr(summary)


def test_check_lab_needs_every_function_and_checks_reject_non_functions():
    with pytest.raises(ValueError, match="functions: no function named PagePool"):
        lab08.check_lab(token_slots=slots_right, paged_decode=None, merge_splits=merge_right)
    with pytest.raises(ValueError, match="token_slots: expected your function"):
        lab08.check_slots(None)


def test_a_crashing_decode_kernel_fails_and_names_the_case(monkeypatch):
    """A store far outside o corrupts the heap or faults: the check runs in a child process and reports
    the case it was on instead of taking the notebook down."""
    monkeypatch.setattr(checking, "ISOLATE", True)
    if not checking.can_isolate():
        pytest.skip("a compiled kernel's stray store faults the GPU context: crash isolation is for the interpreter")
    kernel = build("store far away", ("out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])",
                                      "out.to(o_ptr.dtype.element_ty))"),
                   ("tl.store(o_ptr + b * stride_ob", "tl.store(o_ptr + (1 << 26) + b * stride_ob"), memo=False)
    report = lab08.check_paged_decode(kernel, seed=0).report
    # a store far away faults, hits a sentinel, or corrupts the child so the case computes NaN: each fails it
    assert "case 1 of" in report and any(n in report for n in ("crashed", "outside the tensor", "non-finite")), report
