"""Lab 05's checks accept the solution, say "not implemented yet" for the blank lab, and reject the
known-wrong kernels of lesson 5: no rescale of the accumulator, a causal mask aligned to the start
instead of the end, and query heads mapped to KV heads by h % Hkv instead of h // (Hq // Hkv)."""
import linecache
import math

import nbformat
import pytest
import torch

from attnkit.classroom.checking import is_not_implemented
from attnkit.classroom.notebooks import ROOT
from attnkit.device import ensure_triton_backend
from attnkit.labs import lab05

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

CHECKS = {"forward": lab05.check_forward, "causal": lab05.check_causal, "gqa": lab05.check_gqa}


def _notebook_namespace(relpath: str) -> dict:
    """Run a lab notebook's code cells, except the setup cell and the check cells, in a fresh namespace."""
    nb = nbformat.read(ROOT / relpath, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"][1:]  # [0] is the setup cell
    namespace: dict = {}
    for index, source in enumerate(code):
        if "lab05.check" in source:
            continue
        # Triton reads a kernel's source through `inspect`: register each cell like IPython does.
        filename = f"<{relpath} cell {index + 1}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def solution():
    return _notebook_namespace("solutions/lab05_flash_attention.ipynb")["flash_forward"]


@pytest.fixture(scope="module")
def blank():
    return _notebook_namespace("labs/lab05_flash_attention.ipynb")["flash_forward"]


# ------------------------------------------------------------------------ known-wrong kernels
NO_BUG, NO_RESCALE, CAUSAL_FROM_START, GQA_MODULO = 0, 1, 2, 3


@triton.jit
def _buggy_kernel(Q, K, V, O, stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                  stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on, n_q, n_k, sm_scale,
                  H_Q: tl.constexpr, H_KV: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    """The lab's kernel with one bug switched on by BUG (NO_BUG gives the correct kernel)."""
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=offs_m[:, None] < n_q, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if BUG == GQA_MODULO:
        kv_head = head % H_KV                       # wrong: interleaves the groups
    else:
        kv_head = head // (H_Q // H_KV)
    if BUG == CAUSAL_FROM_START:
        offset = 0                                  # wrong: j <= i, aligned to the start
    else:
        offset = n_k - n_q                          # right: j <= i + Nk - Nq, aligned to the end
    for start_n in range(0, n_k, BLOCK_N):
        keys = start_n + offs_n
        k = tl.load(K + batch * stride_kb + kv_head * stride_kh + keys[:, None] * stride_kn + offs_d[None, :],
                    mask=keys[:, None] < n_k, other=0.0)
        v = tl.load(V + batch * stride_vb + kv_head * stride_vh + keys[:, None] * stride_vn + offs_d[None, :],
                    mask=keys[:, None] < n_k, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        visible = keys[None, :] < n_k
        if CAUSAL:
            visible = visible & (keys[None, :] <= offs_m[:, None] + offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows that have seen no key yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if BUG == NO_RESCALE:
            acc = acc + tl.dot(p.to(v.dtype), v)    # wrong: the old acc keeps its old max
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             acc.to(O.dtype.element_ty), mask=offs_m[:, None] < n_q)


def _launcher(bug: int):
    def flash_forward(q, k, v, causal=False):
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        o = torch.empty_like(q)
        _buggy_kernel[(triton.cdiv(Nq, 16), B * Hq)](
            q, k, v, o, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
            Nq, Nk, 1.0 / math.sqrt(D), H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D,
            BLOCK_M=16, BLOCK_N=16, BUG=bug)
        return o
    return flash_forward


# -------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", CHECKS)
def test_accepts_the_solution(solution, name):
    result = CHECKS[name](solution)
    assert result.passed, result.report
    assert result.report.startswith("✅")


@pytest.mark.parametrize("name", CHECKS)
def test_blank_lab_is_not_implemented_yet(blank, name):
    result = CHECKS[name](blank)
    assert result.status == "not implemented", result.report
    assert "not implemented yet" in result.report and "Traceback" not in result.report


@pytest.mark.parametrize("name", CHECKS)
def test_accepts_the_bug_free_test_kernel(name):
    # The wrong kernels below differ from this one by their bug alone.
    assert CHECKS[name](_launcher(NO_BUG)).passed


@pytest.mark.parametrize("bug, name, words", [
    (NO_RESCALE, "forward", "rescale acc"),
    (CAUSAL_FROM_START, "causal", "Nq=21, Nk=50"),
    (GQA_MODULO, "gqa", "h // (Hq // Hkv)"),
])
def test_rejects_known_wrong_kernels(bug, name, words):
    result = CHECKS[name](_launcher(bug))
    assert result.status == "failed", result.report
    assert result.report.startswith("❌") and "differs from the float64 reference" in result.report
    assert words in result.report


def test_causal_offset_bug_is_invisible_when_nq_equals_nk():
    # Why the causal check needs Nq ≠ Nk: with a square mask both offsets agree.
    from attnkit import runtime
    from attnkit.reference.attention import attention_ref
    from attnkit.tolerances import rel_error, tolerance

    device = runtime().device
    q, k, v = (torch.randn(1, 1, 20, 16).half().to(device) for _ in range(3))
    out = _launcher(CAUSAL_FROM_START)(q, k, v, causal=True)
    assert rel_error(out, attention_ref(q, k, v, causal=True)) <= tolerance("float16", device)


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
