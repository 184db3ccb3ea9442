"""Lab 06's checks: the solution passes, the blank lab says "not implemented yet", and a catalogue of
wrong kernels, each the solution with one line changed as a student would change it, is rejected on
every seed. Every mutant must already fail on a fixed case (the report says "fixed"), whose inputs do
not depend on the seed; a kernel's output on identical inputs is computed once and shared between
seeds (``_memo``), so ten seeds cost little more than one."""
from __future__ import annotations

import hashlib
import linecache

import nbformat
import numpy as np
import pytest
import torch
from mutation import FEW_SEEDS, SEEDS, assert_accepted, assert_rejected_on_every_seed, catalogue_params

from attnkit.classroom import checking
from attnkit.classroom.checking import FAILED, NOT_IMPLEMENTED
from attnkit.classroom.labchecks import lab06
from attnkit.classroom.notebooks import ROOT

SOLUTION = "solutions/lab06_flash_backward.ipynb"
LAB = "labs/lab06_flash_backward.ipynb"
ACCEPT_SEEDS = (0, 1, 2)   # correct variants: every fixed case and three random ones each
# Every wrong kernel must fail at a fixed case (asserted below), whose inputs do not depend on the seed:
# four seeds show it, and keep the interpreter's time down.
WRONG_SEEDS = FEW_SEEDS[:4]


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """The checks run here, not in a child process, so that a mutant's outputs cached by ``_memo`` serve
    every seed; the crash tests below switch the child process back on."""
    monkeypatch.setattr(checking, "ISOLATE", False)


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
    # layouts: dO read through O's strides
    "dO through O's strides": [("do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * "
                                "stride_don",
                                "do = tl.load(DO + batch * stride_ob + head * stride_oh + offs_m[:, None] * "
                                "stride_on")],
    # sentinels: the store's mask left out
    "store without the row mask": [(STORE, "tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta)")],
    # launch sizes: the tile's rows from a hard-coded 16 (right only when block_m is 16)
    "rows of a 16-row tile, hard-coded": [(STORE, "tl.store(DELTA + (batch * H + head) * n_q + tile_m * 16 + "
                                                  "tl.arange(0, BLOCK_M), delta, mask=offs_m < n_q)")],
    # types: Δ in float64 (the lab says fp32)
    "Δ allocated in float64": [("delta = torch.empty(B, H, Nq, dtype=torch.float32",
                                "delta = torch.empty(B, H, Nq, dtype=torch.float64")],
    # state kept between calls: the first Δ of each shape returned again (the fixed case run twice)
    "the first Δ of each shape returned again": [
        ("    return delta", "    return globals().setdefault(('Δ', tuple(delta.shape)), delta)")],
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
    # layouts: V read through K's strides, dO through Q's
    "V through K's strides": [
        ("v = tl.load(V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn",
         "v = tl.load(V + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn")],
    "dO through Q's strides": [("do = tl.load(do_base + rows[:, None] * stride_don",
                                "do = tl.load(do_base + rows[:, None] * stride_qn")],
    # poison: masked loads without other=, LSE read past the rows
    "q loaded without other=": [("mask=rows[:, None] < n_q, other=0.0)\n            do = ",
                                 "mask=rows[:, None] < n_q)\n            do = ")],
    "LSE loaded without its mask": [("lse = tl.load(LSE + row_base + rows, mask=rows < n_q, other=0.0)",
                                     "lse = tl.load(LSE + row_base + rows)")],
    # sentinels: stores without the key mask
    "dV stored without the key mask": [("tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)",
                                        "tl.store(DV + out, dv.to(DV.dtype.element_ty))")],
    # precision: fp16 accumulators
    "dV accumulated in fp16": [("dv += tl.dot(tl.trans(p.to(do.dtype)), do)",
                                "dv = (dv + tl.dot(tl.trans(p.to(do.dtype)), do)).to(tl.float16).to(tl.float32)")],
    "dK accumulated in fp16": [("dk += tl.dot(tl.trans(ds.to(q.dtype)), q)",
                                "dk = (dk + tl.dot(tl.trans(ds.to(q.dtype)), q)).to(tl.float16).to(tl.float32)")],
    # launch sizes: the query loop steps by the key tile's size, or by a hard-coded 16 (right only when
    # block_m = block_n = 16)
    "query loop steps by BLOCK_N": [("for start_m in range(0, n_q, BLOCK_M):",
                                     "for start_m in range(0, n_q, BLOCK_N):")],
    "query loop steps by 16": [("for start_m in range(0, n_q, BLOCK_M):", "for start_m in range(0, n_q, 16):")],
    "launcher passes BLOCK_N=16 whatever block_n": [("BLOCK_M=block_m, BLOCK_N=block_n)",
                                                     "BLOCK_M=block_m, BLOCK_N=16)")],
    # types: dK and dV in float32 (the gradients come back in their inputs' dtype)
    "dK, dV allocated in float32": [("dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype",
                                     "dk = torch.empty(B, Hkv, Nk, D, dtype=torch.float32")],
    # layouts (fresh round 6): lse handed on as it comes to a kernel that indexes it as contiguous, or made
    # contiguous only when its rows are not (as the launcher treats q, k, v and dO)
    "lse passed on as it comes (fresh round 6)": [("    lse = lse.contiguous()\n", "")],
    "lse made contiguous only when its rows are not": [
        ("lse = lse.contiguous()", "lse = lse if lse.stride(-1) == 1 else lse.contiguous()")],
    # state kept between calls: Δ cached by o's shape
    "Δ kept by shape across calls": [
        ("delta = row_term(o, do)", "delta = globals().setdefault(('Δ', tuple(o.shape)), row_term(o, do))")],
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
    # boundaries: the loop end from the padded tile end, without its + 1 (fails only at shift ≡ 1 mod 16)
    "loop end from the padded tile end": [(HI, "hi = tl.minimum((tile_m + 1) * BLOCK_M - 1 + n_k - n_q, n_k)")],
    # layouts: dO through q's strides
    "dO through q's strides": [("offs_m[:, None] * stride_don", "offs_m[:, None] * stride_qn")],
    # poison: K without other=, V without its mask
    "K loaded without other=": [("k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], "
                                 "mask=cols[:, None] < n_k, other=0.0)",
                                 "k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], "
                                 "mask=cols[:, None] < n_k)")],
    "V loaded without its mask, relying on p = 0": [
        ("v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)",
         "v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :])")],
    # sentinels: the store without its row mask
    "dQ stored without the row mask": [("tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)",
                                        "tl.store(DQ + out, dq.to(DQ.dtype.element_ty))")],
    # precision
    "dQ accumulated in fp16": [("dq += tl.dot(ds.to(k.dtype), k)",
                                "dq = (dq + tl.dot(ds.to(k.dtype), k)).to(tl.float16).to(tl.float32)")],
    # launch sizes (fresh round 3: the key loop steps by BLOCK_M), right only when block_m = block_n
    "key loop steps by BLOCK_M": [("for start_n in range(0, hi, BLOCK_N):", "for start_n in range(0, hi, BLOCK_M):")],
    "key loop steps by 16": [("for start_n in range(0, hi, BLOCK_N):", "for start_n in range(0, hi, 16):")],
    "causal loop end from BLOCK_N rows": [("last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1",
                                           "last_row = tl.minimum((tile_m + 1) * BLOCK_N, n_q) - 1")],
    "launcher passes BLOCK_M=16 whatever block_m": [("H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m,",
                                                     "H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=16,")],
    # state kept between calls (fresh round 6): Δ cached by o's shape, the contiguous lse by its shape
    "Δ kept by o's shape across calls (fresh round 6)": [
        ("delta = row_term(o, do)", "delta = globals().setdefault(('Δ', tuple(o.shape)), row_term(o, do))")],
    "lse kept by shape across calls": [
        ("lse = lse.contiguous()", "lse = globals().setdefault(('lse', tuple(lse.shape)), lse.contiguous())")],
    # layouts: lse handed on as it comes
    "lse passed on as it comes": [("    lse = lse.contiguous()\n", "")],
    # types: dQ in float32 (the gradients come back in their inputs' dtype)
    "dQ allocated in float32": [("dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype",
                                 "dq = torch.empty(B, Hq, Nq, D, dtype=torch.float32")],
}
DQ_RIGHT = {
    "solution": [],
    "launcher runs BLOCK_N = block_m (its own choice of key tile)": [("BLOCK_M=block_m, BLOCK_N=block_n)",
                                                                      "BLOCK_M=block_m, BLOCK_N=block_m)")],
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
    # types: the count is an int
    "the count as a float": (112.0, 3.5),
    "the count as a 0-d tensor": (torch.tensor(112), 3.5),
    "the ratio as a string": (112, "3.5"),
}
PREDICTION_RIGHT = {"exact": (112, 3.5), "in the band": (112, 3.46), "tensor.item()": (torch.tensor(112).item(), 7 / 2),
                    "NumPy integer": (np.int64(112), np.float64(3.5)), "a list": [112, 3.5]}


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
    assert_rejected_on_every_seed(check, mutant, WRONG_SEEDS, contains="fixed")


@pytest.mark.parametrize("exercise, name", RIGHT_PARAMS)
def test_correct_kernel_accepted(exercise, name):
    function, kernel, check, _, right = CATALOGUES[exercise]
    seeds = ACCEPT_SEEDS if name == "solution" else ACCEPT_SEEDS[:1]     # every fixed case, and random ones
    assert_accepted(check, fn(function, right[name], name, kernel), seeds)


# Crashes: a store far outside its tensor corrupts the heap or faults; the check runs its cases in a
# child process, so the crash is a failure that names the case (``checking.isolated``).
CRASHING = {
    "dQ stored at the wrong row stride, unmasked": ("flash_dq", "dq_kernel", [
        ("tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)",
         "tl.store(DQ + out * 4096, dq.to(DQ.dtype.element_ty))")]),
    "dK stored far past the keys": ("flash_dkdv", "dkdv_kernel", [
        ("tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)",
         "tl.store(DK + out + (1 << 26), dk.to(DK.dtype.element_ty))")]),
}


@pytest.mark.parametrize("name", list(CRASHING))
def test_a_crashing_kernel_fails_and_names_the_case(monkeypatch, name):
    monkeypatch.setattr(checking, "ISOLATE", True)
    if not checking.can_isolate():
        pytest.skip("a compiled kernel's stray store faults the GPU context: crash isolation is for the interpreter")
    function, kernel, replacements = CRASHING[name]
    check = {"flash_dq": lab06.check_dq, "flash_dkdv": lab06.check_dkdv}[function]
    mutant = variant(replacements, name, kernel)[function]
    result = check(mutant, seed=0)
    assert result.status == FAILED, result.report
    # Where a store 2^26 elements away lands is the allocator's business: it faults (the child crashes), hits a
    # sentinel, corrupts the child's own memory so that the case computes NaN, or lands on another array so
    # that the interpreter's store raises. Each fails the named case.
    named = ("crashed", "outside the tensor", "non-finite", "your function raised")
    assert "case 1 of" in result.report and any(n in result.report for n in named), result.report


def _row_term_returning(kind):
    def row_term(o, do, block_m=16):
        delta = (o.float() * do.float()).sum(-1)
        return {"list": delta.tolist(), "[..., 1]": delta[..., None], "fp16": delta.half()}[kind]
    return row_term


def _gradients_returning(kind):
    def launch(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
        return {"dk only": torch.zeros_like(k), "dk in fp32": (torch.zeros_like(k, dtype=torch.float32),
                                                               torch.zeros_like(v)),
                "dq in fp32": torch.zeros_like(q, dtype=torch.float32)}[kind]
    return launch


@pytest.mark.parametrize("check, mutant, rule", [
    (lab06.check_row_term, _row_term_returning("list"), "row_term: expected a tensor, got list"),
    (lab06.check_row_term, _row_term_returning("[..., 1]"), "row_term: expected shape [2, 4, 17], got [2, 4, 17, 1]"),
    (lab06.check_row_term, _row_term_returning("fp16"), "row_term: expected float32 (one fp32 number per query "
                                                        "row, as the lab says), got float16"),
    (lab06.check_dkdv, _gradients_returning("dk only"), "flash_dkdv: expected a pair (dk, dv), got Tensor"),
    (lab06.check_dkdv, _gradients_returning("dk in fp32"), "dk: expected float16 (the dtype of its input"),
    (lab06.check_dq, _gradients_returning("dq in fp32"), "dq: expected float16 (the dtype of its input"),
], ids=["Δ as a list", "Δ [..., 1]", "Δ in fp16", "dK only", "dK in fp32", "dQ in fp32"])
def test_a_result_of_the_wrong_kind_is_reported_as_what_came_back(check, mutant, rule):
    """The check's verdict on the type, shape or dtype: the rule and what came back, never "your function
    raised" nor the check's own line."""
    report = check(mutant, seed=0).report
    assert "case 1 of " in report and "fixed: B=2, Hq=4, Hkv=2, Nq=17, Nk=38" in report, report
    assert f"your function returned the wrong kind of result: {rule}" in report, report
    assert "raised" not in report and "(line" not in report and "hint:" in report, report


def test_the_padded_tile_end_passes_without_the_shift_one_case():
    """The loop end computed from the padded tile end drops a key only when Nk − Nq ≡ 1 (mod 16) and a
    full query tile ends there: the fixed case with shift 1 is what rejects it."""
    mutant = fn("flash_dq", DQ_WRONG["loop end from the padded tile end"], "padded end", "dq_kernel")
    report = lab06.check_dq(mutant, seed=0).report
    assert "Nq=32, Nk=33" in report, report


def test_the_solution_passes_the_tiny_causal_case_by_its_terms():
    """B=1, Nq=Nk=2, causal: dQ's rows are tiny (row 0 sees one key: dQ = 0), so a pure relative error
    of fp16 rounding looks large; the componentwise bound judges each row by its terms."""
    from attnkit.tolerances import componentwise_error, rel_error

    gen = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 1, 2, 16, generator=gen).half() for _ in range(4))
    *_, dq, _, _ = lab06.reference_backward(q, k, v, do, True)
    noisy = torch.from_numpy(dq.copy()) + 4e-4 * torch.randn(dq.shape, generator=gen, dtype=torch.float64)
    assert componentwise_error(noisy, dq, dq.magnitude) < lab06.gradient_tolerance() < rel_error(noisy, dq)


@pytest.mark.parametrize("value", catalogue_params({k: _prediction(v) for k, v in PREDICTION_WRONG.items()}))
def test_wrong_prediction_rejected(value):
    assert_rejected_on_every_seed(lab06.check_prediction, value, SEEDS)


@pytest.mark.parametrize("value", catalogue_params({k: _prediction(v) for k, v in PREDICTION_RIGHT.items()}))
def test_prediction_accepted(value):
    assert_accepted(lab06.check_prediction, value, SEEDS)


def test_calling_the_course_backward_is_refused():
    from attnkit.kernels.flash import flash_attention_backward

    def borrowed(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
        return flash_attention_backward(do, q, k, v, o, lse, causal=causal)[0]

    def autograd(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
        q = q.detach().clone().requires_grad_()
        scores = q.float() @ k.float().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)
        torch.autograd.backward(scores.sum())
        return q.grad

    def the_checks_own_reference(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
        return lab06.reference_backward(q, k, v, do, causal)[2].to(q.dtype)

    def internal_entry_point(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
        from attnkit.kernels.flash import backward
        return backward.backward(do, q, k, v, o, lse, causal=causal)[0]

    for cheat in (borrowed, autograd, the_checks_own_reference, internal_entry_point):
        result = lab06.check_dq(cheat, seed=0)
        assert not result.passed and "ForbiddenCall" in result.report, result.report
    assert flash_attention_backward.__name__ == "flash_attention_backward"     # restored afterwards
    import attnkit.kernels.flash.triton_kernels as kernels
    assert "run" not in vars(kernels.bwd_dq)


@pytest.mark.parametrize("check, name", [(lab06.check_dq, "flash_dq"), (lab06.check_dkdv, "flash_dkdv"),
                                         (lab06.check_row_term, "row_term")])
def test_a_launch_function_without_the_block_sizes_fails_and_says_so(check, name):
    """The checks launch with block_m ≠ block_n: a launch function that fixes its own sizes cannot be
    tried there, so it fails before any case runs, naming the keywords."""
    def fixed_sizes(q, k=None, v=None, o=None, lse=None, do=None, causal=False):
        raise AssertionError("never called")

    result = check(fixed_sizes, seed=0)
    assert result.status == FAILED and f"{name} must take the keyword argument" in result.report, result.report
    assert "block_m" in result.report and "BLOCK_M ≠ BLOCK_N" in result.report


def test_the_launch_sizes_are_a_case_dimension():
    """Two fixed cases launch with block_m ≠ block_n, both ways; random cases draw their sizes too."""
    assert {c[7] for c in lab06.FIXED} >= {(16, 16), (32, 16), (16, 32)}
    drawn = {c.kwargs["block_m"] * 100 + c.kwargs["block_n"] for seed in range(12)
             for c, _ in lab06.lab_cases(seed)[lab06.N_FIXED:]}
    assert len(drawn) == len(lab06.BLOCKS)


def test_lse_has_its_own_layout_and_the_first_case_comes_again():
    """lse is never contiguous (a launcher that hands it on as it comes fails), in the first case with rows
    of stride 1 (so making it contiguous only when ``stride(-1) != 1`` fails too); the last fixed case is the
    first one again, same shapes, layouts and launch sizes, other values (state kept between calls fails)."""
    cases = [c for c, _ in lab06.lab_cases(0)]
    for c in cases:
        lse = c.args[4]
        assert not lse.is_contiguous(), c.label
        assert lse.stride() != (lse.shape[1] * lse.shape[2], lse.shape[2], 1), c.label
    assert cases[0].args[4].stride(-1) == 1
    first, again = cases[0], cases[lab06.N_FIXED - 1]
    assert "called again with other values" in again.label and again.kwargs == first.kwargs
    for a, b in zip(first.args, again.args):
        if isinstance(a, torch.Tensor):
            assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
            assert not torch.equal(a, b)
        else:
            assert a == b


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
