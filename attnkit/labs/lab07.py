"""Checks for lab 07, GQA and the KV cache.

    check_cache_bytes(cache_bytes)   exercise 1: bytes of K and V for a model, a context and a batch
    check_rope(rope)                 exercise 2: RoPE in PyTorch, both modes
    check_rope_append(rope_append)   exercise 3: the Triton kernel that rotates q and k and appends k, v
    check_lab(cache_bytes, rope, rope_append)

Every check draws fresh random inputs and compares with the float64 references of
``attnkit.kernels.rope_append`` and ``attnkit.reference.rope``. Exercise 3 runs the student's kernel on the course's device
(Triton's interpreter on a CPU) on sizes whose cache rows are not multiples of anything.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..classroom.checking import (
    NOT_IMPLEMENTED,
    CheckResult,
    case,
    fresh_copy,
    is_not_implemented,
    not_implemented,
    run_check,
    student_error,
    summarize,
)
from ..device import runtime
from ..kernels.rope_append import rope_append_reference
from ..reference.rope import apply_rope
from ..serving.kv_cache import kv_cache_bytes
from ..serving.model_configs import MODELS
from ..tolerances import tolerance

HINT_BYTES = ("every layer stores a K and a V vector of head_dim numbers for each KV head (not each query "
              "head) and each token: 2 · layers · kv_heads · head_dim · tokens · batch · dtype_bytes.")
HINT_ROPE = ('"half" pairs x[j] with x[j + D/2]; "interleaved" pairs x[2j] with x[2j + 1]; pair j turns '
             "by pos · base^(−2j/D): (a, b) → (a·cos − b·sin, b·cos + a·sin).")
HINT_Q = "rotate every query head too, at the same position as the key of its token."
HINT_CACHE = ("seqlens_k[b] is the index of the LAST token after the append (length − 1), so the new token s "
              "goes to row past + s with past = seqlens_k[b] + 1 − S, and is rotated at position past + s "
              '(with the pairs of its mode: "half" j ↔ j + D/2, "interleaved" 2j ↔ 2j + 1).')
HINT_V = "V is not rotated: copy each new V row into the cache row of its token."


# ------------------------------------------------------------------------------------ exercise 1
def check_cache_bytes(cache_bytes: Callable, seed: int | None = None) -> CheckResult:
    """``cache_bytes(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch) -> int``."""
    rng = np.random.default_rng(seed)
    cases = []
    for m in MODELS:
        tokens = int(rng.integers(1, 40000))
        batch, dtype_bytes = int(rng.integers(1, 17)), int(rng.choice([1, 2, 4]))
        cases.append(case(m.num_layers, m.num_kv_heads, m.head_dim, tokens, dtype_bytes, batch,
                          label=f"{m.name}, {tokens} tokens, batch {batch}, {dtype_bytes}-byte elements"))

    def reference(layers, kv_heads, head_dim, tokens, dtype_bytes, batch):
        return kv_cache_bytes(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, tokens=tokens,
                              dtype_bytes=dtype_bytes, batch=batch)

    return run_check("cache_bytes", cache_bytes, reference, cases, tol=0.0, hint=HINT_BYTES,
                     compare=lambda got, want: int(got) == int(want))


# ------------------------------------------------------------------------------------ exercise 2
def check_rope(rope: Callable, seed: int | None = None) -> CheckResult:
    """``rope(x, positions, mode) -> tensor``: x [S, D] float64, positions int64 [S]."""
    import torch

    g = torch.Generator().manual_seed(int(np.random.SeedSequence(seed).entropy % 2 ** 31))
    cases = []
    for mode in ("half", "interleaved", "interleaved", "half"):
        n, d = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g)) * 2 + 2
        x = torch.randn(n, d, dtype=torch.float64, generator=g)
        pos = torch.randint(0, 5000, (n,), generator=g)
        cases.append(case(x, pos, mode, label=f'x of shape {tuple(x.shape)}, mode "{mode}"'))
    return run_check("rope", rope, lambda x, pos, mode: apply_rope(x, pos, mode=mode), cases,
                     tol=1e-9, hint=HINT_ROPE)


# ------------------------------------------------------------------------------------ exercise 3
def _append_cases(seed):
    """(q, k, v, k_cache, v_cache, seqlens_k, mode, label) on the course's device, float32."""
    import torch

    device = runtime().device
    g = torch.Generator().manual_seed(int(np.random.SeedSequence(seed).entropy % 2 ** 31))
    # Decoding comes first: there, a position off by one row either way still lies inside the cache, so
    # that bug shows as wrong cache rows. (In the first prompt, seqlens_k taken as a length puts the
    # first new token at row -1, outside the cache.)
    specs = [  # (B, S, Hq, Hkv, D, cache rows, seqlens_k, mode, what)
        (2, 1, 4, 2, 16, 13, [6, 11], "half", "decoding"),
        (2, 3, 4, 2, 16, 13, [2, 2], "half", "first prompt"),
        (2, 4, 6, 2, 32, 17, [9, 15], "interleaved", "chunked prefill"),
        (1, 2, 2, 2, 16, 9, [7], "interleaved", "decoding, Hq = Hkv"),
    ]
    cases = []
    for b, s, hq, hkv, d, rows, seqlens, mode, what in specs:
        def r(*shape):
            return torch.randn(*shape, generator=g).to(device)
        args = (r(b, s, hq, d), r(b, s, hkv, d), r(b, s, hkv, d), r(b, hkv, rows, d), r(b, hkv, rows, d),
                torch.tensor(seqlens, dtype=torch.int32, device=device), mode)
        cases.append(case(*args, label=f"{what}: S={s}, Hq={hq}, Hkv={hkv}, D={d}, seqlens_k={seqlens}, "
                                       f'mode "{mode}"'))
    return cases


def check_rope_append(rope_append: Callable, seed: int | None = None) -> CheckResult:
    """``rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode) -> q_rot``, writing the caches in place."""
    cases = _append_cases(seed)
    results: dict[int, tuple] = {}

    def student(index):
        if index not in results:    # the student's own copies: the references keep the case's inputs
            q, k, v, k_cache, v_cache, seqlens, mode = fresh_copy(cases[index].args)
            try:
                q_rot = rope_append(q, k, v, k_cache, v_cache, seqlens, mode)
            except Exception as exc:
                if is_not_implemented(exc):
                    raise NotImplementedError from None
                raise student_error(exc) from None
            results[index] = (q_rot, k_cache, v_cache)
        return results[index]

    def reference(index):
        q, k, v, k_cache, v_cache, seqlens, mode = cases[index].args
        return rope_append_reference(q, k, v, k_cache, v_cache, seqlens_k=seqlens, mode=mode)

    indexed = [case(i, label=c.label) for i, c in enumerate(cases)]
    tol = tolerance("float32")
    for part, what, hint in ((1, "cache rows of K", HINT_CACHE), (0, "rotated q", HINT_Q),
                             (2, "cache rows of V", HINT_V)):
        def got_part(index, part=part):
            out = student(index)
            return None if out[part] is None else out[part]
        result = run_check(f"rope_append ({what})", got_part, lambda i, part=part: reference(i)[part],
                           indexed, tol=tol, hint=hint)
        if result.status == NOT_IMPLEMENTED:
            return not_implemented("rope_append")
        if not result.passed:
            if part == 1:
                return _with_row_shift_diagnosis(result, cases, results, tol)
            return result
    return CheckResult("rope_append", result.status,
                       f"✅ rope_append: rotated q and the K and V caches match the float64 reference on "
                       f"{len(cases)} random inputs.")


def _with_row_shift_diagnosis(result: CheckResult, cases, results: dict, tol: float) -> CheckResult:
    """Add a line to a failed K-cache report when the student's rows are the right ones, one row off."""
    from ..tolerances import rel_error

    for index in sorted(results):
        q, k, v, k_cache, v_cache, seqlens, mode = cases[index].args
        got = results[index][1]
        if rel_error(got, rope_append_reference(q, k, v, k_cache, v_cache, seqlens_k=seqlens,
                                                mode=mode)[1]) <= tol:
            continue                                  # this case is right; look at the one that failed
        for shift, how in ((-1, "one row too early (and rotated one position too early): that is what "
                                "taking seqlens_k as the length gives, past = seqlens_k − S"),
                           (1, "one row too late (and rotated one position too late): past = "
                               "seqlens_k + 1 − S, not seqlens_k + 2 − S")):
            try:
                shifted = rope_append_reference(q, k, v, k_cache, v_cache, seqlens_k=seqlens + shift,
                                                mode=mode)[1]
            except ValueError:
                continue                              # that shift leaves the cache: not what happened
            if rel_error(got, shifted) <= tol:
                report = result.report.replace("\n   hint:", f"\n   diagnosis: your new K rows are {how}."
                                                             "\n   hint:", 1)
                return CheckResult(result.name, result.status, report)
        break
    return result


def check_lab(cache_bytes: Callable, rope: Callable, rope_append: Callable):
    return summarize([check_cache_bytes(cache_bytes), check_rope(rope), check_rope_append(rope_append)])
