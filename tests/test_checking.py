"""The lab-check machinery reports passes, blanks, wrong answers and crashes clearly."""
import numpy as np

from attnkit.checking import FAILED, NOT_IMPLEMENTED, PASSED, case, run_check, summarize


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
