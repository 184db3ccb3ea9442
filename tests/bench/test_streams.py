"""The read-only stream that lesson 8 and the decode benchmarks use as a bandwidth ceiling."""
import pytest
import torch

from attnkit.bench.streams import five_passes, read_stream

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 4095, 100_003])
def test_read_stream_reads_every_element_once(n):
    x = torch.randn(n, dtype=torch.float16, device=DEVICE) * 3
    partial = read_stream(x, block=64, blocks_per_program=4)
    assert partial.numel() == -(-n // 256)
    torch.testing.assert_close(partial.sum().double(), x.double().sum(), rtol=1e-5, atol=1e-3)


def test_read_stream_refuses_a_strided_view():
    x = torch.randn(64, 8, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="x"):
        read_stream(x.t())


def test_five_passes_is_softmax():
    x = torch.randn(5, 37, dtype=torch.float64)
    torch.testing.assert_close(five_passes(x), torch.softmax(x, dim=1))


# ------------------------------------------------------------------ the ceilings harness (CPU: pure parts)
import math  # noqa: E402

from attnkit.bench import streams  # noqa: E402

CEILS = streams.ceiling_fields(2500.0, 3000.0, 3350.0, "graph", 1 << 30)


def test_fractions_divide_by_each_ceiling():
    got = streams.fractions(1500.0, CEILS)
    assert got == {"fraction_of_copy": 0.6, "fraction_of_read": 0.5, "fraction_of_datasheet": 1500.0 / 3350.0}
    assert all(math.isnan(v) for v in streams.fractions(float("nan"), CEILS).values())


def test_a_row_with_ceilings_carries_the_three_ceilings_and_fractions():
    row = streams.with_ceilings({"method": "paged", "gbps": 3000.0}, 3000.0, CEILS)
    for key in ("copy_GBps", "read_GBps", "datasheet_GBps", "ceiling_timing",
                "fraction_of_copy", "fraction_of_read", "fraction_of_datasheet"):
        assert key in row
    assert row["method"] == "paged" and row["fraction_of_read"] == 1.0 and row["fraction_of_copy"] == 1.2
    assert row["ceiling_timing"] == streams.TIMINGS["graph"]
    with pytest.raises(ValueError, match="ceils: missing"):
        streams.with_ceilings({}, 1.0, {"copy_GBps": 1.0})


def test_timing_and_size_are_checked_before_anything_runs():
    with pytest.raises(ValueError, match="timing: expected one of"):
        streams.ceilings(timing="wall clock")
    with pytest.raises(ValueError, match="nbytes"):
        streams.ceilings(nbytes=1000)
    with pytest.raises(ValueError, match="timing"):
        streams.ceiling_fields(1.0, 1.0, 1.0, "cudagraph", 1)


def test_datasheet_bandwidth_by_device_name():
    assert streams.datasheet_gbps("NVIDIA H100 80GB HBM3") == 3350.0
    assert streams.datasheet_gbps("NVIDIA A100-SXM4-80GB") == 2039.0
    assert math.isnan(streams.datasheet_gbps("Some Other GPU"))


def test_recorded_ceilings_are_the_bandwidth_rows_of_one_timing(tmp_path):
    eager, graph = streams.recorded_ceilings("eager"), streams.recorded_ceilings("graph")
    rows = streams.read_results("bandwidth")
    copy_rows = {r["harness"]: r["gbps"] for r in rows if r["what"] == streams.COPY}
    read_rows = {r["harness"]: r["gbps"] for r in rows if r["what"] == streams.READ}
    for timing, got in (("eager", eager), ("graph", graph)):
        assert got["copy_GBps"] == copy_rows[streams.TIMINGS[timing]]
        assert got["read_GBps"] == read_rows[streams.TIMINGS[timing]]
        assert got["ceiling_timing"] == streams.TIMINGS[timing]
    assert eager["copy_GBps"] != graph["copy_GBps"]
    (tmp_path / "bench_bandwidth.csv").write_text("what,harness,bytes,ms,gbps,datasheet_gbps\n"
                                                  f'"{streams.COPY}","eager, do_bench",2,1,2000,3350\n')
    with pytest.raises(ValueError, match="no .*read_stream"):
        streams.recorded_ceilings("eager", tmp_path)


def test_paged_benchmark_rows_and_ratios():
    from attnkit.bench import paged as bench_paged

    ceiling = bench_paged.ceiling_rows(CEILS)
    assert [r["shape"] for r in ceiling] == ["ceiling", "ceiling"]
    copy_row, read_row = ceiling
    assert copy_row["fraction_of_copy"] == pytest.approx(1.0) and read_row["fraction_of_read"] == pytest.approx(1.0)
    assert copy_row["bytes"] == 2 * read_row["bytes"]
    nbytes = bench_paged.kv_bytes(64, 4096)
    rows = ceiling + [
        bench_paged.measured_row(CEILS, shape="batch", method="paged grouped (auto splits)", batch=64, context=4096,
                                 splits=1, ms=nbytes / 2.7e9, eager_ms=1.0, nbytes=nbytes),
        bench_paged.measured_row(CEILS, shape="batch", method="sdpa cudnn (rows)", batch=64, context=4096,
                                 splits=0, ms=nbytes / 2.97e9, eager_ms=1.0, nbytes=nbytes),
        bench_paged.measured_row(CEILS, shape="batch", method="paged per-head", batch=64, context=4096,
                                 splits=1, ms=nbytes / 1.35e9, eager_ms=1.0, nbytes=nbytes),
    ]
    assert rows[2]["gbps"] == pytest.approx(2700.0)
    assert rows[2]["fraction_of_read"] == pytest.approx(0.9) and rows[2]["fraction_of_copy"] == pytest.approx(1.08)
    got = bench_paged.ratios(rows)
    assert got["batch: paged / read-only stream bandwidth"] == pytest.approx(0.9)
    assert got["batch: paged / copy bandwidth"] == pytest.approx(1.08)
    assert got["batch: SDPA-cuDNN time / paged time"] == pytest.approx(2.7 / 2.97)
    assert got["batch: per-head time / grouped time"] == pytest.approx(2.0)


def test_fp8_ratios_compare_times_of_the_fp16_and_fp8_caches():
    from attnkit.bench import paged as bench_paged

    rows = [dict(kind="timing", method="paged_decode grouped, fp16 cache", ms=0.36, eager_ms=0.4),
            dict(kind="timing", method="paged_decode grouped, fp8 cache", ms=0.2, eager_ms=0.25),
            dict(kind="timing", method="paged_extend 1 token, fp16 cache", ms=0.5, eager_ms=0.6),
            dict(kind="timing", method="paged_extend 1 token, fp8 cache", ms=0.25, eager_ms=0.4),
            dict(kind="accuracy", method="paged_decode grouped, fp8 cache", ms=99.0)]
    got = bench_paged.fp8_ratios(rows)
    assert got["paged_decode grouped: fp16 / fp8 time (graph)"] == pytest.approx(1.8)
    assert got["paged_decode grouped: fp16 / fp8 time (eager)"] == pytest.approx(1.6)
    assert got["paged_extend 1 token: fp16 / fp8 time (graph)"] == pytest.approx(2.0)
    assert got["target"] == bench_paged.FP8_TARGET
    assert math.isnan(bench_paged.fp8_ratios(rows[:1])["paged_decode grouped: fp16 / fp8 time (graph)"])


def test_kvcache_rows_carry_the_ceilings_rounded():
    from attnkit.bench import cache_append as bench_kvcache

    row = bench_kvcache.with_fractions({"scenario": "decode", "ms": 0.01}, 1234.5678, CEILS)
    assert row["GBps"] == 1234.6 and row["copy_GBps"] == 2500.0
    assert row["fraction_of_copy"] == 0.494 and row["fraction_of_read"] == 0.412
    assert row["fraction_of_datasheet"] == round(1234.5678 / 3350, 3)


def test_fp8_benchmark_runs_end_to_end_with_stand_in_timers(monkeypatch, tmp_path):
    """run_fp8's whole path (problem, fp8 cache, paged_extend on both caches, paged_decode, ceilings,
    accuracy, the CSV) on a tiny problem, with the GPU timers replaced by calls that run fn once."""
    from attnkit.bench import paged as bench_paged
    from attnkit.bench.recorder import read_results

    monkeypatch.setattr(bench_paged, "graph_ms", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(bench_paged, "time_ms", lambda fn: (fn(), 2.0)[1])
    monkeypatch.setattr(streams, "ceilings", lambda timing, nbytes=0: streams.ceiling_fields(
        2500.0, 3000.0, 3350.0, timing, 1 << 30))
    rows = bench_paged.run_fp8(tmp_path, shape=(1, 16), accuracy_shape=(2, 16), log=lambda *a, **k: None,
                               device=DEVICE)
    timing = [r for r in rows if r["kind"] == "timing"]
    assert [r["method"] for r in timing] == list(bench_paged.FP8_CASES)
    assert [r["cache"] for r in timing] == ["fp16", "fp8 e4m3"] * 2
    assert all(r["note"] == "" for r in timing), [r["note"] for r in timing]
    assert timing[1]["bytes"] * 2 == timing[0]["bytes"] and timing[1]["fraction_of_read"] > 0
    assert 0 < timing[1]["max_abs_error_vs_fp16"] < 0.2
    accuracy = {r["method"]: r for r in rows if r["kind"] == "accuracy"}
    assert len(accuracy) == 7
    for kernel in ("paged_decode", "paged_extend"):
        assert accuracy[f"{kernel}: fp8 cache vs float64 of the dequantised fp8 cache"]["max_abs_error"] < 2e-3
        assert accuracy[f"{kernel}: fp16 cache vs float64 of the fp16 cache"]["max_abs_error"] < 2e-3
    assert 1e-3 < accuracy["paged_decode: fp8 cache vs float64 of the fp16 cache"]["max_abs_error"] < 0.2
    assert len(read_results("paged_fp8", tmp_path)) == len(rows)
