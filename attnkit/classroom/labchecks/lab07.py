"""Checks for lab 07, GQA and the KV cache.

    cache_bytes(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch)   exercise 1a
    max_sequences(model, context, free_gib, dtype_bytes, window=None)            exercise 1b
    rope(x, positions, mode)                                                     exercise 2
    rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode)                      exercise 3 (Triton)
    check_lab(cache_bytes=..., max_sequences=..., rope=..., rope_append=..., seed=None)

Each check runs fixed adversarial cases first (every size distinct, a size not exact in float32, a cache
larger than 2³² bytes, positions in the thousands, decoding where a row off by one still lies inside the
cache), then cases drawn from ``seed`` (fresh ones when None), and compares with the float64 references
of ``attnkit.kernels.rope_append`` and ``attnkit.reference.rope``; the rotated q must come back in q's
dtype. Exercise 3 runs the student's kernel on the course's device (Triton's interpreter on a CPU), on
caches that are views with strides of their own inside NaN buffers (rows padded past D, BSNH seen as
BNSH, heads outermost; ``CACHE_LAYOUTS``), whose memory outside the view must stay untouched. No answer
may call the course's own implementations.
"""
from __future__ import annotations

import sys
from fractions import Fraction
from typing import Callable

import numpy as np

from ...device import runtime
from ...kernels import rope_append as _rope_append
from ...kernels.rope_append import rope_append_reference
from ...reference import rope as _rope
from ...reference.rope import apply_rope
from ...serving import kv_cache as _kv_cache
from ...serving.kv_cache import kv_cache_bytes
from ...serving.model_configs import MODELS
from ...tolerances import tolerance
from ..checking import (
    FAILED,
    NOT_IMPLEMENTED,
    CheckResult,
    Exercise,
    WrongResult,
    case,
    check_exercises,
    exercise_check,
    fixed_and_random,
    fresh_copy,
    isolated,
    module_functions,
    not_implemented,
    placed,
    run_check,
    unwrapped,
)

HINT_BYTES = ("every layer stores a K and a V vector of head_dim numbers for each KV head (not each query "
              "head) and each token: 2 · layers · kv_heads · head_dim · tokens · batch · dtype_bytes.")
HINT_ROPE = ('"half" pairs x[j] with x[j + D/2]; "interleaved" pairs x[2j] with x[2j + 1]; pair j turns '
             "by pos · base^(−2j/D): (a, b) → (a·cos − b·sin, b·cos + a·sin). Compute the angles in float64 "
             "(torch.float64): positions reach the thousands.")

HINT_Q = "rotate every query head too, at the same position as the key of its token."
HINT_CACHE = ("seqlens_k[b] is the index of the LAST token after the append (length − 1), so the new token s "
              "goes to row past + s with past = seqlens_k[b] + 1 − S, and is rotated at position past + s "
              '(with the pairs of its mode: "half" j ↔ j + D/2, "interleaved" 2j ↔ 2j + 1). The caches are '
              "views of larger buffers: reach row (b, h, pos) as b·sc_b + h·sc_h + pos·sc_s, never through the "
              "shape, and write into the caches you are given (not a copy).")
HINT_V = "V is not rotated: copy each new V row into the cache row of its token."



def forbidden() -> tuple:
    """The course's own implementations: a student's function that calls one of them fails. (Not the
    RoPE tables: the lab's launcher reads them with ``rope_cache``.)"""
    return (apply_rope, _rope.rotation_matrix, rope_append_reference, _rope_append.rope_append_torch,
            _rope_append.rope_append_triton) + module_functions(_kv_cache, sys.modules[__name__])


# ------------------------------------------------------------------------------------ exercise 1
def _exact(got, want) -> bool:
    """An integer number of bytes, equal to the reference (``_whole_bytes`` has refused every non-integer)."""
    try:
        return float(got) == float(want) and int(got) == int(want)
    except (TypeError, ValueError, OverflowError):
        return False


class NotAnInt(WrongResult):
    """An answer of the right value, perhaps, but not the int the lab asks for."""


def _whole_number(fn: Callable, name: str, what: str, how: str) -> Callable:
    """``fn`` whose answer must be a Python or NumPy integer, as the lab asks ("an int"): a float (or a
    bool, or a tensor), even one equal to the right count, raises ``NotAnInt``, the check's verdict."""
    def call(*args, **kwargs):
        got = fn(*args, **kwargs)
        if got is not None and (isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, np.integer))):
            raise NotAnInt(f"{name} must return an int ({what}), got {type(got).__name__} {got!r}: {how}")
        return got
    call.__name__ = getattr(fn, "__name__", name)
    return call


def _whole_bytes(cache_bytes: Callable) -> Callable:
    return _whole_number(cache_bytes, "cache_bytes", "a whole number of bytes",
                         "keep every factor an int (no /, no float)")


def _check_cache_bytes(cache_bytes: Callable, *, seed: int | None = None) -> CheckResult:
    """``cache_bytes(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch) -> int``."""
    fixed = [case(*args, label=label) for args, label in (
        ((3, 5, 7, 100003, 2, 13), "every size a different prime: 3 layers, 5 KV heads, head_dim 7, 100003 "
                                   "tokens, 2-byte elements, batch 13 (not exact in float32)"),
        ((80, 8, 128, 131072, 2, 64), "80 layers, 8 KV heads, head_dim 128, 131072 tokens, batch 64 "
                                      "(more than 2³² bytes)"),
        ((1, 1, 1, 1, 1, 1), "one of everything"),
        ((2, 1, 64, 1, 4, 3), "one KV head, one token, 4-byte elements, batch 3"),
    )]
    rng = np.random.default_rng(seed)
    drawn = []
    for m in MODELS:
        tokens = int(rng.integers(1, 40000))
        batch, dtype_bytes = int(rng.integers(2, 17)), int(rng.choice([1, 2, 4]))
        drawn.append(case(m.num_layers, m.num_kv_heads, m.head_dim, tokens, dtype_bytes, batch,
                          label=f"{m.name}, {tokens} tokens, batch {batch}, {dtype_bytes}-byte elements"))

    def reference(layers, kv_heads, head_dim, tokens, dtype_bytes, batch):
        return kv_cache_bytes(num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, tokens=tokens,
                              dtype_bytes=dtype_bytes, batch=batch)

    return run_check("cache_bytes", _whole_bytes(cache_bytes), reference, fixed + drawn, tol=0.0, hint=HINT_BYTES,
                     compare=_exact, forbidden=forbidden(), fixed=len(fixed))


# ------------------------------------------------------------------------------------ exercise 1b
HINT_SEQUENCES = ("a sequence's cache holds min(context, window) tokens (all `context` when window is None) in "
                  "every layer, for each KV head of the model (model.num_kv_heads, not its query heads): "
                  "cache_bytes(..., tokens, dtype_bytes, 1) bytes. free_gib is in GiB, 2³⁰ bytes (not 10⁹); "
                  "the answer counts whole sequences: ⌊free_gib·2³⁰ / bytes per sequence⌋, an int (0 when "
                  "not even one fits).")


def reference_max_sequences(model, context, free_gib, dtype_bytes, window=None) -> int:
    """Whole sequences of ``context`` tokens whose caches fit in ``free_gib`` GiB; a sliding window of
    ``window`` tokens keeps at most that many per sequence. Exact arithmetic (free_gib as a fraction)."""
    tokens = context if window is None else min(context, window)
    per_sequence = kv_cache_bytes(num_layers=model.num_layers, num_kv_heads=model.num_kv_heads,
                                  head_dim=model.head_dim, tokens=tokens, dtype_bytes=dtype_bytes, batch=1)
    return int(Fraction(free_gib) * 2**30 // per_sequence)


def _model(name: str):
    return next(m for m in MODELS if m.name == name)


def _sequences_label(model, context, free_gib, dtype_bytes, window) -> str:
    win = "" if window is None else f", a {window}-token window"
    return f"{model.name}, context {context}, {free_gib} GiB free, {dtype_bytes}-byte elements{win}"


def _window_edges() -> tuple:
    """Mistral 7B in fp16 (2¹⁷ bytes a token, 2⁻¹³ GiB) with its 4096-token window, at contexts one short
    of the window, exactly the window and one past it: each with the free memory of exactly 40 sequences'
    caches (one token too many per sequence gives 39) and with one token's bytes less than 41 caches
    (one token too few gives 41). Every amount is exact in binary."""
    window, token_gib, edges = 4096, Fraction(1, 2**13), []
    for context in (window - 1, window, window + 1):
        per_sequence = min(context, window) * token_gib
        for free in (40 * per_sequence, 41 * per_sequence - token_gib):
            edges.append(("Mistral 7B", context, float(free), 2, window))
    return tuple(edges)


# The window's edge on both sides (``_window_edges``): a cache of window ± 1 tokens, or context ± 1, fails.
WINDOW_EDGES = _window_edges()


def _whole_sequences(max_sequences: Callable) -> Callable:
    return _whole_number(max_sequences, "max_sequences", "a whole number of sequences",
                         "int(...) the count, or divide whole bytes with //")


def _check_max_sequences(max_sequences: Callable, *, seed: int | None = None) -> CheckResult:
    """``max_sequences(model, context, free_gib, dtype_bytes, window=None) -> int``."""
    fixed_args = (
        # Llama 3 8B at 8192 tokens, fp16: exactly 1 GiB a sequence. 12.75 GiB: 12 (12.75·10⁹ bytes hold 11;
        # rounding gives 13; its 32 query heads would make 4 GiB a sequence).
        ("Llama 3 8B", 8192, 12.75, 2, None),
        ("Llama 3 8B", 8192, 12.0, 2, None),              # exactly 12: a strict < or a −1 shows
        ("Llama 2 7B", 4096, 70.5, 2, None),              # multi-head: 2 GiB a sequence
        ("Mistral 7B", 32768, 20.25, 2, 4096),            # the window holds 4096 of 32768 tokens
        ("Mistral 7B", 3000, 10.0, 2, 4096),              # a context shorter than the window
        ("Falcon 7B", 2048, 0.375, 1, None),              # one KV head, an 8-bit cache
        ("Llama 2 70B", 131072, 39.5, 2, None),           # 40 GiB a sequence: not even one
    ) + WINDOW_EDGES
    fixed = []
    for name, context, free_gib, dtype_bytes, window in fixed_args:
        m = _model(name)
        fixed.append(case(m, context, free_gib, dtype_bytes, window=window,
                          label=_sequences_label(m, context, free_gib, dtype_bytes, window)))
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(6):
        m = MODELS[int(rng.integers(len(MODELS)))]
        context, dtype_bytes = int(rng.integers(100, 40000)), int(rng.choice([1, 2, 4]))
        window = [None, 1024, 4096][int(rng.integers(3))]
        free_gib = float(rng.integers(1, 80 * 16)) / 16                 # exact in binary
        drawn.append(case(m, context, free_gib, dtype_bytes, window=window,
                          label=_sequences_label(m, context, free_gib, dtype_bytes, window)))
    return run_check("max_sequences", _whole_sequences(max_sequences), reference_max_sequences, fixed + drawn,
                     tol=0.0, hint=HINT_SEQUENCES, compare=_exact, forbidden=forbidden(), fixed=len(fixed))


# ------------------------------------------------------------------------------------ exercise 2
def _torch_generator(seed: int | None):
    import torch

    return torch.Generator().manual_seed(int(np.random.SeedSequence(seed).entropy % 2 ** 31))


def _check_rope(rope: Callable, *, seed: int | None = None) -> CheckResult:
    """``rope(x, positions, mode) -> tensor``: x [S, D] float64, positions int64 [S]."""
    import torch

    g = _torch_generator(0)
    fixed = []
    # The second round repeats every shape and mode with other positions (the same first one, too): an answer
    # that keeps its cos/sin table between calls, keyed by what a later call shares, fails there.
    for shapes in (((5, 8, [0, 1, 2, 3, 4]), (3, 12, [4999, 17, 1024]), (4, 6, [7, 7, 300, 2])),
                   ((5, 8, [0, 9, 4000, 3, 77]), (3, 12, [4999, 4998, 5]), (4, 6, [7, 100, 1, 4095]))):
        for mode in ("half", "interleaved"):
            for n, d, pos in shapes:
                x = torch.randn(n, d, dtype=torch.float64, generator=g)
                fixed.append(case(x, torch.tensor(pos), mode, label=f'x of shape {tuple(x.shape)}, positions '
                                                                     f'{pos}, mode "{mode}"'))
    g = _torch_generator(seed)
    drawn = []
    for mode in ("half", "interleaved", "interleaved", "half"):
        n, d = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g)) * 2 + 2
        x = torch.randn(n, d, dtype=torch.float64, generator=g)
        pos = torch.randint(0, 5000, (n,), generator=g)
        drawn.append(case(x, pos, mode, label=f'x of shape {tuple(x.shape)}, mode "{mode}"'))
    return run_check("rope", rope, lambda x, pos, mode: apply_rope(x, pos, mode=mode), fixed + drawn,
                     tol=1e-9, hint=HINT_ROPE, forbidden=forbidden(), fixed=len(fixed))


# ------------------------------------------------------------------------------------ exercise 3
# (B, S, Hq, Hkv, D, cache rows, seqlens_k, mode, what). Decoding comes first: there, a position off by
# one row either way still lies inside the cache, so that bug shows as wrong cache rows. (In the first
# prompt, seqlens_k taken as a length puts the first new token at row -1, outside the cache.)
APPEND_SPECS = [
    (2, 1, 4, 2, 16, 13, [6, 11], "half", "decoding"),
    (2, 3, 4, 2, 16, 13, [2, 2], "half", "first prompt"),
    (2, 4, 6, 2, 32, 17, [9, 15], "interleaved", "chunked prefill"),
    (1, 2, 2, 2, 16, 9, [7], "interleaved", "decoding, Hq = Hkv"),
]


# Layouts (the dimensions from outermost to innermost in memory, the gap after each run; see
# ``kernel_guards.placed``). The rule: every tensor argument comes, in some case, with strides unlike
# its shape's and its siblings'. A server's caches are views with strides of their own: rows padded past
# D (a [..., :D] view of a wider buffer), a BSNH buffer seen as BNSH, heads outermost; each inside NaN,
# so a kernel that steps through a cache by its shape (a row at pos·D, a head at h·S_cache·D, a sequence
# at (b·Hkv + h)·sc_h) or writes into a copy (.contiguous(), reshape) fails, and so does a store outside
# the view (checked after every call). k_cache and v_cache share one layout (the given launch passes
# k_cache's strides for both); the last axis stays contiguous (the kernel's d has stride 1); seqlens_k
# stays contiguous (the given kernel loads seqlens_k + b). q, k and v get layouts of their own: the
# given launch makes them contiguous, and one that does not must use their strides.
CACHE_LAYOUTS = (
    ((0, 1, 2, 3), 8, "cache rows padded to D + 8"),
    ((0, 2, 1, 3), 0, "caches stored BSNH, seen as BNSH"),
    ((1, 0, 2, 3), 0, "caches stored heads outermost"),
    (None, 0, "contiguous caches"),
)
QKV_LAYOUTS = (((0, 2, 1, 3), 0), ((0, 1, 2, 3), 4), ((2, 0, 1, 3), 0), (None, 0))
# NaN elements before and after each laid-out tensor: a stray store near the view lands there (the
# check copies every case's tensors at every call, and on a CPU a copy of placed's default 4096 costs
# about 50 times one of these small buffers).
GUARD = 256


def _laid_out(t, layout):
    order, gap = layout[:2]
    return t if order is None else placed(t, order=order, gap=gap, lead=GUARD, trail=GUARD)


def _append_case(g, spec, layout: int = 3):
    import torch

    device = runtime().device
    b, s, hq, hkv, d, rows, seqlens, mode, what = spec

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device)

    q, k, v = (_laid_out(t, QKV_LAYOUTS[(layout + i) % len(QKV_LAYOUTS)])
               for i, t in enumerate((r(b, s, hq, d), r(b, s, hkv, d), r(b, s, hkv, d))))
    k_cache, v_cache = (_laid_out(r(b, hkv, rows, d), CACHE_LAYOUTS[layout]) for _ in range(2))
    args = (q, k, v, k_cache, v_cache, torch.tensor(seqlens, dtype=torch.int32, device=device), mode)
    return case(*args, label=f"{what}: S={s}, Hq={hq}, Hkv={hkv}, D={d}, seqlens_k={seqlens}, mode \"{mode}\", "
                             f"{CACHE_LAYOUTS[layout][2]} (strides {tuple(k_cache.stride())})")


def append_cases(seed):
    """The fixed cases, then one drawn from ``seed``: q, k, v, k_cache, v_cache, seqlens_k, mode (float32)."""
    import torch

    g = _torch_generator(0)
    fixed = [_append_case(g, spec, i % len(CACHE_LAYOUTS)) for i, spec in enumerate(APPEND_SPECS)]
    g = _torch_generator(seed)
    b, s = int(torch.randint(1, 3, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g))
    hkv = int(torch.randint(1, 3, (1,), generator=g))
    hq = hkv * int(torch.randint(1, 4, (1,), generator=g))
    rows = int(torch.randint(s + 1, 20, (1,), generator=g))
    seqlens = [int(x) for x in torch.randint(s - 1, rows, (b,), generator=g)]
    mode = ("half", "interleaved")[int(torch.randint(0, 2, (1,), generator=g))]
    layout = int(torch.randint(0, len(CACHE_LAYOUTS), (1,), generator=g))
    drawn = _append_case(g, (b, s, hq, hkv, 16, rows, seqlens, mode, "random"), layout)
    return fixed + [drawn], len(fixed)


def _check_rope_append(rope_append: Callable, *, seed: int | None = None) -> CheckResult:
    """``rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode) -> q_rot``, writing the caches in place.
    The cases run in a child process (``isolated``): a store past the cache that corrupts memory fails
    the check with the case it was on instead of ending the notebook's kernel."""
    return isolated("rope_append", lambda: _rope_append_cases(rope_append, seed), hint=HINT_CACHE)


def _rope_append_cases(rope_append: Callable, seed: int | None) -> CheckResult:
    import torch

    cases, n_fixed = append_cases(seed)
    results: dict[int, tuple] = {}
    student_fn = unwrapped(rope_append)

    def written_outside(view) -> int:
        """Elements of the NaN buffer around ``view`` (a ``placed`` cache) that are no longer NaN. (Nested:
        this module's functions are forbidden while the student's function runs, and this runs then.)"""
        n = view.untyped_storage().nbytes() // view.element_size()
        inside = torch.zeros(n, dtype=torch.bool, device=view.device)
        inside.as_strided(view.shape, view.stride(), view.storage_offset()).fill_(True)
        return int((~torch.isnan(view.as_strided((n,), (1,), 0)[~inside])).sum())

    def student(index):
        if index not in results:    # the student's own copies: the references keep the case's inputs
            q, k, v, k_cache, v_cache, seqlens, mode = fresh_copy(cases[index].args)
            q_rot = student_fn(q, k, v, k_cache, v_cache, seqlens, mode)
            for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
                if not cache.is_contiguous() and written_outside(cache):
                    raise WrongResult(
                        f"{written_outside(cache)} elements of the buffer around {name} changed: {name} is a "
                        "view of a larger buffer, and a store reached memory outside it (a row, head or sequence "
                        "reached through the shape instead of sc_s, sc_h, sc_b, or a store past D).")
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
            return student(index)[part]
        result = run_check(f"rope_append ({what})", got_part, lambda i, part=part: reference(i)[part],
                           indexed, tol=tol, hint=hint, forbidden=forbidden(), fixed=n_fixed)
        if result.status == NOT_IMPLEMENTED:
            return not_implemented("rope_append")
        if not result.passed:
            if part == 1:
                return _with_row_shift_diagnosis(result, cases, results, tol)
            return result
    for index, c in enumerate(cases):
        q_rot, q = results[index][0], c.args[0]
        if getattr(q_rot, "dtype", None) != q.dtype:
            got = str(getattr(q_rot, "dtype", type(q_rot).__name__)).replace("torch.", "")
            return CheckResult("rope_append (rotated q)", FAILED,
                               f"❌ rope_append (rotated q): case {index + 1} of {len(cases)}, {c.label}: the "
                               f"values are right, but the rotated q is {got}; expected "
                               f"{str(q.dtype).replace('torch.', '')}, the dtype of q.\n"
                               f"   hint: return q's dtype (q_out = torch.empty_like(q), or .to(q.dtype) after "
                               f"computing in float64): the attention kernel that reads q_rot expects it.")
    return CheckResult("rope_append", result.status,
                       f"✅ rope_append: rotated q and the K and V caches match the float64 reference on "
                       f"{fixed_and_random(n_fixed, len(cases) - n_fixed)}.")


def _with_row_shift_diagnosis(result: CheckResult, cases, results: dict, tol: float) -> CheckResult:
    """Add a line to a failed K-cache report when the student's rows are the right ones, one row off."""
    from ...tolerances import rel_error

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


# ------------------------------------------------------------------------------------ the lab
EXERCISES = (
    Exercise(function="cache_bytes", check=_check_cache_bytes),
    Exercise(function="max_sequences", check=_check_max_sequences, depends=("cache_bytes",)),
    Exercise(function="rope", check=_check_rope),
    Exercise(function="rope_append", check=_check_rope_append),
)

check_cache_bytes = exercise_check(EXERCISES, "cache_bytes")
check_max_sequences = exercise_check(EXERCISES, "max_sequences")
check_rope = exercise_check(EXERCISES, "rope")
check_rope_append = exercise_check(EXERCISES, "rope_append")


def check_lab(*, seed: int | None = None, **functions):
    """Every exercise's check: ``check_lab(cache_bytes=cache_bytes, max_sequences=max_sequences, rope=rope,
    rope_append=rope_append)``."""
    return check_exercises(EXERCISES, functions, seed=seed)
