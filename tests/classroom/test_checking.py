"""The lab-check machinery reports passes, blanks, wrong answers and crashes clearly."""
import numpy as np
import pytest

from attnkit.classroom.checking import FAILED, NOT_IMPLEMENTED, PASSED, case, run_check, summarize


def reference(x):
    return np.cumsum(x)


CASES = [case(np.arange(5.0), label="5 numbers"), case(np.linspace(0, 1, 7), label="7 numbers")]


def check(fn):
    return run_check("cumsum", fn, reference, CASES, tol=1e-12, hint="add the previous total")


def test_correct_answer_passes_with_a_deterministic_report():
    result = check(np.cumsum)
    assert result.status == PASSED and result.passed
    assert repr(result) == "✅ cumsum: matches the float64 reference on 2 random inputs."


def test_blank_says_not_implemented():
    def blank(x):
        raise NotImplementedError

    result = check(blank)
    assert result.status == NOT_IMPLEMENTED and not result.passed
    assert "not implemented yet" in result.report


def test_wrong_answer_shows_expected_got_where_and_hint():
    result = check(lambda x: np.cumsum(x) * (np.arange(len(x)) != 3))
    assert result.status == FAILED
    report = result.report
    assert "case 1 of 2, 5 numbers" in report
    assert "largest difference at index [3]: expected 6, got 0" in report
    assert "hint: add the previous total" in report


def test_crash_is_reported_without_a_traceback():
    result = check(lambda x: x.nonexistent())
    assert result.status == FAILED and "raised AttributeError" in result.report
    assert "Traceback" not in result.report


def _only_lists(fn):
    """The kind of wrapper a lab's check puts around the student's function: it states a rule of the lab."""
    from attnkit.classroom.checking import WrongResult, wrong_kind

    def call(x):
        got = fn(x)
        if not isinstance(got, list):
            raise WrongResult(wrong_kind(f"cumsum must return a list, got {type(got).__name__}"))
        return np.asarray(got)
    return call


def test_a_check_s_verdict_is_reported_as_what_came_back_not_as_the_student_s_error():
    report = check(_only_lists(np.cumsum)).report
    assert report.startswith("❌ cumsum: case 1 of 2, 5 numbers: your function returned the wrong kind of result: "
                             "cumsum must return a list, got ndarray\n   hint: add the previous total"), report
    assert "raised" not in report and "WrongResult" not in report and "(line" not in report
    assert check(_only_lists(lambda x: list(np.cumsum(x)))).status == PASSED
    # the student's own error inside the wrapper is still the student's, with its line
    report = check(_only_lists(lambda x: x.nonexistent())).report
    assert "your function raised AttributeError" in report and "(line " in report


def test_a_lab_s_subclass_of_the_verdict_is_reported_alike_in_a_child_process(monkeypatch):
    from attnkit.classroom import checking

    class RuleBroken(checking.WrongResult):
        pass

    def breaks_a_rule(x):
        raise RuleBroken("rank 0 called dist.all_gather, a collective: this exercise is a ring")

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(checking, "ISOLATE", True)
    for isolate in (False, True):
        result = run_check("ring", breaks_a_rule, reference, CASES, tol=0.0, hint="-", isolate=isolate)
        assert result.status == FAILED
        assert result.report == ("❌ ring: case 1 of 2, 5 numbers: rank 0 called dist.all_gather, a collective: this "
                                 "exercise is a ring\n   hint: -")


def test_a_verdict_crosses_the_grader_s_channel_as_a_verdict():
    """Under the grader a lab's driver may run in the student's process (lab 10's ring): the check's
    verdict comes back as its own course class, so it is still reported as the verdict."""
    from attnkit.classroom.checking import WrongResult
    from attnkit.classroom.grading import codec
    from attnkit.classroom.labchecks.lab10 import RingOutputWrong

    back = codec.decode_exception(codec.encode_exception(RingOutputWrong("rank 1 of 3 returned a float32 tensor")))
    assert type(back) is RingOutputWrong and isinstance(back, WrongResult)
    assert str(back) == "rank 1 of 3 returned a float32 tensor"


def test_none_and_wrong_shape_are_failures():
    assert "returned None" in check(lambda x: None).report
    assert "expected shape (5,), got shape (4,)" in check(lambda x: np.cumsum(x)[:4]).report


def test_nan_is_never_a_pass():
    result = run_check("nan", lambda x: np.full_like(x, np.nan), reference, CASES, tol=np.inf, hint="-")
    assert result.status == FAILED


def test_summary_counts_passes():
    summary = summarize([check(np.cumsum), check(lambda x: x)])
    assert not summary.passed and repr(summary).endswith("1 of 2 exercises pass.")


# --------------------------------------------------------------- answers that write into their inputs
def test_a_right_answer_that_overwrites_its_input_fails_unless_the_check_allows_it():
    def cumsum_in_place(x):
        np.cumsum(x, out=x)                          # right, but overwrites the caller's array
        return x

    report = check(cumsum_in_place).report
    assert "case 1 of 2, 5 numbers: your function wrote into its input: argument 1 changed: element [2] " \
           "was 2, is now 3 (3 of 5 elements changed)" in report, report
    assert run_check("cumsum", cumsum_in_place, reference, CASES, tol=1e-12, hint="-",
                     inputs_unchanged=False).passed


def test_an_answer_that_zeroes_its_input_and_returns_matching_zeros_fails():
    def zero_everything(x):
        x[:] = 0                                     # were the reference run on x afterwards, it would agree
        return np.zeros_like(x)

    assert "wrote into its input" in check(zero_everything).report
    result = run_check("cumsum", zero_everything, reference, CASES, tol=1e-12, hint="-", inputs_unchanged=False)
    assert result.status == FAILED and "differs from the float64 reference" in result.report
    assert "largest difference" in result.report


def test_the_cases_are_left_untouched_for_the_next_check():
    inputs = [c.args[0].copy() for c in CASES]

    def scribble(x):
        x *= -7.0
        return x

    assert check(scribble).status == FAILED
    assert all(np.array_equal(c.args[0], before) for c, before in zip(CASES, inputs))


def test_a_reference_that_writes_into_its_input_is_not_seen_by_the_student():
    def messy_reference(x):
        out = np.cumsum(x)
        x[:] = np.nan
        return out

    result = run_check("cumsum", np.cumsum, messy_reference, CASES, tol=1e-12, hint="-")
    assert result.passed, result.report


def test_nested_inputs_and_torch_tensors_are_copied_too():
    import torch

    pair = (torch.arange(4.0), {"scale": np.array([2.0])})
    cases = [case(pair, label="a tensor and a dict holding an array")]

    def reference(p):
        return (p[0] * p[1]["scale"][0]).numpy()

    def right_but_in_place(p):
        p[1]["scale"][0] *= 1.0                      # harmless write
        return p[0].mul_(p[1]["scale"][0])           # right, and overwrites the tensor

    def wrong_zeroes_both(p):
        p[0].zero_()
        p[1]["scale"][:] = 0
        return torch.zeros(4)

    report = run_check("scaled", right_but_in_place, reference, cases, tol=1e-12, hint="-").report
    assert "argument 1[0] changed: element [1] was 1, is now 2 (3 of 4 elements changed)" in report, report
    assert run_check("scaled", right_but_in_place, reference, cases, tol=1e-12, hint="-",
                     inputs_unchanged=False).passed
    assert run_check("scaled", wrong_zeroes_both, reference, cases, tol=1e-12, hint="-",
                     inputs_unchanged=False).status == FAILED
    assert torch.equal(pair[0], torch.arange(4.0)) and pair[1]["scale"][0] == 2.0


# ------------------------------------------------------------------ digits, dtypes, structure, dependencies
def test_a_small_difference_is_written_with_enough_digits_to_see_it():
    result = check(lambda x: np.cumsum(x) * (1 + 1e-9))
    line = next(line for line in result.report.splitlines() if "largest difference" in line)
    assert line == "   largest difference at index [4]: expected 10, got 10.00000001"


def test_a_float32_answer_gets_the_float32_bound_and_a_float16_one_does_not():
    from attnkit.classroom.checking import within_dtype_tolerance

    compare = within_dtype_tolerance(1e-12)
    exact = np.linspace(0.1, 1.0, 50)
    assert compare(exact.astype(np.float32), exact) and compare(exact, exact)
    assert not compare(exact.astype(np.float16), exact)
    assert not compare(exact.astype(np.float32) * np.float32(1 + 1e-4), exact)
    coarse = run_check("cumsum", lambda x: np.cumsum(x).astype(np.float16), reference, CASES, tol=1e-12, hint="h",
                       compare=compare)
    assert coarse.status == FAILED and "(your answer is float16, too coarse for this check" in coarse.report


def test_a_forbidden_function_fails_the_answer_even_when_its_error_is_caught():
    from attnkit.classroom.checking import ForbiddenCall, forbidden_calls

    def course_cumsum(x):
        return np.cumsum(x)

    alias = course_cumsum                            # a notebook's own name for it

    def sneaky(x):
        try:
            return alias(x)
        except ForbiddenCall:
            return np.cumsum(x)

    result = run_check("cumsum", sneaky, np.cumsum, CASES, tol=1e-12, hint="h", forbidden=[course_cumsum])
    assert result.status == FAILED and "called the course's own course_cumsum" in result.report
    assert alias(np.ones(2)).tolist() == [1.0, 2.0]                     # restored afterwards
    with pytest.raises(ValueError, match="functions: .* is a closure"):
        with forbidden_calls([course_cumsum, _closure()]):
            pass
    assert alias(np.ones(2)).tolist() == [1.0, 2.0]


def _closure():
    captured = 1

    def inner(x):
        return x + captured
    return inner


def test_a_memory_limit_fails_an_answer_that_allocates_more():
    from attnkit.classroom.checking import with_memory_limit

    x = np.ones(1000)
    small = [with_memory_limit(case(x, label="1000 numbers"), 64 * 1024)]
    assert run_check("cumsum", np.cumsum, np.cumsum, small, tol=1e-12, hint="h").passed
    wasteful = run_check("cumsum", lambda v: np.cumsum(np.outer(v, v)[0]), np.cumsum, small, tol=1e-12, hint="h")
    assert wasteful.status == FAILED and "at its peak; this case allows at most 64.0 KiB" in wasteful.report


def test_a_one_shot_stream_is_read_once_in_one_reused_buffer():
    from attnkit.classroom.checking import OneShotStream

    stream = OneShotStream([np.array([1.0, 2.0]), np.array([5.0])])
    first = next(stream)
    assert first.tolist() == [1.0, 2.0] and next(stream).tolist() == [5.0] and first[0] == 5.0
    assert list(stream) == [] and len(stream.blocks) == 2


def test_the_pass_line_counts_fixed_and_random_inputs():
    result = run_check("cumsum", np.cumsum, reference, CASES, tol=1e-12, hint="h", fixed=1)
    assert result.report == "✅ cumsum: matches the float64 reference on 1 fixed and 1 random input."


def _dependent_exercises():
    from attnkit.classroom.checking import Exercise

    def check_double(fn, *, seed=None):
        return run_check("double", fn, lambda x: 2 * x, CASES, tol=1e-12, hint="times two")

    def check_quadruple(fn, *, seed=None):
        return run_check("quadruple", fn, lambda x: 4 * x, CASES, tol=1e-12, hint="twice double")

    return (Exercise("double", check_double), Exercise("quadruple", check_quadruple, depends=("double",)))


def test_a_check_cell_names_the_earlier_exercise_it_uses_when_that_one_fails():
    from attnkit.classroom.checking import check_exercises, exercise_check

    exercises = _dependent_exercises()
    namespace = {}
    exec("def double(x):\n    return 3 * x\ndef quadruple(x):\n    return double(double(x))\n", namespace)
    report = exercise_check(exercises, "quadruple")(namespace["quadruple"]).report
    assert report.splitlines()[0].startswith("❌ quadruple: case 1 of 2")
    assert report.splitlines()[1] == ("   note: this uses your exercise 1 (double), which does not pass yet: "
                                      "fix that first.")
    summary = check_exercises(exercises, {"double": namespace["double"], "quadruple": namespace["quadruple"]})
    assert repr(summary).count("note: this uses your exercise 1 (double)") == 1
    exec("def double(x):\n    return 2 * x\ndef quadruple(x):\n    return double(x) * 3\n", namespace)
    own_fault = exercise_check(exercises, "quadruple")(namespace["quadruple"])
    assert own_fault.status == FAILED and "note:" not in own_fault.report and "hint: twice double" in own_fault.report


def test_module_functions_lists_the_plain_functions_a_module_defines():
    from attnkit.classroom.checking import module_functions
    from attnkit.reference import online_softmax

    names = {f.__name__ for f in module_functions(online_softmax)}
    assert {"merge", "block_state", "online_max_sum", "finalize"} <= names
    assert "PartialState" not in names and "dataclass" not in names        # a class, an imported function


def test_under_nbgrader_a_check_that_does_not_pass_raises(monkeypatch):
    """nbgrader sets NBGRADER_EXECUTION while it autogrades: a failing or blank check cell must raise,
    or the test cell keeps its points; a passing one still returns its report."""
    from attnkit.classroom.labchecks import lab01

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    def blank(scores):
        raise NotImplementedError

    def wrong(scores):
        return np.exp(scores) / np.exp(scores).sum()            # one normaliser for the whole matrix

    def right(scores):
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    for student in (blank, wrong):
        with pytest.raises(AssertionError, match="softmax"):
            lab01.check_softmax(student)
    assert lab01.check_softmax(right).passed
    monkeypatch.delenv("NBGRADER_EXECUTION")
    assert not lab01.check_softmax(wrong).passed


# ------------------------------------------------------------- the defences shared by the kernel labs
def test_placed_gives_each_tensor_its_layout_inside_nan():
    import torch

    from attnkit.classroom.checking import placed

    values = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    t = placed(values, order=(2, 0, 3, 1), gap=2)
    assert torch.equal(t, values)
    assert t.stride() == (27, 1, 56, 5)            # dim 1 innermost (stride 1), then 3: 3 + 2, 0: 5·5 + 2, 2: 2·27 + 2
    storage = torch.tensor([], dtype=t.dtype).set_(t.untyped_storage())
    inside = torch.zeros(storage.numel(), dtype=torch.bool)
    offsets = sum(torch.arange(n).reshape([-1 if d == i else 1 for d in range(4)]) * s
                  for i, (n, s) in enumerate(zip(t.shape, t.stride())))
    inside[t.storage_offset() + offsets.flatten()] = True
    assert torch.isnan(storage[~inside]).all()     # every element that is not the tensor's is NaN
    with pytest.raises(ValueError, match="order"):
        placed(values, order=(0, 1, 2))


def test_guarded_allocations_name_a_store_past_the_end_and_restore_torch():
    import torch

    from attnkit.classroom.checking import guarded_allocations

    empty = torch.empty
    with guarded_allocations() as guard:
        out = torch.empty(3, 4)
        zeros = torch.zeros(5, dtype=torch.int32)
        assert torch.isnan(out).all() and int(zeros.sum()) == 0
        assert guard.damaged() is None
        whole = torch.tensor([]).set_(out.untyped_storage())
        whole[out.storage_offset() + out.numel() + 1] = 1.0        # two elements past the end
    assert torch.empty is empty
    assert guard.damaged() == "a store landed outside the tensor of shape [3, 4] made by torch.empty " \
                              "(2 elements past its end)"


def test_a_crash_in_the_child_fails_the_check_and_names_the_case(monkeypatch):
    import os
    import signal

    from attnkit.classroom import checking

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(checking, "ISOLATE", True)
    if not checking.can_isolate():
        pytest.skip("this process has started CUDA: a forked child could not use it")

    def aborts(x):
        if x > 1:
            os.kill(os.getpid(), signal.SIGABRT)
        return np.float64(x)

    cases = [case(np.float64(v), label=f"x = {v}") for v in (1.0, 2.0)]
    result = checking.run_check("crash", aborts, lambda x: x, cases, tol=0.0, hint="mask the store",
                                isolate=True)
    assert result.status == FAILED
    assert "case 2 of 2, x = 2.0: your kernel crashed" in result.report and "SIGABRT" in result.report
    assert "hint: mask the store" in result.report
    passed = checking.run_check("fine", lambda x: np.float64(x), lambda x: x, cases[:1], tol=0.0, hint="",
                                isolate=True)
    assert passed.status == PASSED


def test_masked_loads_without_other_read_nan_in_the_interpreter(monkeypatch):
    from attnkit.classroom.checking import poisoned_masked_loads
    from attnkit.device import ensure_triton_backend

    ensure_triton_backend()
    import torch
    import triton
    import triton.language as tl

    if os_interpreting() is False:
        pytest.skip("kernels are compiled here")

    @triton.jit
    def copy(x, o, n, OTHER: tl.constexpr):
        offs = tl.arange(0, 8)
        if OTHER:
            v = tl.load(x + offs, mask=offs < n, other=0.0)
        else:
            v = tl.load(x + offs, mask=offs < n)
        tl.store(o + offs, v)

    x, o = torch.ones(8), torch.empty(8)
    with poisoned_masked_loads():
        copy[(1,)](x, o, 5, OTHER=False)
        assert torch.isnan(o[5:]).all() and (o[:5] == 1).all()
        copy[(1,)](x, o, 5, OTHER=True)
        assert (o[5:] == 0).all()
    copy[(1,)](x, o, 5, OTHER=False)
    assert (o[5:] == 0).all()                      # the interpreter's own fill, once the guard is off


def os_interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def test_componentwise_error_judges_each_row_by_its_terms():
    from attnkit.tolerances import check_tolerance, componentwise_error, rel_error, with_magnitude

    ref = np.array([[1e-6, -1e-6], [3.0, 4.0]])
    magnitude = np.array([[1.0, 1.0], [3.0, 4.0]])       # row 0's terms cancelled to almost nothing
    got = ref + np.array([[1e-4, 0.0], [0.0, 0.0]])
    assert componentwise_error(got, ref, magnitude) == pytest.approx(1e-4 / np.sqrt(2))
    assert rel_error(got, ref) < 1e-4 < componentwise_error(got, ref, np.abs(ref)) / 100
    assert componentwise_error(got, ref, np.zeros_like(ref)) == np.inf             # no terms: must be exact
    assert componentwise_error(ref, ref, np.zeros_like(ref)) == 0.0
    assert componentwise_error(np.full_like(ref, np.nan), ref, magnitude) == np.inf
    bounded = with_magnitude(ref, magnitude)
    assert not run_check("rows", lambda: got, lambda: bounded, [case(label="one")], tol=1e-5, hint="").passed
    assert run_check("rows", lambda: got, lambda: bounded, [case(label="one")], tol=1e-3, hint="").passed
    assert check_tolerance("float32") == 1e-5 and check_tolerance("float32", dot=True) == 2e-3
    assert check_tolerance("float16") == check_tolerance("float16", dot=True) == 2e-3


def test_a_function_that_writes_into_its_input_fails_and_says_where():
    def softmax_in_place(S):
        S -= S.max(axis=1, keepdims=True)
        np.exp(S, out=S)
        S /= S.sum(axis=1, keepdims=True)
        return S

    def reference(S):
        e = np.exp(S - S.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    S = np.array([[1.0, 2.0, np.nan], [0.0, 0.5, 0.25]])
    cases = [case(S[:, :2].copy(), label="2×2 scores")]
    result = run_check("softmax", softmax_in_place, reference, cases, tol=1e-12, hint="h")
    assert result.status == FAILED
    assert "case 1 of 1, 2×2 scores: your function wrote into its input: argument 1 changed: element [0, 0]" \
        in result.report, result.report
    assert "(4 of 4 elements changed)" in result.report
    # The same function passes where writing into the argument is the contract.
    assert run_check("softmax", softmax_in_place, reference, cases, tol=1e-12, hint="h",
                     inputs_unchanged=False).passed
    # NaN in an input that stays NaN is no change; arrays nested in tuples are looked into.
    states = [case((S.copy(), np.zeros(2)), label="a tuple holding NaN")]
    assert run_check("first", lambda t: t[0][0, :2].copy(), lambda t: t[0][0, :2], states, tol=0.0, hint="h").passed
    report = run_check("first", lambda t: t[1].__setitem__(0, 1.0) or t[0][0, :2].copy(), lambda t: t[0][0, :2],
                       states, tol=0.0, hint="h").report
    assert "argument 1[1] changed: element [0] was 0, is now 1" in report, report
