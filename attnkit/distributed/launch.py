"""Start ``world_size`` processes in one torch.distributed group, run a function in each, collect results.

    results = run_group(fn, world_size=3, args=(x,))      # fn(rank, world_size, *args) in every process

gloo on the CPU (the course's tests) or NCCL when ``backend="nccl"``. Every process is ended when the
call returns, also on an error or a timeout: a rank that hangs (a peer that never sends) makes the call
raise ``TimeoutError`` naming the ranks that did not finish, instead of blocking forever.
"""
from __future__ import annotations

import datetime
import io
import os
import queue
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, backend, fn, args, results, timeout_s):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        if backend == "nccl":
            torch.cuda.set_device(rank)
        buffer = io.BytesIO()                          # bytes, not shared memory: this process may end first
        torch.save(fn(rank, world_size, *args), buffer)
        results.put((rank, "ok", buffer.getvalue()))
    except BaseException as exc:  # reported to the parent, which raises it
        hint = ""
        if "Autograd-and-Fork" in str(exc):
            hint = ("\nhint: the parent process ran a backward pass before forking (on a machine with a GPU that "
                    "starts autograd's device threads, which a forked process cannot use): run every backward "
                    "inside run_group, or the parent's after the last run_group call")
        results.put((rank, "error", f"{type(exc).__name__}: {exc}{hint}\n{traceback.format_exc()}"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _import_before_fork() -> None:
    """A forked process inherits its parent's imported modules. autograd's first backward imports
    torch.fx.experimental.symbolic_shapes (and with it sympy: seconds of CPU): imported once here, no
    rank pays for it again."""
    try:
        import torch.fx.experimental.symbolic_shapes  # noqa: F401
    except ImportError:
        pass


def run_group(fn, world_size: int, args: tuple = (), *, backend: str = "gloo", timeout_s: float = 120.0):
    """``[fn(0, W, *args), …, fn(W-1, W, *args)]``, each in its own process; see the module doc.

    gloo processes are forked (``fn`` may be any function, a notebook's too); NCCL ones are spawned
    (``fn`` must be importable). Results must be picklable (CPU tensors).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an integer >= 1, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: expected 'gloo' or 'nccl', got {backend!r}")
    if backend == "gloo":
        _import_before_fork()
    ctx = mp.get_context("fork" if backend == "gloo" else "spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, fn, args, results, timeout_s),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    got, errors = {}, []
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s + 10)
    try:
        while len(got) + len(errors) < world_size:
            left = (deadline - datetime.datetime.now()).total_seconds()
            try:
                rank, status, value = results.get(timeout=max(left, 0.1))
            except queue.Empty:
                missing = sorted(set(range(world_size)) - set(got) - {r for r, _ in errors})
                raise TimeoutError(f"run_group: ranks {missing} did not finish within {timeout_s + 10:.0f} s "
                                   f"(a peer that never sends or receives?)") from None
            if status == "ok":
                got[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                errors.append((rank, value))
                break                                   # the others may now wait forever: stop them
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        rank, message = errors[0]
        raise RuntimeError(f"rank {rank} failed: {message}")
    return [got[r] for r in range(world_size)]
