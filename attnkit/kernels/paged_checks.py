"""The input checks of ``paged_decode`` (``attnkit.kernels.paged``): each a ValueError naming the argument
and the rule, before any kernel runs.

- ``check_paged_inputs(...)``: the public check (shapes, dtypes, devices; the values by ``check_values``).
- What a call's first check of its kind runs (``paged``'s plan): ``check_values_option``, ``check_shapes``,
  ``check_splits``, ``check_variant``; what every call with check_values="strict" runs: ``check_values_on_host``.
- The supported inputs: ``MIN_HEAD_DIM`` .. ``MAX_HEAD_DIM``, ``SUPPORTED_DTYPES`` (q), ``CACHE_DTYPES`` (the
  pages; an FP8 cache takes k_scale and v_scale), ``VARIANTS``, ``MAX_SPLITS``.
"""
from __future__ import annotations

import numbers

import torch

from .. import validation
from . import value_checks
from .fp8_cache import FP8

MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256                              # D and Dv: the dense kernel's range
SUPPORTED_HEAD_DIMS = range(MIN_HEAD_DIM, MAX_HEAD_DIM + 1)
SUPPORTED_DTYPES = validation.FLOAT_DTYPES
CACHE_DTYPES = SUPPORTED_DTYPES + (torch.float8_e4m3fn,)        # an FP8 cache takes k_scale, v_scale
VARIANTS = {
    "grouped": "the query heads that share a KV head in one tile; scores by tl.dot (tensor cores)",
    "per_head": "one query head per program; scores by multiply-and-sum (no tensor cores)",
}
MAX_SPLITS = 256


def check_paged_inputs(q, k_pages, v_pages, block_table, seq_lens, *, check_values="strict", k_scale=None,
                       v_scale=None) -> None:
    """Raise ValueError, naming the argument and the rule, unless the inputs are a valid decode step.

    Shapes, dtypes and devices are always checked (on the host, no synchronisation). The contents of
    seq_lens, block_table and the scales, by ``check_values``:
    - "strict" (True): copied to the host and checked now (a synchronisation on a GPU);
    - "device": checked on the device, without synchronising, under the contract of
      ``attnkit.kernels.value_checks``: ``raise_pending_errors()`` reports the first bad call by its
      index, and nothing else does. The kernel clamps lengths and page ids, so a bad table gives a
      wrong answer that is reported, never a device fault. Skipped while a CUDA graph is being captured.
      (Here a few PyTorch operations evaluate the rules; ``paged_decode`` evaluates them in its kernel.)
    - False: not checked.
    """
    check_values = check_values_option(check_values)
    check_shapes(q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale)
    num_pages, page_size = k_pages.shape[:2]
    if check_values == "device":
        _flag_bad_values(block_table, seq_lens, num_pages, page_size, k_scale, v_scale)
    elif check_values:
        check_values_on_host(block_table, seq_lens, num_pages, page_size, k_scale, v_scale)


def check_values_option(check_values):
    """"strict" (also for True), "device" or False; anything else is refused."""
    if check_values is True or (isinstance(check_values, str) and check_values == "strict"):
        return "strict"
    if isinstance(check_values, str) and check_values == "device":
        return "device"
    if check_values is False:
        return False
    raise ValueError(f"check_values: expected 'strict', 'device', True or False, got {check_values!r}")


def _check_head_dim(name: str, letter: str, head_dim: int) -> None:
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"{name}: head dim {letter}={head_dim} is not supported; {letter} must be between "
                         f"{MIN_HEAD_DIM} and {MAX_HEAD_DIM}")


def check_shapes(q, k_pages, v_pages, block_table, seq_lens, k_scale, v_scale) -> None:
    """The ValueErrors that shapes, dtypes and devices decide (no tensor's contents are read)."""
    validation.tensor("q", q, 3, "[B, Hq, D]", SUPPORTED_DTYPES)
    validation.tensor("k_pages", k_pages, 4, "[num_pages, page_size, Hkv, D]", CACHE_DTYPES)
    validation.tensor("v_pages", v_pages, 4, "[num_pages, page_size, Hkv, Dv]", CACHE_DTYPES)
    validation.tensor("block_table", block_table, 2, "[B, max_pages]")
    validation.tensor("seq_lens", seq_lens, 1, "[B]")
    validation.same("dtype", k_pages=k_pages, v_pages=v_pages)
    if k_pages.dtype != FP8:
        validation.same("dtype", q=q, k_pages=k_pages)
    _check_scales(k_pages, k_scale, v_scale)
    for name, t in (("block_table", block_table), ("seq_lens", seq_lens)):
        if t.dtype != torch.int32:
            raise ValueError(f"{name}: dtype must be torch.int32, got {t.dtype}")
    validation.same("device", q=q, k_pages=k_pages, v_pages=v_pages, block_table=block_table, seq_lens=seq_lens,
                    **({"k_scale": k_scale, "v_scale": v_scale} if k_scale is not None else {}))
    validation.kernel_device("q", q)
    if k_pages.shape[:3] != v_pages.shape[:3]:
        raise ValueError(f"k_pages, v_pages: must have the same shape but for the head dim (Dv may differ from "
                         f"D), got {tuple(k_pages.shape)} and {tuple(v_pages.shape)}")
    batch, n_heads, head_dim = q.shape
    n_kv, kv_dim = k_pages.shape[2:]
    if kv_dim != head_dim:
        raise ValueError(f"q, k_pages: head dims differ (q has D={head_dim}, k_pages has D={kv_dim})")
    _check_head_dim("q", "D", head_dim)
    _check_head_dim("v_pages", "Dv", v_pages.shape[3])
    validation.head_groups("q, k_pages", n_heads, n_kv)
    validation.grid_axis("q", "sequences B", batch)
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table: needs one row per sequence of q (B={batch}), got "
                         f"{block_table.shape[0]} rows")
    if seq_lens.shape[0] != batch:
        raise ValueError(f"seq_lens: needs one length per sequence of q (B={batch}), got {seq_lens.shape[0]}")


def check_values_on_host(block_table, seq_lens, num_pages: int, page_size: int, k_scale, v_scale) -> None:
    """check_values="strict": the contents copied to the host; the first bad entry is named."""
    max_pages = block_table.shape[1]
    lens = seq_lens.detach().to("cpu", torch.int64)
    table = block_table.detach().to("cpu", torch.int64)
    capacity = max_pages * page_size
    bad = torch.nonzero((lens < 1) | (lens > capacity)).flatten()
    if bad.numel():
        b = int(bad[0])
        raise ValueError(f"seq_lens: seq_lens[{b}] = {int(lens[b])} is out of range; each sequence needs "
                         f"1 <= seq_len <= max_pages * page_size = {max_pages} * {page_size} = {capacity}")
    pages_used = (lens + page_size - 1) // page_size                                  # [B]
    used = torch.arange(max_pages)[None, :] < pages_used[:, None]                     # [B, max_pages]
    out_of_range = used & ((table < 0) | (table >= num_pages))
    if out_of_range.any():
        b, p = (int(i) for i in torch.nonzero(out_of_range)[0])
        raise ValueError(f"block_table: block_table[{b}, {p}] = {int(table[b, p])} is not a page; "
                         f"the pages a sequence uses must lie in [0, num_pages) = [0, {num_pages})")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None and not bool(torch.all(torch.isfinite(scale) & (scale > 0))):
            raise ValueError(f"{name}: every scale must be finite and > 0")


def _check_scales(k_pages, k_scale, v_scale) -> None:
    """k_scale, v_scale: fp32 [Hkv], given exactly when the cache is float8_e4m3fn."""
    if (k_pages.dtype == FP8) != (k_scale is not None) or (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale, v_scale: required (fp32 [Hkv], one per KV head) exactly when k_pages and "
                         f"v_pages are float8_e4m3fn; the cache is {k_pages.dtype}")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is not None:
            validation.tensor(name, scale, 1, "[Hkv]", (torch.float32,))
            if scale.shape[0] != k_pages.shape[2]:
                raise ValueError(f"{name}: expected {k_pages.shape[2]} scales (one per KV head), got {scale.shape[0]}")


def _bad_values(block_table, seq_lens, num_pages: int, page_size: int, k_scale=None, v_scale=None):
    """A 0-d int64 tensor on the tables' device: the ``value_checks.RULES`` bits the values break (0: none)."""
    capacity = block_table.shape[1] * page_size
    lens = seq_lens.to(torch.int64)
    used = torch.arange(block_table.shape[1], device=lens.device)[None, :] * page_size < lens[:, None]
    table = block_table.to(torch.int64)
    rules = ((lens < 1) | (lens > capacity)).any().to(torch.int64)
    rules = rules + 2 * (used & ((table < 0) | (table >= num_pages))).any().to(torch.int64)
    for scale in (k_scale, v_scale):
        if scale is not None:
            rules = rules | 4 * (~(torch.isfinite(scale) & (scale > 0)).all()).to(torch.int64)
    return rules


def _flag_bad_values(block_table, seq_lens, num_pages: int, page_size: int, k_scale=None, v_scale=None) -> None:
    if value_checks.capturing(block_table):
        return
    value_checks.flag("paged_decode", _bad_values(block_table, seq_lens, num_pages, page_size, k_scale, v_scale))


def check_splits(num_splits) -> int | None:
    """``num_splits`` as a Python int (NumPy's integers accepted) in [1, MAX_SPLITS], or None."""
    if num_splits is None:
        return None
    if (isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral)
            or not 1 <= num_splits <= MAX_SPLITS):
        raise ValueError(f"num_splits: expected None or an integer in [1, {MAX_SPLITS}], got {num_splits!r}")
    return int(num_splits)


def check_variant(variant) -> str:
    """``variant``: one of ``VARIANTS``."""
    if not isinstance(variant, str) or variant not in VARIANTS:
        raise ValueError(f"variant: expected one of {list(VARIANTS)}, got {variant!r}")
    return variant
