"""Lab 08's checks accept the solution, report a blank as not implemented, and reject the known-wrong
answers: page and offset swapped, the last partial page over-read, a wrong GQA group mapping, a
split merge without the rescale, and pools that corrupt themselves or leak."""
from __future__ import annotations

import math

import pytest
import torch

from attnkit.device import ensure_triton_backend
from attnkit.labs import lab08

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SEED = 11


# ------------------------------------------------------------------------------- exercise 1: slots
def slots_right(row, seq_len, page_size):
    t = torch.arange(seq_len)
    return row.long()[t // page_size], t % page_size


def slots_swapped(row, seq_len, page_size):           # page and offset swapped
    t = torch.arange(seq_len)
    return row.long()[t % page_size], t // page_size


def slots_blank(row, seq_len, page_size):
    raise NotImplementedError


def test_slots():
    assert lab08.check_slots(slots_right, seed=SEED).passed
    assert lab08.check_slots(slots_blank).status == "not implemented"
    bad = lab08.check_slots(slots_swapped, seed=SEED)
    assert not bad.passed and "page_size" in bad.report and "hint" in bad.report


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


class PoolPartialOnFailure(PoolRight):
    """Takes the pages it can, then fails: the pool is corrupted by the failed request."""

    def append(self, seq, n):
        need = self.needed(seq, n)
        if need > len(self.free):
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


SEEDS = (0, 1, 2, 3, 4, 10, 14, 28, 38, 58)   # with 10 .. 58 the random workloads alone never catch a partial grab
WRONG_POOLS = {PoolPartialOnFailure: "raised an error but changed the pool first", PoolLeaks: "leak",
               PoolPageEveryToken: "pages; expected ceil(", PoolSwapped: "but its page table puts it at",
               PoolNeverRunsOut: "expected a RuntimeError (or MemoryError) and no change",
               PoolRefusesExactFit: "so it must succeed, but it raised RuntimeError",
               PoolCountsFailedTokens: "so it must succeed, but it raised RuntimeError"}


@pytest.mark.parametrize("seed", SEEDS)
def test_pool_accepts_the_right_pool(seed):
    result = lab08.check_pool(PoolRight, seed=seed)
    assert result.passed, result.report
    assert result.report == ("✅ page pool (append, free, out of pages): a scripted workload and 3 random ones "
                             "keep every token in its own slot, leak no page, and run out of pages cleanly "
                             "(no change to the pool).")


def test_pool_reports_a_blank():
    assert lab08.check_pool(PoolBlank).status == "not implemented"


@pytest.mark.parametrize("wrong", list(WRONG_POOLS), ids=lambda cls: cls.__name__)
def test_pool_rejects_a_wrong_pool_on_every_seed(wrong):
    for seed in SEEDS:
        result = lab08.check_pool(wrong, seed=seed)
        assert result.status == "failed", (wrong.__name__, seed)
        assert WRONG_POOLS[wrong] in result.report and "hint:" in result.report, (wrong.__name__, result.report)


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

    assert lab08._run_scripted_pool(Recording) is None
    assert free_at_refusal == [3, 0]


# ------------------------------------------------------------------------------ exercise 3: kernel
RIGHT, SWAPPED, OVER_READ, WRONG_GROUP, BLANK = 0, 1, 2, 3, 4


@triton.jit
def _lab_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
                stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_btb, stride_ob, stride_oh,
                N_KV: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    """The solution's kernel with one known bug switched on by BUG."""
    kv = tl.program_id(0)
    b = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    if BUG == 3:
        heads = kv + offs_g * N_KV                   # h % Hkv: interleaved groups
    else:
        heads = kv * GROUP + offs_g
    row_ok = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    seq_len = tl.load(lens_ptr + b)
    if BUG == 2:                                     # reads the whole last page
        seq_len = (seq_len + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        tok = start + offs_n
        valid = tok < seq_len
        if BUG == 1:                                 # page and offset swapped
            page = tl.load(bt_ptr + b * stride_btb + tok % PAGE_SIZE, mask=valid, other=0)
            slot = tok // PAGE_SIZE
        else:
            page = tl.load(bt_ptr + b * stride_btb + tok // PAGE_SIZE, mask=valid, other=0)
            slot = tok % PAGE_SIZE
        rows = page.to(tl.int64) * stride_kp + slot * stride_ks + kv * stride_kh
        k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _blank_kernel(q_ptr, o_ptr):
    raise NotImplementedError


def launcher(bug):
    def paged_decode(q, k_pages, v_pages, block_table, seq_lens):
        if bug == BLANK:
            _blank_kernel[(1,)](q, q)
        q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
        batch, n_heads, d = q.shape
        page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
        group = n_heads // n_kv
        o = torch.empty_like(q)
        _lab_kernel[(n_kv, batch)](q, k_pages, v_pages, block_table, seq_lens, o, 1 / math.sqrt(d),
                                   q.stride(0), q.stride(1), *k_pages.stride()[:3], block_table.stride(0),
                                   o.stride(0), o.stride(1), N_KV=n_kv, GROUP=group,
                                   BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=d,
                                   PAGE_SIZE=page_size, BLOCK_N=16, BUG=bug)
        return o
    return paged_decode


def test_paged_decode_accepts_the_solution_and_reports_a_blank():
    assert lab08.check_paged_decode(launcher(RIGHT), seed=SEED).passed
    assert lab08.check_paged_decode(launcher(BLANK)).status == "not implemented"


@pytest.mark.parametrize("bug", [SWAPPED, OVER_READ, WRONG_GROUP], ids=["swapped", "over-read", "group"])
def test_paged_decode_rejects_known_wrong_kernels(bug):
    result = lab08.check_paged_decode(launcher(bug), seed=SEED)
    assert not result.passed and "differs from the float64 reference" in result.report


# ------------------------------------------------------------------------------- exercise 4: merge
def merge_right(m, l, z):
    w = torch.exp(m - m.amax(dim=1, keepdim=True))
    return (w[:, :, None] * z).sum(1) / (w * l).sum(1, keepdim=True)


def merge_no_rescale(m, l, z):                        # adds the splits' states as they are
    return z.sum(1) / l.sum(1, keepdim=True)


def merge_average(m, l, z):                           # averages the splits' normalised outputs
    return (z / l[:, :, None].clamp_min(1e-30)).mean(1)


def merge_blank(m, l, z):
    raise NotImplementedError


def test_merge():
    assert lab08.check_merge(merge_right, seed=SEED).passed
    assert lab08.check_merge(merge_blank).status == "not implemented"
    for wrong in (merge_no_rescale, merge_average):
        result = lab08.check_merge(wrong, seed=SEED)
        assert not result.passed and "rescale" in result.report, wrong.__name__


def test_check_lab_summary_and_bad_argument():
    summary = lab08.check_lab(slots_right, PoolRight, launcher(RIGHT), merge_blank, seed=SEED)
    assert "3 of 4 exercises pass." in repr(summary)
    with pytest.raises(ValueError, match="token_slots: expected your function"):
        lab08.check_slots(None)
