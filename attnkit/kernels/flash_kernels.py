"""Former path of the FlashAttention Triton kernels, which live in ``attnkit.kernels.flash.triton_kernels``.

Kept only for the modules that still import this name (``paged``, the lab checks' guards, ``bench.compiled``):
the same objects, so a guard that replaces a kernel's ``run`` here replaces it there.
"""
from .flash.triton_kernels import (  # noqa: F401
    DEVICE_DESCRIPTORS,
    HOST_DESCRIPTORS,
    LN2,
    LOG2E,
    POINTERS,
    _atomic_add_tile,
    _attn_fwd,
    _backward_sequence,
    _batch_and_head,
    _bwd_dkdv,
    _bwd_dkdv_inner,
    _bwd_dq,
    _bwd_dq_inner,
    _bwd_preprocess,
    _descriptor,
    _fwd_keys,
    _probs,
    _row_stats,
    _sequence,
    _softmax_update,
    _store_tile,
    _visible,
    key_range,
    load_tile,
    tanh,
)
