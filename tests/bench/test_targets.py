"""Issue 40's targets table (attnkit.bench.targets): the shipped document is the module's output for the
shipped CSVs, each target's reading agrees with the ratio columns its recording wrote, each target flips
between met and not met across its threshold on tiny synthetic CSVs, and a missing CSV or column gives
"not recorded"."""
import csv
import math

import pytest

from attnkit.bench import targets
from attnkit.bench.recorder import PROVENANCE, read_results

STAMP = dict(zip(PROVENANCE, ("Test GPU", "2026-01-01", "2.11.0", "3.6.0", "13.0", "91900")))


def write(directory, name, rows):
    """bench_<name>.csv with the provenance columns, as the recorder writes it."""
    rows = [{**r, **STAMP} for r in rows]
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with (directory / f"bench_{name}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def test_the_document_is_the_modules_output_for_the_shipped_csvs():
    assert targets.DOCUMENT.read_text() == targets.document(), (
        "docs/performance_targets.md is stale: run python -m attnkit.bench.targets --write")


def test_every_target_of_issue_40_has_a_row_and_the_shipped_csvs_give_a_number_where_they_record_one():
    rows = targets.rows()
    keys = {r.target.key for r in rows}
    assert {"1a", "1b", "1c", "1d", "2", "3a", "3b", "4a", "4b", "4c", "5", "6a"} <= keys
    recorded = [r for r in rows if r.measured is not None]
    assert all(math.isfinite(r.measured) and r.recorded_on for r in recorded)
    assert {r.target.key for r in rows if r.measured is None} == {"6c", "6d"}


def _by_source(prefix):
    return [r for r in targets.rows() if r.source.startswith(prefix)]


def test_readings_agree_with_the_ratio_columns_the_recordings_wrote():
    """The module computes every ratio from times; the recording scripts wrote their own ratio columns."""
    head = read_results("flash_headdims")
    for row in targets.head_dims()[:4]:
        direction, causal = next(k for k, t in targets.HEAD_DIM_TARGETS.items() if t is row.target)
        column = [r["vs_cudnn"] for r in head if r["suite"] == "baseline" and r["impl"] == "attnkit"
                  and r["direction"] == direction and r["causal"] == str(causal) and r["head_dim"] != 128]
        assert row.measured == pytest.approx(min(column), rel=1e-9)
    fp8 = [r["vs_fp16"] for r in head if r["suite"] == "fp8" and r["impl"] == "fp8"]
    assert targets.fp8_forward()[0].measured == pytest.approx(min(fp8), rel=1e-9)
    tflops = next(r for r in head if r["suite"] == "fp8" and r["impl"] == "fp8" and r["n"] == 16384
                  and r["causal"] == "False")["tflops"]
    assert targets.fp8_forward()[1].measured == pytest.approx(tflops, rel=1e-9)
    varlen = next(r for r in head if r["suite"] == "varlen" and r["impl"] == "attnkit_varlen")
    assert targets.packed()[0].measured * varlen["bound"] == pytest.approx(varlen["vs_cudnn"], rel=1e-9)
    assert targets.packed()[0].target.threshold * varlen["bound"] == pytest.approx(varlen["target"], rel=1e-9)

    eager = read_results("paged_eager")
    loop = [r["ratio"] for r in eager if r["B"] == 1 and "check_values='device'" in r["method"]
            and r["method"].startswith("ratio") and r["method"].endswith("(loop_us)")]
    assert targets.eager_paged()[0].measured == pytest.approx(max(loop), rel=1e-9)
    cache = next(r for r in read_results("paged_fp8_ratio") if r["kind"] == "ratio" and r["B"] == 64
                 and "default config" in r["method"])
    assert targets.fp8_cache()[0].measured == pytest.approx(cache["ratio"], rel=1e-9)

    # 6a at the dispatch's configurations: the fraction column is relative to D = 128's default row, which
    # is D = 128's configuration today as well
    paged = read_results("paged_headdims")
    used = {(r["D"], r["Dv"], r["block_n"], r["num_warps"], r["num_stages"]) for r in paged}
    fractions = [r["fraction_of_D128_gbps"] for r in paged if (r["block_n"], r["num_warps"], r["num_stages"])
                 == targets.dispatch_config(int(r["D"]), int(r["Dv"]))]
    assert len(fractions) == len({(d, dv) for d, dv, *_ in used})
    assert targets.paged_head_sizes()[0].measured == pytest.approx(min(fractions), rel=1e-9)


# ------------------------------------------------------------------ synthetic CSVs: met on both sides
# Each builder writes CSVs whose every target of one function measures threshold x f.
def build_head_dims(d, f):
    rows = []
    for dim, dim_v in targets.HEAD_DIM_CASES + ((128, 128),):
        for direction in ("fwd", "bwd"):
            for causal in (False, True):
                ratio = 0.9 * f if dim != 128 else 2.0          # D = 128 is not a target: never the worst
                common = dict(suite="baseline", direction=direction, head_dim=dim, head_dim_v=dim_v, causal=causal,
                              n=4096)
                rows += [dict(common, impl="attnkit", ms=1 / ratio), dict(common, impl="sdpa_cudnn", ms=1.0)]
    rows.append(dict(suite="baseline", impl="attnkit", direction="fwd", head_dim=80, head_dim_v=80, causal=False,
                     n=1024, ms=100.0))                          # N < 2k: outside the target
    write(d, "flash_headdims", rows)
    sweep = []
    for dim in (80, 96, 112):
        common = dict(suite="sweep_fwd", head_dim=dim, head_dim_v=dim, causal=True, n=4096)
        sweep += [dict(common, impl="dispatch", ms=1 / (0.9 * f)), dict(common, impl="sdpa_cudnn", ms=1.0),
                  dict(common, impl="fwd", ms=100.0)]
    write(d, "flash_headdims_sweep", sweep)


def build_broadcast_do(d, f):
    rows = []
    for repeat, noise in enumerate((1.0, 0.9, 1.1)):          # medians: 2.1 f against 2
        for impl in ("attnkit", "sdpa_cudnn"):
            common = dict(impl=impl, repeat=repeat, dtype="bfloat16", causal=True, batch=1, heads=16, n=16384,
                          head_dim=64)
            rows += [dict(common, do="sum", ms=2.1 * f * noise), dict(common, do="random", ms=2.0 * noise)]
    write(d, "flash_broadcast_do", rows)


def build_eager_paged(d, f):
    rows = []
    for context in (4096, 32768):
        mine = 150.0 * f if context == 4096 else 50.0
        rows += [dict(B=1, context=context, method=targets.PAGED_EAGER_DEFAULT, loop_us=mine, do_bench_us=mine),
                 dict(B=1, context=context, method=targets.PAGED_EAGER_PEER, loop_us=100.0, do_bench_us=100.0),
                 dict(B=1, context=context, method="paged_decode eager (check_values=False)", loop_us=1e4,
                      do_bench_us=1e4)]
    rows.append(dict(B=64, context=4096, method=targets.PAGED_EAGER_DEFAULT, loop_us=1e4, do_bench_us=1e4))
    write(d, "paged_eager", rows)


def build_eager_flash(d, f):
    rows = []
    for repeat, noise in enumerate((1.0, 0.5, 3.0)):            # medians: 1.2 f against 1
        for batch in (1, 16):
            mine = 1.2 * f * noise if batch == 1 else 0.5 * noise
            common = dict(repeat=repeat, dtype="float16", batch=batch, heads=16, n=1024, head_dim=128, causal=False)
            rows += [dict(common, impl="attnkit", ms=mine), dict(common, impl="sdpa_cudnn", ms=noise)]
    write(d, "flash_eager", rows)


def build_fp8_forward(d, f):
    def rows_for(fp8, fp16, extra):
        rows = []
        for n in (4096, 16384):
            work = 4 * 1 * 16 * n * n * 128
            fp8_ms = work / (950 * f * 1e12) * 1e3 if n == 16384 else 1.0
            base = dict(extra, n=n, causal=False, batch=1, heads=16, head_dim=128)
            rows += [dict(base, impl=fp8, ms=fp8_ms), dict(base, impl=fp16, ms=fp8_ms * (1.6 * f if n == 4096 else 3)),
                     dict(base, impl="fp8_quantize", ms=50.0)]
        rows.append(dict(extra, impl=fp8, ms=1e-3, n=2048, causal=False, batch=1, heads=16, head_dim=128))  # N < 4k
        return rows
    write(d, "flash_headdims", rows_for("fp8", "attnkit", {"suite": "fp8"}))
    write(d, "flash_fp8", rows_for("fp8", "fp16_attnkit", {}))


def build_fp8_cache(d, f):
    write(d, "paged_fp8_ratio", [
        dict(kind="timing", B=64, context=4096, method="fp16 cache (default config)", ms=1.6 * f),
        dict(kind="timing", B=64, context=4096, method="fp8 cache (default config)", ms=1.0),
        dict(kind="timing", B=16, context=16384, method="fp8 cache (default config)", ms=100.0)])
    write(d, "paged_fp8", [dict(kind="timing", cache="fp16", B=64, context=4096, ms=1.6 * f),
                           dict(kind="timing", cache="fp8 e4m3", B=64, context=4096, ms=1.0),
                           dict(kind="accuracy", cache="", B=4, context=4096, ms="")])


def build_packed(d, f):
    def rows_for(extra):
        common = dict(extra, useful_pairs=100.0, padded_pairs=250.0)        # bound 2.5
        return [dict(common, impl="attnkit_varlen", ms=1.0), dict(common, impl="sdpa_cudnn_padded", ms=0.85 * f * 2.5),
                dict(common, impl="attnkit_padded", ms=9.0)]
    write(d, "flash_headdims", rows_for({"suite": "varlen"}))
    write(d, "flash_features", rows_for({"suite": "varlen", "pass_": "forward"}))


def build_paged_head_sizes(d, f):
    rows = []
    for dim, dim_v in ((32, 32), (80, 80), (128, 128), (192, 128)):
        config = targets.dispatch_config(dim, dim_v)
        gbps = 1000.0 if dim == 128 else 900.0 * f
        rows.append(dict(D=dim, Dv=dim_v, default=True, block_n=config[0], num_warps=config[1], num_stages=config[2],
                         gbps=gbps, rel_error_small=0.002 * f, bound=0.002))
        other = (config[0] * 2, config[1], config[2])                # a candidate that is not the dispatch's
        rows.append(dict(D=dim, Dv=dim_v, default=False, block_n=other[0], num_warps=other[1], num_stages=other[2],
                         gbps=5000.0 if dim != 128 else 1.0, rel_error_small="", bound=""))
    write(d, "paged_headdims", rows)


BUILDERS = {targets.head_dims: build_head_dims, targets.broadcast_do: build_broadcast_do,
            targets.eager_paged: build_eager_paged, targets.eager_flash: build_eager_flash,
            targets.fp8_forward: build_fp8_forward, targets.fp8_cache: build_fp8_cache,
            targets.packed: build_packed, targets.paged_head_sizes: build_paged_head_sizes}


def test_every_target_function_has_a_builder():
    assert set(BUILDERS) == set(targets.TARGETS)


@pytest.mark.parametrize("f", [0.99, 1.01])
@pytest.mark.parametrize("target", targets.TARGETS, ids=lambda t: t.__name__)
def test_met_flips_at_the_threshold(tmp_path, target, f):
    BUILDERS[target](tmp_path, f)
    rows = target(tmp_path)
    measured = [r for r in rows if r.measured is not None]
    assert measured, [r.detail for r in rows]
    for r in measured:
        assert r.measured == pytest.approx(r.target.threshold * f, rel=1e-9), (r.target.key, r.detail)
        assert r.met is ((f >= 1) if r.target.at_least else (f <= 1)), (r.target.key, r.detail)
        assert r.recorded_on.startswith("Test GPU, 2026-01-01")
    # only paged_extend (6d) has no recording at all
    assert [r.target.key for r in rows if r.measured is None] == (["6d"] if target is targets.paged_head_sizes else [])


def test_a_missing_csv_or_column_gives_not_recorded(tmp_path):
    rows = targets.rows(tmp_path)                           # an empty directory: every CSV missing
    assert rows and all(r.measured is None and r.met is None for r in rows)
    assert all(r.detail.startswith(targets.NOT_RECORDED) for r in rows)
    build_eager_flash(tmp_path, 1.0)
    path = tmp_path / "bench_flash_eager.csv"
    lines = path.read_text().splitlines()
    drop = lines[0].split(",").index("causal")
    path.write_text("\n".join(",".join(c for i, c in enumerate(line.split(",")) if i != drop) for line in lines))
    (row,) = targets.eager_flash(tmp_path)
    assert row.measured is None and row.met is None and "no column causal" in row.detail
    assert "not recorded" in targets.table(tmp_path)


def test_an_empty_time_gives_not_recorded(tmp_path):
    build_fp8_cache(tmp_path, 1.0)
    path = tmp_path / "bench_paged_fp8_ratio.csv"
    path.write_text(path.read_text().replace(",1.6,", ",nan,", 1))
    row = targets.fp8_cache(tmp_path)[0]
    assert row.measured is None and "ms is empty" in row.detail


def test_the_command_line_prints_the_table(tmp_path, capsys):
    build_packed(tmp_path, 1.01)
    assert targets.main(["--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| # | target (issue 40)") and "| 5 |" in out and "| yes |" in out


def test_a_value_at_the_threshold_meets_it_from_either_side():
    at_least, at_most = targets.Target("x", "", 0.9), targets.Target("y", "", 1.5, at_least=False)
    assert at_least.met(0.9) and not at_least.met(0.8999) and at_least.met(0.9001)
    assert at_most.met(1.5) and not at_most.met(1.5001) and at_most.met(1.4999)
