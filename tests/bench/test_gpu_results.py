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
    for draw in (gpu_results.plot_features, gpu_results.plot_backward, gpu_results.plot_serving_features,
                 gpu_results.plot_sweep):
        assert draw().axes


def test_sweep_summary_ranks_by_geometric_mean_over_the_cases():
    rows = [dict(suite="sweep_forward", launcher="fwd", desc="False", config=c, n=n, causal="False", head_dim=128.0,
                 ms=ms, check="pass") for c, n, ms in (("a", 1, 2.0), ("a", 2, 2.0), ("b", 1, 1.0), ("b", 2, 4.0),
                                                       ("c", 1, 1.0), ("c", 2, 1.0))]
    rows.append(dict(rows[0], config="d", n=1, ms=0.5))                    # fails to run at n = 2: left out
    rows.append(dict(rows[0], config="d", n=2, ms=float("nan"), check="ERROR: OutOfResources"))
    ranked = gpu_results.sweep_summary(rows)[("fwd", False)]
    assert [c for c, _, _ in ranked] == ["c", "a", "b"]
    assert dict((c, v) for c, v, _ in ranked) == pytest.approx({"c": 2.0, "a": 1.0, "b": 1.0})


def test_the_recorded_sweep_backs_the_launch_defaults():
    """Each default at D = 128 is within 5% of the best configuration its launcher's sweep measured."""
    from attnkit.kernels import flash

    summary = gpu_results.sweep_summary(read_results("flash_sweep"))
    for launcher, desc in (("fwd_desc", True), ("fwd", False), ("bwd_atomic", False), ("bwd_dkdv", True),
                           ("bwd_dq", True)):
        speeds = {config: speed for config, speed, _ in summary[(launcher, desc)]}
        c = flash.default_config(launcher, 128)
        default = f"{c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}"
        assert speeds[default] >= 0.95 * max(speeds.values()), (launcher, default)


def test_profile_table_takes_each_call_s_longest_kernel():
    rows = read_results("flash_profile")
    table = {r["case"]: r for r in gpu_results.profile_table(rows)}
    assert table["bwd_cudnn"]["kernel"].startswith("cudnn_generated") and table["fwd_4k"]["kernel"] == "_attn_fwd"
    totals = gpu_results.profile_totals(rows)
    assert totals["bwd_two_kernels"] == pytest.approx(sum(r["duration_us"] for r in rows
                                                          if r["case"] == "bwd_two_kernels"))
    assert all(r["registers"] <= 255 for r in rows)


def test_the_ncu_summary_converts_each_file_s_units():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "summarize_ncu.py"
    spec = importlib.util.spec_from_file_location("summarize_ncu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw = [{"case": "a units", "Kernel Name": "", "gpu__time_duration.sum": "ms",
            "launch__shared_mem_per_block_dynamic": "Kbyte/block"},
           {"case": "a", "Kernel Name": "void k<1>(int)", "gpu__time_duration.sum": "1.5",
            "launch__shared_mem_per_block_dynamic": "2.048"},
           {"case": "b units", "Kernel Name": "", "gpu__time_duration.sum": "us"},
           {"case": "b", "Kernel Name": "_attn_fwd", "gpu__time_duration.sum": "1,500"}]
    rows = module.summarize(raw, {"gpu": "x"})
    assert [r["kernel"] for r in rows] == ["k", "_attn_fwd"]
    assert rows[0]["duration_us"] == rows[1]["duration_us"] == 1500.0
    assert rows[0]["shared_kib"] == pytest.approx(2.0) and rows[0]["gpu"] == "x"
    bad = [dict(raw[0], **{"gpu__time_duration.sum": "hours"}), raw[1]]
    with pytest.raises(ValueError, match="unit"):
        module.summarize(bad, {})


def test_spread_ratios_pair_each_repeat():
    rows = read_results("flash_spread_backward")
    ratios = gpu_results.spread_ratios(rows, "warp_specialized_atomic")
    repeats = len({r["repeat"] for r in rows})
    assert ratios and all(len(found) == repeats for found in ratios.values())
    first = next(r for r in rows if r["impl"] == "warp_specialized_atomic")
    cudnn = next(r["ms"] for r in rows if r["impl"] == "sdpa_cudnn" and
                 all(r[f] == first[f] for f in ("repeat", "n", "causal", "head_dim")))
    key = (int(first["head_dim"]), int(first["n"]), first["causal"] == "True")
    assert ratios[key][int(first["repeat"])] == pytest.approx(cudnn / first["ms"])
    assert gpu_results.spread_ratios(rows, "no_such_design") == {}
