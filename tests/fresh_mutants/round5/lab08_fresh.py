# ruff: noqa: E501, B007, F841
"""Round 5 of fresh wrong answers for lab 08 (paged attention), written from the lab's text and its solution only
(the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; the kernel answer is the
solution's kernel and launch function with one student's edit, the pool answers subclass the solution's pool and
change one method. New classes here: NumPy arrays where tensors are asked, slots cached by the length alone, an
append that returns a one-shot generator or every slot of the sequence, validity decided by whole pages (the
stale tail of the last page scored), and a result squeezed to drop singleton axes. The correct answers build
pages token by token and shift the merge by the splits' largest log-sum-exp."""
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


def sl_returns_numpy(block_table_row, seq_len, page_size):
    """Exercise 1. Returns pages.numpy(), offsets.numpy() ('plain arrays are easier to print'): NumPy int64
    arrays where the lab asks for int64 tensors."""
    t = torch.arange(seq_len)
    pages = block_table_row.long()[t // page_size]
    offsets = t % page_size
    return pages.numpy(), offsets.numpy()


_slots = {}


def sl_cached_by_length(block_table_row, seq_len, page_size):
    """Exercise 1. Memoises the result by (seq_len, page_size) ('a tensor is not hashable, and the same length
    gives the same slots'): a second sequence of the same length with another page table gets the first one's
    pages."""
    key = (seq_len, page_size)
    if key not in _slots:
        t = torch.arange(seq_len)
        _slots[key] = (block_table_row.long()[t // page_size], t % page_size)
    return _slots[key]


# ---------------------------------------------------------------- exercise 2


class pp_returns_generator(PagePool):
    """Exercise 2. append returns a generator expression of the (page, offset) pairs ('no list needed'): a
    one-shot iterator where the lab asks for a list; iterated twice, it is empty the second time."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        pages_after = -(-(length + n_tokens) // self.page_size)
        needed = pages_after - len(table)
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return ((table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens))


class pp_returns_all_slots(PagePool):
    """Exercise 2. append returns the slots of every token of the sequence, range(0, length + n_tokens) ('the
    caller wants the whole table'): the lab asks for the slots of the n_tokens new tokens only."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        pages_after = -(-(length + n_tokens) // self.page_size)
        needed = pages_after - len(table)
        if needed > len(self.free):
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(0, length + n_tokens)]


class PagePoolPerToken(PagePool):
    """Exercise 2, correct: counts the tokens that start a page, checks them against the free list, then takes
    a page (from the front of the free list) at each such token while building the slots."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        starts = sum(1 for t in range(length, length + n_tokens) if t % self.page_size == 0)
        if starts > len(self.free):
            raise RuntimeError(f"out of pages: {starts} needed, {len(self.free)} free")
        slots = []
        for t in range(length, length + n_tokens):
            if t % self.page_size == 0:
                table.append(self.free.pop(0))
            slots.append((table[t // self.page_size], t % self.page_size))
        self.lengths[seq] = length + n_tokens
        return slots


# ---------------------------------------------------------------- exercise 4


def mg_squeezed(m, l, z):
    """Exercise 4. The result squeezed, (...).squeeze() ('drop the extra axis from keepdim'): one row gives
    shape [D], and D = 1 gives [rows], not [rows, D]."""
    m_max = m.amax(dim=1, keepdim=True)
    w = torch.exp(m - m_max)
    return ((w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)).squeeze()


def merge_lse_reference(m, l, z):
    """Exercise 4, correct: every split measured against the largest log-sum-exp m + log l (any common
    reference works; an empty split's log 0 = −inf gives weight 0)."""
    ref = (m + torch.log(l)).amax(dim=1, keepdim=True)
    w = torch.exp(m - ref)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


# ---------------------------------------------------------------- exercise 3


# ---------------------------------------------------------------- pd_valid_by_page

@triton.jit
def paged_decode_kernel__pd_valid_by_page(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        valid = tok < (seq_len + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
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


def pd_valid_by_page(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Validity decided by whole pages, tok < ceil(seq_len / PAGE_SIZE) · PAGE_SIZE ('a page the
    sequence owns is its own'): the slots after seq_len in the last page hold stale values from earlier
    sequences, and they are scored."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_valid_by_page[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


WRONG = {
    "slots": [sl_returns_numpy, sl_cached_by_length],
    "pool": [pp_returns_generator, pp_returns_all_slots],
    "paged_decode": [pd_valid_by_page],
    "merge": [mg_squeezed],
}
SOLUTION = {"slots": token_slots, "pool": PagePool, "paged_decode": paged_decode, "merge": merge_splits}
CORRECT = {"pool": [PagePool, PagePoolPerToken], "merge": [merge_splits, merge_lse_reference]}


def _w_slots_two_tables(f):
    f(torch.tensor([7, 2, 9, 4], dtype=torch.int32), 13, 4)
    pages, offsets = f(torch.tensor([1, 5, 3, 0], dtype=torch.int32), 13, 4)
    return [type(pages).__name__, torch.as_tensor(pages), torch.as_tensor(offsets)]


def _w_pool(cls):
    """A script of adds, appends (one of them past the free pages) and frees; the state after each step, and
    each append's slots read twice."""
    pool = cls(6, 4)
    log = []
    for step in (("add", 0), ("app", 0, 4), ("app", 0, 2), ("add", 1), ("app", 1, 12), ("add", 3), ("app", 3, 4),
                 ("free", 0), ("add", 2), ("app", 2, 5), ("free", 1), ("free", 2)):
        try:
            if step[0] == "add":
                r = pool.add(step[1])
            elif step[0] == "app":
                slots = pool.append(step[1], step[2])
                r = [type(slots).__name__, list(slots), list(slots)]
            else:
                r = pool.free_sequence(step[1])
        except RuntimeError:
            r = "RuntimeError"
        log.append((step, r, sorted(pool.free), {k: list(v) for k, v in sorted(pool.tables.items())},
                    dict(sorted(pool.lengths.items()))))
    return log


def _w_decode(f, ps=4, scale=2.0):
    g = torch.Generator().manual_seed(5)
    B, Hq, Hkv, D, n_pages = 2, 6, 3, 16, 24
    q = (torch.randn(B, Hq, D, generator=g) * scale).half()
    k = (torch.randn(n_pages, ps, Hkv, D, generator=g) * scale).half()
    v = torch.randn(n_pages, ps, Hkv, D, generator=g).half()
    bt = torch.randperm(n_pages, generator=g).view(B, n_pages // B).int()
    lens = torch.tensor([13, 30], dtype=torch.int32)
    return f(q, k, v, bt, lens)


def _w_merge_one_row(f):
    g = torch.Generator().manual_seed(5)
    m = torch.randn(1, 3, generator=g).double()
    l = torch.rand(1, 3, generator=g).double() + 0.5
    z = torch.randn(1, 3, 4, generator=g).double()
    return f(m, l, z)


WITNESS = {
    "sl_returns_numpy": _w_slots_two_tables, "sl_cached_by_length": _w_slots_two_tables,
    "pp_returns_generator": _w_pool, "pp_returns_all_slots": _w_pool,
    "pd_valid_by_page": _w_decode,
    "mg_squeezed": _w_merge_one_row,
}
