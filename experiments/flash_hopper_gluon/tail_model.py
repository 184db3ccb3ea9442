"""How evenly a causal forward's tiles fill the H100's SMs, by the order the grid hands them out.

A model, not a measurement: one program per SM at a time (the warp-specialised kernel's shared memory
and registers leave room for one), a program's time proportional to the key blocks it walks (query
block m of a causal head walks m + 1), and the hardware giving the next program to the first SM that
frees up, in the grid's order (blockIdx.x fastest). The makespan over the mean work per SM is what the
order costs: 1.0 is a perfect fill.

    python experiments/flash_hopper_gluon/tail_model.py

Orders: head by head, each head's blocks shortest first or longest first (the package kernel's
``head_group`` 1), every tile longest first (which also spreads a head's blocks over the whole run: its
K and V are read again from HBM when the L2 cache has let them go), and longest first within groups of
g heads (``head_group`` g; the K/V that a group's programs read at once: g · 2 · N · D · 2 bytes).
"""
from __future__ import annotations

import heapq

SMS = 132                       # the H100 SXM's streaming multiprocessors
TOKENS, HEADS, BLOCK_M, BLOCK_N, HEAD_DIM = 16384, 16, 128, 128, 128


def makespan(lengths, sms: int = SMS) -> int:
    """The finish time of the last SM when each tile goes, in order, to the SM that frees up first."""
    free_at = [0] * sms
    for length in lengths:
        heapq.heappush(free_at, heapq.heappop(free_at) + length)
    return max(free_at)


def orders(n_m: int, heads: int, groups=(16, 32, 64)) -> dict:
    """Tile lengths (key blocks) in each order's dispatch order; n_m query blocks per head, square causal."""
    found = {
        "head by head, shortest first": [m + 1 for _ in range(heads) for m in range(n_m)],
        "head by head, longest first": [n_m - m for _ in range(heads) for m in range(n_m)],
        "longest first overall": [n_m - r for r in range(n_m) for _ in range(heads)],
    }
    for g in groups:
        if g < heads and heads % g == 0:
            found[f"longest first in groups of {g} heads"] = [n_m - r for _ in range(heads // g)
                                                              for r in range(n_m) for _ in range(g)]
    return found


def fill(n: int) -> dict:
    """Makespan ÷ mean work per SM of each order at sequence length n (B · N = TOKENS, HEADS heads)."""
    n_m, heads = -(-n // BLOCK_M), TOKENS // n * HEADS
    mean = heads * n_m * (n_m + 1) / 2 / SMS
    return {name: makespan(lengths) / mean for name, lengths in orders(n_m, heads).items()}


def main() -> None:
    for n in (1024, 2048, 4096, 16384):
        heads = TOKENS // n * HEADS
        kv_mb = 2 * n * HEAD_DIM * 2 / 2**20
        print(f"causal N = {n}: {heads} (batch, head) pairs, {-(-n // BLOCK_M)} query blocks each, "
              f"K and V {kv_mb:.1f} MB a head")
        for name, ratio in fill(n).items():
            print(f"  {name:38s} {ratio:.3f}")


if __name__ == "__main__":
    main()
