"""Lab 07's checks accept the solution, say "not implemented yet" for the blank lab, and reject the
known-wrong answers of lesson 7: RoPE modes swapped, seqlens_k taken as a length (a row too early) or
one row too late, K rotated but Q not, and a cache size that counts query heads or forgets V."""
import linecache

import nbformat
import pytest

from attnkit.classroom.notebooks import ROOT
from attnkit.kernels import rope_append
from attnkit.labs import lab07


def _notebook_namespace(relpath: str, replace: tuple[str, str] | None = None) -> dict:
    """Run a lab notebook's code cells, except the setup cell and the check cells, in a fresh namespace
    (with ``replace = (old, new)``: one line of the code changed, which must occur exactly once)."""
    import attnkit

    nb = nbformat.read(ROOT / relpath, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"][1:]   # [0] is the setup cell
    namespace: dict = {"RT": attnkit.runtime(), "attnkit": attnkit}
    if replace is not None:
        assert sum(source.count(replace[0]) for source in code) == 1, replace
        code = [source.replace(*replace) for source in code]
    for index, source in enumerate(code):
        if "lab07.check" in source:
            continue
        filename = f"<{relpath} cell {index + 1}>"       # Triton reads a kernel's source via inspect
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def solution():
    return _notebook_namespace("solutions/lab07_gqa_kv_cache.ipynb")


@pytest.fixture(scope="module")
def blank():
    return _notebook_namespace("labs/lab07_gqa_kv_cache.ipynb")


CHECKS = {"cache_bytes": lab07.check_cache_bytes, "rope": lab07.check_rope, "rope_append": lab07.check_rope_append}


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_solution_passes(solution, name):
    result = CHECKS[name](solution[name])
    assert result.passed, result.report
    assert result.report.startswith("✅")


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_blank_lab_is_not_implemented_yet(blank, name):
    result = CHECKS[name](blank[name])
    assert result.status == "not implemented", result.report
    assert "not implemented yet" in result.report and result.report.startswith(f"⏳ {name}: ")


def test_check_lab_summarizes(solution):
    summary = lab07.check_lab(solution["cache_bytes"], solution["rope"], solution["rope_append"])
    assert summary.passed and repr(summary).endswith("3 of 3 exercises pass.")


# ------------------------------------------------------------------------------ known-wrong answers
def bytes_without_v(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    return num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes


def bytes_with_query_heads(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    from attnkit.serving.model_configs import MODELS
    q_heads = {(m.num_layers, m.num_kv_heads, m.head_dim): m.num_q_heads for m in MODELS}
    return 2 * num_layers * q_heads[(num_layers, num_kv_heads, head_dim)] * head_dim * tokens * batch * dtype_bytes


@pytest.mark.parametrize("wrong", [bytes_without_v, bytes_with_query_heads])
def test_cache_bytes_rejects(wrong):
    result = lab07.check_cache_bytes(wrong)
    assert result.status == "failed" and "kv_heads" in result.report


def test_rope_rejects_modes_swapped(solution):
    def swapped(x, positions, mode):
        return solution["rope"](x, positions, "interleaved" if mode == "half" else "half")
    result = lab07.check_rope(swapped)
    assert result.status == "failed" and "interleaved" in result.report


def _torch_append(seqlens_shift=0, rotate_q=True, swap_modes=False):
    """A wrong rope_append built on the package's PyTorch path (the caches are written in place)."""
    def student_rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        if swap_modes:
            mode = "interleaved" if mode == "half" else "half"
        q_rot, _, _ = rope_append.rope_append_torch(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k + seqlens_shift,
                                                mode=mode)
        return q_rot if rotate_q else q.clone()
    return student_rope_append


def test_the_torch_path_itself_passes():
    """So that each rejection below is due to its one bug."""
    assert lab07.check_rope_append(_torch_append()).passed


@pytest.mark.parametrize("shift, diagnosis", [
    (-1, "one row too early"),      # seqlens_k taken as a length: past = seqlens_k - S
    (+1, "one row too late"),       # past = seqlens_k + 2 - S
], ids=["seqlens_k as a length (shift -1)", "one past the end (shift +1)"])
def test_rope_append_rejects_an_off_by_one_row(shift, diagnosis):
    result = lab07.check_rope_append(_torch_append(seqlens_shift=shift))
    assert result.status == "failed", result.report
    report = result.report
    # Rejected for the right reason: the K rows differ (no error raised), named as a shift by one row.
    assert "rope_append (cache rows of K)" in report and "differs from the float64 reference" in report
    assert "raised" not in report and "largest difference at index" in report
    assert f"diagnosis: your new K rows are {diagnosis}" in report
    assert "index of the LAST token" in report                                               # the hint


def test_a_triton_kernel_taking_seqlens_k_as_a_length_is_diagnosed():
    wrong = _notebook_namespace("solutions/lab07_gqa_kv_cache.ipynb",
                                replace=("past = tl.load(seqlens_k + b) + 1 - S", "past = tl.load(seqlens_k + b) - S"))
    result = lab07.check_rope_append(wrong["rope_append"])
    assert result.status == "failed" and "rope_append (cache rows of K)" in result.report
    assert "diagnosis: your new K rows are one row too early" in result.report, result.report


def test_the_off_by_one_diagnosis_is_not_given_for_other_bugs():
    result = lab07.check_rope_append(_torch_append(swap_modes=True))
    assert result.status == "failed" and "diagnosis" not in result.report


def test_a_right_answer_that_overwrites_q_k_v_in_place_passes():
    """Its own copies: overwriting q, k and v after reading them does not change what it is judged on."""
    def scribbling(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        q_rot, _, _ = rope_append.rope_append_torch(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k, mode=mode)
        q.zero_(), k.zero_(), v.zero_()
        return q_rot

    result = lab07.check_rope_append(scribbling)
    assert result.passed, result.report


def test_a_kernel_that_zeroes_q_and_returns_it_is_rejected():
    def zeroes(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        rope_append.rope_append_torch(q, k, v, k_cache, v_cache, seqlens_k=seqlens_k, mode=mode)
        return q.zero_()

    result = lab07.check_rope_append(zeroes)
    assert result.status == "failed" and "rope_append (rotated q)" in result.report


@pytest.mark.parametrize("wrong, part, hint", [
    (_torch_append(rotate_q=False), "rotated q", "rotate every query head too"),            # K rotated, Q not
    (_torch_append(swap_modes=True), "cache rows of K", "interleaved"),                     # modes swapped
])
def test_rope_append_rejects(wrong, part, hint):
    result = lab07.check_rope_append(wrong)
    assert result.status == "failed", result.report
    assert f"rope_append ({part})" in result.report and hint in result.report


def test_rope_append_rejects_a_kernel_that_forgets_v(solution):
    def no_v(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        saved = v_cache.clone()
        q_rot = solution["rope_append"](q, k, v, k_cache, v_cache, seqlens_k, mode)
        v_cache.copy_(saved)
        return q_rot
    result = lab07.check_rope_append(no_v)
    assert result.status == "failed" and "rope_append (cache rows of V)" in result.report
