"""Checks for lab 03, online softmax and tiled attention in NumPy.

Students write three functions:

    online_softmax(blocks)                      exercise 1: (m, ℓ) of a row of scores that arrives as a
                                                stream of blocks, read once
    merge(a, b)                                 exercise 2: (m, l, z), the state over the keys of a and b
    tiled_attention(Q, K, V, block_q, block_k)  exercise 3: softmax(Q Kᵀ/√d) V, tile by tile, with merge

Each check runs fixed adversarial cases first (rows whose maxima are thousands apart, scores that
overflow ``exp``, tiles that do not divide the lengths), then cases drawn from ``seed`` (fresh ones when
None), and compares with the float64 references of the package. The lesson's claims about structure are
checked too: the stream can be read once (a second pass finds nothing, and each block arrives in a
buffer that the next one overwrites); a tiled forward never builds a score block larger than the tile
(one case is large enough that the full matrix, or a row of tiles, exceeds its memory limit); and no
answer may call the course's own implementations.

Python loops are counted, not guessed at: while the student's function runs, the lines of Python it
executes outside NumPy and the course are counted (``count_lines``, a trace function). A merge may run a
few dozen lines whatever the number of rows (``MERGE_LINES``: no Python loop over rows); a tiled
forward about ``LINES_PER_TILE`` per tile of ``block_q × block_k`` (one case has 128 × 256 tiles over
512 queries and keys): going a query row at a time, against all keys or key tile by key tile, runs
block_q times as many and fails, whatever its memory.

Internal API for tests and scripts: the limits the checks set and the cases they set them on,
``memory_limit(**BIG)`` with ``big_case()``, ``long_stream()`` (a case carrying its ``max_bytes``) and
``line_limit``.
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading

import numpy as np

from ...reference import attention as _attention
from ...reference import online_softmax as _online
from ...reference import tiled_numpy as _tiled
from ...reference.online_softmax import PartialState, block_state, empty_state
from ...tolerances import rel_error, tolerance
from ..checking import (
    FAILED,
    CheckResult,
    Exercise,
    OneShotStream,
    case,
    check_exercises,
    exercise_check,
    module_functions,
    run_check,
    with_memory_limit,
)

TOL = tolerance("float64") * 1e3   # float64 arithmetic in a different order: far below any real bug

HINT_ONLINE = ("one loop over the blocks, keeping the running maximum m and the running sum ℓ: for each "
               "block, m_new = max(m, block.max()), ℓ = ℓ·exp(m − m_new) + Σ exp(block − m_new). The stream "
               "can be read only once, and each block is overwritten by the next: use a block before "
               "asking for the next one.")
HINT_MERGE = ("m = max(m_a, m_b) ROW BY ROW (np.maximum, not one maximum for all rows); then "
              "l = exp(m_a − m)·l_a + exp(m_b − m)·l_b and z = exp(m_a − m)[:, None]·z_a + exp(m_b − m)[:, None]·z_b. "
              "Return the tuple (m, l, z). (The report shows one line per row: m, l, then z.)")
HINT_TILED = ("for each block of query rows start from m = -inf, l = 0, z = 0; for each key/value block "
              "compute the scores S = Q_i K_jᵀ/√d (never more than block_q × block_k of them at once), take "
              "each ROW's maximum, turn them into the block's state and merge it in; the last tiles may be "
              "shorter than block_q / block_k; finish with O_i = z / l.")


def forbidden() -> tuple:
    """The course's own implementations (the references and this module's functions, but for the
    line counter that runs around the student's function): a student's function that calls one of
    them fails."""
    counter = (count_lines, _is_student_code, _counted, line_limit)
    return tuple(f for f in module_functions(_attention, _online, _tiled, sys.modules[__name__])
                 if f not in counter)


def _check(name, student_fn, reference_fn, fixed, drawn, hint, compare, line_limit=None,
           loop_hint="") -> CheckResult:
    """run_check; with ``line_limit(*args) -> int``, the student's function is stopped on a case as soon
    as it has run more lines of Python than the case allows, and the check fails on that case."""
    log: list[tuple[int, int]] = []
    fn = student_fn if line_limit is None else _counted(student_fn, line_limit, log)
    cases = fixed + drawn
    result = run_check(name, fn, reference_fn, cases, tol=TOL, hint=hint, compare=compare,
                       forbidden=forbidden(), fixed=len(fixed))
    over = [(index, lines, limit) for index, (lines, limit) in enumerate(log, start=1) if lines > limit]
    if result.status == "not implemented" or not over:
        return result
    index, lines, limit = over[0]
    return CheckResult(name, FAILED,
                       f"❌ {name}: case {index} of {len(cases)}, {cases[index - 1].label}: your function ran more "
                       f"than {limit} lines of Python, the most this case needs. {loop_hint}\n   hint: {hint}")


# ------------------------------------------------------------------------------ counting Python lines
def _library_dirs() -> tuple[str, ...]:
    """Where code that is not the student's lives: the standard library, site-packages, NumPy, the course."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {os.path.dirname(os.path.dirname(np.__file__)), os.path.dirname(os.path.dirname(__file__))}
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


_LIBRARY_DIRS = _library_dirs()
_STUDENT_CODE: dict = {}


def _is_student_code(code) -> bool:
    known = _STUDENT_CODE.get(code)
    if known is None:
        name = code.co_filename
        if name.startswith("<frozen"):
            known = False
        elif os.path.isabs(name):                    # a file: the student's unless it is a library's
            known = not os.path.realpath(name).startswith(_LIBRARY_DIRS)
        else:                                        # <ipython-input-…>, <string>: typed in a notebook
            known = True
        _STUDENT_CODE[code] = known
    return known


class LineLimit(Exception):
    """Raised into the student's code when it runs more lines of Python than ``count_lines`` allows."""


def count_lines(fn, *args, limit: int | None = None, **kwargs):
    """``(fn(*args, **kwargs), lines)``: the result and how many lines of the student's Python ran
    (frames whose code lies outside the standard library, site-packages, NumPy and the course), in this
    thread and in threads started meanwhile (a grader that runs the student's code in a thread). Past
    ``limit`` lines, LineLimit is raised in the student's code (and lines stays above the limit even
    if that code catches it)."""
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if limit is not None and count[0] == limit + 1:
                raise LineLimit(f"more than {limit} lines of Python")
        return local

    def tracer(frame, event, arg):
        return local if event == "call" and _is_student_code(frame.f_code) else None

    before, before_threads = sys.gettrace(), threading.gettrace()
    sys.settrace(tracer)
    threading.settrace(tracer)
    try:
        out = fn(*args, **kwargs)
    except Exception:
        if limit is not None and count[0] > limit:     # whatever the stopped code raised afterwards
            raise LineLimit(f"more than {limit} lines of Python") from None
        raise
    finally:
        sys.settrace(before)
        threading.settrace(before_threads)
    return out, count[0]


def _counted(fn, line_limit, log: list):
    """``fn`` run under ``count_lines`` with the limit ``line_limit(*args)``; each call appends (lines,
    limit) to ``log``. A call stopped at its limit returns an array that matches no answer."""
    def call(*args, **kwargs):
        limit = line_limit(*args)
        try:
            out, lines = count_lines(fn, *args, limit=limit, **kwargs)
        except LineLimit:
            out, lines = None, limit + 1
        log.append((lines, limit))
        return np.full(1, np.nan) if lines > limit else out
    return call


def _parts_close(got, expected, columns) -> bool:
    """Each group of columns (m, then l, then z) within TOL of the reference, on its own scale."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if got.shape != expected.shape:
        return False
    return all(rel_error(got[:, c], expected[:, c]) <= TOL for c in columns)


# ------------------------------------------------------------------------------ exercise 1
def _stream(blocks, what) -> object:
    blocks = [np.asarray(b, dtype=np.float64) for b in blocks]
    sizes = "+".join(str(len(b)) for b in blocks)
    return case(OneShotStream(blocks), label=f"{what}, blocks of {sizes}")


LONG = dict(blocks=256, block=256)     # a row of 65 536 scores: 512 KiB in float64


def long_stream():
    """A long row whose blocks may not be kept: one pass holds a block at a time (a few KiB of
    temporaries); keeping copies of the blocks for a second pass needs the whole row (512 KiB)."""
    rng = np.random.default_rng(5)
    n_blocks, size = LONG["blocks"], LONG["block"]
    rising = np.linspace(0, 60, n_blocks)[:, None]                    # the maximum keeps growing
    blocks = list(rng.standard_normal((n_blocks, size)) * 3 + rising)
    row_bytes = 8 * n_blocks * size
    c = case(OneShotStream(blocks), label=f"a row of {n_blocks} blocks of {size} scores: keeping copies of the "
                                          f"blocks would take {row_bytes >> 10} KiB")
    return with_memory_limit(c, row_bytes // 4)


def _reference_stats(stream: OneShotStream):
    m, l = _online.online_max_sum(np.concatenate(stream.blocks))
    return np.array([[m, l]])


def _student_stats(online_softmax):
    def call(stream):
        out = online_softmax(stream)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"online_softmax must return the tuple (m, l), got {type(out).__name__}")
        return np.array([[float(out[0]), float(out[1])]])
    return call


def _far_below_blocks(rng, depths, sizes) -> list:
    """A block holding the row's maximum 0, then one block of ``sizes[i]`` scores within 0.3 below
    ``-depths[i]``: terms far too small to change m, yet their sum moves ℓ by far more than the check's
    tolerance (e^-21.5 · 256 ≈ 1e-7 of ℓ). An answer that skips a block, or flushes terms, below some
    threshold under the running maximum drops them."""
    first = np.append(rng.uniform(-3.0, -0.5, 3), 0.0)
    return [first] + [-float(depth) - rng.uniform(0.0, 0.3, size) for depth, size in zip(depths, sizes)]


def _check_online_softmax(online_softmax, *, seed: int | None = None) -> CheckResult:
    """online_softmax(blocks) -> (m, l): the maximum and Σ exp(x − m) of a row streamed as 1-D blocks."""
    rng = np.random.default_rng(4)
    fixed = [
        _stream(np.split(np.sort(rng.standard_normal(12) * 3), [3, 6, 9]), "12 increasing scores"),
        _stream(np.split(np.sort(rng.standard_normal(9))[::-1], [2, 7]), "9 decreasing scores"),
        _stream([rng.standard_normal(4) * 30 + 900, rng.standard_normal(6) * 30 + 950],
                "10 scores near 900 (exp(900) overflows)"),
        _stream([rng.uniform(800, 1000, 3), rng.uniform(-1000, -800, 4), rng.uniform(-10, 10, 2)],
                "scores near +900, then -900, then 0"),
        _stream([rng.uniform(-1000, -800, 3), rng.uniform(800, 1000, 5)], "scores near -900, then +900"),
        _stream([np.array([rng.standard_normal()])], "a single score"),
        _stream(np.split(rng.standard_normal(15) + np.linspace(0, 40, 15), [1, 6, 8]), "15 rising scores"),
        long_stream(),
        _stream(_far_below_blocks(rng, [10.5, 13.0, 16.0, 21.5], [40, 40, 64, 256]),
                "one score at 0, then blocks about 10.5, 13, 16 and 21.5 below it (each term is small, "
                "e^-10.5 ≈ 3e-5 down to e^-21.5 ≈ 5e-10, but every term counts in ℓ)"),
    ]
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(3):
        n_blocks = int(rng.integers(2, 7))
        heights = rng.uniform(-2000, 2000, n_blocks)
        drawn.append(_stream([rng.standard_normal(int(rng.integers(1, 9))) * 5 + h for h in heights],
                             f"{n_blocks} blocks at heights thousands apart"))
    depths = np.sort(rng.uniform(9.0, 20.0, int(rng.integers(2, 6))))
    drawn.append(_stream(_far_below_blocks(rng, depths, [64] * len(depths)),
                         f"a maximum first, then {len(depths)} blocks between 9 and 20 below it"))
    return _check("online_softmax", _student_stats(online_softmax), _reference_stats, fixed, drawn, HINT_ONLINE,
                  compare=lambda got, want: _parts_close(got, want, (slice(0, 1), slice(1, 2))))


# ------------------------------------------------------------------------------------ exercise 2
MERGE_LINES = 40          # lines of Python a merge may run, whatever the number of rows


def _state(rng, rows, dv, n_keys, heights) -> tuple:
    scores = rng.standard_normal((rows, n_keys)) * 2 + np.reshape(heights, (rows, 1))
    s = block_state(scores, rng.standard_normal((n_keys, dv)))
    return (s.m, s.l, s.z)


def _empty_rows(state, rows) -> tuple:
    """``state`` with ``rows`` made empty (m = -inf, l = 0, z = 0): rows that have seen no key yet."""
    m, l, z = (np.array(x, dtype=np.float64) for x in state)
    m[rows], l[rows], z[rows] = -np.inf, 0.0, 0.0
    return m, l, z


def _merge_reference(a, b):
    s = _online.merge(PartialState(*a), PartialState(*b))
    return np.column_stack([s.m, s.l, s.z])


def _student_merge(merge_fn):
    def call(a, b):
        state = merge_fn(a, b)
        if not (isinstance(state, (tuple, list)) and len(state) == 3):
            size = f" of {len(state)} items" if isinstance(state, (tuple, list)) else ""
            raise TypeError(f"merge must return a tuple (m, l, z) of three arrays, got a "
                            f"{type(state).__name__}{size}")
        m, l, z = (np.asarray(x, dtype=np.float64) for x in state)
        if m.ndim != 1 or l.shape != m.shape or z.ndim != 2 or len(z) != len(m):
            raise TypeError(f"merge must return m and l of shape [rows] and z of shape [rows, dv], got "
                            f"m {m.shape}, l {l.shape}, z {z.shape}")
        return np.column_stack([m, l, z])
    return call


def _merge_label(a, b, what) -> str:
    return f"{what}: {len(a[0])} rows, dv = {a[2].shape[1]}"


def _check_merge(merge_fn, *, seed: int | None = None) -> CheckResult:
    """merge(a, b) -> (m, l, z) where a = (m_a, l_a, z_a), b = (m_b, l_b, z_b); m, l: [rows], z: [rows, dv]."""
    rng = np.random.default_rng(5)
    pairs = [
        (_state(rng, 3, 2, 4, [0, 0, 0]), _state(rng, 3, 2, 5, [3, 3, 3]), "b holds the larger scores"),
        (_state(rng, 4, 3, 6, [3, 3, 3, 3]), _state(rng, 4, 3, 2, [0, 0, 0, 0]), "a holds the larger scores"),
        (_state(rng, 4, 4, 3, [0, 0, 0, 0]), _state(rng, 4, 4, 7, [-5, 5, -5, 5]),
         "the larger maximum differs from row to row (z is square)"),
        (_state(rng, 3, 2, 4, [0, 1500, -1500]), _state(rng, 3, 2, 4, [1, 1490, -1510]),
         "rows whose maxima are thousands apart"),
        (tuple(np.asarray(x) for x in (lambda e: (e.m, e.l, e.z))(empty_state(3, 2))),
         _state(rng, 3, 2, 4, [0, 0, 0]), "a is the empty state (m = -inf, l = 0, z = 0)"),
        (_state(rng, 2, 3, 5, [500, 500]), _state(rng, 2, 3, 5, [510, 510]), "scores near 500"),
        # a empty and b far below 0: a merge that replaces m = -inf by 0 takes m = 0 and e^(m_b - 0) underflows
        (tuple(np.asarray(x) for x in (lambda e: (e.m, e.l, e.z))(empty_state(3, 2))),
         _state(np.random.default_rng(6), 3, 2, 4, [-1000, -990, -1010]),
         "a is the empty state and b's maxima are near -1000"),
        # Empty in some rows only: each row merges on its own, so an answer that decides "a is empty"
        # from one row (row 0, the last row, any row) loses the other rows.
        (_empty_rows(_state(rng, 4, 2, 3, [0, 2, -1, 1]), [0]), _state(rng, 4, 2, 5, [1, 0, 2, -2]),
         "a empty in row 0 only"),
        (_empty_rows(_state(rng, 5, 3, 4, [0, 800, 2, -800, 1]), [1, 4]),
         _empty_rows(_state(rng, 5, 3, 2, [3, 790, -2, -790, 0]), [0, 2]),
         "a empty in rows 1 and 4, b empty in rows 0 and 2, never both in one row"),
    ]
    fixed = [case(a, b, label=_merge_label(a, b, what)) for a, b, what in pairs]
    a = _state(rng, 200, 3, 4, rng.uniform(-1000, 1000, 200))
    fixed.append(case(a, _state(rng, 200, 3, 5, rng.uniform(-1000, 1000, 200)),
                      label=_merge_label(a, a, "many rows (a Python loop over them shows)")))
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(4):
        rows, dv = int(rng.integers(2, 7)), int(rng.integers(1, 5))
        a = _state(rng, rows, dv, int(rng.integers(1, 6)), rng.uniform(-2000, 2000, rows))
        b = _state(rng, rows, dv, int(rng.integers(1, 6)), rng.uniform(-2000, 2000, rows))
        drawn.append(case(a, b, label=_merge_label(a, b, "random heights")))
    return _check("merge", _student_merge(merge_fn), _merge_reference, fixed, drawn, HINT_MERGE,
                  compare=lambda got, want: _parts_close(got, want, (slice(0, 1), slice(1, 2), slice(2, None))),
                  line_limit=lambda a, b: MERGE_LINES,
                  loop_hint="A merge works on whole arrays (np.maximum, np.exp, [:, None]): no Python loop "
                            "over the rows.")


# ----------------------------------------------------------------------------- exercise 3
def _far_apart(rng, n_q, n_k, d, dv):
    """Q, K, V where neighbouring query rows have scores thousands apart."""
    Q, K, V = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d)), rng.standard_normal((n_k, dv))
    K[:, 0] = rng.uniform(1.0, 1.5, n_k)
    Q[:, 0] = np.resize([0.0, 3000.0, -3000.0, 1500.0], n_q)
    return Q, K, V


# The memory case: the full score matrix is 8 MiB, a row of tiles (or all queries against one key
# block) 512 KiB, one tile 32 KiB. The limit allows twice the inputs and the output, and six tiles.
BIG = dict(n_q=1024, n_k=1024, d=2, dv=2, block_q=64, block_k=64)


def memory_limit(n_q, n_k, d, dv, block_q, block_k) -> int:
    """The bytes a tiled forward may allocate (float64): twice its inputs and output, and six score tiles."""
    return 8 * (2 * (n_q * d + n_k * d + n_k * dv + n_q * dv) + 6 * block_q * block_k)


# The tile cases. TILES: 256 × 64 tiles over 512 queries and 64 keys, 2 tiles: a query row at a time
# (against all keys, or key tile by key tile) loops 512 times, twice the line limit of 2 tiles even at
# one line per row. NARROW: 16 × 128 tiles; a tile as tall as it is wide (block_q ignored, block_k used
# for both) is 8 times the tile and exceeds the memory limit.
TILES = dict(n_q=512, n_k=64, d=4, dv=2, block_q=256, block_k=64)
NARROW = dict(n_q=256, n_k=256, d=4, dv=2, block_q=16, block_k=128)
LINES_PER_TILE = 40       # lines of Python per tile (its scores, state, merge) and per query block


def line_limit(Q, K, V, block_q, block_k) -> int:
    """The lines of Python a tiled forward may run: LINES_PER_TILE per tile and per query block, and
    twice as many for the set-up."""
    tiles_q, tiles_k = -(-len(Q) // block_q), -(-len(K) // block_k)
    return LINES_PER_TILE * (tiles_q * tiles_k + tiles_q + 2)


@functools.lru_cache(maxsize=1)
def big_case() -> tuple:
    """Q, K, V of the memory case and their float64 attention, computed once."""
    rng = np.random.default_rng(7)
    Q, K, V = (rng.standard_normal((BIG[n], BIG[d])) for n, d in (("n_q", "d"), ("n_k", "d"), ("n_k", "dv")))
    out = _attention.attention_np(Q, K, V)
    for a in (Q, K, V, out):
        a.setflags(write=False)
    return Q, K, V, out


def _tiled_reference(Q, K, V, block_q, block_k):
    big_Q, big_K, big_V, big_out = big_case()
    if Q.shape == big_Q.shape and np.array_equal(Q, big_Q) and np.array_equal(K, big_K) and \
            np.array_equal(V, big_V):
        return big_out.copy()
    return _attention.attention_np(Q, K, V)


def _check_tiled_attention(tiled_attention, *, seed: int | None = None) -> CheckResult:
    """tiled_attention(Q, K, V, block_q, block_k) -> softmax(Q Kᵀ/√d) V, [N_q, dv]."""
    rng = np.random.default_rng(6)
    fixed = []
    shapes = [  # (N_q, N_k, d, dv, block_q, block_k, what)
        (4, 4, 4, 2, 2, 2, "the 4×4 example's shape"),
        (10, 10, 8, 8, 4, 4, "N not a multiple of the tile"),
        (7, 13, 16, 5, 3, 4, "N_q ≠ N_k, d ≠ dv, ragged tiles on both axes"),
        (16, 9, 8, 8, 16, 2, "one query block, many key blocks"),
        (5, 20, 4, 3, 2, 32, "one key block larger than N_k"),
        (1, 9, 4, 2, 4, 4, "a single query"),
    ]
    for n_q, n_k, d, dv, bq, bk, what in shapes:
        Q, K, V = rng.standard_normal((n_q, d)), rng.standard_normal((n_k, d)), rng.standard_normal((n_k, dv))
        fixed.append(case(Q, K, V, bq, bk, label=f"{what}: Q {Q.shape}, K {K.shape}, V {V.shape}, tiles {bq}×{bk}"))
    Q, K, V = _far_apart(rng, 6, 11, 4, 3)
    fixed.append(case(Q, K, V, 4, 3, label="rows of one tile whose scores are thousands apart, tiles 4×3"))
    Q = np.abs(rng.standard_normal((5, 4))) + np.array([50.0, 0, 0, 0])
    K = np.column_stack([np.linspace(-30, 30, 9), rng.standard_normal((9, 3))])
    fixed.append(case(Q, K, rng.standard_normal((9, 2)), 2, 3,
                      label="scores rising from about -800 to +800 along the keys, tiles 2×3"))
    Q, K, V = (np.array(a) for a in big_case()[:3])
    big = case(Q, K, V, BIG["block_q"], BIG["block_k"],
               label=f"Q {Q.shape}, K {K.shape}, tiles {BIG['block_q']}×{BIG['block_k']}: the full score "
                     f"matrix would take {8 * BIG['n_q'] * BIG['n_k'] / 2**20:.0f} MiB")
    fixed.append(with_memory_limit(big, memory_limit(**BIG)))
    for sizes, why in ((TILES, f"2 tiles; one query row at a time would loop {TILES['n_q']} times"),
                       (NARROW, f"a {NARROW['block_k']}×{NARROW['block_k']} tile would be 8 times the tile")):
        Q, K, V = (rng.standard_normal((sizes[n], sizes[d])) for n, d in (("n_q", "d"), ("n_k", "d"), ("n_k", "dv")))
        c = case(Q, K, V, sizes["block_q"], sizes["block_k"],
                 label=f"Q {Q.shape}, K {K.shape}, tiles {sizes['block_q']}×{sizes['block_k']}: {why}")
        fixed.append(with_memory_limit(c, memory_limit(**sizes)))
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(4):
        bq, bk = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        n_q = bq * int(rng.integers(1, 4)) + int(rng.integers(-1, 2))      # k·BLOCK and k·BLOCK ± 1
        n_k = bk * int(rng.integers(3, 5)) + int(rng.integers(-1, 2))      # at least three key tiles
        n_q, d, dv = max(n_q, 1), int(rng.integers(1, 9)), int(rng.integers(1, 6))
        Q, K, V = _far_apart(rng, n_q, n_k, d + 1, dv)
        drawn.append(case(Q, K, V, bq, bk, label=f"Q {Q.shape}, K {K.shape}, V {V.shape}, tiles {bq}×{bk}"))
    return _check("tiled_attention", tiled_attention, _tiled_reference, fixed, drawn, HINT_TILED,
                  compare=lambda got, want: bool(rel_error(got, want) <= TOL), line_limit=line_limit,
                  loop_hint="A tiled forward loops over tiles of block_q query rows and block_k keys, with "
                            "NumPy inside a tile: not over single query rows.")


# ------------------------------------------------------------------------------------ the lab
EXERCISES = (
    Exercise(function="online_softmax", check=_check_online_softmax),
    Exercise(function="merge", check=_check_merge),
    Exercise(function="tiled_attention", check=_check_tiled_attention, depends=("merge",)),
)

check_online_softmax = exercise_check(EXERCISES, "online_softmax")
check_merge = exercise_check(EXERCISES, "merge")
check_tiled_attention = exercise_check(EXERCISES, "tiled_attention")


def check_lab(*, seed: int | None = None, **functions):
    """Every exercise's check: ``check_lab(online_softmax=online_softmax, merge=merge,
    tiled_attention=tiled_attention)``."""
    return check_exercises(EXERCISES, functions, seed=seed)
