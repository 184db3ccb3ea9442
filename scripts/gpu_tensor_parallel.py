"""Tensor-parallel decode of the capstone's tiny model over NCCL, token for token against one GPU.

    python scripts/gpu_tensor_parallel.py OUT_DIR --tp 2 4      # tp = 2 and 4 GPUs of this host
    python scripts/gpu_tensor_parallel.py OUT_DIR --cpu         # gloo processes: the logic only
    python scripts/gpu_tensor_parallel.py OUT_DIR --merge DIR [DIR ...]   # one CSV from several runs

The reference is one GPU (GPU 0) decoding the same prompt with the plain model, no cache and no split
(``attnkit.serving.tinymodel.greedy_no_cache``). Then ``attnkit.distributed.tensor_parallel.decode_rank``
runs on 1 GPU (the split code with nothing split: its time is the baseline) and on every ``--tp`` count:
each rank holds its query heads, their KV heads and their columns of the output projection on its own
GPU, and one all-reduce per layer sums the partial outputs. No stop token: every run decodes
``--new-tokens`` tokens.

Writes OUT_DIR/bench_tensor_parallel_decode.csv, one row per tp: the tokens equal to one GPU's (yes/no),
the first position where they differ (empty when none), whether every rank produced the same tokens,
each rank's KV heads and cache bytes, and ms per token (the median decode step, the slowest rank's;
the prompt's step left out), with the course's provenance (GPU, date, torch, triton, CUDA, cuDNN), the
link between GPUs 0 and 1 and NCCL's version.
"""
from __future__ import annotations

import argparse
import functools
import signal
import sys
from pathlib import Path

import torch

from attnkit.bench.recorder import write_results
from attnkit.distributed import tensor_parallel
from attnkit.distributed.benchmark import link_and_nccl, merge_csvs
from attnkit.distributed.launch import run_group
from attnkit.serving.tinymodel import greedy_no_cache, load_model

NAME = "tensor_parallel_decode"
PROMPT = "the kernel reads"


def first_difference(got: list[int], expected: list[int]) -> int | None:
    """The first position where two token lists differ (a missing token counts), None if equal."""
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return i
    return None if len(got) == len(expected) else min(len(got), len(expected))


def reference_tokens(prompt: str, new_tokens: int, device: torch.device) -> list[int]:
    """One device, the plain model: no cache, no split."""
    model = load_model().to(device)
    tokens, _ = greedy_no_cache(model, model.encode(prompt), new_tokens)
    return tokens


def row_for(tp: int, results: list[dict], expected: list[int], prompt: str, new_tokens: int) -> dict:
    tokens = results[0]["tokens"]
    diff = first_difference(tokens, expected)
    return dict(kind="tp_decode", tp=tp, prompt=prompt, new_tokens=new_tokens,
                tokens_equal="yes" if diff is None else "no", first_difference="" if diff is None else diff,
                ranks_agree="yes" if all(r["tokens"] == tokens for r in results) else "no",
                kv_heads_per_rank=" ".join("/".join(map(str, r["kv_heads"])) for r in results),
                cache_bytes_per_rank=results[0]["cache_bytes"], ms_per_token=results[0]["ms_per_token"],
                device=results[0]["device"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the CSV (created)")
    parser.add_argument("--tp", type=int, nargs="+", default=None,
                        help="tensor-parallel sizes (default: 2 and every power of 2 up to this host's GPUs)")
    parser.add_argument("--cpu", action="store_true", help="gloo processes on the CPU")
    parser.add_argument("--new-tokens", type=int, default=96,
                        help="tokens to decode after the prompt (the model was trained on 128 positions)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="DIR",
                        help="write OUT/bench_tensor_parallel_decode.csv from these runs' CSVs instead")
    args = parser.parse_args(argv)
    if args.merge:
        print("wrote", merge_csvs(args.out, args.merge, (NAME,)))
        return 0

    cfg = load_model().cfg
    if args.new_tokens < 2 or len(PROMPT) + args.new_tokens > cfg.max_seq_len:
        parser.error(f"--new-tokens: between 2 and {cfg.max_seq_len - len(PROMPT)} (the model's "
                     f"{cfg.max_seq_len} positions less the prompt's {len(PROMPT)})")
    if args.cpu:
        backend, device, available = "gloo", torch.device("cpu"), 4
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device: run with --cpu to try the logic on gloo processes")
        backend, device, available = "nccl", torch.device("cuda", 0), torch.cuda.device_count()
    sizes = args.tp or [t for t in (2, 4, 8) if t <= available]
    for tp in sizes:
        if tp > available:
            parser.error(f"--tp {tp}: this host has {available} GPUs")
        try:
            tensor_parallel.heads_of_rank(0, tp, cfg.n_heads, cfg.n_kv_heads)
        except ValueError as exc:
            parser.error(f"--tp {tp}: {exc}")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = link_and_nccl(args.cpu)

    expected = reference_tokens(PROMPT, args.new_tokens, device)
    print(f"one device, plain model: {PROMPT!r} -> {load_model().decode(expected)!r}")
    decode = functools.partial(tensor_parallel.decode_rank, prompt=PROMPT, max_new_tokens=args.new_tokens,
                               repeats=args.repeats)
    rows = []
    for tp in [1, *sizes]:
        results = run_group(decode, tp, backend=backend, timeout_s=600)
        row = row_for(tp, results, expected, PROMPT, args.new_tokens)
        rows.append(row)
        print(f"tp = {tp}: tokens equal to one device: {row['tokens_equal']} (first difference: "
              f"{row['first_difference'] if row['first_difference'] != '' else 'none'}), ranks agree: "
              f"{row['ranks_agree']}, KV heads per rank {row['kv_heads_per_rank']}, "
              f"{row['ms_per_token']:.3f} ms per token")
    for row in rows:                                  # the split code on one device is the baseline
        row["one_device_ms_per_token"] = rows[0]["ms_per_token"]
    print("wrote", write_results(NAME, [{**r, **meta} for r in rows], directory=args.out))
    return 0 if all(r["tokens_equal"] == "yes" and r["ranks_agree"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    # `timeout` sends SIGTERM: leave through run_group's clean-up, which ends the ranks (they hold the GPUs)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main())
