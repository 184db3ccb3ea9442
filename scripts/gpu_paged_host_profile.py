"""Where the host's time goes in one eager ``paged_decode`` call at B = 1 (issue 40, target 3a).

    PYTHONPATH=. python scripts/gpu_paged_host_profile.py > paged_host_profile.txt

At B = 1 the kernels take about 14 µs (CUDA-graph replay) and a back-to-back call about 110 µs
(``bench_paged_eager.csv``): the host sets the pace. For B = 1, 4k and 32k (Hq = 32, Hkv = 8, D = 128,
fp16) this prints, per call:
1. the host's microseconds issuing 200 calls without synchronising (``host_us``), and the decode loop's
   time (``loop_us``: wall clock between two synchronisations), for the default call, check_values=False,
   one split (one launch instead of two), and the default call with every launch keyed by
   ``runners.launch_key`` (the path before ``launch_planned``), side by side;
2. the layers of one call timed apart: the plan's key and lookup, the output buffers, the device
   context, each launch through the kept runners, the same launches straight into the compiled
   kernel's runner (no key), and an empty Triton kernel with as many arguments (the launcher's floor);
3. cProfile's 25 functions with the most time of their own over 200 calls.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

from attnkit.bench import paged as bench_paged
from attnkit.kernels import paged, paged_plans
from attnkit.kernels.flash import runners

CALLS = 200


def host_us(fn, calls: int = CALLS, repeats: int = 7) -> float:
    """Median over ``repeats`` rounds of the host's µs per call, ``calls`` calls issued without a sync."""
    fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def loop_us(fn, calls: int = CALLS) -> float:
    """µs per call of back-to-back calls, wall clock between two synchronisations (best of 3)."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def captured_launches(fn) -> list:
    """(kernel, grid, args, options, device, planned) of every launch one call of ``fn`` makes; planned:
    (kept, varying, n_tensors) of a ``RUNNERS.launch_planned``, None for a ``RUNNERS.launch``."""
    real, real_planned, calls = runners.RUNNERS.launch, runners.RUNNERS.launch_planned, []

    def spy(*args):
        calls.append((*args, None))
        return real(*args)

    def planned_spy(kept, varying, *args):
        calls.append((*args[:-1], (kept, varying, args[-1])))
        return real_planned(kept, varying, *args)

    runners.RUNNERS.launch, runners.RUNNERS.launch_planned = spy, planned_spy
    try:
        fn()
    finally:
        runners.RUNNERS.launch, runners.RUNNERS.launch_planned = real, real_planned
    torch.cuda.synchronize()
    return calls


def profiled(fn, calls: int = CALLS) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def empty_kernel_runner(n_args: int):
    """The compiled runner of a Triton kernel that does nothing, taking ``n_args`` int arguments."""
    import importlib.util

    names = [f"a{i}" for i in range(n_args)]
    src = f"def empty({', '.join(names)}):\n    pass\n"       # n_args parameters, none used
    path = f"/tmp/attnkit_empty_{n_args}.py"             # Triton reads a jit function's source file
    with open(path, "w") as handle:
        handle.write("import triton\n@triton.jit\n" + src)
    spec = importlib.util.spec_from_file_location(f"attnkit_empty_{n_args}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = [3] * n_args
    compiled = module.empty[(1,)](*args)
    runner = compiled[(1, 1, 1)]
    return lambda: runner(*args)


def layers(problem: dict) -> None:
    args = (problem["q"], problem["k_pages"], problem["v_pages"], problem["block_table"], problem["seq_lens"])
    call = lambda: paged.paged_decode(*args)                                   # noqa: E731
    launches = captured_launches(call)
    key_args = (*args, None, None, None, None, "grouped", (-1, -1), "device")
    key = paged_plans.plan_key(*key_args)
    plan = paged_plans.PLANS[key]
    print(f"  launches per call: {len(launches)}; plan: splits {plan.num_splits}, grid {plan.grid}, "
          f"args per launch {[len(launch[2]) for launch in launches]}")
    timed = {
        "whole call (default)": call,
        "plan_key": lambda: paged_plans.plan_key(*key_args),
        "plan_key + PLANS.get": lambda: paged_plans.PLANS.get(paged_plans.plan_key(*key_args)),
        "value_checks.capturing": lambda: paged.value_checks.capturing(problem["q"]),
        "new_buffer (output)": lambda: paged.new_buffer(plan.out_shape, torch.float16, problem["q"].device),
        "new_buffer (workspace)": lambda: paged.new_buffer(plan.workspace_shape, torch.float32, problem["q"].device)
        if plan.num_splits > 1 else None,
        "on_device context": lambda: paged.on_device(problem["q"].device).__enter__(),
    }
    for i, (kernel, grid, launch_args, options, device, planned) in enumerate(launches):
        launch = (kernel, grid, launch_args, options, device)
        timed[f"launch {i} through RUNNERS.launch (launch_key)"] = lambda launch=launch: runners.RUNNERS.launch(*launch)
        if planned is not None:
            kept, varying, n_tensors = planned
            timed[f"launch {i} through RUNNERS.launch_planned"] = (
                lambda launch=launch, p=planned: runners.RUNNERS.launch_planned(p[0], p[1], *launch, p[2]))
        timed[f"launch {i}: launch_key alone"] = lambda launch=launch: runners.launch_key(*launch[1:])
        key = runners.RUNNERS._key(*launch)
        kept_runner = runners.RUNNERS.by_key.get(key)
        if kept_runner is not None:
            _, runner, constexprs = kept_runner
            timed[f"launch {i}: kept runner alone"] = (
                lambda runner=runner, a=launch_args, c=constexprs: runner(*a, *c))
        try:
            timed[f"launch {i}: empty kernel, {len(launch_args)} int args"] = empty_kernel_runner(len(launch_args))
        except Exception as exc:                         # the floor is a comparison, not the point
            print(f"  empty kernel of {len(launch_args)} args: {type(exc).__name__}: {exc}")
    for name, fn in timed.items():
        try:
            print(f"  {name:44} {host_us(fn):8.2f} µs")
        except Exception as exc:
            print(f"  {name:44} failed: {type(exc).__name__}: {exc}")


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}, {time.strftime('%Y-%m-%d')}")
    for batch, context in ((1, 4096), (1, 32768)):
        problem = bench_paged.make_problem(batch, context)
        args = (problem["q"], problem["k_pages"], problem["v_pages"], problem["block_table"], problem["seq_lens"])
        print(f"== B = {batch}, context {context}")
        for name, fn in (("default", lambda: paged.paged_decode(*args)),
                         ("check_values=False", lambda: paged.paged_decode(*args, check_values=False)),
                         ("num_splits=1", lambda: paged.paged_decode(*args, num_splits=1))):
            print(f"  {name:22} host_us {host_us(fn):8.2f}  loop_us {loop_us(fn):8.2f}")
        planned = runners.RUNNERS.launch_planned                 # the path before launch_planned, side by side
        runners.RUNNERS.launch_planned = lambda kept, varying, *a: runners.RUNNERS.launch(*a[:-1])
        try:
            fn = lambda: paged.paged_decode(*args)                           # noqa: E731
            print(f"  {'default, launch_key':22} host_us {host_us(fn):8.2f}  loop_us {loop_us(fn):8.2f}"
                  "  (every launch keyed by launch_key, as before launch_planned)")
        finally:
            runners.RUNNERS.launch_planned = planned
        layers(problem)
        print(profiled(lambda: paged.paged_decode(*args)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
