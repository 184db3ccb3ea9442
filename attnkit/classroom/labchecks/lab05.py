"""Checks for lab 05, the FlashAttention forward kernel in Triton, written whole by the student.

Each check calls the student's launch function ``flash_forward(q, k, v, causal=...) -> (o, lse)`` (the
lab gives it; it launches the student's kernel) on fp16 inputs of small shapes (the lab's contract: q, k
and v are fp16 only, as its text states, so a kernel that converts p with ``p.to(tl.float16)`` where the
solution writes ``p.to(v.dtype)`` is right by it), on the course's device
(Triton's interpreter on a CPU), and compares o and the fp32 natural-log LSE of each row with a float64
reference (a row that sees no key: o = 0, LSE = −inf):

    check_forward(flash_forward)   the online-softmax loop (no mask, Hq = Hkv), D not a power of two
    check_causal(flash_forward)    the causal mask aligned to the end, the loop bound, rows that see no key
    check_gqa(flash_forward)       grouped-query heads, h → h // (Hq // Hkv)
    check_lab(flash_forward=...)   all three, with a summary line

Each check runs fixed adversarial cases first, the same on every run, then cases drawn from ``seed``
(fresh ones when None). The fixed cases are built for the lab's 16 × 16 tiles: lengths k·16 and
k·16 ± 1, sequences spanning three or more tiles, Nq = 1 and Nq > Nk, the last key a causal tile sees at
the start of a key tile, score gaps of hundreds (exp overflows fp32 without a per-row maximum, and
underflows without a running one), rows whose every score is −2³² (``DEEP``: a finite stand-in for −inf,
−1e4 or −1e9, for the padding keys, the hidden ones or the maximum's start or floor, takes over there),
D = 24, a 33-tile row whose small late terms fp16 running sums drop, a key holding a tenth of the weight
(the scores' scale must be exact: log₂e cut to 1.44 fails), and head counts where every wrong head
mapping reads another head. q, k and v each have their own memory layout (``LAYOUTS``: a kernel that
reads one through another's strides, or ignores the column stride, fails) inside a buffer of NaN (a load
past an edge, or a masked load without ``other=``, gives NaN); o and lse, allocated by the launch
function, sit between sentinels checked after the call; and on a CPU the cases run in a child process,
so a kernel that crashes it fails with the case it was on. Each row's o is judged against the size of
its terms, |P|·|V|, with the float16 bound, on a CPU and a GPU alike; each row's LSE, computed in
float32, is held to a float32 bound (``LSE_EPS``) relative to its largest score, so an error in the
scores' scale that o's fp16 bound cannot see (log2(e) typed 1.4427) fails.

While the student's function runs, the course's own attention code (``attnkit.kernels.flash``,
``attnkit.kernels.paged``, the references), PyTorch's ``scaled_dot_product_attention`` and PyTorch's
matrix products, softmax and exp raise: the lab asks for the student's kernel.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...device import runtime
from ...reference.attention import attention_ref  # noqa: F401  (the course's reference, guarded while students run)
from ...tolerances import check_tolerance, componentwise_error, with_magnitude
from ..checking import (
    FAILED,
    CheckResult,
    Exercise,
    WrongResult,
    case,
    check_exercises,
    is_not_implemented,
    placed,
    student_error,
    wrong_kind,
)
from .course_code import (  # noqa: F401  (re-exported: lab 05's guards, as the labs and the timing worker name them)
    GUARDED_MODULES,
    course_code_forbidden,
    course_kernel_modules,
    guarded_check,
    torch_compute_forbidden,
    used_course_code,
)

DTYPE_NAME = "float16"
BLOCK = 16                                  # the lab's BLOCK_M = BLOCK_N

HINT_FORWARD = ("keep a running max m, sum l and accumulator acc per query row (m starts at −inf); for "
                "each K/V tile: s = q·kᵀ·scale with keys j ≥ Nk set to −inf, m_new = max(m, rowmax(s)), "
                "alpha = exp(m − m_new), p = exp(s − m_new), l = l·alpha + rowsum(p), "
                "acc = acc·alpha + p·v (rescale acc!), all three in float32; after the loop divide acc by "
                "l, once, and store LSE = m + log(l). Load q, k, v through all four of their strides with "
                "masks on the rows AND on the columns d ≥ D (the tile is the next power of two wide) and "
                "other=0.")
HINT_NO_KEY = (" A row that sees no key has m = −inf: use 0 in its place inside exp (exp(−inf − 0) = 0, "
               "not NaN), and at the end store o = 0 and LSE = −inf for it.")
HINT_CAUSAL = ("query i sees key j iff j ≤ i + Nk − Nq (the mask is aligned to the END of the keys, "
               "so with Nq < Nk the last query sees every key); the loop stops at `hi`, ONE PAST the last "
               "key the tile's last real row sees (an off-by-one drops that key when it starts a key "
               "tile), and hidden scores are −inf before the row max.") + HINT_NO_KEY
HINT_GQA = ("query head h shares the K/V of head h // (Hq // Hkv) = h // GROUP: consecutive query heads "
            "form a group (not h % Hkv, which interleaves them, nor h // Hkv).")



# ----------------------------------------------------------------------------------- the inputs
def _seed(seed: int | None) -> int:
    return int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed


# Memory orders of the [B, H, N, D] dimensions (outermost first) and the gap after each run: case c gives
# q, k, v the layouts (c, c + 1, c + 2) mod 5, so every tensor meets every layout and never shares its
# siblings' strides; two of them put D outside N (a column stride that is not 1).
LAYOUTS = (((0, 1, 2, 3), 0), ((0, 2, 1, 3), 3), ((1, 0, 3, 2), 1), ((2, 0, 1, 3), 5), ((0, 1, 3, 2), 2))


def _placed(t, index: int):
    """``t`` (fp16, on the course's device) in layout ``LAYOUTS[index % 5]`` inside a buffer of NaN: a
    read past an edge, or a masked load without ``other=``, makes the answer NaN."""
    import torch

    order, gap = LAYOUTS[index % len(LAYOUTS)]
    return placed(t, order=order, gap=gap, dtype=torch.float16, device=runtime().device)


def _normal_qkv(gen, b, hq, hkv, nq, nk, d):
    import torch

    return (torch.randn(b, hq, nq, d, generator=gen), torch.randn(b, hkv, nk, d, generator=gen),
            torch.randn(b, hkv, nk, d, generator=gen))


def _gap_qkv(gen, b, hq, hkv, nq, nk, d):
    """Scores of ±192 in the first query rows of every head: row 0 sees +192 in key tile 0 and −192
    after it, row 1 the reverse, every score of row 2 is −192, row 3 sees scores near 0 (in the same
    query tile as rows 0 and 1). Without a per-row running maximum, exp overflows or underflows."""
    import torch

    q, k, v = _normal_qkv(gen, b, hq, hkv, nq, nk, d)
    k = 0.25 * k
    k[..., 1] += 8.0
    k[..., :BLOCK, 0] += 8.0
    k[..., BLOCK:, 0] -= 8.0
    q[..., 0, :] = 0.0
    q[..., 0, 0] = 96.0
    q[..., 1, :] = 0.0
    q[..., 1, 0] = -96.0
    q[..., 2, :] = 0.0
    q[..., 2, 1] = -96.0
    q[..., 3, :] = 0.01 * torch.randn(q[..., 3, :].shape, generator=gen)
    return q, k, v


def _lone_qkv(lead: float, opposite: bool):
    """Key 0 scores ``lead`` above every other key for every query. ``lead`` 11.5, ``opposite``: each
    other key weighs e^−11.5 ≈ 10⁻⁵ and its value points the other way from key 0's, so a tile of 16
    adds less than half an fp16 ulp to ℓ ≈ 1 and to acc: fp16 running sums drop every later tile (about
    1% of a 500-key answer). ``lead`` ln(9 (Nk − 1)), the other values near 0: key 0 holds a tenth of
    the weight and makes the answer, and a 0.2% error in the scores' scale (log2(e) cut to 1.44) moves
    that weight, and the answer, by 1.2%."""
    def make(gen, b, hq, hkv, nq, nk, d):
        import torch

        q, k, v = _normal_qkv(gen, b, hq, hkv, nq, nk, d)
        q, k, v = 0.02 * q, 0.02 * k, 0.05 * v
        q[..., 0] = d / 4.0
        k[..., 0] = 0.0
        k[..., 0, 0] = lead * 4.0 / d ** 0.5              # (d/4) · k₀ / √d = lead
        direction = torch.randn(b, hkv, 1, d, generator=gen)
        v[..., :1, :] += direction
        if opposite:
            v[..., 1:, :] -= direction
        return q, k, v
    return make


def _hidden_high_qkv(gen, b, hq, hkv, nq, nk, d):
    """Keys 8 and later score +200 with every query, keys 0 to 7 score −200: queries 0 to 7 (causal,
    Nq = Nk) see only keys that score −200 while keys they may not see, in the same tile, score +200. A
    row maximum taken before the causal mask is +200, and exp(−400) underflows: the row becomes 0/0."""
    q, k, v = _normal_qkv(gen, b, hq, hkv, nq, nk, d)
    q, k = 0.02 * q, 0.02 * k
    q[..., 0] = 20.0
    k[..., :8, 0] = -40.0                                 # 20 · (±40) / √16 = ±200
    k[..., 8:, 0] = 40.0
    return q, k, v


# Every score of a "deep" case: q = +2¹⁵ and k = −2¹⁵ in every column (both exact in fp16), D = 16, so each
# score is −16 · 2³⁰ / 4 = −2³², exactly, in fp32 and in any order of summation (every partial sum is a
# power of two): equal along every row, far below any finite stand-in for −inf a kernel might use
# (−1e4, −65504, −1e9). A right kernel gives o = the mean of the V rows the row sees and
# LSE = −2³² + ln(their count). The rule: any finite sentinel, for the padding keys (j ≥ Nk), the hidden
# keys or the running maximum's start or floor, that a row's real scores may all lie below, takes the
# place of the row's maximum there (o becomes the padding's zeros, or 0/0; the LSE the sentinel's).
DEEP = 2.0 ** 15


def _deep_qkv(gen, b, hq, hkv, nq, nk, d):
    """q = +DEEP, k = −DEEP everywhere (every score −DEEP²·√d), v normal."""
    import torch

    _, _, v = _normal_qkv(gen, b, hq, hkv, nq, nk, d)
    return torch.full((b, hq, nq, d), DEEP), torch.full((b, hkv, nk, d), -DEEP), v


VALUES = {"normal": _normal_qkv, "deep": _deep_qkv, "hidden_high": _hidden_high_qkv, "gaps": _gap_qkv,
          "long": _lone_qkv(11.5, True), "tenth": _lone_qkv(float(np.log(9 * 159)), False),
          "fifth": _lone_qkv(float(np.log(255 / 4)), False)}


def _make_case(gen, shape, causal: bool, index: int, note: str = "", values: str = "normal"):
    b, hq, hkv, nq, nk, d = shape
    q, k, v = VALUES[values](gen, b, hq, hkv, nq, nk, d)
    q, k, v = (_placed(t, index + i) for i, t in enumerate((q, k, v)))
    label = f"B={b}, Hq={hq}, Hkv={hkv}, Nq={nq}, Nk={nk}, D={d}{', causal' if causal else ''}"
    return case(q, k, v, causal, label=f"{label}{f' ({note})' if note else ''}")


_FIXED_CASES: dict = {}


def _cases(fixed, random_shapes, causal: bool, seed: int | None):
    """The fixed cases (their own generator, the same on every run, built once per device), then the
    seeded ones."""
    import torch

    key = (fixed, causal, runtime().device)
    if key not in _FIXED_CASES:
        fixed_gen = torch.Generator().manual_seed(20_505)
        _FIXED_CASES[key] = [_make_case(fixed_gen, shape, causal, index, note, values)
                             for index, (shape, note, values) in enumerate(fixed)]
    gen = torch.Generator().manual_seed(_seed(seed))
    return _FIXED_CASES[key] + [_make_case(gen, shape, causal, len(fixed) + i)
                                for i, shape in enumerate(random_shapes(np.random.default_rng(_seed(seed))))]


# (B, Hq, Hkv, Nq, Nk, D), what the case is for, its values (VALUES)
FORWARD_FIXED = (
    ((1, 1, 1, 20, 40, 16), "scores ±192: exp overflows without a per-row running maximum", "gaps"),
    ((1, 1, 1, 33, 33, 16), "33 = 2·16 + 1: the last tile holds one key", "normal"),
    ((1, 2, 2, 47, 48, 16), "Nq = 3·16 − 1, Nk = 3·16", "normal"),
    ((1, 1, 1, 1, 49, 32), "Nq = 1: one query over four key tiles", "normal"),
    ((2, 1, 1, 40, 17, 16), "Nq > Nk", "normal"),
    ((1, 1, 1, 9, 21, 24), "D = 24, not a power of two: pad the tile to 32 and mask the columns", "normal"),
    ((1, 1, 1, 16, 528, 16), "33 key tiles, key 0 holds almost all the weight: fp16 running sums drop the rest",
     "long"),
    ((1, 1, 1, 5, 160, 16), "key 0 holds a tenth of the weight: the scores' scale must be exact", "tenth"),
    ((1, 1, 1, 4, 256, 16), "key 0 scores ln(255/4) above 255 others and holds a fifth of the weight: the LSE "
     "moves by the scale's error times 3.3", "fifth"),
    ((1, 1, 1, 5, 20, 16), "every score −2³², equal along each row: o is the mean of V's 20 rows, the LSE "
     "−2³² + ln 20; a finite −inf (−1e4, −1e9) for keys 20..31 or for the running maximum takes over", "deep"),
)
CAUSAL_FIXED = (
    ((1, 1, 1, 33, 33, 16), "query 32 sees key 32, the first key of tile 2", "normal"),
    ((1, 1, 1, 18, 35, 16), "Nq < Nk: query 15 sees keys up to 32, the first key of tile 2", "normal"),
    ((1, 1, 1, 1, 33, 16), "Nq = 1, a decoding step: it sees all 33 keys", "normal"),
    ((1, 2, 2, 32, 32, 16), "Nq = Nk = 2·16", "normal"),
    ((1, 1, 1, 20, 47, 16), "scores ±192 and Nq < Nk", "gaps"),
    ((1, 1, 1, 40, 21, 16), "Nq > Nk: queries 0..18 see no key (o = 0, LSE = −inf)", "normal"),
    ((1, 1, 1, 16, 16, 16), "queries 0..7 see keys scoring −200; keys they may not see score +200", "hidden_high"),
    ((1, 1, 1, 24, 21, 16), "every score −2³²: query i ≥ 3 sees keys 0..i − 3 (o their mean), queries 0..2 none; "
     "a finite −inf (−1e4, −1e9) for hidden keys, for the maximum, or to tell rows that see no key takes over",
     "deep"),
)
GQA_FIXED = (
    ((2, 6, 3, 9, 17, 16), "3 groups of 2 query heads", "normal"),
    ((1, 4, 1, 9, 20, 16), "multi-query: 4 query heads share one KV head", "normal"),
    ((1, 8, 2, 5, 33, 16), "2 groups of 4 query heads", "normal"),
)


def _random_forward(rng):
    return [(int(rng.integers(1, 3)), h, h, int(rng.integers(1, 50)), int(rng.integers(1, 50)),
             int(rng.choice([16, 24, 32]))) for h in (1, 2)]


def _random_causal(rng):
    shapes = []
    for _ in range(2):
        nk = int(rng.integers(2, 50))
        shapes.append((1, int(rng.integers(1, 3)), 1, int(rng.integers(1, nk + 8)), nk, 16))
    return [(b, h, h, nq, nk, d) for b, h, _, nq, nk, d in shapes]


def _random_gqa(rng):
    shapes = []
    for hkv, group in ((int(rng.integers(1, 4)), int(rng.integers(2, 4))), (2, 2)):
        shapes.append((int(rng.integers(1, 3)), hkv * group, hkv, int(rng.integers(1, 20)),
                       int(rng.integers(1, 34)), 16))
    return shapes


# ----------------------------------------------------------------------------------- the checks
NO_KEY = -1.0e4        # stands for the LSE (−inf) of a row that sees no key, in the compared arrays


class _Compared(np.ndarray):
    """The compared array, with ``no_key``: which rows' LSE was −inf (shown as NO_KEY). A row that sees no
    key must store −inf itself: a finite stand-in (−1e4 is NO_KEY's own value) fails, as the lab asks."""
    no_key = None


def _as_compared(o, lse):
    """o and lse in one float64 array [B, H, Nq, D + 1] (lse last; −inf as NO_KEY), as the check compares."""
    import torch

    o64 = o.detach().to("cpu", torch.float64)
    lse64 = lse.detach().to("cpu", torch.float64)
    no_key = torch.isneginf(lse64)
    lse64 = torch.where(no_key, torch.full_like(lse64, NO_KEY), lse64)
    out = torch.cat([o64, lse64[..., None]], dim=-1).numpy().view(_Compared)
    out.no_key = no_key.numpy()
    return out


def _student(flash_forward: Callable) -> Callable:
    """The student's function, with Triton's wrapping of errors taken off for a readable report; its
    (o, lse) are handed to the comparison as one array (``_as_compared``)."""
    import torch

    def call(q, k, v, causal):
        try:
            got = flash_forward(q, k, v, causal=causal)
        except Exception as exc:
            if is_not_implemented(exc):
                raise NotImplementedError from None
            if used_course_code(exc):
                raise
            raise student_error(exc) from None           # the error in the student's kernel line
        if got is None:
            return None
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
            # the check's verdict on what came back (reported as is, not as an error the student's code raised)
            what = (f"a {type(got).__name__} of {len(got)} items" if isinstance(got, (tuple, list))
                    else f"a {type(got).__name__}")
            if isinstance(got, (tuple, list)) and len(got) == 2:
                what += f" ({type(got[0]).__name__}, {type(got[1]).__name__})"
            raise WrongResult(wrong_kind(f"flash_forward must return (o, lse), two tensors; got {what}"))
        o, lse = got
        if tuple(o.shape) != tuple(q.shape) or tuple(lse.shape) != tuple(q.shape[:3]):
            raise WrongResult(wrong_kind(f"expected o {list(q.shape)} and lse {list(q.shape[:3])}, got "
                                         f"{list(o.shape)} and {list(lse.shape)}"))
        return _as_compared(o, lse)
    return call


def _reference(q, k, v, causal):
    """float64 (o, lse) as one array (``_as_compared``), with its magnitude: |P|·|V| for o, 0 for the
    LSE, whose error counts in its row against the size of o's terms."""
    import torch

    q64, k64, v64 = (t.detach().to("cpu", torch.float64) for t in (q, k, v))
    group = q64.shape[1] // k64.shape[1]
    k64, v64 = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    scores = q64 @ k64.transpose(-1, -2) / np.sqrt(q64.shape[-1])
    if causal:
        n_q, n_k = scores.shape[-2:]
        hidden = torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + (n_k - n_q)
        scores = scores.masked_fill(hidden, -np.inf)
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.exp(scores - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    ref = _as_compared(p @ v64, lse)
    magnitude = np.concatenate([(p @ v64.abs()).numpy(), np.zeros(tuple(lse.shape) + (1,))], axis=-1)
    ref = with_magnitude(ref, magnitude)
    seen = torch.isfinite(scores)
    largest = torch.where(seen, scores.abs(), 0.0).amax(dim=-1).numpy()
    ref.lse_bound = LSE_EPS * np.finfo(np.float32).eps * (largest + np.log(np.maximum(seen.sum(-1).numpy(), 1)) + 1)
    ref.no_key = torch.isneginf(lse).numpy()
    ref.explain = lambda got: _explain_lse(got, ref)
    return ref


# The LSE is float32 (fp16 products are exact in fp32, the sums and exp run in fp32): each row's LSE may
# differ from the float64 one by LSE_EPS float32 epsilons times (its largest |score| + ln(keys seen) + 1),
# the size of the rounding of its maximum, its sum of exponentials and their log. An error in the scores'
# scale (log2(e) typed short) moves the LSE by that error times the weighted mean of s − max s.
LSE_EPS = 4.0


def _lse_error(got, expected):
    """(row index, error, bound) of the row whose LSE is furthest past its bound, or None when none is; a
    row whose LSE is −inf in one and not in the other is off by inf."""
    got64, want = np.asarray(got, dtype=np.float64)[..., -1], np.asarray(expected, dtype=np.float64)[..., -1]
    bound = expected.lse_bound
    over = np.where(np.isfinite(got64), np.abs(got64 - want) - bound, np.inf)
    got_no_key, want_no_key = getattr(got, "no_key", None), getattr(expected, "no_key", None)
    mismatch = (got_no_key != want_no_key if got_no_key is not None and want_no_key is not None
                else np.zeros(over.shape, dtype=bool))
    over = np.where(mismatch, np.inf, over)
    if not np.any(over > 0):
        return None
    where = np.unravel_index(int(np.argmax(over)), over.shape)
    err = np.inf if mismatch[where] else float(abs(got64[where] - want[where]))
    return tuple(int(i) for i in where), err, float(bound[where])


def _o_error(got, expected) -> float:
    """The componentwise error of o alone (the LSE column left out: it has its own bound, ``LSE_EPS``,
    which on a row whose scores are −2³² is hundreds, not a fraction of o's terms)."""
    got64 = np.asarray(got, dtype=np.float64)
    if got64.shape != np.shape(expected) or not np.all(np.isfinite(got64[..., -1])):
        return float("inf")
    return componentwise_error(got64[..., :-1], np.asarray(expected)[..., :-1], expected.magnitude[..., :-1])


def _compare(got, expected) -> bool:
    err = _o_error(got, expected)
    return bool(np.isfinite(err) and err <= _tol()) and _lse_error(got, expected) is None


def _explain_lse(got, expected):
    if np.shape(got) != np.shape(expected):
        return None
    lines = []
    err = _o_error(got, expected)
    if np.isfinite(err) and err > _tol():
        lines.append(f"   o (columns 0..D − 1) differs: its largest row error ‖got − expected‖/‖|terms|‖ is "
                     f"{err:.3g}")
    found = _lse_error(got, expected)
    if found is not None and np.isinf(found[1]):
        (b, h, i), _, _ = found
        no_key = getattr(got, "no_key", None)
        have = "-inf" if no_key is not None and no_key[b, h, i] else f"{float(np.asarray(got)[b, h, i, -1]):.6g}"
        seen = "sees no key: its LSE must be −inf" if expected.no_key[b, h, i] else "sees keys: its LSE is finite"
        lines.append(f"   the LSE of row [{b}, {h}, {i}] is {have}; that row {seen}")
    elif found is not None:
        (b, h, i), err, bound = found
        lines.append(f"   the LSE of row [{b}, {h}, {i}] is off by {err:.3g} (natural-log units; float32 rounding "
                     f"allows {bound:.2g} here)")
    return "\n".join(lines) or None


def _tol() -> float:
    return check_tolerance(DTYPE_NAME)


def _hint(hint: str) -> str:
    return (f"{hint} (passes when every row's error is at most {_tol():.0e} of the size of its terms, the float16 "
            f"bound; in the arrays above, the last column of a row, index D, is its LSE)")


def _check(name: str, flash_forward: Callable, fixed, random_shapes, causal: bool, hint: str,
           seed: int | None) -> CheckResult:
    if not callable(flash_forward):
        raise ValueError(f"flash_forward: must be the launch function, got {type(flash_forward).__name__}")
    return guarded_check(name, _student(flash_forward), _reference, _cases(fixed, random_shapes, causal, seed),
                         tol=_tol(), hint=_hint(hint), compare=_compare, fixed=len(fixed), kernel=True)


def _with_exercise_1_note(result: CheckResult, flash_forward: Callable) -> CheckResult:
    """A failing check of exercise 2 or 3 says so when exercise 1's loop fails too (on one fixed case)."""
    if result.status != FAILED:
        return result
    probe = _check("probe", flash_forward, FORWARD_FIXED[:2], lambda rng: [], False, HINT_FORWARD, 0)
    if probe.passed:
        return result
    return CheckResult(result.name, result.status,
                       f"{result.report}\n   note: this uses your exercise 1 (the online-softmax loop), which "
                       f"does not pass yet: fix that one first.")


def check_forward(flash_forward: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 1: plain attention (no mask, one KV head per query head)."""
    return _check("flash forward (online softmax)", flash_forward, FORWARD_FIXED, _random_forward, False,
                  HINT_FORWARD, seed)


def check_causal(flash_forward: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 2: causal attention, Nq = Nk, Nq < Nk (a decode step has Nq = 1) and Nq > Nk (rows that
    see no key)."""
    result = _check("flash forward (causal)", flash_forward, CAUSAL_FIXED, _random_causal, True, HINT_CAUSAL,
                    seed)
    return _with_exercise_1_note(result, flash_forward)


def check_gqa(flash_forward: Callable, *, seed: int | None = None) -> CheckResult:
    """Exercise 3: grouped-query attention (groups of 2 and 4, multi-query) and plain MHA."""
    result = _check("flash forward (GQA)", flash_forward, GQA_FIXED, _random_gqa, False, HINT_GQA, seed)
    return _with_exercise_1_note(result, flash_forward)


# The three exercises are three parts of one kernel, launched by one function: checks 2 and 3 name
# exercise 1 themselves when its loop fails (the dependency is inside the function, not between two).
EXERCISES = (
    Exercise(function="flash_forward", check=check_forward),
    Exercise(function="flash_forward", check=check_causal),
    Exercise(function="flash_forward", check=check_gqa),
)


def check_lab(*, seed: int | None = None, **functions):
    """All three checks, with a summary line: ``check_lab(flash_forward=flash_forward)``."""
    return check_exercises(EXERCISES, functions, seed=seed)
