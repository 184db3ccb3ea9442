"""Benchmark plumbing: every recorded result says where it came from; every suite can be run."""
from pathlib import Path

import pytest

from attnkit.bench import recorder as benchmarking

ROOT = Path(__file__).resolve().parents[2]
RECORDED = sorted(benchmarking.RESULTS.glob("bench_*.csv"))


def test_results_round_trip_with_provenance(tmp_path):
    path = benchmarking.write_results("demo", [{"n": 512, "ms": 1.25, "backend": "x"}], directory=tmp_path)
    rows = benchmarking.read_results("demo", directory=tmp_path)
    assert rows[0]["n"] == 512.0 and rows[0]["ms"] == 1.25 and rows[0]["backend"] == "x"
    assert set(benchmarking.PROVENANCE) <= set(rows[0])
    assert path.name == "bench_demo.csv"
    assert benchmarking.describe_source(rows).startswith(f"recorded on {rows[0]['gpu']} on {rows[0]['date']}")


def test_nothing_to_write_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="rows"):
        benchmarking.write_results("empty", [], directory=tmp_path)


def test_every_suite_name_has_its_function_in_the_table():
    """The recorder's names (the command line's choices) are exactly the suites of the table, in order."""
    from attnkit.bench import suites

    assert tuple(suites.SUITES) == benchmarking.SUITE_NAMES
    for name, function in suites.SUITES.items():
        assert callable(function) and function.__module__.startswith("attnkit.bench."), name


def test_every_suite_is_recorded_or_said_not_to_be():
    """Each suite has its CSV in the package data (an installed course shows it), except those listed
    as not yet recorded; a recorded suite leaves that list."""
    recorded = {p.stem.removeprefix("bench_") for p in RECORDED} - set(benchmarking.SCRIPT_RESULTS)
    assert recorded | set(benchmarking.NOT_YET_RECORDED) == set(benchmarking.SUITE_NAMES)
    assert not recorded & set(benchmarking.NOT_YET_RECORDED)


def test_unknown_suite_is_an_error(tmp_path):
    from attnkit.bench import suites

    with pytest.raises(ValueError, match="names: unknown suites"):
        suites.record(["flsh"], tmp_path)


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_every_recorded_result_names_gpu_date_and_versions(path):
    rows = benchmarking.read_results(path.stem.removeprefix("bench_"))
    assert rows, f"{path.name} is empty"
    for row in rows:
        assert "H100" in row["gpu"] or "H200" in row["gpu"]
        assert row["date"] and row["torch"] and row["triton"] and row["cuda"] and row["cudnn"]


def test_the_command_names_its_output_directory_and_suites(monkeypatch, tmp_path, capsys):
    """``python -m attnkit.bench.suites --out DIR SUITE ...`` records exactly those suites into DIR."""
    import torch

    from attnkit.bench import suites

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    recorded = []
    monkeypatch.setattr(suites, "record", lambda names, directory: recorded.append((names, directory)) or [])
    assert suites.main(["--out", str(tmp_path), "flash_ladder", "flash"]) == 0
    assert recorded == [(["flash_ladder", "flash"], tmp_path)]
    assert suites.main(["--out", str(tmp_path), "paged"]) == 0 and recorded[-1] == (["paged"], tmp_path)
    assert suites.main([]) == 0 and recorded[-1] == (list(benchmarking.SUITE_NAMES), benchmarking.RESULTS)
    with pytest.raises(SystemExit):
        suites.main(["--out", str(tmp_path), "flsh"])
    assert "unknown suites ['flsh']" in capsys.readouterr().err


def test_the_gpu_scripts_record_through_the_recorder():
    """The GPU scripts write the benchmark CSVs with suites.record only (``python -m attnkit.bench.suites``,
    as the Makefile's ``bench`` runs it)."""
    from pathlib import Path

    scripts = Path(__file__).resolve().parents[2] / "scripts"
    for name in ("gpu_flash.py", "gpu_flash_tuning.py", "gpu_paged.py"):
        text = (scripts / name).read_text()
        assert "record(" in text and "csv.DictWriter" not in text, name
        assert 'write_results("' not in text, name
        assert "attnkit.bench.suites import record" in text, name
    assert "-m attnkit.bench.suites" in (scripts.parent / "Makefile").read_text()
    assert not hasattr(benchmarking, "record") and not hasattr(benchmarking, "main")


def test_every_script_result_is_recorded_and_its_script_exists():
    for name, command in benchmarking.SCRIPT_RESULTS.items():
        assert (benchmarking.RESULTS / f"bench_{name}.csv").exists(), name
        script = command.split()[1]
        assert script == "-m" or (ROOT / script).exists(), command


def test_every_script_result_names_a_writer_that_exists_under_scripts_or_the_package():
    """Each command of SCRIPT_RESULTS runs a file of scripts/ or a module of attnkit (python -m), and that
    writer exists: nothing shipped comes from experiments/."""
    import re

    outside = set()
    for name, command in benchmarking.SCRIPT_RESULTS.items():
        files = re.findall(r"(?:python|bash) ((?:scripts|experiments)/\S+\.(?:py|sh))", command)
        modules = re.findall(r"python -m (attnkit(?:\.\w+)+)", command)
        assert files or modules, f"{name}: no writer named in {command!r}"
        for path in files:
            assert (ROOT / path).is_file(), f"{name}: {path} does not exist"
            if not path.startswith("scripts/"):
                outside.add(path)
        for module in modules:                     # a module, or a package run by its __main__
            path = ROOT / module.replace(".", "/")
            assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), \
                f"{name}: {module} does not exist"
    assert not outside, f"writers of shipped CSVs outside scripts/: {sorted(outside)}"
