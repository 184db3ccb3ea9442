"""Timing and recording GPU results, shared by every benchmark in the course.

``time_ms`` times a call; ``write_results`` writes rows to ``bench_<name>.csv`` (by default into the
package's ``attnkit/bench/results/``) with the GPU's name, the date and the torch / triton / CUDA / cuDNN
versions added to every row, so a recorded number always says where it came from; ``read_results`` and
``describe_source`` read them back. On a CPU, notebooks show these recorded files instead of live timings.
The suites themselves (one function each, in the modules of ``attnkit/bench/``) are the table of
``attnkit.bench.suites``, which runs them:

    python -m attnkit.bench.suites [--out DIR] [SUITE ...]        # every suite when none is named

Where results live and how rows are written and read is ``attnkit.results`` (the package's lowest floor, so
that ``distributed/`` uses it too), re-exported here; this module imports no suite.
"""
from __future__ import annotations

from ..results import PROVENANCE, RESULTS, describe_source, provenance, read_results, write_results

__all__ = ["RESULTS", "PROVENANCE", "SUITE_NAMES", "NOT_YET_RECORDED", "SCRIPT_RESULTS", "time_ms",
           "provenance", "write_results", "read_results", "describe_source"]
# The suites' names, as ``bench_<name>.csv`` and the command line call them; ``suites.SUITES`` maps each to
# its function (that table imports every suite's module, each of which imports this one).
SUITE_NAMES = ("naive_attention", "naive_profile", "flash", "flash_ladder", "paged", "kvcache", "serving",
               "serving_features", "serving_steps", "softmax", "bandwidth", "decode_profile")
# Suites written but not yet run on a GPU: their lessons say "recorded on a GPU only" until they are.
NOT_YET_RECORDED: tuple[str, ...] = ()
# Results written by the GPU scripts (checks, then timings of several designs side by side), kept beside
# the suites' CSVs: bench_<name>.csv and the command that recorded it (scripts/gpu_session.sh runs all).
SCRIPT_RESULTS = {
    "flash_features": "python scripts/gpu_flash_features.py DIR --no-check",
    "flash_backward": "python scripts/gpu_flash_backward.py DIR",
    "flash_fp8": "python scripts/gpu_flash_fp8.py DIR",
    "flash_fp8_sweep": "python scripts/gpu_flash_fp8.py DIR --sweep",
    "paged_fp8": "python -m attnkit.bench.paged fp8 DIR --decode-only",
    "paged_eager": "python scripts/gpu_paged.py --out DIR --mode eager fp8 headdims",
    "paged_fp8_ratio": "python scripts/gpu_paged.py --out DIR --mode eager fp8 headdims",
    "paged_headdims": "python scripts/gpu_paged.py --out DIR --mode eager fp8 headdims",
    "flash_sweep": "python scripts/gpu_flash_sweep.py DIR (D = 256: --head-dim-256)",
    "flash_profile": "bash scripts/gpu_session.sh tune-time DIR (ncu, then scripts/summarize_ncu.py); the backward's "
                     "rows: record-backward-profile",
    "flash_overhead": "python scripts/gpu_flash_overhead.py DIR",
    "flash_suite_row": "python scripts/gpu_flash_suite_row.py DIR",
    "flash_spread": "python scripts/gpu_flash_spread.py DIR --repeats 12",
    "flash_spread_persistent": "python scripts/gpu_flash_spread.py DIR --repeats 12 --persistent",
    "flash_spread_backward": "python scripts/gpu_flash_spread.py DIR --repeats 7 --backward",
    "flash_hopper": "python scripts/gpu_flash_hopper.py --out DIR --configs hopper,ws:64x128x3,128x128x2x8,"
                    "128x128x2x8x0 --check-configs 2",
    "flash_hopper_backward": "python scripts/gpu_flash_hopper_backward.py DIR --n 1024,2048,4096,8192,16384",
    "flash_tile_order": "python scripts/gpu_flash_hopper.py --out DIR --name flash_tile_order --configs hopper,"
                        "ws:64x128x2:h16,ws:64x128x2:h32,ws:64x128x2:h64,sched:64x128x2,sched:64x128x2:h32 "
                        "--check-configs 6 --head-dims 128 --lengths 1024,2048,4096; then the first four configs "
                        "at --head-dims 64 --lengths 1024,2048 (rows appended)",
    "flash_persistent": "python scripts/gpu_flash_hopper.py --out DIR --name flash_persistent --configs hopper,"
                        "ws:64x128x2,ws:64x128x2:p --check-configs 3 --lengths 1024,2048,4096,8192,16384",
    "context_parallel": "python scripts/gpu_context_parallel.py W2 --world 2 --repeats 3, the same with W4 and "
                        "--world 4, then python scripts/gpu_context_parallel.py DIR --merge W2 W4; N = 256k: "
                        "--seq-lens 262144 --repeats 3 --skip check pingpong at --world 2 and 4 (C2, C4), then "
                        "--merge SHIPPED C2 C4 (docs/context_parallel.md)",
    "context_parallel_pingpong": "python scripts/gpu_context_parallel.py DIR: the runs and merge of context_parallel",
    "tensor_parallel_decode": "python scripts/gpu_tensor_parallel.py DIR --tp 2 4",
    "flash_broadcast_do": "python scripts/gpu_flash_broadcast_do.py DIR --repeats 5",
    "flash_headdims": "python scripts/gpu_flash_headdims.py DIR --quick (--no-sweep after a change of the dispatch)",
    "flash_eager": "python scripts/gpu_flash_eager.py DIR --repeats 5",
    "flash_headdims_sweep": "python scripts/gpu_flash_headdims.py DIR --quick",
    "leaderboard": "python -m attnkit.classroom.grading leaderboard --jobs 12 --repeats 3 --out DIR "
                   "solutions/lab0[4568]_*.ipynb tests/fixtures/leaderboard/*.ipynb (docs/leaderboard.md)",
    "flash_tile_order_ncu": "python scripts/gpu_flash_tile_order_ncu.py --csv RAW DIR/bench_flash_tile_order.csv DIR "
                            "(RAW: ncu's lines of gpu_flash_tile_order_ncu.py G C 1024, "
                            "experiments/flash_hopper_gluon/tile_order_ncu.csv)",
}


def time_ms(fn, *, warmup: int = 25, rep: int = 100) -> float:
    """Median time of ``fn()`` in milliseconds, measured with CUDA events by triton.testing.do_bench."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
