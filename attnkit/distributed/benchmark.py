"""Context parallelism measured on a group of processes: correctness against one device, timings, and a
ping-pong fit of the link's α and β. ``scripts/gpu_context_parallel.py`` runs it on N GPUs (NCCL) or, with
``--cpu``, on gloo processes with tiny sizes (the logic, not a measurement).

Each function runs in every rank (``launch.run_group``) and returns plain rows (dicts); rank 0's rows
are the result.

- ``check_rank``: for each scheme (ring, zig-zag ring, all-gather, Ulysses), causal and not, GQA: the
  output and dQ, dK, dV against one device's ``flash_attention`` on the whole sequence (each rank
  computes that reference itself), as relative errors with the dtype's bound (two computations each
  within the bound of the exact result: twice the bound).
- ``time_rank``: forward, and forward + backward, per scheme and sequence length: the median over
  repeats of the slowest rank's time; beside it one device's ``flash_attention`` on the whole sequence,
  the bytes each rank receives (``comm_bytes``), and the same scheme's compute alone (``compute_ms``:
  the same block calls, merges and copies inside ``context_parallel.no_communication()``, timed the
  same way) with the overlap fraction ``ms / compute_ms`` (1: every transfer hidden behind compute;
  ``ms / compute_ms - 1``: the time communication added, as a share of the compute alone).
- ``uneven_rank``: rank 0's shard two tokens longer than the others'; each scheme's ValueError message.
- ``pingpong_rank``: ranks 0 and 1 bounce messages of 4 KiB … 1 GiB; the one-way time is half the
  round trip; α and β are fitted over all sizes.
"""
from __future__ import annotations

import csv
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..results import write_results
from ..tolerances import rel_error, tolerance
from . import context_parallel as cp

SCHEMES = (("ring", "contiguous"), ("ring", "zigzag"), ("all_gather_kv", "zigzag"), ("ulysses", "zigzag"))
PINGPONG_SIZES = tuple(4096 * 4**i for i in range(10))          # 4 KiB, 16 KiB, … 1 GiB


def _device(rank):
    return torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(n_total, batch, hq, hkv, d, dtype, device, seed):
    """q, k, v, dO of the whole sequence, the same on every rank: drawn by a generator on the device
    itself (every rank's GPU is the same model, so the same seed gives the same numbers), which keeps
    a 256k-token sequence from costing seconds of CPU time per rank."""
    gen = torch.Generator(device=device).manual_seed(seed)
    make = lambda h: torch.randn(batch, h, n_total, d, generator=gen, device=device, dtype=torch.float32  # noqa: E731
                                 ).to(dtype)
    return make(hq), make(hkv), make(hkv), make(hq)


def _one_device(q, k, v, do, causal, block):
    """o, dq, dk, dv of the whole sequence on this device: flash_attention (kernel) or PyTorch (torch)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if block == "kernel":
        from ..kernels.flash import flash_attention
        o = flash_attention(q, k, v, causal=causal)
    else:
        g = q.shape[1] // k.shape[1]
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=causal)
    o.backward(do)
    return [t.detach() for t in (o, q.grad, k.grad, v.grad)]


def _distributed(variant, layout, q, k, v, do, causal, block, rank, world, check_lengths=True):
    """This rank's o, dq, dk, dv (its shard) from the scheme."""
    q, k, v, do = (cp.shard(t, rank, world, layout) for t in (q, k, v, do))
    q, k, v = (t.contiguous().requires_grad_() for t in (q, k, v))
    o = cp.ATTEND[variant](q, k, v, causal=causal, layout=layout, block=block, check_lengths=check_lengths)
    o.backward(do.contiguous())
    return [t.detach() for t in (o, q.grad, k.grad, v.grad)]


def check_rank(rank, world, *, n_total, batch, hq, hkv, d, dtype, block, seed=0):
    device = _device(rank)
    q, k, v, do = _inputs(n_total, batch, hq, hkv, d, dtype, device, seed)
    for t in (q, k, v, do):              # rank 0's numbers on every rank, whatever each GPU's generator drew
        dist.broadcast(t, 0)
    expected = _one_device(q, k, v, do, False, block), _one_device(q, k, v, do, True, block)
    bound = 2 * tolerance(dtype, device.type)
    rows = []
    for variant, layout in SCHEMES:
        if variant == "ulysses" and (hq % world or hkv % world):
            continue
        for causal in (False, True):
            got = _distributed(variant, layout, q, k, v, do, causal, block, rank, world)
            gathered = []
            for t in got:                                    # every rank's shard, then the whole sequence
                parts = [torch.empty_like(t) for _ in range(world)]
                dist.all_gather(parts, t.contiguous())
                gathered.append(cp.unshard(parts, layout))
            errs = [rel_error(g, e) for g, e in zip(gathered, expected[causal])]
            rows.append(dict(kind="check", variant=variant, layout=layout, causal=causal, N=n_total, B=batch,
                             Hq=hq, Hkv=hkv, D=d, dtype=str(dtype).replace("torch.", ""), world=world,
                             err_o=errs[0], err_dq=errs[1], err_dk=errs[2], err_dv=errs[3], bound=bound,
                             ok=all(e <= bound for e in errs)))
    return rows


def _timed(fn, device, repeats):
    """Median seconds of ``fn`` over ``repeats`` (after one warm-up), the slowest rank's each time."""
    fn()
    times = []
    for _ in range(repeats):
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(float(elapsed))
    return statistics.median(times)


def time_rank(rank, world, *, seq_lens, batch, hq, hkv, d, dtype, block, causal, repeats):
    device = _device(rank)
    rows = []
    for n_total in seq_lens:
        q, k, v, do = _inputs(n_total, batch, hq, hkv, d, dtype, device, seed=n_total)
        one = {}
        if rank == 0:                                        # one device, the whole sequence
            def fwd_one():
                with torch.no_grad():
                    _one_device_forward(q, k, v, causal, block)
            one["fwd"] = _timed_local(fwd_one, device, repeats)
            one["fwd+bwd"] = _timed_local(lambda: _one_device(q, k, v, do, causal, block), device, repeats)
        for variant, layout in SCHEMES:
            if variant == "ulysses" and (hq % world or hkv % world):
                continue
            shards = [cp.shard(t, rank, world, layout).contiguous() for t in (q, k, v, do)]
            attend = cp.ATTEND[variant]

            def fwd():
                with torch.no_grad():
                    attend(*shards[:3], causal=causal, layout=layout, block=block, check_lengths=False)

            def both():
                qs, ks, vs = (t.detach().requires_grad_() for t in shards[:3])
                attend(qs, ks, vs, causal=causal, layout=layout, block=block, check_lengths=False).backward(shards[3])

            for pass_, fn in (("fwd", fwd), ("fwd+bwd", both)):
                seconds = _timed(fn, device, repeats)
                with cp.no_communication():                  # the same blocks, no transfer
                    compute = _timed(fn, device, repeats)
                received = cp.comm_bytes(variant, batch=batch, q_heads=hq, kv_heads=hkv, seq_len=n_total,
                                         head_dim=d, world_size=world, itemsize=q.element_size(),
                                         backward=pass_ == "fwd+bwd",
                                         grad_itemsize=q.element_size() if variant == "ulysses" else 4)
                rows.append(dict(kind="time", variant=variant, layout=layout, causal=causal, pass_=pass_,
                                 N=n_total, n_per_rank=n_total // world, B=batch, Hq=hq, Hkv=hkv, D=d,
                                 dtype=str(dtype).replace("torch.", ""), world=world, ms=seconds * 1e3,
                                 one_device_ms=one.get(pass_, float("nan")) * 1e3, bytes_per_rank=received,
                                 gb_per_s=received / seconds / 1e9, compute_ms=compute * 1e3,
                                 overlap_fraction=seconds / compute))
    for row in rows:                                          # speed-up over one device: its time ÷ ours
        row["speedup"] = row["one_device_ms"] / row["ms"]
    return rows


def uneven_rank(rank, world, *, block, variants=cp.VARIANTS, dtype=torch.float32):
    """Every rank calls each of ``variants`` with rank 0's shard two tokens longer: {variant: the
    ValueError's message (the same on every rank), or "accepted"}."""
    device = _device(rank)
    n = 2 * (3 if rank == 0 else 2)
    q = torch.zeros(1, 2 * world, n, 16, device=device, dtype=dtype)
    messages = {}
    for variant in variants:
        try:
            cp.ATTEND[variant](q, q, q, layout="zigzag", block=block)
            messages[variant] = "accepted"
        except ValueError as exc:
            messages[variant] = str(exc)
    return messages


def _one_device_forward(q, k, v, causal, block):
    if block == "kernel":
        from ..kernels.flash import flash_attention_forward
        return flash_attention_forward(q, k, v, causal=causal)
    return cp.block_forward_torch(q, k, v, causal, q.shape[-1] ** -0.5)


def _timed_local(fn, device, repeats):
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pingpong_rank(rank, world, *, sizes=PINGPONG_SIZES, repeats=20):
    """One-way seconds per message size between ranks 0 and 1 (others wait), and the fitted α, β."""
    device = _device(rank)
    rows = []
    for size in sizes:
        buf = torch.zeros(size, dtype=torch.uint8, device=device)
        reps = max(3, repeats if size <= 2**24 else repeats // 4)
        dist.barrier()
        if rank < 2:
            peer = 1 - rank
            for i in range(reps + 2):                       # two warm-up round trips
                if i == 2:
                    _sync(device)
                    start = time.perf_counter()
                if rank == 0:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
            _sync(device)
            one_way = (time.perf_counter() - start) / reps / 2
            rows.append(dict(kind="pingpong", bytes=size, one_way_us=one_way * 1e6, gb_per_s=size / one_way / 1e9))
        dist.barrier()
    if rank == 0:
        from .alpha_beta import fit_alpha_beta
        try:
            alpha, beta = fit_alpha_beta([r["bytes"] for r in rows], [r["one_way_us"] * 1e-6 for r in rows])
            rows.append(dict(kind="fit", bytes="", one_way_us=alpha * 1e6, gb_per_s=beta / 1e9))
        except ValueError as exc:                       # noisy times (a shared CPU): no fit, say why
            rows.append(dict(kind="fit", bytes="", one_way_us=float("nan"), gb_per_s=float("nan"), reason=str(exc)))
    return rows


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


def merge_csvs(out: Path, directories, names) -> list[Path]:
    """For each name, ``out/bench_<name>.csv`` holding the rows of ``bench_<name>.csv`` of every directory
    in order (the columns: every column of any of them; a row lacking one leaves it empty). A name no
    directory holds is an error."""
    written = []
    for name in names:
        rows = []
        for directory in directories:
            path = Path(directory) / f"bench_{name}.csv"
            if path.exists():
                with path.open(newline="") as f:
                    rows += list(csv.DictReader(f))
        if not rows:
            raise ValueError(f"directories: none holds bench_{name}.csv")
        fields = list(dict.fromkeys(k for row in rows for k in row))
        Path(out).mkdir(parents=True, exist_ok=True)
        target = Path(out) / f"bench_{name}.csv"
        with target.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
        written.append(target)
    return written


__all__ = ["SCHEMES", "PINGPONG_SIZES", "check_rank", "time_rank", "pingpong_rank", "uneven_rank", "link_and_nccl",
           "write_csv", "merge_csvs"]
