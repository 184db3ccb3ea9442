"""Checks for lab 02, counting FLOPs and bytes and placing kernels on the roofline.

Students write five functions; each check compares them with exact integer counts (or the float64
roofline of ``attnkit.bench.iomodel``) on fixed adversarial sizes first, then on sizes drawn from a
seed (fresh ones when ``seed`` is None; the grader passes a seed the student never sees):

    matmul_cost(batch, m, n, k, itemsize)                          -> (flops, bytes)
    flash_forward_cost(batch, heads, n_q, n_k, d, block_q, itemsize) -> (flops, bytes)
    decode_cost(batch, q_heads, kv_heads, context, d, itemsize)    -> (flops, bytes)
    roofline(flops, nbytes, gpu)                                   -> (intensity, seconds, memory_bound)
    predicted_qk_ms(n)                                             -> predicted ms of naive QKᵀ on an H100

The last one is a prediction, made before the measurement is shown: it must lie within
``PREDICTION_BAND`` (±2%) of the H100 SXM's roofline bound at every recorded length (a band that
rejects the usual unit slips: GB/s read as GiB/s is 7.4% off, TB/s as TiB/s 10%, a count that also
writes Kᵀ 17% at n = 512), and it cannot exceed the time the kernel was measured to take.

Every report gives the numbers in the answer's own units (FLOPs, bytes, seconds, milliseconds) with the
ratio got / expected, never one relative error over quantities of different units.
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

from ...bench import iomodel
from ...bench.recorder import describe_source, read_results
from ..checking import (
    FAILED,
    PASSED,
    CheckResult,
    Exercise,
    WrongResult,
    case,
    check_exercises,
    fixed_and_random,
    fresh_copy,
    is_not_implemented,
    not_implemented,
    wrong_kind,
)

TOL = 1e-9            # counts are exact integers; 1e-9 leaves room only for float rounding


def _each_close(got, expected) -> bool:
    """Every entry within TOL of its own expected value (a small count is not hidden by a large one)."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    return got.shape == expected.shape and bool(np.all(np.abs(got - expected) <= TOL * np.abs(expected)))


def _rng(seed):
    return np.random.default_rng(seed)      # seed None: fresh sizes on every run


def _as_pair(result, name):
    """(flops, bytes) as two floats, or a WrongResult that tells the student what to return."""
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        kind = f"a {type(result).__name__}" + (f" of {len(result)} items" if isinstance(result, (tuple, list)) else "")
        raise WrongResult(wrong_kind(f"{name} must return a tuple (flops, bytes), got {kind}"))
    for label, value in zip(("flops", "bytes"), result):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise WrongResult(wrong_kind(f"{label} must be a number, got {type(value).__name__} {value!r}"))
    return np.array([float(result[0]), float(result[1])])


class ForbiddenCall(Exception):
    """Raised when a student's function calls the check's own reference or the recorded measurement."""


def _raiser(*args, **kwargs):
    # Runs as the code of a course function, with that function's module globals: reach the
    # exception through the builtins only.
    raise __import__("attnkit.classroom.labchecks.lab02", fromlist=["ForbiddenCall"]).ForbiddenCall(
        "a ready-made answer of the course (or the measurement itself): compute it with your own code")


def _refused():
    """The check's references, the recorded results and lesson 2's ready-made counts."""
    return [matmul_cost_reference, flash_forward_cost_reference, decode_cost_reference, roofline_reference,
            qk_recorded, qk_roofline_ms, read_results, iomodel.attention_steps, iomodel.fused_attention,
            iomodel.Step.time_bound_s]


@contextlib.contextmanager
def _refusing():
    saved = [(fn, fn.__code__) for fn in _refused()]
    try:
        for fn, _ in saved:
            fn.__code__ = _raiser.__code__.replace(co_name=fn.__name__)
        yield
    finally:
        for fn, code in saved:
            fn.__code__ = code


def _guarded(student_fn):
    def call(*args):
        with _refusing():
            return student_fn(*args)
    return call


def _number(value: float, unit: str) -> str:
    """A value in its unit, with 6 significant digits (never a bare '0.')."""
    text = f"{value:.6g}"
    return f"{text} {unit}".strip()


def _digits(expected: float, got: float, unit: str) -> tuple[str, str]:
    """The two values written with enough digits to read differently (6 to 17)."""
    for digits in range(6, 18):
        want, have = f"{expected:.{digits}g}", f"{got:.{digits}g}"
        if want != have:
            break
    return f"{want} {unit}".strip(), f"{have} {unit}".strip()


def describe_fields(got, expected, fields) -> str:
    """One line per quantity that differs: expected and got in its own unit, and their ratio."""
    lines = []
    for (label, unit), g, e in zip(fields, got, expected):
        if unit is None:                                # a yes/no answer
            if bool(g) != bool(e):
                lines.append(f"   {label}: expected {bool(e)}, got {bool(g)}")
            continue
        if abs(g - e) <= TOL * abs(e):
            continue
        want, have = _digits(e, g, unit)
        ratio = f" ({g / e:.4g} × the expected value)" if e else ""
        lines.append(f"   {label}: expected {want}, got {have}{ratio}")
    return "\n".join(lines)


def _field_check(name, student_fn, reference, cases, fields, hint, convert) -> CheckResult:
    """Each case: the reference, then the student's function (guarded, on its own copy of the
    arguments); every quantity compared on its own (within TOL) and reported in its own unit."""
    student_fn = _guarded(student_fn)
    for index, c in enumerate(cases, start=1):
        where = f"case {index} of {len(cases)}, {c.label}"
        expected = reference(*fresh_copy(c.args))
        try:
            got = convert(student_fn(*fresh_copy(c.args)))
        except WrongResult as exc:  # the check's verdict on what came back, not an error of the student's code
            return CheckResult(name, FAILED, f"❌ {name}: {where}: {exc}.\n   hint: {hint}")
        except Exception as exc:  # a blank, or a student's bug: a report, never a traceback
            if is_not_implemented(exc):
                return not_implemented(name)
            return CheckResult(name, FAILED, f"❌ {name}: {where}: your function raised {type(exc).__name__}: "
                                             f"{exc}\n   hint: {hint}")
        if not np.all(np.isfinite(got)):
            return CheckResult(name, FAILED, f"❌ {name}: {where}: your function returned {list(got)}, not "
                                             f"finite numbers.\n   hint: {hint}")
        if not _each_close(got, expected):
            return CheckResult(name, FAILED, f"❌ {name}: {where}: differs from the exact count.\n"
                                             f"{describe_fields(got, expected, fields)}\n   hint: {hint}")
    fixed = sum(1 for c in cases if not c.label.startswith(_DRAWN))
    return CheckResult(name, PASSED, f"✅ {name}: right on {fixed_and_random(fixed, len(cases) - fixed)}.")


_DRAWN = "random: "          # the label prefix of a case drawn from the seed
PAIR = (("FLOPs", "FLOP"), ("bytes", "bytes"))


def _pair_check(name, student_fn, reference, cases, hint):
    return _field_check(name, student_fn, reference, cases, PAIR, hint, lambda r: _as_pair(r, name))


# ---------------------------------------------------------------------------------- matmul_cost
def matmul_cost_reference(batch, m, n, k, itemsize):
    """C[m, n] = A[m, k] · B[k, n], ``batch`` times: A and B read once, C written once."""
    flops = 2 * batch * m * n * k
    nbytes = itemsize * batch * (m * k + k * n + m * n)
    return np.array([float(flops), float(nbytes)])


MATMUL_FIXED = (  # (batch, m, n, k, itemsize): m, n, k all different, so a swapped size shows
    ((1, 3, 5, 7, 2), "one 3×7 by 7×5 product, fp16"),
    ((4, 64, 16, 128, 2), "4 products of 64×128 by 128×16, fp16 (k largest)"),
    ((2, 100, 300, 20, 4), "2 products of 100×20 by 20×300, fp32 (k smallest)"),
    ((32, 4096, 4096, 128, 2), "QKᵀ of 32 heads: 4096×128 by 128×4096, fp16"),
    ((3, 1, 50, 9, 1), "3 products of 1×9 by 9×50, 1-byte elements"),
)


def _matmul_cases(seed):
    rng = _rng(seed)
    cases = [case(*args, label=label) for args, label in MATMUL_FIXED]
    for _ in range(6):
        batch, m, n, k = (int(x) for x in rng.integers(1, 3000, size=4))
        batch = 1 + batch % 40
        itemsize = int(rng.choice([1, 2, 4]))
        cases.append(case(batch, m, n, k, itemsize,
                          label=f"{_DRAWN}batch={batch}, m={m}, n={n}, k={k}, itemsize={itemsize}"))
    return cases


def check_matmul_cost(matmul_cost, *, seed: int | None = None) -> CheckResult:
    """matmul_cost(batch, m, n, k, itemsize) -> (flops, bytes) of C = A·B, A [m, k], B [k, n]."""
    return _pair_check(
        "matmul_cost", matmul_cost, matmul_cost_reference, _matmul_cases(seed),
        "a multiply-add is 2 FLOPs, and each of the m·n outputs needs k of them: 2·m·n·k per product. "
        "The kernel reads A (m·k elements) and B (k·n) once and writes C (m·n) once; multiply the "
        "elements by itemsize, and everything by batch.")


# --------------------------------------------------------------------------- flash_forward_cost
def flash_forward_cost_reference(batch, heads, n_q, n_k, d, block_q, itemsize):
    tiles = -(-n_q // block_q)                                  # ⌈n_q / block_q⌉ query tiles
    flops = 4 * batch * heads * n_q * n_k * d
    nbytes = itemsize * batch * heads * (2 * n_q * d + tiles * 2 * n_k * d)
    return np.array([float(flops), float(nbytes)])


FLASH_FIXED = (  # (batch, heads, n_q, n_k, d, block_q, itemsize)
    ((1, 1, 128, 128, 64, 64, 2), "n_q = 2·block_q exactly"),
    ((1, 2, 129, 300, 64, 64, 2), "n_q = 2·block_q + 1: a third, nearly empty query tile"),
    ((2, 3, 127, 50, 128, 64, 2), "n_q = 2·block_q − 1, n_k < n_q"),
    ((1, 4, 1, 4096, 128, 128, 2), "n_q = 1 (one query tile), long n_k"),
    ((3, 1, 40, 17, 32, 128, 4), "one query tile larger than n_q, fp32"),
    ((1, 32, 4096, 4096, 128, 128, 2), "N = 4096, 32 heads, block_q = 128, fp16"),
)


def _flash_cases(seed):
    rng = _rng(seed)
    cases = [case(*a, label=f"batch={a[0]}, heads={a[1]}, n_q={a[2]}, n_k={a[3]}, d={a[4]}, "
                            f"block_q={a[5]}, itemsize={a[6]}: {label}") for a, label in FLASH_FIXED]
    for _ in range(6):
        block_q = int(rng.choice([16, 32, 64, 128]))
        n_q = int(block_q * rng.integers(1, 20) + rng.choice([-1, 0, 1, 5]))
        n_q = max(n_q, 1)
        n_k, d = int(rng.integers(1, 5000)), int(rng.choice([32, 64, 80, 128, 256]))
        batch, heads, itemsize = int(rng.integers(1, 5)), int(rng.integers(1, 33)), int(rng.choice([2, 4]))
        cases.append(case(batch, heads, n_q, n_k, d, block_q, itemsize,
                          label=f"{_DRAWN}batch={batch}, heads={heads}, n_q={n_q}, n_k={n_k}, d={d}, "
                                f"block_q={block_q}, itemsize={itemsize}"))
    return cases


def check_flash_forward_cost(flash_forward_cost, *, seed: int | None = None) -> CheckResult:
    """flash_forward_cost(batch, heads, n_q, n_k, d, block_q, itemsize) -> (flops, bytes)."""
    return _pair_check(
        "flash_forward_cost", flash_forward_cost, flash_forward_cost_reference, _flash_cases(seed),
        "FLOPs: two products of 2·n_q·n_k·d each per head (the softmax is not counted). Bytes per head: "
        "Q read once and O written once (n_q·d each), and K and V (n_k·d each) read once per query "
        "tile: ⌈n_q / block_q⌉ tiles, counting the last, partly empty one.")


# ---------------------------------------------------------------------------------- decode_cost
def decode_cost_reference(batch, q_heads, kv_heads, context, d, itemsize):
    flops = 4 * batch * q_heads * context * d
    nbytes = itemsize * batch * (2 * q_heads * d + 2 * kv_heads * context * d)
    return np.array([float(flops), float(nbytes)])


DECODE_FIXED = (  # (batch, q_heads, kv_heads, context, d, itemsize)
    ((1, 8, 8, 1000, 64, 2), "multi-head: q_heads = kv_heads"),
    ((2, 32, 8, 4096, 128, 2), "GQA: 4 query heads per KV head"),
    ((4, 16, 1, 513, 128, 2), "multi-query: one KV head"),
    ((3, 6, 2, 1, 32, 4), "a context of one token, fp32"),
    ((1, 64, 8, 131072, 128, 1), "a 128k context with an 8-bit cache"),
)


def _decode_cases(seed):
    rng = _rng(seed)
    cases = [case(*args, label=f"batch={args[0]}, q_heads={args[1]}, kv_heads={args[2]}, context={args[3]}, "
                               f"d={args[4]}, itemsize={args[5]}: {label}") for args, label in DECODE_FIXED]
    for _ in range(6):
        kv_heads = int(rng.choice([1, 2, 4, 8]))
        q_heads = kv_heads * int(rng.choice([1, 2, 4, 8]))
        if q_heads == kv_heads:
            q_heads *= 2
        batch, context = int(rng.integers(1, 65)), int(rng.integers(2, 100_000))
        d, itemsize = int(rng.choice([64, 96, 128])), int(rng.choice([1, 2, 4]))
        cases.append(case(batch, q_heads, kv_heads, context, d, itemsize,
                          label=f"{_DRAWN}batch={batch}, q_heads={q_heads}, kv_heads={kv_heads}, "
                                f"context={context}, d={d}, itemsize={itemsize}"))
    return cases


def check_decode_cost(decode_cost, *, seed: int | None = None) -> CheckResult:
    """decode_cost(batch, q_heads, kv_heads, context, d, itemsize) -> (flops, bytes) of one decode step."""
    return _pair_check(
        "decode_cost", decode_cost, decode_cost_reference, _decode_cases(seed),
        "one new token per sequence: each query head does 2·context·d FLOPs for its scores and as many "
        "for P·V. Bytes: q read and o written (q_heads·d each), and the K and V cache read once per KV "
        "head (kv_heads·context·d each): the query heads of a group share it.")


# ------------------------------------------------------------------------------------- roofline
def roofline_reference(flops, nbytes, gpu):
    step = iomodel.Step("kernel", flops, nbytes, 0)
    intensity = flops / nbytes
    return np.array([intensity, step.time_bound_s(gpu), float(intensity < gpu.ridge)])


def _as_triple(result):
    """(intensity, seconds, memory_bound) as three floats, or a WrongResult in the lab's words: two
    numbers and a bool (``True`` or ``False``, not 1 or 0, nor a string), as the lab asks."""
    if not isinstance(result, (tuple, list)) or len(result) != 3:
        kind = f"a {type(result).__name__}" + (f" of {len(result)} items" if isinstance(result, (tuple, list)) else "")
        raise WrongResult(wrong_kind(f"roofline must return a tuple (intensity, seconds, memory_bound), got {kind}"))
    for label, value in zip(("intensity", "seconds"), result[:2]):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise WrongResult(wrong_kind(f"{label} must be a number, got {type(value).__name__} {value!r}"))
    flag = result[2]
    if not isinstance(flag, (bool, np.bool_)):
        raise WrongResult(wrong_kind(f"memory_bound must be True or False (a bool), got {type(flag).__name__} "
                                     f"{flag!r}: compare the intensity with the ridge, e.g. intensity < ridge"))
    return np.array([float(result[0]), float(result[1]), float(bool(flag))])


def _roofline_cases(seed):
    rng = _rng(seed)
    gpus = iomodel.GPUS
    h100, a100, t4 = gpus["H100 SXM"], gpus["A100 SXM 80GB"], gpus["T4"]
    cases = [
        case(4.295e9, 35.65e6, h100, label="QKᵀ of one head at N = 4096 on the H100 SXM (memory-bound)"),
        case(2.2e12, 1.0e9, h100, label="2.2 TFLOP over 1 GB on the H100 SXM (compute-bound)"),
        case(16.7e6, 67.1e6, a100, label="softmax-like: 0.25 FLOP/byte on the A100 SXM 80GB"),
        case(1.0e12, 4.0e9, t4, label="250 FLOP/byte on the T4 (compute-bound: its ridge is 203)"),
        case(8.0e9, 6.0e7, t4, label="133 FLOP/byte on the T4 (memory-bound)"),
        _at_ridge(t4, -10), _at_ridge(h100, -12),
        case(h100.ridge * (1 - 1e-9) * 2.0e9, 2.0e9, h100,
             label="just below the H100 SXM's ridge (intensity 1 − 10⁻⁹ times it: memory-bound)"),
        case(a100.ridge * (1 + 1e-9) * 3.0e8, 3.0e8, a100,
             label="just above the A100 SXM 80GB's ridge (intensity 1 + 10⁻⁹ times it: not memory-bound)"),
    ]
    names = list(gpus)
    for _ in range(6):
        gpu = gpus[names[int(rng.integers(len(names)))]]
        intensity = gpu.ridge * float(np.exp(rng.uniform(-4, 4)))
        if abs(intensity / gpu.ridge - 1) < 1e-3:
            intensity *= 1.5
        nbytes = float(np.exp(rng.uniform(np.log(1e5), np.log(1e11))))
        cases.append(case(intensity * nbytes, nbytes, gpu,
                          label=f"{_DRAWN}{intensity * nbytes:.4g} FLOPs over {nbytes:.4g} bytes on the {gpu.name}"))
    drawn = _at_ridge(gpus[names[int(rng.integers(len(names)))]], int(rng.integers(-20, 4)))
    cases.append(case(*drawn.args, label=_DRAWN + drawn.label))
    return cases


def _at_ridge(gpu, power: int):
    """A case exactly on ``gpu``'s ridge: flops = peak·2^power s and nbytes = bandwidth·2^power s, so the
    intensity is peak / bandwidth to the last bit, and the two times are both exactly 2^power s (every
    usual way of writing the ridge, the times or their comparison gives the same floats here). The lab's
    rule: memory-bound when the intensity is strictly below the ridge, so the answer is False."""
    flops, nbytes = math.ldexp(gpu.tensor_tflops * 1e12, power), math.ldexp(gpu.hbm_gbs * 1e9, power)
    return case(flops, nbytes, gpu, label=f"exactly on the {gpu.name}'s ridge ({flops:.6g} FLOPs over "
                                          f"{nbytes:.6g} bytes: both times are 2^{power} s; not memory-bound, "
                                          f"since the intensity is not below the ridge)")


def check_roofline(roofline, *, seed: int | None = None) -> CheckResult:
    """roofline(flops, nbytes, gpu) -> (intensity FLOP/byte, seconds at least, memory_bound: bool).

    memory_bound is True when the intensity is strictly below the ridge (fixed and drawn cases lie
    exactly on it, and 10⁻⁹ either side of it), and must be a bool (1 or 0 fails: the lab asks for True
    or False); intensity and seconds must be numbers."""
    return _field_check(
        "roofline", roofline, roofline_reference, _roofline_cases(seed),
        (("intensity", "FLOP/byte"), ("seconds", "s"), ("memory_bound", None)), convert=_as_triple,
        hint="intensity = flops / nbytes. The kernel needs at least flops / peak seconds to compute and "
             "nbytes / bandwidth seconds to move its bytes; it cannot beat the larger of the two. "
             "gpu.tensor_tflops is in 10¹² FLOP/s, gpu.hbm_gbs in 10⁹ bytes/s. It is memory-bound when "
             "its intensity is strictly below the ridge, gpu.tensor_tflops·10¹² / (gpu.hbm_gbs·10⁹) (exactly "
             "on the ridge it is not), and memory_bound is a bool: True or False.")


# ----------------------------------------------------------------------------- the prediction
# prediction / the H100 SXM's roofline bound. ±2% rejects the unit slips of a bandwidth or a count:
# GB/s read as GiB/s (2³⁰/10⁹ = 1.074), TB/s as TiB/s (1.100), Kᵀ written and read as well (1.17 at
# n = 512), compute and memory times added (1.29 at n = 512); a rounded datasheet figure (3.35 TB/s,
# 989 TFLOP/s) stays inside it.
PREDICTION_BAND = (0.98, 1.02)


def qk_recorded() -> list[dict]:
    """The H100's recorded naive-attention rows (32 heads, d = 128, fp16): N and the QKᵀ kernel's ms."""
    return read_results("naive_attention")


def qk_roofline_ms(n: int) -> float:
    """The roofline's bound on the QKᵀ kernel of naive attention, 32 heads, d = 128, fp16, H100 SXM."""
    step = iomodel.attention_steps(n, 128, itemsize=2)[0]
    heads = iomodel.Step("QKᵀ, 32 heads", 32 * step.flops, 32 * step.bytes_read, 32 * step.bytes_written)
    return heads.time_bound_s(iomodel.GPUS["H100 SXM"]) * 1e3


def _ms(value: float) -> str:
    return f"{value:.4f} ms" if value >= 1e-3 else f"{value:.4g} ms"


def check_prediction(predicted_qk_ms, *, seed: int | None = None) -> CheckResult:
    """predicted_qk_ms(n) -> your predicted time in ms of naive attention's QKᵀ kernel on an H100.

    One sequence, 32 heads, d = 128, fp16, sequence length n; the kernel reads Q and K and writes the
    n × n scores of every head. Checked at every recorded n: the prediction must lie within
    PREDICTION_BAND of the H100 SXM's roofline bound, and may not exceed the recorded time (a bound
    is a floor the kernel cannot beat). Errors are reported in milliseconds and as a ratio to the bound.
    ``seed`` is accepted for the common interface; the cases are fixed.
    """
    name = "predicted_qk_ms"
    rows = qk_recorded()
    lo, hi = PREDICTION_BAND
    lines = []
    hint = ("per head QKᵀ reads Q and K (n·d elements each) and writes S (n·n), 2 bytes per element; it "
            "does 2·n·n·d FLOPs. Multiply by 32 heads, then take the larger of FLOPs / 989.5·10¹² FLOP/s "
            "and bytes / 3,350·10⁹ bytes/s (the H100 SXM's fp16 tensor peak and HBM bandwidth: decimal "
            "units, 10⁹ not 2³⁰), and give milliseconds.")
    for row in rows:
        n, measured = int(row["N"]), float(row["QK^T_ms"])
        try:
            with _refusing():
                got = predicted_qk_ms(n)
        except NotImplementedError:
            return not_implemented(name)
        except Exception as exc:  # a bug in the student's code: report it
            return CheckResult(name, FAILED, f"❌ {name}: n = {n}: your function raised {type(exc).__name__}: {exc}")
        try:
            got = float(got)
        except (TypeError, ValueError):
            return CheckResult(name, FAILED, f"❌ {name}: n = {n}: return a number of milliseconds, "
                                             f"got {type(got).__name__}")
        bound = qk_roofline_ms(n)
        ratio = got / bound
        lines.append(f"   n = {n:5d}: predicted {_ms(got)}, measured {_ms(measured)} "
                     f"(prediction / measured = {got / measured:.2f})")
        if not (math.isfinite(ratio) and lo <= ratio <= hi) or got > measured:
            off = got - bound
            if got > measured:
                what = (f"your prediction, {_ms(got)}, is above the measured {_ms(measured)}: a bound cannot be "
                        f"slower than the kernel")
            else:
                what = (f"your prediction, {_ms(got)}, is {abs(off):.4g} ms {'above' if off > 0 else 'below'} "
                        f"the roofline bound ({got / bound:.4g} × the bound; the band is {lo:g} to {hi:g} ×)")
            return CheckResult(name, FAILED, f"❌ {name}: n = {n}: {what}.\n   hint: {hint}")
    source = describe_source(rows)
    return CheckResult(name, PASSED, "\n".join(
        [f"✅ {name}: within {lo:g} to {hi:g} × the H100 SXM's roofline bound and below the H100's recorded "
         f"time at all {len(rows)} lengths ({source}).", *lines]))


# ----------------------------------------------------------------------------------- the lab
EXERCISES = (
    Exercise(function="matmul_cost", check=check_matmul_cost),
    Exercise(function="flash_forward_cost", check=check_flash_forward_cost),
    Exercise(function="decode_cost", check=check_decode_cost),
    Exercise(function="roofline", check=check_roofline),
    Exercise(function="predicted_qk_ms", check=check_prediction, depends=("matmul_cost", "roofline")),
)


def check_lab(*, seed: int | None = None, **functions):
    """Every exercise's check, in order, with a summary line."""
    return check_exercises(EXERCISES, functions, seed=seed)
