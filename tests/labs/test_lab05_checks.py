"""Lab 05's checks: the solution and other correct kernels pass, a blank is "not implemented yet", and
a catalogue of wrong kernels, each the solution's kernel with one mistake a student makes, fails on
every seed. Every mutant must already fail on the fixed adversarial cases, which come before the
seeded ones: its report names a fixed case.

The kernels run in Triton's interpreter. A mutant's output on the fixed cases is the same for every
seed, so each mutant's launcher remembers its outputs by input (``_memo``): ten seeds cost about one.
"""
from __future__ import annotations

import hashlib
import linecache
import math
import re

import nbformat
import pytest
import torch
from mutation import FEW_SEEDS, assert_accepted, assert_rejected_on_every_seed

from attnkit.classroom import checking
from attnkit.classroom.checking import is_not_implemented
from attnkit.classroom.labchecks import lab05
from attnkit.classroom.notebooks import ROOT
from attnkit.device import ensure_triton_backend
from attnkit.tolerances import rel_error

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SOLUTION, LAB = "solutions/lab05_flash_attention.ipynb", "labs/lab05_flash_attention.ipynb"
ACCEPT_SEEDS = FEW_SEEDS[:3]          # correct kernels run the seeded cases too: three seeds of them
# Every wrong kernel must fail at a fixed case (asserted below), whose inputs do not depend on the seed:
# four seeds show it, and keep the interpreter's time down.
WRONG_SEEDS = FEW_SEEDS[:4]


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """The checks run here, not in a child process, so that a kernel's outputs cached by ``_memo`` serve
    every seed; the crash test switches the child process back on."""
    monkeypatch.setattr(checking, "ISOLATE", False)


def _code_cells(relpath: str) -> list[str]:
    return [c.source for c in nbformat.read(ROOT / relpath, as_version=4).cells if c.cell_type == "code"]


def _cell(relpath: str, marker: str) -> str:
    (source,) = [s for s in _code_cells(relpath) if marker in s]
    return source


def _memo(fn, name: str):
    """``fn`` remembering its output for each input it has seen (inputs are read, never written)."""
    seen: dict = {}

    def key(t):
        if isinstance(t, torch.Tensor):
            return (tuple(t.shape), str(t.dtype), hashlib.sha1(t.detach().cpu().numpy().tobytes()).hexdigest())
        return t

    def call(q, k, v, causal=False):
        at = (key(q), key(k), key(v), causal, q.stride(), k.stride(), v.stride())
        if at not in seen:
            seen[at] = fn(q, k, v, causal=causal)
        return tuple(t.clone() for t in seen[at])
    call.__name__ = name
    return call


def build(name: str, *replacements: tuple[str, str], relpath: str = SOLUTION, memo: bool = True):
    """The lab's launcher with its kernel taken from ``relpath``, each ``old`` replaced by ``new``."""
    kernel = _cell(relpath, "def flash_forward_kernel")
    for old, new in replacements:
        assert kernel.count(old) == 1, f"{name}: {old!r} occurs {kernel.count(old)} times in the kernel"
        kernel = kernel.replace(old, new)
    namespace = {"math": math, "torch": torch, "triton": triton, "tl": tl}
    for index, source in enumerate((kernel, _cell(relpath, "def flash_forward("))):
        # Triton reads a kernel's source through `inspect`: register each cell like IPython does.
        filename = f"<lab05 {name} {index}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    launcher = namespace["flash_forward"]
    return _memo(launcher, name) if memo else launcher


# ------------------------------------------------------------------------------ the solution's lines
S_DOT = "s = tl.dot(q, tl.trans(k)) * sm_scale"
S_MASK = 's = tl.where(keys[None, :] < n_k, s, float("-inf"))'
M_NEW = "m_new = tl.maximum(m_i, tl.max(s, axis=1))"
ALPHA = "alpha = tl.exp(m_i - m_use)"
P = "p = tl.exp(s - m_use[:, None])"
L = "l_i = l_i * alpha + tl.sum(p, axis=1)"
ACC = "acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)"
FINAL = "    acc = acc / tl.where(seen, l_i, 1.0)[:, None]\n"
M_USE = 'm_use = tl.where(m_new == float("-inf"), 0.0, m_new)'
LSE = 'lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))'
Q_LOAD = "q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)"
V_LOAD = "v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)"
O_STORE = "tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)"
LAST_ROW = "last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1"
HI = "hi = tl.minimum(last_row + n_k - n_q + 1, n_k)"
CAUSAL_MASK = 's = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))'
KV_HEAD = "kv_head = head // GROUP"
LOG2E = "1.4426950408889634"
M_START = 'm_i = tl.full([BLOCK_M], float("-inf"), tl.float32)'
SEEN = "seen = l_i > 0"

WRONG_FORWARD = {
    "no rescale of acc": [(ACC, "acc = acc + tl.dot(p.to(v.dtype), v)")],
    "no rescale of l": [(L, "l_i = l_i + tl.sum(p, axis=1)")],
    "no maximum (exp of the raw scores)": [(M_NEW, "m_new = tl.zeros([BLOCK_M], tl.float32)")],
    "the tile's row max, not the running one": [(M_NEW, "m_new = tl.max(s, axis=1)")],
    "one max for the whole tile": [(M_NEW, "m_new = tl.maximum(m_i, tl.max(tl.max(s, axis=1), axis=0))")],
    "keys j >= Nk not masked": [(S_MASK, "s = s")],
    "mask j <= Nk": [(S_MASK, S_MASK.replace("< n_k", "<= n_k"))],
    "alpha upside down": [(ALPHA, "alpha = tl.exp(m_use - m_i)")],
    "no softmax scale": [(S_DOT, "s = tl.dot(q, tl.trans(k))")],
    "scores q·k, not q·kᵀ": [(S_DOT, "s = tl.dot(q, k) * sm_scale")],
    "p normalised per tile": [(P, P + "\n        p = p / tl.sum(p, axis=1)[:, None]")],
    "no final division by l": [(FINAL, "")],
    "exp2 without log2(e)": [(ALPHA, "alpha = tl.exp2(m_i - m_use)"), (P, "p = tl.exp2(s - m_use[:, None])")],
    "max taken before the key mask": [(S_MASK, "s = s"),
                                      (P, 'p = tl.where(keys[None, :] < n_k, tl.exp(s - m_use[:, None]), 0.0)')],
    # layouts: a tensor through another's strides, a column stride ignored
    "V through K's strides": [(V_LOAD, V_LOAD.replace("stride_vn", "stride_kn").replace("stride_vd", "stride_kd"))],
    "q's column stride ignored": [("offs_d[None, :] * stride_qd", "offs_d[None, :]")],
    # poison: the column mask left out (D = 24), V without other=
    "q loaded without the column mask": [(Q_LOAD, "q = tl.load(q_ptrs, mask=offs_m[:, None] < n_q, other=0.0)")],
    "V masked without other=": [(V_LOAD, V_LOAD.replace(", other=0.0", ""))],
    "V loaded unmasked, relying on p = 0": [(V_LOAD, V_LOAD.replace(", mask=kv_mask, other=0.0", ""))],
    # sentinels: the store without its row mask
    "o stored without the row mask": [(O_STORE, O_STORE.replace("(offs_m[:, None] < n_q) & dims", "dims"))],
    # precision: fp16 running sums, log2(e) cut short
    "acc kept in fp16": [(ACC, "acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)).to(tl.float16)"
                               ".to(tl.float32)")],
    "l kept in fp16": [(L, "l_i = (l_i * alpha + tl.sum(p, axis=1)).to(tl.float16).to(tl.float32)")],
    "exp2 with log2(e) cut to 1.44": [(S_DOT, "s = tl.dot(q, tl.trans(k)) * (sm_scale * 1.44)"),
                                      (ALPHA, "alpha = tl.exp2(m_i - m_use)"), (P, "p = tl.exp2(s - m_use[:, None])"),
                                      (LSE, 'lse = tl.where(seen, (m_i + tl.log2(l_i)) / 1.44, float("-inf"))')],
    # log2(e) typed 1.4427: the scale is off by 3.4e-6, invisible in o under fp16's bound, not in the fp32 LSE
    "exp2 with log2(e) typed 1.4427": [(ALPHA, "alpha = tl.exp2((m_i - m_use) * 1.4427)"),
                                       (P, "p = tl.exp2((s - m_use[:, None]) * 1.4427)")],
    # finite stand-ins for −inf (fresh round 6): right until a row's real scores all lie below them, as
    # every score of the fixed case with q = +2¹⁵, k = −2¹⁵ does (−2³²)
    "padding keys scored −1e4 (fresh round 6)": [(S_MASK, S_MASK.replace('float("-inf")', "-1.0e4"))],
    "maximum clamped at −1e4 (fresh round 6)": [(M_USE, "m_use = tl.maximum(m_new, -1.0e4)")],
    "running maximum started at −1e9": [(M_START, M_START.replace('float("-inf")', "-1.0e9"))],
    # the LSE
    "LSE without the maximum": [(LSE, 'lse = tl.where(seen, tl.log(l_i), float("-inf"))')],
    "LSE in log2 units": [(LSE, 'lse = tl.where(seen, m_i + tl.log2(l_i), float("-inf"))')],
}
RIGHT_FORWARD = {
    "the solution": [],
    "exp2 with log2(e) in the scale": [(S_DOT, f"s = tl.dot(q, tl.trans(k)) * (sm_scale * {LOG2E})"),
                                       (ALPHA, "alpha = tl.exp2(m_i - m_use)"),
                                       (P, "p = tl.exp2(s - m_use[:, None])"),
                                       (LSE, f'lse = tl.where(seen, (m_i + tl.log2(l_i)) / {LOG2E}, float("-inf"))')],
    "acc kept normalised (no final division)": [
        (L, "l_new = l_i * alpha + tl.sum(p, axis=1)\n        l_div = tl.where(l_new > 0, l_new, 1.0)"),
        (ACC, "acc = acc * (alpha * l_i / l_div)[:, None] + tl.dot(p.to(v.dtype), v) / l_div[:, None]\n"
              "        l_i = l_new"),
        (FINAL, "")],
    "key mask on p, max of the masked scores": [
        (S_MASK, 's = tl.where(keys[None, :] < n_k, s, -1.0e30)'),
        (P, 'p = tl.where(keys[None, :] < n_k, tl.exp(s - m_use[:, None]), 0.0)')],
    # The lab's inputs are fp16 only (its text says so): p.to(tl.float16) is p.to(v.dtype) there (round 4's
    # f5_p_fp16_hardcoded).
    "p converted with p.to(tl.float16)": [(ACC, ACC.replace("p.to(v.dtype)", "p.to(tl.float16)"))],
}
WRONG_CAUSAL = {
    "hi without + 1": [(HI, "hi = tl.minimum(last_row + n_k - n_q, n_k)")],
    "mask aligned to the start (j <= i)": [(CAUSAL_MASK, CAUSAL_MASK.replace(" + n_k - n_q", ""))],
    "strict mask (j < i + Nk - Nq)": [(CAUSAL_MASK, CAUSAL_MASK.replace("<=", "<"))],
    "hi from the tile's first row": [(LAST_ROW, "last_row = tile_m * BLOCK_M")],
    "hi without the offset Nk - Nq": [(HI, "hi = tl.minimum(last_row + 1, n_k)")],
    "offset Nq - Nk": [(CAUSAL_MASK, CAUSAL_MASK.replace("+ n_k - n_q", "+ n_q - n_k"))],
    "no mask inside the diagonal tile": [(CAUSAL_MASK, "s = s")],
    "mask multiplies the scores": [(CAUSAL_MASK, "s = s * (keys[None, :] <= offs_m[:, None] + n_k - n_q)")],
    "hi = the tile's end": [(HI, "hi = tl.minimum((tile_m + 1) * BLOCK_M, n_k)")],
    "mask with the row inside the tile": [(CAUSAL_MASK, CAUSAL_MASK.replace("offs_m[:, None]",
                                                                           "tl.arange(0, BLOCK_M)[:, None]"))],
    # rows that see no key (Nq > Nk)
    "no guard for rows that see no key": [(M_USE, "m_use = m_new")],
    "rows that see no key divided by l = 0": [(FINAL, "    acc = acc / l_i[:, None]\n")],
    "mask with a large finite negative": [(CAUSAL_MASK, CAUSAL_MASK.replace('float("-inf")', "-1.0e30"))],
    # finite stand-ins for −inf: hidden keys at fp16's lowest, rows that see no key told by a finite
    # maximum, their LSE stored as −1e4 where the lab says −inf
    "hidden keys scored −65504": [(CAUSAL_MASK, CAUSAL_MASK.replace('float("-inf")', "-65504.0"))],
    "rows that see no key told by m > −1e9": [(SEEN, "seen = m_i > -1.0e9")],
    "rows that see no key given LSE = −1e4": [(LSE, LSE.replace('float("-inf")', "-1.0e4"))],
    "row maximum taken before the causal mask": [
        (CAUSAL_MASK, "m_before = tl.maximum(m_i, tl.max(s, axis=1))\n            " + CAUSAL_MASK),
        (M_NEW, "m_new = m_before if CAUSAL else tl.maximum(m_i, tl.max(s, axis=1))")],
}
RIGHT_CAUSAL = {
    "the solution": [],
    "no early stop (hi = Nk)": [(HI, "hi = n_k")],
    "hi from the tile's end, not clamped to Nq": [(LAST_ROW, "last_row = (tile_m + 1) * BLOCK_M - 1")],
}
WRONG_GQA = {
    "h % Hkv": [(KV_HEAD, "kv_head = head % (H_Q // GROUP)")],
    "h // Hkv": [(KV_HEAD, "kv_head = head // (H_Q // GROUP)")],
    "h % GROUP": [(KV_HEAD, "kv_head = head % GROUP")],
    "h · GROUP": [(KV_HEAD, "kv_head = head * GROUP")],
    "ceil(h / GROUP)": [(KV_HEAD, "kv_head = tl.cdiv(head, GROUP)")],
    "the group's first query head": [(KV_HEAD, "kv_head = head // GROUP * GROUP")],
    "(h + 1) // GROUP": [(KV_HEAD, "kv_head = (head + 1) // GROUP")],
    "always KV head 0": [(KV_HEAD, "kv_head = 0")],
}
RIGHT_GQA = {
    "the solution": [],
    "h · Hkv // Hq": [(KV_HEAD, "kv_head = head * (H_Q // GROUP) // H_Q")],
    "(h − h % GROUP) // GROUP": [(KV_HEAD, "kv_head = (head - head % GROUP) // GROUP")],
}

CHECKS = {"forward": (lab05.check_forward, lab05.FORWARD_FIXED, WRONG_FORWARD, RIGHT_FORWARD),
          "causal": (lab05.check_causal, lab05.CAUSAL_FIXED, WRONG_CAUSAL, RIGHT_CAUSAL),
          "gqa": (lab05.check_gqa, lab05.GQA_FIXED, WRONG_GQA, RIGHT_GQA)}


def _params(kind: str, index: int):
    return [pytest.param(name, catalogue, mutant, id=f"{name}: {mutant}")
            for name, entry in CHECKS.items() for catalogue in [entry[index]] for mutant in catalogue]


_BUILT: dict = {}


def built(name: str, catalogue: dict, mutant: str):
    if (name, mutant) not in _BUILT:
        _BUILT[(name, mutant)] = build(f"{name}: {mutant}", *catalogue[mutant])
    return _BUILT[(name, mutant)]


def test_every_catalogue_is_large_enough():
    for name, (_, _, wrong, right) in CHECKS.items():
        assert len(wrong) >= 8 and len(right) >= 2, name


@pytest.mark.slow
@pytest.mark.parametrize("name, catalogue, mutant", _params("wrong", 2))
def test_rejects_the_wrong_kernel_on_every_seed_at_a_fixed_case(name, catalogue, mutant):
    check, fixed = CHECKS[name][0], CHECKS[name][1]
    kernel = built(name, catalogue, mutant)
    assert_rejected_on_every_seed(check, kernel, WRONG_SEEDS, contains="hint:")
    report = check(kernel, seed=0).report
    where = re.search(r"case (\d+) of \d+", report)
    caught_at = int(where.group(1)) if where else 1
    assert caught_at <= len(fixed), f"caught by a seeded case, not a fixed one:\n{report}"


@pytest.mark.slow
@pytest.mark.parametrize("name, catalogue, variant", _params("right", 3))
def test_accepts_the_correct_kernel(name, catalogue, variant):
    assert_accepted(CHECKS[name][0], built(name, catalogue, variant), ACCEPT_SEEDS)


# --------------------------------------------------------------------- what the fixed cases are for
def test_hi_off_by_one_would_pass_without_the_tile_start_case():
    # The off-by-one bound only loses a key when the last key a tile sees starts a key tile.
    kernel = built("causal", WRONG_CAUSAL, "hi without + 1")
    q, k, v = (torch.randn(1, 1, 37, 16).half() for _ in range(3))
    assert rel_error(kernel(q, k, v, causal=True)[0], lab05.attention_ref(q, k, v, causal=True)) <= 2e-3
    report = lab05.check_causal(kernel, seed=0).report
    assert "case 1 of" in report and "query 32 sees key 32, the first key of tile 2" in report


def test_no_rescale_fails_at_the_score_gap_case():
    report = lab05.check_forward(built("forward", WRONG_FORWARD, "no rescale of acc"), seed=0).report
    assert "case 1 of" in report and "scores ±192" in report and "rescale acc" in report


def test_a_failing_loop_is_named_by_the_causal_and_gqa_checks():
    kernel = built("forward", WRONG_FORWARD, "no rescale of acc")
    for check in (lab05.check_causal, lab05.check_gqa):
        report = check(kernel, seed=0).report
        assert "note: this uses your exercise 1 (the online-softmax loop)" in report, report
    report = lab05.check_causal(built("causal", WRONG_CAUSAL, "hi without + 1"), seed=0).report
    assert "note:" not in report


def test_report_shows_the_difference_and_the_bound():
    report = lab05.check_forward(built("forward", WRONG_FORWARD, "no softmax scale"), seed=0).report
    assert re.search(r"expected -?\d+\.\d+, got -?\d+\.\d+", report), report
    assert "at most 2e-03 of the size of its terms, the float16 bound" in report


# ------------------------------------------------------------------------- no course code, no SDPA
def _uses_flash_attention(q, k, v, causal=False):
    from attnkit.kernels.flash import flash_attention_forward
    return flash_attention_forward(q, k, v, causal=causal)


def _uses_sdpa(q, k, v, causal=False):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                            is_causal=causal).half()


def _uses_reference(q, k, v, causal=False):
    return lab05.attention_ref(q, k, v, causal=causal).half()   # bound before the check ran


def _computes_with_torch(q, k, v, causal=False):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    s = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, -1) @ v).half()


def _launches_the_course_kernel(q, k, v, causal=False):
    from attnkit.kernels.flash import triton_kernels
    triton_kernels.attn_fwd[(1,)](q)
    return q


def _uses_an_internal_entry_point(q, k, v, causal=False):
    from attnkit.kernels.flash import forward
    return forward.forward(q, k, v, causal=causal)


@pytest.mark.parametrize("cheat, called", [
    (_uses_an_internal_entry_point, "attnkit.kernels.flash.forward.forward"),
    (_uses_flash_attention, "attnkit.kernels.flash.flash_attention_forward"),
    (_uses_sdpa, "torch.nn.functional.scaled_dot_product_attention"),
    (_uses_reference, "attnkit.reference.attention.attention_ref"),
    (_launches_the_course_kernel, "attnkit.kernels.flash.triton_kernels._attn_fwd"),
    (_computes_with_torch, "PyTorch's bmm (aten.bmm)"),
])
def test_calling_the_course_code_fails_and_is_restored(cheat, called):
    import torch.nn.functional as F

    from attnkit.kernels import flash
    from attnkit.kernels.flash import triton_kernels as flash_kernels

    before = (flash.flash_attention.__code__, lab05.attention_ref.__code__, F.scaled_dot_product_attention)
    result = lab05.check_forward(cheat, seed=0)
    assert result.status == "failed" and f"your function called {called}, " in result.report, result.report
    assert (flash.flash_attention.__code__, lab05.attention_ref.__code__, F.scaled_dot_product_attention) == before
    assert "run" not in vars(flash_kernels.attn_fwd)
    q = torch.randn(1, 1, 5, 16).half()
    assert rel_error(lab05.attention_ref(q, q, q), lab05.attention_ref(q, q, q)) == 0


# ------------------------------------------------------------------------ the notebooks, the blanks
@pytest.fixture(scope="module")
def solution():
    return build("solution", relpath=SOLUTION, memo=False)


@pytest.fixture(scope="module")
def blank():
    return build("blank", relpath=LAB, memo=False)


def test_solution_passes_check_lab(solution):
    summary = lab05.check_lab(flash_forward=solution, seed=1)
    assert summary.passed and repr(summary).endswith("3 of 3 exercises pass."), repr(summary)


@pytest.mark.parametrize("name", CHECKS)
def test_blank_lab_is_not_implemented_yet(blank, name):
    result = CHECKS[name][0](blank)
    assert result.status == "not implemented", result.report
    assert "not implemented yet" in result.report and "Traceback" not in result.report


def test_student_errors_are_reported_without_a_traceback():
    def crashes(q, k, v, causal=False):
        raise IndexError("tile index out of range")

    result = lab05.check_forward(crashes)
    assert result.status == "failed"
    assert "IndexError: tile index out of range" in result.report and "Traceback" not in result.report


def test_returning_none_is_reported():
    result = lab05.check_forward(lambda q, k, v, causal=False: None)
    assert result.status == "failed" and "returned None" in result.report


def test_not_a_function_is_a_value_error():
    with pytest.raises(ValueError, match="flash_forward: must be the launch function"):
        lab05.check_forward("flash_forward")
    with pytest.raises(ValueError, match="functions: no function named flash_forward"):
        lab05.check_lab(flash=None)


def test_compiler_refusing_the_placeholder_counts_as_not_implemented():
    # On a GPU the kernel is compiled, and the compiler rejects the `raise` statement itself.
    import ast

    from triton.compiler.errors import UnsupportedLanguageConstruct

    src = "def kernel(x):\n    raise NotImplementedError\n"
    node = ast.parse(src).body[0].body[0]
    exc = UnsupportedLanguageConstruct(src, node, "unsupported AST node type: Raise")
    assert is_not_implemented(exc)
    assert not is_not_implemented(UnsupportedLanguageConstruct(src.replace("raise", "return"), node,
                                                                      "unsupported AST node type: Return"))
    assert not is_not_implemented(ValueError("q: wrong shape"))


def test_a_crashing_kernel_fails_and_names_the_case(monkeypatch):
    """A store far outside o corrupts the heap or faults: the check runs in a child process and reports
    the case it was on instead of taking the notebook down."""
    monkeypatch.setattr(checking, "ISOLATE", True)
    if not checking.can_isolate():
        pytest.skip("a compiled kernel's stray store faults the GPU context: crash isolation is for the interpreter")
    kernel = build("store far away", (O_STORE, "tl.store(o_ptrs + (1 << 26), acc.to(O.dtype.element_ty))"),
                   memo=False)
    report = lab05.check_forward(kernel, seed=0).report
    # a store far away faults, hits a sentinel, or corrupts the child so the case computes NaN: each fails it
    assert "case 1 of" in report and any(n in report for n in ("crashed", "outside the tensor", "non-finite")), report


def test_a_result_of_another_kind_is_the_checks_verdict_not_an_error_of_the_students_code():
    # o alone, or (o, lse) as NumPy arrays: the report says what came back, never "your function raised".
    for got in (lambda q: q.clone(), lambda q: (q.numpy(), q[..., 0].float().numpy())):
        def launch(q, k, v, causal=False, _got=got):
            return _got(q)
        report = lab05.check_gqa(launch, seed=0).report
        assert "your function returned the wrong kind of result: flash_forward must return (o, lse)" in report, report
        assert "raised" not in report, report
