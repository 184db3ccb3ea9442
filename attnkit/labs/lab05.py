"""Checks for lab 05, the FlashAttention forward kernel in Triton.

Each check calls the student's launch function ``flash_forward(q, k, v, causal=...)`` (the lab gives
it; it launches the student's kernel) on fresh random fp16 inputs of small shapes, on the course's
device (Triton's interpreter on a CPU), and compares the output with the float64 reference
``attnkit.reference.attention.attention_ref``:

    check_forward(flash_forward)   exercise 1: the online-softmax loop (no mask, Hq = Hkv)
    check_causal(flash_forward)    exercise 2: the causal mask aligned to the end, also with Nq < Nk
    check_gqa(flash_forward)       exercise 3: grouped-query heads, h → h // (Hq // Hkv)
    check_lab(flash_forward)       all three, with a summary line

The sizes are never multiples of the 16×16 tiles, so the masks of the last tiles matter too.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..classroom.checking import CheckResult, case, is_not_implemented, run_check, student_error, summarize
from ..device import runtime
from ..reference.attention import attention_ref
from ..tolerances import tolerance

DTYPE_NAME = "float16"

HINT_FORWARD = ("keep a running max m, sum l and accumulator acc per query row; for each K/V tile: "
                "s = q·kᵀ·scale with keys j ≥ Nk set to −inf, m_new = max(m, rowmax(s)), "
                "alpha = exp(m − m_new), p = exp(s − m_new), l = l·alpha + rowsum(p), "
                "acc = acc·alpha + p·v (rescale acc!); after the loop divide acc by l.")
HINT_CAUSAL = ("query i sees key j iff j ≤ i + Nk − Nq (the mask is aligned to the END of the keys, "
               "so with Nq < Nk the last query sees every key); stop the loop after the tile's last "
               "visible key, and set hidden scores to −inf before taking the row max.")
HINT_GQA = ("query head h shares the K/V of head h // (Hq // Hkv): consecutive query heads form a group "
            "(not h % Hkv, which interleaves them).")


def _student(flash_forward: Callable) -> Callable:
    """The student's function, with Triton's wrapping of errors taken off for a readable report."""
    def call(q, k, v, causal):
        try:
            return flash_forward(q, k, v, causal=causal)
        except Exception as exc:
            if is_not_implemented(exc):
                raise NotImplementedError from None
            raise student_error(exc) from None           # the error in the student's kernel line
    return call


def _reference(q, k, v, causal):
    return attention_ref(q, k, v, causal=causal)


def _cases(shapes, causal: bool, seed: int | None):
    """fp16 q [B, Hq, Nq, D], k and v [B, Hkv, Nk, D] on the course's device, one case per shape."""
    import torch

    seed = int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed
    gen = torch.Generator().manual_seed(seed)
    device = runtime().device
    made = []
    for b, hq, hkv, nq, nk, d in shapes:
        q = torch.randn(b, hq, nq, d, generator=gen, dtype=torch.float32)
        k = torch.randn(b, hkv, nk, d, generator=gen, dtype=torch.float32)
        v = torch.randn(b, hkv, nk, d, generator=gen, dtype=torch.float32)
        q, k, v = (t.to(device=device, dtype=torch.float16) for t in (q, k, v))
        label = (f"B={b}, Hq={hq}, Hkv={hkv}, Nq={nq}, Nk={nk}, D={d}"
                 f"{', causal' if causal else ''}")
        made.append(case(q, k, v, causal, label=label))
    return made


def _check(name: str, flash_forward: Callable, shapes, causal: bool, hint: str,
           seed: int | None) -> CheckResult:
    if not callable(flash_forward):
        raise ValueError(f"flash_forward: must be the launch function, got {type(flash_forward).__name__}")
    return run_check(name, _student(flash_forward), _reference, _cases(shapes, causal, seed),
                     tol=tolerance(DTYPE_NAME, runtime().device), hint=hint)


# Shapes: (B, Hq, Hkv, Nq, Nk, D). Tiles are 16 × 16, so 37 rows need three tiles, the last one
# partly masked; Nq ≠ Nk in causal cases catches a mask aligned to the start instead of the end.
FORWARD_SHAPES = ((1, 2, 2, 37, 37, 16), (2, 1, 1, 19, 45, 32), (1, 1, 1, 5, 70, 16))
CAUSAL_SHAPES = ((1, 2, 2, 37, 37, 16), (1, 1, 1, 21, 50, 16), (2, 1, 1, 1, 40, 32))
GQA_SHAPES = ((1, 4, 2, 33, 33, 16), (1, 3, 1, 20, 27, 16), (2, 4, 4, 17, 17, 16))


def check_forward(flash_forward: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 1: plain attention (no mask, one KV head per query head) on 3 random inputs."""
    return _check("flash forward (online softmax)", flash_forward, FORWARD_SHAPES, False,
                  HINT_FORWARD, seed)


def check_causal(flash_forward: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 2: causal attention, Nq = Nk and Nq < Nk (a decode step has Nq = 1)."""
    return _check("flash forward (causal)", flash_forward, CAUSAL_SHAPES, True, HINT_CAUSAL, seed)


def check_gqa(flash_forward: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 3: grouped-query attention (Hq = 4 with Hkv = 2; Hq = 3 with Hkv = 1) and plain MHA."""
    return _check("flash forward (GQA)", flash_forward, GQA_SHAPES, False, HINT_GQA, seed)


def check_lab(flash_forward: Callable, *, seed: int | None = None):
    """All three checks, with a summary line."""
    return summarize([check_forward(flash_forward, seed=seed), check_causal(flash_forward, seed=seed),
                      check_gqa(flash_forward, seed=seed)])
