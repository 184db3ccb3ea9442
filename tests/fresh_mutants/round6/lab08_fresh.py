# ruff: noqa: E501, B007, F841, B006
"""Round 6 of fresh wrong answers for lab 08 (paged attention), written from the lab's text and its solution only
(the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in round 5; the kernel answers are the solution's
kernel and launch function with one student's edit, the pool answers subclass the solution's pool and change
one method. New classes here: offsets or pages in int32 where int64 is asked, a pool whose tables live on the
class (shared by every pool), a mutable default list shared by every sequence, a freed sequence whose length is
kept, a block table's row stride taken from its shape, a running maximum started at 0, q scaled in place by
the launch, one maximum for all the rows of a merge, a merge that shifts m in place, a merge maximum clamped
at 0. The correct answers: pages by repeat_interleave, a first-in first-out free list, page ids loaded
without other= (their K/V loads are masked), and weights from a softmax over the splits' maxima."""
import math

import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ---------------------------------------------------------------- the solution

def token_slots(block_table_row, seq_len, page_size):
    """(pages, offsets): int64 [seq_len] each, for tokens 0 .. seq_len-1 of one sequence."""
    t = torch.arange(seq_len)                              # [seq_len] token positions
    pages = block_table_row.long()[t // page_size]         # logical page -> physical page
    offsets = t % page_size                                # position inside the page
    return pages, offsets


class PagePool:
    """A free list of pages and one page table per sequence."""

    def __init__(self, num_pages, page_size):
        self.page_size = page_size
        self.free = list(range(num_pages))       # page ids not in use
        self.tables = {}                         # seq id -> list of page ids
        self.lengths = {}                        # seq id -> tokens stored

    def add(self, seq):
        self.tables[seq], self.lengths[seq] = [], 0

    def append(self, seq, n_tokens):
        """Room for n_tokens more tokens of seq; returns their [(page, offset), ...]."""
        table, length = self.tables[seq], self.lengths[seq]
        pages_after = -(-(length + n_tokens) // self.page_size)      # ceil
        needed = pages_after - len(table)
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]

    def free_sequence(self, seq):
        """Return every page of seq to the free list and forget seq."""
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


@triton.jit
def paged_decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
                        stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_btb, stride_ob, stride_oh,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                        PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    kv = tl.program_id(0)                                   # KV head
    b = tl.program_id(1)                                    # sequence
    offs_g = tl.arange(0, BLOCK_G)                          # [BLOCK_G] rows: query heads of the group
    offs_d = tl.arange(0, HEAD_DIM)                         # [D]
    offs_n = tl.arange(0, BLOCK_N)                          # [BLOCK_N] tokens of one block
    heads = kv * GROUP + offs_g                             # query heads that read KV head kv
    row_ok = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)            # [BLOCK_G, D]
    seq_len = tl.load(lens_ptr + b)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        tok = start + offs_n
        valid = tok < seq_len                               # the last page is partly filled
        page = tl.load(bt_ptr + b * stride_btb + tok // PAGE_SIZE, mask=valid, other=0)
        slot = tok % PAGE_SIZE
        rows = page.to(tl.int64) * stride_kp + slot * stride_ks + kv * stride_kh       # [BLOCK_N]
        k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale              # [BLOCK_G, BLOCK_N]
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


def paged_decode(q, k_pages, v_pages, block_table, seq_lens):
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


def merge_splits(m, l, z):
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m - m_max)                                # [rows, S]; 0 for an empty split
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)



# ---------------------------------------------------------------- exercise 1

def sl6_offsets_int32(block_table_row, seq_len, page_size):
    """Exercise 1. Token positions made int32 ('positions are small'): the pages come out int64 through .long(),
    the offsets stay int32 where the lab asks for two int64 tensors."""
    t = torch.arange(seq_len, dtype=torch.int32)
    pages = block_table_row.long()[t // page_size]
    offsets = t % page_size
    return pages, offsets


def sl6_pages_keep_table_dtype(block_table_row, seq_len, page_size):
    """Exercise 1. The page ids indexed straight from the table, without .long() ('they are already ids'): an
    int32 block table gives int32 pages where int64 is asked."""
    t = torch.arange(seq_len)
    pages = block_table_row[t // page_size]
    offsets = t % page_size
    return pages, offsets


# ---------------------------------------------------------------- exercise 2

class pp6_class_level_tables(PagePool):
    """Exercise 2. The tables and lengths declared on the class ('the fields of the pool'), not in __init__:
    every pool shares them, so a second pool sees (and frees) the first one's sequences."""

    tables = {}
    lengths = {}

    def __init__(self, num_pages, page_size):
        self.page_size = page_size
        self.free = list(range(num_pages))


class pp6_free_keeps_length(PagePool):
    """Exercise 2. free_sequence returns the pages and drops the table but keeps lengths[seq] ('the length is
    harmless'): the lab says the pool forgets the sequence."""

    def free_sequence(self, seq):
        self.free.extend(self.tables.pop(seq))


class pp6_add_default_list(PagePool):
    """Exercise 2. add(seq, table=[]) with a default list ('a sequence may bring its table'): every sequence
    added without one shares the same list object, so appends to one grow all their tables."""

    def add(self, seq, table=[]):
        self.tables[seq], self.lengths[seq] = table, 0


# ---------------------------------------------------------------- exercise 3

# ---------------------------------------------------------------- pd6_bt_stride_from_shape

def pd6_bt_stride_from_shape(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. The block table's row stride passed as block_table.shape[1] ('max_pages per row'): right for a contiguous table, wrong for a view into a wider one."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.shape[1], o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# ---------------------------------------------------------------- pd6_max_starts_at_zero

@triton.jit
def paged_decode_kernel__pd6_max_starts_at_zero(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
                        stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_btb, stride_ob, stride_oh,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                        PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    kv = tl.program_id(0)                                   # KV head
    b = tl.program_id(1)                                    # sequence
    offs_g = tl.arange(0, BLOCK_G)                          # [BLOCK_G] rows: query heads of the group
    offs_d = tl.arange(0, HEAD_DIM)                         # [D]
    offs_n = tl.arange(0, BLOCK_N)                          # [BLOCK_N] tokens of one block
    heads = kv * GROUP + offs_g                             # query heads that read KV head kv
    row_ok = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)            # [BLOCK_G, D]
    seq_len = tl.load(lens_ptr + b)
    m_i = tl.zeros([BLOCK_G], tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        tok = start + offs_n
        valid = tok < seq_len                               # the last page is partly filled
        page = tl.load(bt_ptr + b * stride_btb + tok // PAGE_SIZE, mask=valid, other=0)
        slot = tok % PAGE_SIZE
        rows = page.to(tl.int64) * stride_kp + slot * stride_ks + kv * stride_kh       # [BLOCK_N]
        k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale              # [BLOCK_G, BLOCK_N]
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


def pd6_max_starts_at_zero(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. The running maximum starts at 0 ('scores are centred'): exact while some score of a row is above about -88; a group whose scores all lie below underflows to 0/0."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd6_max_starts_at_zero[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# ---------------------------------------------------------------- pd6_q_scaled_in_place

def pd6_q_scaled_in_place(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. The launch scales q in place by 1/√D and passes sm_scale = 1 ('fold the scale into q once'): the result is right, but q.contiguous() is q itself, so the caller's query is changed."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    q.mul_(1.0 / math.sqrt(head_dim))
    paged_decode_kernel[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# ---------------------------------------------------------------- exercise 4

def mg6_global_max(m, l, z):
    """Exercise 4. One maximum for the whole tensor, m.max() ('the largest score'): rows whose maxima lie far
    below another row's underflow to 0/0."""
    m_max = m.max()
    w = torch.exp(m - m_max)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


def mg6_m_changed_in_place(m, l, z):
    """Exercise 4. The weights computed in place, m.sub_(m_max).exp_() ('no temporary'): the result is right,
    the caller's m is replaced by the weights."""
    m_max = m.amax(dim=1, keepdim=True)
    w = m.sub_(m_max).exp_()
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


def mg6_max_clamped_at_zero(m, l, z):
    """Exercise 4. The common maximum clamped at 0, m.amax(...).clamp(min=0) ('an empty split has m = -inf'):
    right while a row's largest m is above about -700; a row of very negative maxima underflows to 0/0."""
    m_max = m.amax(dim=1, keepdim=True).clamp(min=0)
    w = torch.exp(m - m_max)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)

# ---------------------------------------------------------------- correct alternatives

def token_slots_repeat(block_table_row, seq_len, page_size):
    """Exercise 1, correct: each page id repeated page_size times, cut at seq_len; offsets by subtraction."""
    t = torch.arange(seq_len)
    pages = block_table_row.long().repeat_interleave(page_size)[:seq_len]
    offsets = t - (t // page_size) * page_size
    return pages, offsets


class PagePoolFifo(PagePool):
    """Exercise 2, correct: pages taken from the front of the free list (first in, first out)."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        needed = -(-(length + n_tokens) // self.page_size) - len(table)
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop(0) for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]


def merge_softmax_weights(m, l, z):
    """Exercise 4, correct: weights softmax(m) over the splits (any common factor cancels in the ratio)."""
    w = torch.softmax(m, dim=1)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


# ---------------------------------------------------------------- paged_decode_page_ids_no_other

@triton.jit
def paged_decode_kernel__paged_decode_page_ids_no_other(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
                        stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_btb, stride_ob, stride_oh,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                        PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    kv = tl.program_id(0)                                   # KV head
    b = tl.program_id(1)                                    # sequence
    offs_g = tl.arange(0, BLOCK_G)                          # [BLOCK_G] rows: query heads of the group
    offs_d = tl.arange(0, HEAD_DIM)                         # [D]
    offs_n = tl.arange(0, BLOCK_N)                          # [BLOCK_N] tokens of one block
    heads = kv * GROUP + offs_g                             # query heads that read KV head kv
    row_ok = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)            # [BLOCK_G, D]
    seq_len = tl.load(lens_ptr + b)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for start in range(0, seq_len, BLOCK_N):
        tok = start + offs_n
        valid = tok < seq_len                               # the last page is partly filled
        page = tl.load(bt_ptr + b * stride_btb + tok // PAGE_SIZE, mask=valid)
        slot = tok % PAGE_SIZE
        rows = page.to(tl.int64) * stride_kp + slot * stride_ks + kv * stride_kh       # [BLOCK_N]
        k = tl.load(k_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale              # [BLOCK_G, BLOCK_N]
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


def paged_decode_page_ids_no_other(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3, correct: the page ids loaded with a mask and no other= (a masked lane's page id is never used: its K and V loads are masked too)."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__paged_decode_page_ids_no_other[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


WRONG = {
    "slots": [sl6_offsets_int32, sl6_pages_keep_table_dtype],
    "pool": [pp6_class_level_tables, pp6_free_keeps_length, pp6_add_default_list],
    "paged_decode": [pd6_bt_stride_from_shape, pd6_max_starts_at_zero, pd6_q_scaled_in_place],
    "merge": [mg6_global_max, mg6_m_changed_in_place, mg6_max_clamped_at_zero],
}
SOLUTION = {"slots": token_slots, "pool": PagePool, "paged_decode": paged_decode, "merge": merge_splits}
CORRECT = {"slots": [token_slots, token_slots_repeat], "pool": [PagePool, PagePoolFifo],
           "paged_decode": [paged_decode, paged_decode_page_ids_no_other], "merge": [merge_splits, merge_softmax_weights]}


def _w_slots(f):
    pages, offsets = f(torch.tensor([7, 2, 9, 4], dtype=torch.int32), 13, 4)
    return [str(pages.dtype), str(offsets.dtype), pages, offsets]


def _w_pool(cls):
    """Two pools; a script of adds, appends and frees on the second; the state after each step."""
    other = cls(4, 4)
    other.add(9)
    other.append(9, 5)
    pool = cls(6, 4)
    log = []
    for step in (("add", 0), ("add", 1), ("app", 0, 4), ("app", 0, 2), ("app", 1, 3), ("free", 0), ("add", 2),
                 ("app", 2, 5), ("free", 1)):
        try:
            if step[0] == "add":
                r = pool.add(step[1])
            elif step[0] == "app":
                r = list(pool.append(step[1], step[2]))
            else:
                r = pool.free_sequence(step[1])
        except RuntimeError:
            r = "RuntimeError"
        log.append((step, r, sorted(pool.free), {k: list(v) for k, v in sorted(pool.tables.items())},
                    dict(sorted(pool.lengths.items()))))
    return log


def _w_decode(f, ps=4, scale=2.0, shift=0.0, wide_table=False):
    g = torch.Generator().manual_seed(5)
    B, Hq, Hkv, D, n_pages = 2, 6, 3, 16, 24
    q = (torch.randn(B, Hq, D, generator=g) * scale + shift).half()
    k = (torch.randn(n_pages, ps, Hkv, D, generator=g) * scale - shift).half()
    v = torch.randn(n_pages, ps, Hkv, D, generator=g).half()
    bt = torch.randperm(n_pages, generator=g).view(B, n_pages // B).int()
    if wide_table:
        wide = torch.randint(0, n_pages, (B, 2 * n_pages), generator=g, dtype=torch.int32)   # valid page ids, others'
        wide[:, : n_pages // B] = bt
        bt = wide[:, : n_pages // B]
    lens = torch.tensor([13, 30], dtype=torch.int32)
    q0 = q.clone()
    o = f(q, k, v, bt, lens)
    return [o, q - q0]


def _w_merge(f):
    g = torch.Generator().manual_seed(5)
    m = torch.randn(2, 3, generator=g).double()
    m[1] -= 900.0
    l = torch.rand(2, 3, generator=g).double() + 0.5
    z = torch.randn(2, 3, 4, generator=g).double()
    m0 = m.clone()
    o = f(m, l, z)
    return [o, m - m0]


WITNESS = {
    "sl6_offsets_int32": _w_slots, "sl6_pages_keep_table_dtype": _w_slots,
    "pp6_class_level_tables": _w_pool, "pp6_free_keeps_length": _w_pool, "pp6_add_default_list": _w_pool,
    "pd6_bt_stride_from_shape": lambda f: _w_decode(f, wide_table=True),
    "pd6_max_starts_at_zero": lambda f: _w_decode(f, scale=0.5, shift=6.0),
    "pd6_q_scaled_in_place": _w_decode,
    "mg6_global_max": _w_merge, "mg6_m_changed_in_place": _w_merge, "mg6_max_clamped_at_zero": _w_merge,
}
