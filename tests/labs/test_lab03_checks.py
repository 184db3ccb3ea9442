"""Lab 03's checks: every wrong answer of the catalogue fails on every seed, every right one passes,
and the lesson's claims about structure (one pass, tiles only, no course functions) are enforced."""
import numpy as np
from mutants.lab03 import (
    RIGHT,
    WRONG,
    merge_maximum,
    online_blockwise,
    tiled_row_of_tiles,
    tiled_with_merge,
)
from mutation import SEEDS, assert_rejected_on_every_seed, blank_tests, catalogue_tests

from attnkit.classroom.checking import FAILED, OneShotStream
from attnkit.classroom.labchecks import lab03

CHECKS = {e.function: e.check for e in lab03.EXERCISES}


test_every_wrong_answer_fails_on_every_seed, test_every_right_answer_passes_on_every_seed = \
    catalogue_tests(CHECKS, WRONG, RIGHT)


def test_the_catalogue_is_large_enough():
    for name in CHECKS:
        assert len(WRONG[name]) >= 8 and len(RIGHT[name]) >= 3, name


test_blank_reports_not_implemented = blank_tests(CHECKS)


def test_a_stream_is_read_once_and_reuses_its_buffer():
    stream = OneShotStream([np.arange(3.0), np.arange(3.0, 5.0)])
    kept = list(stream)
    assert [k.tolist() for k in kept] == [[3.0, 4.0, 2.0], [3.0, 4.0]] and list(stream) == []


def test_a_second_pass_is_reported_as_a_wrong_answer():
    result = lab03.check_online_softmax(WRONG["online_softmax"]["two passes over the stream"], seed=0)
    assert result.status == FAILED and "can be read only once" in result.report


def test_a_row_of_tiles_fails_on_memory_not_on_values():
    result = lab03.check_tiled_attention(tiled_row_of_tiles, seed=0)
    assert result.status == FAILED and "at its peak; this case allows at most 320.0 KiB" in result.report
    assert "the full score matrix would take 8 MiB" in result.report


def test_the_memory_limit_lies_between_a_tiled_answer_and_a_row_of_tiles():
    from attnkit.classroom.checking import memory_peak

    Q, K, V, _ = lab03.big_case()
    b = lab03.BIG
    peaks = {}
    for name, fn in (("tiled", tiled_with_merge), ("row of tiles", tiled_row_of_tiles)):
        with memory_peak() as peak:
            fn(Q, K, V, b["block_q"], b["block_k"])
        peaks[name] = peak[0]
    limit = lab03.memory_limit(**b)
    assert peaks["tiled"] * 1.5 < limit < peaks["row of tiles"] / 1.5, (peaks, limit)


def test_tiled_attention_names_merge_when_merge_fails():
    namespace = {"np": np, "tiled_with_merge": tiled_with_merge}
    exec("def merge(a, b):\n    return a[0], a[1] + b[1], a[2] + b[2]\n"        # exercise 2 wrong: no rescale
         "def tiled_attention(Q, K, V, bq, bk):\n    return tiled_with_merge(Q, K, V, bq, bk, merge=merge)\n",
         namespace)
    report = lab03.check_tiled_attention(namespace["tiled_attention"], seed=0).report
    assert report.splitlines()[1] == ("   note: this uses your exercise 2 (merge), which does not pass yet: "
                                      "fix that first.")
    summary = lab03.check_lab(seed=0, online_softmax=online_blockwise, merge=namespace["merge"],
                              tiled_attention=namespace["tiled_attention"])
    assert "this uses your exercise 2 (merge)" in repr(summary) and "1 of 3 exercises pass." in repr(summary)
    right = lab03.check_lab(seed=0, online_softmax=online_blockwise, merge=merge_maximum,
                            tiled_attention=tiled_with_merge)
    assert right.passed and "note:" not in repr(right)


def test_the_course_functions_work_again_after_a_check():
    from attnkit.reference.online_softmax import online_max_sum

    lab03.check_online_softmax(WRONG["online_softmax"]["calls the course's online_max_sum"], seed=0)
    assert online_max_sum(np.array([0.0, 0.0])) == (0.0, 2.0)


def test_check_all_is_gone():
    assert not hasattr(lab03, "check_all")


def test_the_long_row_limit_lies_between_one_pass_and_kept_copies():
    from mutants.lab03 import ONLINE_RIGHT, online_copies_then_two_passes

    from attnkit.classroom.checking import memory_peak

    def peak_of(fn):
        stream = lab03.long_stream().args[0]
        with memory_peak() as peak:
            fn(stream)
        return peak[0]

    limit = lab03.long_stream().max_bytes
    assert max(peak_of(fn) for fn in ONLINE_RIGHT.values()) * 4 < limit < peak_of(online_copies_then_two_passes) / 2


def test_a_loop_over_rows_is_counted_and_named():
    result = lab03.check_merge(WRONG["merge"]["loops over rows (the lab asks for none)"], seed=0)
    assert result.status == FAILED and "lines of Python" in result.report and "no Python loop" in result.report
    result = lab03.check_tiled_attention(WRONG["tiled_attention"]["one query row against all keys"], seed=0)
    assert result.status == FAILED and "not over single query rows" in result.report, result.report


def test_the_line_limit_lies_between_tiles_and_rows():
    from mutants.lab03 import TILED_RIGHT, tiled_row_one_liner

    t = lab03.TILES
    rng = np.random.default_rng(0)
    Q, K, V = rng.standard_normal((t["n_q"], t["d"])), rng.standard_normal((t["n_k"], t["d"])), \
        rng.standard_normal((t["n_k"], t["dv"]))
    limit = lab03.line_limit(Q, K, V, t["block_q"], t["block_k"])
    tiled = max(lab03.count_lines(fn, Q, K, V, t["block_q"], t["block_k"])[1] for fn in TILED_RIGHT.values())
    rows = lab03.count_lines(tiled_row_one_liner, Q, K, V, t["block_q"], t["block_k"])[1]
    assert tiled * 3 < limit < rows / 1.5, (tiled, limit, rows)


def test_lines_are_counted_in_a_thread_the_call_starts():
    # The grader runs a student's function in a thread of its own, started during the call.
    import threading

    def in_a_thread(a, b):
        box = {}

        def target():
            try:
                box["out"] = WRONG["merge"]["loops over rows (the lab asks for none)"](a, b)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller, as the grader does
                box["error"] = exc

        worker = threading.Thread(target=target)
        worker.start()
        worker.join()
        if "error" in box:
            raise box["error"]
        return box["out"]

    result = lab03.check_merge(in_a_thread, seed=0)
    assert result.status == FAILED and "lines of Python" in result.report, result.report


def merge_nan_to_zero(a, b):
    """Exercise 2, wrong: guards the empty state by replacing m = -inf with 0 (np.nan_to_num(m, neginf=0));
    with a empty and b's maxima near -1000, m comes out 0 and e^(m_b - 0) underflows to 0."""
    (m_a, l_a, z_a), (m_b, l_b, z_b) = a, b
    m_a, m_b = np.nan_to_num(m_a, neginf=0.0), np.nan_to_num(m_b, neginf=0.0)
    m = np.maximum(m_a, m_b)
    alpha, beta = np.exp(m_a - m), np.exp(m_b - m)
    return m, alpha * l_a + beta * l_b, alpha[:, None] * z_a + beta[:, None] * z_b


def test_a_merge_that_turns_an_empty_maximum_into_zero_fails_on_every_seed():
    assert_rejected_on_every_seed(lab03.check_merge, merge_nan_to_zero, SEEDS, contains="hint:")
    report = lab03.check_merge(merge_nan_to_zero, seed=0).report
    assert "b's maxima are near -1000" in report, report


def test_far_blocks_and_partly_empty_states_are_fixed_cases():
    # Blocks 10 to 21 below the maximum (tiny terms that still count) and states empty in some rows
    # only are fixed cases: no seed can leave them out.
    report = lab03.check_online_softmax(WRONG["online_softmax"]["skips blocks more than 20 below the running "
                                                                "maximum"], seed=0).report
    assert "every term counts in ℓ" in report, report
    report = lab03.check_merge(WRONG["merge"]["returns b when a's row 0 is empty"], seed=0).report
    assert "a empty in row 0 only" in report, report
