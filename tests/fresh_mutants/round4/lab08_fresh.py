# ruff: noqa: E501, B007, F841
"""Round 4 of fresh wrong answers for lab 08 (paged attention), written from the lab's text and its solution only
(the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; the kernel answers are the
solution's kernel and launch function with one student's edit, the pool answers subclass the solution's pool and
change one method. New classes here: bit tricks that assume a power-of-two page size, a pool that refuses an
exact fit or keeps a freed sequence's length, scores rounded to fp16, a merge that scales its input in place,
and a shortcut for a single split."""
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


# ---------------------------------------------------------------- pd_slot_bitmask

@triton.jit
def paged_decode_kernel__pd_slot_bitmask(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        slot = tok & (PAGE_SIZE - 1)
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


def pd_slot_bitmask(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Offset in the page as tok & (PAGE_SIZE − 1) ('a mask is cheaper than %'): right only when
    the page size is a power of two."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_slot_bitmask[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# ---------------------------------------------------------------- pd_scores_fp16

@triton.jit
def paged_decode_kernel__pd_scores_fp16(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, sm_scale,
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
        s = tl.dot(q, tl.trans(k)).to(tl.float16) * sm_scale  # [BLOCK_G, BLOCK_N]
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


def pd_scores_fp16(q, k_pages, v_pages, block_table, seq_lens):
    """Exercise 3. Scores kept in fp16, tl.dot(q, tl.trans(k)).to(tl.float16) ('the inputs are fp16'): a score of
    192 is rounded to a multiple of 0.125, and its exponential moves by up to 6%."""
    q, k_pages, v_pages = q.contiguous(), k_pages.contiguous(), v_pages.contiguous()
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    group = n_heads // n_kv
    o = torch.empty_like(q)
    paged_decode_kernel__pd_scores_fp16[(n_kv, batch)](
        q, k_pages, v_pages, block_table, seq_lens, o, 1.0 / math.sqrt(head_dim),
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        block_table.stride(0), o.stride(0), o.stride(1),
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=16)
    return o


# ---------------------------------------------------------------- exercise 1


def sl_bit_tricks(block_table_row, seq_len, page_size):
    """Exercise 1. Page and offset by bit operations, t >> log2(page_size) and t & (page_size − 1) ('as real
    kernels do'): right only when the page size is a power of two."""
    t = torch.arange(seq_len)
    shift = int(math.log2(page_size))
    pages = block_table_row.long()[t >> shift]
    offsets = t & (page_size - 1)
    return pages, offsets


# ---------------------------------------------------------------- exercise 2


class pp_exact_fit_refused(PagePool):
    """Exercise 2. Raises when the pages needed are >= the free ones ('keep one in reserve'): an append that
    needs exactly the free pages is refused."""

    def append(self, seq, n_tokens):
        table, length = self.tables[seq], self.lengths[seq]
        pages_after = -(-(length + n_tokens) // self.page_size)
        needed = pages_after - len(table)
        if needed >= len(self.free) and needed > 0:
            raise RuntimeError(f"out of pages: {needed} needed, {len(self.free)} free")
        table.extend(self.free.pop() for _ in range(needed))
        self.lengths[seq] = length + n_tokens
        return [(table[t // self.page_size], t % self.page_size) for t in range(length, length + n_tokens)]


class pp_length_kept(PagePool):
    """Exercise 2. free_sequence gives the pages back but leaves lengths[seq] ('add resets it anyway'): the pool
    still says the freed sequence holds its tokens."""

    def free_sequence(self, seq):
        self.free.extend(self.tables.pop(seq))


# ---------------------------------------------------------------- exercise 4


def mg_scales_z_in_place(m, l, z):
    """Exercise 4. z.mul_(w[:, :, None]) ('no temporary [rows, S, D] tensor'): the result is right, but the
    caller's z is rescaled."""
    m_max = m.amax(dim=1, keepdim=True)
    w = torch.exp(m - m_max)
    return z.mul_(w[:, :, None]).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


def mg_single_split_shortcut(m, l, z):
    """Exercise 4. 'One split: nothing to merge', returns z[:, 0] when S == 1: z is the unnormalised sum, so it
    needs dividing by l."""
    if m.shape[1] == 1:
        return z[:, 0]
    m_max = m.amax(dim=1, keepdim=True)
    w = torch.exp(m - m_max)
    return (w[:, :, None] * z).sum(dim=1) / (w * l).sum(dim=1, keepdim=True)


# ---------------------------------------------------------------- correct alternatives


def merge_by_logsumexp(m, l, z):
    """Exercise 4, correct: each split's weight from its log-sum-exp m + log l, normalised by softmax over the
    splits, times its own output z / l (an empty split has weight 0 and output 0)."""
    lse = m + torch.log(l)
    w = torch.softmax(lse, dim=1)
    own = torch.where(l[:, :, None] > 0, z / l.clamp_min(1e-300)[:, :, None], torch.zeros_like(z))
    return (w[:, :, None] * own).sum(dim=1)


def token_slots_divmod(block_table_row, seq_len, page_size):
    """Exercise 1, correct: torch.div with rounding_mode='floor' and torch.remainder, the table indexed with an
    int64 index."""
    t = torch.arange(seq_len, dtype=torch.int64)
    logical = torch.div(t, page_size, rounding_mode="floor")
    return block_table_row.to(torch.int64).index_select(0, logical), torch.remainder(t, page_size)


WRONG = {
    "slots": [sl_bit_tricks],
    "pool": [pp_exact_fit_refused, pp_length_kept],
    "paged_decode": [pd_slot_bitmask, pd_scores_fp16],
    "merge": [mg_scales_z_in_place, mg_single_split_shortcut],
}
SOLUTION = {"slots": token_slots, "pool": PagePool, "paged_decode": paged_decode, "merge": merge_splits}
CORRECT = {"slots": [token_slots, token_slots_divmod], "merge": [merge_splits, merge_by_logsumexp]}


def _w_slots(f):
    row = torch.tensor([7, 2, 9, 4, 0, 5, 8, 1], dtype=torch.int32)
    return [f(row, n, ps) for n, ps in ((1, 4), (13, 3), (16, 5), (6, 1), (11, 6))]


def _w_pool(cls):
    """A script: an append that needs exactly the free pages, frees, re-adds; the state after each step."""
    pool = cls(6, 4)
    log = []
    for step in (("add", 0), ("app", 0, 4), ("app", 0, 2), ("add", 1), ("app", 1, 12), ("add", 3), ("app", 3, 4),
                 ("free", 0), ("add", 2), ("app", 2, 5), ("free", 1), ("free", 2)):
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


def _w_decode(f, ps=4, scale=2.0):
    g = torch.Generator().manual_seed(4)
    B, Hq, Hkv, D, n_pages = 2, 6, 3, 16, 24
    q = (torch.randn(B, Hq, D, generator=g) * scale).half()
    k = (torch.randn(n_pages, ps, Hkv, D, generator=g) * scale).half()
    v = torch.randn(n_pages, ps, Hkv, D, generator=g).half()
    bt = torch.randperm(n_pages, generator=g).view(B, n_pages // B).int()
    lens = torch.tensor([13, 30], dtype=torch.int32)
    return f(q, k, v, bt, lens)


def _w_merge(f):
    g = torch.Generator().manual_seed(4)
    rows, S, D = 4, 3, 4
    m = torch.randn(rows, S, generator=g) * 3
    m[0, 1] = float("-inf")
    l = torch.rand(rows, S, generator=g) * 3 + 0.5
    l[0, 1] = 0.0
    z = torch.randn(rows, S, D, generator=g) * l[:, :, None]
    z[0, 1] = 0.0
    m, l, z = m.double(), l.double(), z.double()
    o = f(m, l, z)
    return [o, z]


def _w_merge_one_split(f):
    g = torch.Generator().manual_seed(4)
    m = torch.randn(4, 1, generator=g).double()
    l = torch.rand(4, 1, generator=g).double() + 0.5
    z = torch.randn(4, 1, 3, generator=g).double()
    return f(m, l, z)


WITNESS = {
    "sl_bit_tricks": _w_slots,
    "pp_exact_fit_refused": _w_pool, "pp_length_kept": _w_pool,
    "pd_slot_bitmask": lambda f: _w_decode(f, ps=3),
    "pd_scores_fp16": lambda f: _w_decode(f, scale=5.0),
    "mg_scales_z_in_place": _w_merge,
    "mg_single_split_shortcut": _w_merge_one_split,
}
