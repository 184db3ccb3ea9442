"""Lesson 2's ``iomodel`` as its cells and lab 2 call it (``iomodel.attention_steps``,
``iomodel.measure_naive_scaling``): the cost model, which lives in ``attnkit.analysis.iomodel``, and naive
attention timed, which lives in ``attnkit.bench.naive``, under the one name those notebooks import. New code
imports the two homes.
"""
from __future__ import annotations

from ..analysis.iomodel import (  # noqa: F401
    GPU,
    GPUS,
    H100_BOOST_GHZ,
    HIERARCHY_H100,
    REGISTER_UNIT,
    ROOFLINE_GPUS,
    SMEM_BYTES_PER_CLOCK,
    SMEM_RESERVED_PER_BLOCK,
    SMEM_UNIT,
    Occupancy,
    Step,
    attention_flops,
    attention_steps,
    fused_attention,
    gpu_from_device,
    memory_hierarchy_figure,
    occupancy,
    roofline_attention_figure,
    roofline_figure,
    smem_bandwidth,
)
from .naive import (  # noqa: F401
    CPU_TIMING,
    NAIVE_STEPS,
    cpu_best_ms,
    measure_naive_scaling,
    naive_attention_torch,
    profile_naive,
    quadratic_fit,
    run_naive_profile,
    run_naive_scaling,
    scaling_exponent,
    without_profiler_log,
)
