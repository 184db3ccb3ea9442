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
   repeats.

A worker started without a notebook times only the course's kernels and the library's: the grader's
clean baselines, against which it checks that a notebook's process did not slow them down.

The clock is named in the spec (``CLOCKS``): ``cuda`` times with CUDA events through
``triton.testing.do_bench`` (median); ``ops`` is for tests on a CPU: it counts the loads, stores and
``tl.dot`` calls that Triton's interpreter executes (each a millionth of a "second": not a time).

Everything it reports is plain data; the grader trusts none of it beyond what it checks: this process
runs the student's code, which can change anything in it, so a timing is never part of a grade.
Internal API, for ``tests/classroom/test_leaderboard.py`` only: ``_prepare`` (step 2 for one kernel, in this process).
"""
from __future__ import annotations

import json
import math
import os
import select
import statistics
import sys
from dataclasses import dataclass
from typing import Any, Callable

from . import channel, sandbox

SEED = 36_006                  # the inputs of every timed kernel
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


def measure(calls: dict[str, Callable[[], Any]], clock: Callable, repeats: int, say=lambda text: None):
    """Time each of ``calls`` ``repeats`` times in turns, the order rotated each repeat (so that no call
    always follows the same one); returns (median ms of each, every sample of each)."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats: must be a positive integer, got {repeats!r}")
    names = list(calls)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        shift = r % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            say(f"timing {name}, repeat {r + 1} of {repeats}")
            samples[name].append(float(clock(calls[name])))
    return {n: statistics.median(v) for n, v in samples.items()}, samples


# -------------------------------------------------------------------------------------- timed kernels
@dataclass(frozen=True)
class Timed:
    """One kernel of a lab timed on one fixed shape.

    ``functions``: the exercises' functions it uses; it is timed only when every exercise of each
    passed. ``shapes``: "gpu" (what the leaderboard times) and "tiny" (for the interpreter).
    ``inputs(shape, device)`` -> a dict of tensors; ``student(fns, x)``, ``course(x)`` and
    ``library(x, device)`` -> a call without arguments (``course`` None: the course has no kernel for
    it). ``reference``: which call's output the student's is compared with at the timed shape.
    """

    lab: int
    name: str
    functions: tuple[str, ...]
    shapes: dict
    inputs: Callable
    student: Callable
    course: Callable | None
    library: Callable
    library_gpu: str                 # the library's call on a GPU, named in the leaderboard
    reference: str = "course"
    library_cpu: str = ""            # its name on a CPU, where it differs ("cuDNN" is not there)

    def shape(self, size: str) -> dict:
        if size not in self.shapes:
            raise ValueError(f"size: expected one of {sorted(self.shapes)}, got {size!r}")
        return self.shapes[size]

    def label(self, size: str) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.shape(size).items())

    def library_name(self, device: str) -> str:
        return self.library_gpu if device == "cuda" else (self.library_cpu or f"{self.library_gpu} on the CPU")


def _gen(device):
    import torch

    return torch.Generator(device=device).manual_seed(SEED)


def _randn(gen, *shape, dtype=None, device="cpu", scale=1.0):
    import torch

    return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype or torch.float32)


# Lab 04: each puzzle's launch function fills ``out``; the library is PyTorch's own op (the course has
# no kernel for a puzzle).
def _puzzle(name, make, torch_op, library_gpu, gpu, tiny):
    def inputs(shape, device):
        return make(shape, device)

    def student(fns, x):
        return lambda: fns[name](*x["args"], x["out"])

    def library(x, device):
        return lambda: torch_op(*x["args"], **x.get("extra", {}))
    return Timed(4, name, (name,), {"gpu": gpu, "tiny": tiny}, inputs, student, None, library, library_gpu,
                 reference="library")


def _vec(shape, device):
    import torch

    gen = _gen(device)
    x, y = _randn(gen, shape["n"], device=device), _randn(gen, shape["n"], device=device)
    return {"args": (x, y, 0.5), "out": torch.empty_like(x)}


def _one(shape, device):
    import torch

    x = _randn(_gen(device), shape["n"], device=device)
    return {"args": (x,), "out": torch.empty(1, device=device)}


def _affine(shape, device):
    import torch

    gen = _gen(device)
    m, n = shape["M"], shape["N"]
    x, scale, bias = _randn(gen, m, n, device=device), _randn(gen, n, device=device), _randn(gen, n, device=device)
    return {"args": (x, scale, bias), "out": torch.empty(m, n, device=device)}


def _rows(shape, device, spread=1.0):
    import torch

    x = _randn(_gen(device), shape["M"], shape["N"], device=device, scale=spread)
    return {"args": (x,), "out": torch.empty(shape["M"], device=device)}


def _mat(shape, device):
    import torch

    gen = _gen(device)
    a = _randn(gen, shape["M"], shape["K"], dtype=torch.float16, device=device)
    b = _randn(gen, shape["K"], shape["N"], dtype=torch.float16, device=device)
    return {"args": (a, b), "out": torch.empty(shape["M"], shape["N"], device=device)}


def _causal(shape, device):
    import torch

    s = _randn(_gen(device), shape["Nq"], shape["Nk"], device=device, scale=3.0)
    n_q, n_k = s.shape
    hidden = torch.arange(n_k, device=device)[None, :] > torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
    return {"args": (s, 0.125), "out": torch.empty_like(s), "extra": {"hidden": hidden}}


def _masked_softmax(s, scale, hidden):
    """PyTorch's causal softmax, its mask made beforehand (not timed)."""
    import torch

    return torch.softmax((s * scale).masked_fill(hidden, float("-inf")), dim=-1)


def _weighted(shape, device):
    import torch

    gen = _gen(device)
    s = _randn(gen, shape["M"], shape["N"], device=device, scale=3.0)
    v = _randn(gen, shape["N"], shape["D"], device=device)
    return {"args": (s, v), "out": torch.empty(shape["M"], shape["D"], device=device)}


def _lab04() -> list[Timed]:
    import torch

    return [
        _puzzle("scaled_add", _vec, lambda x, y, a: torch.add(y, x, alpha=a), "torch.add",
                {"n": 2**26}, {"n": 100}),
        _puzzle("block_max", _one, lambda x: x.max().reshape(1), "torch.max", {"n": 2**18}, {"n": 100}),
        _puzzle("affine_columns", _affine, lambda x, s, b: x * s + b, "x * scale + bias",
                {"M": 8192, "N": 8192}, {"M": 9, "N": 20}),
        _puzzle("row_sums", _rows, lambda x: x.sum(1), "torch.sum", {"M": 8192, "N": 8192}, {"M": 5, "N": 40}),
        _puzzle("matmul", _mat, lambda a, b: a @ b, "torch.matmul (fp16)",
                {"M": 2048, "N": 2048, "K": 2048}, {"M": 20, "N": 20, "K": 20}),
        _puzzle("causal_softmax", _causal, _masked_softmax, "torch.softmax (masked)",
                {"Nq": 4096, "Nk": 4096}, {"Nq": 6, "Nk": 20}),
        _puzzle("row_logsumexp", _rows, lambda x: torch.logsumexp(x, 1), "torch.logsumexp",
                {"M": 8192, "N": 8192}, {"M": 5, "N": 40}),
        _puzzle("softmax_weighted_sum", _weighted, lambda s, v: torch.softmax(s, -1) @ v,
                "torch.softmax, torch.matmul", {"M": 4096, "N": 4096, "D": 64}, {"M": 5, "N": 40, "D": 16}),
    ]


# Labs 05 and 06: fp16 q, k, v [B, H, N, D], one KV head per query head; the library is cuDNN's SDPA.
def _sdpa(q, k, v, causal, device):
    import torch.nn.functional as F

    if device != "cuda":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _qkv(shape, device):
    import torch

    gen = _gen(device)
    b, h, n, d = shape["B"], shape["H"], shape["N"], shape["D"]
    return {k: _randn(gen, b, h, n, d, dtype=torch.float16, device=device) for k in ("q", "k", "v", "do")}


def _forward(causal: bool) -> Timed:
    def inputs(shape, device):
        x = _qkv(shape, device)
        x.pop("do")
        return x

    def student(fns, x):
        return lambda: fns["flash_forward"](x["q"], x["k"], x["v"], causal=causal)

    def course(x):
        from ...kernels.flash import flash_attention_forward

        return lambda: flash_attention_forward(x["q"], x["k"], x["v"], causal=causal)

    def library(x, device):
        return lambda: _sdpa(x["q"], x["k"], x["v"], causal, device)

    return Timed(5, f"flash_forward{' causal' if causal else ''}", ("flash_forward",),
                 {"gpu": {"B": 4, "H": 16, "N": 2048, "D": 64}, "tiny": {"B": 1, "H": 1, "N": 20, "D": 16}},
                 inputs, student, course, library, "cuDNN SDPA", library_cpu="PyTorch SDPA on the CPU")


def _backward(causal: bool) -> Timed:
    def inputs(shape, device):
        from ...kernels.flash import flash_attention_forward

        x = _qkv(shape, device)
        x["o"], x["lse"] = flash_attention_forward(x["q"], x["k"], x["v"], causal=causal)
        return x

    def student(fns, x):
        args = (x["q"], x["k"], x["v"], x["o"], x["lse"], x["do"])

        def call():
            dq = fns["flash_dq"](*args, causal=causal)
            dk, dv = fns["flash_dkdv"](*args, causal=causal)
            return dq, dk, dv
        return call

    def course(x):
        from ...kernels.flash import flash_attention_backward

        return lambda: flash_attention_backward(x["do"], x["q"], x["k"], x["v"], x["o"], x["lse"], causal=causal)

    def library(x, device):
        import torch

        q, k, v = (x[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
        o = _sdpa(q, k, v, causal, device)
        return lambda: torch.autograd.grad(o, (q, k, v), x["do"], retain_graph=True)

    return Timed(6, f"backward{' causal' if causal else ''}", ("row_term", "flash_dkdv", "flash_dq"),
                 {"gpu": {"B": 4, "H": 16, "N": 1024, "D": 64}, "tiny": {"B": 1, "H": 1, "N": 20, "D": 16}},
                 inputs, student, course, library, "cuDNN SDPA backward",
                 library_cpu="PyTorch SDPA backward on the CPU")


# Lab 08: one decode step over a paged cache (pages in a random order); the library is cuDNN's SDPA on
# the same cache gathered into a contiguous [B, Hkv, N, D] copy beforehand (the gather is not timed), the
# query heads of a KV head passed as its query rows.
def _paged_inputs(shape, device):
    import torch

    gen = _gen(device)
    b, hq, hkv, d, n, page = shape["B"], shape["Hq"], shape["Hkv"], shape["D"], shape["N"], shape["page"]
    per_seq = n // page
    k = _randn(gen, b, hkv, n, d, dtype=torch.float16, device=device)
    v = _randn(gen, b, hkv, n, d, dtype=torch.float16, device=device)
    q = _randn(gen, b, hq, d, dtype=torch.float16, device=device)
    table = torch.randperm(b * per_seq, generator=gen, device=device).reshape(b, per_seq).int()
    k_pages = torch.empty(b * per_seq, page, hkv, d, dtype=torch.float16, device=device)
    v_pages = torch.empty_like(k_pages)
    k_pages[table.long()] = k.transpose(1, 2).reshape(b, per_seq, page, hkv, d)
    v_pages[table.long()] = v.transpose(1, 2).reshape(b, per_seq, page, hkv, d)
    lens = torch.full((b,), n, dtype=torch.int32, device=device)
    return {"q": q, "k_pages": k_pages, "v_pages": v_pages, "table": table, "lens": lens, "k": k, "v": v}


def _paged() -> Timed:
    def student(fns, x):
        return lambda: fns["paged_decode"](x["q"], x["k_pages"], x["v_pages"], x["table"], x["lens"])

    def course(x):
        from ...kernels.paged import paged_decode

        return lambda: paged_decode(x["q"], x["k_pages"], x["v_pages"], x["table"], x["lens"])

    def library(x, device):
        b, hq, d = x["q"].shape
        hkv = x["k"].shape[1]
        rows = x["q"].view(b, hkv, hq // hkv, d)
        return lambda: _sdpa(rows, x["k"], x["v"], False, device).reshape(b, hq, d)

    return Timed(8, "paged_decode", ("paged_decode",),
                 {"gpu": {"B": 64, "Hq": 32, "Hkv": 8, "D": 128, "N": 4096, "page": 16},
                  "tiny": {"B": 2, "Hq": 4, "Hkv": 2, "D": 16, "N": 32, "page": 16}},
                 _paged_inputs, student, course, library, "cuDNN SDPA on the gathered contiguous cache",
                 library_cpu="PyTorch SDPA on the gathered contiguous cache, on the CPU")


def timed_kernels() -> dict[int, list[Timed]]:
    """Lab number -> its timed kernels, in the order the leaderboard lists them."""
    return {4: _lab04(), 5: [_forward(False), _forward(True)], 6: [_backward(False), _backward(True)],
            8: [_paged()]}


TIMED_LABS = (4, 5, 6, 8)


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
    from ..labchecks.lab05 import course_code_forbidden, torch_compute_forbidden

    with course_code_forbidden(), torch_compute_forbidden():
        return fn()


def _prepare(item: Timed, ns, size: str, device: str):
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
            prepared[name] = _prepare(kernels[name], ns, spec["size"], device)
        except Exception as exc:  # noqa: BLE001 - this kernel's inputs or baselines failed: said
            prepared[name] = (None, {"worker": f"{type(exc).__name__}: {str(exc)[:200]}"})
    if device == "cuda":
        torch.cuda.synchronize()
    say("ready")
    if not _wait_for_turn(turn_fd, say):
        send.send({"kind": "problem", "problem": "the grader gave no turn"})
        return
    for name, (calls, notes) in prepared.items():
        frame = {"kind": "timing", "item": name, "notes": notes, "ms": {}, "samples": {}}
        if calls:
            try:
                ms, samples = measure(calls, clock, int(spec["repeats"]), say)
                frame["ms"], frame["samples"] = ms, samples
            except Exception as exc:  # noqa: BLE001 - a call that fails while timed: said
                frame["notes"] = {**notes, "worker": f"timing failed: {type(exc).__name__}"}
        send.send(frame)
    send.send({"kind": "done"})
