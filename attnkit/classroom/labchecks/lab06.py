"""Checks for lab 06, the FlashAttention backward in Triton.

    check_row_term(row_term)     exercise 1: Δ = rowsum(dO ∘ O), one fp32 number per query row
    check_dkdv(flash_dkdv)       exercise 2: the dK/dV kernel (GQA: summed over each group of query heads)
    check_dq(flash_dq)           exercise 3: the dQ kernel
    check_prediction(predict)    exercise 4: the backward's matrix products, predicted before counting
    count_products(flash_dkdv, flash_dq)   the measurement: your tl.dot calls and FLOPs, counted in the interpreter
    check_lab(seed=None, **functions)      all four, with a summary line

The launch functions take ``(q, k, v, o, lse, do, causal=..., block_m=..., block_n=...)`` with fp16 q, k,
v, dO and o, and the fp32 natural-log log-sum-exp of each row; they are compared with float64 autograd
through the same attention. Fixed cases come first: sizes that are not multiples of the 16 × 16 tiles,
several batches and grouped query heads, a causal mask aligned to the end with Nq < Nk, a query tile
whose last visible key starts a key tile (shift Nk − Nq = 1, the case the padded tile end gets wrong),
Nq = 1, Nq > Nk, two long sums (33 tiles) whose small late terms an fp16 accumulator drops, and two
launches with block_m ≠ block_n (32 and 16, 16 and 32: a loop that steps by the other tile's size is
right only when they are equal), and the first case once more with other values of the same shapes and
layouts (``AGAIN``: a Δ, LSE or result kept from an earlier call, by shape or not, fails there); then
random shapes and launch sizes drawn from ``seed``. Δ must come back in float32, the gradients in their
inputs' dtype, the prediction's count as an int. Every tensor of a case has its own memory layout
(``LAYOUTS``: a kernel that reads dO through O's strides fails), the fp32 lse too (``LSE_LAYOUTS``: never
contiguous, so a launch function that passes it on without ``.contiguous()`` to a kernel that indexes it
as contiguous fails) inside a buffer of NaN (a load past an edge without its mask, or a masked load without ``other=``,
gives NaN); the tensors the launch functions allocate sit between sentinels checked after each call (a
store without its mask is named), and the cases run in a child process where kernels are interpreted
(a crash is a failure that names the case).

Each gradient is judged row by row against the size of the terms summed into it (the same products on
absolute values: ``attnkit.tolerances.componentwise_error``), with the float16 bound, on a CPU and a GPU
alike: a row whose terms cancel (a query that sees one key) is not judged by a pure relative error.

While the student's function runs, attnkit's own FlashAttention (its Python functions and its Triton
kernels) and ``torch.autograd`` raise ``ForbiddenCall``: the gradients must come from the student's kernels.

Internal API for tests and scripts: ``reference_backward`` (the float64 forward and gradients, with their
magnitudes), ``gradient_tolerance`` and ``lab_cases`` (a seed's cases with their launch sizes).
"""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Callable

import numpy as np

from ...device import runtime
from ...tolerances import check_tolerance, with_magnitude
from ..checking import (
    FAILED,
    PASSED,
    CheckResult,
    Exercise,
    ForbiddenCall,
    WrongResult,
    case,
    check_exercises,
    forbidden_calls,
    is_not_implemented,
    module_functions,
    not_implemented,
    placed,
    run_check,
    student_error,
    wrong_kind,
)

DTYPE_NAME = "float16"
HEAD_DIM = 16
BLOCK = 16

HINT_ROW_TERM = ("Δ[b, h, i] = Σ_d dO[b, h, i, d] · O[b, h, i, d]: load both tiles with the row mask "
                 "(rows i ≥ Nq are padding), convert to float32 BEFORE multiplying (an fp16 product "
                 "rounds), sum over axis 1, and store at row (b·H + h)·Nq + i of the contiguous Δ. Use the "
                 "strides you are given: the inputs may not be contiguous.")
HINT_DKDV = ("one program owns BLOCK_N keys of one KV head: for each query head g of its group "
             "(head = kv_head·GROUP + g) and each query tile: P = exp(q kᵀ·scale − LSE) (mask hidden keys "
             "with j ≤ i + Nk − Nq when causal), dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP − Δ), dK += dSᵀ Q; "
             "after the loops dK *= scale.")
HINT_DQ = ("one program owns BLOCK_M query rows of one head, reading KV head head // (Hq // Hkv): for "
           "each key tile up to the last one any row of the tile sees (i + Nk − Nq, so the loop bound needs "
           "its + 1): P = exp(q kᵀ·scale − LSE) (masked when causal), dP = dO Vᵀ, dS = P ∘ (dP − Δ), "
           "dQ += dS K; after the loop dQ *= scale.")
HINT_PREDICTION = ("count the tl.dot lines of YOUR two kernels: the dK/dV kernel computes S, dV, dP and dK "
                   "for every (query tile, key tile) pair, and the dQ kernel rebuilds S and dP before dQ; "
                   "the forward does 2 per pair (S and P·V). Every tl.dot here is 2·16·16·16 FLOPs.")


# ------------------------------------------------------------------------------ what may not be called
def _forbidden(what: str) -> Callable:
    def refuse(*args, **kwargs):
        raise ForbiddenCall(f"your function called {what}; the gradients must come from your own kernels")
    return refuse


@contextlib.contextmanager
def forbid_course_attention():
    """While inside: attnkit's FlashAttention (functions and Triton kernels), this module's own functions
    (its float64 reference among them) and torch.autograd raise ``ForbiddenCall``.

    Every function defined in a module of the attnkit.kernels.flash package is replaced for the duration;
    each of its Triton kernels gets a raising ``run`` (and, in the interpreter, ``rewrite``) on the object
    itself, so a reference a notebook imported earlier is caught too.
    """
    import types

    import torch

    from ...kernels import flash
    from .course_code import course_kernel_modules

    saved = []

    def replace(owner, name, what):
        if hasattr(owner, name):
            saved.append((owner, name, vars(owner).get(name, _MISSING)))
            setattr(owner, name, _forbidden(what))

    flash_modules = [sys.modules[name] for name in course_kernel_modules(flash.__name__)]
    for module in flash_modules:
        for name, obj in list(vars(module).items()):
            if isinstance(obj, types.FunctionType) and obj.__module__ == module.__name__:
                replace(module, name, f"{module.__name__}.{name}")
    for name in ("backward", "grad"):
        replace(torch.autograd, name, f"torch.autograd.{name}")
    from triton.runtime.jit import KernelInterface

    kernels = {}                      # each kernel once, by its own name (a module may give it a public one too)
    for module in flash_modules:
        for name, obj in vars(module).items():
            if isinstance(obj, KernelInterface):                  # a kernel object, not a class
                kernels.setdefault(id(obj), (obj, getattr(getattr(obj, "fn", None), "__name__", name)))
    for obj, name in kernels.values():
        for attr in ("run", "rewrite"):
            if callable(getattr(obj, attr, None)):
                replace(obj, attr, f"attnkit's Triton kernel {name}")
    try:
        with forbidden_calls(module_functions(flash, sys.modules[__name__])):
            yield
    finally:
        for owner, name, own in reversed(saved):
            if own is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, own)


_MISSING = object()


# ----------------------------------------------------------------------------------- reference and cases
def reference_backward(q, k, v, do, causal, grads: bool = True):
    """o (float64), lse (float64) and, with ``grads``, the float64 autograd gradients (dq, dk, dv), each
    carrying its magnitude (``attnkit.tolerances.with_magnitude``): the same products on absolute values,
    |dS|·|K|, |dS|ᵀ·|Q| and Pᵀ·|dO|, with |dS| = P ∘ (|dO|·|V|ᵀ + rowsum(|dO| ∘ |O|))."""
    import torch

    q64, k64, v64 = (t.detach().to("cpu", torch.float64).requires_grad_(grads) for t in (q, k, v))
    group = q64.shape[1] // k64.shape[1]
    scale = 1 / math.sqrt(q64.shape[-1])
    scores = q64 @ k64.repeat_interleave(group, 1).transpose(-1, -2) * scale
    if causal:
        n_q, n_k = scores.shape[-2:]
        hidden = torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + (n_k - n_q)
        scores = scores.masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - lse[..., None])
    o = p @ v64.repeat_interleave(group, 1)
    if not grads:
        return o.detach(), lse.detach(), None, None, None
    do64 = do.detach().to("cpu", torch.float64)
    with torch.enable_grad():
        o.backward(do64)
    with torch.no_grad():
        pa, doa = p.abs(), do64.abs()
        ka, va, qa = (t.detach().abs().repeat_interleave(g, 1) for t, g in ((k64, group), (v64, group), (q64, 1)))
        dsa = pa * (doa @ va.transpose(-1, -2) + (doa * o.abs()).sum(-1, keepdim=True))
        dqa = dsa @ ka * scale
        dka = (dsa.transpose(-1, -2) @ qa * scale).unflatten(1, (-1, group)).sum(2)
        dva = (pa.transpose(-1, -2) @ doa).unflatten(1, (-1, group)).sum(2)
    return (o.detach(), lse.detach(), with_magnitude(q64.grad, dqa), with_magnitude(k64.grad, dka),
            with_magnitude(v64.grad, dva))


def _seed(seed):
    return int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed


# Shapes: (B, Hq, Hkv, Nq, Nk, causal, values, (BLOCK_M, BLOCK_N), what the case is for). Every tensor
# of a case gets its own layout (LAYOUTS): a kernel that reads one tensor through another's strides, or
# assumes a contiguous [B, H, N, D] tensor, reads the wrong rows. values: see ``_values`` (the two long
# cases make an fp16 accumulator fail). The launch sizes are a case dimension: the launch functions take
# block_m and block_n, and a key loop that steps by BLOCK_M (or a query loop by BLOCK_N, or a causal
# bound from the other tile's size) is right only when the two are equal.
FIXED = (
    (2, 4, 2, 17, 38, True, "normal", (16, 16), "GQA, batches, causal aligned to the end (Nq < Nk, shift 21)"),
    (1, 2, 1, 33, 20, False, "normal", (16, 16), "Nq > Nk (three query tiles), multi-query"),
    (1, 1, 1, 33, 33, True, "normal", (16, 16), "query tile 2's last visible key (32) starts key tile 2"),
    (1, 1, 1, 32, 33, True, "normal", (16, 16),
     "shift Nk − Nq = 1: query 15, the last row of a full tile, sees key 16"),
    (1, 2, 2, 1, 40, True, "normal", (16, 16), "one decoding step: Nq = 1 sees every key"),
    (1, 1, 1, 16, 528, False, "long_keys", (16, 16), "33 key tiles: dQ summed over a long row"),
    (1, 1, 1, 528, 16, False, "long_queries", (16, 16), "33 query tiles: dK and dV summed over a long column"),
    (1, 2, 1, 40, 45, True, "normal", (32, 16), "a query tile of 32 rows walks key tiles of 16, causal"),
    (2, 2, 2, 37, 50, False, "normal", (16, 32), "a key tile of 32 keys walks query tiles of 16"),
)
# The launch sizes a random case draws from (with its own generator: the shapes drawn do not depend on it).
BLOCKS = ((16, 16), (32, 16), (16, 32), (32, 32))
# Memory orders of the [B, H, N, D] dimensions (outermost first; D is always innermost, as the lab's
# launchers require) and the gap after each run: case c gives tensor t (q, k, v, o, dO) LAYOUTS[(c + t) % 5].
LAYOUTS = (((0, 1, 2, 3), 0), ((0, 2, 1, 3), 3), ((1, 0, 2, 3), 1), ((2, 0, 1, 3), 5), ((1, 2, 0, 3), 2))

# The lse [B, Hq, Nq] of case c: LSE_LAYOUTS[c % 5], (order, gap, step) as ``placed`` takes them. The rule:
# lse, like every tensor argument, has a layout unlike its siblings' and is never contiguous, so a launch
# function that hands it on as it comes to a kernel that reads row (b·Hq + h)·Nq + i fails. Entry 0 (the
# first case, B = 2, Hq = 4) keeps its rows contiguous (stride 1) with the heads outermost and gaps, so
# making lse contiguous only when ``lse.stride(-1) != 1`` (as the launchers treat q, k, v and dO) fails
# too; the others give its rows a stride of 2 or more, so even a case with B = Hq = 1 shows (such a case
# never takes entry 0, which would be contiguous there).
LSE_LAYOUTS = (((1, 0, 2), 2, 1), ((0, 2, 1), 1, 1), ((2, 0, 1), 3, 1), ((0, 1, 2), 0, 2), ((1, 2, 0), 1, 1))

FIXED_SEED = 6          # the fixed cases' values are fixed too: the same inputs on every run
# State kept between calls (a Δ or an LSE cached by shape, a result kept from the first call): the first
# fixed case runs once more after the others, the same shapes, layouts and launch sizes with other values
# (their own generator, the same on every run), as lab 04's runner does (``again_with_other_values``).
# Its o and lse are computed from its own q, k, v, so permuting the first case's values would not do.
AGAIN_SEED = 66
AGAIN_NOTE = ("the first case called again with other values of the same shapes and layouts: a Δ, LSE or "
              "result kept from an earlier call shows here")
N_FIXED = len(FIXED) + 1        # the fixed cases and the first one again


def _random_shapes(rng, count: int, block_rng):
    shapes = []
    for _ in range(count):
        hkv = int(rng.integers(1, 3))
        hq = hkv * int(rng.integers(1, 3))
        causal = bool(rng.integers(0, 2))
        n_k = int(rng.integers(2, 41))
        n_q = int(rng.integers(1, n_k + 1)) if causal else int(rng.integers(1, 41))
        blocks = BLOCKS[int(block_rng.integers(len(BLOCKS)))]
        shapes.append((int(rng.integers(1, 3)), hq, hkv, n_q, n_k, causal, "normal", blocks, ""))
    return shapes


def _values(gen, b, hq, hkv, n_q, n_k, kind):
    """q, k, v, dO in float32 (before rounding to fp16), ``kind`` "normal", "long_keys" or "long_queries".

    "long_keys" (dQ's long sum, one query tile): query row 0 gives keys 0 and 1 half its weight each,
    with dP = +1 and −1, so dQ's row 0 is one large term, (K₀ − K₁)/2, and every later key tile adds a
    term about 2·10⁻⁴ of it in the same direction: below half an fp16 ulp of the sum, so an fp16
    accumulator drops every one of them (about 1% of the row), an fp32 one keeps them.
    "long_queries" (dK's and dV's long sum, one key tile): the same for key 0's column: query 0 gives it
    half its weight, every later query row about 6·10⁻⁶.
    """
    import torch

    q, do = (torch.randn(b, hq, n_q, HEAD_DIM, generator=gen) for _ in range(2))
    k, v = (torch.randn(b, hkv, n_k, HEAD_DIM, generator=gen) for _ in range(2))
    if kind == "long_keys":
        k = 0.01 * k
        k[..., :2, 0] = 2.0                    # keys 0 and 1 score 10 with query 0, every other key 0
        k[..., :, 2:] += 1.0                   # every key points along w = (0, 0, 1, …, 1) …
        k[..., 1, 2:] -= 2.0                   # … but key 1, the other way
        q[..., 0, :] = 0.0
        q[..., 0, 0] = 20.0                    # 20 · 2 / √16 = 10
        q[..., 1:, :] *= 0.3
        v = 0.01 * v
        v[..., 0, 0], v[..., 1, 0] = 1.0, -1.0
        v[..., 2:, 0] += 0.55
        do[..., 0, :] = 0.01 * do[..., 0, :]
        do[..., 0, 0] = 1.0                    # dP = dO·Vᵀ: +1, −1, then 0.55 for every later key
    elif kind == "long_queries":
        k = 0.01 * k
        k[..., :2, 0] = 10.0                   # query 0 scores keys 0, 1 at 10, the others at 0
        k[..., 2:, 1] = 9.35                   # every later query scores keys 2.. at 9.35, keys 0, 1 at 0
        q = 0.01 * q
        q[..., 0, 0] = 4.0
        q[..., 1:, 1] = 4.0
        q[..., :, 2:] += 1.0                   # every query points along w
        v = 0.01 * v
        v[..., 0, 2], v[..., 1, 2] = 1.0, -1.0
        do = 0.01 * do
        do[..., :, 2] += 1.0                   # dP = +1 for key 0, −1 for key 1, 0 for the others
    return q, k, v, do


_FIXED_CASES: dict = {}       # device -> the fixed cases, built once (run_check hands out copies of them)


def lab_cases(seed, n_random: int = 1):
    """(case, gradients) pairs, fixed shapes then random ones: the case's inputs are (q, k, v, o, lse, do,
    causal), each in its own layout inside a NaN-filled buffer, and the keywords block_m, block_n;
    gradients() computes the float64 autograd (dq, dk, dv) when the check gets there (once, for a fixed
    case)."""
    import torch

    device = runtime().device
    if device not in _FIXED_CASES:
        again = (FIXED[0][:-1] + (f"{FIXED[0][-1]}; {AGAIN_NOTE}",),)
        made = (_build(FIXED, 0, torch.Generator().manual_seed(FIXED_SEED), "fixed")
                + _build(again, 0, torch.Generator().manual_seed(AGAIN_SEED), "fixed"))   # index 0: case 1's layouts
        _FIXED_CASES[device] = [(c, _once(g)) for c, g in made]
    seed = _seed(seed)
    shapes = tuple(_random_shapes(np.random.default_rng(seed), n_random, np.random.default_rng([seed, 6])))
    return _FIXED_CASES[device] + _build(shapes, len(FIXED), torch.Generator().manual_seed(seed), "random")


def _once(fn):
    done: list = []

    def call():
        if not done:
            done.append(fn())
        return done[0]
    return call


def _build(shapes, first: int, gen, kind_name: str):
    import torch

    device, dtype = runtime().device, torch.float16
    made = []
    for index, (b, hq, hkv, n_q, n_k, causal, kind, (block_m, block_n), note) in enumerate(shapes, start=first):
        q, k, v, do = (t.to(dtype) for t in _values(gen, b, hq, hkv, n_q, n_k, kind))
        o64, lse64, *_ = reference_backward(q, k, v, do, causal, grads=False)
        tensors = [q, k, v, o64.to(dtype), do]
        q, k, v, o, do = (placed(t, order=LAYOUTS[(index + i) % 5][0], gap=LAYOUTS[(index + i) % 5][1],
                                 dtype=dtype, device=device) for i, t in enumerate(tensors))
        lse_order, lse_gap, lse_step = (LSE_LAYOUTS[index % len(LSE_LAYOUTS)] if b * hq > 1
                                        else LSE_LAYOUTS[1 + index % (len(LSE_LAYOUTS) - 1)])
        lse = placed(lse64, order=lse_order, gap=lse_gap, step=lse_step, dtype=torch.float32, device=device)
        blocks = "" if (block_m, block_n) == (BLOCK, BLOCK) else f", block_m={block_m}, block_n={block_n}"
        label = (f"{kind_name}: B={b}, Hq={hq}, Hkv={hkv}, Nq={n_q}, Nk={n_k}, D={HEAD_DIM}"
                 f"{', causal' if causal else ''}{blocks}{f' ({note})' if note else ''}")
        made.append((case(q, k, v, o, lse, do, causal, label=label, block_m=block_m, block_n=block_n),
                     lambda q=q, k=k, v=v, do=do, causal=causal: reference_backward(q, k, v, do, causal)[2:]))
    return made


def _student(fn: Callable, pick: Callable) -> Callable:
    """The student's function under the ban, launched with the case's block_m and block_n, its Triton
    error wrapping taken off, result picked out."""
    def call(*args, **blocks):
        try:
            with forbid_course_attention():
                out = fn(*args[:-1], causal=args[-1], **blocks)
        except Exception as exc:
            if is_not_implemented(exc):
                raise NotImplementedError from None
            raise student_error(exc) from None
        return pick(out, args)
    return call


def _require_callable(name: str, fn) -> None:
    if not callable(fn):
        raise ValueError(f"{name}: must be a function, got {type(fn).__name__}")


def _missing_block_sizes(check_name: str, name: str, fn, sizes: tuple[str, ...]) -> CheckResult | None:
    """A failed result when ``fn`` cannot take the keywords ``sizes`` (the given launch functions take
    them, and the checks launch with BLOCK_M ≠ BLOCK_N), else None."""
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None                                # a callable without a signature: let the call decide
    if any(p.kind is p.VAR_KEYWORD for p in params.values()) or all(s in params for s in sizes):
        return None
    wanted = " and ".join(sizes)
    return CheckResult(check_name, FAILED,
                       f"❌ {check_name}: {name} must take the keyword argument{'s' if len(sizes) > 1 else ''} "
                       f"{wanted}, as the launch function the lab gives does: the check launches your kernels "
                       f"with tiles of 16 and 32 rows, BLOCK_M ≠ BLOCK_N in some cases.\n"
                       f"   hint: keep the given launch function's signature "
                       f"({name}(..., block_m=16{', block_n=16' if len(sizes) > 1 else ''})) and pass the sizes "
                       f"on to the kernel.")


def gradient_tolerance() -> float:
    """The bound on each gradient row's componentwise error (the float16 check tolerance)."""
    return check_tolerance(DTYPE_NAME)


def _run(name, fn, pick, expect, hint, seed) -> CheckResult:
    """run_check on the cases of ``seed`` (in a child process where kernels are interpreted, with
    poisoned masked loads and guarded allocations); each case's float64 gradients are computed when it is
    reached."""
    made = lab_cases(seed)
    gradients = iter([g for _, g in made])
    tol = gradient_tolerance()
    hint = f"{hint} (passes when every row's error is at most {tol:.0e} of the size of its terms, the float16 bound)"
    return run_check(name, _student(fn, pick), lambda *args, **blocks: expect(next(gradients)()),
                     [c for c, _ in made], tol=tol, hint=hint, fixed=N_FIXED, kernel_guards=True, isolate=True)


# ------------------------------------------------------------------------------------------- the checks
def _as_tensor(name, out, shape, dtype, why: str):
    """``out`` if it is a tensor of ``shape`` and ``dtype``, else ``WrongResult`` saying which rule it breaks."""
    import torch

    if not isinstance(out, torch.Tensor):
        problem = f"expected a tensor, got {type(out).__name__}"
    elif tuple(out.shape) != shape:
        problem = f"expected shape {list(shape)}, got {list(out.shape)}"
    elif out.dtype != dtype:
        problem = (f"expected {str(dtype).replace('torch.', '')} ({why}), got "
                   f"{str(out.dtype).replace('torch.', '')}")
    else:
        return out
    raise WrongResult(wrong_kind(f"{name}: {problem}"))


GRADIENT_DTYPE = "the dtype of its input, as autograd returns a gradient: allocate it with the given launcher"


def check_row_term(row_term: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 1: row_term(o, do) -> Δ [B, H, Nq] fp32, against float64 rowsum(dO ∘ O)."""
    import torch

    _require_callable("row_term", row_term)

    missing = _missing_block_sizes("row term Δ = rowsum(dO ∘ O)", "row_term", row_term, ("block_m",))
    if missing is not None:
        return missing

    def student(q, k, v, o, lse, do, causal, block_m, block_n):
        try:
            with forbid_course_attention():
                out = row_term(o, do, block_m=block_m)
        except Exception as exc:
            if is_not_implemented(exc):
                raise NotImplementedError from None
            raise student_error(exc) from None
        return _as_tensor("row_term", out, tuple(o.shape[:3]), torch.float32,
                          "one fp32 number per query row, as the lab says")

    def reference(q, k, v, o, lse, do, causal, block_m, block_n):
        o64, do64 = o.to("cpu", torch.float64), do.to("cpu", torch.float64)
        return with_magnitude((o64 * do64).sum(-1), (o64.abs() * do64.abs()).sum(-1))

    cases = [c for c, _ in lab_cases(seed)]
    # Δ is computed in fp32 from fp16 inputs: only the float32 bound separates it from an fp16 product.
    return run_check("row term Δ = rowsum(dO ∘ O)", student, reference, cases, tol=check_tolerance("float32"),
                     hint=HINT_ROW_TERM, fixed=N_FIXED, kernel_guards=True, isolate=True)


def check_dkdv(flash_dkdv: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 2: flash_dkdv(q, k, v, o, lse, do, causal=...) -> (dk, dv), each [B, Hkv, Nk, D]."""
    import torch

    _require_callable("flash_dkdv", flash_dkdv)
    name = "dK/dV kernel (index 0 is dK, 1 is dV)"
    missing = _missing_block_sizes(name, "flash_dkdv", flash_dkdv, ("block_m", "block_n"))
    if missing is not None:
        return missing

    def pick(out, args):
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise WrongResult(wrong_kind(f"flash_dkdv: expected a pair (dk, dv), got {type(out).__name__}"))
        shape, dtype = tuple(args[1].shape), args[1].dtype
        return torch.stack([_as_tensor("dk", out[0], shape, dtype, GRADIENT_DTYPE).double().cpu(),
                            _as_tensor("dv", out[1], shape, dtype, GRADIENT_DTYPE).double().cpu()])

    return _run(name, flash_dkdv, pick,
                lambda g: with_magnitude(np.stack([g[1], g[2]]), np.stack([g[1].magnitude, g[2].magnitude])),
                HINT_DKDV, seed)


def check_dq(flash_dq: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 3: flash_dq(q, k, v, o, lse, do, causal=...) -> dq [B, Hq, Nq, D]."""
    _require_callable("flash_dq", flash_dq)
    missing = _missing_block_sizes("dQ kernel", "flash_dq", flash_dq, ("block_m", "block_n"))
    if missing is not None:
        return missing

    def pick(out, args):
        return _as_tensor("dq", out, tuple(args[0].shape), args[0].dtype, GRADIENT_DTYPE)

    return _run("dQ kernel", flash_dq, pick, lambda g: g[0], HINT_DQ, seed)


# ------------------------------------------------------------------------------ prediction, measurement
PREDICTION_SHAPE = dict(B=1, H=1, Nq=64, Nk=64, D=16, block=16, causal=False)
EXPECTED_DOTS = 7 * (64 // 16) ** 2          # dK/dV kernel 4 per tile pair, dQ kernel 3
EXPECTED_RATIO = 3.5                          # 7 products per tile pair against the forward's 2
RATIO_BAND = 0.05


def check_prediction(predict: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 4: predict() -> (tl.dot calls of both backward kernels, backward/forward FLOP ratio).

    For PREDICTION_SHAPE; the count must be an exact int, the ratio a number within ± RATIO_BAND. ``seed`` is unused
    (the question has one answer).
    """
    name = "prediction: the backward's matrix products"
    _require_callable("predict", predict)
    try:
        got = predict()
    except NotImplementedError:
        return not_implemented(name)
    except Exception as exc:
        return CheckResult(name, FAILED, f"❌ {name}: your function raised {type(exc).__name__}: {exc}\n"
                                         f"   hint: {HINT_PREDICTION}")
    try:
        dots, ratio = got
    except (TypeError, ValueError):
        return CheckResult(name, FAILED, f"❌ {name}: expected a pair (number of tl.dot calls, FLOP ratio), "
                                         f"got {got!r}")
    if isinstance(dots, (bool, np.bool_)) or not isinstance(dots, (int, np.integer)):
        return CheckResult(name, FAILED, f"❌ {name}: the number of tl.dot calls must be an int (a count, as "
                                         f"the lab asks), got {type(dots).__name__} {dots!r}.\n"
                                         f"   hint: {HINT_PREDICTION}")
    if isinstance(ratio, (bool, np.bool_)) or not isinstance(ratio, (int, float, np.integer, np.floating)):
        return CheckResult(name, FAILED, f"❌ {name}: the FLOP ratio must be a number (an int or a float), got "
                                         f"{type(ratio).__name__} {ratio!r}.\n   hint: {HINT_PREDICTION}")
    dots_ok = int(dots) == EXPECTED_DOTS
    ratio_ok = abs(float(ratio) - EXPECTED_RATIO) <= RATIO_BAND
    if dots_ok and ratio_ok:
        return CheckResult(name, PASSED, f"✅ {name}: the count is exact and the ratio within ± {RATIO_BAND}; "
                                         f"the cell below measures both in your kernels.")
    wrong = []
    if not dots_ok:
        wrong.append(f"the number of tl.dot calls ({dots!r}) is not right (it must be exact)")
    if not ratio_ok:
        wrong.append(f"the ratio ({ratio!r}) is not within ± {RATIO_BAND} of the right value")
    return CheckResult(name, FAILED, f"❌ {name}: " + "; ".join(wrong) + f".\n   hint: {HINT_PREDICTION}")


@contextlib.contextmanager
def _count_dots(counter: dict):
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    original = builder.create_dot

    def create_dot(a, b, d, *args):
        m, kk = a.data.shape[-2:]
        n = b.data.shape[-1]
        counter["dots"] += 1
        counter["flops"] += 2 * m * n * kk
        return original(a, b, d, *args)

    builder.create_dot = create_dot
    try:
        yield
    finally:
        del builder.create_dot


def count_products(flash_dkdv: Callable, flash_dq: Callable) -> str:
    """Count the tl.dot calls of the student's backward and their FLOPs on PREDICTION_SHAPE, in Triton's
    interpreter, against the forward's 4·B·H·Nq·Nk·D FLOPs (2 products per tile pair); returns the report."""
    import torch

    if runtime().device != "cpu":
        return "Counting runs kernels in Triton's interpreter, on a machine without a GPU (this one compiles them)."
    shape = PREDICTION_SHAPE
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(shape["B"], shape["H"], n, shape["D"], generator=gen).half()
                   for n in (shape["Nq"], shape["Nk"], shape["Nk"], shape["Nq"]))
    o64, lse64, *_ = reference_backward(q, k, v, do, False, grads=False)
    o, lse = o64.half(), lse64.float()
    forward_flops = 4 * shape["B"] * shape["H"] * shape["Nq"] * shape["Nk"] * shape["D"]
    backward = {"dots": 0, "flops": 0}
    try:
        with _count_dots(backward), forbid_course_attention():
            flash_dkdv(q, k, v, o, lse, do, causal=False)
            flash_dq(q, k, v, o, lse, do, causal=False)
    except Exception as exc:
        if is_not_implemented(exc):
            return "⏳ count_products: needs exercises 2 and 3 first."
        raise student_error(exc) from None
    pairs = (shape["Nq"] // shape["block"]) * (shape["Nk"] // shape["block"])
    return (f"{'forward (2 products per tile pair, 4·B·H·Nq·Nk·D):':<52}{2 * pairs:4d} products,     "
            f"{forward_flops:>9,} FLOPs\n"
            f"{'your backward, counted:':<52}{backward['dots']:4d} tl.dot calls, {backward['flops']:>9,} FLOPs\n"
            f"backward / forward: {backward['flops'] / forward_flops:.2f}")


# -------------------------------------------------------------------------------------------- the lab
EXERCISES = (
    Exercise(function="row_term", check=check_row_term),
    Exercise(function="flash_dkdv", check=check_dkdv, depends=("row_term",)),
    Exercise(function="flash_dq", check=check_dq, depends=("row_term",)),
    Exercise(function="predict", check=check_prediction),
)


def check_lab(*, seed: int | None = None, **functions):
    """All four exercises, with a summary line: check_lab(row_term=..., flash_dkdv=..., flash_dq=..., predict=...)."""
    return check_exercises(EXERCISES, functions, seed=seed)


__all__ = ["check_row_term", "check_dkdv", "check_dq", "check_prediction", "count_products", "check_lab",
           "EXERCISES", "ForbiddenCall", "forbid_course_attention"]
