"""Lab 01's checks: every wrong answer of the catalogue fails on every seed, every right one passes."""
import numpy as np
import pytest
from mutants.lab01 import (
    RIGHT,
    WRONG,
    attention_loops,
    positions_float32,
    positions_loops,
    scores_einsum,
    softmax_loops,
)
from mutation import blank_tests, catalogue_tests

from attnkit.classroom.checking import FAILED
from attnkit.labs import lab01

CHECKS = {e.function: e.check for e in lab01.EXERCISES}


def blank(*args, **kwargs):
    raise NotImplementedError


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
    runs = [seen[i:i + 8] for i in range(0, 32, 8)]
    assert runs[0] == runs[1] and runs[2] != runs[3]
    assert runs[0][:4] == runs[2][:4]                                # the fixed cases come first


def test_attention_names_the_earlier_exercise_that_fails():
    # In a notebook, attention uses the student's own scores and softmax_rows.
    namespace = {"np": np}
    exec("def scores(Q, K):\n    return Q @ K.T\n"                    # exercise 1 wrong: no 1/√d
         "def softmax_rows(S):\n    e = np.exp(S - S.max(axis=1, keepdims=True))\n"
         "    return e / e.sum(axis=1, keepdims=True)\n"
         "def attention(Q, K, V, causal=False):\n    return softmax_rows(scores(Q, K)) @ V\n", namespace)
    report = lab01.check_attention(namespace["attention"], seed=0).report
    assert report.splitlines()[1] == ("   note: this uses your exercise 1 (scores), which does not pass yet: "
                                      "fix that first.")
    summary = lab01.check_lab(seed=0, scores=namespace["scores"], softmax_rows=namespace["softmax_rows"],
                              attention=namespace["attention"], sinusoidal_positions=blank)
    assert "this uses your exercise 1 (scores)" in repr(summary) and "1 of 4 exercises pass." in repr(summary)
    right = lab01.check_lab(seed=0, scores=scores_einsum, softmax_rows=softmax_loops, attention=attention_loops,
                            sinusoidal_positions=positions_float32)
    assert right.passed and "note:" not in repr(right)


def test_check_lab_names_a_missing_function():
    with pytest.raises(ValueError, match="functions: no function named sinusoidal_positions"):
        lab01.check_lab(scores=blank, softmax_rows=blank, attention=blank)
