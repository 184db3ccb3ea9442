"""Block-configuration sweep of the FlashAttention kernels on the H100 (issue 17): which tile sizes, warps
and pipeline depths each kernel should launch with, measured, instead of the few guesses in
``attnkit.kernels.flash.LAUNCHERS``.

    python scripts/gpu_flash_sweep.py OUTDIR --compile-only [--part I/N]   # compile (and check) share I of N
    python scripts/gpu_flash_sweep.py OUTDIR                               # check, time, pick winners

The compile-only runs fill Triton's on-disk cache in parallel (run N of them at once); the timing run,
alone on the GPU, then loads every kernel from the cache. Each candidate is checked before it is timed
(fp16, [1, 16, 1008, D]: FlashAttention-2's criterion, at most 2x plain fp16 PyTorch's max error against
fp32, outputs poisoned with NaN), and a candidate that fails or does not launch (out of shared memory)
is recorded with its reason.

Sweeps (fp16, B·N = 16k tokens, 16 heads):
- backward, D in {64, 128}, causal and not, N = 4096: each candidate of ``bwd_dkdv`` (with ``bwd_dq`` at
  its default) and of ``bwd_dq`` (with ``bwd_dkdv`` at its default) timed as the whole two-kernel
  backward; each candidate of ``bwd_atomic`` as the whole one-pass backward. Then each design with its
  winners at N = 1k, 4k and 16k beside SDPA's cuDNN and flash backends (suite "backward_tuned").
- forward (the "best" rung, launcher ``fwd_desc``), D = 128: causal at N = 1k and 2k, non-causal at 4k
  and 16k, every candidate at every N, beside cuDNN.
Rows go to OUTDIR/bench_flash_sweep.csv (columns: suite, launcher, config, n, head_dim, causal, ms,
tflops, vs_cudnn, vs_default (the launcher's default configuration's time / this time), check, reason)
and the winners to OUTDIR/sweep_winners.json (read by scripts/gpu_flash_profile.py).
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ["ATTNKIT_AUTOTUNE"] = "0"

import gpu_flash_backward as fb  # noqa: E402  (scripts/ is sys.path[0])
import torch  # noqa: E402

from attnkit.bench.recorder import write_results  # noqa: E402
from attnkit.kernels import flash  # noqa: E402

BC = flash.BlockConfig
# (BLOCK_M, BLOCK_N, num_warps, num_stages). bwd_dkdv programs own BLOCK_N keys and loop over BLOCK_M
# queries; bwd_dq programs own BLOCK_M queries; the forward's own BLOCK_M queries.
CANDIDATES = {
    "bwd_dkdv": [BC(32, 64, 4, 3), BC(32, 128, 4, 3), BC(32, 128, 4, 4), BC(32, 128, 4, 5), BC(32, 128, 8, 3),
                 BC(64, 128, 8, 2), BC(64, 128, 8, 3), BC(64, 64, 4, 3), BC(64, 64, 4, 4), BC(16, 128, 4, 4),
                 BC(32, 64, 4, 5), BC(64, 128, 4, 3)],
    "bwd_dq": [BC(64, 32, 4, 3), BC(128, 32, 4, 3), BC(128, 32, 4, 4), BC(128, 32, 4, 5), BC(128, 32, 8, 3),
               BC(128, 64, 8, 2), BC(128, 64, 8, 3), BC(64, 64, 4, 3), BC(64, 64, 4, 4), BC(128, 16, 4, 4),
               BC(64, 32, 4, 5), BC(128, 64, 4, 3)],
    "bwd_atomic": [BC(64, 128, 8, 2), BC(64, 128, 8, 3), BC(64, 64, 8, 2), BC(64, 64, 4, 3), BC(32, 128, 4, 3),
                   BC(32, 128, 8, 3), BC(64, 128, 4, 2), BC(128, 128, 8, 2)],
    "fwd_desc": [BC(128, 64, 4, 3), BC(128, 64, 8, 3), BC(128, 128, 8, 3), BC(128, 64, 8, 4), BC(64, 64, 4, 3),
                 BC(128, 128, 8, 2), BC(128, 64, 4, 4), BC(64, 128, 4, 3), BC(128, 32, 4, 4), BC(64, 64, 4, 4)],
}
BACKWARD_CASES = [(128, True), (128, False), (64, True), (64, False)]        # (head_dim, causal)
BACKWARD_N, BACKWARD_TUNED_N = 4096, (1024, 4096, 16384)
FORWARD_CASES = {True: (1024, 2048), False: (4096, 16384)}                   # causal -> the N timed
FORWARD_D = 128
DESIGN_OF = {"bwd_dkdv": "two_kernels", "bwd_dq": "two_kernels", "bwd_atomic": "atomic_dq"}
PARTNER = {"bwd_dkdv": "bwd_dq", "bwd_dq": "bwd_dkdv"}     # the other kernel of the two-kernel design


def default(launcher: str) -> flash.BlockConfig:
    return flash.LAUNCHERS[launcher][2]


def backward_configs(launcher: str, config: flash.BlockConfig) -> dict:
    """Every launcher of the design fixed: ``config`` for ``launcher``, the defaults for its partner."""
    configs = {launcher: config}
    if launcher in PARTNER:
        configs[PARTNER[launcher]] = default(PARTNER[launcher])
    return configs


def run_backward(tensors, o, lse, causal, design, configs):
    q, k, v, do = tensors
    scale = 1 / math.sqrt(q.shape[-1])
    return lambda: flash._backward(do, q, k, v, o, lse, causal, scale, design=design, configs=configs)


def check_backward(design, configs, head_dim, causal) -> str:
    q, k, v, do = fb.random_inputs(1, fb.HEADS, fb.CHECK_N, head_dim, seed=head_dim + causal)
    o, lse = fb.forward_for_backward(q, k, v, causal)
    with fb.poisoned_buffers():
        got = run_backward((q, k, v, do), o, lse, causal, design, configs)()
    exact = fb.reference_grads(q, k, v, do, causal, torch.float32)
    plain = fb.reference_grads(q, k, v, do, causal, q.dtype)
    failures = [f"not finite: {n}" for n, g in zip(("dq", "dk", "dv"), got) if not torch.isfinite(g).all()]
    failures += fb.within_criterion(got, exact[1:], plain[1:], ("dq", "dk", "dv"))
    return "pass" if not failures else "FAIL: " + "; ".join(failures)


def run_forward(q, k, v, causal, config):
    rung = flash.VARIANTS[flash.BEST]
    return lambda: flash._forward_rung(q, k, v, causal, 1 / math.sqrt(q.shape[-1]), rung, config)


def check_forward(causal, config) -> str:
    """Batch 1 and 2: Triton compiles an integer argument equal to 1 (the forward's batch) as a constant,
    so both kernel variants the timings use (N = 16k runs one sequence) are checked and compiled."""
    failures = []
    for batch in (1, 2):
        q, k, v, _ = fb.random_inputs(batch, fb.HEADS, fb.CHECK_N, FORWARD_D, seed=3 + causal)
        with fb.poisoned_buffers():
            o, _ = run_forward(q, k, v, causal, config)()
        exact, plain = (fb.attention_plain(q.to(dt), k.to(dt), v.to(dt), causal).float()
                        for dt in (torch.float32, q.dtype))
        failures += [] if torch.isfinite(o).all() else [f"not finite: o (batch {batch})"]
        failures += fb.within_criterion([o], [exact], [plain], [f"o (batch {batch})"])
    return "pass" if not failures else "FAIL: " + "; ".join(failures)


def guarded(fn) -> str:
    try:
        return fn()
    except Exception as exc:   # out of resources (shared memory), compile errors
        return f"ERROR: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


# ------------------------------------------------------------------------------------------ the work
def work_items():
    """Every (kind, launcher, head_dim, causal, config) to compile, check and time, in a fixed order."""
    items = [("backward", launcher, d, causal, c) for d, causal in BACKWARD_CASES
             for launcher in ("bwd_dkdv", "bwd_dq", "bwd_atomic") for c in CANDIDATES[launcher]]
    items += [("forward", "fwd_desc", FORWARD_D, causal, c) for causal in FORWARD_CASES for c in CANDIDATES["fwd_desc"]]
    return items


def check_item(item) -> str:
    kind, launcher, head_dim, causal, config = item
    if kind == "forward":
        return guarded(lambda: check_forward(causal, config))
    return guarded(lambda: check_backward(DESIGN_OF[launcher], backward_configs(launcher, config), head_dim, causal))


def row(suite, launcher, config, n, head_dim, causal, ms, *, backward, check="", reason=""):
    batch = fb.TOKENS // n
    return dict(suite=suite, launcher=launcher, config=config if isinstance(config, str) else fb.config_name(config),
                n=n, head_dim=head_dim, causal=causal, ms=ms,
                tflops=fb.tflops(ms, batch, fb.HEADS, head_dim, n, causal, backward),
                vs_cudnn=float("nan"), vs_default=float("nan"), check=check, reason=reason)


def ratios(rows, cudnn_ms, default_ms=None):
    for r in rows:
        if r["ms"] == r["ms"]:
            r["vs_cudnn"] = cudnn_ms / r["ms"]
            if default_ms:
                r["vs_default"] = default_ms / r["ms"]
    return rows


def best(rows, **where):
    """The fastest passing row matching ``where``, or None."""
    ok = [r for r in rows if r["check"] == "pass" and r["ms"] == r["ms"] and all(r[k] == v for k, v in where.items())]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def sweep_backward(checks, rows, head_dim, causal):
    n = BACKWARD_N
    tensors = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, head_dim)
    o, lse = fb.forward_for_backward(*tensors[:3], causal)
    cudnn_ms, _ = fb.timed(lambda: fb.sdpa_backward("sdpa_cudnn", tensors, causal))
    case_rows = []
    for launcher in ("bwd_dkdv", "bwd_dq", "bwd_atomic"):
        launcher_rows = []
        for config in CANDIDATES[launcher]:
            status = checks[("backward", launcher, head_dim, causal, config)]
            ms, why = (float("nan"), "") if status != "pass" else fb.timed(
                lambda c=config: run_backward(tensors, o, lse, causal, DESIGN_OF[launcher],
                                              backward_configs(launcher, c)))
            launcher_rows.append(row("sweep_backward", launcher, config, n, head_dim, causal, ms, backward=True,
                                     check=status, reason=why))
        default_ms = launcher_rows[0]["ms"]   # the first candidate of each list is today's default
        case_rows += ratios(launcher_rows, cudnn_ms, default_ms)
    rows += case_rows
    fb.log(f"backward D={head_dim} causal={causal} N={n}: cuDNN {cudnn_ms:.3f} ms; best " + ", ".join(
        f"{launcher} {b['config']} {b['ms']:.3f} ms ({b['vs_default']:.2f}x default)"
        for launcher in ("bwd_dkdv", "bwd_dq", "bwd_atomic")
        if (b := best(case_rows, launcher=launcher)) is not None))


def tuned_backward(rows, winners, head_dim, causal):
    """Each design with its winning configurations at every N, beside SDPA's cuDNN and flash backends."""
    for n in BACKWARD_TUNED_N:
        tensors = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, head_dim)
        o, lse = fb.forward_for_backward(*tensors[:3], causal)
        case = []
        for impl in ("sdpa_cudnn", "sdpa_flash"):
            ms, why = fb.timed(lambda i=impl: fb.sdpa_backward(i, tensors, causal))
            case.append(row("backward_tuned", impl, "", n, head_dim, causal, ms, backward=True, reason=why))
        for design, launchers in (("two_kernels", ("bwd_dkdv", "bwd_dq")), ("atomic_dq", ("bwd_atomic",))):
            configs = {name: winners[name] for name in launchers}
            ms, why = fb.timed(lambda d=design, c=configs: run_backward(tensors, o, lse, causal, d, c))
            label = " + ".join(f"{name} {fb.config_name(c)}" for name, c in configs.items())
            case.append(row("backward_tuned", design, label, n, head_dim, causal, ms, backward=True,
                            check="pass", reason=why))
        rows += ratios(case, case[0]["ms"])
        fb.log(f"tuned backward D={head_dim} causal={causal} N={n}: " + ", ".join(
            f"{r['launcher']} {r['vs_cudnn']:.2f}x" for r in case))


def sweep_forward(checks, rows, causal):
    for n in FORWARD_CASES[causal]:
        q, k, v, _ = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, FORWARD_D)
        with torch.no_grad():
            cudnn_ms, _ = fb.timed(lambda: lambda: fb.implementation("sdpa_cudnn")(q, k, v, causal))
            case = [row("sweep_forward", "sdpa_cudnn", "", n, FORWARD_D, causal, cudnn_ms, backward=False)]
            for config in CANDIDATES["fwd_desc"]:
                status = checks[("forward", "fwd_desc", FORWARD_D, causal, config)]
                ms, why = (float("nan"), "") if status != "pass" else fb.timed(
                    lambda c=config: run_forward(q, k, v, causal, c))
                case.append(row("sweep_forward", "fwd_desc", config, n, FORWARD_D, causal, ms, backward=False,
                                check=status, reason=why))
        rows += ratios(case, cudnn_ms, case[1]["ms"])
        b = best(case, launcher="fwd_desc")
        if b:
            fb.log(f"forward causal={causal} N={n}: cuDNN {cudnn_ms:.3f} ms; best {b['config']} {b['ms']:.3f} ms, "
                   f"{b['vs_cudnn']:.2f}x cuDNN, {b['vs_default']:.2f}x default")


def geometric_winner(rows, launcher) -> flash.BlockConfig:
    """The candidate with the smallest geometric mean time over the sweep's cases where it passed everywhere."""
    cases = {(r["n"], r["head_dim"], r["causal"]) for r in rows if r["launcher"] == launcher}
    scores = {}
    for config in CANDIDATES[launcher]:
        mine = [r for r in rows if r["launcher"] == launcher and r["config"] == fb.config_name(config)
                and r["suite"].startswith("sweep") and r["check"] == "pass" and r["ms"] == r["ms"]]
        if len(mine) == len(cases):
            scores[config] = math.exp(sum(math.log(r["ms"]) for r in mine) / len(mine))
    return min(scores, key=scores.get) if scores else default(launcher)


def main(argv) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    items = work_items()
    fb.check_sdpa_lse()
    if "--compile-only" in argv:
        part, parts = (int(x) for x in (argv[argv.index("--part") + 1] if "--part" in argv else "0/1").split("/"))
        for item in items[part::parts]:
            fb.log(item[:4], fb.config_name(item[4]), check_item(item))
        return 0
    checks = {item: check_item(item) for item in items}
    failed = {k: v for k, v in checks.items() if v != "pass"}
    fb.log(f"{len(checks) - len(failed)} of {len(checks)} candidates passed their checks")
    for item, status in failed.items():
        fb.log("  ", item[:4], fb.config_name(item[4]), status)
    rows: list[dict] = []
    for head_dim, causal in BACKWARD_CASES:
        sweep_backward(checks, rows, head_dim, causal)
        write_results("flash_sweep", rows, out)
    for causal in FORWARD_CASES:
        sweep_forward(checks, rows, causal)
        write_results("flash_sweep", rows, out)
    winners = {launcher: geometric_winner(rows, launcher) for launcher in CANDIDATES}
    (out / "sweep_winners.json").write_text(json.dumps(
        {name: [c.block_m, c.block_n, c.num_warps, c.num_stages] for name, c in winners.items()}))
    fb.log("winners (geometric mean over the sweep's cases):",
           {name: fb.config_name(c) for name, c in winners.items()})
    for head_dim, causal in BACKWARD_CASES:
        tuned_backward(rows, winners, head_dim, causal)
        write_results("flash_sweep", rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
