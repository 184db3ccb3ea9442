"""The grading steps on a machine with a GPU: CUDA cannot start under an address-space cap (RLIMIT_AS) of a
few GiB, so a step that uses the GPU has none; its memory is held by the resident size of its process
tree (and a cgroup where one exists) and a cap on each CUDA process's allocator. A step that uses no GPU
keeps RLIMIT_AS. No test here needs a GPU."""
import json
import os
import sys

import pytest
import torch

from attnkit.classroom.grading import Budgets, protection_summary, runner, sandbox
from attnkit.classroom.grading.timing_runs import grading_reaches_gpu

MIB = 2**20
# A worker in miniature: reads its spec, applies its limits, says what RLIMIT_AS is, then holds ``hold``
# MiB of resident memory (pages written) for a second.
WORKER = """import json, resource, sys, time
from attnkit.classroom.grading import sandbox
spec = json.loads(sys.stdin.buffer.readline())
sandbox.apply_limits(spec)
sys.stderr.write("RLIMIT_AS " + json.dumps(resource.getrlimit(resource.RLIMIT_AS)) + "\\n")
sys.stderr.flush()
hold = bytearray(int(spec["hold"]) * 2**20)
for i in range(0, len(hold), 4096):
    hold[i] = 1
time.sleep(1.5)
"""


def run_worker(tmp_path, budgets, hold=0):
    return sandbox.run_budgeted([sys.executable, "-I", "-c", WORKER], budgets, sandbox=False, spec={"hold": hold},
                                workdir=tmp_path)


def address_space(run):
    line = next(l for l in run.stderr.splitlines() if l.startswith("RLIMIT_AS "))
    return json.loads(line.split(" ", 1)[1])


def test_a_gpu_steps_spec_carries_no_address_space_cap_but_a_resident_memory_budget():
    spec = sandbox.worker_spec({}, Budgets(memory_mib=4096, gpu_memory_mib=16384), sandbox=False)
    assert spec["memory_mib"] == 4096 and spec["gpu_memory_mib"] == 16384
    limits = dict(sandbox.rlimits(spec))
    assert "RLIMIT_AS" not in limits
    assert limits["RLIMIT_CORE"] == 0 and limits["RLIMIT_FSIZE"] == Budgets.staging_mib * MIB


def test_a_cpu_steps_spec_keeps_its_address_space_cap():
    spec = sandbox.worker_spec({}, Budgets(memory_mib=4096), sandbox=False)
    assert spec["gpu_memory_mib"] == 0
    assert dict(sandbox.rlimits(spec))["RLIMIT_AS"] == 4096 * MIB


def test_in_a_real_worker_the_gpu_step_has_no_rlimit_as_and_the_cpu_step_has_it(tmp_path):
    import resource

    (tmp_path / "cpu").mkdir()
    (tmp_path / "gpu").mkdir()
    cpu = run_worker(tmp_path / "cpu", Budgets(memory_mib=1024))
    gpu = run_worker(tmp_path / "gpu", Budgets(memory_mib=1024, gpu_memory_mib=2048))
    assert cpu.stopped is None and gpu.stopped is None, (cpu.stderr, gpu.stderr)
    assert address_space(cpu) == [1024 * MIB, 1024 * MIB]
    # The grader's own limit (unlimited here, or whatever the machine set) is all a GPU step inherits.
    assert address_space(gpu) == list(resource.getrlimit(resource.RLIMIT_AS))
    assert address_space(gpu) != [1024 * MIB, 1024 * MIB]


def test_without_rlimit_as_the_trees_resident_memory_still_stops_a_gpu_step(tmp_path):
    run = run_worker(tmp_path, Budgets(memory_mib=200, gpu_memory_mib=2048), hold=400)
    assert run.stopped == "used more than its 200 MiB of memory (all its processes together)"
    assert run.peak_mib > 200


def test_the_isolation_line_says_how_a_gpu_steps_memory_is_held():
    gpu = protection_summary(False, Budgets(memory_mib=8192, gpu_memory_mib=16384))
    cpu = protection_summary(False, Budgets(memory_mib=8192))
    assert "no RLIMIT_AS (the steps use the GPU" in gpu and "capped at 16384 MiB per process" in gpu
    assert "no RLIMIT_AS" not in cpu and "capped at" not in cpu
    if sandbox.cgroup_problem() is not None:       # no cgroup: the per-process caps are named for both
        assert "with RLIMIT_AS per process" in cpu


def test_bubblewrap_binds_the_gpu_device_files_only_for_a_gpu_step(monkeypatch):
    monkeypatch.setattr(sandbox, "gpu_device_files", lambda: ["/dev/nvidiactl", "/dev/nvidia0"])
    monkeypatch.setattr(sandbox, "readable_roots", lambda: [])
    gpu = sandbox.bwrap_args(Budgets(gpu_memory_mib=1024), drop=False)
    cpu = sandbox.bwrap_args(Budgets(), drop=False)
    assert [gpu[i + 1] for i, a in enumerate(gpu) if a == "--dev-bind"] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert "--dev-bind" not in cpu
    assert gpu.index("--dev") < gpu.index("--dev-bind")        # bound on top of the minimal /dev


def test_the_notebook_kernel_caps_its_allocator_from_a_startup_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("IPYTHONDIR", raising=False)
    runner.write_kernel_startup(3072)
    startup = tmp_path / ".ipython" / "profile_default" / "startup" / "00-gpu-memory.py"
    assert startup.is_file() and "cap_gpu_memory(3072)" in startup.read_text()
    assert os.environ["IPYTHONDIR"] == str(tmp_path / ".ipython")
    capped = []          # (the real cap would hold this test process to 3 GiB of GPU memory on a GPU)
    monkeypatch.setattr(sandbox, "cap_gpu_memory", lambda mib: capped.append(mib))
    namespace = {}
    exec(compile(startup.read_text(), str(startup), "exec"), namespace)
    assert capped == [3072]
    assert [k for k in namespace if not k.startswith("__")] == []          # it leaves no name behind
    # A kernel that cannot cap its allocator ends itself (IPython would report an exception and go on).
    monkeypatch.setattr(sandbox, "cap_gpu_memory", lambda mib: "RuntimeError: no context")

    class Ended(Exception):
        pass

    def end(status):
        raise Ended(status)
    monkeypatch.setattr(os, "_exit", end)
    with pytest.raises(Ended, match="3"):
        exec(compile(startup.read_text(), str(startup), "exec"), {})
    assert "the GPU memory cap of 3072 MiB could not be set: RuntimeError: no context" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_process_on_the_gpu_steps_caps_reaches_it(tmp_path):
    reaches, why = grading_reaches_gpu(Budgets(memory_mib=8192, gpu_memory_mib=4096), sandbox=False)
    assert reaches, why


def test_cap_gpu_memory_sets_the_fraction_of_the_devices_memory(monkeypatch):
    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("P", (), {"total_memory": 80 * 1024 * MIB})())
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, *a: set_to.append(f))
    assert sandbox.cap_gpu_memory(16384) is None and set_to == [pytest.approx(0.2)]
    assert sandbox.cap_gpu_memory(10**9) is None and set_to[-1] == 1.0

    def fails(*a):
        raise RuntimeError("no context")
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fails)
    assert sandbox.cap_gpu_memory(1024) == "RuntimeError: no context"


@pytest.mark.parametrize("value", [-1, 1.5, True, "8"])
def test_a_bad_gpu_memory_budget_is_a_clear_error(value):
    with pytest.raises(ValueError, match="gpu_memory_mib: must be a whole number of MiB, 0 \\(no GPU\\) or more"):
        Budgets(gpu_memory_mib=value)


@pytest.mark.parametrize("lab, has_gpu, given, expected", [("05", True, [], 16384), ("01", True, [], 0),
                                                           ("05", False, [], 0), ("05", True, ["--gpu-memory", "0"], 0),
                                                           ("08", True, ["--gpu-memory", "2048"], 2048)])
def test_make_grade_lets_a_gpu_labs_steps_use_the_gpu_where_there_is_one(tmp_path, monkeypatch, lab, has_gpu,
                                                                        given, expected):
    from attnkit.classroom.grading import __main__ as command

    seen = []

    def grade(notebook, lab, **limits):
        seen.append(limits["gpu_memory_mib"])
        raise ValueError("not graded in this test")
    monkeypatch.setattr(command, "grade", grade)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: has_gpu)       # what `make grade` asks
    command.main(["--lab", lab, str(tmp_path / "a.ipynb"), "--out", str(tmp_path / "out"), "--no-sandbox", *given])
    assert seen == [expected]


def test_a_probe_that_dies_before_reporting_says_why(monkeypatch):
    """A probe that cannot even start (here: a module it imports is missing, as when the course is not installed
    in the interpreter the steps run with ``-I``) is reported with its last line of stderr, not as "no GPU"."""
    from attnkit.classroom.grading import timing_runs

    monkeypatch.setattr(timing_runs, "PROBE_ARGV", [sys.executable, "-I", "-c", "import no_such_module_for_the_probe"])
    reaches, why = grading_reaches_gpu(Budgets(memory_mib=1024), sandbox=False)
    assert not reaches
    assert why.startswith("the probe sent no report (ModuleNotFoundError: No module named 'no_such_module_for_the"), why
