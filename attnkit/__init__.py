"""attnkit: the library of the course "Attention kernels, from a 4×4 example to paged decoding".

Importing ``attnkit`` is light: Triton is imported only when a kernel is first used, after
``attnkit.device`` has switched on Triton's interpreter on machines without a GPU.
"""
from __future__ import annotations

import importlib

from .device import Runtime, runtime, setup, versions
from .tolerances import REL_TOL, assert_close, rel_error, tolerance

__version__ = "0.1.0"

# Public names that live in heavier modules, imported on first use.
_LAZY = {
    "flash_attention": "attnkit.kernels.flash",
    "flash_attention_varlen": "attnkit.kernels.flash",
    "flash_attention_fp8": "attnkit.kernels.flash_fp8",
    "quantize_for_attention": "attnkit.kernels.flash_fp8",
    "paged_extend": "attnkit.kernels.paged_extend",
    "paged_decode": "attnkit.kernels.paged",
    "kv_cache_bytes": "attnkit.serving.kv_cache",
    "attention_ref": "attnkit.reference.attention",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'attnkit' has no attribute {name!r}")


__all__ = ["Runtime", "runtime", "setup", "versions", "REL_TOL", "assert_close", "rel_error",
           "tolerance", *_LAZY]
