"""Lab 08's decode cases: the paged caches, page tables and lengths that ``check_paged_decode`` runs
(fixed adversarial cases first, then cases drawn from a seed), in the layouts a server gives them."""
from __future__ import annotations

import numpy as np

from ..checking import case

BLOCK_N = 16                                  # the lab's kernel reads 16 tokens per block

# Layouts. The rule: every tensor argument comes, in some case, with strides unlike its shape's and
# unlike its siblings'. A server preallocates its block table once, [max_batch, max_pages], and hands a
# kernel the rows and first columns of this step's batch: the row stride is the wide table's, not
# max_pages, and the columns past the view name other sequences' pages ("table"). Pages and q may be
# padded views, and K and V may be stored in different orders ("pages"): q's and K's rows padded to
# D + 8 with NaN, V stored [page, Hkv, slot, D] and seen as [page, slot, Hkv, D]. The given launcher
# makes q and the pages contiguous and passes the table's row stride; the given kernel reads the
# table's columns and seq_lens as contiguous, so those stay contiguous.
LAYOUT_NAMES = {"": "", "table": "block table cut from a wider one",
                "pages": "q and K rows padded, V stored [page, Hkv, slot, D]",
                "both": "block table cut from a wider one, q and K rows padded, V stored [page, Hkv, slot, D]"}
PAD = 8                                       # elements of NaN after each padded row


def laid_out(layout: str, q, k_pages, v_pages, table, num_pages: int):
    """(q, k_pages[:num_pages], v_pages[:num_pages], table) in ``layout`` (``LAYOUT_NAMES``): the same
    values with other strides, each buffer built on the tensors' device (``.to`` would make a view
    contiguous). The pages past ``num_pages`` stay in the buffer behind the view."""
    import torch

    if layout in ("table", "both"):
        batch, width = table.shape
        filler = torch.Generator().manual_seed(int(table.sum()))      # the case's own: gen is not drawn from
        wide = torch.randint(1, num_pages, (batch + 2, 2 * width + 3), dtype=table.dtype, generator=filler)
        wide = wide.to(table.device)
        wide[1: batch + 1, :width] = table
        table = wide[1: batch + 1, :width]
    if layout in ("pages", "both"):
        d = q.shape[-1]

        def padded(x):
            buf = torch.full((*x.shape[:-1], d + PAD), float("nan"), dtype=x.dtype, device=x.device)
            buf[..., :d] = x
            return buf[..., :d]

        q, k_pages = padded(q), padded(k_pages)
        v_pages = v_pages.transpose(1, 2).contiguous().transpose(1, 2)
    return q, k_pages[:num_pages], v_pages[:num_pages], table


def make_paged_case(gen, lens, hq, hkv, d, page_size, dtype, device, spare_pages=4, gaps=False, lone=None,
                    layout: str = ""):
    """A random decode step: permuted pages; stale random K/V in every slot no sequence owns, and in
    ``extra`` pages past the end of the pool's buffer; NaN in the slots of a sequence's last page past
    its end (a cache's unwritten slots may hold anything: a kernel that loads them unmasked, relying on
    p = 0, gets 0 · NaN); page table entries past a sequence's pages (the table is wider than any
    sequence's tokens) name random pages.

    With ``gaps``, query heads 4j, 4j+1, 4j+2, 4j+3 meet scores near +192 then −192 (after the first
    16 tokens), −192 then +192, −192 everywhere, and near 0. With ``lone``, token 0 scores ``lone``
    above every other token and the others' values point the other way from its value. At 11.5 (weight
    e^−11.5 ≈ 10⁻⁵ for each other token) a block of 16 adds less than half an fp16 ulp to ℓ ≈ 1 and to
    the accumulator, so fp16 running sums drop every later block (about 1% of a 500-token answer). At
    ln((n − 1)/3) token 0 holds a quarter of the weight, which a 0.2% error in the scores' scale (log2(e)
    cut to 1.44) moves by 0.14%, the answer by 0.5%.

    ``layout`` (see ``laid_out``): "table" cuts the block table from a wider preallocated one, "pages"
    pads q's and K's rows and stores V in another order, "both" does both, "" leaves them contiguous.
    """
    import torch

    batch, longest = len(lens), max(lens)
    per_seq = [-(-n // page_size) for n in lens]
    num_pages = sum(per_seq) + spare_pages + 1                 # + page 0, the null page
    q = torch.randn(batch, hq, d, generator=gen)
    keys = torch.randn(batch, longest, hkv, d, generator=gen)
    values = torch.randn(batch, longest, hkv, d, generator=gen)
    if gaps:
        keys = 0.25 * keys
        keys[..., 1] += 8.0
        keys[:, :BLOCK_N, :, 0] += 8.0
        keys[:, BLOCK_N:, :, 0] -= 8.0
        small = 0.01 * torch.randn(batch, hq, d, generator=gen)
        for h in range(hq):
            q[:, h] = 0.0
            if h % 4 == 3:
                q[:, h] = small[:, h]
            else:
                q[:, h, 1 if h % 4 == 2 else 0] = -96.0 if h % 4 else 96.0
    if lone is not None:
        keys = 0.02 * keys
        values = 0.05 * values
        keys[:, :, :, 0] = 0.0
        keys[:, 0, :, 0] = lone * 4.0 * d ** 0.5 / d        # q · k / √d = lone with q's dim 0 = d / 4
        q = 0.02 * q
        q[:, :, 0] = d / 4.0
        direction = torch.randn(hkv, d, generator=gen)
        values[:, 0] += direction
        values[:, 1:] -= direction
    # Stale data everywhere, and past the last page (so a slot index past a page's end reads wrong
    # numbers, not outside the buffer); page table entries past a sequence's pages name random pages.
    extra = -(-longest // page_size) + 2
    k_pages = torch.randn(num_pages + extra, page_size, hkv, d, generator=gen) * 3
    v_pages = torch.randn(num_pages + extra, page_size, hkv, d, generator=gen) * 3
    # Page 0 is never a sequence's (vLLM keeps it as a null page too) and holds NaN: a masked load of
    # the page table with other=0 sends the lanes past a sequence's end there.
    order = 1 + torch.randperm(num_pages - 1, generator=gen)
    table = torch.randint(0, num_pages, (batch, max(max(per_seq) + 1, longest + 1, page_size)), generator=gen,
                          dtype=torch.int32)
    used = 0
    for b, n in enumerate(lens):
        table[b, : per_seq[b]] = order[used: used + per_seq[b]].int()
        used += per_seq[b]
        for t in range(n):
            k_pages[table[b, t // page_size], t % page_size] = keys[b, t]
            v_pages[table[b, t // page_size], t % page_size] = values[b, t]
        last = table[b, per_seq[b] - 1]
        k_pages[last, (n - 1) % page_size + 1:] = float("nan")
        v_pages[last, (n - 1) % page_size + 1:] = float("nan")
    k_pages[0] = float("nan")
    v_pages[0] = float("nan")
    lengths = torch.tensor(lens, dtype=torch.int32).to(device)
    q, k_pages, v_pages, table = laid_out(layout, q.to(device, dtype), k_pages.to(device, dtype),
                                          v_pages.to(device, dtype), table.to(device), num_pages)
    return q, k_pages, v_pages, table, lengths


# (lens, Hq, Hkv, D, page_size, what the case is for, values: "gaps", "" or token 0's score lead)
DECODE_FIXED = (
    ([40, 33], 4, 2, 16, 8, "scores ±192 over three blocks: exp overflows without a running max", "gaps"),
    ([48, 47, 49], 6, 3, 16, 4, "lengths 3·16 and 3·16 ± 1; 3 groups of 2 query heads", ""),
    ([1, 35], 8, 2, 32, 16, "one token; 2 groups of 4 query heads", ""),
    ([37], 4, 1, 16, 24, "multi-query: 4 query heads share one KV head; pages of 24 tokens, more than a block "
                         "and not a power of two", ""),
    # page sizes are any whole number (the lab's rule): with 6, tok & (page_size − 1) is not tok % page_size
    ([45, 34], 4, 2, 16, 6, "pages of 6 tokens: not a power of two", ""),
    ([528], 2, 1, 16, 16, "33 blocks, one token with almost all the weight: fp16 running sums drop the rest",
     11.5),
    ([160], 2, 1, 16, 16, "one token with a quarter of the weight: the scores' scale must be exact",
     float(np.log(159 / 3))),
)
# Each fixed case's layout (``laid_out``): the table cut from a wider one where there are two sequences
# or more (its row stride shows from the second), padded pages on every page size class; the precision
# cases stay contiguous.
DECODE_LAYOUTS = ("table", "pages", "both", "", "both", "", "")


def random_decode(rng):
    """Two shapes drawn from ``rng`` and a layout for each."""
    shapes = []
    for _ in range(2):
        hkv, group = int(rng.integers(1, 3)), int(rng.choice([1, 2, 4]))
        lens = [int(n) for n in rng.integers(1, 50, size=int(rng.integers(1, 3)))]
        shapes.append((lens, hkv * group, hkv, 16, int(rng.choice([3, 4, 5, 6, 8, 12, 16])), "", ""))
    layouts = tuple(str(rng.choice(list(LAYOUT_NAMES))) for _ in shapes)
    return shapes, layouts


def decode_cases(shapes, layouts, gen, device) -> list:
    """The cases of ``shapes`` (rows as in ``DECODE_FIXED``), each in its layout, float16."""
    import torch

    cases = []
    for (lens, hq, hkv, d, page, note, values), layout in zip(shapes, layouts, strict=True):
        args = make_paged_case(gen, lens, hq, hkv, d, page, torch.float16, device, gaps=values == "gaps",
                               lone=values if isinstance(values, float) else None, layout=layout)
        label = f"seq_lens={lens}, Hq={hq}, Hkv={hkv}, D={d}, page_size={page}"
        notes = "; ".join(x for x in (note, LAYOUT_NAMES[layout]) if x)
        cases.append(case(*args, label=f"{label} ({notes})" if notes else label))
    return cases
