"""attnkit: the library of the course "Attention kernels, from a 4×4 example to paged decoding".

Importing ``attnkit`` is light: Triton is imported only when a kernel is first used, after
``attnkit.device`` has switched on Triton's interpreter on machines without a GPU.
"""
from __future__ import annotations

from .device import Runtime, runtime, setup, versions
from .tolerances import REL_TOL, assert_close, rel_error, tolerance

__version__ = "0.1.0"

# Public names that live in heavier modules (torch, Triton), imported on first use by ``_load``.
_LAZY = ("flash_attention", "flash_attention_varlen", "flash_attention_fp8", "quantize_for_attention",
         "paged_extend", "paged_decode", "kv_cache_bytes", "attention_ref")


def _load(name: str):
    """The public name ``name`` of ``_LAZY``, imported from the module that defines it."""
    if name in ("flash_attention", "flash_attention_varlen"):
        from .kernels import flash as module
    elif name in ("flash_attention_fp8", "quantize_for_attention"):
        from .kernels.flash import fp8 as module
    elif name == "paged_extend":
        from .kernels import paged_extend as module
    elif name == "paged_decode":
        from .kernels import paged as module
    elif name == "kv_cache_bytes":
        from .serving import kv_cache as module
    else:
        from .reference import attention as module
    return getattr(module, name)


def __getattr__(name: str):
    if name in _LAZY:
        return _load(name)
    raise AttributeError(f"module 'attnkit' has no attribute {name!r}")


__all__ = ["Runtime", "runtime", "setup", "versions", "REL_TOL", "assert_close", "rel_error",
           "tolerance", *_LAZY]
