"""Checks for lab 06, the FlashAttention backward in Triton.

    check_row_term(row_term)     exercise 1: Δ = rowsum(dO ∘ O), one fp32 number per query row
    check_dkdv(flash_dkdv)       exercise 2: the dK/dV kernel (GQA: summed over each group of query heads)
    check_dq(flash_dq)           exercise 3: the dQ kernel
    check_prediction(predict)    exercise 4: the backward's matrix products, predicted before counting
    count_products(flash_dkdv, flash_dq)   the measurement: your tl.dot calls and FLOPs, counted in the interpreter
    check_lab(seed=None, **functions)      all four, with a summary line

The launch functions take ``(q, k, v, o, lse, do, causal=...)`` with fp16 q, k, v, dO and o, and the
fp32 natural-log log-sum-exp of each row; they are compared with float64 autograd through the same
attention. Fixed cases come first: sizes that are not multiples of the 16 × 16 tiles, several batches
and grouped query heads, tensors in the [B, N, H, D] memory layout (strides that are not those of a
contiguous [B, H, N, D] tensor), a causal mask aligned to the end with Nq < Nk, a query tile whose last
visible key starts a key tile, Nq = 1 and Nq > Nk; then random shapes drawn from ``seed``.

While the student's function runs, attnkit's own FlashAttention (its Python functions and its Triton
kernels) and ``torch.autograd`` raise ``ForbiddenCall``: the gradients must come from the student's kernels.
"""
from __future__ import annotations

import contextlib
import math
import sys
from typing import Callable

import numpy as np

from ..classroom.checking import (
    FAILED,
    PASSED,
    CheckResult,
    Exercise,
    ForbiddenCall,
    case,
    check_exercises,
    forbidden_calls,
    is_not_implemented,
    module_functions,
    not_implemented,
    run_check,
    student_error,
)
from ..device import runtime
from ..tolerances import tolerance

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

    Module functions are replaced for the duration; each Triton kernel of attnkit.kernels.flash_kernels
    gets a raising ``run`` (and, in the interpreter, ``rewrite``) on the object itself, so a reference a
    notebook imported earlier is caught too.
    """
    import torch

    from ..kernels import flash, flash_kernels

    saved = []

    def replace(owner, name, what):
        if hasattr(owner, name):
            saved.append((owner, name, vars(owner).get(name, _MISSING)))
            setattr(owner, name, _forbidden(what))

    for name in ("flash_attention", "flash_attention_forward", "flash_attention_backward",
                 "_forward", "_forward_rung", "_backward", "_preprocess", "_launch"):
        replace(flash, name, f"attnkit.kernels.flash.{name}")
    for name in ("backward", "grad"):
        replace(torch.autograd, name, f"torch.autograd.{name}")
    from triton.runtime.jit import KernelInterface

    for name, obj in vars(flash_kernels).items():
        if isinstance(obj, KernelInterface):                  # a kernel object, not a class
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
def _reference(q, k, v, do, causal, grads: bool = True):
    """o (float64), lse (float64) and, with ``grads``, the float64 autograd gradients (dq, dk, dv)."""
    import torch

    q64, k64, v64 = (t.detach().to("cpu", torch.float64).requires_grad_(grads) for t in (q, k, v))
    group = q64.shape[1] // k64.shape[1]
    scores = q64 @ k64.repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q64.shape[-1])
    if causal:
        n_q, n_k = scores.shape[-2:]
        hidden = torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + (n_k - n_q)
        scores = scores.masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.exp(scores - lse[..., None]) @ v64.repeat_interleave(group, 1)
    if not grads:
        return o.detach(), lse.detach(), None, None, None
    with torch.enable_grad():
        o.backward(do.detach().to("cpu", torch.float64))
    return o.detach(), lse.detach(), q64.grad, k64.grad, v64.grad


def _seed(seed):
    return int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed


# Shapes: (B, Hq, Hkv, Nq, Nk, causal, layout). layout "bnhd": the tensors are [B, N, H, D] in memory,
# handed over as [B, H, N, D] views (strides that a kernel assuming contiguity gets wrong).
FIXED = (
    (2, 4, 2, 17, 38, True, "bnhd"),    # GQA, batches, causal aligned to the end (Nq < Nk, shift 21), 3 key tiles
    (1, 2, 1, 33, 20, False, "bhnd"),   # Nq > Nk (three query tiles), multi-query
    (1, 1, 1, 33, 33, True, "bhnd"),    # query tile 2's last visible key (32) starts key tile 2
    (1, 2, 2, 1, 40, True, "bnhd"),     # one decoding step: Nq = 1 sees every key
)


FIXED_SEED = 6          # the fixed cases' values are fixed too: the same inputs on every run


def _random_shapes(rng, count: int):
    shapes = []
    for _ in range(count):
        hkv = int(rng.integers(1, 3))
        hq = hkv * int(rng.integers(1, 3))
        causal = bool(rng.integers(0, 2))
        n_k = int(rng.integers(2, 41))
        n_q = int(rng.integers(1, n_k + 1)) if causal else int(rng.integers(1, 41))
        shapes.append((int(rng.integers(1, 3)), hq, hkv, n_q, n_k, causal,
                       "bnhd" if rng.integers(0, 2) else "bhnd"))
    return shapes


def _tensor(gen, b, h, n, layout, device, dtype):
    import torch

    if layout == "bnhd":
        t = torch.randn(b, n, h, HEAD_DIM, generator=gen).transpose(1, 2)
    else:
        t = torch.randn(b, h, n, HEAD_DIM, generator=gen)
    return t.to(device=device, dtype=dtype)


def _cases(seed, n_random: int = 1):
    """(case, gradients) pairs, fixed shapes then random ones: the case's inputs are (q, k, v, o, lse, do,
    causal); gradients() computes the float64 autograd (dq, dk, dv) when the check gets there."""
    import torch

    seed = _seed(seed)
    rng = np.random.default_rng(seed)
    fixed_gen, random_gen = torch.Generator().manual_seed(FIXED_SEED), torch.Generator().manual_seed(seed)
    device, dtype = runtime().device, torch.float16
    made = []
    for index, (b, hq, hkv, n_q, n_k, causal, layout) in enumerate(FIXED + tuple(_random_shapes(rng, n_random))):
        gen = fixed_gen if index < len(FIXED) else random_gen
        q, do = (_tensor(gen, b, hq, n_q, layout, device, dtype) for _ in range(2))
        k, v = (_tensor(gen, b, hkv, n_k, layout, device, dtype) for _ in range(2))
        o64, lse64, *_ = _reference(q, k, v, do, causal, grads=False)
        o = o64.to(device=device, dtype=dtype)
        if layout == "bnhd":
            o = o.transpose(1, 2).contiguous().transpose(1, 2)
        lse = lse64.to(device=device, dtype=torch.float32)
        kind = "fixed" if index < len(FIXED) else "random"
        label = (f"{kind}: B={b}, Hq={hq}, Hkv={hkv}, Nq={n_q}, Nk={n_k}, D={HEAD_DIM}"
                 f"{', causal' if causal else ''}{', [B, N, H, D] layout' if layout == 'bnhd' else ''}")
        made.append((case(q, k, v, o, lse, do, causal, label=label),
                     lambda q=q, k=k, v=v, do=do, causal=causal: _reference(q, k, v, do, causal)[2:]))
    return made


def _student(fn: Callable, pick: Callable) -> Callable:
    """The student's function under the ban, its Triton error wrapping taken off, result picked out."""
    def call(*args):
        try:
            with forbid_course_attention():
                out = fn(*args[:-1], causal=args[-1])
        except Exception as exc:
            if is_not_implemented(exc):
                raise NotImplementedError from None
            raise student_error(exc) from None
        return pick(out, args)
    return call


def _require_callable(name: str, fn) -> None:
    if not callable(fn):
        raise ValueError(f"{name}: must be a function, got {type(fn).__name__}")


def _run(name, fn, pick, expect, hint, seed) -> CheckResult:
    """run_check on the cases of ``seed``; each case's float64 gradients are computed when it is reached."""
    made = _cases(seed)
    gradients = iter([g for _, g in made])
    return run_check(name, _student(fn, pick), lambda *args: expect(next(gradients)()), [c for c, _ in made],
                     tol=tolerance(DTYPE_NAME, runtime().device), hint=hint)


# ------------------------------------------------------------------------------------------- the checks
def _pick_delta(out, args):
    return _as_tensor("row_term", out, tuple(args[0].shape[:3]))


def _as_tensor(name, out, shape):
    import torch

    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(out.shape)}")
    return out


def check_row_term(row_term: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 1: row_term(o, do) -> Δ [B, H, Nq] fp32, against float64 rowsum(dO ∘ O)."""
    import torch

    _require_callable("row_term", row_term)

    def student(q, k, v, o, lse, do, causal):
        try:
            with forbid_course_attention():
                out = row_term(o, do)
        except Exception as exc:
            if is_not_implemented(exc):
                raise NotImplementedError from None
            raise student_error(exc) from None
        return _as_tensor("row_term", out, tuple(o.shape[:3]))

    def reference(q, k, v, o, lse, do, causal):
        return (o.to("cpu", torch.float64) * do.to("cpu", torch.float64)).sum(-1)

    cases = [c for c, _ in _cases(seed)]
    # Δ is computed in fp32 from fp16 inputs: only the float32 bound separates it from an fp16 product.
    return run_check("row term Δ = rowsum(dO ∘ O)", student, reference, cases,
                     tol=tolerance("float32", "cpu"), hint=HINT_ROW_TERM)


def check_dkdv(flash_dkdv: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 2: flash_dkdv(q, k, v, o, lse, do, causal=...) -> (dk, dv), each [B, Hkv, Nk, D]."""
    import torch

    _require_callable("flash_dkdv", flash_dkdv)

    def pick(out, args):
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError(f"flash_dkdv: expected a pair (dk, dv), got {type(out).__name__}")
        shape = tuple(args[1].shape)
        return torch.stack([_as_tensor("dk", out[0], shape).double().cpu(),
                            _as_tensor("dv", out[1], shape).double().cpu()])

    return _run("dK/dV kernel (index 0 is dK, 1 is dV)", flash_dkdv, pick,
                lambda g: torch.stack([g[1], g[2]]), HINT_DKDV, seed)


def check_dq(flash_dq: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 3: flash_dq(q, k, v, o, lse, do, causal=...) -> dq [B, Hq, Nq, D]."""
    _require_callable("flash_dq", flash_dq)

    def pick(out, args):
        return _as_tensor("dq", out, tuple(args[0].shape))

    return _run("dQ kernel", flash_dq, pick, lambda g: g[0], HINT_DQ, seed)


# ------------------------------------------------------------------------------ prediction, measurement
PREDICTION_SHAPE = dict(B=1, H=1, Nq=64, Nk=64, D=16, block=16, causal=False)
EXPECTED_DOTS = 7 * (64 // 16) ** 2          # dK/dV kernel 4 per tile pair, dQ kernel 3
EXPECTED_RATIO = 3.5                          # 7 products per tile pair against the forward's 2
RATIO_BAND = 0.05


def check_prediction(predict: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 4: predict() -> (tl.dot calls of both backward kernels, backward/forward FLOP ratio).

    For PREDICTION_SHAPE; the count must be exact, the ratio within ± RATIO_BAND. ``seed`` is unused
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
        dots_ok = int(dots) == dots and int(dots) == EXPECTED_DOTS
        ratio_ok = abs(float(ratio) - EXPECTED_RATIO) <= RATIO_BAND
    except (TypeError, ValueError):
        return CheckResult(name, FAILED, f"❌ {name}: expected a pair (number of tl.dot calls, FLOP ratio), "
                                         f"got {got!r}")
    if dots_ok and ratio_ok:
        return CheckResult(name, PASSED, f"✅ {name}: {EXPECTED_DOTS} tl.dot calls, backward/forward "
                                         f"= {EXPECTED_RATIO} (within ± {RATIO_BAND}).")
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
    o64, lse64, *_ = _reference(q, k, v, do, False, grads=False)
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
