# ruff: noqa: E501, B007, F841
"""Round 2 of fresh wrong answers for lab 08 (paged attention), written from the lab's text and its
solution only. Each wrong answer is the solution with one student's edit (its docstring says which).
WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
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


# slots: sl_table_indexed_by_token
def sl_table_indexed_by_token(block_table_row, seq_len, page_size):
    """Page table indexed by the token, not its logical page."""
    """(pages, offsets): int64 [seq_len] each, for tokens 0 .. seq_len-1 of one sequence."""
    t = torch.arange(seq_len)                              # [seq_len] token positions
    pages = block_table_row.long()[torch.clamp(t, max=len(block_table_row) - 1)]         # logical page -> physical page
    offsets = t % page_size                                # position inside the page
    return pages, offsets


# slots: sl_offset_is_page
def sl_offset_is_page(block_table_row, seq_len, page_size):
    """Offsets computed with // ."""
    """(pages, offsets): int64 [seq_len] each, for tokens 0 .. seq_len-1 of one sequence."""
    t = torch.arange(seq_len)                              # [seq_len] token positions
    pages = block_table_row.long()[t // page_size]         # logical page -> physical page
    offsets = t // page_size                                # position inside the page
    return pages, offsets


# slots: sl_logical_pages
def sl_logical_pages(block_table_row, seq_len, page_size):
    """Returned the logical page (no table lookup)."""
    """(pages, offsets): int64 [seq_len] each, for tokens 0 .. seq_len-1 of one sequence."""
    t = torch.arange(seq_len)                              # [seq_len] token positions
    pages = t // page_size         # logical page -> physical page
    offsets = t % page_size                                # position inside the page
    return pages, offsets


# slots: sl_tokens_from_one
def sl_tokens_from_one(block_table_row, seq_len, page_size):
    """Tokens numbered 1 .. seq_len."""
    """(pages, offsets): int64 [seq_len] each, for tokens 0 .. seq_len-1 of one sequence."""
    t = torch.arange(1, seq_len + 1)                              # [seq_len] token positions
    pages = block_table_row.long()[t // page_size]         # logical page -> physical page
    offsets = t % page_size                                # position inside the page
    return pages, offsets


# slots: sl_ceil_page
def sl_ceil_page(block_table_row, seq_len, page_size):
    """Logical page rounded up."""
    """(pages, offsets): int64 [seq_len] each, for tokens 0 .. seq_len-1 of one sequence."""
    t = torch.arange(seq_len)                              # [seq_len] token positions
    pages = block_table_row.long()[-(-t // page_size)]         # logical page -> physical page
    offsets = t % page_size                                # position inside the page
    return pages, offsets


# pool: pp_partial_change_on_failure
class pp_partial_change_on_failure:
    """Takes pages one by one and raises when the list runs dry (pool left changed)."""
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
        for _ in range(needed):
            if not self.free:
                raise RuntimeError("out of pages")
            table.append(self.free.pop())
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]

    def free_sequence(self, seq):
        """Return every page of seq to the free list and forget seq."""
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


# pool: pp_ignores_partial_page
class pp_ignores_partial_page:
    """Pages for the new tokens alone, ignoring room left in the last page."""
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
        needed = -(-n_tokens // self.page_size)
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]

    def free_sequence(self, seq):
        """Return every page of seq to the free list and forget seq."""
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


# pool: pp_lengths_not_updated
class pp_lengths_not_updated:
    """Forgot to update the length."""
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
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]

    def free_sequence(self, seq):
        """Return every page of seq to the free list and forget seq."""
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


# pool: pp_pages_leak
class pp_pages_leak:
    """free_sequence forgets the sequence without returning its pages."""
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
        self.tables.pop(seq)
        del self.lengths[seq]


# pool: pp_raise_on_exact
class pp_raise_on_exact:
    """>= : raises when the free pages are exactly enough."""
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
        if needed >= len(self.free) and needed > 0:
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]

    def free_sequence(self, seq):
        """Return every page of seq to the free list and forget seq."""
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


# pool: pp_offsets_from_zero
class pp_offsets_from_zero:
    """Returned slots for tokens 0 .. n_tokens−1 instead of from the old length."""
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
        return [(table[t // self.page_size], t % self.page_size) for t in range(n_tokens)]

    def free_sequence(self, seq):
        """Return every page of seq to the free list and forget seq."""
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


# pool: pp_table_kept_after_free
class pp_table_kept_after_free:
    """free_sequence returns the pages but keeps the table."""
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
        self.free.extend(self.tables[seq])
        del self.lengths[seq]


# pool: pp_floor_pages
class pp_floor_pages:
    """Pages after the append counted with a floor."""
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
        pages_after = (length + n_tokens) // self.page_size + (1 if n_tokens and length == 0 else 0)
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


# paged_decode: pd_padding_scored
@triton.jit
def paged_decode_kernel__pd_padding_scored(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def pd_padding_scored(q, k_pages, v_pages, block_table, seq_lens):
    """Tokens past seq_len not set to -inf (their K rows load as 0)."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_padding_scored[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_strided_heads
@triton.jit
def paged_decode_kernel__pd_strided_heads(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
                        stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_btb, stride_ob, stride_oh,
                        GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr,
                        PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    kv = tl.program_id(0)                                   # KV head
    b = tl.program_id(1)                                    # sequence
    offs_g = tl.arange(0, BLOCK_G)                          # [BLOCK_G] rows: query heads of the group
    offs_d = tl.arange(0, HEAD_DIM)                         # [D]
    offs_n = tl.arange(0, BLOCK_N)                          # [BLOCK_N] tokens of one block
    heads = kv + offs_g * tl.num_programs(0)                             # query heads that read KV head kv
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


def pd_strided_heads(q, k_pages, v_pages, block_table, seq_lens):
    """Heads of a group taken as kv + g · Hkv."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_strided_heads[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_logical_page
@triton.jit
def paged_decode_kernel__pd_logical_page(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        page = tok // PAGE_SIZE
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


def pd_logical_page(q, k_pages, v_pages, block_table, seq_lens):
    """Logical page used as the physical page."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_logical_page[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_slot_div
@triton.jit
def paged_decode_kernel__pd_slot_div(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        slot = tok // PAGE_SIZE
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


def pd_slot_div(q, k_pages, v_pages, block_table, seq_lens):
    """Offset in the page with // ."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_slot_div[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_loop_by_page
@triton.jit
def paged_decode_kernel__pd_loop_by_page(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
    for start in range(0, seq_len, PAGE_SIZE):
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


def pd_loop_by_page(q, k_pages, v_pages, block_table, seq_lens):
    """Loop steps by PAGE_SIZE while a block holds BLOCK_N tokens."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_loop_by_page[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_acc_not_rescaled
@triton.jit
def paged_decode_kernel__pd_acc_not_rescaled(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        acc = acc + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def pd_acc_not_rescaled(q, k_pages, v_pages, block_table, seq_lens):
    """acc not rescaled."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_acc_not_rescaled[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_fp16_acc
@triton.jit
def paged_decode_kernel__pd_fp16_acc(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float16)
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
        acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)).to(tl.float16)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def pd_fp16_acc(q, k_pages, v_pages, block_table, seq_lens):
    """acc kept in fp16."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_fp16_acc[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_table_row_stride_missing
@triton.jit
def paged_decode_kernel__pd_table_row_stride_missing(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        page = tl.load(bt_ptr + b + tok // PAGE_SIZE, mask=valid, other=0)
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


def pd_table_row_stride_missing(q, k_pages, v_pages, block_table, seq_lens):
    """Page table row of sequence b at b (forgot stride_btb)."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_table_row_stride_missing[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_no_scale
@triton.jit
def paged_decode_kernel__pd_no_scale(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        s = tl.dot(q, tl.trans(k))              # [BLOCK_G, BLOCK_N]
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


def pd_no_scale(q, k_pages, v_pages, block_table, seq_lens):
    """Forgot sm_scale."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_no_scale[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_stale_max
@triton.jit
def paged_decode_kernel__pd_stale_max(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def pd_stale_max(q, k_pages, v_pages, block_table, seq_lens):
    """Forgot m_i = m_new."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_stale_max[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_last_token_dropped
@triton.jit
def paged_decode_kernel__pd_last_token_dropped(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        valid = tok < seq_len - 1                               # the last page is partly filled
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


def pd_last_token_dropped(q, k_pages, v_pages, block_table, seq_lens):
    """valid = tok < seq_len − 1."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_last_token_dropped[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# merge: mg_unweighted_l
def mg_unweighted_l(m, l, z):
    """Divided by Σ l (no weights)."""
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m - m_max)                                # [rows, S]; 0 for an empty split
    return (w[:, :, None] * z).sum(dim=1) / l.sum(dim=1, keepdim=True)


# merge: mg_mean_of_outputs
def mg_mean_of_outputs(m, l, z):
    """Plain mean of the splits' outputs z / l."""
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m - m_max)                                # [rows, S]; 0 for an empty split
    return (z / l[:, :, None]).nan_to_num(0.0).sum(dim=1) / (l > 0).sum(dim=1, keepdim=True)


# merge: mg_unshifted_exp
def mg_unshifted_exp(m, l, z):
    """exp(m) without the common maximum."""
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m)                                # [rows, S]; 0 for an empty split
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


# merge: mg_per_split_output_first
def mg_per_split_output_first(m, l, z):
    """Each split's z / l first (empty splits give 0/0), then weighted by w·l."""
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m - m_max)                                # [rows, S]; 0 for an empty split
    o_s = z / l[:, :, None]
    return (w[:, :, None] * l[:, :, None] * o_s).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


# merge: mg_keepdim_missing
def mg_keepdim_missing(m, l, z):
    """Σ w·l without keepdim (broadcasts along D)."""
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m - m_max)                                # [rows, S]; 0 for an empty split
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1)


# merge: mg_l_ignored
def mg_l_ignored(m, l, z):
    """Weights normalised by Σ w (l forgotten)."""
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m - m_max)                                # [rows, S]; 0 for an empty split
    return (w[:, :, None] * z).sum(dim=1) / (w * l.clamp(max=1)).sum(dim=1, keepdim=True)


# merge: mg_max_over_rows
def mg_max_over_rows(m, l, z):
    """Common maximum over the rows (dim 0)."""
    """m, l: [rows, S]; z: [rows, S, D] -> o [rows, D]."""
    m_max = m.amax(dim=0, keepdim=True)                     # [rows, 1] common maximum
    w = torch.exp(m - m_max)                                # [rows, S]; 0 for an empty split
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


# paged_decode: pd_max_starts_at_zero
@triton.jit
def paged_decode_kernel__pd_max_starts_at_zero(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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


def pd_max_starts_at_zero(q, k_pages, v_pages, block_table, seq_lens):
    """Running maximum started at 0."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_max_starts_at_zero[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# paged_decode: pd_l_fp16
@triton.jit
def paged_decode_kernel__pd_l_fp16(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
    l_i = tl.zeros([BLOCK_G], tl.float16)
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
        l_i = (l_i * alpha + tl.sum(p, 1)).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def pd_l_fp16(q, k_pages, v_pages, block_table, seq_lens):
    """l kept in fp16."""
    """Launch one program per (KV head, sequence). q [B, Hq, D] -> o [B, Hq, D]."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_l_fp16[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# pool: pp_check_after_take
class pp_check_after_take:
    """Takes the pages, then raises if too few were there (pages already moved)."""
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
        taken = self.free[len(self.free) - needed:] if needed else []
        del self.free[len(self.free) - len(taken):]
        table.extend(reversed(taken))
        if len(taken) < needed:
            raise RuntimeError("out of pages")
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]

    def free_sequence(self, seq):
        """Return every page of seq to the free list and forget seq."""
        self.free.extend(self.tables.pop(seq))
        del self.lengths[seq]


WRONG = {
    "slots": [sl_table_indexed_by_token, sl_offset_is_page, sl_logical_pages, sl_tokens_from_one, sl_ceil_page],
    "pool": [pp_partial_change_on_failure, pp_ignores_partial_page, pp_lengths_not_updated, pp_pages_leak, pp_raise_on_exact, pp_offsets_from_zero, pp_table_kept_after_free, pp_floor_pages, pp_check_after_take],
    "paged_decode": [pd_padding_scored, pd_strided_heads, pd_logical_page, pd_slot_div, pd_loop_by_page, pd_acc_not_rescaled, pd_fp16_acc, pd_table_row_stride_missing, pd_no_scale, pd_stale_max, pd_last_token_dropped, pd_max_starts_at_zero, pd_l_fp16],
    "merge": [mg_unweighted_l, mg_mean_of_outputs, mg_unshifted_exp, mg_per_split_output_first, mg_keepdim_missing, mg_l_ignored, mg_max_over_rows],
}
SOLUTION = {"slots": token_slots, "pool": PagePool, "paged_decode": paged_decode, "merge": merge_splits}
CORRECT = {k: [v] for k, v in SOLUTION.items()}


def _w_slots(f):
    row = torch.tensor([7, 2, 9, 4, 0, 5], dtype=torch.int32)
    return [f(row, n, ps) for n, ps in ((1, 4), (13, 4), (16, 4), (6, 1), (11, 2))]


def _w_pool(cls):
    """A script: appends across page boundaries, a failing append with pages still free, frees, re-adds."""
    pool = cls(6, 4)
    log = []
    for step in (("add", 0), ("app", 0, 3), ("app", 0, 2), ("add", 1), ("app", 1, 4), ("app", 1, 12),
                 ("app", 0, 3), ("free", 0), ("add", 2), ("app", 2, 9), ("free", 1), ("free", 2), ("add", 0),
                 ("app", 0, 24)):
        try:
            if step[0] == "add":
                pool.add(step[1])
                r = None
            elif step[0] == "app":
                r = pool.append(step[1], step[2])
            else:
                r = pool.free_sequence(step[1])
        except RuntimeError:
            r = "RuntimeError"
        log.append((step, r, sorted(pool.free), {k: list(v) for k, v in sorted(pool.tables.items())},
                    dict(sorted(pool.lengths.items()))))
    return log


def _w_decode(f, scale=4.0):
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, D, ps, n_pages = 2, 6, 3, 16, 4, 24
    q = (torch.randn(B, Hq, D, generator=g) * scale).half()
    k = (torch.randn(n_pages, ps, Hkv, D, generator=g) * scale).half()
    v = torch.randn(n_pages, ps, Hkv, D, generator=g).half()
    bt = torch.randperm(n_pages, generator=g).view(B, n_pages // B).int()
    lens = torch.tensor([13, 30], dtype=torch.int32)
    return f(q, k, v, bt, lens)


def _w_decode_negative(f):
    """Every score of sequence 0 near -150: exp underflows unless the maximum is subtracted."""
    g = torch.Generator().manual_seed(0)
    B, Hq, Hkv, D, ps, n_pages = 2, 6, 3, 16, 4, 24
    q = (torch.ones(B, Hq, D) * 6.1 + torch.rand(B, Hq, D, generator=g) * 0.1).half()
    k = (-torch.ones(n_pages, ps, Hkv, D) * 6.1 + torch.rand(n_pages, ps, Hkv, D, generator=g) * 0.1).half()
    v = torch.randn(n_pages, ps, Hkv, D, generator=g).half()
    bt = torch.randperm(n_pages, generator=g).view(B, n_pages // B).int()
    lens = torch.tensor([13, 30], dtype=torch.int32)
    return f(q, k, v, bt, lens)


def _w_merge(f):
    g = torch.Generator().manual_seed(0)
    rows, S, D = 4, 3, 4
    m = torch.randn(rows, S, generator=g) * 3
    m[0, 1] = float("-inf")                       # an empty split
    m[1] += torch.tensor([800.0, 0.0, -300.0])    # maxima hundreds apart (exp(800) overflows float64)
    l = torch.rand(rows, S, generator=g) * 3 + 0.5
    l[0, 1] = 0.0
    z = torch.randn(rows, S, D, generator=g) * l[:, :, None]
    z[0, 1] = 0.0
    return f(m.double(), l.double(), z.double())


WITNESS = {
    **{n.__name__: _w_slots for n in WRONG["slots"]},
    **{n.__name__: _w_pool for n in WRONG["pool"]},
    **{n.__name__: _w_decode for n in WRONG["paged_decode"]},
    **{n.__name__: _w_merge for n in WRONG["merge"]},
    "pd_padding_scored": lambda f: _w_decode(f, scale=0.5),
    "pd_max_starts_at_zero": _w_decode_negative,
}
