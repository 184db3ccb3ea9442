"""The Gluon forward compiled for the H100 (sm_90a) on any machine, and what its PTX says about the
overlap: how the key loop waits for its warpgroup matrix products.

    TRITON_INTERPRET=0 PYTHONPATH=. python experiments/flash_hopper_gluon/compiled.py

For each configuration it prints ptxas's registers, spills and wgmma verdict, and the counts of
``wgmma.wait_group.sync.aligned 1`` (wait for the score product only, the value product still
running) and ``... 0`` (wait for every product). With OVERLAP the loop must hold a ``1``.
"""
from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"   # compile for a GPU target, even on a CPU

import triton  # noqa: E402

from attnkit.bench.compiled import compile_gluon_ptx, ptxas_report  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel  # noqa: E402


def compile_ptx(block_m: int, block_n: int, head_dim: int, causal: bool, stages: int, warps: int,
                overlap: bool) -> str:
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, CAUSAL=causal, STAGES=stages,
                      OVERLAP=overlap, num_warps=warps)
    return compile_gluon_ptx(kernel._attn_fwd_hopper, constexprs,
                             dict(q_desc=block_m, k_desc=block_n, v_desc=block_n), warps)


def main() -> int:
    print(f"Triton {triton.__version__}, sm_90a, fp16")
    for config in ((128, 128, 128, 2, 8), (64, 64, 128, 3, 4), (64, 128, 64, 2, 4)):
        for causal in (False, True):
            for overlap in (True, False):
                ptx = compile_ptx(*config[:3], causal, *config[3:], overlap)
                waits = [ptx.count(f"wgmma.wait_group.sync.aligned {n};") for n in (1, 0)]
                print(f"{'x'.join(map(str, config[:2]))} D={config[2]} s{config[3]} w{config[4]} causal={causal!s:5} "
                      f"overlap={overlap!s:5}: {ptxas_report(ptx).line()}, waits for 1: {waits[0]}, for 0: {waits[1]}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
