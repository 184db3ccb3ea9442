"""Lab 10's checks: the solution passes, every plausible wrong answer fails on every seed, other correct
answers pass; the ring runs on real process groups (gloo)."""
import math

import nbformat
import numpy as np
import pytest
import torch
import torch.distributed as dist
from mutation import FEW_SEEDS, SEEDS, assert_accepted, assert_rejected_on_every_seed, catalogue_params

from attnkit.classroom.checking import FAILED
from attnkit.classroom.labchecks import lab10
from attnkit.classroom.notebooks import ROOT
from attnkit.distributed.context_parallel import block_forward_torch


def _solution():
    nb = nbformat.read(ROOT / "solutions" / "lab10_beyond_one_gpu.ipynb", as_version=4)
    ns = {}
    for cell in nb.cells[3:]:
        if cell.cell_type == "code" and not cell.source.lstrip().startswith("check"):
            exec(cell.source, ns)
    return ns


SOLUTION = _solution()


def test_the_solution_passes_and_blanks_say_not_implemented():
    names = [e.function for e in lab10.EXERCISES]
    assert lab10.check_lab(**{n: SOLUTION[n] for n in names}, seed=3).passed

    def blank(*args, **kwargs):
        raise NotImplementedError

    summary = lab10.check_lab(**{n: blank for n in names})
    assert all(r.status == "not implemented" for r in summary.results)


# ------------------------------------------------------------------------------------ zig-zag
ZIGZAG_WRONG = {
    "mirror inside W": lambda r, w: [r, w - 1 - r],
    "off by one (2W - r)": lambda r, w: [r, 2 * w - r],
    "neighbours": lambda r, w: [2 * r, 2 * r + 1],
    "striped": lambda r, w: [r, r + w],
    "decreasing order": lambda r, w: [2 * w - 1 - r, r],
    "one chunk": lambda r, w: [r],
    "2W - 2 - r": lambda r, w: [r, 2 * w - 2 - r],
    "chunks counted from 1": lambda r, w: [r + 1, 2 * w - r],
    # the right numbers in another type than the list of ints the lab asks for (round 3: a tuple)
    "a tuple": lambda r, w: (r, 2 * w - 1 - r),
    "a NumPy array": lambda r, w: np.array([r, 2 * w - 1 - r]),
    "a torch tensor": lambda r, w: torch.tensor([r, 2 * w - 1 - r]),
    "floats": lambda r, w: [float(r), float(2 * w - 1 - r)],
    "a generator": lambda r, w: (c for c in (r, 2 * w - 1 - r)),
    "a sorted() of a NumPy array (NumPy scalars, a list)": lambda r, w: sorted(np.array([r, 2.0 * w - 1 - r])),
}
ZIGZAG_RIGHT = {
    "formula": lambda r, w: [r, 2 * w - 1 - r],
    "pairs of the two ends, as a list": lambda r, w: list(list(zip(range(w), reversed(range(w, 2 * w))))[r]),
    "sorted set": lambda r, w: sorted({r, 2 * w - 1 - r}),
    "NumPy ints in a list": lambda r, w: [np.int64(r), np.int64(2 * w - 1 - r)],
}


@pytest.mark.parametrize("mutant", catalogue_params(ZIGZAG_WRONG))
def test_zigzag_rejects(mutant):
    assert_rejected_on_every_seed(lab10.check_zigzag_chunks, mutant, SEEDS)


@pytest.mark.parametrize("correct", catalogue_params(ZIGZAG_RIGHT))
def test_zigzag_accepts(correct):
    assert_accepted(lab10.check_zigzag_chunks, correct, SEEDS)


# ------------------------------------------------------------------------------------ prediction
RATIO_WRONG = {
    "W": lambda w: w, "W - 1": lambda w: w - 1, "2W": lambda w: 2 * w, "2W + 1": lambda w: 2 * w + 1,
    "2W - 2 (diagonal forgotten)": lambda w: 2 * w - 2, "W squared": lambda w: w * w,
    "balanced": lambda w: 1.0, "triangle number": lambda w: w * (w + 1) / 2,
    "W - 1/2 (not divided by the first rank's half)": lambda w: w - 0.5,
    "last rank over the mean (2W - 1) / W": lambda w: (2 * w - 1) / w,
    "ratio the wrong way up": lambda w: 1 / (2 * w - 1),
    "four ranks' answer for every W": lambda w: 7.0,
    "a string": lambda w: f"{2 * w - 1}",
    "a 0-d tensor": lambda w: torch.tensor(2.0 * w - 1),
}
RATIO_RIGHT = {
    "2W - 1": lambda w: 2 * w - 1,
    "counted": lambda w: (w - 1 + 0.5) / 0.5,
    "integer": lambda w: int(2 * w - 1),
    "a NumPy float": lambda w: np.float64(2 * w - 1),
}


@pytest.mark.parametrize("mutant", catalogue_params(RATIO_WRONG))
def test_ratio_rejects(mutant):
    assert_rejected_on_every_seed(lab10.check_predicted_work_ratio, mutant, SEEDS)


@pytest.mark.parametrize("correct", catalogue_params(RATIO_RIGHT))
def test_ratio_accepts(correct):
    assert_accepted(lab10.check_predicted_work_ratio, correct, SEEDS)


# ------------------------------------------------------------------------------------ merge
def _weights(lse_a, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    shift = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))     # a row with no key: weights 0
    return torch.exp(lse_a - shift)[..., None], torch.exp(lse_b - shift)[..., None], lse


def merge_sum(o_a, lse_a, o_b, lse_b):
    return o_a + o_b, torch.logaddexp(lse_a, lse_b)


def merge_average(o_a, lse_a, o_b, lse_b):
    return (o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)


def merge_unshifted(o_a, lse_a, o_b, lse_b):
    total = torch.exp(lse_a) + torch.exp(lse_b)
    return (torch.exp(lse_a)[..., None] * o_a + torch.exp(lse_b)[..., None] * o_b) / total[..., None], torch.log(total)


def merge_lse_is_max(o_a, lse_a, o_b, lse_b):
    w_a, w_b, _ = _weights(lse_a, lse_b)
    return w_a * o_a + w_b * o_b, torch.maximum(lse_a, lse_b)


def merge_swapped_weights(o_a, lse_a, o_b, lse_b):
    w_a, w_b, lse = _weights(lse_a, lse_b)
    return w_b * o_a + w_a * o_b, lse


def merge_lse_sum(o_a, lse_a, o_b, lse_b):
    w_a, w_b, _ = _weights(lse_a, lse_b)
    return w_a * o_a + w_b * o_b, lse_a + lse_b


def merge_one_global_max(o_a, lse_a, o_b, lse_b):
    m = torch.maximum(lse_a.max(), lse_b.max())                    # one maximum for every row
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    return torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b, lse


def merge_keeps_lse_a(o_a, lse_a, o_b, lse_b):
    w_a, w_b, _ = _weights(lse_a, lse_b)
    return w_a * o_a + w_b * o_b, lse_a


def merge_weights_not_normalised(o_a, lse_a, o_b, lse_b):
    m = torch.maximum(lse_a, lse_b)
    return torch.exp(lse_a - m)[..., None] * o_a + torch.exp(lse_b - m)[..., None] * o_b, torch.logaddexp(lse_a, lse_b)


def merge_empty_lse_as_zero(o_a, lse_a, o_b, lse_b):
    """An empty block's −inf "fixed" with nan_to_num: it now weighs like keys with scores summing to 1."""
    lse_a, lse_b = (torch.nan_to_num(t, neginf=0.0) for t in (lse_a, lse_b))
    return merge_logaddexp(o_a, lse_a, o_b, lse_b)


def merge_in_float32(o_a, lse_a, o_b, lse_b):
    o, lse = merge_logaddexp(*(t.float() for t in (o_a, lse_a, o_b, lse_b)))
    return o.double(), lse.double()


def merge_no_empty_guard(o_a, lse_a, o_b, lse_b):
    """Shifts by the row maximum with no guard: a row with no key in either block gives −inf − (−inf) = NaN."""
    m = torch.maximum(lse_a, lse_b)
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    return torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b, lse


def merge_guards_the_shift_only(o_a, lse_a, o_b, lse_b):
    """Shifts by 0 where both are empty (lse right, −inf) but weighs o by e^(lse_a − lse): NaN in that row."""
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    lse = m + torch.log(torch.exp(lse_a - m) + torch.exp(lse_b - m))
    return torch.exp(lse_a - lse)[..., None] * o_a + torch.exp(lse_b - lse)[..., None] * o_b, lse


def merge_weights_from_max_only(o_a, lse_a, o_b, lse_b):
    """The larger block takes all the weight (a hard maximum instead of the softmax of the two lse)."""
    pick_a = (lse_a >= lse_b)[..., None]
    return torch.where(pick_a, o_a, o_b), torch.maximum(lse_a, lse_b)


def merge_float32_output(o_a, lse_a, o_b, lse_b):
    """Round 3: computed in float32 throughout and returned so (float32 for float64 inputs)."""
    return merge_logaddexp(*(t.float() for t in (o_a, lse_a, o_b, lse_b)))


def merge_numpy_output(o_a, lse_a, o_b, lse_b):
    """The right numbers as NumPy arrays where the lab works in torch."""
    o, lse = merge_logaddexp(o_a, lse_a, o_b, lse_b)
    return o.numpy(), lse.numpy()


def merge_lse_keepdim(o_a, lse_a, o_b, lse_b):
    """lse returned as [..., rows, 1] (kept for broadcasting) where the lab asks for [..., rows]."""
    o, lse = merge_logaddexp(o_a, lse_a, o_b, lse_b)
    return o, lse[..., None]


def merge_o_in_lse_dtype(o_a, lse_a, o_b, lse_b):
    """o cast to float32 'to match the ring's lse' (float64 inputs)."""
    o, lse = merge_logaddexp(o_a, lse_a, o_b, lse_b)
    return o.to(torch.float32), lse


MERGE_WRONG = {f.__name__: f for f in (merge_sum, merge_average, merge_unshifted, merge_lse_is_max,
                                       merge_swapped_weights, merge_lse_sum, merge_one_global_max,
                                       merge_keeps_lse_a, merge_weights_not_normalised, merge_empty_lse_as_zero,
                                       merge_in_float32, merge_weights_from_max_only, merge_no_empty_guard,
                                       merge_guards_the_shift_only, merge_float32_output, merge_numpy_output,
                                       merge_lse_keepdim, merge_o_in_lse_dtype)}


def merge_logaddexp(o_a, lse_a, o_b, lse_b):
    w_a, w_b, lse = _weights(lse_a, lse_b)
    return w_a * o_a + w_b * o_b, lse


def merge_softmax(o_a, lse_a, o_b, lse_b):
    w = torch.softmax(torch.stack([lse_a, lse_b]), dim=0)         # [2, ..., rows]; NaN where both are −inf
    w = torch.nan_to_num(w, nan=0.0)                               # a row with no key stays empty: o = 0
    return w[0][..., None] * o_a + w[1][..., None] * o_b, torch.logsumexp(torch.stack([lse_a, lse_b]), dim=0)


MERGE_RIGHT = {"solution": SOLUTION["merge_blocks"], "logaddexp": merge_logaddexp, "softmax": merge_softmax}


@pytest.mark.parametrize("mutant", catalogue_params(MERGE_WRONG))
def test_merge_rejects(mutant):
    assert_rejected_on_every_seed(lab10.check_merge_blocks, mutant, SEEDS)


@pytest.mark.parametrize("correct", catalogue_params(MERGE_RIGHT))
def test_merge_accepts(correct):
    assert_accepted(lab10.check_merge_blocks, correct, SEEDS)


# ------------------------------------------------------------------------------------ the ring
def make_ring(*, steps=None, owner_sign=-1, skip_own=False, mask_diagonal=True, mask_all=False,
              swap=True, merge=None, send_to=+1, one_buffer=False, read_before_wait=False, send_last=False,
              out=None, contiguous="kv", recv_like_input=False, double_buffered=False):
    """A ring_forward with one mistake (the defaults give the right ring); ``out(o, q)`` makes the
    returned value from the merged o (default: o in q's dtype); ``contiguous`` names the inputs made
    contiguous before the ring; ``recv_like_input``: receive buffers made like the inputs as given;
    ``double_buffered``: two pairs of receive buffers allocated once and received into in turn."""
    merge = merge or merge_logaddexp

    def ring_forward(q, k, v, causal):
        rank, world = dist.get_rank(), dist.get_world_size()
        scale = 1 / math.sqrt(q.shape[-1])
        o = lse = None
        k_in, v_in = k, v
        k, v = (k.contiguous() if "k" in contiguous else k), (v.contiguous() if "v" in contiguous else v)
        pairs = [(torch.empty_like(k), torch.empty_like(v)) for _ in range(2)]
        for step in range(world if steps is None else steps(world)):
            owner = (rank + owner_sign * step) % world
            requests = []
            if step < world - 1 or send_last:
                nk, nv = (k, v) if one_buffer else (torch.empty_like(k), torch.empty_like(v))
                if recv_like_input:
                    nk, nv = torch.empty_like(k_in), torch.empty_like(v_in)
                if double_buffered:
                    nk, nv = pairs[step % 2]
                dst, src = (rank + send_to) % world, (rank - send_to) % world
                requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, k, dst), dist.P2POp(dist.isend, v, dst),
                                                   dist.P2POp(dist.irecv, nk, src), dist.P2POp(dist.irecv, nv, src)])
            if read_before_wait and requests:
                k, v = nk, nv                                    # computes on the block still arriving
            later = owner >= rank if skip_own else owner > rank
            if not (causal and later):
                block_causal = causal and (mask_all or (mask_diagonal and owner == rank))
                o_b, lse_b = block_forward_torch(q, k, v, block_causal, scale)
                o, lse = (o_b, lse_b) if o is None else merge(o, lse, o_b, lse_b)
            for r in requests:
                r.wait()
            if requests and swap and not read_before_wait:
                k, v = nk, nv
        if o is None:
            return torch.zeros_like(q)
        return o.to(q.dtype) if out is None else out(o, q)

    return ring_forward


def ring_local_only(q, k, v, causal):
    return block_forward_torch(q, k, v, causal, 1 / math.sqrt(q.shape[-1]))[0]


def ring_average(o_a, lse_a, o_b, lse_b):
    return (o_a + o_b) / 2, torch.logaddexp(lse_a, lse_b)


def ring_all_gather(q, k, v, causal):
    """Every rank's K/V gathered by one collective, then the blocks merged: right numbers, not a ring."""
    rank, world = dist.get_rank(), dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(world)], [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(ks, k.contiguous())
    dist.all_gather(vs, v.contiguous())
    o = lse = None
    for owner in range(world):
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, ks[owner], vs[owner], causal and owner == rank,
                                             1 / math.sqrt(q.shape[-1]))
            o, lse = (o_b, lse_b) if o is None else merge_logaddexp(o, lse, o_b, lse_b)
    return o.to(q.dtype)


def ring_p2p_to_everyone(q, k, v, causal):
    """An all-gather written with sends: every rank sends its K/V to every other rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    k, v = k.contiguous(), v.contiguous()
    got = {rank: (k, v)}
    ops = []
    for peer in range(world):
        if peer != rank:
            got[peer] = (torch.empty_like(k), torch.empty_like(v))
            ops += [dist.P2POp(dist.isend, k, peer), dist.P2POp(dist.isend, v, peer),
                    dist.P2POp(dist.irecv, got[peer][0], peer), dist.P2POp(dist.irecv, got[peer][1], peer)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    o = lse = None
    for owner in range(world):
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, *got[owner], causal and owner == rank, 1 / math.sqrt(q.shape[-1]))
            o, lse = (o_b, lse_b) if o is None else merge_logaddexp(o, lse, o_b, lse_b)
    return o.to(q.dtype)


def ring_gather_then_compute(q, k, v, causal):
    """The K/V passed around the ring and every block kept, computed at the end: a gather in disguise."""
    rank, world = dist.get_rank(), dist.get_world_size()
    k, v = k.contiguous(), v.contiguous()
    blocks = [(k, v)]
    for _step in range(world - 1):
        nk, nv = torch.empty_like(k), torch.empty_like(v)
        cur = blocks[-1]
        for r in dist.batch_isend_irecv([dist.P2POp(dist.isend, cur[0], (rank + 1) % world),
                                         dist.P2POp(dist.isend, cur[1], (rank + 1) % world),
                                         dist.P2POp(dist.irecv, nk, (rank - 1) % world),
                                         dist.P2POp(dist.irecv, nv, (rank - 1) % world)]):
            r.wait()
        blocks.append((nk, nv))
    o = lse = None
    for step, (bk, bv) in enumerate(blocks):
        owner = (rank - step) % world
        if not (causal and owner > rank):
            o_b, lse_b = block_forward_torch(q, bk, bv, causal and owner == rank, 1 / math.sqrt(q.shape[-1]))
            o, lse = (o_b, lse_b) if o is None else merge_logaddexp(o, lse, o_b, lse_b)
    return o.to(q.dtype)


RING_WRONG = {
    "one step short": make_ring(steps=lambda w: w - 1),
    "own block only": ring_local_only,
    "owner counted the wrong way": make_ring(owner_sign=+1),
    "own chunk skipped under the causal mask": make_ring(skip_own=True),
    "own chunk not masked": make_ring(mask_diagonal=False),
    "every block masked": make_ring(mask_all=True),
    "received block never used": make_ring(swap=False),
    "outputs averaged": make_ring(merge=ring_average),
    "sends the wrong way round": make_ring(send_to=-1),
    "all-gather instead of a ring": ring_all_gather,
    "sends to every rank": ring_p2p_to_everyone,
    "passes every block on, computes at the end": ring_gather_then_compute,
    "one buffer sent and received into (a race)": make_ring(one_buffer=True),
    "computes on the block before wait()": make_ring(read_before_wait=True),
    "sends on the last step too": make_ring(send_last=True),
    # the right numbers in another type, dtype or shape than q's (round 3: not cast back to q's dtype)
    "output not cast to q's dtype": make_ring(out=lambda o, q: o),
    "output always float64": make_ring(out=lambda o, q: o.double()),
    "the cast forgotten on rank 1":
        make_ring(out=lambda o, q: o if dist.get_rank() == 1 else o.to(q.dtype)),
    "NumPy output": make_ring(out=lambda o, q: o.to(q.dtype).numpy()),
    "output [B, n, Hq, D]": make_ring(out=lambda o, q: o.to(q.dtype).transpose(1, 2).contiguous()),
    # layouts (round 4's class): K/V sent as they come, which gloo refuses for a strided view
    "K and V sent as given (no .contiguous())": make_ring(contiguous=""),
    "only K made contiguous": make_ring(contiguous="k"),
    "receive buffers made like the K/V given (empty_like of a strided view)": make_ring(recv_like_input=True),
}
RING_RIGHT = {
    "solution": SOLUTION["ring_forward"],
    "reversed ring (send to r - 1, owner r + s)": make_ring(owner_sign=+1, send_to=-1),
    "two pairs of receive buffers allocated once, used in turn": make_ring(double_buffered=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", catalogue_params(RING_WRONG))
def test_ring_rejects(mutant):
    assert_rejected_on_every_seed(lab10.check_ring_forward, mutant, FEW_SEEDS)


@pytest.mark.slow
@pytest.mark.parametrize("correct", catalogue_params(RING_RIGHT))
def test_ring_accepts(correct):
    assert_accepted(lab10.check_ring_forward, correct, FEW_SEEDS[:3])


def test_the_ring_may_not_call_the_course_ring():
    from attnkit.distributed.context_parallel import ring_attention

    def borrowed(q, k, v, causal):
        return ring_attention(q, k, v, causal=causal, block="torch")

    assert_rejected_on_every_seed(lab10.check_ring_forward, borrowed, (0,), contains="course's own implementation")


def test_a_failing_merge_is_named_by_the_ring_check():
    """The ring uses merge_blocks: when that exercise fails, the ring's failure says so."""
    broken = make_ring(merge=ring_average)
    ns = {"merge_blocks": ring_average, "ring_forward": broken}
    exec("def ring_forward(q, k, v, causal):\n    return inner(q, k, v, causal)", ns | {"inner": broken})
    summary = lab10.check_lab(zigzag_chunks=SOLUTION["zigzag_chunks"],
                              predicted_work_ratio=SOLUTION["predicted_work_ratio"],
                              merge_blocks=ring_average, ring_forward=broken,
                              step_transfer_us=SOLUTION["step_transfer_us"], seed=0)
    ring = next(r for r in summary.results if r.name == "ring_forward")
    assert not ring.passed and "exercise 3 (merge_blocks)" in ring.report


@pytest.mark.parametrize("mutant", ["output not cast to q's dtype", "output always float64",
                                    "the cast forgotten on rank 1"])
def test_a_ring_output_in_another_dtype_is_told_so(mutant):
    result = lab10.check_ring_forward(RING_WRONG[mutant], seed=0)
    assert result.status == FAILED and "in q's dtype" in result.report, result.report
    assert_told_as_the_check_s_verdict(result.report)


def assert_told_as_the_check_s_verdict(report: str) -> None:
    """A broken rule is the case's verdict: not "your function raised", not the line of the check that found it."""
    assert ": case " in report and "raised" not in report and "(line" not in report, report
    assert "RingRuleBroken" not in report and "RingOutputWrong" not in report, report


@pytest.mark.parametrize("mutant, reason", [
    ("all-gather instead of a ring", "a collective"), ("sends to every rank", "only to its neighbours"),
    ("passes every block on, computes at the end", "keeps one block"),
    ("one buffer sent and received into (a race)", "received into while it was being sent"),
    ("sends on the last step too", "nothing on the last step"),
    ("K and V sent as given (no .contiguous())", "not contiguous"),
    ("receive buffers made like the K/V given (empty_like of a strided view)", "not contiguous")])
def test_a_ring_that_breaks_a_rule_is_told_which(mutant, reason):
    result = lab10.check_ring_forward(RING_WRONG[mutant], seed=0)
    assert result.status == FAILED and reason in result.report, result.report
    assert_told_as_the_check_s_verdict(result.report)


# ------------------------------------------------------------------------------------ a ring step's transfer
def _transfer(n, hkv, d, alpha_us, beta, backward, *, e=2, g_e=4, alpha_times=1, beta_unit=1e9, out=1e6,
              kv_tensors=2):
    nbytes = kv_tensors * hkv * n * d * (e + (g_e if backward else 0))
    return alpha_times * alpha_us + nbytes / (beta * beta_unit) * out


TRANSFER_WRONG = {
    "milliseconds": lambda *a: _transfer(*a) / 1e3,
    "seconds": lambda *a: _transfer(*a) / 1e6,
    "GiB/s for GB/s": lambda *a: _transfer(*a, beta_unit=2**30),
    "Gb/s (bits) for GB/s": lambda *a: _transfer(*a, beta_unit=1e9 / 8),
    "alpha forgotten": lambda *a: _transfer(*a, alpha_times=0),
    "alpha per tensor sent": lambda *a: _transfer(*a, alpha_times=4 if a[5] else 2),
    "alpha read as ms": lambda *a: _transfer(*a, alpha_times=1000),
    "the forward's bytes for the backward": lambda *a: _transfer(*a[:5], False),
    "gradients in bf16": lambda *a: _transfer(*a, g_e=2),
    "K only (V forgotten)": lambda *a: _transfer(*a, kv_tensors=1),
    "bytes term left in seconds": lambda *a: _transfer(*a, out=1),
    "elements, not bytes": lambda *a: _transfer(*a, e=1, g_e=2),
    "a string": lambda *a: str(_transfer(*a)),
    "a 0-d tensor": lambda *a: torch.tensor(_transfer(*a)),
}
TRANSFER_RIGHT = {
    "formula": _transfer,
    "by parts": lambda n, hkv, d, a, b, bwd: a + (2 * hkv * n * d * 2 + (2 * hkv * n * d * 4 if bwd else 0)) / b / 1e3,
    "seconds, then µs": lambda n, hkv, d, a, b, bwd: (a * 1e-6 + 2 * hkv * n * d * (2 + 4 * bwd) / (b * 1e9)) * 1e6,
    "a NumPy float": lambda *a: np.float64(_transfer(*a)),
}


@pytest.mark.parametrize("mutant", catalogue_params(TRANSFER_WRONG))
def test_step_transfer_rejects(mutant):
    assert_rejected_on_every_seed(lab10.check_step_transfer_us, mutant, SEEDS)


@pytest.mark.parametrize("correct", catalogue_params(TRANSFER_RIGHT))
def test_step_transfer_accepts(correct):
    assert_accepted(lab10.check_step_transfer_us, correct, SEEDS)
