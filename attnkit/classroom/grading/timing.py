"""The leaderboard's timing worker: a student's kernels timed beside the course's kernel and PyTorch's
(cuDNN's attention where the operation has one), in one process, on fixed shapes.

It is started by the grader (``leaderboard``) like the grader's other workers (``sandbox.run_budgeted``:
in bubblewrap where it works, on the same budgets, talking only over the grader's pipes), and only for
the kernels whose every check passed when the notebook was graded. In it:

1. the notebook's code is loaded as the grader's student process loads it (``submission``), with the
   course's implementations guarded (``guard``);
2. for each timed kernel (``TIMED``): its inputs are built from a fixed seed; the student's launch
   function runs once at the timed shape under the lab checks' guards (no course code, no PyTorch
   attention, matrix product, softmax or exp while it runs) and its output is compared with the
   course's kernel (or PyTorch's op) within ``GATE_TOLERANCE`` of the output's largest magnitude: a
   kernel wrong at the timed shape is not timed; the course's kernel and the library's call run once too;
3. the worker tells the grader it is ready and waits for its turn (``go``), so that while it times, no
   other worker of the leaderboard uses the GPU;
4. the student's call, the course's and the library's are timed in turns (``measure``: the order rotates
   each repeat; each time is the median of a ``do_bench``), and each is reported as the median over the
   repeats. The course's kernel is timed with the guard lifted (``guard.lifted``): as a user calls it.

A worker started without a notebook times only the course's kernels and the library's: the grader's
clean baselines, against which it checks that a notebook's process did not slow them down.

The clock is named in the spec (``CLOCKS``): ``cuda`` times with CUDA events through
``triton.testing.do_bench`` (median); ``ops`` is for tests on a CPU: it counts the loads, stores and
``tl.dot`` calls that Triton's interpreter executes (each a millionth of a "second": not a time).

Everything it reports is plain data; the grader trusts none of it beyond what it checks: this process
runs the student's code, which can change anything in it, so a timing is never part of a grade.
Internal API, for ``tests/classroom/test_leaderboard.py`` only: ``prepare`` (step 2 for one kernel, in this process).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import select
import statistics
import sys
from typing import Any, Callable

from . import channel, sandbox
from .timed_kernels import SEED, TIMED_LABS, Timed, timed_kernels  # noqa: F401  (their names, used here and by the grader)

GATE_TOLERANCE = 1e-2          # largest |student - reference| / largest |reference| at the timed shape
GO_LIMIT = 2**16               # the largest frame the grader sends on the turn connection


# ---------------------------------------------------------------------------------------------- clocks
class CudaClock:
    """Milliseconds of ``fn()``: the median of ``triton.testing.do_bench`` (CUDA events; it clears the
    L2 cache before each call), with short warm-up and measuring windows."""

    name = "cuda"
    describe = "CUDA events (triton.testing.do_bench, median)"

    def __init__(self, warmup_ms: float = 5, rep_ms: float = 25):
        self.warmup_ms, self.rep_ms = warmup_ms, rep_ms

    def __call__(self, fn: Callable[[], Any]) -> float:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))


class OpCountClock:
    """Not a time: the loads, stores and ``tl.dot`` calls Triton's interpreter executes in one call of
    ``fn``, plus one, times 1e-3 "ms". Deterministic, for tests of the leaderboard on a CPU."""

    name = "ops"
    describe = "interpreter operation count (a test clock, not a time)"

    def __call__(self, fn: Callable[[], Any]) -> float:
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("clock: 'ops' counts the operations of Triton's interpreter; kernels are compiled here")
        from triton.runtime import interpreter

        builder = interpreter.InterpreterBuilder
        names = ("create_masked_load", "create_masked_store", "create_dot")
        saved = {n: getattr(builder, n) for n in names}
        count = [0]

        def counting(original):
            def call(*args, **kwargs):
                count[0] += 1
                return original(*args, **kwargs)
            return call

        try:
            for n in names:
                setattr(builder, n, counting(saved[n]))
            fn()
        finally:
            for n in names:
                setattr(builder, n, saved[n])
        return 1e-3 * (count[0] + 1)


CLOCKS = {"cuda": CudaClock, "ops": OpCountClock}


def make_clock(name: str):
    if name not in CLOCKS:
        raise ValueError(f"clock: expected one of {sorted(CLOCKS)}, got {name!r}")
    return CLOCKS[name]()


def measure(calls: dict[str, Callable[[], Any]], clock: Callable, repeats: int, say=lambda text: None,
            around: dict | None = None):
    """Time each of ``calls`` ``repeats`` times in turns, the order rotated each repeat (so that no call
    always follows the same one); returns (median ms of each, every sample of each). ``around``: a call's
    name -> a context manager factory entered around each of its timings (``guard.lifted`` for the course's)."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats: must be a positive integer, got {repeats!r}")
    names = list(calls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        shift = r % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            say(f"timing {name}, repeat {r + 1} of {repeats}")
            with (around or {}).get(name, contextlib.nullcontext)():
                samples[name].append(float(clock(calls[name])))
    return {n: statistics.median(v) for n, v in samples.items()}, samples


# ------------------------------------------------------------------------------------- the comparison
def _tensors(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    raise ValueError(f"expected tensors, got {type(value).__name__}")


def gate_error(got, want) -> float:
    """The largest |got - want| over the largest |want|, over every tensor of ``want`` (``got``: the
    same number of tensors of the same shapes); inf when they differ in shape or ``got`` is not finite."""
    import torch

    got_t, want_t = _tensors(got), _tensors(want)
    if len(got_t) != len(want_t):
        return math.inf
    worst = 0.0
    for g, w in zip(got_t, want_t):
        if tuple(g.shape) != tuple(w.shape):
            return math.inf
        g, w = g.detach().float(), w.detach().float()
        if not bool(torch.isfinite(g).all()):
            return math.inf
        size = float(w.abs().max()) if w.numel() else 0.0
        diff = float((g - w).abs().max()) if w.numel() else 0.0
        worst = max(worst, diff / max(size, 1e-30))
    return worst


# ------------------------------------------------------------------------------------------ the worker
def _start():
    spec = json.loads(sys.stdin.buffer.readline())
    if spec.get("clock") == "cuda" and not spec.get("gpu_memory_mib"):
        raise SystemExit("the cuda clock needs budgets that let the step use the GPU (Budgets.gpu_memory_mib)")
    sandbox.apply_limits(spec)          # no address-space cap where the step uses the GPU (sandbox's doc)
    if spec.get("gpu_memory_mib"):
        problem = sandbox.cap_gpu_memory(int(spec["gpu_memory_mib"]))
        if problem:
            raise SystemExit(f"the GPU memory cap of {spec['gpu_memory_mib']} MiB could not be set: {problem}")
    progress_fd, channel_fd, turn_fd = channel.worker_fds()
    for fd in (progress_fd, channel_fd, turn_fd):
        if fd is not None:
            os.set_inheritable(fd, False)
    return spec, channel.progress_writer(progress_fd), channel.Writer(channel_fd), turn_fd


def _load(spec, say):
    """The notebook's namespace, loaded as the grader's student process loads it."""
    import base64

    import nbformat

    from . import guard
    from .checker import lab_module
    from .submission import load_cells, submission_cells

    module = lab_module(spec["module"])
    guard.install(module, [tuple(t) for t in spec.get("tools") or []])
    if spec.get("notebook") is None:
        return None
    nb = nbformat.reads(base64.b64decode(spec["notebook"]).decode("utf-8"), as_version=4)
    cells = submission_cells(nb, spec["cell_timeout"])
    log = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)                      # the notebook's prints go to a file in the sandbox
    os.dup2(log, 2)
    ns, _ = load_cells(cells, spec["cell_timeout"], say)
    return ns


def _guarded(fn):
    """``fn()`` with the lab checks' guards on: no course code, no PyTorch attention, matrix product,
    softmax or exp while the student's call runs."""
    from ..labchecks.course_code import course_code_forbidden, torch_compute_forbidden

    with course_code_forbidden(), torch_compute_forbidden():
        return fn()


def prepare(item: Timed, ns, size: str, device: str):
    """(calls to time, notes) for ``item``: each call run once (compiling it); the student's checked
    against the reference at this shape."""
    from .submission import origin_problem

    x = item.inputs(item.shape(size), device)
    calls, outputs = {}, {}
    makers = {"course": item.course, "library": lambda x: item.library(x, device)}
    for role, make in makers.items():
        if make is None:
            continue
        try:
            calls[role] = make(x)
            outputs[role] = calls[role]()
        except Exception as exc:  # noqa: BLE001 - a baseline that cannot run this shape here: said
            calls.pop(role, None)
            outputs[role] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    if ns is None:
        return calls, {r: o for r, o in outputs.items() if isinstance(o, str)}
    fns = {}
    for name in item.functions:
        fn = ns.get(name)
        problem = "not defined" if fn is None else origin_problem(name, fn)
        if problem:
            return None, {"student": f"{name}: {problem}"}
        fns[name] = fn
    student = item.student(fns, x)
    want = outputs.get(item.reference)
    if want is None or isinstance(want, str):
        return None, {"student": f"no reference at the timed shape ({item.reference}: {want})"}
    try:
        got = _guarded(student)
        error = gate_error(got, want)
    except Exception as exc:  # noqa: BLE001 - the student's kernel fails at this shape: not timed
        return None, {"student": f"raised {type(exc).__name__} at the timed shape"}
    if not error <= GATE_TOLERANCE:
        return None, {"student": f"wrong at the timed shape (error {error:.2g} of the largest value, "
                                 f"more than {GATE_TOLERANCE:g})"}
    calls = {"student": student, **calls}
    return calls, {r: o for r, o in outputs.items() if isinstance(o, str)}


def _wait_for_turn(turn_fd: int, say) -> bool:
    """Tell the grader this worker is ready and wait for its turn on the GPU."""
    channel.Writer(turn_fd).send({"kind": "ready"})
    waited = 0
    while True:
        readable, _, _ = select.select([turn_fd], [], [], 5.0)
        if readable:
            frame = channel.read_frame(turn_fd, GO_LIMIT)
            return frame is not None and frame.get("kind") == "go"
        waited += 5
        say(f"waiting for its turn on the GPU ({waited} s)")


def main() -> None:
    """Entry point of the timing worker (``python -c "...timing import main; main()"``)."""
    spec, say, send, turn_fd = _start()
    try:
        _work(spec, say, send, turn_fd)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        send.send({"kind": "problem", "problem": f"{type(exc).__name__}: {str(exc)[:300]}"})
    sys.stdout.flush()
    os._exit(0)


def _work(spec, say, send, turn_fd) -> None:
    from ...device import ensure_triton_backend
    from . import guard

    ensure_triton_backend()
    import torch

    device = "cuda" if spec["clock"] == "cuda" else "cpu"      # the ops clock counts the interpreter's work
    if device == "cuda" and not torch.cuda.is_available():
        send.send({"kind": "problem", "problem": "the timing process sees no CUDA GPU"})
        return
    clock = make_clock(spec["clock"])
    kernels = {t.name: t for t in timed_kernels()[int(spec["lab"])]}
    say("loading the notebook's code" if spec.get("notebook") else "loading the course")
    ns = _load(spec, say)
    prepared = {}
    for name in spec["items"]:
        say(f"preparing {name}")
        try:
            prepared[name] = prepare(kernels[name], ns, spec["size"], device)
        except Exception as exc:  # noqa: BLE001 - this kernel's inputs or baselines failed: said
            prepared[name] = (None, {"worker": f"{type(exc).__name__}: {str(exc)[:200]}"})
    if device == "cuda":
        torch.cuda.synchronize()
    say("ready")
    if not _wait_for_turn(turn_fd, say):
        send.send({"kind": "problem", "problem": "the grader gave no turn"})
        return
    copy_ms_per_byte = copy_time_per_byte(clock) if ns is None and device == "cuda" else None
    for name, (calls, notes) in prepared.items():
        frame = {"kind": "timing", "item": name, "notes": notes, "ms": {}, "samples": {}}
        if calls:
            try:
                ms, samples = measure(calls, clock, int(spec["repeats"]), say, around={"course": guard.lifted})
                frame["ms"], frame["samples"] = ms, samples
            except Exception as exc:  # noqa: BLE001 - a call that fails while timed: said
                frame["notes"] = {**notes, "worker": f"timing failed: {type(exc).__name__}"}
        item = kernels[name]
        if copy_ms_per_byte and item.moved_bytes is not None:      # the clean worker: the kernel's floor
            frame["ms"]["floor"] = item.moved_bytes(item.inputs(item.shape(spec["size"]), device)) * copy_ms_per_byte
        send.send(frame)
    send.send({"kind": "done"})


COPY_BYTES = 2**30                       # the buffer copied to measure the GPU's copy bandwidth


def copy_time_per_byte(clock, device: str = "cuda", nbytes: int = COPY_BYTES) -> float:
    """ms per byte moved by a copy of ``nbytes`` on ``device`` (each byte read once and written once, so the
    copy moves twice its size), timed by ``clock`` (``do_bench`` flushes the L2 cache before each run): the
    rate below which no kernel that reads and writes that many bytes once can be believed."""
    import torch

    src = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return clock(lambda: dst.copy_(src)) / (2 * nbytes)
