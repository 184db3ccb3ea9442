"""How the lost variants were launched in attnkit (commit 3863a76, attnkit/kernels/flash.py): their
switch sets, the ping_pong rule and their autotune spaces. The launcher they ran through is that
commit's attnkit.kernels.flash._forward_switches (`git show 3863a76:attnkit/kernels/flash.py`).
"""
from __future__ import annotations

_BASE = dict(use_exp2=True, split=True, tuned=True, desc=False, warp_spec=False, halves=False, ping_pong=False,
             pipeline=False, host_desc=False, host_rule=False)
# Switch sets explored on the GPU (scripts/gpu_flash_tuning.py) outside the ladder (see
# docs/flash_notes.md): "halves" computes every query tile as two interleaved halves;
# "ping_pong" takes halves for non-causal D = 128 from 1k keys on and whole descriptor tiles for
# causal D = 128 from 2k keys on (ping_pong_choice), faster than "descriptors" but slower than
# "host_descriptors"; "warp_specialized" did not compile on Hopper with Triton 3.6; "pipelined"
# issues the next tile's score product before the current tile's softmax (FlashAttention-3's
# intra-warpgroup overlap by hand), measured slower at every size; "host_halves" is "halves" with
# host-built descriptors, slower than "host_descriptors".
CANDIDATES = {
    "ping_pong": dict(_BASE, desc=True, ping_pong=True),
    "halves": dict(_BASE, desc=True, halves=True),
    "warp_specialized": dict(_BASE, desc=True, warp_spec=True),
    "pipelined": dict(_BASE, desc=True, pipeline=True),
    "host_halves": dict(_BASE, desc=True, host_desc=True, halves=True),
}

# Two interleaved halves (HALVES=True): 256-row query tiles, 128 rows each half (the two fastest
# configurations measured at D = 128).
FWD_HALVES_CONFIGS = [(256, 64, 8, 3), (256, 64, 8, 4)]


def ping_pong_choice(causal: bool, head_dim: int, n_k: int) -> dict:
    """The kernel switches the ping_pong candidate uses for one shape, from the H100 measurements in
    docs/flash_notes.md: two half tiles for non-causal D = 128 from 1k keys on, descriptor tiles
    for causal D = 128 from 2k keys on, and the autotuned pointer kernel elsewhere (at D = 64, and for
    short sequences, where each program's few key tiles do not repay building its descriptors)."""
    if head_dim != 128:
        return dict(desc=False, halves=False)
    if causal:
        return dict(desc=n_k >= 2048, halves=False)
    return dict(desc=n_k >= 1024, halves=n_k >= 1024)
