"""Mutation testing for lab checks: every plausible wrong answer is rejected on every seed, every
correct variant is accepted on every seed.

A check has the signature ``check(student_fn, *, seed=None) -> CheckResult`` (see
``attnkit.classroom.checking``). A catalogue is two dicts, name -> function, for example::

    from mutation import SEEDS, catalogue_params, assert_rejected_on_every_seed, assert_accepted

    WRONG = {"global max": softmax_global_max, "no max": softmax_no_max, ...}
    RIGHT = {"loops": softmax_loops, "log-sum-exp": softmax_lse, ...}

    @pytest.mark.parametrize("mutant", catalogue_params(WRONG))
    def test_softmax_rejects(mutant):
        assert_rejected_on_every_seed(lab01.check_softmax, mutant, SEEDS)

    @pytest.mark.parametrize("correct", catalogue_params(RIGHT))
    def test_softmax_accepts(correct):
        assert_accepted(lab01.check_softmax, correct, SEEDS)

Seeds are fixed (``SEEDS`` = 0..49; ``FEW_SEEDS`` = 0..9 for checks that run Triton in the
interpreter), so a failure is reproducible: the message names the seeds and the check's report.
"""
from __future__ import annotations

from typing import Callable, Iterable

import pytest

from attnkit.classroom.checking import FAILED, PASSED

SEEDS = tuple(range(50))
FEW_SEEDS = tuple(range(10))


def catalogue_params(catalogue: dict[str, Callable]) -> list:
    """``pytest.param`` entries, one per named function, with the name as the test id."""
    return [pytest.param(fn, id=name) for name, fn in catalogue.items()]


def run_on_seeds(check: Callable, fn: Callable, seeds: Iterable[int]) -> dict:
    """``{seed: CheckResult}`` of ``check(fn, seed=seed)`` for every seed."""
    return {seed: check(fn, seed=seed) for seed in seeds}


def assert_rejected_on_every_seed(check: Callable, mutant: Callable, seeds: Iterable[int] = SEEDS,
                                  *, contains: str | None = None) -> None:
    """``check`` fails ``mutant`` (status FAILED, not 'not implemented') on every seed.

    ``contains``: a piece of text every failing report must include (e.g. a hint or a phrase of a
    structural rule), to show it was rejected for the right reason.
    """
    results = run_on_seeds(check, mutant, seeds)
    accepted = [s for s, r in results.items() if r.status != FAILED]
    name = getattr(mutant, "__name__", repr(mutant))
    if accepted:
        first = results[accepted[0]]
        pytest.fail(f"{name} was not rejected on {len(accepted)} of {len(results)} seeds "
                    f"(first: seed {accepted[0]}, status {first.status!r}):\n{first.report}")
    if contains is not None:
        missing = [s for s, r in results.items() if contains not in r.report]
        if missing:
            pytest.fail(f"{name}: the report on seed {missing[0]} does not say {contains!r}:\n"
                        f"{results[missing[0]].report}")


def assert_accepted(check: Callable, correct: Callable, seeds: Iterable[int] = SEEDS) -> None:
    """``check`` passes ``correct`` on every seed."""
    results = run_on_seeds(check, correct, seeds)
    refused = [s for s, r in results.items() if r.status != PASSED]
    name = getattr(correct, "__name__", repr(correct))
    if refused:
        pytest.fail(f"{name} was refused on {len(refused)} of {len(results)} seeds "
                    f"(first: seed {refused[0]}):\n{results[refused[0]].report}")


def catalogue_tests(checks: dict, wrong: dict, right: dict, seeds: Iterable[int] = SEEDS):
    """The two tests every lab's catalogue runs, for ``checks`` (exercise -> check) and the catalogues
    ``wrong`` and ``right`` (exercise -> {label: function}); assign them to test names in the module::

        test_every_wrong_answer_fails, test_every_right_answer_passes = catalogue_tests(CHECKS, WRONG, RIGHT)
    """
    seeds = tuple(seeds)

    @pytest.mark.parametrize("name, fn", [pytest.param(n, f, id=f"{n}: {label}")
                                          for n in wrong for label, f in wrong[n].items()])
    def every_wrong_answer_fails_on_every_seed(name, fn):
        assert_rejected_on_every_seed(checks[name], fn, seeds, contains="hint:")

    @pytest.mark.parametrize("name, fn", [pytest.param(n, f, id=f"{n}: {label}")
                                          for n in right for label, f in right[n].items()])
    def every_right_answer_passes_on_every_seed(name, fn):
        assert_accepted(checks[name], fn, seeds)

    return every_wrong_answer_fails_on_every_seed, every_right_answer_passes_on_every_seed


def blank_tests(checks: dict):
    """The test that every check of ``checks`` reports a blank exercise as "not implemented yet"."""
    from attnkit.classroom.checking import NOT_IMPLEMENTED

    def blank(*args, **kwargs):
        raise NotImplementedError

    @pytest.mark.parametrize("name", list(checks))
    def blank_reports_not_implemented(name):
        result = checks[name](blank)
        assert result.status == NOT_IMPLEMENTED and "not implemented yet" in result.report

    return blank_reports_not_implemented
