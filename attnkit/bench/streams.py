"""Memory-bound kernels measured on a GPU: lesson 4's softmax and the bandwidth ceilings (GPU only).

    run_softmax()    lesson 4: the fused Triton softmax, torch.softmax, and the five-pass PyTorch version
                     on fp16 matrices; GB/s of the bytes each one moves and of the 2·M·N·2 useful bytes
    run_bandwidth()  the ceilings the course compares decode kernels with: a device-to-device copy
                     (bytes read + written) timed eagerly and from a CUDA graph, and two read-only
                     streams (``read_stream``, a Triton kernel that reads every byte once and writes one
                     float per program, and torch's float32 sum), each of 1 GiB, beside the datasheet figure

    python -m attnkit.bench.recorder softmax bandwidth
"""
from __future__ import annotations

from ..device import ensure_triton_backend

ensure_triton_backend()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from .iomodel import GPUS  # noqa: E402
from .recorder import time_ms  # noqa: E402

SOFTMAX_SHAPES = ((4096, 4096), (16384, 4096), (4096, 16384))
STREAM_BYTES = 1 << 30


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
                         "datasheet_gbps": GPUS["H100 SXM"].hbm_gbs})
    return rows


@triton.jit
def _read_sum_kernel(X, partial, n, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
    """Program p sums elements [p · BLOCKS · BLOCK, (p + 1) · BLOCKS · BLOCK) of X into partial[p]."""
    start = tl.program_id(0).to(tl.int64) * BLOCKS * BLOCK
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(BLOCKS):
        offsets = start + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(partial + tl.program_id(0), tl.sum(acc, axis=0))


def read_stream(x: torch.Tensor, partial: torch.Tensor | None = None, *, block: int = 4096,
                blocks_per_program: int = 8) -> torch.Tensor:
    """Read every element of the contiguous tensor ``x`` once: each program sums ``blocks_per_program``
    blocks of ``block`` elements in float32 and writes one float to ``partial`` (returned). The bytes
    written are ``4 / (2 · block · blocks_per_program)`` of those read for fp16: a read-only stream."""
    if not x.is_contiguous():
        raise ValueError("x: read_stream reads a contiguous tensor")
    per_program = block * blocks_per_program
    programs = triton.cdiv(x.numel(), per_program)
    if partial is None:
        partial = torch.empty(programs, device=x.device, dtype=torch.float32)
    _read_sum_kernel[(programs,)](x, partial, x.numel(), BLOCK=block, BLOCKS=blocks_per_program)
    return partial


def run_bandwidth(nbytes: int = STREAM_BYTES) -> list[dict]:
    from triton.testing import do_bench_cudagraph

    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    out = torch.empty((), device="cuda", dtype=torch.float32)
    partial = read_stream(src)
    copy = lambda: dst.copy_(src)                                           # noqa: E731
    read = lambda: read_stream(src, partial)                                # noqa: E731
    torch_sum = lambda: torch.sum(src, dim=0, dtype=torch.float32, out=out)  # noqa: E731
    rows = []
    for what, fn, moved in (("copy, read + write", copy, 2 * nbytes), ("read only (Triton read_stream)", read, nbytes),
                            ("read only (torch.sum)", torch_sum, nbytes)):
        graph_ms = float(do_bench_cudagraph(fn, rep=100, return_mode="median"))
        for harness, ms in (("eager, do_bench", time_ms(fn)), ("CUDA graph, do_bench_cudagraph", graph_ms)):
            rows.append({"what": what, "harness": harness, "bytes": moved, "ms": ms, "gbps": moved / ms / 1e6,
                         "datasheet_gbps": GPUS["H100 SXM"].hbm_gbs})
    return rows
