"""How steady is one ratio? The course's forward and cuDNN's, timed alternately many times in one process,
with the GPU's clock and power read while each timing runs.

    PYTHONPATH=. python scripts/gpu_flash_spread.py OUTDIR [--repeats 12] [--backward | --persistent]

The same non-causal forward (fp16, D = 128, B·N = 16k tokens, 16 heads, N = 4096) measured 0.891 ms in the
SDPA suite and 0.974 ms in the ladder of one recording (cuDNN 0.914 and 0.900). Here each repeat allocates
fresh q, k, v and times the course's call (``flash_attention_forward``) and cuDNN's one after the other with
``triton.testing.do_bench``, at causal N = 1024 and 2048 (target 2 of issue 17) and non-causal 4096, 8192 and
16384 (target 3). ``nvidia-smi`` samples the SM clock, the power draw and the active clock event reasons every
100 ms; each row keeps the samples taken while its timing ran (median clock, highest power, whether the power
cap, reason 0x4, was active). Rows go to OUTDIR/bench_flash_spread.csv with the GPU, date and versions; lesson
5 prints them. With ``--backward``: the backward instead (the suite's way: ``torch.autograd.grad`` of one
forward, kept) of the two Gluon designs, ``warp_specialized`` (7 products, reproducible) and
``warp_specialized_atomic`` (the one pass, dQ added by TMA's bulk reductions), at D = 64 and 128, N = 1024,
4096 and 16384, causal and not, into OUTDIR/bench_flash_spread_backward.csv. With ``--persistent``: the public
call, the Gluon kernel's persistent programs forced (``hopper.launch(..., persistent=True)``) and cuDNN at
non-causal N = 4096, 8192 and 16384, D = 128, into OUTDIR/bench_flash_spread_persistent.csv: whether
persistent programs should run beyond 2k keys when not causal. The runs and their reading:
experiments/flash_hopper_gluon/README.md and docs/flash_notes.md.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torch

from attnkit.bench.flash import implementation
from attnkit.bench.recorder import time_ms, write_results
from attnkit.kernels.flash import flash_attention_forward

HEADS, HEAD_DIM, TOKENS = 16, 128, 16 * 1024
CASES = [(1024, True), (2048, True), (4096, False), (8192, False), (16384, False)]       # (N, causal), D = 128
PERSISTENT_CASES = [(n, False, 128) for n in (4096, 8192, 16384)]
BACKWARD_CASES = [(n, causal, d) for d in (128, 64) for n in (1024, 4096, 16384) for causal in (False, True)]
SW_POWER_CAP = 0x4          # nvidia-smi's clocks_event_reasons: the clock lowered to hold the power limit
QUERY = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"


def samples(path: Path) -> list[tuple[float, float, float, int]]:
    """(unix time, SM MHz, watts, reasons) of every line nvidia-smi wrote (its timestamps are local time)."""
    parsed = []
    for line in path.read_text().splitlines():
        fields = [f.strip() for f in line.split(",")]
        try:
            when = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            parsed.append((when, float(fields[1]), float(fields[2]), int(fields[3], 16)))
        except (ValueError, IndexError):
            continue                                   # a header or a partial last line
    return parsed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=12)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--backward", action="store_true")
    mode.add_argument("--persistent", action="store_true")
    args = parser.parse_args(argv)
    cudnn = implementation("sdpa_cudnn")
    if args.backward:
        cases = BACKWARD_CASES
        from attnkit.kernels.flash import flash_attention

        calls = {design: backward_of(lambda q, k, v, causal, design=design: flash_attention(
            q, k, v, causal=causal, backward=design)) for design in ("warp_specialized", "warp_specialized_atomic")}
        calls["sdpa_cudnn"] = backward_of(cudnn)
    elif args.persistent:
        from attnkit.kernels.flash import hopper

        cases = PERSISTENT_CASES
        calls = {impl: forward_of(call) for impl, call in
                 (("attnkit", lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal)[0]),
                  ("persistent", lambda q, k, v, causal: hopper.launch(
                      q, k, v, causal, q.shape[-1] ** -0.5, 64, 128, 2, 2, True)[0]),
                  ("sdpa_cudnn", cudnn))}
    else:
        cases = [(n, causal, HEAD_DIM) for n, causal in CASES]
        calls = {impl: forward_of(call) for impl, call in
                 (("attnkit", lambda q, k, v, causal: flash_attention_forward(q, k, v, causal=causal)[0]),
                  ("sdpa_cudnn", cudnn))}
    log = Path(tempfile.mkstemp(suffix=".csv")[1])
    sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                "-lms", "100"], stdout=log.open("w"), stderr=subprocess.DEVNULL)
    timed = []                                         # (row, start, end)
    try:
        for repeat in range(args.repeats):
            for n, causal, head_dim in cases:
                heads = HEADS * HEAD_DIM // head_dim                     # H · D = 2048
                q, k, v = (torch.randn(TOKENS // n, heads, n, head_dim, device="cuda", dtype=torch.float16)
                           for _ in range(3))
                for impl, make in calls.items():
                    call = make(q, k, v, causal)
                    call()                              # compiled and warm before the clock starts
                    torch.cuda.synchronize()
                    start = time.time()
                    ms = time_ms(call)
                    end = time.time()
                    timed.append((dict(repeat=repeat, n=n, causal=causal, head_dim=head_dim, impl=impl, ms=ms),
                                  start, end))
                    print(f"#{repeat} N={n} causal={causal} D={head_dim} {impl:>10} {ms:.4f} ms", flush=True)
                q = k = v = call = None
    finally:
        time.sleep(0.3)
        sampler.terminate()
        sampler.wait()
    read = samples(log)
    rows = []
    for row, start, end in timed:
        during = [s for s in read if start <= s[0] <= end]
        rows.append({**row, "samples": len(during),
                     "sm_mhz": statistics.median(s[1] for s in during) if during else None,
                     "max_watts": max(s[2] for s in during) if during else None,
                     "power_capped": any(s[3] & SW_POWER_CAP for s in during) if during else None})
    name = "flash_spread" + ("_backward" if args.backward else "_persistent" if args.persistent else "")
    print(write_results(name, rows, args.out), file=sys.stderr)
    pairs = [("sdpa_cudnn", impl) for impl in calls if impl != "sdpa_cudnn"]
    if args.persistent:
        pairs.append(("attnkit", "persistent"))
    for n, causal, head_dim in cases:
        for slower, faster in pairs:
            ratios = []
            for repeat in range(args.repeats):
                ms = {r["impl"]: r["ms"] for r in rows
                      if (r["n"], r["causal"], r["head_dim"], r["repeat"]) == (n, causal, head_dim, repeat)}
                ratios.append(ms[slower] / ms[faster])
            print(f"N={n} causal={causal} D={head_dim}: {slower}'s time ÷ {faster}'s, median "
                  f"{statistics.median(ratios):.3f}, {min(ratios):.3f} to {max(ratios):.3f}", file=sys.stderr)


def forward_of(attend):
    """make(q, k, v, causal) -> a call of the forward alone, without autograd."""
    def make(q, k, v, causal):
        def call():
            with torch.no_grad():
                return attend(q, k, v, causal)
        return call
    return make


def backward_of(attend):
    """make(q, k, v, causal) -> a call of the backward of one forward (kept), as the SDPA suite times it."""
    def make(q, k, v, causal):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        o = attend(q, k, v, causal)
        do = torch.randn_like(o)
        return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    return make


if __name__ == "__main__":
    main()
