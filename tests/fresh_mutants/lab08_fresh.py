"""Fresh wrong answers (and alternative correct answers) for lab 08, written from the student notebook
and the solutions only. Each function or class docstring names the exercise it answers and the
mistake; the kernel variants share one kernel whose constexpr MUT selects it (MUT = 0 is correct)."""
import math

import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


# ---------------------------------------------------------------- exercise 1: token_slots
def slots_no_table(block_table_row, seq_len, page_size):
    """Exercise 1. Uses the logical page t // page_size as the physical page (ignores the table)."""
    t = torch.arange(seq_len)
    return t // page_size, t % page_size


def slots_offset_from_page(block_table_row, seq_len, page_size):
    """Exercise 1. Offset computed as t - page * page_size with the physical page."""
    t = torch.arange(seq_len)
    pages = block_table_row.long()[t // page_size]
    return pages, t - pages * page_size


def slots_int32(block_table_row, seq_len, page_size):
    """Exercise 1. Returns the table's own dtype (int32) instead of int64."""
    t = torch.arange(seq_len, dtype=torch.int32)
    return block_table_row[(t // page_size).long()], t % page_size


def slots_one_page_late(block_table_row, seq_len, page_size):
    """Exercise 1. Page index (t + 1) // page_size - a token at the end of a page goes to the next one."""
    t = torch.arange(seq_len)
    return block_table_row.long()[(t + 1) // page_size], t % page_size


# ---------------------------------------------------------------- exercise 2: PagePool
class _PoolBase:
    def __init__(self, num_pages, page_size):
        self.page_size = page_size
        self.free = list(range(num_pages))
        self.tables = {}
        self.lengths = {}

    def add(self, seq):
        self.tables[seq], self.lengths[seq] = [], 0

    def free_sequence(self, seq):
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


class PoolTakesBeforeChecking(_PoolBase):
    """Exercise 2. Pops pages one by one as tokens need them and raises when the list runs dry, leaving
    the pages already taken in the table (a half-done append)."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        out = []
        for t in range(length, length + n_tokens):
            if t % self.page_size == 0 and t // self.page_size >= len(table):
                if not self.free:
                    raise RuntimeError("out of pages")
                table.append(self.free.pop())
            out.append((table[t // self.page_size], t % self.page_size))
        self.lengths[seq] = length + n_tokens
        return out


class PoolFloorPages(_PoolBase):
    """Exercise 2. Pages needed by floor division: a partly filled last page is not allocated."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        needed = (length + n_tokens) // self.page_size - len(table)
        needed = max(needed, 0)
        if needed > len(self.free):
            raise RuntimeError("out of pages")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        pages = [table[min(t // self.page_size, len(table) - 1)] if table else -1
                 for t in range(length, length + n_tokens)]
        return [(p, t % self.page_size) for p, t in zip(pages, range(length, length + n_tokens))]


class PoolNewPagePerAppend(_PoolBase):
    """Exercise 2. Every append starts a fresh page (never fills the last one)."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        needed = -(-n_tokens // self.page_size)
        if needed > len(self.free):
            raise RuntimeError("out of pages")
        start = len(table)
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[start + i // self.page_size], i % self.page_size) for i in range(n_tokens)]


class PoolFreeForgetsLength(_PoolBase):
    """Exercise 2. free_sequence returns the pages but keeps the table (as an empty list) and the length."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        needed = -(-(length + n_tokens) // self.page_size) - len(table)
        if needed > len(self.free):
            raise RuntimeError("out of pages")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]

    def free_sequence(self, seq):
        self.free.extend(self.tables[seq])
        self.tables[seq] = []


class PoolLengthUpdatedEarly(_PoolBase):
    """Exercise 2. Updates the length before checking the free list: a refused append still grows it."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        self.lengths[seq] = length + n_tokens
        needed = -(-(length + n_tokens) // self.page_size) - len(table)
        if needed > len(self.free):
            raise RuntimeError("out of pages")
        table.extend(self.free.pop() for _ in range(needed))
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]


class CorrectPoolFifo(_PoolBase):
    """Exercise 2, correct: takes pages from the front of the free list (FIFO), checks before changing."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        have_room = len(table) * self.page_size - length
        extra = max(0, n_tokens - have_room)
        needed = -(-extra // self.page_size)
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        taken, self.free = self.free[:needed], self.free[needed:]
        table.extend(taken)
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]


# ---------------------------------------------------------------- exercise 3: paged decode kernel
@triton.jit
def _paged_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
                  stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_btb, stride_ob, stride_oh,
                  GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                  PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, MUT: tl.constexpr):
    kv = tl.program_id(0)
    b = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    if MUT == 1:     # heads of the group strided by the number of KV heads
        heads = kv + offs_g * tl.num_programs(0)
    else:
        heads = kv * GROUP + offs_g
    row_ok = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    seq_len = tl.load(lens_ptr + b)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    if MUT == 6:
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float16)
    for start in range(0, seq_len, BLOCK_N):
        tok = start + offs_n
        valid = tok < seq_len
        if MUT == 2:   # logical page used as physical page
            page = tok // PAGE_SIZE
        elif MUT == 7:  # page table indexed with the page stride (row of block_table taken as b * stride_kp)
            page = tl.load(bt_ptr + b * PAGE_SIZE + tok // PAGE_SIZE, mask=valid, other=0)
        else:
            page = tl.load(bt_ptr + b * stride_btb + tok // PAGE_SIZE, mask=valid, other=0)
        slot = tok % PAGE_SIZE
        rows = page.to(tl.int64) * stride_kp + slot * stride_ks + kv * stride_kh
        k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        if MUT != 3:   # 3: stale tokens past seq_len keep their score (k loaded as 0 -> score 0)
            s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MUT == 4:   # acc not rescaled
            acc = acc + tl.dot(p.to(v.dtype), v)
        elif MUT == 6:
            acc = (acc * alpha[:, None].to(tl.float16) + tl.dot(p.to(v.dtype), v).to(tl.float16)).to(tl.float16)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        if MUT == 5:   # running max not carried: m_i stays -inf
            m_i = m_i
        else:
            m_i = m_new
    out = acc.to(tl.float32) / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def _paged(q, k_pages, v_pages, block_table, seq_lens, mut, block_n=16):
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    _paged_kernel[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=block_n, MUT=mut)
    return o


def paged_group_strided(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Query heads of KV head kv taken as kv, kv + Hkv, ... (strided, not consecutive)."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 1)


def paged_no_table(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Reads logical page t // page_size directly (ignores the page table)."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 2)


def paged_no_score_mask(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Masks the K/V loads but not the scores: tokens past seq_len score 0."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 3)


def paged_acc_not_rescaled(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Rescales l but not acc."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 4)


def paged_max_not_carried(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Forgets m_i = m_new: every block rescales against -inf."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 5)


def paged_fp16_acc(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. acc in float16."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 6)


def paged_table_row_by_page_size(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Indexes the page table's row by b * PAGE_SIZE (not its row stride)."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 7)


def paged_hardcoded_block(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Hard-codes one KV head: a grid of (1, B) with GROUP = Hq (right for multi-query only)."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size = k_pages.shape[1]
    o = torch.empty_like(q)
    _paged_kernel[(1, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=n_heads, BLOCK_G=max(16, triton.next_power_of_2(n_heads)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=32, MUT=0)
    return o


def correct_paged_block32(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3, correct: the same kernel with 32 tokens per block."""
    return _paged(q, k_pages, v_pages, block_table, seq_lens, 0, block_n=32)


# ---------------------------------------------------------------- exercise 4: merge_splits
def merge_no_shift(m, l, z):
    """Exercise 4. Weights exp(m) without subtracting the common maximum (overflows)."""
    w = torch.exp(m)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


def merge_l_unweighted(m, l, z):
    """Exercise 4. Rescales z but sums the l's as they are."""
    w = torch.exp(m - m.amax(dim=1, keepdim=True))
    return (w[:, :, None] * z).sum(dim=1) / l.sum(dim=1, keepdim=True)


def merge_average_of_outputs(m, l, z):
    """Exercise 4. Normalises each split (z / l) and averages them with weights exp(m - max)."""
    w = torch.exp(m - m.amax(dim=1, keepdim=True))
    o = z / l.clamp_min(1e-30)[:, :, None]
    return (w[:, :, None] * o).sum(dim=1) / w.sum(dim=1, keepdim=True)


def merge_global_max(m, l, z):
    """Exercise 4. One maximum over every row and split instead of one per row."""
    w = torch.exp(m - m.max())
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


def merge_softmax_of_m(m, l, z):
    """Exercise 4. Weights softmax(m) over the splits, then z / l per split (forgets l in the weights)."""
    w = torch.softmax(m, dim=1)
    return (w[:, :, None] * z / l.clamp_min(1e-30)[:, :, None]).sum(dim=1)


def correct_merge_pairwise(m, l, z):
    """Exercise 4, correct: folds the splits in one at a time with the two-state merge rule."""
    mm, ll, zz = m[:, 0].clone(), l[:, 0].clone(), z[:, 0].clone()
    for s in range(1, m.shape[1]):
        new = torch.maximum(mm, m[:, s])
        safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
        a, b = torch.exp(mm - safe), torch.exp(m[:, s] - safe)
        ll = a * ll + b * l[:, s]
        zz = a[:, None] * zz + b[:, None] * z[:, s]
        mm = new
    return zz / ll[:, None]


def correct_slots_divmod(block_table_row, seq_len, page_size):
    """Exercise 1, correct: torch.div with rounding_mode='floor' and remainder."""
    t = torch.arange(seq_len, dtype=torch.int64)
    logical = torch.div(t, page_size, rounding_mode="floor")
    return block_table_row.to(torch.int64).index_select(0, logical), torch.remainder(t, page_size)


WRONG = {
    "slots": [slots_no_table, slots_offset_from_page, slots_int32, slots_one_page_late],
    "pool": [PoolTakesBeforeChecking, PoolFloorPages, PoolNewPagePerAppend, PoolFreeForgetsLength,
             PoolLengthUpdatedEarly],
    "paged_decode": [paged_group_strided, paged_no_table, paged_no_score_mask, paged_acc_not_rescaled,
                     paged_max_not_carried, paged_fp16_acc, paged_table_row_by_page_size, paged_hardcoded_block],
    "merge": [merge_no_shift, merge_l_unweighted, merge_average_of_outputs, merge_global_max, merge_softmax_of_m],
}
CORRECT = {
    "slots": [correct_slots_divmod],
    "pool": [CorrectPoolFifo],
    "paged_decode": [correct_paged_block32],
    "merge": [correct_merge_pairwise],
}
