"""What the device-side value check costs the paged decode kernel at B = 64, 4k (issue 40's note in
docs/paged_notes.md, "The eager call's host time"): the kernel with CHECK on and off, its registers and
spills as compiled, and its time (do_bench, CUDA events) with and without the check.

    PYTHONPATH=. python scripts/gpu_paged_check_cost.py
"""
from __future__ import annotations

import torch
import triton

from attnkit.bench import paged as bench_paged
from attnkit.kernels import paged


def compiled_kernels(kernel):
    """(constexpr CHECK, n_regs, n_spills, num_warps) of every compiled variant of ``kernel`` here."""
    found = []
    for caches in getattr(kernel, "device_caches", {}).values():
        for compiled in caches[0].values():
            constants = getattr(compiled.src, "constants", {}) if hasattr(compiled, "src") else {}
            check = next((v for k, v in constants.items() if "CHECK" in str(k)), None)
            found.append((check, compiled.n_regs, compiled.n_spills, compiled.metadata.num_warps))
    return found


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for batch in (64, 16, 1):
        p = bench_paged.make_problem(batch, 4096)
        args = (p["q"], p["k_pages"], p["v_pages"], p["block_table"], p["seq_lens"])
        for check in ("device", False):
            fn = lambda c=check: paged.paged_decode(*args, check_values=c)    # noqa: E731
            fn()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=25, rep=200)
            print(f"B = {batch:3}, 4k, check_values={check!r:9}: {ms * 1e3:8.1f} µs (do_bench)")
        paged.raise_pending_errors()
    for row in sorted(set(compiled_kernels(paged.paged_kernel)), key=str):
        print(f"compiled paged_kernel: CHECK={row[0]}, registers {row[1]}, spills {row[2]}, warps {row[3]}")


if __name__ == "__main__":
    main()
