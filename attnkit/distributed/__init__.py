"""Attention across processes on torch.distributed (gloo on CPU processes, NCCL on GPUs).

context_parallel (the sequence split over ranks: ring attention forward and backward, the zig-zag
layout, all-gather K/V, their communication volumes), tensor_parallel (heads split over ranks: KV heads
per rank, cache bytes per GPU, a tensor-parallel decode of the capstone model), launch (start a group
of processes, with a timeout and clean-up).
"""
