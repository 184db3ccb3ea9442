"""attnkit.kernels.flash.runners: a launch key's first call through Triton's JIT, later ones through the compiled
kernel's runner; the key changes with everything the JIT specialises on; a failing runner warns once and
leaves the JIT. On a CPU with Triton stood in for (``FakeTriton``) and with the real interpreter; the GPU
tests of tests/kernels/test_flash_hopper.py and tests/kernels/test_flash.py check the runners' results bit for bit."""
from __future__ import annotations

import os

import pytest
import torch

from attnkit.kernels.flash.runners import Runners, launch_key

CPU = torch.device("cpu")


class FakeTriton:
    """Stands in for a kernel: ``kernel[grid](*args, **options)`` is the JIT (it records the launch and
    returns the compiled kernel, itself here), ``compiled[(x, y, z)](*every_parameter)``, with no keyword,
    that kernel's runner (it records its arguments, or raises ``fail``)."""

    def __init__(self, arg_names, fail=None):
        self.arg_names, self.launches, self.fail = list(arg_names), [], fail

    def __getitem__(self, grid):
        def launch(*args, **options):
            if options:                     # the JIT takes the constexprs and num_warps by name
                self.launches.append(("jit", grid, args))
                return self
            if self.fail:
                raise self.fail
            self.launches.append(("runner", grid, args))
        return launch


NAMES = ["x_ptr", "desc", "scale", "n", "stride", "maybe", "BLOCK", "CAUSAL"]


def _args(n=100, stride=64, x=None, block=(16, 64), scale=0.5):
    from triton.tools.tensor_descriptor import TensorDescriptor

    base = torch.empty(256, 64, dtype=torch.float16)
    desc = TensorDescriptor(base, list(base.shape), list(base.stride()), list(block))
    return [torch.empty(8) if x is None else x, desc, scale, n, stride, None]


OPTIONS = dict(BLOCK=64, CAUSAL=True, num_warps=4)


def test_a_keys_first_launch_goes_through_the_jit_and_the_next_through_the_runner():
    kernel, runners = FakeTriton(NAMES), Runners()
    first, second, other = _args(), _args(scale=0.25), _args(n=101)
    for args in (first, second, other, second):
        runners.launch(kernel, (3, 8), args, OPTIONS, CPU)
    assert [how for how, _, _ in kernel.launches] == ["jit", "runner", "jit", "runner"]
    how, grid, args = kernel.launches[1]
    assert grid == (3, 8, 1) and len(args) == len(NAMES)                 # every parameter, in order:
    assert all(got is given for got, given in zip(args, second))         # the call's own arguments,
    assert args[len(second):] == (64, True)                              # then the constexprs


def test_the_key_changes_with_everything_the_jit_specialises_on():
    key = launch_key((3, 8), _args(), OPTIONS, CPU)
    assert launch_key((3, 8), _args(scale=0.1), OPTIONS, CPU) == key     # other data, other float: one key
    changed = {
        "an integer": _args(n=101),
        "a stride": _args(stride=65),
        "a pointer's 16-byte alignment": _args(x=torch.empty(9)[1:]),
        "a tensor's dtype": _args(x=torch.empty(8, dtype=torch.float64)),
        "a descriptor's block": _args(block=(32, 64)),
    }
    for what, args in changed.items():
        assert launch_key((3, 8), args, OPTIONS, CPU) != key, what
    assert launch_key((3, 9), _args(), OPTIONS, CPU) != key
    assert launch_key((3, 8), _args(), dict(OPTIONS, num_warps=8), CPU) != key
    assert launch_key((3, 8), _args(), OPTIONS, torch.device("cuda", 1)) != key
    assert launch_key((3, 8), [*_args()[:-1], 1], OPTIONS, CPU) != key   # None against a value
    assert launch_key((3, 8), [*_args()[:-1], True], OPTIONS, CPU) != launch_key((3, 8), [*_args()[:-1], 1],
                                                                               OPTIONS, CPU)  # a flag, a count
    assert launch_key((3, 8), [*_args()[:-1], object()], OPTIONS, CPU) is None


def test_two_kernels_with_the_same_arguments_keep_their_own_runners():
    one, two, runners = FakeTriton(NAMES), FakeTriton(NAMES), Runners()
    for kernel in (one, two, one, two):
        runners.launch(kernel, (3, 8), _args(), OPTIONS, CPU)
    assert [how for how, _, _ in one.launches] == [how for how, _, _ in two.launches] == ["jit", "runner"]


def test_a_parameter_left_to_its_default_keeps_the_jit():
    kernel, runners = FakeTriton(NAMES), Runners()
    for _ in range(2):
        runners.launch(kernel, (3, 8), _args(), dict(BLOCK=64), CPU)      # CAUSAL not passed
    assert [how for how, _, _ in kernel.launches] == ["jit", "jit"] and not runners.by_key


def test_a_runner_that_fails_leaves_the_jit_with_one_warning():
    """A Triton whose compiled kernels launch otherwise: one RuntimeWarning, the same launch through the
    JIT, then the JIT for the rest of the process."""
    kernel, runners = FakeTriton(NAMES, fail=TypeError("launch() takes 20 positional arguments")), Runners()
    runners.launch(kernel, (3, 8), _args(), OPTIONS, CPU)
    with pytest.warns(RuntimeWarning, match="launching a compiled kernel directly failed"):
        runners.launch(kernel, (3, 8), _args(), OPTIONS, CPU)
    runners.launch(kernel, (3, 8), _args(), OPTIONS, CPU)
    assert [how for how, _, _ in kernel.launches] == ["jit", "jit", "jit"]
    assert runners.enabled is False and runners.by_key == {}


def test_running_out_of_memory_in_a_runner_is_raised():
    kernel, runners = FakeTriton(NAMES), Runners()
    runners.launch(kernel, (3, 8), _args(), OPTIONS, CPU)
    kernel.fail = torch.cuda.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        runners.launch(kernel, (3, 8), _args(), OPTIONS, CPU)
    assert runners.enabled and runners.by_key


def test_only_the_most_recent_keys_are_kept():
    kernel, runners = FakeTriton(NAMES), Runners(kept=3)
    for n in range(5):
        runners.launch(kernel, (3, 8), _args(n=n), OPTIONS, CPU)
    assert len(runners.by_key) == 3
    runners.launch(kernel, (3, 8), _args(n=0), OPTIONS, CPU)              # the oldest: dropped
    runners.launch(kernel, (3, 8), _args(n=4), OPTIONS, CPU)              # the newest: kept
    assert [how for how, _, _ in kernel.launches][-2:] == ["jit", "runner"]


def test_a_planned_launch_is_keyed_by_its_tensors_alignment_and_what_varies():
    """launch_planned: the plan's first launch of a key through the JIT, later ones with other tensors of
    the same 16-byte alignment through the kept runner (with those tensors); a tensor at another
    alignment, or another value of ``varying``, is a new key: the JIT again."""
    kernel, runners, kept = FakeTriton(NAMES), Runners(), {}
    store = torch.empty(64)

    def planned(x, n=100):                        # n: an argument the plan does not fix
        runners.launch_planned(kept, (n,), kernel, (3, 8), _args(x=x, n=n), OPTIONS, CPU, 1)

    aligned, also_aligned, off_by_one = store[:8], store[16:24], store[1:9]     # 0, 64 and 4 bytes in
    for x in (aligned, also_aligned, off_by_one, off_by_one):
        planned(x)
    planned(aligned, n=101)
    assert [how for how, _, _ in kernel.launches] == ["jit", "runner", "jit", "runner", "jit"]
    assert kernel.launches[1][2][0] is also_aligned                            # the call's own tensor
    assert len(kept) == 3


def test_a_planned_launch_whose_runner_fails_leaves_the_jit():
    kernel, runners, kept = FakeTriton(NAMES), Runners(), {}
    runners.launch_planned(kept, (), kernel, (3, 8), _args(), OPTIONS, CPU, 1)
    kernel.fail = TypeError("launch() takes 20 positional arguments")
    with pytest.warns(RuntimeWarning, match="launching a compiled kernel directly failed"):
        runners.launch_planned(kept, (), kernel, (3, 8), _args(), OPTIONS, CPU, 1)
    runners.launch_planned(kept, (), kernel, (3, 8), _args(), OPTIONS, CPU, 1)
    assert [how for how, _, _ in kernel.launches] == ["jit", "jit", "jit"]
    assert runners.enabled is False


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter only")
def test_the_interpreter_keeps_nothing_and_computes_the_same():
    """Triton's interpreter returns no compiled kernel: every call runs the kernel, nothing is kept."""
    import triton
    import triton.language as tl

    @triton.jit
    def add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

    runners = Runners()
    for n in (5, 5, 7):
        x = torch.arange(n, dtype=torch.float32)
        y = torch.zeros(n)
        runners.launch(add, (1,), [x, y, n], dict(BLOCK=8), CPU)
        assert torch.equal(y, x + 1)
    assert not runners.by_key
