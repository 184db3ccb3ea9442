"""Lab 07's checks: every wrong answer of the catalogue fails on every seed (50; 10 for the Triton
kernels run in the interpreter), every right one passes, the blank lab says "not implemented yet", and
an off-by-one row is diagnosed as such."""
import linecache
import os

import nbformat
import pytest
import torch
from mutants.lab07 import RIGHT, TRITON_WRONG, WRONG, _rotate, append_torch
from mutation import FEW_SEEDS, SEEDS, assert_accepted, assert_rejected_on_every_seed, catalogue_tests

from attnkit.classroom import checking
from attnkit.classroom.checking import FAILED, NOT_IMPLEMENTED
from attnkit.classroom.labchecks import lab07
from attnkit.classroom.notebooks import ROOT


@pytest.fixture(autouse=True)
def in_process(monkeypatch):
    """rope_append's cases run here, not in a child process (a fork per check of a process holding
    torch costs more than the case); the crash test switches the child process back on."""
    monkeypatch.setattr(checking, "ISOLATE", False)


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


CHECKS = {e.function: e.check for e in lab07.EXERCISES}
SOLUTION = "solutions/lab07_gqa_kv_cache.ipynb"


test_every_wrong_answer_fails_on_every_seed, test_every_right_answer_passes_on_every_seed = \
    catalogue_tests(CHECKS, WRONG, RIGHT)


def test_the_catalogue_is_large_enough():
    for name in CHECKS:
        assert len(WRONG[name]) >= 8, name
        assert len(RIGHT[name]) + (name == "rope_append") >= 3, name     # + the solution's Triton kernel


@pytest.mark.parametrize("label", list(TRITON_WRONG))
def test_a_triton_kernel_with_one_wrong_line_fails_on_every_seed(label):
    wrong = _notebook_namespace(SOLUTION, replace=TRITON_WRONG[label])
    assert_rejected_on_every_seed(CHECKS["rope_append"], wrong["rope_append"], FEW_SEEDS, contains="hint:")


# Layouts never varied (round 6's class): a kernel or a launch that reaches a cache row, head or sequence
# through the cache's shape, or writes into a copy of a cache that is a view, must fail on every seed.
OUT = "out = b * sc_b + h * sc_h + pos * sc_s + d"
LAYOUT_TRITON_WRONG = {
    "a cache row at pos · D, sc_s ignored (round 6's ra_cache_row_stride_assumed)": (
        OUT, "out = b * sc_b + h * sc_h + pos * D + d"),
    "a sequence at (b · Hkv + h) · sc_h, sc_b ignored": (
        OUT, "out = (b * (tl.num_programs(1) - HQ) + h) * sc_h + pos * sc_s + d"),
    "the caches made contiguous in the launch (the rows land in a copy)": (
        "q, k, v = q.contiguous(), k.contiguous(), v.contiguous()",
        "q, k, v, k_cache, v_cache = (t.contiguous() for t in (q, k, v, k_cache, v_cache))"),
}


def append_into_flat_rows(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3, wrong: the caches flattened to rows [B, Hkv·S_cache, D] with reshape, then row h·S_cache
    + pos written: reshape copies a cache that is a view, so the rows land in the copy."""
    B, S = q.shape[:2]
    hkv, rows = k_cache.shape[1], k_cache.shape[2]
    pos = (seqlens_k.long() + 1 - S)[:, None] + torch.arange(S)[None, :]
    k_rot = _rotate(k, pos, mode)
    k_rows, v_rows = (c.reshape(B, hkv * rows, c.shape[-1]) for c in (k_cache, v_cache))
    for b in range(B):
        for s in range(S):
            at = torch.arange(hkv) * rows + int(pos[b, s])
            k_rows[b, at], v_rows[b, at] = k_rot[b, s], v[b, s]
    return _rotate(q, pos, mode)


LAYOUT_WRONG = {
    "caches made contiguous first": lambda q, k, v, kc, vc, sk, mode="half": append_torch(
        q, k, v, kc.contiguous(), vc.contiguous(), sk, mode),
    "rows written through a reshape of the caches": append_into_flat_rows,
}


@pytest.mark.parametrize("label", list(LAYOUT_TRITON_WRONG))
def test_a_kernel_that_reaches_the_cache_through_its_shape_fails_on_every_seed(label):
    wrong = _notebook_namespace(SOLUTION, replace=LAYOUT_TRITON_WRONG[label])
    assert_rejected_on_every_seed(CHECKS["rope_append"], wrong["rope_append"], FEW_SEEDS, contains="hint:")


@pytest.mark.parametrize("label", list(LAYOUT_WRONG))
def test_an_answer_that_writes_into_a_copy_of_the_caches_fails_on_every_seed(label):
    assert_rejected_on_every_seed(CHECKS["rope_append"], LAYOUT_WRONG[label], SEEDS, contains="hint:")


def test_every_case_s_caches_are_views_inside_nan_but_one_and_k_and_v_share_their_strides():
    cases, n_fixed = lab07.append_cases(seed=0)
    layouts = set()
    for c in cases[:n_fixed]:
        q, k, v, k_cache, v_cache, seqlens_k, mode = c.args
        assert k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1 and seqlens_k.is_contiguous()
        layouts.add(k_cache.stride())
        assert k_cache.is_contiguous() or torch.isnan(k_cache.as_strided((1,), (1,), 0)).all()
    assert len(layouts) == n_fixed and sum(c.args[3].is_contiguous() for c in cases[:n_fixed]) == 1


def test_a_store_outside_the_cache_s_view_is_named():
    """A store into the padding of a cache's rows (past D) fails with the buffer named, even when every
    row of the view is right."""
    def spills(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        q_rot = append_torch(q, k, v, k_cache, v_cache, seqlens_k, mode)
        if k_cache.stride(2) > k_cache.shape[3]:
            k_cache.as_strided((1,), (1,), k_cache.storage_offset() + k_cache.shape[3]).fill_(0.0)
        return q_rot

    report = lab07.check_rope_append(spills, seed=0).report
    assert "case 1 of" in report and "elements of the buffer around k_cache changed" in report, report


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_solution_passes(solution, name):
    seeds = FEW_SEEDS if name == "rope_append" else SEEDS
    assert_accepted(CHECKS[name], solution[name], seeds)


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_blank_lab_is_not_implemented_yet(blank, name):
    result = CHECKS[name](blank[name])
    assert result.status == NOT_IMPLEMENTED, result.report
    assert "not implemented yet" in result.report and result.report.startswith(f"⏳ {name}: ")


def test_check_lab_summarizes(solution):
    summary = lab07.check_lab(seed=0, cache_bytes=solution["cache_bytes"], max_sequences=solution["max_sequences"],
                              rope=solution["rope"], rope_append=solution["rope_append"])
    assert summary.passed and repr(summary).endswith("4 of 4 exercises pass.")


@pytest.mark.parametrize("shift, diagnosis", [
    (-1, "one row too early"),      # seqlens_k taken as a length: past = seqlens_k - S
    (+1, "one row too late"),       # past = seqlens_k + 2 - S
], ids=["seqlens_k as a length (shift -1)", "one past the end (shift +1)"])
def test_rope_append_diagnoses_an_off_by_one_row(shift, diagnosis):
    result = lab07.check_rope_append(lambda *a: append_torch(*a, shift=shift), seed=0)
    report = result.report
    assert result.status == FAILED and "rope_append (cache rows of K)" in report
    assert "raised" not in report and "largest difference at index" in report
    assert f"diagnosis: your new K rows are {diagnosis}" in report
    assert "index of the LAST token" in report                                               # the hint


def test_a_triton_kernel_taking_seqlens_k_as_a_length_is_diagnosed():
    wrong = _notebook_namespace(SOLUTION, replace=TRITON_WRONG["seqlens_k taken as the length"])
    result = lab07.check_rope_append(wrong["rope_append"], seed=0)
    assert "diagnosis: your new K rows are one row too early" in result.report, result.report


def test_the_off_by_one_diagnosis_is_not_given_for_other_bugs():
    result = lab07.check_rope_append(WRONG["rope_append"]["modes swapped"], seed=0)
    assert result.status == FAILED and "diagnosis" not in result.report


@pytest.mark.parametrize("label, part, hint", [
    ("q not rotated", "rotated q", "rotate every query head too"),
    ("modes swapped", "cache rows of K", "interleaved"),
    ("V not written", "cache rows of V", "V is not rotated"),
])
def test_rope_append_names_the_part_that_differs(label, part, hint):
    result = lab07.check_rope_append(WRONG["rope_append"][label], seed=0)
    assert result.status == FAILED and f"rope_append ({part})" in result.report and hint in result.report


def test_a_right_answer_that_overwrites_q_k_v_in_place_passes():
    """Its own copies: overwriting q, k and v after reading them does not change what it is judged on."""
    def scribbling(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        q_rot = append_torch(q, k, v, k_cache, v_cache, seqlens_k, mode)
        q.zero_(), k.zero_(), v.zero_()
        return q_rot

    assert lab07.check_rope_append(scribbling, seed=0).passed


def test_a_kernel_that_zeroes_q_and_returns_it_is_rejected():
    def zeroes(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        append_torch(q, k, v, k_cache, v_cache, seqlens_k, mode)
        return q.zero_()

    result = lab07.check_rope_append(zeroes, seed=0)
    assert result.status == FAILED and "rope_append (rotated q)" in result.report


def test_a_cache_size_off_by_a_little_shows_every_digit():
    result = lab07.check_cache_bytes(WRONG["cache_bytes"]["one token too many"], seed=0)
    line = next(line for line in result.report.splitlines() if "largest difference" in line)
    expected, got = line.split("expected ")[1].split(", got ")
    assert expected != got, line


def bytes_float_then_back(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a, wrong: the right count as a float (computed in GiB, then multiplied back by 2³⁰),
    where the lab asks for an int."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes / 2**30 * 2**30


def test_a_cache_size_returned_as_a_float_fails_on_every_seed_and_says_int():
    assert_rejected_on_every_seed(lab07.check_cache_bytes, bytes_float_then_back, SEEDS,
                                  contains="cache_bytes must return an int")
    assert_rejected_on_every_seed(lab07.check_cache_bytes, lambda *a: float(RIGHT["cache_bytes"]["formula"](*a)),
                                  SEEDS[:5], contains="got float")
    assert_rejected_on_every_seed(lab07.check_cache_bytes, lambda *a: RIGHT["cache_bytes"]["formula"](*a) > 0,
                                  SEEDS[:5], contains="got bool")


@pytest.mark.parametrize("check, answer, rule", [
    (lab07.check_cache_bytes, bytes_float_then_back,
     "cache_bytes must return an int (a whole number of bytes), got float 546016380.0: keep every factor an int"),
    (lab07.check_max_sequences, lambda model, context, free_gib, dtype_bytes, window=None: 12.0,
     "max_sequences must return an int (a whole number of sequences), got float 12.0: int(...) the count"),
], ids=["cache_bytes", "max_sequences"])
def test_not_an_int_is_the_check_s_verdict_without_its_line(check, answer, rule):
    """The int rule is reported as the case's verdict: never "your function raised" nor the check's line."""
    report = check(answer, seed=0).report
    assert ": case 1 of " in report and f": {rule}" in report, report
    assert "raised" not in report and "(line" not in report and "NotAnInt" not in report, report


def test_a_rope_append_that_crashes_fails_and_names_the_case(monkeypatch):
    """A store past the cache (the KV head taken as the program's head, not head − Hq) corrupts the heap
    of the process it runs in: the check runs the cases in a child and reports the case it was on."""
    monkeypatch.setattr(checking, "ISOLATE", True)
    if not checking.can_isolate():
        pytest.skip("crash isolation is for the interpreter (a compiled kernel's stray store faults the GPU)")

    def aborts(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
        os.abort()                                    # what a corrupted heap does ("double free or corruption")

    result = lab07.check_rope_append(aborts, seed=0)
    assert result.status == FAILED and "case 1 of" in result.report and "crashed" in result.report, result.report
