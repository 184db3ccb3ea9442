"""One call of the package's Gluon forward with its tiles in groups of G (batch, head) pairs, inside a
profiler window, for Nsight Compute to read what the order does to the L2 cache (README.md, "The order
of a causal grid's tiles"). fp16, B · N = 16k tokens, 2048 / D heads.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum,... \
        python experiments/flash_hopper_gluon/tile_order.py GROUP CAUSAL [N] [D]
"""
from __future__ import annotations

import math
import sys

import torch

from attnkit.kernels import flash_hopper


def main(head_group: int, causal: bool, n: int = 1024, head_dim: int = 128) -> None:
    heads, batch = 2048 // head_dim, 16384 // n
    q, k, v = (torch.randn(batch, heads, n, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    config = flash_hopper.CONFIG[head_dim, causal]

    def call():
        return flash_hopper._launch(q, k, v, causal, 1 / math.sqrt(head_dim), *config, head_group)
    call()                                      # compiled and warm before the window
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] == "1", *(int(x) for x in sys.argv[3:5]))
