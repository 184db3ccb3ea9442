"""Triton kernels: softmax, flash (FlashAttention, a sub-package: its public face in ``flash``, every rule
that picks a kernel, backward design and configuration in ``flash.dispatch``, the rungs and backward
designs those rules choose among in ``flash.designs``, the launch plans and
autotuning in ``flash.plans``, the Triton kernels in ``flash.triton_kernels``, the warp-specialised Gluon
forward and backward for sm_90 GPUs in ``flash.hopper`` and ``flash.hopper_backward``, an e4m3 forward in
``flash.fp8``, launches without Triton's JIT in ``flash.runners``), paged (paged decode with split-KV,
sliding windows and an FP8 cache; its input checks in ``paged_checks``, its launch-configuration rules in
``paged_dispatch``, its launch plans in ``paged_plans``), paged_extend (several new tokens per sequence
over the paged cache), rope_append (rotate and append to the KV cache, fp16/bf16/fp32 or FP8).
input_checks: the options the dense and paged kernels share (window, softcap, packed sequences' offsets).

flash_hopper is the former path of ``flash.hopper``, kept because the forward's ladder
(``flash.dispatch.LADDER``, printed in lessons' stored outputs) names it.

Where each runs is decided by ``attnkit.device``; inputs are checked by ``attnkit.validation``.
"""
