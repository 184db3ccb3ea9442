"""FLOP and byte counts of attention, the GPU table and the roofline helpers."""
import math

import pytest

from attnkit.analysis import iomodel
from attnkit.analysis.iomodel import GPUS, attention_flops, attention_steps, fused_attention, roofline_figure
from attnkit.bench import naive
from attnkit.reference.tiled_numpy import naive_traffic_bytes

N, D = 4096, 128


def test_steps_at_the_lessons_size():
    qk, scale, softmax, pv = attention_steps(N, D, itemsize=2)
    assert qk.flops == pv.flops == 2 * N * N * D == 4_294_967_296
    assert qk.bytes == 2 * (2 * N * D + N * N) == 35_651_584
    assert math.isclose(qk.intensity, 2 * N * N * D / (4 * N * D + 2 * N * N)) and round(qk.intensity, 1) == 120.5
    assert softmax.intensity == 1.25 and scale.intensity == 0.25
    assert attention_flops(N, D) == 4 * N * N * D + 2 * N * N


def test_three_kernel_traffic_is_the_sources_table_and_the_naive_counter():
    steps = attention_steps(N, D, itemsize=2, separate_scale=False)
    total = sum(s.bytes for s in steps)
    assert total == sum(naive_traffic_bytes(N, N, D, D, itemsize=2)) == 138_412_032
    assert round(4 * N * N * 2 / total, 4) == 0.9697                        # "97% of traffic"
    assert round(total / fused_attention(N, D).bytes, 1) == 33.0            # "33x less traffic"
    fp32 = sum(s.bytes for s in attention_steps(N, D, itemsize=4, separate_scale=False))
    assert fp32 == 16 * N * N + 16 * N * D                                 # the second source's estimate


def test_fused_intensity_grows_with_n():
    assert round(fused_attention(N, D).intensity) == 2068
    assert fused_attention(2 * N, D).intensity > 1.9 * fused_attention(N, D).intensity


def test_gpu_table_ridges_and_roofline():
    assert round(GPUS["H100 SXM"].ridge, 1) == 295.4 and round(GPUS["V100 SXM2"].ridge, 1) == 138.9
    for g in GPUS.values():
        assert g.source and "datasheet" in g.source
        assert g.attainable_tflops(g.ridge * 10) == g.tensor_tflops
        assert math.isclose(g.attainable_tflops(1.0), g.hbm_gbs / 1000)
    # every step of naive attention is memory-bound on every GPU of the table, the fused floor is not
    for g in GPUS.values():
        assert all(s.intensity < g.ridge for s in attention_steps(N, D))
        assert fused_attention(N, D).intensity > g.ridge


def test_time_bound_is_the_larger_of_compute_and_memory():
    h100 = GPUS["H100 SXM"]
    softmax = attention_steps(N, D)[2]
    assert softmax.time_bound_s(h100) == softmax.bytes / (h100.hbm_gbs * 1e9)
    fused = fused_attention(N, D)
    assert fused.time_bound_s(h100) == fused.flops / (h100.tensor_tflops * 1e12)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="N: must be a whole number"):
        attention_steps(0, 64)
    with pytest.raises(ValueError, match="itemsize"):
        fused_attention(16, 64, itemsize=1.5)
    with pytest.raises(ValueError, match="gpus: unknown GPU"):
        roofline_figure([], gpus=["B200"])
    with pytest.raises(ValueError, match="points: intensity"):
        roofline_figure([("x", 0.0)])


def test_figures_draw(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for fig in (iomodel.roofline_attention_figure(), iomodel.memory_hierarchy_figure(),
                roofline_figure([("measured", 100.0, 250.0)], gpus=["H100 SXM"])):
        assert fig.axes and fig.axes[0].get_xlabel() and fig.axes[0].get_ylabel()
        fig.savefig(tmp_path / "f.png")
        plt.close(fig)


def test_naive_torch_steps_match_the_reference():
    import torch

    from attnkit.reference.attention import attention_ref
    from attnkit.tolerances import assert_close

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 16, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(37, 37, dtype=torch.bool).tril()
    assert_close(naive.naive_attention_torch(q, k, v, mask), attention_ref(q, k, v, causal=True), "float64")


def test_quadratic_fit_and_exponent_recover_a_quadratic():
    Ns = [256, 512, 1024, 2048]
    ms = [3e-6 * n * n + 1e-5 * n + 0.01 for n in Ns]
    a, b, c = naive.quadratic_fit(Ns, ms)
    assert math.isclose(a, 3e-6, rel_tol=1e-6) and math.isclose(c, 0.01, rel_tol=1e-3)
    assert 1.8 < naive.scaling_exponent(Ns, ms) < 2.0


def test_recorded_h100_results_carry_their_provenance():
    from attnkit.bench.recorder import RESULTS, read_results

    if not (RESULTS / "bench_naive_attention.csv").exists():
        pytest.skip("no recorded GPU results")
    for name in ("naive_attention", "naive_profile"):
        rows = read_results(name)
        assert rows and all(r["gpu"] and r["gpu"] != "cpu" and r["date"] and r["torch"] for r in rows)
    rows = read_results("naive_attention")
    assert [r["N"] for r in rows] == sorted(r["N"] for r in rows)
    assert all(r["total_ms"] > 0 for r in rows)


def test_cpu_timing_keeps_the_best_round_and_restores_the_threads():
    import torch

    threads = torch.get_num_threads()
    calls = {"a": 0}
    delays = iter([0.0] * 2 + [0.02, 0.001, 0.02])                           # 2 warm-ups, then 3 rounds

    def slow_then_fast():
        import time
        calls["a"] += 1
        time.sleep(next(delays))

    best = naive.cpu_best_ms({"a": slow_then_fast}, warmup=2, min_rounds=3, min_seconds=0.0)
    assert calls["a"] == 5 and 1.0 <= best["a"] < 15.0                       # the 1 ms round, not the 20 ms ones
    assert torch.get_num_threads() == threads


def test_naive_scaling_on_the_cpu_times_every_step(monkeypatch):
    monkeypatch.setattr(naive, "CPU_TIMING", dict(threads=1, warmup=1, min_rounds=2, min_seconds=0.0))
    rows = naive.measure_naive_scaling([32, 64], d=16, heads=1, device="cpu")
    assert [r["N"] for r in rows] == [32, 64]
    for r in rows:
        for key in ("total_ms", "QK^T_ms", "scale+mask_ms", "softmax_ms", "PV_ms"):
            assert 0 < r[key] < 1e3, key


def test_the_profilers_log_lines_are_dropped_and_other_stderr_kept(capfd):
    import os

    with naive.without_profiler_log():
        os.write(2, b"USDT:2026-11-22 08:15:19 20716:20716 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"STAGE:2026-11-22 08:15:19 20716:20716 SyncActivityProfilerHandler.cpp:60] Completed Stage\n")
        os.write(2, b"a real error\n")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "Completed Stage" not in err
    assert "a real error" in err


def test_profile_naive_writes_no_profiler_log(capfd):
    rows = naive.profile_naive(32, d=16, heads=1, device="cpu", reps=1)
    assert [r["step"] for r in rows] == list(naive.NAIVE_STEPS)
    assert "profiler_" not in capfd.readouterr().err


def test_four_kernel_traffic_against_the_fused_floor():
    four = sum(s.bytes for s in attention_steps(N, D))
    assert four == 205_520_896 and round(four / fused_attention(N, D).bytes) == 49   # lesson 2's 49×, not 33×


def test_shared_memory_bandwidth_from_the_clock():
    # the FlashAttention paper's "19 TB/s" for the A100: 108 SMs × 128 bytes per clock × 1.41 GHz
    assert round(iomodel.smem_bandwidth(GPUS["A100 SXM 80GB"], 1.41) / 1e12, 1) == 19.5
    h100 = iomodel.smem_bandwidth(GPUS["H100 SXM"], iomodel.H100_BOOST_GHZ)
    assert round(h100 / 1e12, 1) == 33.5 and round(h100 / (GPUS["H100 SXM"].hbm_gbs * 1e9)) == 10
    levels = [level for level, *_ in iomodel.HIERARCHY_H100]
    assert levels.index("shared memory / L1") < levels.index("HBM3")
    rates = {level: rate for level, _, _, rate in iomodel.HIERARCHY_H100}
    assert rates["shared memory / L1"] > rates["HBM3"] > rates["host DRAM over PCIe 5.0 x16"]


def test_gpu_suites_of_the_lessons_import_and_the_five_passes_are_softmax():
    import torch

    from attnkit.bench import streams
    from attnkit.bench.suites import SUITES

    for name in ("softmax", "bandwidth", "decode_profile"):
        assert callable(SUITES[name])
    x = torch.randn(3, 17, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(streams.five_passes(x), torch.softmax(x, dim=1), rtol=1e-12, atol=0)


def test_lesson_2s_iomodel_is_the_cost_model_and_the_naive_timing_under_one_name():
    """``attnkit.bench.iomodel`` (lesson 2's and lab 2's import) hands out the objects of the two homes."""
    from attnkit.bench import iomodel as lesson2

    assert lesson2.GPUS is iomodel.GPUS and lesson2.attention_steps is iomodel.attention_steps
    assert lesson2.measure_naive_scaling is naive.measure_naive_scaling and lesson2.NAIVE_STEPS is naive.NAIVE_STEPS


def test_the_graders_guard_covers_the_cost_model_and_the_naive_timing():
    """The grader refuses calls into the course's own cost model and naive timing (lab 2 asks students to
    write them): the guard lists the modules that define them, since it guards a function in its own module."""
    from attnkit.classroom.grading.guard import COURSE_IMPLEMENTATIONS

    covered = {name for name in ("attnkit.analysis.iomodel", "attnkit.bench.naive")
               if any(name == p or name.startswith(p + ".") for p in COURSE_IMPLEMENTATIONS)}
    assert covered == {"attnkit.analysis.iomodel", "attnkit.bench.naive"}
