"""The leaderboard's timing workers, run from the grader's process: a batch of workers prepares at once
(load, compile, check), then each times alone when the grader tells it to go (``run_timing_jobs``); and
whether a process on the grading steps' caps reaches the GPU (``grading_reaches_gpu``, whose worker is
``probe``). The timing worker itself is ``timing.main``; the leaderboard (``leaderboard.run_leaderboard``)
builds the jobs and reads their frames.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import channel, sandbox
from .reports import one_line
from .sandbox import Budgets, run_budgeted

TIMING_ARGV = [sys.executable, "-I", "-c", "from attnkit.classroom.grading.timing import main; main()"]
PROBE_ARGV = [sys.executable, "-I", "-c", "from attnkit.classroom.grading.timing_runs import probe; probe()"]


@dataclass
class TimingJob:
    key: tuple                    # ("student", index) or ("baseline", lab)
    spec: dict
    frames: list = field(default_factory=list)
    problem: str | None = None


class _Turn:
    """The grader's end of a worker's turn connection: ready when the worker says so."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.ready = threading.Event()
        self.answered = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        from . import timing

        frame = channel.read_frame(self.sock.fileno(), timing.GO_LIMIT)
        if isinstance(frame, dict) and frame.get("kind") == "ready":
            self.ready.set()
        self.answered.set()

    def go(self) -> None:
        try:
            channel.Writer(self.sock.fileno()).send({"kind": "go"})
        except OSError:
            pass


def run_timing_jobs(jobs: list[TimingJob], budgets: Budgets, sandbox: bool, parallel: int, env: dict, say) -> None:
    """Run the timing workers ``parallel`` at a time: a batch prepares together, then each times alone."""
    for start in range(0, len(jobs), parallel):
        batch = jobs[start:start + parallel]
        with tempfile.TemporaryDirectory(prefix=f"attnkit-leaderboard-{os.getpid()}-") as tmp, \
                ThreadPoolExecutor(len(batch)) as pool:
            running = []
            for i, job in enumerate(batch):
                folder = Path(tmp) / str(i)
                folder.mkdir()
                grader_end, worker_end = socket.socketpair()
                future = pool.submit(run_budgeted, TIMING_ARGV, budgets, sandbox=sandbox, spec=job.spec,
                                     workdir=folder, calls_fd=os.dup(worker_end.fileno()), env=env)
                worker_end.close()
                running.append((job, grader_end, future, _Turn(grader_end)))
            for _, _, future, turn in running:          # every worker ready (or ended) before any times
                while not turn.answered.wait(0.2) and not future.done():
                    pass
            for job, grader_end, future, turn in running:
                if turn.ready.is_set() and not future.done():
                    say(f"timing {job.spec['label']}")
                    turn.go()
                run = future.result()
                grader_end.close()
                job.frames = run.frames
                problem = next((f.get("problem") for f in run.frames if f.get("kind") == "problem"), None)
                if isinstance(problem, str):
                    job.problem = one_line(problem)
                elif run.stopped:
                    job.problem = f"the timing process {run.stopped}"
                elif not any(f.get("kind") == "done" for f in run.frames):
                    tail = (run.stderr.strip().splitlines() or [f"exit status {run.returncode}"])[-1]
                    job.problem = f"the timing process ended without its results ({one_line(tail, 200)})"


def grading_reaches_gpu(budgets: Budgets, sandbox: bool) -> tuple[bool, str]:
    """Whether a process on the grading steps' caps reaches the GPU, and what it said."""
    with tempfile.TemporaryDirectory(prefix=f"attnkit-probe-{os.getpid()}-") as tmp:
        run = run_budgeted(PROBE_ARGV, budgets, sandbox=sandbox, spec={}, workdir=Path(tmp))
    frame = next((f for f in run.frames if f.get("kind") == "probe"), {})
    silent = not frame and (run.stderr.strip().splitlines()[-1:] or [f"exit status {run.returncode}"])[0]
    why = frame.get("problem") or run.stopped or (f"the probe sent no report ({silent})" if silent else "")
    return frame.get("cuda") is True, one_line(why, 200)


def probe() -> None:
    """Entry point of a probe started with the grading steps' own caps: whether a process of theirs
    reaches the GPU (CUDA cannot start under an address-space cap of a few GiB: a step that uses the GPU
    has none, see ``sandbox``) and whether its GPU memory cap can be set."""
    spec = json.loads(sys.stdin.buffer.readline())
    sandbox.apply_limits(spec)
    progress_fd, channel_fd, _ = channel.worker_fds()
    send = channel.Writer(channel_fd)
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
        frame = {"kind": "probe", "cuda": cuda}
        if not cuda:
            frame["problem"] = "torch.cuda.is_available() is False in a process on these caps"
        elif spec.get("gpu_memory_mib"):
            problem = sandbox.cap_gpu_memory(int(spec["gpu_memory_mib"]))
            if problem:
                frame.update(cuda=False, problem=f"the GPU memory cap could not be set: {problem}")
        send.send(frame)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        send.send({"kind": "probe", "cuda": False, "problem": f"{type(exc).__name__}: {str(exc)[:200]}"})
    os._exit(0)
