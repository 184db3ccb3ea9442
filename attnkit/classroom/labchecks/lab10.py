"""Checks for lab 10, attention beyond one GPU.

Students write five functions:

    zigzag_chunks(rank, world_size)          exercise 1: the chunks rank r holds in the zig-zag split of a
                                             sequence cut into 2·world_size chunks, in increasing order
    predicted_work_ratio(world_size)         exercise 2: a prediction: under a causal mask and a contiguous
                                             split, the last rank's blocks ÷ the first rank's
    merge_blocks(o_a, lse_a, o_b, lse_b)     exercise 3: (o, lse) of the keys of two blocks together
    ring_forward(q, k, v, causal)            exercise 4: this rank's output of ring attention (contiguous
                                             split: rank r holds chunk r), run inside a process group
    step_transfer_us(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward)
                                             exercise 5: a prediction: the α–β model's time of one ring step's
                                             transfer (one sequence, bf16 K/V, float32 dK/dV), in µs

Each check runs fixed adversarial cases first (log-sum-exps hundreds apart, empty blocks, causal masks
where a wrong block owner changes the result, GQA), then cases drawn from ``seed``. ``ring_forward`` runs
on 2, 3 and 4 processes (torch.distributed, gloo) and is compared with one-process float64 attention;
the course's own ring, all-gather, Ulysses and merge may not be called while it runs. Its calls to
torch.distributed are watched (``attnkit.distributed.traffic``), and the ring's rules enforced:

- no collective (an all-gather, all-to-all, broadcast … holds or moves every rank's K/V at once);
- sends and receives only with the neighbours r + 1 and r − 1;
- exactly W − 1 K/V blocks received (none on the last step);
- when a step's transfers are posted (``batch_isend_irecv``), no earlier received block is still held
  except the one being sent on (a ring holds one block, not the whole sequence);
- q, K and V come as strided views in some cases (of [B, n, H, D] caches; the lab promises no layout), so
  a ring that sends them as they are fails there (gloo sends contiguous tensors only);
- a buffer handed to a receive holds NaN from the moment the receive is posted until the data arrive,
  so a buffer that is sent and received into at once, or read before ``wait()``, fails on every run
  instead of now and then.

Every answer is held to the type the lab promises before its value is compared: the zig-zag chunks are a
list of ints; the two predictions are numbers; ``merge_blocks`` returns torch tensors ``(o, lse)`` of the
inputs' shapes and dtype; ``ring_forward`` returns, on every rank, a tensor of q's shape and dtype (one
fixed case runs the ring on bf16 q, K and V, where the merged output is float32 until it is cast back).
"""
from __future__ import annotations

import copy
import math
import numbers
import weakref

import numpy as np
import torch
import torch.distributed as dist

from ...distributed import alpha_beta as _ab
from ...distributed import context_parallel as _cp
from ...distributed.launch import run_group
from ...distributed.traffic import COLLECTIVES, count_traffic, received_bytes
from ...reference.attention import attention_ref
from ...tolerances import tolerance
from ..checking import (
    FAILED,
    CheckResult,
    Exercise,
    WrongResult,
    answer_error,
    case,
    check_exercises,
    exercise_check,
    run_check,
)

TOL = tolerance("float64") * 1e3
RING_TIMEOUT_S = 20

HINT_ZIGZAG = ("cut the sequence into 2·W chunks; rank r takes chunk r (early, little causal work) and chunk "
               "2W − 1 − r (late, much work); return them as a list in increasing order.")
HINT_RATIO = ("with a contiguous split and a causal mask, rank r attends to r full blocks and one half "
              "(diagonal) block: count the first and the last rank's blocks and divide.")
HINT_MERGE = ("lse = log(e^lse_a + e^lse_b), computed without overflow: m = max(lse_a, lse_b) row by row, "
              "lse = m + log(e^(lse_a − m) + e^(lse_b − m)); then o = e^(lse_a − lse)·o_a + e^(lse_b − lse)·o_b "
              "(weights broadcast over the last axis). A block with lse = −inf holds no keys: weight 0. A row "
              "with no key in either block stays empty: o = 0, lse = −inf (shift by 0 there, never by −inf).")
HINT_TRANSFER = ("one step moves one rank's K and V: 2·Hkv·n·D elements of 2 bytes (bf16) in the forward; the "
                 "backward moves K, V and their float32 gradients dK, dV: (2·2 + 2·4)·Hkv·n·D bytes. The time is "
                 "α + bytes/β with β in GB/s = 10^9 bytes/s (not GiB/s, not Gb/s), and the answer in µs.")
HINT_RING = ("W steps: at step s the K/V held came from rank (r − s) mod W, i.e. chunk (r − s) mod W. Start "
             "sending the block to rank r + 1 and receiving the next from rank r − 1 "
             "(dist.batch_isend_irecv), compute block_forward(q, k, v, causal and owner == r, scale) unless "
             "causal and owner > r, merge it with your merge_blocks, then wait and swap in the received "
             "block. Receive into new buffers (not the ones you send), read them only after wait(), and keep "
             "no other block. Return o in q's dtype.")


def _type_problem(name, student_fn, cases, problem_of, hint) -> CheckResult | None:
    """The first case on which ``student_fn`` returns a value of another type than the lab promises
    (``problem_of(got, *case args)`` says how, in words), as a failure; None when every answer has the
    promised type. An answer that raises is left to ``run_check``, which reports it (or "not implemented")."""
    for index, c in enumerate(cases, start=1):
        try:
            got = student_fn(*copy.deepcopy(c.args), **copy.deepcopy(c.kwargs))
        except Exception:
            return None
        problem = problem_of(got, *c.args)
        if problem:
            return CheckResult(name, FAILED, f"❌ {name}: case {index} of {len(cases)}, {c.label}: {problem}\n"
                                             f"   hint: {hint}")
    return None


def _kind(value) -> str:
    """'a tuple, (0, 3)': the type of a returned value, and the value, for a failure message."""
    text = repr(value)
    return f"a {type(value).__name__}, {text if len(text) <= 60 else text[:57] + '...'}"


def _not_a_number(got, *args) -> str | None:
    """A prediction is a real number: an int or a float (NumPy's included), not a bool, a string or a tensor."""
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        return f"returned {_kind(got)}: the prediction is a number (an int or a float)."
    return None


def forbidden() -> tuple:
    """The course's own merge, ring, all-gather and Ulysses (block_forward_torch is the lab's tool: allowed)."""
    return (_cp.ring_attention, _cp.all_gather_kv_attention, _cp.ulysses_attention, _cp.merge, _cp._local_forward)


# ------------------------------------------------------------------------------ exercise 1
def _chunks_case(rank, world):
    return case(rank, world, label=f"rank {rank} of {world}")


def _zigzag_type(got, rank, world) -> str | None:
    """The lab asks for the two chunk numbers as a list; chunk numbers are ints."""
    if type(got) is not list:
        return f"returned {_kind(got)}: the lab asks for the two chunk numbers as a list, [first, second]."
    bad = next((x for x in got if isinstance(x, bool) or not isinstance(x, (int, np.integer))), None)
    if bad is not None:
        return f"the list holds {_kind(bad)}: chunk numbers are ints (they number the 2W chunks)."
    return None


def _check_zigzag(zigzag_chunks, *, seed: int | None = None) -> CheckResult:
    """zigzag_chunks(rank, world_size) -> [r, 2W − 1 − r]."""
    fixed = [_chunks_case(r, w) for w in (1, 2, 3, 4, 8) for r in range(w)]
    rng = np.random.default_rng(seed)
    drawn = []
    for _ in range(4):
        w = int(rng.integers(5, 64))
        drawn.append(_chunks_case(int(rng.integers(0, w)), w))
    cases = fixed + drawn
    wrong_type = _type_problem("zigzag_chunks", zigzag_chunks, cases, _zigzag_type, HINT_ZIGZAG)
    if wrong_type is not None:
        return wrong_type
    return run_check("zigzag_chunks", lambda r, w: list(map(int, zigzag_chunks(r, w))),
                     lambda r, w: _cp.chunks_of_rank(r, w, "zigzag"), cases, tol=0, hint=HINT_ZIGZAG,
                     compare=lambda got, want: list(got) == list(want), fixed=len(fixed))


# ------------------------------------------------------------------------------ exercise 2
def _check_ratio(predicted_work_ratio, *, seed: int | None = None) -> CheckResult:
    """predicted_work_ratio(world_size): within 2% of the counted ratio (2W − 1)."""
    fixed = [case(w, label=f"W = {w}") for w in (2, 3, 4, 8, 16)]
    rng = np.random.default_rng(seed)
    drawn = [case(int(rng.integers(5, 100)), label="W drawn at random") for _ in range(3)]

    def counted(w):
        work = _cp.causal_work(w, "contiguous")
        return work[-1] / work[0]

    wrong_type = _type_problem("predicted_work_ratio", predicted_work_ratio, fixed + drawn, _not_a_number, HINT_RATIO)
    if wrong_type is not None:
        return wrong_type
    return run_check("predicted_work_ratio", lambda w: float(predicted_work_ratio(w)), counted, fixed + drawn,
                     tol=0.02, hint=HINT_RATIO, fixed=len(fixed),
                     compare=lambda got, want: math.isfinite(got) and abs(got - want) <= 0.02 * want)


# ------------------------------------------------------------------------------ exercise 3
def _merge_reference(o_a, lse_a, o_b, lse_b):
    o, lse = _cp.merge(_cp.merge(None, o_a, lse_a), o_b, lse_b)
    empty = torch.isneginf(lse_a) & torch.isneginf(lse_b)          # no key in either block: o = 0, lse = −inf
    o = torch.where(empty[..., None], torch.zeros_like(o), o)
    return torch.cat([o, lse[..., None]], dim=-1)


def _merge_close(got, want) -> bool:
    """Entries the reference leaves at −inf (the lse of a row with no key) must be −inf; the rest within TOL."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False
    finite = np.isfinite(want)
    if not np.array_equal(got[~finite], want[~finite]):
        return False
    err = answer_error(got[finite], want[finite])
    return bool(np.isfinite(err) and err <= TOL)


def _merge_case(rng, rows, d, offset_a, offset_b, label, empty=None):
    o_a, o_b = (torch.from_numpy(rng.standard_normal((1, 2, rows, d))) for _ in range(2))
    lse_a = torch.from_numpy(rng.standard_normal((1, 2, rows)) * 3 + np.asarray(offset_a))   # offsets per row or one
    lse_b = torch.from_numpy(rng.standard_normal((1, 2, rows)) * 3 + np.asarray(offset_b))
    if empty == "a":
        lse_a[..., 0], o_a[..., 0, :] = -math.inf, 0.0
    if empty == "b":
        lse_b[..., 1], o_b[..., 1, :] = -math.inf, 0.0
    if empty == "both":
        lse_a[..., 2], o_a[..., 2, :], lse_b[..., 2], o_b[..., 2, :] = -math.inf, 0.0, -math.inf, 0.0
    return case(o_a, lse_a, o_b, lse_b, label=label)


def _merge_type(got, o_a, lse_a, o_b, lse_b) -> str | None:
    """(o, lse): torch tensors, o [..., rows, D] and lse [..., rows] as the inputs, in the inputs' dtype."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return f"returned {_kind(got)}: merge_blocks returns the pair (o, lse)."
    shapes = {"o": tuple(torch.broadcast_shapes(o_a.shape, o_b.shape)), "lse": tuple(lse_a.shape)}
    for label, t in zip(("o", "lse"), got):
        if not isinstance(t, torch.Tensor):
            return f"{label} is {_kind(t)}: return torch tensors (o, lse), as the inputs are."
        if tuple(t.shape) != shapes[label]:
            return (f"{label} has shape {tuple(t.shape)}; it should have {shapes[label]} (o [..., rows, D], "
                    f"lse [..., rows], as o_a and lse_a).")
        if t.dtype != o_a.dtype:
            return (f"{label} is {t.dtype}, the inputs are {o_a.dtype}: keep the inputs' dtype (the check compares "
                    f"with a float64 reference at float64's precision).")
    return None


def _check_merge(merge_blocks, *, seed: int | None = None) -> CheckResult:
    """merge_blocks(o_a, lse_a, o_b, lse_b) -> (o, lse); o [..., rows, D], lse [..., rows]."""
    rng = np.random.default_rng(10)
    fixed = [
        _merge_case(rng, 3, 4, 0.0, 0.0, "log-sum-exps near 0"),
        _merge_case(rng, 4, 8, 800.0, 790.0, "log-sum-exps near 800 (e^800 overflows)"),
        _merge_case(rng, 4, 8, -900.0, -600.0, "log-sum-exps near −900 and −600 (e^−900 underflows)"),
        _merge_case(rng, 5, 4, 5.0, 300.0, "block b dominates by ~300"),
        _merge_case(rng, 3, 4, [0.0, 900.0, -900.0], [2.0, 904.0, -897.0],
                    "rows near 0, 900 and −900 (one maximum for all rows underflows)"),
        _merge_case(rng, 3, 4, 2.0, 1.0, "row 0 of block a holds no keys (lse −inf)", empty="a"),
        _merge_case(rng, 3, 4, 2.0, 1.0, "row 1 of block b holds no keys (lse −inf)", empty="b"),
        _merge_case(np.random.default_rng(11), 3, 4, 2.0, 1.0,
                    "row 2 holds no keys in either block (o = 0, lse = −inf)", empty="both"),
    ]
    rng = np.random.default_rng(seed)
    drawn = [_merge_case(rng, int(rng.integers(1, 7)), int(rng.integers(1, 9)), *rng.uniform(-50, 50, 2),
                         "random rows") for _ in range(4)]

    wrong_type = _type_problem("merge_blocks", merge_blocks, fixed + drawn, _merge_type, HINT_MERGE)
    if wrong_type is not None:
        return wrong_type

    def student(o_a, lse_a, o_b, lse_b):
        out = merge_blocks(o_a, lse_a, o_b, lse_b)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise WrongResult(f"merge_blocks must return the tuple (o, lse), got {type(out).__name__}")
        o, lse = (torch.as_tensor(t, dtype=torch.float64) for t in out)
        return torch.cat([o, lse[..., None]], dim=-1)

    return run_check("merge_blocks", student, _merge_reference, fixed + drawn, tol=TOL, hint=HINT_MERGE,
                     compare=_merge_close, forbidden=forbidden(), fixed=len(fixed))


# ------------------------------------------------------------------------------ exercise 4
_BLANK = "not implemented"


class RingRuleBroken(WrongResult):
    """A ring_forward that gives the right numbers by breaking one of the ring's rules (module doc)."""


class RingOutputWrong(RingRuleBroken):
    """A rank's ring_forward returned something else than a tensor of q's shape and dtype."""


def _ring_output_problem(out, q, rank, world) -> str | None:
    """What is wrong with the type of one rank's output (the lab: [B, Hq, n, D], in q's dtype), or None."""
    if out is None:
        return None                                          # reported as "returned None" by the check
    if not isinstance(out, torch.Tensor):
        return (f"rank {rank} of {world} returned {_kind(out)}: return this rank's output as a torch tensor "
                f"[B, Hq, n, D] in q's dtype")
    if tuple(out.shape) != tuple(q.shape):
        return (f"rank {rank} of {world} returned a tensor of shape {tuple(out.shape)}: this rank's output is "
                f"[B, Hq, n, D] = {tuple(q.shape)}, q's shape")
    if out.dtype != q.dtype:
        return (f"rank {rank} of {world} returned a {out.dtype} tensor for q in {q.dtype}: return o in q's dtype "
                f"(o.to(q.dtype)); the merges run in float32 or float64, the output goes back in q's dtype")
    return None


class _RingRules:
    """Watches one rank's torch.distributed calls during ring_forward (runs in the rank's process)."""

    def __init__(self, rank, world, block_bytes):
        self.rank, self.world, self.block_bytes = rank, world, block_bytes
        self.broken: list[str] = []
        self.received = []                                   # weak references to earlier receive buffers

    def note(self, message):
        if message not in self.broken:
            self.broken.append(message)

    def strided(self, op, tensors):
        """Note a tensor handed to a transfer that is not contiguous (gloo refuses it, and raises)."""
        for t in tensors:
            if isinstance(t, torch.Tensor) and not t.is_contiguous():
                self.note(f"rank {self.rank} handed dist.{op} a tensor that is not contiguous (shape "
                          f"{tuple(t.shape)}, strides {t.stride()}): q, K and V may come as strided views, and "
                          f"gloo sends and receives contiguous tensors only. Send k.contiguous() and "
                          f"v.contiguous(), and receive into buffers made like those")
                return

    def on_call(self, call, buffers, sent=()):
        neighbours = {(self.rank + 1) % self.world, (self.rank - 1) % self.world}
        if call.op not in COLLECTIVES:
            self.strided(call.op, list(buffers) + list(sent))
        if call.op in COLLECTIVES:
            self.note(f"rank {self.rank} called dist.{call.op}, a collective: this exercise is a ring, where each "
                      f"rank only sends to and receives from its neighbours (a gather holds every rank's K/V "
                      f"at once)")
        elif call.peer is not None and call.peer not in neighbours:
            self.note(f"rank {self.rank} of {self.world} used dist.{call.op} with rank {call.peer}: in a ring a "
                      f"rank talks only to its neighbours {sorted(neighbours)}")
        for t in buffers:                                    # its contents are undefined until wait()
            if t.is_floating_point():
                t.fill_(float("nan"))

    def batch(self, original):
        def batch_isend_irecv(p2p_op_list):
            ops = list(p2p_op_list)
            self.strided("batch_isend_irecv", [getattr(op, "tensor", None) for op in ops])
            receives = [op.tensor for op in ops if getattr(op.op, "__name__", "") == "irecv"]
            sends = {id(op.tensor) for op in ops if getattr(op.op, "__name__", "") == "isend"}
            reused = {id(t) for t in receives}             # a buffer received into again holds no old block
            held = [t() for t in self.received]
            held = [t for t in held if t is not None and id(t) not in sends and id(t) not in reused]
            if held:
                self.note(f"rank {self.rank} still held {len(held)} earlier received buffer(s) of K/V when it "
                          f"posted the next step: a ring keeps one block (the one it passes on), not every "
                          f"block it has seen")
            for t in receives:                               # poisoned before any op of the batch starts
                if t.is_floating_point():
                    t.fill_(float("nan"))
            self.received += [weakref.ref(t) for t in receives]
            return original(p2p_op_list)
        return batch_isend_irecv

    def after(self, log):
        got, want = received_bytes(log), (self.world - 1) * self.block_bytes
        if not self.broken and got != want:
            self.note(f"rank {self.rank} received {got:,} bytes of K/V; a ring of {self.world} ranks receives "
                      f"W − 1 = {self.world - 1} block(s) of {self.block_bytes:,} bytes (nothing on the last step)")


def _as_view(t, layout):
    """``t`` [B, H, n, D] as the lab allows it to come: ``"contiguous"``; ``"bsnh"``, a view of a [B, n, H, D]
    cache (transposed, dense); ``"bsnh-padded"``, a view of a [B, n, H, D + 2] cache whose last two columns hold
    NaN (not dense: strides of its own on every axis). gloo sends and receives contiguous tensors only."""
    if layout == "contiguous":
        return t.contiguous()
    b, h, n, d = t.shape
    pad = 2 if layout == "bsnh-padded" else 0
    store = torch.full((b, n, h, d + pad), float("nan"), dtype=t.dtype)
    store[..., :d] = t.transpose(1, 2)
    return store[..., :d].transpose(1, 2)


def _ring_rank(rank, world, ring_forward, q, k, v, causal, layout="contiguous"):
    q, k, v = (_as_view(_cp.shard(t, rank, world, "contiguous"), layout) for t in (q, k, v))
    rules = _RingRules(rank, world, k.numel() * k.element_size() + v.numel() * v.element_size())
    original = dist.batch_isend_irecv
    dist.batch_isend_irecv = rules.batch(original)
    try:
        with count_traffic(on_call=rules.on_call) as log:
            out = ring_forward(q, k, v, causal)
    except NotImplementedError:
        return _BLANK
    except Exception:
        if rules.broken:                        # what gloo raised for a rule the check names (a strided send)
            return None, rules.broken, None
        raise
    finally:
        dist.batch_isend_irecv = original
    rules.after(log)
    problem = _ring_output_problem(out, q, rank, world)
    if problem is not None:
        return None, rules.broken, problem
    return (out if out is None else out.detach()), rules.broken, None


def _run_ring(ring_forward):
    def call(q, k, v, causal, world, layout="contiguous"):
        shards = run_group(_ring_rank, world, args=(ring_forward, q, k, v, causal, layout), timeout_s=RING_TIMEOUT_S)
        if any(isinstance(s, str) for s in shards):
            raise NotImplementedError
        broken = [m for _, rules, _ in shards for m in rules]
        if broken:
            raise RingRuleBroken(broken[0])
        wrong = [problem for _, _, problem in shards if problem]
        if wrong:
            raise RingOutputWrong(wrong[0])
        if any(out is None for out, _, _ in shards):
            return None
        out = _cp.unshard([out for out, _, _ in shards], "contiguous")
        if out.is_floating_point() and torch.isnan(out).any():
            raise RingRuleBroken("your output holds NaN (the inputs hold none): a block was read from a receive "
                                 "buffer before its wait() returned, or a buffer was received into while it was "
                                 "being sent. This check fills a receive buffer with NaN when the receive is "
                                 "posted; on a real network its contents are undefined until wait() returns")
        return out
    return call


def _ring_reference(q, k, v, causal, world, layout="contiguous"):
    return attention_ref(q, k, v, causal=causal)


def _ring_close(got, want) -> bool:
    """Within TOL of the float64 reference; a bf16 output (bf16 inputs: its dtype was checked on every rank)
    within bf16's own bound."""
    bound = TOL if got.dtype == torch.float64 else tolerance(got.dtype)
    err = answer_error(got, want)
    return bool(np.isfinite(err) and err <= bound)


_LAYOUTS = {"contiguous": "", "bsnh": ", q, K and V strided views of [B, n, H, D] tensors",
            "bsnh-padded": ", q, K and V strided views of [B, n, H, D + 2] tensors"}


def _ring_case(rng, world, hq, hkv, n_per_rank, causal, spread, label, dtype=torch.float64, layout="contiguous"):
    n = world * n_per_rank
    q = torch.from_numpy(rng.standard_normal((1, hq, n, 16)) * spread).to(dtype)
    k, v = (torch.from_numpy(rng.standard_normal((1, hkv, n, 16))).to(dtype) for _ in range(2))
    return case(q, k, v, causal, world, layout, label=f"W = {world}, Hq = {hq}, Hkv = {hkv}, N = {n}, "
                                                    f"{'causal' if causal else 'not causal'}, {label}"
                                                    f"{_LAYOUTS[layout]}")


def _check_ring(ring_forward, *, seed: int | None = None) -> CheckResult:
    """ring_forward(q, k, v, causal) on every rank of 2, 3 and 4 processes = one-process attention."""
    rng = np.random.default_rng(20)
    fixed = [
        # layouts: each rank's q, K and V are views of a [B, n, H, D] cache (the lab does not promise
        # contiguous inputs; gloo sends only contiguous tensors)
        _ring_case(np.random.default_rng(22), 3, 4, 2, 2, True, 1.0, "GQA", layout="bsnh"),
        # bf16 q, K, V (exercise 5's K and V are bf16): the blocks merge in float32 (block_forward_torch's lse), so
        # an output not cast back to q's dtype shows here; bf16's own bound applies to this case
        _ring_case(np.random.default_rng(21), 3, 4, 2, 3, True, 1.0, "bf16 q, K and V (o in q's dtype, bf16)",
                   dtype=torch.bfloat16),
        _ring_case(rng, 2, 2, 2, 3, False, 1.0, "scores of size ~1"),
        _ring_case(rng, 4, 2, 1, 3, True, 30.0, "MQA, scores of size ~100 (e^score overflows)"),
    ]
    rng = np.random.default_rng(seed)
    world = int(rng.integers(2, 5))
    drawn = [_ring_case(rng, world, 2, int(rng.choice([1, 2])), int(rng.integers(2, 4)), bool(rng.integers(0, 2)),
                        float(rng.uniform(0.5, 10)), "drawn at random", layout="bsnh-padded")]
    # Under the grader the student's function is a stub: its process runs the ring (and this check's rules)
    # where the student's code lives, through the driver named here.
    driver = (ring_forward.through("attnkit.classroom.labchecks.lab10:_run_ring") if hasattr(ring_forward, "through")
              else _run_ring(ring_forward))
    return run_check("ring_forward", driver, _ring_reference, fixed + drawn, tol=TOL, compare=_ring_close,
                     hint=HINT_RING, forbidden=forbidden(), fixed=len(fixed))


# ------------------------------------------------------------------------------ exercise 5
def _transfer_reference(tokens_per_rank, kv_heads, head_dim, alpha_us, beta_gb_per_s, backward):
    _, seconds = _ab.step_times(tokens_per_rank, rate=1.0, alpha=alpha_us * 1e-6, beta=beta_gb_per_s * 1e9, batch=1,
                                q_heads=kv_heads, kv_heads=kv_heads, head_dim=head_dim, itemsize=2, grad_itemsize=4,
                                backward=backward)
    return seconds * 1e6


def _check_transfer(step_transfer_us, *, seed: int | None = None) -> CheckResult:
    """step_transfer_us(n, Hkv, D, α µs, β GB/s, backward) = α + bytes/β in µs, within 0.1%."""
    fixed = [
        case(16384, 8, 128, 44.5, 374.0, False, label="N = 64k on 4 GPUs, Llama 3 8B's KV heads, an H100 "
                                                      "NVLink's α and β, forward"),
        case(16384, 8, 128, 44.5, 374.0, True, label="the same step in the backward"),
        case(512, 8, 128, 44.5, 374.0, False, label="512 tokens per rank: α is most of the time"),
        case(131072, 32, 128, 5.0, 50.0, True, label="multi-head, 50 GB/s (InfiniBand), backward: bytes dominate"),
        case(4096, 1, 64, 0.0, 450.0, False, label="α = 0"),
    ]
    rng = np.random.default_rng(seed)
    drawn = [case(int(2 ** rng.integers(9, 18)), int(rng.choice([1, 2, 4, 8, 16, 32])), int(rng.choice([64, 128])),
                  float(rng.uniform(1, 100)), float(rng.uniform(20, 900)), bool(rng.integers(0, 2)),
                  label="drawn at random") for _ in range(4)]
    wrong_type = _type_problem("step_transfer_us", step_transfer_us, fixed + drawn, _not_a_number, HINT_TRANSFER)
    if wrong_type is not None:
        return wrong_type
    return run_check("step_transfer_us", lambda *a: float(step_transfer_us(*a)), _transfer_reference, fixed + drawn,
                     tol=1e-3, hint=HINT_TRANSFER, fixed=len(fixed),
                     compare=lambda got, want: math.isfinite(got) and abs(got - want) <= 1e-3 * want)


# ------------------------------------------------------------------------------------ the lab
EXERCISES = (
    Exercise(function="zigzag_chunks", check=_check_zigzag),
    Exercise(function="predicted_work_ratio", check=_check_ratio),
    Exercise(function="merge_blocks", check=_check_merge),
    Exercise(function="ring_forward", check=_check_ring, depends=("merge_blocks",)),
    Exercise(function="step_transfer_us", check=_check_transfer),
)

check_zigzag_chunks = exercise_check(EXERCISES, "zigzag_chunks")
check_predicted_work_ratio = exercise_check(EXERCISES, "predicted_work_ratio")
check_merge_blocks = exercise_check(EXERCISES, "merge_blocks")
check_ring_forward = exercise_check(EXERCISES, "ring_forward")
check_step_transfer_us = exercise_check(EXERCISES, "step_transfer_us")


def check_lab(*, seed: int | None = None, **functions):
    """Every exercise's check: ``check_lab(zigzag_chunks=..., predicted_work_ratio=..., merge_blocks=...,
    ring_forward=..., step_transfer_us=...)``."""
    return check_exercises(EXERCISES, functions, seed=seed)
