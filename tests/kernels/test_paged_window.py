"""Sliding-window decode: paged_decode(..., window=(left, right)) sees each sequence's last left + 1
tokens, never loading the pages before them (they hold NaN here, so a read poisons the output)."""
from __future__ import annotations

import pytest
import torch
from test_paged import make_case

from attnkit.kernels.paged import paged_decode, paged_decode_ref
from attnkit.tolerances import rel_error, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def poison_before_window(k_pages, v_pages, block_table, seq_lens, left):
    """NaN into every cached token older than each sequence's window."""
    page_size = k_pages.shape[1]
    for b, n in enumerate(seq_lens.tolist()):
        for t in range(max(n - 1 - left, 0)):
            page = int(block_table[b, t // page_size])
            k_pages[page, t % page_size] = float("nan")
            v_pages[page, t % page_size] = float("nan")


@pytest.mark.parametrize("left", [0, 5, 16, 40, 200])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_window_matches_reference_and_skips_old_pages(left, num_splits):
    gen = torch.Generator().manual_seed(left * 7 + num_splits)
    q, k_pages, v_pages, table, lens = make_case(gen, [37, 1, 64, 50], dtype=torch.float32, device="cpu")
    expected = paged_decode_ref(q, k_pages, v_pages, table, lens, window=(left, -1))
    poison_before_window(k_pages, v_pages, table, lens, left)
    args = [t.to(DEVICE) for t in (q, k_pages, v_pages, table, lens)]
    out = paged_decode(*args, window=(left, 0), num_splits=num_splits)
    assert torch.isfinite(out).all(), "a token before the window was read"
    assert rel_error(out.cpu(), expected) <= tolerance(torch.float32, DEVICE)


def test_unbounded_window_is_full_attention():
    gen = torch.Generator().manual_seed(3)
    q, k_pages, v_pages, table, lens = make_case(gen, [20, 9], dtype=torch.float32, device="cpu")
    full = paged_decode_ref(q, k_pages, v_pages, table, lens)
    torch.testing.assert_close(paged_decode_ref(q, k_pages, v_pages, table, lens, window=(-1, -1)), full)
    torch.testing.assert_close(paged_decode_ref(q, k_pages, v_pages, table, lens, window=(19, -1)), full)
    assert rel_error(paged_decode_ref(q, k_pages, v_pages, table, lens, window=(3, -1)), full) > 1e-3


@pytest.mark.parametrize("window", [(-2, -1), (3,), 4, (1.5, 0), (True, 0)])
def test_bad_window_is_refused(window):
    gen = torch.Generator().manual_seed(0)
    args = [t.to(DEVICE) for t in make_case(gen, [5], device="cpu")]
    with pytest.raises(ValueError, match="window"):
        paged_decode(*args, window=window)
