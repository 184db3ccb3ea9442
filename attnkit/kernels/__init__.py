"""Triton kernels: softmax, flash (FlashAttention forward and its backward designs; its jit functions
in flash_kernels), flash_fp8 (an e4m3 forward for Hopper), paged (paged decode with split-KV, sliding
windows and an FP8 cache), paged_extend (several new tokens per sequence over the paged cache),
rope_append (rotate and append to the KV cache, fp16/bf16/fp32 or FP8). In Gluon, for sm_90 GPUs only
(imported by flash where they run): flash_hopper (the warp-specialised forward) and flash_hopper_backward
(the warp-specialised backward: dK/dV beside the Triton dQ kernel, or one pass with dQ added atomically).
runners: a compiled kernel launched again without Triton's JIT in between (every launch of flash and of
the Gluon forward).

Where each runs is decided by ``attnkit.device``; inputs are checked by ``attnkit.validation``.
"""
