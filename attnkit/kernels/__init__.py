"""Triton kernels: softmax, flash (FlashAttention forward and backward; its jit functions in
flash_kernels), paged (paged decode with split-KV), rope_append (rotate and append to the KV cache).

Where each runs is decided by ``attnkit.device``; inputs are checked by ``attnkit.validation``.
"""
