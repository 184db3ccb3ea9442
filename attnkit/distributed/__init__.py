"""Attention across processes on torch.distributed (gloo on CPU processes, NCCL on GPUs).

context_parallel (the sequence split over ranks: ring attention forward and backward, the zig-zag
layout, all-gather K/V with a reduce-scatter backward, Ulysses' all-to-all of heads, their
communication volumes), traffic (count the bytes each torch.distributed call receives), alpha_beta (the
α–β link model and when a ring step hides its transfer), benchmark (correctness, timings and a ping-pong
on a process group, run by scripts/gpu_context_parallel.py), recorded (that script's recorded runs, read
for lesson 10: the GPUs, link and versions, the fitted α and β, the speed-ups, the measured crossover
beside the α–β model's), tensor_parallel (heads split over ranks: KV heads per rank, cache bytes per GPU,
a tensor-parallel decode of the capstone model), launch (start a group of processes, with a timeout and
clean-up).
"""
