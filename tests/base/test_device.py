"""Device handling: interpreter on CPU, the one-line report, GPU capability gating."""
import os

import pytest

from attnkit import device
from attnkit.kernels.flash import layout


def test_interpreter_is_on_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert os.environ.get("TRITON_INTERPRET") == "1"
    rt = device.runtime()
    assert rt.device == "cpu" and rt.interpreter and rt.bf16_kernels


def test_summary_is_one_line_naming_device_and_versions(capsys):
    rt = device.setup()
    first = capsys.readouterr().out.splitlines()[0]
    assert first == rt.summary()
    assert first.startswith("attnkit: ") and "torch" in first and "triton" in first


def _fake_cuda(monkeypatch, name, capability):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)


def test_a_t4_is_flagged_and_gets_no_bf16_kernels(monkeypatch):
    _fake_cuda(monkeypatch, "Tesla T4", (7, 5))
    rt = device.detect()
    assert rt.device == "cuda" and not rt.triton_supported_gpu and not rt.bf16_kernels
    assert any("7.5" in note and "bf16" in note for note in rt.notes)
    assert "sm_75" in rt.summary()


def test_an_h100_gets_compiled_kernels_and_bf16(monkeypatch):
    _fake_cuda(monkeypatch, "NVIDIA H100 80GB HBM3", (9, 0))
    rt = device.detect()
    assert rt.triton_supported_gpu and rt.bf16_kernels and not rt.notes
    assert "compiled Triton kernels" in rt.summary()


def test_missing_triton_is_reported(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(device, "package_version", lambda name: None if name == "triton" else "1.0")
    rt = device.detect()
    assert not rt.has_triton and "no Triton" in rt.summary()
    assert any("not installed" in note for note in rt.notes)


def test_old_triton_interpreter_with_new_numpy_is_flagged(monkeypatch, tmp_path):
    import importlib.util
    import types

    package = tmp_path / "triton"
    (package / "runtime").mkdir(parents=True)
    interpreter = package / "runtime" / "interpreter.py"
    fake_spec = types.SimpleNamespace(submodule_search_locations=[str(package)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: fake_spec)
    monkeypatch.setattr(device, "package_version", lambda name: {"numpy": "2.4.1"}.get(name, "3.4.0"))
    interpreter.write_text("tensor.__index__ = lambda self: int(self.handle.data)\n")
    assert device.interpreter_breaks_on_new_numpy()
    interpreter.write_text('scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))\n')
    assert not device.interpreter_breaks_on_new_numpy()
    interpreter.write_text("tensor.__index__ = lambda self: int(self.handle.data)\n")
    monkeypatch.setattr(device, "package_version", lambda name: {"numpy": "2.3.5"}.get(name, "3.4.0"))
    assert not device.interpreter_breaks_on_new_numpy()


def test_bf16_is_computed_in_fp32_where_triton_cannot_take_it(monkeypatch):
    """The interpreter and GPUs below sm_80 (Colab's T4) compute bf16 in fp32; sm_80+ take bf16."""
    import torch

    from attnkit import device
    from attnkit.device import bf16_computed_in_fp32

    assert bf16_computed_in_fp32("cpu") and bf16_computed_in_fp32(torch.device("cpu"))
    monkeypatch.setattr(device, "triton_interprets", lambda: False)     # a compiling Triton, as on a GPU
    for capability, expected in (((7, 5), True), ((7, 0), True), ((8, 0), False), ((9, 0), False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        assert bf16_computed_in_fp32("cuda") is expected, capability


def test_kernel_wrappers_follow_the_bf16_rule(monkeypatch):
    """flash (forward and backward) follows bf16_computed_in_fp32 for its inputs."""
    import torch


    x = torch.randn(1, 1, 3, 16, dtype=torch.bfloat16)
    monkeypatch.setattr(layout, "bf16_computed_in_fp32", lambda device: True)
    assert all(t.dtype == torch.float32 for t in layout.compute_dtype_inputs(x, x))
    monkeypatch.setattr(layout, "bf16_computed_in_fp32", lambda device: False)
    assert all(t.dtype == torch.bfloat16 for t in layout.compute_dtype_inputs(x, x))
    assert layout.compute_dtype_inputs(x.half())[0].dtype == torch.float16


def test_one_rule_for_where_kernels_run(monkeypatch):
    """kernel_device: CUDA tensors stay; CPU tensors stay where Triton interprets, and go to the GPU
    where it compiles (no other path runs the course's kernels)."""
    import torch

    from attnkit import device

    interprets = device.triton_interprets()
    assert interprets == (not torch.cuda.is_available())
    if interprets:
        assert device.kernel_device("cpu") == torch.device("cpu")
    else:
        assert device.kernel_device("cpu") == torch.device("cuda", torch.cuda.current_device())
    x = torch.ones(2)
    assert device.to_kernel_device(x, None)[1] is None
    assert (device.to_kernel_device(x)[0] is x) == interprets
    assert device.kernel_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    monkeypatch.setattr(device, "triton_interprets", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert device.kernel_device("cpu") == torch.device("cuda", 0)
    assert device.launch_options(num_warps=4) == {"num_warps": 4}


def test_launches_make_a_tensors_gpu_current_and_change_nothing_else(monkeypatch):
    """Triton launches on the current CUDA device: on_device switches to the tensors' GPU where it is
    another one, and is a no-op for the CPU (the interpreter) and for the current GPU."""
    import contextlib

    import torch

    from attnkit import device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for where in (torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda")):
        assert isinstance(device.on_device(where), contextlib.nullcontext), where
    other = device.on_device(torch.device("cuda", 1))
    assert isinstance(other, torch.cuda.device) and other.idx == 1


def test_the_interpreter_is_not_switched_on_after_triton_is_imported(monkeypatch):
    """A late ensure_triton_backend (a GPU machine whose CUDA looks absent for a moment) must not set
    TRITON_INTERPRET: kernels decorated afterwards would not match Triton's own compiled library."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    device.ensure_triton_backend()
    assert "TRITON_INTERPRET" not in os.environ


def test_no_kernel_decides_its_device_by_itself():
    """Every kernel module (the FlashAttention sub-package's among them) and every benchmark module with a
    kernel of its own go through attnkit.device: none tests for the interpreter or re-decorates a kernel on
    its own."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "attnkit"
    benchmarks = [path for path in (root / "bench").glob("*.py") if "@triton.jit" in path.read_text()]
    assert benchmarks                                         # the key-read kernel's module at least
    for path in [*(root / "kernels").rglob("*.py"), *benchmarks]:
        text = path.read_text()
        for pattern in ("InterpretedFunction", "TRITON_INTERPRET", ".cuda()", "multiprocessing", "jit_for"):
            assert pattern not in text, f"{path.name}: {pattern}"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_the_interpreter_builds_no_overflow_check_that_it_would_throw_away():
    import torch
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    device.ensure_triton_backend()
    options = interpreter.interpreter_builder.options
    # device_assert keeps a check only in debug mode: with debug off the overflow check was dead work.
    assert options.debug is False and options.sanitize_overflow is False

    @triton.jit
    def wrap(x_ptr, y_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i)
        tl.store(y_ptr + i, x * 3 + x - 7)

    # int32 arithmetic still wraps exactly as on a GPU, overflow included
    x = torch.tensor([0, 5, -9, 2**30, -(2**30), 2**31 - 1, -(2**31), 12345], dtype=torch.int32)
    y = torch.empty_like(x)
    wrap[(1,)](x, y, N=8)
    want = ((x.long() * 4 - 7 + 2**31) % 2**32 - 2**31).int()
    assert torch.equal(y, want)


def test_sm_counts_are_read_once_per_gpu_and_none_elsewhere(monkeypatch):
    """A GPU's SM count comes from one read per device index (the host reads it on every short call's
    path); a CPU or meta device has none, nor a capability."""
    import torch

    assert device.sm_count("cpu") is None and device.sm_major("cpu") is None
    assert device.sm_count(torch.device("meta")) is None
    reads = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: reads.append(index) or type("Props", (), {"multi_processor_count": 132 - index}))
    device.cuda_sm_count.cache_clear()
    try:
        assert [device.sm_count(f"cuda:{i}") for i in (0, 1, 0, 1)] == [132, 131, 132, 131]
        assert reads == [0, 1]
    finally:
        device.cuda_sm_count.cache_clear()             # no fake count left behind for a real GPU


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_the_interpreter_patches_the_language_once_per_launch_not_per_helper_call(monkeypatch):
    """A kernel calling a helper of its own module eight times, and tl.max (the standard library, whose
    module sees ``core``): the results are exact, and the language is patched by the launch and once
    more for the standard library's module, not at every call."""
    import torch
    from triton.runtime import interpreter

    device.ensure_triton_backend()
    patched = []
    real = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patched.append(fn.__name__) or real(fn))
    x = torch.randn(16)
    out = torch.empty(2)
    for _ in range(2):                                   # a second launch patches again, once
        _helpers_kernel[(1,)](x, out)
    want = (x * 2 ** 8).max()                            # the helper doubles, eight times
    assert torch.equal(out, torch.stack([want, want]))
    assert patched.count("_helpers_kernel") == 2 and len(patched) <= 4, patched
    patched.clear()
    assert interpreter.InterpretedFunction(_double.fn)(3.0) == 6.0 and patched == ["_double"]   # outside a launch


def _helpers_kernel_source():
    import triton
    import triton.language as tl

    @triton.jit
    def _double(x):
        return x * 2

    @triton.jit
    def _helpers_kernel(x_ptr, out_ptr):
        x = tl.load(x_ptr + tl.arange(0, 16))
        for _ in tl.static_range(8):
            x = _double(x)
        best = tl.max(x, axis=0)
        tl.store(out_ptr + tl.arange(0, 2), tl.zeros([2], tl.float32) + best)

    return _double, _helpers_kernel


if os.environ.get("TRITON_INTERPRET") == "1":
    _double, _helpers_kernel = _helpers_kernel_source()
