"""A fused row softmax in Triton: the canonical version of lesson 4's kernel.

One program handles one row. It loads the whole row into a block of ``next_power_of_2(n_cols)``
lanes (the lanes past the row's end are masked off and read as -inf), subtracts the row maximum,
exponentiates, divides by the sum, and writes the row back: one read and one write of HBM per
element, instead of the five passes of an unfused softmax.

    from attnkit.kernels.softmax import softmax
    y = softmax(x)          # x: [..., n_cols] fp16 / bf16 / fp32, any strides; y: x's device and dtype

Where it runs: as every kernel of the course, by ``attnkit.device.kernel_device`` (the interpreter
for CPU tensors on a machine without a GPU; the GPU otherwise). The arithmetic runs in fp32 whatever
the storage dtype. Where Triton cannot take bf16 (its
interpreter on the CPU, whose bf16 arithmetic is not faithful, and GPUs below sm_80) bf16 inputs
are converted to fp32 before the kernel and back after it.
"""
from __future__ import annotations

from .. import validation
from ..device import bf16_computed_in_fp32, ensure_triton_backend, launch_options, on_device, to_kernel_device

ensure_triton_backend()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SUPPORTED_DTYPES = validation.FLOAT_DTYPES
# One row lives in one program's registers: beyond this the block spills and a row-splitting
# (online) softmax is the right tool, the subject of lesson 3.
MAX_COLS = 16384


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK: tl.constexpr):
    """Softmax of row ``program_id(0)``: ``BLOCK`` ≥ n_cols lanes, the extra ones masked off."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)                                   # [BLOCK] lane indices
    mask = cols < n_cols                                         # True on the row's real elements
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    x = x - tl.max(x, axis=0)                                    # safe softmax: largest becomes 0
    numerator = tl.exp(x)                                        # masked lanes: exp(-inf) = 0
    denominator = tl.sum(numerator, axis=0)
    y = numerator / denominator
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _validate(x) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1:
        raise ValueError("x: must have at least one dimension (the rows' length is the last one)")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"x: dtype must be float16, bfloat16 or float32, got {x.dtype}")
    n_cols = x.shape[-1]
    if n_cols == 0:
        raise ValueError("x: the last dimension (row length) must be at least 1")
    if n_cols > MAX_COLS:
        raise ValueError(f"x: rows of {n_cols} elements exceed the {MAX_COLS} that fit in one program's "
                         f"block; use an online (row-splitting) softmax")
    validation.kernel_device("x", x)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of ``x`` with one Triton program per row; same shape and dtype."""
    _validate(x)
    n_cols = x.shape[-1]
    (rows,) = to_kernel_device(x.reshape(-1, n_cols))            # [n_rows, n_cols]
    compute_in_fp32 = x.dtype == torch.bfloat16 and bf16_computed_in_fp32(rows.device)
    rows = (rows.float() if compute_in_fp32 else rows).contiguous()   # the kernel takes unit column stride
    out = torch.empty_like(rows)
    if rows.shape[0] > 0:
        block = triton.next_power_of_2(n_cols)
        warps = 4 if block <= 2048 else (8 if block <= 4096 else 16)  # more threads for longer rows
        with on_device(rows.device):
            softmax_kernel[(rows.shape[0],)](out, rows, rows.stride(0), out.stride(0), n_cols,
                                             BLOCK=block, **launch_options(num_warps=warps))
    return out.to(x.device, x.dtype).reshape(x.shape)
