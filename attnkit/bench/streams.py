"""Memory-bound kernels measured on a GPU: lesson 4's softmax and the bandwidth ceilings (GPU only).

    run_softmax()    lesson 4: the fused Triton softmax, torch.softmax, and the five-pass PyTorch version
                     on fp16 matrices; GB/s of the bytes each one moves and of the 2·M·N·2 useful bytes
    run_bandwidth()  the ceilings the course compares decode kernels with: a device-to-device copy
                     (bytes read + written) timed eagerly and from a CUDA graph, and two read-only
                     streams (``read_stream``, a Triton kernel that reads every byte once and writes one
                     float per program, and torch's float32 sum), each of 1 GiB, beside the datasheet figure

The one copy harness of the course (lessons 7 and 8 and their benchmarks use it):

    ceilings(nbytes, timing="eager" | "graph") -> {"copy_GBps", "read_GBps", "datasheet_GBps", ...}
        the copy (``dst.copy_(src)``, bytes read + written) and the read-only stream (``read_stream``,
        bytes read), timed by the same method as the benchmark that compares with them: "eager" is
        ``recorder.time_ms`` (triton.testing.do_bench, median of eager calls), "graph" is
        ``graph_ms`` (triton.testing.do_bench_cudagraph, median of CUDA-graph replays). On the H100
        the two methods give the copy 2998 and 2435 GB/s, so a fraction is only meaningful against a
        ceiling timed the same way.
    with_ceilings(row, gbps, ceilings) -> row with the three ceilings and
        ``fraction_of_copy``, ``fraction_of_read``, ``fraction_of_datasheet``

Which ceiling is the right one: a kernel that only reads (a decode step reads the K/V cache and
writes a few hundred bytes per sequence) is bounded by the read-only stream, so its
``fraction_of_read`` says how close it is to the best it can do; ``fraction_of_copy`` may then exceed
1, since a copy also writes. A kernel that reads and writes as much (appending to the cache) is
bounded by the copy. ``fraction_of_datasheet`` compares with the figure no kernel reaches.

    python -m attnkit.bench.suites softmax bandwidth
"""
from __future__ import annotations

from ..device import ensure_triton_backend

ensure_triton_backend()

import torch  # noqa: E402

try:
    import triton
    import triton.language as tl
except ImportError:  # the ceilings' arithmetic and the recorded ceilings still work
    triton = tl = None

from .iomodel import GPUS  # noqa: E402
from .recorder import RESULTS, read_results, time_ms  # noqa: E402

SOFTMAX_SHAPES = ((4096, 4096), (16384, 4096), (4096, 16384))
STREAM_BYTES = 1 << 30
# timing method -> the harness named in bench_bandwidth.csv
TIMINGS = {"eager": "eager, do_bench", "graph": "CUDA graph, do_bench_cudagraph"}
COPY = "copy, read + write"
READ = "read only (Triton read_stream)"
# the GPU a device name is matched to (first match wins) for its datasheet bandwidth
DATASHEET_NAMES = (("H100", "H100 SXM"), ("A100", "A100 SXM 80GB"), ("V100", "V100 SXM2"), ("T4", "T4"))


def five_passes(x):
    """Softmax as lesson 4 writes it step by step: five PyTorch kernels, 5 reads and 3 writes."""
    row_max = x.max(dim=1, keepdim=True).values
    z = x - row_max
    num = torch.exp(z)
    den = num.sum(dim=1, keepdim=True)
    return num / den


def run_softmax(shapes=SOFTMAX_SHAPES) -> list[dict]:
    from ..kernels.softmax import softmax

    rows = []
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=torch.float16)
        reference = torch.softmax(x.float(), dim=1)
        useful = 2 * m * n * x.element_size()                       # one read and one write of the matrix
        for impl, fn, passes in (("attnkit fused (Triton)", softmax, 2),
                                 ("torch.softmax", lambda t: torch.softmax(t, dim=1), 2),
                                 ("five passes (PyTorch)", five_passes, 8)):
            err = ((fn(x).float() - reference).norm() / reference.norm()).item()
            ms = time_ms(lambda fn=fn: fn(x))
            moved = passes * m * n * x.element_size()
            rows.append({"impl": impl, "M": m, "N": n, "dtype": "float16", "ms": ms, "rel_error": err,
                         "bytes_moved": moved, "gbps_moved": moved / ms / 1e6, "gbps_useful": useful / ms / 1e6,
                         "datasheet_gbps": datasheet_gbps()})
    return rows


def _read_sum_kernel(X, partial, n, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
    """Program p sums elements [p · BLOCKS · BLOCK, (p + 1) · BLOCKS · BLOCK) of X into partial[p]."""
    start = tl.program_id(0).to(tl.int64) * BLOCKS * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(BLOCKS):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(partial + tl.program_id(0), tl.sum(acc, axis=0))


if triton is not None:
    _read_sum_kernel = triton.jit(_read_sum_kernel)


def read_stream(x: torch.Tensor, partial: torch.Tensor | None = None, *, block: int = 4096,
                blocks_per_program: int = 8) -> torch.Tensor:
    """Read every element of the contiguous tensor ``x`` once: each program sums ``blocks_per_program``
    blocks of ``block`` elements in float32 and writes one float to ``partial`` (returned). The bytes
    written are ``4 / (2 · block · blocks_per_program)`` of those read for fp16: a read-only stream."""
    if triton is None:
        raise RuntimeError("read_stream is a Triton kernel: install triton")
    if not x.is_contiguous():
        raise ValueError("x: read_stream reads a contiguous tensor")
    per_program = block * blocks_per_program
    programs = triton.cdiv(x.numel(), per_program)
    if partial is None:
        partial = torch.empty(programs, device=x.device, dtype=torch.float32)
    _read_sum_kernel[(programs,)](x, partial, x.numel(), BLOCK=block, BLOCKS=blocks_per_program)
    return partial


def graph_ms(fn) -> float:
    """Median time of fn() in ms, replayed from a CUDA graph (no host launch overhead)."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))


def timed_ms(fn, timing: str) -> float:
    """fn()'s median time in ms by the method ``timing``: "eager" (do_bench) or "graph" (do_bench_cudagraph)."""
    check_timing(timing)
    return time_ms(fn) if timing == "eager" else graph_ms(fn)


def check_timing(timing) -> str:
    if timing not in TIMINGS:
        raise ValueError(f"timing: expected one of {list(TIMINGS)}, got {timing!r}")
    return timing


def datasheet_gbps(device_name: str | None = None) -> float:
    """The datasheet HBM bandwidth (GB/s) of the GPU named ``device_name`` (default: this one; the H100
    SXM when there is no GPU), NaN for a GPU not in ``iomodel.GPUS``."""
    if device_name is None:
        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "H100"
    for token, gpu in DATASHEET_NAMES:
        if token in device_name:
            return GPUS[gpu].hbm_gbs
    return float("nan")


def ceiling_fields(copy_gbps: float, read_gbps: float, datasheet: float, timing: str, nbytes: int) -> dict:
    """The ceilings as the columns every benchmark row carries."""
    return {"copy_GBps": float(copy_gbps), "read_GBps": float(read_gbps), "datasheet_GBps": float(datasheet),
            "ceiling_timing": TIMINGS[check_timing(timing)], "ceiling_bytes": int(nbytes)}


def ceilings(nbytes: int = STREAM_BYTES, *, timing: str = "eager") -> dict:
    """The bandwidth ceilings of this GPU, measured now on ``nbytes`` of fp16 (GPU only).

    copy_GBps: ``dst.copy_(src)``, (bytes read + bytes written) / time; read_GBps: ``read_stream``,
    bytes read / time; datasheet_GBps: ``datasheet_gbps()``. Both timed by ``timing`` ("eager":
    do_bench, as kvcache's benchmark times; "graph": do_bench_cudagraph, as paged's does), so that a
    benchmark divides by ceilings timed the way it times its kernels. A decode kernel only reads the
    cache: read_GBps is its ceiling.
    """
    check_timing(timing)
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1 << 20:
        raise ValueError(f"nbytes: expected an integer of at least 1 MiB, got {nbytes!r}")
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    partial = read_stream(src)
    copy_ms = timed_ms(lambda: dst.copy_(src), timing)
    read_ms = timed_ms(lambda: read_stream(src, partial), timing)
    moved = src.numel() * src.element_size()
    src = dst = partial = None  # free the memory before the benchmark's own tensors
    torch.cuda.empty_cache()
    return ceiling_fields(2 * moved / copy_ms / 1e6, moved / read_ms / 1e6, datasheet_gbps(), timing, moved)


def recorded_ceilings(timing: str = "eager", directory=RESULTS) -> dict:
    """The ceilings recorded in ``bench_bandwidth.csv`` (run_bandwidth's rows), for the timing method
    ``timing``: what a CPU-only notebook compares recorded rows with."""
    check_timing(timing)
    rows = read_results("bandwidth", directory)
    by_what = {r["what"]: r for r in rows if r["harness"] == TIMINGS[timing]}
    missing = [w for w in (COPY, READ) if w not in by_what]
    if missing:
        raise ValueError(f"timing: bench_bandwidth.csv has no {missing} rows timed {TIMINGS[timing]!r}")
    return ceiling_fields(by_what[COPY]["gbps"], by_what[READ]["gbps"], by_what[READ]["datasheet_gbps"], timing,
                          int(by_what[READ]["bytes"]))


def fractions(gbps: float, ceils: dict) -> dict:
    """gbps as fractions of the three ceilings of ``ceils`` (a ``ceilings()`` dict); NaN stays NaN."""
    return {f"fraction_of_{name}": gbps / ceils[f"{name}_GBps"] for name in ("copy", "read", "datasheet")}


def with_ceilings(row: dict, gbps: float, ceils: dict) -> dict:
    """``row`` with the ceilings' columns and gbps's three fractions added (a new dict)."""
    missing = [k for k in ("copy_GBps", "read_GBps", "datasheet_GBps") if k not in ceils]
    if missing:
        raise ValueError(f"ceils: missing {missing}; pass what ceilings() returns")
    return {**row, **ceils, **fractions(gbps, ceils)}


def run_bandwidth(nbytes: int = STREAM_BYTES) -> list[dict]:
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    out = torch.empty((), device="cuda", dtype=torch.float32)
    partial = read_stream(src)
    copy = lambda: dst.copy_(src)                                           # noqa: E731
    read = lambda: read_stream(src, partial)                                # noqa: E731
    torch_sum = lambda: torch.sum(src, dim=0, dtype=torch.float32, out=out)  # noqa: E731
    rows = []
    for what, fn, moved in ((COPY, copy, 2 * nbytes), (READ, read, nbytes),
                            ("read only (torch.sum)", torch_sum, nbytes)):
        for timing, harness in TIMINGS.items():
            ms = timed_ms(fn, timing)
            rows.append({"what": what, "harness": harness, "bytes": moved, "ms": ms, "gbps": moved / ms / 1e6,
                         "datasheet_gbps": datasheet_gbps()})
    return rows
