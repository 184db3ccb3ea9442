"""bench.serving.step_breakdown: the phases of the engine's steps add up to the whole run."""
import math

from attnkit.bench import serving

TINY = serving.FeatureWorkload(n_requests=2, prefix_tokens=4, question_tokens=(2, 3), new_tokens=(2, 3),
                               arrivals_per_step=1, max_batch=2, page_size=4, num_pages=8, max_tokens_per_step=4)


def test_the_phases_of_a_step_add_up():
    rows = serving.step_breakdown("cpu", workload=TINY, configs={"baseline": {}})
    assert [r["phase"] for r in rows] == ["decode", "prefill", "host"]
    assert math.isclose(sum(r["share"] for r in rows), 1.0, rel_tol=1e-9)
    assert math.isclose(sum(r["ms_per_step"] for r in rows), rows[0]["step_ms"], rel_tol=1e-9)
    by = {r["phase"]: r for r in rows}
    assert by["prefill"]["ms_per_step"] > 0 and by["decode"]["ms_per_step"] > 0 and by["host"]["ms_per_step"] > 0
    assert 0 < by["decode"]["calls_per_step"] <= 1 and 0 < by["prefill"]["calls_per_step"] <= 1
    assert all(r["requests"] == TINY.n_requests and r["cuda_graphs"] is False for r in rows)


def test_an_unknown_option_is_named():
    import pytest

    with pytest.raises(ValueError, match="configs"):
        serving.step_breakdown("cpu", workload=TINY, configs={"x": {"page_size": 8}})
