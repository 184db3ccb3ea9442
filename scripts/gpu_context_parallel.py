"""Context parallelism on N GPUs (NCCL): correctness against one GPU, timings, and the link's α and β.

    python scripts/gpu_context_parallel.py OUT_DIR --world 2      # 2 GPUs of this host
    python scripts/gpu_context_parallel.py OUT_DIR --cpu          # gloo processes, tiny sizes: the logic only
    python scripts/gpu_context_parallel.py OUT_DIR --merge DIR [DIR ...]   # one CSV pair from several runs

Writes to OUT_DIR:
- bench_context_parallel.csv: one row per check (scheme, causal, relative errors of o, dQ, dK, dV
  against one GPU's flash_attention, the bound, pass) and per timing (scheme, pass, N, tokens per rank,
  the slowest rank's median ms, one GPU's ms on the whole sequence, the speed-up, bytes each rank
  receives and their rate, the scheme's compute alone (``compute_ms``: the same blocks with no
  communication) and the overlap fraction ``ms / compute_ms``);
- bench_context_parallel_pingpong.csv: one-way time per message size between GPUs 0 and 1, and the
  least-squares α and β;
each row with the course's provenance (GPU, date, torch, triton, CUDA, cuDNN: ``attnkit.bench.recorder``),
the link between GPUs 0 and 1 (``nvidia-smi topo -m``) and NCCL's version.
The schemes and the measuring method: attnkit/distributed/benchmark.py.

The default shape is Llama 3 8B's attention (Hq = 32, Hkv = 8, D = 128), B = 1, bf16, causal, at whole
sequences of 8k to 256k tokens: at 256k one GPU's reference holds q, dO, o and dQ (2 GiB each in bf16)
and K, V with their gradients (0.5 GiB each) beside the kernels' float32 work space, well inside an
H100's 80 GB. ``--merge`` writes OUT_DIR's two CSVs from the CSVs of earlier runs (one machine with 2
GPUs, one with 4), each row as it was recorded.
"""
from __future__ import annotations

import argparse
import functools
import signal
import sys
from pathlib import Path

import torch

from attnkit.distributed import benchmark
from attnkit.distributed.benchmark import link_and_nccl, merge_csvs, write_csv
from attnkit.distributed.launch import run_group


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the CSVs (created)")
    parser.add_argument("--world", type=int, default=None, help="GPUs (default: all of this host)")
    parser.add_argument("--cpu", action="store_true", help="gloo processes on the CPU, tiny sizes")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=None,
                        help="whole-sequence lengths to time (default: 8k … 256k on GPUs)")
    parser.add_argument("--heads", type=int, nargs=2, default=None, metavar=("HQ", "HKV"),
                        help="query and KV heads (default 32 8, Llama 3 8B's; CPU 4 2)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed repeats per measurement (lengths of 128k and more: at most 3, each run "
                             "being long)")
    parser.add_argument("--non-causal", action="store_true", help="time without the causal mask")
    parser.add_argument("--skip", nargs="*", default=(), choices=("check", "time", "pingpong"))
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="DIR",
                        help="write OUT's CSVs from these runs' CSVs instead of measuring")
    args = parser.parse_args(argv)
    if args.merge:
        for path in merge_csvs(args.out, args.merge, ("context_parallel", "context_parallel_pingpong")):
            print("wrote", path)
        return 0

    if args.cpu:
        backend, block, world = "gloo", "torch", args.world or 2
        dtype = torch.float32 if args.dtype == "bfloat16" else getattr(torch, args.dtype)
        seq_lens, (hq, hkv), d = args.seq_lens or [64, 128], args.heads or (4, 2), 16
        check_n, sizes, timeout = 8 * world, benchmark.PINGPONG_SIZES[:7], 600
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --cpu to try the logic on gloo processes")
        backend, block, world = "nccl", "kernel", args.world or torch.cuda.device_count()
        if world > torch.cuda.device_count():
            parser.error(f"--world {world}: this host has {torch.cuda.device_count()} GPUs")
        dtype = getattr(torch, args.dtype)
        seq_lens, (hq, hkv), d = args.seq_lens or [2**k for k in range(13, 19)], args.heads or (32, 8), 128
        check_n, sizes, timeout = 1024 * world, benchmark.PINGPONG_SIZES, 3600
    if world < 2:
        parser.error("--world: context parallelism needs at least 2 ranks")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = link_and_nccl(args.cpu)
    run = functools.partial(run_group, world_size=world, backend=backend, timeout_s=timeout)

    rows = []
    if "check" not in args.skip:
        rows += run(functools.partial(benchmark.check_rank, n_total=check_n, batch=1, hq=hq, hkv=hkv, d=d,
                                      dtype=dtype, block=block))[0]
        failed = [r for r in rows if not r["ok"]]
        for r in rows:
            print(f"check {r['variant']:14} {r['layout']:10} causal={r['causal']!s:5} errors o/dq/dk/dv "
                  f"{r['err_o']:.1e} {r['err_dq']:.1e} {r['err_dk']:.1e} {r['err_dv']:.1e} (bound {r['bound']:.0e})"
                  f" {'ok' if r['ok'] else 'FAILED'}")
        if failed:
            print(f"{len(failed)} checks failed: no timings recorded", file=sys.stderr)
            write_csv(args.out, "context_parallel", rows, meta)
            return 1
    if rows:
        write_csv(args.out, "context_parallel", rows, meta)
    if "pingpong" not in args.skip:
        pp = run(functools.partial(benchmark.pingpong_rank, sizes=sizes))[0]
        for r in pp:
            print(f"{r['kind']:8} {r['bytes']!s:>10} bytes: {r['one_way_us']:10.2f} µs one way, "
                  f"{r['gb_per_s']:8.2f} GB/s {r.get('reason', '')}")
        write_csv(args.out, "context_parallel_pingpong", pp, {**meta, "world": world})
    if "time" not in args.skip:
        # The lengths up to 64k in one group of processes, each longer one in its own; the CSV is written
        # after each group, so a run cut off by a time limit keeps what it measured.
        groups = [[n for n in seq_lens if n < 131072]] + [[n] for n in seq_lens if n >= 131072]
        for group in (g for g in groups if g):
            timed = run(functools.partial(benchmark.time_rank, seq_lens=group, batch=1, hq=hq, hkv=hkv, d=d,
                                          dtype=dtype, block=block, causal=not args.non_causal,
                                          repeats=args.repeats if group[0] < 131072 else min(args.repeats, 3)))[0]
            for r in timed:
                print(f"time {r['variant']:14} {r['layout']:10} {r['pass_']:8} N={r['N']:>7} {r['ms']:9.3f} ms "
                      f"(one device {r['one_device_ms']:9.3f} ms, speed-up {r['speedup']:.2f}; compute alone "
                      f"{r['compute_ms']:9.3f} ms, overlap fraction {r['overlap_fraction']:.2f})", flush=True)
            rows += timed
            write_csv(args.out, "context_parallel", rows, meta)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    # `timeout` sends SIGTERM: leave through run_group's clean-up, which ends the ranks (they hold the GPUs)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main())
