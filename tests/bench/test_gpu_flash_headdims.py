"""scripts/gpu_flash_headdims.py on the CPU: its plan, its checks (which must reject wrong kernels), its
selection of the best configurations, and the whole pipeline at tiny sizes in Triton's interpreter (--cpu
--tiny), with an injected timer so that no timing depends on this machine."""
from __future__ import annotations

import csv
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_flash_headdims.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gpu_flash_headdims", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module             # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_plan_orders_work_and_refuses_bad_sizes(script):
    plan = script.make_plan("full")
    items = script.work_items(plan)
    kinds = [(it.kind, it.dtype) for it in items]
    assert kinds[:2] == [("dispatch", "float16"), ("dispatch_bwd", "float16")]
    assert kinds[-1] == ("dispatch_bwd", "bfloat16")
    first_sweep = next(i for i, it in enumerate(items) if it.kind not in ("dispatch", "dispatch_bwd", "fp8", "varlen"))
    assert {it.kind for it in items[:first_sweep]} == {"dispatch", "dispatch_bwd", "fp8", "varlen"}
    swept = {(it.d, it.dv) for it in items[first_sweep:] if not it.kind.startswith("dispatch")}
    assert swept == {(80, 80), (96, 96), (112, 112), (192, 128), (256, 256)}      # not D = 128: Gluon
    assert {it.kind for it in items if it.d == 192} >= {"fwd", "bwd_dkdv", "bwd_dq", "bwd_atomic"}
    sweep = [it for it in items[first_sweep:] if not it.kind.startswith("dispatch")]
    assert (sweep[0].kind, sweep[0].d) == ("fwd", 192)            # the worst head dim first, forwards first
    backward = [it.kind.startswith("bwd") for it in sweep]
    assert backward == sorted(backward)
    assert not any(it.kind == "pad128" for it in items if it.d >= 128)
    for (d, dv), launchers in plan.candidates.items():     # each launcher's first candidate: today's default
        for launcher, configs in launchers.items():
            default = script.default_config(launcher.removesuffix("_desc"), d, dv)
            assert script.block_config(*configs[0]) == default, (d, dv, launcher)
    assert len({it.key for it in items}) == len(items)
    for n in plan.lengths:                        # the timed kernels are the checked ones (module docstring)
        assert plan.batch_of(n) > 1 and plan.batch_of(n) % 16
    assert script.plan_from_json(script.plan_to_json(plan)) == plan
    assert script.Item.from_json(json.loads(json.dumps(items[-3].to_json()))) == items[-3]
    quick = script.make_plan("quick")
    assert quick.dtypes == ("float16",) and quick.lengths == quick.sweep_lengths == (4096,)
    assert len(script.work_items(quick)) < 0.6 * len(items)
    with pytest.raises(ValueError, match="dims: each must be one of"):
        script.make_plan("full", dims=[72])
    with pytest.raises(ValueError, match="dtypes: .*float16 among them"):
        script.make_plan("full", dtypes=["bfloat16"])
    with pytest.raises(ValueError, match="kind:"):
        script.make_plan("huge")
    with pytest.raises(SystemExit):
        script.parse_args(["out", "--cpu"])          # --cpu without --tiny: the interpreter runs tiny sizes only


def test_selection_ratios_and_rounds(script):
    rows = [dict(impl="sdpa_cudnn", ms=2.0, check=""), dict(impl="dispatch", ms=4.0, check="pass"),
            dict(impl="fwd", config="128x64 w8 s3", ms=3.0, check="pass"),
            dict(impl="fwd", config="64x64 w4 s3", ms=1.0, check="FAIL: o relative error 1e-1 > 2e-3"),
            dict(impl="fwd", config="128x128 w8 s2", ms=float("nan"), check="pass"),
            dict(impl="bwd_dq", config="64x32 w4 s3", ms=2.5, check="pass")]
    script.with_ratio(rows, "sdpa_cudnn", ())
    assert rows[2]["vs_cudnn"] == pytest.approx(2 / 3) and "vs_cudnn" not in rows[4]
    best = script.fastest(rows)
    assert best["config"] == "64x32 w4 s3"        # the failing 1.0 ms one and the dispatch are never chosen
    assert script.fastest(rows, impl="fwd")["config"] == "128x64 w8 s3"
    assert script.parse_config(script.config_name((128, 64, 8, 3))) == (128, 64, 8, 3)
    assert script.flops(2, 16, 1024, 192, 128, True) == pytest.approx(2 * 2 * 16 * 1024 ** 2 * (192 + 128) / 2)

    calls = []

    def timer(name, fn):
        fn()
        calls.append(name)
        return {"a": 2.0, "b": 1.0}[name] + len(calls) * 0.01

    def broken():
        raise RuntimeError("No available kernel")

    timed = script.interleaved({"a": lambda: 0, "b": lambda: 0, "c": broken}, 3, timer)
    assert calls == ["a", "b"] * 3                 # round robin; "c" raised on its first call, never again
    assert timed["a"][0] == pytest.approx(2.03) and timed["b"][0] == pytest.approx(1.04)
    assert math.isnan(timed["c"][0]) and timed["c"][2] == "RuntimeError: No available kernel"


def test_checks_reject_wrong_kernels(script, monkeypatch):
    plan = script.make_plan("tiny", dims=[80], dtypes=["float16"])
    fwd = script.Item("fwd", 80, 80, True, "float16", (16, 16, 1, 1))
    real_forward = script.forward_with_config
    assert script.prepare(fwd, plan)["status"] == "pass"

    def shifted(*args, **kwargs):                 # a forward off by 1% everywhere
        o, lse = real_forward(*args, **kwargs)
        return o * 1.01, lse
    monkeypatch.setattr(script, "forward_with_config", shifted)
    assert script.prepare(fwd, plan)["status"].startswith("FAIL: o relative error")

    def unwritten(*args, **kwargs):               # a forward that leaves its last row unwritten (NaN-poisoned)
        o, lse = real_forward(*args, **kwargs)
        o[..., -1, :] = float("nan")
        return o, lse
    monkeypatch.setattr(script, "forward_with_config", unwritten)
    assert script.prepare(fwd, plan)["status"].startswith("FAIL: o relative error inf")

    def no_launch(*args, **kwargs):
        raise RuntimeError("out of resource: shared memory")
    monkeypatch.setattr(script, "backward_with_configs", no_launch)
    status = script.prepare(script.Item("bwd_dq", 80, 80, False, "float16", (16, 16, 1, 1)), plan)["status"]
    assert status == "ERROR: RuntimeError: out of resource: shared memory"


def test_sweep_case_times_what_passed_and_picks_the_fastest(script, tmp_path):
    plan = script.make_plan("tiny", dims=[80], dtypes=["float16"])
    run = script.Run(plan, tmp_path, timer=None)
    items = script.sweep_items(plan, 80, 80, True)
    fast = {"bwd_dkdv": 3.0, "bwd_dq": 2.0}
    dispatched = [script.Item(kind, 80, 80, True, "float16") for kind in ("dispatch", "dispatch_bwd")]
    run.prepared = {it.key: dict(status="pass", seconds=1.0) for it in items + dispatched}
    failing = next(it for it in items if it.kind == "bwd_atomic")
    run.prepared[failing.key] = dict(status="FAIL: dk relative error 3e-2 > 2e-3", seconds=1.0)
    by_key = {it.key: it for it in items}
    seen = []

    def timer(name, fn):                          # no kernel runs: the times come from the names
        seen.append(name)
        it = by_key.get(name)
        return {"dispatch": 10.0, "two_kernels_best": 4.0}.get(name, fast.get(it.kind, 6.0) if it else 8.0)

    run.timer = timer
    run.sweep_case(80, 80, True, 32)
    assert failing.key not in seen and "two_kernels_best" in seen
    rows = {(r["suite"], r["impl"], r["config"]): r for r in run.sweep_rows}
    dead = rows[("sweep_bwd", "bwd_atomic", "16x16 w1 s1")]
    assert math.isnan(dead["ms"]) and dead["reason"].startswith("not timed: check FAIL")
    best = rows[("sweep_bwd", "two_kernels_best", "bwd_dkdv 16x16 w1 s1 + bwd_dq 16x16 w1 s1")]
    assert best["vs_dispatch"] == pytest.approx(10 / 4)
    assert rows[("sweep_fwd", "pad128", "")]["vs_dispatch"] == pytest.approx(10 / 6)
    per_case = script.best_per_case(run.sweep_rows)
    assert [(r["suite"], r["impl"]) for r in per_case] == [("sweep_bwd", "bwd_dq"), ("sweep_fwd", "fwd")]
    overall = script.best_overall(run.sweep_rows)
    assert overall["D=80 Dv=80 bwd two_kernels_best"]["vs_dispatch"] == pytest.approx(2.5)
    assert "D=80 Dv=80 bwd bwd_atomic" not in overall


def test_tiny_pipeline_writes_every_suite(script, tmp_path, capsys):
    """--cpu --tiny end to end (D = 80, fp16, no sweep): phase 1 checks in this process, then every suite's
    rows with provenance; no cuDNN on a CPU, and its rows say so."""
    timer = lambda name, fn: 1.0 if "quantize" in name else 2.0  # noqa: E731
    assert script.main([str(tmp_path), "--cpu", "--tiny", "--dims", "80", "--dtypes", "float16", "--no-sweep"],
                       timer=timer) == 0
    checks = read(tmp_path / "bench_flash_headdims_checks.csv")
    assert {r["kind"] for r in checks} == {"dispatch", "dispatch_bwd", "fp8", "varlen"}
    assert all(r["status"] == "pass" for r in checks), checks
    rows = read(tmp_path / "bench_flash_headdims.csv")
    assert {r["suite"] for r in rows} == {"baseline", "fp8", "varlen"}
    assert all(r["gpu"] == "cpu" and r["torch"] == torch.__version__ for r in rows)
    base = [r for r in rows if r["suite"] == "baseline" and r["impl"] == "attnkit"]
    assert len(base) == 4 and all(float(r["ms"]) == 2.0 and r["check"] == "pass" for r in base)
    cudnn = [r for r in rows if r["impl"].startswith("sdpa_cudnn")]
    assert cudnn and all(r["reason"] == "cuDNN needs a CUDA GPU" for r in cudnn)
    fp8 = {r["impl"]: r for r in rows if r["suite"] == "fp8" and r["causal"] == "True"}
    assert float(fp8["fp8"]["rel_err"]) < 0.08 and float(fp8["attnkit"]["rel_err"]) < 2e-3
    assert float(fp8["fp8"]["vs_fp16"]) == 1.0 and fp8["fp8_quantize"]["vs_fp16"] == "nan"
    varlen = {r["impl"]: r for r in rows if r["suite"] == "varlen"}
    assert float(varlen["attnkit_varlen"]["bound"]) > 1 and varlen["attnkit_varlen"]["check"] == "pass"
    assert (tmp_path / "headdims_log.txt").read_text().count("phase 1 done: 7 of 7 passed") == 1
    capsys.readouterr()
    assert script.main([str(tmp_path), "--report"]) == 0                 # docs/head_dims.md's tables
    text = capsys.readouterr().out
    assert "recorded on cpu" in text and "| 80, 80 | – | – | – |" in text and "| attnkit_varlen |" in text
