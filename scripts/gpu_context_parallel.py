"""Context parallelism on N GPUs (NCCL): correctness against one GPU, timings, and the link's α and β.

    python scripts/gpu_context_parallel.py OUT_DIR --world 2      # 2 GPUs of this host
    python scripts/gpu_context_parallel.py OUT_DIR --cpu          # gloo processes, tiny sizes: the logic only

Writes to OUT_DIR:
- bench_context_parallel.csv: one row per check (scheme, causal, relative errors of o, dQ, dK, dV
  against one GPU's flash_attention, the bound, pass) and per timing (scheme, pass, N, tokens per rank,
  the slowest rank's median ms, one GPU's ms on the whole sequence, the speed-up, bytes each rank
  receives and their rate);
- bench_context_parallel_pingpong.csv: one-way time per message size between GPUs 0 and 1, and the
  least-squares α and β;
each row with the course's provenance (GPU, date, torch, triton, CUDA, cuDNN: ``attnkit.bench.recorder``),
the link between GPUs 0 and 1 (``nvidia-smi topo -m``) and NCCL's version.
The schemes and the measuring method: attnkit/distributed/benchmark.py.
"""
from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from pathlib import Path

import torch

from attnkit.bench.recorder import write_results
from attnkit.distributed import benchmark
from attnkit.distributed.launch import run_group


def _link() -> str:
    """The GPU0–GPU1 entry of ``nvidia-smi topo -m`` (NV18: 18 NVLinks; PIX/PXB/PHB/SYS: PCIe paths)."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for line in out.splitlines():
        cells = line.split()
        if cells and cells[0] == "GPU0" and len(cells) > 2:
            return cells[2]
    return "unknown"


def link_and_nccl(cpu: bool) -> dict:
    """What the course's recorder does not stamp: the link between GPUs 0 and 1 and NCCL's version."""
    if cpu:
        return dict(link="gloo (loopback)", nccl="")
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else ""
    return dict(link=_link(), nccl=nccl)


def write_csv(directory: Path, name: str, rows: list[dict], meta: dict) -> Path:
    """bench_<name>.csv with the course's provenance columns (GPU, date, torch, triton, CUDA, cuDNN)."""
    return write_results(name, [{**r, **meta} for r in rows], directory=directory)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the CSVs (created)")
    parser.add_argument("--world", type=int, default=None, help="GPUs (default: all of this host)")
    parser.add_argument("--cpu", action="store_true", help="gloo processes on the CPU, tiny sizes")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=None,
                        help="whole-sequence lengths to time (default: 8k … 128k on GPUs)")
    parser.add_argument("--heads", type=int, nargs=2, default=None, metavar=("HQ", "HKV"),
                        help="query and KV heads (default 32 8, Llama 3 8B's; CPU 4 2)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--non-causal", action="store_true", help="time without the causal mask")
    parser.add_argument("--skip", nargs="*", default=(), choices=("check", "time", "pingpong"))
    args = parser.parse_args(argv)

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
        seq_lens, (hq, hkv), d = args.seq_lens or [8192, 16384, 32768, 65536, 131072], args.heads or (32, 8), 128
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
    if "time" not in args.skip:
        timed = run(functools.partial(benchmark.time_rank, seq_lens=seq_lens, batch=1, hq=hq, hkv=hkv, d=d,
                                      dtype=dtype, block=block, causal=not args.non_causal,
                                      repeats=args.repeats))[0]
        for r in timed:
            print(f"time {r['variant']:14} {r['layout']:10} {r['pass_']:8} N={r['N']:>7} {r['ms']:9.3f} ms "
                  f"(one device {r['one_device_ms']:9.3f} ms, speed-up {r['speedup']:.2f})")
        rows += timed
    if rows:
        write_csv(args.out, "context_parallel", rows, meta)
    if "pingpong" not in args.skip:
        pp = run(functools.partial(benchmark.pingpong_rank, sizes=sizes))[0]
        for r in pp:
            print(f"{r['kind']:8} {r['bytes']!s:>10} bytes: {r['one_way_us']:10.2f} µs one way, "
                  f"{r['gb_per_s']:8.2f} GB/s {r.get('reason', '')}")
        write_csv(args.out, "context_parallel_pingpong", pp, {**meta, "world": world})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
