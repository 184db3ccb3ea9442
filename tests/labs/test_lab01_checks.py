"""Lab 01's checks: every wrong answer of the catalogue fails on every seed, every right one passes."""
import numpy as np
import pytest
from mutants.lab01 import (
    RIGHT,
    WRONG,
    attention_loops,
    hand_rounded,
    positions_float32,
    positions_loops,
    scores_einsum,
    softmax_loops,
)
from mutation import blank_tests, catalogue_tests

from attnkit.classroom.checking import FAILED
from attnkit.classroom.labchecks import lab01

CHECKS = {e.function: e.check for e in lab01.EXERCISES}


def blank(*args, **kwargs):
    raise NotImplementedError


def _positions_in(position_type=np.int64, column_type=np.int64):
    """The sinusoidal table with the positions, or the column indices 2i, kept in a narrower type."""
    def positions(n_positions, d_model):
        pos = np.arange(n_positions).astype(position_type)[:, None]
        two_i = np.arange(0, d_model, 2).astype(column_type)
        angles = pos / 10000 ** (two_i / d_model)
        pe = np.empty((n_positions, d_model))
        pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
        return pe
    return positions


def positions_int16(n_positions, d_model):
    """Round 6's survivor: positions made int16 ('a few thousand positions at most'): past 32767 they wrap."""
    pos = np.arange(n_positions, dtype=np.int16)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.empty((n_positions, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


# Indices kept in a type too narrow for them (the class of round 6's positions_int16): each is right
# while every index fits, so the checks take positions past 65535 and column indices past 255.
WRONG = {**WRONG, "sinusoidal_positions": {
    **WRONG["sinusoidal_positions"],
    "positions in int16 (wrap past 32767)": positions_int16,
    "positions in uint16 (wrap past 65535)": _positions_in(position_type=np.uint16),
    "positions in float16 (rounded past 2048, inf past 65504)": _positions_in(position_type=np.float16),
    "column index 2i in int8 (wraps past 127)": _positions_in(column_type=np.int8)}}

test_every_wrong_answer_fails_on_every_seed, test_every_right_answer_passes_on_every_seed = \
    catalogue_tests(CHECKS, WRONG, RIGHT)


def test_the_catalogue_is_large_enough():
    for name in CHECKS:
        assert len(WRONG[name]) >= 8 and len(RIGHT[name]) >= 3, name


test_blank_reports_not_implemented = blank_tests(CHECKS)


def test_a_global_maximum_is_named_in_the_hint():
    result = lab01.check_softmax(WRONG["softmax_rows"]["one global maximum"], seed=0)
    assert result.status == FAILED and "EACH ROW's own maximum" in result.report


def test_a_float32_table_passes_and_a_difference_shows_its_digits():
    assert lab01.check_positions(positions_float32, seed=1).passed
    off = lab01.check_positions(lambda n, d: positions_loops(n, d) * (1 + 1e-7), seed=1)
    line = next(line for line in off.report.splitlines() if "largest difference" in line)
    expected, got = line.split("expected ")[1].split(", got ")
    assert expected != got, line


def test_calling_the_course_reference_fails_even_when_the_error_is_caught():
    from attnkit.reference.attention import softmax_np

    def sneaky(S):
        try:
            return softmax_np(S)
        except Exception:
            return softmax_loops(S)

    result = lab01.check_softmax(sneaky, seed=0)
    assert result.status == FAILED and "the course's own softmax_np" in result.report
    assert softmax_np(np.zeros((1, 2))).tolist() == [[0.5, 0.5]]     # restored afterwards


def test_a_check_is_the_same_for_a_seed_and_fresh_without_one():
    seen = []

    def recording(n, d):
        seen.append((n, d))
        return positions_loops(n, d)

    for seed in (5, 5, None, None):
        assert CHECKS["sinusoidal_positions"](recording, seed=seed).passed
    per_run = len(seen) // 4                                          # every run makes the same calls
    runs = [seen[i:i + per_run] for i in range(0, len(seen), per_run)]
    assert len(runs) == 4 and runs[0] == runs[1] and runs[2] != runs[3]
    assert runs[0][:8] == runs[2][:8]                                # the 8 fixed cases come first


def test_attention_names_the_earlier_exercise_that_fails():
    # In a notebook, attention uses the student's own scores and softmax_rows.
    namespace = {"np": np}
    exec("def scores(Q, K):\n    return Q @ K.T\n"                    # exercise 1 wrong: no 1/√d
         "def softmax_rows(S):\n    e = np.exp(S - S.max(axis=1, keepdims=True))\n"
         "    return e / e.sum(axis=1, keepdims=True)\n"
         "def attention(Q, K, V, causal=False):\n    return softmax_rows(scores(Q, K)) @ V\n", namespace)
    report = lab01.check_attention(namespace["attention"], seed=0).report
    assert report.splitlines()[1] == ("   note: this uses your exercise 2 (scores), which does not pass yet: "
                                      "fix that first.")
    summary = lab01.check_lab(seed=0, by_hand=blank, scores=namespace["scores"],
                              softmax_rows=namespace["softmax_rows"], attention=namespace["attention"],
                              sinusoidal_positions=blank)
    assert "this uses your exercise 2 (scores)" in repr(summary) and "1 of 5 exercises pass." in repr(summary)
    right = lab01.check_lab(seed=0, by_hand=hand_rounded, scores=scores_einsum, softmax_rows=softmax_loops,
                            attention=attention_loops, sinusoidal_positions=positions_float32)
    assert right.passed and "note:" not in repr(right)


def test_check_lab_names_a_missing_function():
    with pytest.raises(ValueError, match="functions: no function named sinusoidal_positions"):
        lab01.check_lab(by_hand=blank, scores=blank, softmax_rows=blank, attention=blank)


def test_numpy_only_is_enforced_and_says_why():
    for name, label in (("softmax_rows", "torch.softmax, back to NumPy"),
                        ("softmax_rows", "F.softmax imported inside the function"),
                        ("softmax_rows", "a helper that uses torch"), ("scores", "returns a torch tensor")):
        report = CHECKS[name](WRONG[name][label], seed=0).report
        assert "this lab is NumPy only" in report, (label, report)


def test_torch_operators_are_caught_while_the_function_runs_even_when_unseen_in_its_code():
    # A function whose code names no library (it reaches torch through an object handed in at run
    # time): the operators it runs are recorded.
    import torch

    hidden = {"lib": torch}

    def sneaky(S):
        t = hidden["lib"]
        return t.softmax(t.from_numpy(S), -1).numpy()

    report = lab01.check_softmax(sneaky, seed=0).report
    assert "ran PyTorch operators" in report and "NumPy only" in report


def test_float32_is_held_to_its_own_bound_and_float64_to_the_tight_one():
    from mutants.lab01 import softmax_float32
    S = np.array([[2999.0, 3000.0, 2998.5]])
    expected = lab01.reference_softmax(S)
    got32 = softmax_float32(S)
    assert lab01.within_bound(got32, expected)                        # float32's rounding of 3000: allowed
    assert not lab01.within_bound(got32.astype(np.float64), expected)  # the same numbers claimed as float64
    assert not lab01.within_bound(got32.astype(np.float16), expected)
    assert lab01.bound_for(got32, expected) < 2e-3                # 4·u·(2·3000 + 7) + 1e-5


def test_by_hand_reports_which_entry_is_off_without_the_answer():
    report = lab01.check_by_hand(WRONG["by_hand"]["output columns swapped"], seed=0).report
    assert "the output: your entry 0 (0.4911)" in report and "1.0447" not in report
    report = lab01.check_by_hand(WRONG["by_hand"]["computed with NumPy"], seed=0).report
    assert "type the numbers you found" in report


def _course_wrapper(fn):
    """A wrapper whose code the course owns (as the grader's timer is), around the student's ``fn``."""
    namespace = {"fn": fn}
    exec(compile("def wrap(fn):\n    def call(*args, **kwargs):\n        return fn(*args, **kwargs)\n"
                 "    return call\n", lab01.__file__, "exec"), namespace)
    return namespace["wrap"](fn)


def test_the_rules_see_through_a_course_wrapper_to_the_students_function():
    assert lab01.check_by_hand(_course_wrapper(hand_rounded), seed=0).passed
    report = lab01.check_by_hand(_course_wrapper(WRONG["by_hand"]["computed with NumPy"]), seed=0).report
    assert "type the numbers you found" in report
    report = lab01.check_softmax(_course_wrapper(WRONG["softmax_rows"]["a global alias of F.softmax"]),
                                 seed=0).report
    assert "your function uses the module torch.nn.functional" in report, report
    assert lab01.check_softmax(_course_wrapper(softmax_loops), seed=0).passed


def test_softmax_is_on_a_2d_matrix_and_another_shape_is_named():
    # The exercise speaks of the rows of a matrix: axis=1 and axis=-1 are the same answer there, and an
    # answer that returns another shape is told that S is a matrix and what it returned.
    from mutants.lab01 import softmax_axis1
    result = lab01.check_softmax(softmax_axis1, seed=0)
    assert result.passed and "2-D matrix" in result.report
    report = lab01.check_softmax(WRONG["softmax_rows"]["weights flattened to 1-D"], seed=0).report
    assert "S is a matrix of shape (3, 3)" in report and "returned an array of shape (9,)" in report, report


def test_a_mask_built_from_the_scores_values_fails_on_scores_of_exactly_zero():
    for label in ("mask from the values: np.triu(S, 1) != 0", "np.tril(S), then every 0 hidden"):
        report = lab01.check_attention(WRONG["attention"][label], seed=0).report
        assert "scoring exactly 0" in report and "positions i and j" in report, (label, report)


def test_a_result_of_another_kind_is_reported_in_the_students_terms_not_raised():
    # A tuple (O, P) where O belongs once made the comparison raise; now every check reports it.
    report = lab01.check_attention(WRONG["attention"]["returns (O, P)"], seed=0).report
    assert "a tuple of 2 items where one NumPy array belongs" in report and "not (O, P)" in report, report
    report = lab01.check_softmax(WRONG["softmax_rows"]["returns (weights, row sums)"], seed=0).report
    assert "a tuple of 2 items" in report, report
    report = lab01.check_scores(WRONG["scores"]["returns a list (S.tolist())"], seed=0).report
    assert "a list where a NumPy array belongs" in report, report


def test_state_kept_between_calls_is_caught_by_the_same_shapes_with_other_values():
    from mutants.lab01 import scores_cached_by_shape
    for seed in (0, 1):          # the cache is already full on the second seed: still rejected
        report = lab01.check_scores(scores_cached_by_shape, seed=seed).report
        assert "called again with other values of the same shapes" in report, report
    # The pass line counts the cases as given: the second calls are not extra inputs.
    assert lab01.check_scores(scores_einsum, seed=0).report.endswith("on 5 fixed and 4 random inputs.")
