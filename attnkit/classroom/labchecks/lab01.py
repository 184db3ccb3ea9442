"""Checks for lab 01, attention by hand.

    by_hand()                                 exercise 1: one query of the 4×4 example, typed to 4 decimals
    scores(Q, K)                              exercise 2: S = Q Kᵀ / √d
    softmax_rows(S)                           exercise 3: a softmax of each row that never overflows
    attention(Q, K, V, causal=False)          exercise 4: softmax(Q Kᵀ/√d) V, with the causal mask
    sinusoidal_positions(n_positions, d_model) exercise 5: the sinusoidal position table

Each check runs fixed adversarial cases first (shapes where Nq, Nk, d and dv all differ, rows whose
maxima are thousands apart, scores that overflow ``exp``, a causal row whose hidden keys score
thousands above its visible ones, causal keys scoring exactly 0 or tied with a visible key, so that a
mask built from the scores' values fails; position tables of 66,000 rows and of 1024 columns, so that
a position or column index kept in int16, uint16, float16 or int8 fails), then cases drawn from
``seed`` (fresh ones when None), and compares with a float64 reference. Then every fixed case runs
again, followed by the same shapes with other values in the other memory order (a result, mask or
table kept from an earlier call fails), and an answer that writes into its inputs fails.
Exercise 3's S is a 2-D matrix, as the lab states: every case is
2-D, and an answer returning another shape is told so.

Precision: a float64 answer is held to ``TOL``. An answer returned as float32 is held to the float32
bound of ``attnkit.tolerances`` plus the rounding float32 cannot avoid on these inputs: the unit
roundoff u = 2⁻²⁴ times the condition of the case (``_Expected.condition``, e.g. the largest |score| for
a softmax: scores near 3000 are stored with an error of 3000·u ≈ 2e-4). A float16 answer gets no
allowance.

NumPy only: the lab asks for NumPy (and ``math``). While a check runs the student's function, every
PyTorch operator is recorded (a ``TorchDispatchMode``), the function and every function it uses are
read for names of other array libraries (``torch``, ``scipy``, ``jax``, …), and what it returns must be
a NumPy array (a tuple, a list or a number is reported as the wrong kind of result); any of these
fails the check with a message that says which. The course's own
implementations raise while the student's function runs.

Internal API for tests and scripts: ``within_bound(got, expected)``, the comparison every check makes
(finite, and a relative error within ``bound_for``).
"""
from __future__ import annotations

import math
import sys
from contextlib import contextmanager

import numpy as np

from ...reference import attention as _attention
from ...reference import example_4x4 as _example
from ...reference import online_softmax as _online
from ...reference import tiled_numpy as _tiled
from ...tolerances import REL_TOL, dtype_name, rel_error, tolerance
from ..checking import (
    FAILED,
    PASSED,
    CheckResult,
    Exercise,
    WrongResult,
    case,
    check_exercises,
    exercise_check,
    fixed_and_random,
    module_functions,
    not_an_array,
    not_implemented,
    run_check,
    wrong_kind,
)
from . import library_use
from .library_use import OTHER_LIBRARIES, code_objects, other_libraries_used, student_function

TOL = tolerance("float64") * 1e3   # float64 arithmetic in a different order: far below any real bug
UNIT_ROUNDOFF_FLOAT32 = float(np.finfo(np.float32).eps) / 2          # u = 2⁻²⁴

HINT_SCORES = "S[i, j] is the dot product of query i and key j, divided by √d with d = Q.shape[1]."
HINT_SOFTMAX = ("S is a matrix (2-D, one row per query): normalise along each row (axis=-1), and subtract "
                "EACH ROW's own maximum (S.max(axis=-1, keepdims=True)) before exp: one maximum for the whole "
                "matrix underflows the rows whose scores are far below it.")
HINT_ATTENTION = "P = softmax of each row of S = Q Kᵀ/√d, then O = P V, shape [Nq, dv]."
HINT_CAUSAL = ("mask before the softmax: query i may see keys j ≤ i (set S[i, j] = -inf for j > i, the "
               "diagonal stays visible), then softmax each row and multiply by V. Build the mask from the "
               "positions i and j (np.triu(np.ones(S.shape, dtype=bool), k=1)), never from the scores' "
               "values: a score of exactly 0 is a score like any other.")
HINT_POSITIONS = ("even columns 2i hold sin(pos / 10000^(2i/d_model)), odd columns 2i+1 the cos of the "
                  "same angle; positions start at 0.")


def _norm_ratio(absolute, exact) -> float:
    """‖absolute‖ / ‖exact‖ (1 when exact is 0): how much a relative error per term can grow."""
    exact_norm = float(np.linalg.norm(exact))
    return float(np.linalg.norm(absolute)) / exact_norm if exact_norm > 0 else 1.0


def reference_scores(Q, K):
    Q, K = np.asarray(Q, dtype=np.float64), np.asarray(K, dtype=np.float64)
    d = Q.shape[-1]
    S = Q @ K.T / math.sqrt(d)
    # float32: Q, K rounded and a d-term dot product: (d + 2)·u·(|Q| |K|ᵀ) per score.
    return _expected(S, (d + 2) * _norm_ratio(np.abs(Q) @ np.abs(K).T / math.sqrt(d), S))


def _softmax_condition(S) -> float:
    """Scores stored in float32 move by u·|s|: each weight moves by up to 2·u·max|s| relatively; exp,
    the sum over the row and the division add (row length + 4)·u."""
    finite = np.abs(S[np.isfinite(S)])
    return 2 * float(finite.max(initial=0.0)) + S.shape[-1] + 4


def reference_softmax(S):
    return _expected(_attention.softmax_np(S), _softmax_condition(np.asarray(S, dtype=np.float64)))


def reference_positions(n_positions, d_model):
    pos = np.arange(n_positions)[:, None]
    inv_freq = 1.0 / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((n_positions, d_model))
    pe[:, 0::2] = np.sin(pos * inv_freq)
    pe[:, 1::2] = np.cos(pos * inv_freq)
    # float32: an angle of up to n_positions − 1 radians is stored with an error of u·angle.
    return _expected(pe, math.sqrt(2) * (n_positions + 2))


def _reference_attention(Q, K, V, causal=False):
    Q, K, V = (np.asarray(a, dtype=np.float64) for a in (Q, K, V))
    out = _attention.attention_np(Q, K, V, causal=causal)
    d, n_k = Q.shape[-1], K.shape[0]
    score_error = (d + 2) * float((np.abs(Q) @ np.abs(K).T).max(initial=0.0)) / math.sqrt(d)
    P = _attention.softmax_np(np.where(np.triu(np.ones((len(Q), n_k), dtype=bool), k=1), -np.inf,
                                       Q @ K.T / math.sqrt(d)) if causal else Q @ K.T / math.sqrt(d))
    growth = _norm_ratio(P @ np.abs(V), out)
    return _expected(out, (2 * score_error + 2 * n_k + 6) * growth)


def forbidden() -> tuple:
    """The course's own implementations (the references and this module's functions): a student's
    function that calls one of them fails."""
    return module_functions(_attention, _online, _tiled, library_use, sys.modules[__name__])


# ------------------------------------------------------------------------------------ precision
class _Expected(np.ndarray):
    """A reference result that carries ``condition``: how many unit roundoffs of relative error an
    answer computed in float32 cannot avoid on this case (the inputs' rounding, amplified)."""

    condition: float = 1.0


def _expected(values, condition: float) -> _Expected:
    out = np.asarray(values, dtype=np.float64).view(_Expected)
    out.condition = float(condition)
    return out


def bound_for(got, expected) -> float:
    """The relative error allowed to ``got``: TOL for float64; for a float32 answer the float32 bound
    of ``attnkit.tolerances`` plus 4·u·condition (u = 2⁻²⁴); other dtypes (float16) get TOL."""
    try:
        name = dtype_name(getattr(got, "dtype", None))
    except ValueError:
        name = ""
    if name != "float32":
        return TOL
    return REL_TOL["float32"] + 4 * UNIT_ROUNDOFF_FLOAT32 * float(getattr(expected, "condition", 1.0))


def within_bound(got, expected) -> bool:
    """Whether ``got`` is finite and within ``bound_for(got, expected)`` of ``expected`` (relative error)."""
    err = rel_error(got, expected)
    return bool(np.isfinite(err) and err <= bound_for(got, expected))


# ------------------------------------------------------------------------------------ NumPy only
@contextmanager
def _torch_operators_recorded(seen: list):
    """While the block runs, every PyTorch operator (on any tensor) is appended to ``seen`` by name and
    then runs as usual. Only when PyTorch is loaded: without it no tensor can be made."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            seen.append(str(getattr(func, "__name__", func)))
            return func(*args, **(kwargs or {}))

    with Recorder():
        yield


def _numpy_only(student_fn, problems: list):
    """``student_fn`` run with PyTorch's operators recorded and its result's type checked; what breaks
    the rule goes into ``problems`` (the check fails on it after comparing)."""
    def call(*args, **kwargs):
        ops: list = []
        with _torch_operators_recorded(ops):
            out = student_fn(*args, **kwargs)
        if ops:
            problems.append(f"your function ran PyTorch operators ({', '.join(dict.fromkeys(ops[:5]))})")
        if out is not None and not isinstance(out, np.ndarray):
            # (no call to this module's functions here: they raise while the student's function runs)
            if str(getattr(type(out), "__module__", "")).split(".")[0] in OTHER_LIBRARIES:
                problems.append(f"your function returned a {type(out).__module__}.{type(out).__qualname__}, "
                                f"not a NumPy array")
            else:                                        # a tuple, a list, a number: the wrong kind of result
                raise WrongResult(wrong_kind(not_an_array(out, "NumPy array")))
        return out
    return call


NUMPY_ONLY = ("this lab is NumPy only (and `math`): write it with np.exp, np.max, @, … and return a "
              "NumPy array.")


def _check(name, student_fn, reference_fn, fixed, drawn, hint) -> CheckResult:
    used = other_libraries_used(student_fn)
    if used:
        return CheckResult(name, FAILED, f"❌ {name}: your function uses {', '.join(used)}: {NUMPY_ONLY}\n"
                                         f"   hint: {hint}")
    problems: list[str] = []
    result = run_check(name, _numpy_only(student_fn, problems), reference_fn, fixed + drawn, tol=TOL,
                       hint=hint, compare=within_bound, forbidden=forbidden(), fixed=len(fixed), again=len(fixed))
    if problems and result.status != "not implemented":
        return CheckResult(name, FAILED, f"❌ {name}: {problems[0]}: {NUMPY_ONLY}\n   hint: {hint}")
    return result


def _qkv(rng, n_q, n_k, d, d_v=None, scale=1.0):
    arrays = [rng.standard_normal((n_q, d)) * scale, rng.standard_normal((n_k, d)) * scale]
    if d_v is not None:
        arrays.append(rng.standard_normal((n_k, d_v)))
    return arrays


def _label(arrays) -> str:
    return ", ".join(f"{n} {a.shape}" for n, a in zip("QKV", arrays))


# Shapes where Nq, Nk, d and dv all differ (a transposed product or the wrong √ shows), d ≠ 4 (a
# hard-coded √4 = 2 shows), Nq = 1, and d < Nq.
FIXED_SHAPES = [(3, 5, 8, 2), (6, 4, 2, 3), (1, 7, 16, 5), (5, 3, 9, 4)]


# ------------------------------------------------------------------------------------ exercise 1
# A fifth query joins the lesson's example (its K and V unchanged): the lesson never prints its row.
HAND_QUERY = np.array([2.0, 0.0, 0.0, 1.0])
# 4 decimals, rounded once at the end: within half a unit of the 4th decimal of the exact value (a
# truncated number, or one rounded before the last step, can be a whole unit off). 1e-9 absorbs the
# binary representation of a typed decimal.
HAND_TOL = 0.5e-4 + 1e-9
HAND_PARTS = (("scores", 4, "s_j = q·k_j / √d (d = 4, so divide by 2)"),
              ("weights", 4, "p_j = exp(s_j − max s) / Σ exp(s_k − max s); the four add up to 1"),
              ("output", 2, "o = Σ p_j v_j, a vector of d_v = 2 numbers"))
HINT_HAND = ("with a pencil or a calculator: first the four scores of q = (2, 0, 0, 1) against the keys of "
             "the example, then the weights, then the output; keep full precision and round to 4 "
             "decimals only at the end.")


def reference_by_hand() -> dict:
    s = _example.K @ HAND_QUERY / math.sqrt(len(HAND_QUERY))
    p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    return {"scores": s, "weights": p, "output": p @ _example.V}


def _typed_numbers(fn) -> str | None:
    """None when the student's ``fn`` only returns numbers typed into it (or when its code is not in
    this process: the values are still checked); otherwise the names it computes with."""
    fn = student_function(fn)
    if fn is None:
        return None
    names = sorted({n for c in code_objects(fn.__code__) for n in c.co_names})
    return ", ".join(names) if names else None


def _how_far(difference: float) -> str:
    """How far a typed number is from the exact value, in a band that does not give the value away."""
    size = abs(difference)
    if not math.isfinite(size):
        return "a non-finite amount"
    for limit, words in ((1e-4, "less than 0.0001 (one unit of the 4th decimal)"),
                         (1e-3, "between 0.0001 and 0.001"), (1e-2, "between 0.001 and 0.01"),
                         (1e-1, "between 0.01 and 0.1")):
        if size < limit:
            return words
    return "more than 0.1"


def _check_by_hand(by_hand, *, seed: int | None = None) -> CheckResult:
    """by_hand() -> (scores, weights, output) of the query (2, 0, 0, 1) against the example's K and V,
    typed to 4 decimals: 4, 4 and 2 numbers. ``seed`` is accepted for the common interface."""
    name = "by_hand"
    try:
        got = by_hand()
    except NotImplementedError:
        return not_implemented(name)
    except Exception as exc:  # a typo in the student's numbers: report it
        return CheckResult(name, FAILED, f"❌ {name}: your function raised {type(exc).__name__}: {exc}\n"
                                         f"   hint: {HINT_HAND}")
    uses = _typed_numbers(by_hand)
    if uses:
        return CheckResult(name, FAILED, f"❌ {name}: type the numbers you found (this exercise is done by "
                                         f"hand); your function computes with {uses}.\n   hint: {HINT_HAND}")
    want = reference_by_hand()
    if not (isinstance(got, (tuple, list)) and len(got) == 3):
        return CheckResult(name, FAILED, f"❌ {name}: return three lists (scores, weights, output), got "
                                         f"{type(got).__name__}.\n   hint: {HINT_HAND}")
    for (part, size, rule), values in zip(HAND_PARTS, got):
        try:
            numbers = [float(v) for v in values]
        except (TypeError, ValueError):
            numbers = None
        if numbers is None or len(numbers) != size:
            return CheckResult(name, FAILED, f"❌ {name}: the {part} must be a list of {size} numbers, got "
                                             f"{values!r}.\n   hint: {rule}")
        wrong = [j for j, (g, w) in enumerate(zip(numbers, want[part])) if not abs(g - w) <= HAND_TOL]
        if wrong:
            j = wrong[0]
            return CheckResult(name, FAILED,
                               f"❌ {name}: the {part}: your entry {j} ({numbers[j]:.4f}) is off by "
                               f"{_how_far(numbers[j] - want[part][j])} ({len(wrong)} of {size} entries are "
                               f"off by more than 0.00005, half a unit of the 4th decimal).\n   hint: {rule}"
                               + ("; round once, at the end, to the nearest 4th decimal (not cut off)"
                                  if abs(numbers[j] - want[part][j]) < 2e-4 else ""))
    return CheckResult(name, PASSED, f"✅ {name}: the scores, the weights and the output are right to 4 decimals.")


# ------------------------------------------------------------------------------------ exercise 2
def _check_scores(scores, *, seed: int | None = None) -> CheckResult:
    """scores(Q, K) -> S = Q Kᵀ / √d, shape [Nq, Nk]."""
    fixed = [case(_example.Q.astype(float), _example.K.astype(float), label="the 4×4 example of lesson 1")]
    rng = np.random.default_rng(1)
    fixed += [case(*a, label=_label(a)) for a in (_qkv(rng, *s[:3]) for s in FIXED_SHAPES)]
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(4):
        n_q, n_k, d = (int(x) for x in rng.integers(1, 13, 3))
        a = _qkv(rng, n_q, n_k, 2 * d + 1)
        drawn.append(case(*a, label=_label(a)))
    return _check("scores", scores, reference_scores, fixed, drawn, HINT_SCORES)


# ------------------------------------------------------------------------------------ exercise 3
def _spread_rows(rng, rows, cols, spread):
    """Scores whose rows sit at very different heights: row maxima up to ``spread`` apart."""
    offsets = rng.uniform(-spread, spread, (rows, 1))
    offsets[0, 0], offsets[-1, 0] = -spread, spread         # at least one pair of rows far apart
    return rng.standard_normal((rows, cols)) * 3 + offsets


def _matrix_in_matrix_out(softmax_rows, problems: list):
    """``softmax_rows`` called on a case's S; an answer whose result is not a matrix of S's shape goes
    into ``problems`` in the exercise's words (the exercise promises a 2-D S and its 2-D weights)."""
    def call(S):
        out = softmax_rows(S)
        shape = getattr(out, "shape", None)
        if shape is not None and tuple(shape) != tuple(np.shape(S)):
            problems.append(f"S is a matrix of shape {np.shape(S)} (2-D: one row of scores per query); your "
                            f"function returned an array of shape {tuple(shape)}. Return the weights as a "
                            f"matrix of S's shape, each row normalised on its own")
        return out
    return call


def _check_softmax(softmax_rows, *, seed: int | None = None) -> CheckResult:
    """softmax_rows(S) -> each row of the matrix S (2-D, [rows, cols]) turned into weights that are
    positive and sum to 1. The exercise speaks of a matrix: every case is 2-D, and an answer that
    returns another shape (or rank) fails with a message that says so. Normalising over axis 1 or over
    axis -1 is the same thing here."""
    rng = np.random.default_rng(2)
    masked = rng.standard_normal((4, 4))
    masked[np.triu_indices(4, k=1)] = -np.inf
    fixed = [
        case(np.array([[0.0, 1.0, 2.0], [2000.0, 2001.0, 1999.0], [-1500.0, -1502.0, -1501.0]]),
             label="3 rows near 0, 2000 and -1500 (one maximum for all rows underflows two of them)"),
        case(rng.standard_normal((2, 6)) * 50 + 800, label="2×6 scores near 800 (exp(800) overflows)"),
        case(_spread_rows(rng, 4, 4, 1200), label="4×4 scores, rows up to 2400 apart"),
        case(_spread_rows(rng, 5, 2, 900), label="5×2 scores (more rows than columns), rows far apart"),
        case(rng.standard_normal((1, 7)) * 4, label="a single row of 7 scores"),
        case(masked, label="4×4 scores with -inf above the diagonal (a causal mask)"),
        case(np.array([[-1000.0, 0.0, 1000.0], [5.0, -1500.0, 1400.0]]),
             label="2 rows whose scores spread over 2900 (a shift by the row's mean, not its maximum, overflows)"),
    ]
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(4):
        rows, cols = (int(x) for x in rng.integers(2, 10, 2))
        S = _spread_rows(rng, rows, cols, float(rng.uniform(800, 3000)))
        drawn.append(case(S, label=f"{rows}×{cols} scores, rows far apart"))
    shape_problems: list[str] = []
    result = _check("softmax_rows", _matrix_in_matrix_out(softmax_rows, shape_problems), reference_softmax,
                    fixed, drawn, HINT_SOFTMAX)
    if result.status == FAILED and shape_problems and "expected shape" in result.report:
        where = result.report.split(": differs from")[0]
        return CheckResult("softmax_rows", FAILED, f"{where}: {shape_problems[0]}.\n   hint: {HINT_SOFTMAX}")
    if result.passed:
        return CheckResult("softmax_rows", result.status,
                           f"✅ softmax_rows: matches the float64 reference on "
                           f"{fixed_and_random(len(fixed), len(drawn))} (S a 2-D matrix).")
    return result


# ------------------------------------------------------------------------------------ exercise 4
def _far_apart_rows(rng, n_q, n_k, d=4, d_v=3):
    """Q, K, V where the rows of S sit near 0, ±1000 and ±2000: one maximum for all rows underflows."""
    Q, K, V = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d)), rng.standard_normal((n_k, d_v))
    K[:, 0] = rng.uniform(1.0, 1.5, n_k)                      # every key leans the same way
    Q[:, 0] = np.resize([0.0, 2000.0, -2000.0, 4000.0, -4000.0], n_q)
    return Q, K, V


def _hidden_keys_far_above(rng, n, d=4, d_v=3, gap=4000.0):
    """Causal Q, K, V where every key j scores j·gap/√d·… above key 0 for every query: the keys a query
    may not see score thousands above those it sees, so a finite additive mask (−1000, −10⁴) leaves
    them the largest weights."""
    Q, K, V = rng.standard_normal((n, d)), rng.standard_normal((n, d)), rng.standard_normal((n, d_v))
    Q[:, 0] = 2.0 * math.sqrt(d)
    K[:, 0] = gap * np.arange(n) / 2.0                            # s[i, j] ≈ gap·j: rising along the keys
    return Q, K, V


def _scores_exactly_zero_and_tied():
    """Causal Q, K, V (d = 4, so 1/√d = 1/2 is exact) whose scores are exact small numbers: key 2 is
    all zeros, so it scores exactly 0 for every query (hidden from queries 0 and 1, visible to the
    others, the diagonal of query 2 included), and key 4 repeats key 0, so each query's hidden key 4
    scores exactly what its visible key 0 does. A mask built from the scores' values (``S != 0``,
    ``np.triu(S, 1) != 0``, ``np.tril(S)`` with its zeros hidden, or a value shared with a visible
    score) hides or shows the wrong keys; a mask built from the positions does not."""
    Q = np.array([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, -1.0], [1.0, 1.0, 0.0, 0.0], [-1.0, 0.0, 1.0, 1.0],
                  [0.0, -1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0]])
    K = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, -1.0, 1.0],
                  [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, -1.0]])
    V = np.array([[1.0, 0.0, 0.5], [0.0, 2.0, 0.0], [-3.0, 1.0, 2.0], [0.5, -1.0, 1.0], [4.0, 3.0, -2.0],
                  [-1.0, 0.5, 3.0]])
    return Q, K, V


def _check_attention(attention, *, seed: int | None = None) -> CheckResult:
    """attention(Q, K, V, causal=False) -> softmax(Q Kᵀ/√d) V, with the causal mask when asked."""
    ex = [a.astype(float) for a in (_example.Q, _example.K, _example.V)]
    rng = np.random.default_rng(3)
    plain = [case(*ex, label="the 4×4 example of lesson 1")]
    plain += [case(*a, label=_label(a)) for a in (_qkv(rng, *s) for s in FIXED_SHAPES)]
    plain += [case(*_qkv(rng, 3, 6, 4, 2, scale=8.0), label="Q (3, 4), K (6, 4) with scores in the hundreds")]
    plain += [case(*_far_apart_rows(rng, 5, 7), label="Q (5, 4), K (7, 4), rows whose scores are thousands apart")]
    causal = [case(*ex, causal=True, label="the 4×4 example, causal")]
    causal += [case(*_far_apart_rows(rng, 6, 6), causal=True, label="6×6, rows thousands apart, causal")]
    causal += [case(*_qkv(rng, 6, 6, 3, 2, scale=6.0), causal=True, label="6×6, scores in the tens, causal")]
    causal += [case(*_qkv(rng, 1, 1, 4, 3), causal=True, label="one query and one key, causal")]
    causal += [case(*_hidden_keys_far_above(rng, 5), causal=True,
                    label="5×5, causal, each hidden key scoring 4000 more than the key before it "
                          "(a mask of -1000 or -10⁴ does not hide it)")]
    causal += [case(*_scores_exactly_zero_and_tied(), causal=True,
                    label="6×6, causal, key 2 scoring exactly 0 for every query and key 4 scoring what key 0 "
                          "does (a mask built from the scores' values, not from i and j, shows)")]
    rng = np.random.default_rng(seed)
    drawn_plain, drawn_causal = [], []
    for _ in range(3):
        n_q, n_k, d, d_v = (int(x) for x in rng.integers(1, 12, 4))
        a = _qkv(rng, n_q, n_k, d + 1, d_v)
        drawn_plain.append(case(*a, label=_label(a)))
        n = int(rng.integers(3, 12))
        a = _qkv(rng, n, n, int(rng.integers(1, 9)), int(rng.integers(1, 6)), scale=3.0)
        zero = int(rng.integers(1, n - 1))                 # a key scoring exactly 0: hidden from some queries,
        a[1][zero] = 0.0                                   # visible to the others
        drawn_causal.append(case(*a, causal=True, label=_label(a) + f", causal, key {zero} all zeros (it scores "
                                                                     f"exactly 0)"))
    first = _check("attention", attention, _reference_attention, plain, drawn_plain, HINT_ATTENTION)
    if not first.passed:
        return first
    second = _check("attention", attention, _reference_attention, causal, drawn_causal, HINT_CAUSAL)
    if not second.passed:
        return second
    n_fixed, n_drawn = len(plain) + len(causal), len(drawn_plain) + len(drawn_causal)
    return CheckResult("attention", second.status, f"✅ attention: matches the float64 reference on "
                                                   f"{fixed_and_random(n_fixed, n_drawn)}.")


# ------------------------------------------------------------------------------------ exercise 5
# Sizes past the range of the narrow types an index could be kept in: a position in int16 wraps past
# 32767, in uint16 past 65535, in float16 rounds past 2048 (to multiples of 32 near 66000) and becomes inf
# past 65504; a column index 2i in int8 wraps past 127, in uint8 past 255.
BIG_SIZES = ((66_000, 2, "positions past 32767, 65535 and float16's 65504: kept in int16, uint16 or float16 "
                         "they wrap or round"),
             (3, 1024, "column indices 2i up to 1022: kept in int8 or uint8 they wrap"))


def _check_positions(sinusoidal_positions, *, seed: int | None = None) -> CheckResult:
    """sinusoidal_positions(n_positions, d_model) -> PE [n_positions, d_model] (float64 or float32)."""
    # Several positions and d_model ≥ 4, so that a wrong exponent (i/d instead of 2i/d) or base shows;
    # d_model = 6 is not a multiple of 4; 128 positions make large angles. Each argument also comes again
    # with the other one changed (10 positions at d_model 6 then 16; d_model 16 at 50 then 4 positions), so
    # a table kept from an earlier call and looked up by one argument alone fails.
    # Every index is taken past the narrow number types it could be held in (BIG_SIZES): positions past
    # int16's 32767, uint16's 65535 and float16's 65504 (whole numbers exact only to 2048), and column
    # indices 2i past int8's 127 and uint8's 255; a position or column that wraps or rounds changes its
    # angle by hundreds of radians.
    sizes = ((4, 4), (10, 6), (50, 16), (128, 64), (10, 16), (4, 16))
    fixed = [case(n, d, label=f"{n} positions, d_model={d}") for n, d in sizes]
    fixed += [case(n, d, label=f"{n} positions, d_model={d} ({why})") for n, d, why in BIG_SIZES]
    rng = np.random.default_rng(seed)
    ranges = [((2, 9), (2, 5)), ((10, 65), (4, 17)), ((2, 6), (16, 33)), ((65, 129), (8, 33))]
    sizes = [(int(rng.integers(*n)), 2 * int(rng.integers(*half))) for n, half in ranges]
    drawn = [case(n, d, label=f"{n} positions, d_model={d}") for n, d in sizes]
    return _check("sinusoidal_positions", sinusoidal_positions, reference_positions, fixed, drawn, HINT_POSITIONS)


# ------------------------------------------------------------------------------------ the lab
EXERCISES = (
    Exercise(function="by_hand", check=_check_by_hand),
    Exercise(function="scores", check=_check_scores),
    Exercise(function="softmax_rows", check=_check_softmax),
    Exercise(function="attention", check=_check_attention, depends=("scores", "softmax_rows")),
    Exercise(function="sinusoidal_positions", check=_check_positions),
)

check_by_hand = exercise_check(EXERCISES, "by_hand")
check_scores = exercise_check(EXERCISES, "scores")
check_softmax = exercise_check(EXERCISES, "softmax_rows")
check_attention = exercise_check(EXERCISES, "attention")
check_positions = exercise_check(EXERCISES, "sinusoidal_positions")


def check_lab(*, seed: int | None = None, **functions):
    """Every exercise's check: ``check_lab(by_hand=by_hand, scores=scores, softmax_rows=softmax_rows,
    attention=attention, sinusoidal_positions=sinusoidal_positions)``."""
    return check_exercises(EXERCISES, functions, seed=seed)
