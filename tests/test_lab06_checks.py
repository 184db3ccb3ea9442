"""Lab 06's checks: the solution passes, the blank lab says "not implemented yet", and a catalogue of
wrong kernels, each the solution with one line changed as a student would change it, is rejected on
every seed. Every mutant must already fail on a fixed case (the report says "fixed"), whose inputs do
not depend on the seed; a kernel's output on identical inputs is computed once and shared between
seeds (``_memo``), so ten seeds cost little more than one."""
from __future__ import annotations

import hashlib
import linecache

import nbformat
import pytest
import torch
from mutation import FEW_SEEDS, SEEDS, assert_accepted, assert_rejected_on_every_seed, catalogue_params

from attnkit.classroom.checking import NOT_IMPLEMENTED
from attnkit.classroom.notebooks import ROOT
from attnkit.labs import lab06

SOLUTION = "solutions/lab06_flash_backward.ipynb"
LAB = "labs/lab06_flash_backward.ipynb"
ACCEPT_SEEDS = (0, 1, 2)   # correct variants: every fixed case and three random ones each


def _cells(relpath: str) -> list[str]:
    nb = nbformat.read(ROOT / relpath, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"][1:]        # [0] is the setup cell
    return [s for s in code if "lab06." not in s]                           # not the checks


def _namespace(cells: list[str], tag: str) -> dict:
    """Run the cells in a fresh namespace; Triton reads kernel source through linecache."""
    namespace: dict = {}
    for index, source in enumerate(cells):
        filename = f"<lab06 {tag} cell {index + 1}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


def _digest(value) -> object:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return (tuple(t.shape), t.stride(), str(t.dtype), hashlib.sha1(t.contiguous().numpy().tobytes()).hexdigest())
    return value


def _memo(fn):
    """fn with its results kept per input (the checks rebuild identical fixed cases on every seed)."""
    cache: dict = {}

    def call(*args, **kwargs):
        key = (tuple(_digest(a) for a in args), tuple(sorted((k, _digest(v)) for k, v in kwargs.items())))
        if key not in cache:
            cache[key] = fn(*args, **kwargs)
        out = cache[key]
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()
    call.__name__ = getattr(fn, "__name__", "memo")
    return call


def variant(replacements: list[tuple[str, str]], tag: str, kernel: str = "") -> dict:
    """The solution's namespace with each (old, new) replacement made once, in the cell that defines
    ``kernel`` (old must occur there exactly once)."""
    cells = _cells(SOLUTION)
    index = next(i for i, s in enumerate(cells) if f"def {kernel}" in s)
    for old, new in replacements:
        assert cells[index].count(old) == 1, f"{tag}: {old!r} must occur once in the cell of {kernel}"
        cells[index] = cells[index].replace(old, new)
    return _namespace(cells, tag)


def fn(name: str, replacements: list[tuple[str, str]], tag: str, kernel: str):
    f = _memo(variant(replacements, tag, kernel)[name])
    f.__name__ = tag
    return f


# -------------------------------------------------------------------------------- exercise 1: Δ
PRODUCT = "delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)"
STORE = "tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)"
ROW_TERM_WRONG = {
    "fp16 product": [(PRODUCT, "delta = tl.sum(o * do, axis=1)")],
    "converted after the product": [(PRODUCT, "delta = tl.sum((o * do).to(tl.float32), axis=1)")],
    "mean instead of sum": [(PRODUCT, PRODUCT + " / HEAD_DIM")],
    "product of the row sums": [(PRODUCT, "delta = tl.sum(o.to(tl.float32), axis=1) "
                                          "* tl.sum(do.to(tl.float32), axis=1)")],
    "sum over axis 0": [(PRODUCT, "delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=0)")],
    "dO with itself": [(PRODUCT, "delta = tl.sum(do.to(tl.float32) * do.to(tl.float32), axis=1)")],
    "no batch offset in the store": [(STORE, "tl.store(DELTA + head * n_q + offs_m, delta, mask=offs_m < n_q)")],
    "rows of the first tile": [(STORE, "tl.store(DELTA + (batch * H + head) * n_q + tl.arange(0, BLOCK_M), delta, "
                                       "mask=offs_m < n_q)")],
    "contiguous strides assumed": [("offs_m[:, None] * stride_on", "offs_m[:, None] * HEAD_DIM"),
                                   ("offs_m[:, None] * stride_don", "offs_m[:, None] * HEAD_DIM")],
}
ROW_TERM_RIGHT = {
    "solution": [],
    "program id as the row index, 2-D mask": [
        (STORE, "tl.store(DELTA + tl.program_id(1) * n_q + offs_m, delta, mask=offs_m < n_q)"),
        ("rows = offs_m[:, None] < n_q", "rows = (offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)")],
}

# ------------------------------------------------------------------------------ exercise 2: dK, dV
CAUSAL_DKDV = "p = tl.where(offs_n[None, :] <= rows[:, None] + n_k - n_q, p, 0.0)"
DKDV_WRONG = {
    "dK not scaled": [("    dk = dk * sm_scale\n", "")],
    "dV scaled too": [("    dk = dk * sm_scale\n", "    dk = dk * sm_scale\n    dv = dv * sm_scale\n")],
    "no Δ": [("ds = p * (dp - delta[:, None])\n            dk", "ds = p * dp\n            dk")],
    "Δ added": [("ds = p * (dp - delta[:, None])\n            dk", "ds = p * (dp + delta[:, None])\n            dk")],
    "causal mask aligned to the start": [(CAUSAL_DKDV, "p = tl.where(offs_n[None, :] <= rows[:, None], p, 0.0)")],
    "causal mask with <": [(CAUSAL_DKDV, CAUSAL_DKDV.replace("<=", "<"))],
    "GQA heads interleaved": [("head = kv_head * GROUP + g", "head = kv_head + g * H_KV")],
    "first head of the group only": [("for g in range(GROUP):", "for g in range(1):")],
    "P not normalised by LSE": [("p = tl.exp(s - lse[:, None])\n            if", "p = tl.exp(s)\n            if")],
    "LSE, Δ rows without the batch": [("row_base = (batch * H_Q + head) * n_q", "row_base = head * n_q")],
    "dK from P": [("dk += tl.dot(tl.trans(ds.to(q.dtype)), q)", "dk += tl.dot(tl.trans(p.to(q.dtype)), q)")],
    "dP with V untransposed": [("dp = tl.dot(do, tl.trans(v))\n            ds", "dp = tl.dot(do, v)\n            ds")],
    "hidden query tiles skipped by the start-aligned rule": [
        ("for start_m in range(0, n_q, BLOCK_M):",
         "lo = 0\n        if CAUSAL:\n            lo = tile_n * BLOCK_N // BLOCK_M * BLOCK_M\n"
         "        for start_m in range(lo, n_q, BLOCK_M):")],
}
DKDV_RIGHT = {
    "solution": [],
    "query tiles before the first visible row skipped": [
        ("for start_m in range(0, n_q, BLOCK_M):",
         "lo = 0\n        if CAUSAL:\n"
         "            lo = tl.maximum(tile_n * BLOCK_N - (n_k - n_q), 0) // BLOCK_M * BLOCK_M\n"
         "        for start_m in range(lo, n_q, BLOCK_M):")],
}

# ------------------------------------------------------------------------------------ exercise 3: dQ
HI = "hi = tl.minimum(last_row + n_k - n_q + 1, n_k)"
CAUSAL_DQ = "p = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)"
DQ_WRONG = {
    "dQ not scaled": [("    dq = dq * sm_scale\n", "")],
    "loop end without + 1": [(HI, "hi = tl.minimum(last_row + n_k - n_q, n_k)")],
    "loop end from the tile's first row": [("last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1",
                                            "last_row = tile_m * BLOCK_M")],
    "loop end without the causal shift": [(HI, "hi = tl.minimum(last_row + 1, n_k)")],
    "causal mask aligned to the start": [(CAUSAL_DQ, "p = tl.where(cols[None, :] <= offs_m[:, None], p, 0.0)")],
    "causal mask with <": [(CAUSAL_DQ, CAUSAL_DQ.replace("<=", "<"))],
    "GQA by h % Hkv": [("kv_head = head // (H_Q // H_KV)", "kv_head = head % H_KV")],
    "no Δ": [("ds = p * (dp - delta[:, None])\n        dq", "ds = p * dp\n        dq")],
    "P not normalised by LSE": [("p = tl.exp(s - lse[:, None])\n        if", "p = tl.exp(s)\n        if")],
    "dS K with K transposed": [("dq += tl.dot(ds.to(k.dtype), k)", "dq += tl.dot(ds.to(k.dtype), tl.trans(k))")],
}
DQ_RIGHT = {
    "solution": [],
    "every key tile, mask only": [("hi = n_k\n    if CAUSAL:", "hi = n_k\n    if False:")],
    "hidden scores -inf before exp": [
        ("p = tl.exp(s - lse[:, None])\n        if CAUSAL:\n            " + CAUSAL_DQ,
         "if CAUSAL:\n            s = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, s, float('-inf'))\n"
         "        p = tl.exp(s - lse[:, None])")],
}

# ------------------------------------------------------------------------------ exercise 4: prediction
PREDICTION_WRONG = {
    "the lesson's 5 products": (80, 2.5),
    "right count, lesson's ratio": (112, 2.5),
    "dK/dV kernel only": (64, 2.0),
    "dQ kernel only": (48, 1.5),
    "per tile pair": (7, 3.5),
    "ratio against one forward product": (112, 7.0),
    "8 products per pair": (128, 4.0),
    "6 products per pair": (96, 3.0),
    "count right, ratio off by 0.1": (112, 3.6),
}
PREDICTION_RIGHT = {"exact": (112, 3.5), "in the band": (112, 3.46), "NumPy integer": (torch.tensor(112).item(), 7 / 2)}


def _prediction(value):
    def predict():
        return value
    predict.__name__ = f"predict {value}"
    return predict


CATALOGUES = {
    "row_term": ("row_term", "row_term_kernel", lab06.check_row_term, ROW_TERM_WRONG, ROW_TERM_RIGHT),
    "dkdv": ("flash_dkdv", "dkdv_kernel", lab06.check_dkdv, DKDV_WRONG, DKDV_RIGHT),
    "dq": ("flash_dq", "dq_kernel", lab06.check_dq, DQ_WRONG, DQ_RIGHT),
}
WRONG_PARAMS = [pytest.param(ex, name, id=f"{ex}: {name}") for ex, (*_, wrong, _) in CATALOGUES.items()
                for name in wrong]
RIGHT_PARAMS = [pytest.param(ex, name, id=f"{ex}: {name}") for ex, (*_, right) in CATALOGUES.items()
                for name in right]


@pytest.mark.parametrize("exercise, name", WRONG_PARAMS)
def test_wrong_kernel_rejected_on_every_seed_by_a_fixed_case(exercise, name):
    function, kernel, check, wrong, _ = CATALOGUES[exercise]
    mutant = fn(function, wrong[name], name, kernel)
    assert_rejected_on_every_seed(check, mutant, FEW_SEEDS, contains="fixed")


@pytest.mark.parametrize("exercise, name", RIGHT_PARAMS)
def test_correct_kernel_accepted(exercise, name):
    function, kernel, check, _, right = CATALOGUES[exercise]
    assert_accepted(check, fn(function, right[name], name, kernel), ACCEPT_SEEDS)


@pytest.mark.parametrize("value", catalogue_params({k: _prediction(v) for k, v in PREDICTION_WRONG.items()}))
def test_wrong_prediction_rejected(value):
    assert_rejected_on_every_seed(lab06.check_prediction, value, SEEDS)


@pytest.mark.parametrize("value", catalogue_params({k: _prediction(v) for k, v in PREDICTION_RIGHT.items()}))
def test_prediction_accepted(value):
    assert_accepted(lab06.check_prediction, value, SEEDS)


def test_calling_the_course_backward_is_refused():
    from attnkit.kernels.flash import flash_attention_backward

    def borrowed(q, k, v, o, lse, do, causal=False):
        return flash_attention_backward(do, q, k, v, o, lse, causal=causal)[0]

    def autograd(q, k, v, o, lse, do, causal=False):
        q = q.detach().clone().requires_grad_()
        scores = q.float() @ k.float().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)
        torch.autograd.backward(scores.sum())
        return q.grad

    def the_checks_own_reference(q, k, v, o, lse, do, causal=False):
        return lab06._reference(q, k, v, do, causal)[2].to(q.dtype)

    for cheat in (borrowed, autograd, the_checks_own_reference):
        result = lab06.check_dq(cheat, seed=0)
        assert not result.passed and "ForbiddenCall" in result.report, result.report
    assert flash_attention_backward.__name__ == "flash_attention_backward"     # restored afterwards
    import attnkit.kernels.flash_kernels as kernels
    assert "run" not in vars(kernels._bwd_dq)


def test_blank_lab_reports_not_implemented():
    ns = _namespace(_cells(LAB), "blank")
    functions = {e.function: ns[e.function] for e in lab06.EXERCISES}
    summary = lab06.check_lab(seed=0, **functions)
    assert [r.status for r in summary.results] == [NOT_IMPLEMENTED] * 4, summary


def test_count_products_counts_the_solution():
    ns = variant([], "count", "dq_kernel")
    report = lab06.count_products(ns["flash_dkdv"], ns["flash_dq"])
    assert "112 tl.dot calls" in report and "backward / forward: 3.50" in report, report


def test_launch_functions_refuse_bad_shapes():
    ns = variant([], "shapes", "dq_kernel")
    q, k = torch.zeros(1, 3, 5, 16, dtype=torch.float16), torch.zeros(1, 2, 5, 16, dtype=torch.float16)
    lse = torch.zeros(1, 3, 5)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        ns["flash_dq"](q, k, k, q, lse, q)
    with pytest.raises(ValueError, match="Nq <= Nk"):
        ns["flash_dkdv"](q, k[:, :1, :4], k[:, :1, :4], q, lse, q, causal=True)
