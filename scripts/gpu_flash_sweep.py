"""Block-configuration sweep of the FlashAttention kernels on the H100 (issue 17): which tile sizes, warps
and pipeline depths each kernel should launch with, measured, instead of the few guesses in
``attnkit.kernels.flash.LAUNCHERS``.

    python scripts/gpu_flash_sweep.py OUTDIR --compile-only [--part I/N]   # compile (and check) share I of N
    python scripts/gpu_flash_sweep.py OUTDIR                               # check, time, pick winners
    ... --backward-only                                                   # the backward's sweeps alone
    ... --head-dim-256                                                    # D = 256 alone (below)
    ... --head-dims 96,112                                                # other head dims alone (below)

The compile-only runs fill Triton's on-disk cache in parallel (run N of them at once); the timing run,
alone on the GPU, then loads every kernel from the cache. Each candidate is checked before it is timed
(fp16, [1, 16, 1008, D]: FlashAttention-2's criterion, at most 2x plain fp16 PyTorch's max error against
fp32, outputs poisoned with NaN), and a candidate that fails or does not launch (out of shared memory)
is recorded with its reason.

Sweeps (fp16, B·N = 16k tokens, 16 heads):
- backward, D in {64, 128}, causal and not, N = 4096: each candidate of ``bwd_dkdv`` (with ``bwd_dq`` at
  its default) and of ``bwd_dq`` (with ``bwd_dkdv`` at its default) timed as the whole two-kernel
  backward; each candidate of ``bwd_atomic`` as the whole one-pass backward. Tiles by pointers (every
  candidate of ``CANDIDATES``) and by host-built tensor descriptors (``desc``: the launcher's autotuning
  candidates). Then each design, with and without descriptors, with its winners at N = 1k, 4k and 16k
  beside SDPA's cuDNN and flash backends (suite "backward_tuned").
- forward, D in {64, 128}: the best Triton rung, BEST_TRITON (launcher ``fwd_desc``) and, at D = 128, the
  "autotuned" rung (pointer loads, launcher ``fwd``), causal at N = 1k and 2k, non-causal at 4k and 16k,
  every candidate at every N, beside cuDNN.
With --head-dim-256: the same sweeps at D = 256 alone (backward, and the forward's "autotuned" rung, the
launcher D = 256 uses), over ``CANDIDATES_D256`` for pointer and descriptor tiles alike: the configurations
that ptxas compiles for sm_90a without serialising the matrix products and with at most 24 bytes spilled
(``python -m attnkit.bench.compiled``, Triton 3.6), the halved default first. With --head-dims: the same
sweeps at the head dims named (a new row of ``attnkit.kernels.flash.dispatch.HEAD_DIMS``,
docs/adding_a_head_dim.md): backward, the "autotuned" forward and, at a power of two up to 128, the
descriptor forward; tiles padded past 128 take ``CANDIDATES_D256``, the others ``CANDIDATES``.
Rows go to OUTDIR/bench_flash_sweep.csv (columns: suite, launcher, desc, config, n, head_dim, causal, ms,
tflops, vs_cudnn, vs_default (the first candidate's time / this time; the first is the launcher's old
default), check, reason) and the winners to OUTDIR/sweep_winners.json.
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
from attnkit.kernels.flash import dispatch  # noqa: E402
from attnkit.kernels.flash import forward as forward_launch  # noqa: E402

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
CANDIDATES["fwd"] = CANDIDATES["fwd_desc"]
CANDIDATES_D256 = {
    "bwd_dkdv": [BC(64, 32, 4, 2), BC(64, 32, 8, 2), BC(32, 32, 4, 2), BC(32, 32, 4, 3), BC(16, 32, 4, 2)],
    "bwd_dq": [BC(64, 32, 4, 2), BC(64, 32, 8, 2), BC(64, 64, 8, 2), BC(16, 32, 4, 2)],
    "bwd_atomic": [BC(64, 32, 4, 2), BC(64, 32, 8, 2), BC(32, 32, 4, 2), BC(16, 32, 4, 2)],
    "fwd": [BC(64, 32, 4, 2), BC(64, 32, 8, 2), BC(64, 64, 8, 2), BC(64, 64, 4, 2), BC(128, 64, 8, 2)],
}
FORWARD_RUNG = {"fwd_desc": flash.BEST_TRITON, "fwd": "autotuned"}      # the rung each forward launcher serves
BACKWARD_CASES = [(128, True), (128, False), (64, True), (64, False)]        # (head_dim, causal)
BACKWARD_N, BACKWARD_TUNED_N = 4096, (1024, 4096, 16384)
FORWARD_CASES = {True: (1024, 2048), False: (4096, 16384)}                   # causal -> the N timed
FORWARD_SWEEPS = [("fwd_desc", 128), ("fwd_desc", 64), ("fwd", 128)]           # (launcher, head dim)
DESIGN_OF = {"bwd_dkdv": "two_kernels", "bwd_dq": "two_kernels", "bwd_atomic": "atomic_dq"}
PARTNER = {"bwd_dkdv": "bwd_dq", "bwd_dq": "bwd_dkdv"}     # the other kernel of the two-kernel design


def candidates(launcher: str, desc: bool, head_dim: int = 128) -> list:
    """Pointer tiles: every configuration of CANDIDATES; descriptor tiles: the launcher's autotuning ones;
    for tiles padded past 128 (D = 256) both CANDIDATES_D256."""
    if dispatch.padded(head_dim) > 128:
        return CANDIDATES_D256[launcher]
    return [BC(*c) for c in flash.LAUNCHERS[launcher][1]] if desc else CANDIDATES[launcher]


def backward_configs(launcher: str, config: flash.BlockConfig, head_dim: int) -> dict:
    """Every launcher of the design fixed: ``config`` for ``launcher``, the default for its partner."""
    configs = {launcher: config}
    if launcher in PARTNER:
        configs[PARTNER[launcher]] = flash.default_config(PARTNER[launcher], head_dim)
    return configs


def run_backward(tensors, o, lse, causal, design, configs, desc):
    return fb.attnkit_backward(design, tensors, o, lse, causal, configs=configs, desc=desc)


def check_backward(design, configs, head_dim, causal, desc) -> str:
    failures = fb.check_backward(design, head_dim, causal, configs=configs, desc=desc)
    return "pass" if not failures else "FAIL: " + "; ".join(failures)


def run_forward(q, k, v, causal, config, launcher="fwd_desc"):
    rung = flash.VARIANTS[FORWARD_RUNG[launcher]]
    return lambda: forward_launch.forward_rung(q, k, v, causal, 1 / math.sqrt(q.shape[-1]), rung, config)


def check_forward(causal, config, launcher, head_dim) -> str:
    """Batch 1 and 2: Triton compiles an integer argument equal to 1 (the forward's batch) as a constant,
    so both kernel variants the timings use (N = 16k runs one sequence) are checked and compiled."""
    failures = []
    for batch in (1, 2):
        q, k, v, _ = fb.random_inputs(batch, fb.HEADS, fb.CHECK_N, head_dim, seed=3 + causal)
        with fb.poisoned_buffers():
            o, _ = run_forward(q, k, v, causal, config, launcher)()
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
def work_items(backward_only: bool = False):
    """Every (kind, launcher, desc, head_dim, causal, config) to compile, check and time, in a fixed order."""
    items = [("backward", launcher, desc, d, causal, c) for d, causal in BACKWARD_CASES
             for launcher in ("bwd_dkdv", "bwd_dq", "bwd_atomic") for desc in (False, True)
             for c in candidates(launcher, desc, d)]
    items += [("forward", launcher, launcher == "fwd_desc", d, causal, c)
              for launcher, d in forward_sweeps(backward_only) for causal in FORWARD_CASES
              for c in forward_candidates(launcher, d)]
    return items


def forward_sweeps(backward_only: bool):
    """(launcher, head dim) of the forward sweeps: none with --backward-only."""
    return [] if backward_only else FORWARD_SWEEPS


def forward_candidates(launcher: str, head_dim: int) -> list:
    return CANDIDATES_D256[launcher] if dispatch.padded(head_dim) > 128 else CANDIDATES[launcher]


def head_dims() -> list[int]:
    return sorted({d for d, _ in BACKWARD_CASES})


def check_item(item) -> str:
    kind, launcher, desc, head_dim, causal, config = item
    if kind == "forward":
        return guarded(lambda: check_forward(causal, config, launcher, head_dim))
    return guarded(lambda: check_backward(DESIGN_OF[launcher], backward_configs(launcher, config, head_dim),
                                          head_dim, causal, desc))


def row(suite, launcher, config, n, head_dim, causal, ms, *, backward, desc=False, check="", reason=""):
    batch = fb.TOKENS // n
    return dict(suite=suite, launcher=launcher, desc=desc,
                config=config if isinstance(config, str) else fb.config_name(config),
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
        for desc in (False, True):
            launcher_rows = []
            for config in candidates(launcher, desc, head_dim):
                status = checks[("backward", launcher, desc, head_dim, causal, config)]
                ms, why = (float("nan"), "") if status != "pass" else fb.timed(
                    lambda c=config, d=desc: run_backward(tensors, o, lse, causal, DESIGN_OF[launcher],
                                                          backward_configs(launcher, c, head_dim), d))
                launcher_rows.append(row("sweep_backward", launcher, config, n, head_dim, causal, ms, backward=True,
                                         desc=desc, check=status, reason=why))
            case_rows += ratios(launcher_rows, cudnn_ms, launcher_rows[0]["ms"])
    rows += case_rows
    fb.log(f"backward D={head_dim} causal={causal} N={n}: cuDNN {cudnn_ms:.3f} ms; best " + ", ".join(
        f"{launcher}{' desc' if desc else ''} {b['config']} {b['ms']:.3f} ms ({b['vs_cudnn']:.2f}x cuDNN)"
        for launcher in ("bwd_dkdv", "bwd_dq", "bwd_atomic") for desc in (False, True)
        if (b := best(case_rows, launcher=launcher, desc=desc)) is not None))


def tuned_backward(rows, winners, head_dim, causal):
    """Each design, tiles by pointers and by descriptors, with its winning configurations at every N,
    beside SDPA's cuDNN and flash backends."""
    for n in BACKWARD_TUNED_N:
        tensors = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, head_dim)
        o, lse = fb.forward_for_backward(*tensors[:3], causal)
        case = []
        for impl in ("sdpa_cudnn", "sdpa_flash"):
            ms, why = fb.timed(lambda i=impl: fb.sdpa_backward(i, tensors, causal))
            case.append(row("backward_tuned", impl, "", n, head_dim, causal, ms, backward=True, reason=why))
        for design, launchers in (("two_kernels", ("bwd_dkdv", "bwd_dq")), ("atomic_dq", ("bwd_atomic",))):
            for desc in (False, True):
                configs = {name: winners[winner_key(name, head_dim, desc)] for name in launchers}
                ms, why = fb.timed(lambda d=design, c=configs, t=desc: run_backward(tensors, o, lse, causal, d, c, t))
                label = " + ".join(f"{name} {fb.config_name(c)}" for name, c in configs.items())
                case.append(row("backward_tuned", design, label, n, head_dim, causal, ms, backward=True, desc=desc,
                                check="pass", reason=why))
        rows += ratios(case, case[0]["ms"])
        fb.log(f"tuned backward D={head_dim} causal={causal} N={n}: " + ", ".join(
            f"{r['launcher']}{' desc' if r['desc'] else ''} {r['vs_cudnn']:.2f}x" for r in case))


def sweep_forward(checks, rows, launcher, head_dim, causal):
    desc = launcher == "fwd_desc"
    for n in FORWARD_CASES[causal]:
        q, k, v, _ = fb.random_inputs(fb.TOKENS // n, fb.HEADS, n, head_dim)
        with torch.no_grad():
            cudnn_ms, _ = fb.timed(lambda: lambda: fb.implementation("sdpa_cudnn")(q, k, v, causal))
            case = [row("sweep_forward", "sdpa_cudnn", "", n, head_dim, causal, cudnn_ms, backward=False)]
            for config in forward_candidates(launcher, head_dim):
                status = checks[("forward", launcher, desc, head_dim, causal, config)]
                ms, why = (float("nan"), "") if status != "pass" else fb.timed(
                    lambda c=config: run_forward(q, k, v, causal, c, launcher))
                case.append(row("sweep_forward", launcher, config, n, head_dim, causal, ms, backward=False, desc=desc,
                                check=status, reason=why))
        rows += ratios(case[1:], cudnn_ms, case[1]["ms"]) + ratios(case[:1], cudnn_ms)
        b = best(case, launcher=launcher)
        if b:
            fb.log(f"forward {launcher} D={head_dim} causal={causal} N={n}: cuDNN {cudnn_ms:.3f} ms; best "
                   f"{b['config']} {b['ms']:.3f} ms, {b['vs_cudnn']:.2f}x cuDNN, {b['vs_default']:.2f}x the first")


def winner_key(launcher, head_dim, desc) -> str:
    """sweep_winners.json's key: e.g. bwd_dkdv_desc_d128 (backward launchers, descriptor tiles), fwd_d128."""
    return f"{launcher}{'_desc' if desc and launcher.startswith('bwd') else ''}_d{head_dim}"


def geometric_winner(rows, launcher, head_dim, desc) -> flash.BlockConfig:
    """The candidate with the smallest geometric mean time over the sweep's cases at this head dim where it
    passed everywhere (the launcher's default when none did)."""
    mine = [r for r in rows if r["launcher"] == launcher and r["head_dim"] == head_dim and r["desc"] == desc
            and r["suite"].startswith("sweep")]
    cases = {(r["n"], r["causal"]) for r in mine}
    scores = {}
    for config in (candidates(launcher, desc, head_dim) if launcher.startswith("bwd")
                   else forward_candidates(launcher, head_dim)):
        timed = [r for r in mine
                 if r["config"] == fb.config_name(config) and r["check"] == "pass" and r["ms"] == r["ms"]]
        if timed and len(timed) == len(cases):
            scores[config] = math.exp(sum(math.log(r["ms"]) for r in timed) / len(timed))
    return min(scores, key=scores.get) if scores else flash.default_config(launcher, head_dim)


def main(argv) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    backward_only = "--backward-only" in argv
    dims = [256] if "--head-dim-256" in argv else (
        [int(d) for d in argv[argv.index("--head-dims") + 1].split(",")] if "--head-dims" in argv else None)
    if dims:
        global BACKWARD_CASES, FORWARD_SWEEPS
        BACKWARD_CASES = [(d, causal) for d in dims for causal in (True, False)]
        FORWARD_SWEEPS = [(launcher, d) for d in dims for launcher in ("fwd_desc", "fwd")
                          if launcher == "fwd" or d == dispatch.padded(d) <= 128]
    items = work_items(backward_only)
    fb.check_sdpa_lse()
    if "--compile-only" in argv:
        part, parts = (int(x) for x in (argv[argv.index("--part") + 1] if "--part" in argv else "0/1").split("/"))
        for item in items[part::parts]:
            fb.log(item[:5], fb.config_name(item[5]), check_item(item))
        return 0
    checks = {item: check_item(item) for item in items}
    failed = {k: v for k, v in checks.items() if v != "pass"}
    fb.log(f"{len(checks) - len(failed)} of {len(checks)} candidates passed their checks")
    for item, status in failed.items():
        fb.log("  ", item[:5], fb.config_name(item[5]), status)
    rows: list[dict] = []
    for head_dim, causal in BACKWARD_CASES:
        sweep_backward(checks, rows, head_dim, causal)
        write_results("flash_sweep", rows, out)
    for launcher, head_dim in forward_sweeps(backward_only):
        for causal in FORWARD_CASES:
            sweep_forward(checks, rows, launcher, head_dim, causal)
        write_results("flash_sweep", rows, out)
    winners = {winner_key(launcher, d, desc): geometric_winner(rows, launcher, d, desc)
               for launcher in ("bwd_dkdv", "bwd_dq", "bwd_atomic") for d in head_dims() for desc in (False, True)}
    for launcher, d in forward_sweeps(backward_only):
        desc = launcher == "fwd_desc"
        winners[winner_key(launcher, d, desc)] = geometric_winner(rows, launcher, d, desc)
    (out / "sweep_winners.json").write_text(json.dumps(
        {name: [c.block_m, c.block_n, c.num_warps, c.num_stages] for name, c in winners.items()}, indent=1))
    fb.log("winners (geometric mean over the sweep's cases):",
           {name: fb.config_name(c) for name, c in winners.items()})
    for head_dim, causal in BACKWARD_CASES:
        tuned_backward(rows, winners, head_dim, causal)
        write_results("flash_sweep", rows, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
