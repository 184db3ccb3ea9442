"""The lab-check machinery reports passes, blanks, wrong answers and crashes clearly."""
import numpy as np

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
def test_a_right_answer_that_overwrites_its_input_passes():
    def cumsum_in_place(x):
        np.cumsum(x, out=x)                          # right, but overwrites the caller's array
        return x

    assert check(cumsum_in_place).passed


def test_an_answer_that_zeroes_its_input_and_returns_matching_zeros_fails():
    def zero_everything(x):
        x[:] = 0                                     # were the reference run on x afterwards, it would agree
        return np.zeros_like(x)

    result = check(zero_everything)
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

    assert run_check("scaled", right_but_in_place, reference, cases, tol=1e-12, hint="-").passed
    assert run_check("scaled", wrong_zeroes_both, reference, cases, tol=1e-12, hint="-").status == FAILED
    assert torch.equal(pair[0], torch.arange(4.0)) and pair[1]["scale"][0] == 2.0
