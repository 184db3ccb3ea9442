"""The summaries of the GPU scripts' recordings: ratios recomputed from the rows' times."""
import math

import pytest

from attnkit.bench import gpu_results
from attnkit.bench.recorder import read_results


def test_feature_ratios_follow_the_rows():
    rows = read_results("flash_features")
    ratios = gpu_results.feature_ratios(rows)
    for causal, by_dim in ratios["head_dim"].items():
        assert by_dim[128][1] == pytest.approx(1.0)
        ms = {r["impl"]: r["ms"] for r in rows if r["suite"] == "head_dim" and r["head_dim"] == 80
              and r["causal"] == str(causal)}
        assert by_dim[80][0] == pytest.approx(ms["sdpa_cudnn"] / ms["attnkit"])
    varlen = [r for r in rows if r["suite"] == "varlen"]
    assert ratios["varlen"]["target"] == pytest.approx(varlen[0]["padded_pairs"] / varlen[0]["useful_pairs"])
    assert ratios["window_target"] == pytest.approx(0.8 * 32768 / (2 * 4096))


def test_backward_ratios_are_cudnn_time_over_the_design_time():
    rows = read_results("flash_backward")
    ratios = gpu_results.backward_ratios(rows)
    for r in rows:
        if r["suite"] == "backward" and r["impl"] == "two_kernels":
            cudnn = next(c["ms"] for c in rows if c["impl"] == "sdpa_cudnn" and
                         (c["n"], c["head_dim"], c["causal"]) == (r["n"], r["head_dim"], r["causal"]))
            key = ("two_kernels", int(r["head_dim"]), int(r["n"]), r["causal"] == "True")
            assert ratios[key] == pytest.approx(cudnn / r["ms"], rel=0.05)   # cuDNN timed beside it


def test_fp8_ratios_and_ceilings():
    ratios = gpu_results.fp8_ratios(read_results("flash_fp8"))
    assert {"matmul_fp16", "scaled_mm_fp8"} <= set(ratios["ceilings"])
    for key, r in ratios.items():
        if key != "ceilings":
            assert r["vs_fp16"] > 0 and math.isfinite(r["vs_cudnn_fp16"]) and r["rel_err"] > r["fp16_rel_err"]


def test_the_plots_draw():
    import matplotlib

    matplotlib.use("Agg")
    for draw in (gpu_results.plot_features, gpu_results.plot_backward, gpu_results.plot_serving_features):
        assert draw().axes
