# ruff: noqa: E501, B007, F841
"""Round 3 of fresh wrong answers for lab 08 (paged attention), written from the lab's text and its solution
only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; the kernel answers are the
solution's kernel and launch function with one student's edit (the docstring says which)."""
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

# ---------------------------------------------------------------- pd_seq_len_batch0

@triton.jit
def paged_decode_kernel__pd_seq_len_batch0(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
    seq_len = tl.load(lens_ptr)
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



def pd_seq_len_batch0(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. seq_len = tl.load(lens_ptr) (no + b): every sequence uses sequence 0's length."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_seq_len_batch0[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o

# ---------------------------------------------------------------- pd_one_page_per_block

@triton.jit
def paged_decode_kernel__pd_one_page_per_block(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        page = tl.load(bt_ptr + b * stride_btb + start // PAGE_SIZE)
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



def pd_one_page_per_block(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. One page id per block of BLOCK_N tokens (start // PAGE_SIZE): right only when a page holds BLOCK_N = 16 tokens."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_one_page_per_block[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o

# ---------------------------------------------------------------- pd_slot_stride_assumed

@triton.jit
def paged_decode_kernel__pd_slot_stride_assumed(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        rows = page.to(tl.int64) * stride_kp + slot * HEAD_DIM + kv * stride_kh       # [BLOCK_N]
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



def pd_slot_stride_assumed(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. A token's row inside a page at slot · HEAD_DIM (as if a page held one head): right for one KV head only."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_slot_stride_assumed[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o

# ---------------------------------------------------------------- exercise 1


def sl_last_page_mod(block_table_row, seq_len, page_size):
    """Exercise 1. Builds the slots page by page; the last page holds seq_len % page_size tokens, which is 0
    when the last page is full (its tokens vanish)."""
    n_pages = -(-seq_len // page_size)
    pages, offsets = [], []
    for p in range(n_pages):
        count = page_size if p < n_pages - 1 else seq_len % page_size
        pages += [int(block_table_row[p])] * count
        offsets += list(range(count))
    return torch.tensor(pages, dtype=torch.int64), torch.tensor(offsets, dtype=torch.int64)


# ---------------------------------------------------------------- exercise 2


class pp_raise_memoryerror(PagePool):
    """Exercise 2. Raises MemoryError ('out of memory') where the lab asks for RuntimeError."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        pages_after = -(-(length + n_tokens) // self.page_size)
        needed = pages_after - len(table)
        if needed > len(self.free):
            raise MemoryError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]


class pp_extra_page_when_full(PagePool):
    """Exercise 2. Pages after the append as (length + n) // page_size + 1: one page too many whenever the
    append ends exactly at the end of a page."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        pages_after = (length + n_tokens) // self.page_size + 1
        needed = pages_after - len(table)
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]


# ---------------------------------------------------------------- exercise 4


def mg_exp2_weights(m, l, z):
    """Exercise 4. Weights 2^(m − max) (torch.exp2, 'as the GPU kernels do') on natural-log maxima."""
    m_max = m.amax(dim=1, keepdim=True)
    w = torch.exp2(m - m_max)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


def mg_max_no_keepdim(m, l, z):
    """Exercise 4. m.amax(dim=1) without keepdim: m − m_max broadcasts along the splits' axis, right only when
    rows == S (square) and then wrong values."""
    m_max = m.amax(dim=1)
    w = torch.exp(m - m_max)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


# ---------------------------------------------------------------- correct alternatives


def token_slots_repeat(block_table_row, seq_len, page_size):
    """Exercise 1, correct: each page id repeated page_size times, cut at seq_len; offsets by remainder."""
    n_pages = -(-seq_len // page_size)
    pages = block_table_row[:n_pages].long().repeat_interleave(page_size)[:seq_len]
    return pages, torch.arange(seq_len) % page_size


class PagePoolRoom(PagePool):
    """Exercise 2, correct: counts the room left in the last page, takes pages from the front of the free list."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        room = len(table) * self.page_size - length
        needed = max(0, -(-(n_tokens - room) // self.page_size))
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        taken, self.free = self.free[:needed], self.free[needed:]
        table.extend(taken)
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]


WRONG = {
    "slots": [sl_last_page_mod],
    "pool": [pp_raise_memoryerror, pp_extra_page_when_full],
    "paged_decode": [pd_seq_len_batch0, pd_one_page_per_block, pd_slot_stride_assumed],
    "merge": [mg_exp2_weights, mg_max_no_keepdim],
}
SOLUTION = {"slots": token_slots, "pool": PagePool, "paged_decode": paged_decode, "merge": merge_splits}
CORRECT = {"slots": [token_slots, token_slots_repeat], "pool": [PagePool, PagePoolRoom]}


def _w_slots(f):
    row = torch.tensor([7, 2, 9, 4, 0, 5], dtype=torch.int32)
    return [f(row, n, ps) for n, ps in ((1, 4), (13, 4), (16, 4), (6, 1), (11, 2))]


def _w_pool(cls):
    """A script: appends that end at a page's end, a refused append, frees, re-adds; the state after each step."""
    pool = cls(6, 4)
    log = []
    for step in (("add", 0), ("app", 0, 4), ("app", 0, 2), ("add", 1), ("app", 1, 8), ("app", 1, 12),
                 ("free", 0), ("add", 2), ("app", 2, 8), ("free", 1), ("free", 2)):
        try:
            if step[0] == "add":
                r = pool.add(step[1])
            elif step[0] == "app":
                r = pool.append(step[1], step[2])
            else:
                r = pool.free_sequence(step[1])
        except RuntimeError:
            r = "RuntimeError"
        except Exception as exc:           # any other exception is recorded by its type
            r = type(exc).__name__
        log.append((step, r, sorted(pool.free), {k: list(v) for k, v in sorted(pool.tables.items())},
                    dict(sorted(pool.lengths.items()))))
    return log


def _w_decode(f, ps=4):
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, D, n_pages = 2, 6, 3, 16, 24
    q = (torch.randn(B, Hq, D, generator=g) * 2).half()
    k = (torch.randn(n_pages, ps, Hkv, D, generator=g) * 2).half()
    v = torch.randn(n_pages, ps, Hkv, D, generator=g).half()
    bt = torch.randperm(n_pages, generator=g).view(B, n_pages // B).int()
    lens = torch.tensor([13, 30], dtype=torch.int32)
    return f(q, k, v, bt, lens)


def _w_merge(f):
    g = torch.Generator().manual_seed(3)
    rows, S, D = 4, 3, 4
    m = torch.randn(rows, S, generator=g) * 3
    m[0, 1] = float("-inf")
    l = torch.rand(rows, S, generator=g) * 3 + 0.5
    l[0, 1] = 0.0
    z = torch.randn(rows, S, D, generator=g) * l[:, :, None]
    z[0, 1] = 0.0
    return f(m.double(), l.double(), z.double())


def _w_merge_square(f):
    g = torch.Generator().manual_seed(4)
    m = torch.randn(3, 3, generator=g).double() * 3
    l = torch.rand(3, 3, generator=g).double() + 0.5
    z = torch.randn(3, 3, 5, generator=g).double()
    return f(m, l, z)


WITNESS = {
    "sl_last_page_mod": _w_slots,
    "pp_raise_memoryerror": _w_pool, "pp_extra_page_when_full": _w_pool,
    "pd_seq_len_batch0": _w_decode, "pd_one_page_per_block": _w_decode, "pd_slot_stride_assumed": _w_decode,
    "mg_exp2_weights": _w_merge, "mg_max_no_keepdim": _w_merge_square,
}
