"""Profile one FlashAttention case on the H100 under Nsight Compute (issue 17, target 5): where the course's
backward and short causal forward lose to cuDNN (stall reasons, occupancy, registers, tensor-pipe use).

    ncu --profile-from-start off --set full -o REPORT python scripts/gpu_flash_profile.py CASE
    python scripts/gpu_flash_profile.py --triton-meta OUT.csv   # registers, spills, shared memory

CASE is one of ``CASES``. Everything is compiled and run once before the profiled window
(cudaProfilerStart/Stop), so ncu sees one call: the kernels of one backward or one forward, each launcher
with its default configuration unless the case names one. fp16, 16 heads, B·N = 16k tokens.
``--triton-meta`` runs every attnkit case (no profiler) and writes what Triton reports of each compiled
kernel.
"""
from __future__ import annotations

import csv
import math
import os
import sys

os.environ["ATTNKIT_AUTOTUNE"] = "0"

import gpu_flash_backward as fb  # noqa: E402
import torch  # noqa: E402

from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import backward as backward_launch  # noqa: E402
from attnkit.kernels.flash import forward as forward_launch  # noqa: E402
from attnkit.kernels.flash import triton_kernels  # noqa: E402

BC = flash.BlockConfig
# name: (pass, implementation, head_dim, n, causal, tiles by descriptors, block configuration or None:
# the launcher's default)
CASES = {
    "bwd_two_kernels": ("backward", "two_kernels", 128, 4096, True, False, None),
    "bwd_two_kernels_desc": ("backward", "two_kernels", 128, 4096, True, True, None),
    "bwd_atomic_dq": ("backward", "atomic_dq", 128, 4096, True, False, None),
    "bwd_atomic_dq_desc": ("backward", "atomic_dq", 128, 4096, True, True, None),
    "bwd_cudnn": ("backward", "sdpa_cudnn", 128, 4096, True, False, None),
    "fwd_causal_1k": ("forward", "attnkit", 128, 1024, True, True, None),
    "fwd_causal_1k_128x64": ("forward", "attnkit", 128, 1024, True, True, BC(128, 64, 4, 3)),   # the old default
    "fwd_causal_1k_cudnn": ("forward", "sdpa_cudnn", 128, 1024, True, False, None),
    "fwd_4k": ("forward", "attnkit", 128, 4096, False, True, BC(128, 128, 8, 3)),
    "fwd_4k_cudnn": ("forward", "sdpa_cudnn", 128, 4096, False, False, None),
}


def case_call(name: str):
    """A function running case ``name`` once (its inputs built, nothing run yet)."""
    pass_, impl, head_dim, n, causal, desc, config = CASES[name]
    tensors = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, head_dim)
    q, k, v, do = tensors
    if pass_ == "forward":
        if impl == "sdpa_cudnn":
            attend = fb.implementation("sdpa_cudnn")
            return lambda: attend(q, k, v, causal)
        rung = flash.VARIANTS[flash.BEST_TRITON]
        return lambda: forward_launch.forward_rung(q, k, v, causal, 1 / math.sqrt(head_dim), rung, config)
    if impl == "sdpa_cudnn":
        return fb.sdpa_backward(impl, tensors, causal)
    o, lse = fb.forward_for_backward(q, k, v, causal)
    launchers = ("bwd_atomic",) if impl == "atomic_dq" else ("bwd_dkdv", "bwd_dq")
    configs = {launcher: config or flash.default_config(launcher, head_dim) for launcher in launchers}
    return lambda: backward_launch.backward(do, q, k, v, o, lse, causal, 1 / math.sqrt(head_dim), design=impl,
                                   configs=configs, desc=desc)


def profile(name: str) -> None:
    call = case_call(name)
    with torch.no_grad() if CASES[name][0] == "forward" else torch.enable_grad():
        call()                                   # compile (or load from the cache) and warm up
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def compiled_kernels(jit_function):
    """Triton's compiled variants of one @triton.jit function (its in-memory cache, any device)."""
    for entry in getattr(jit_function, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        yield from cache.values()


def constants(kernel) -> dict:
    src = getattr(kernel, "src", None)
    names = getattr(getattr(src, "fn", None), "arg_names", [])
    return {names[key[0]]: value for key, value in getattr(src, "constants", {}).items()
            if isinstance(key, tuple) and len(key) == 1 and key[0] < len(names)}


def triton_meta(out_path: str) -> None:
    for name, (pass_, impl, *_rest) in CASES.items():
        if impl != "sdpa_cudnn":
            with torch.no_grad() if pass_ == "forward" else torch.enable_grad():
                case_call(name)()
    torch.cuda.synchronize()
    rows = []
    for fn_name in ("_attn_fwd", "_bwd_dkdv", "_bwd_dq", "_bwd_preprocess"):
        for kernel in compiled_kernels(getattr(triton_kernels, fn_name)):
            meta, const = kernel.metadata, constants(kernel)
            rows.append(dict(kernel=fn_name, block_m=const.get("BLOCK_M"), block_n=const.get("BLOCK_N"),
                             head_dim=const.get("HEAD_DIM"), causal=const.get("CAUSAL"),
                             atomic_dq=const.get("ATOMIC_DQ"), desc=const.get("DESC"),
                             num_warps=getattr(meta, "num_warps", None),
                             num_stages=getattr(meta, "num_stages", None), shared_bytes=getattr(meta, "shared", None),
                             registers=getattr(kernel, "n_regs", None), spills=getattr(kernel, "n_spills", None)))
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["kernel"])
        writer.writeheader()
        writer.writerows(rows)
    for r in rows:
        print(r)


def main(argv) -> int:
    if not argv or argv[0] not in (*CASES, "--triton-meta"):
        print(__doc__)
        return 2
    if argv[0] == "--triton-meta":
        triton_meta(argv[1])
    else:
        profile(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
