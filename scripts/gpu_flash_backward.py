"""One GPU session for the FlashAttention backward designs and the causal forward's launch order
(issue 17, targets 1 and 2). Checks first, then times; rows go through attnkit.bench.recorder.write_results
to OUTDIR/bench_flash_backward.csv (rewritten after every case, so a cut-off run keeps what it measured).

    python scripts/gpu_flash_backward.py OUTDIR [--budget SECONDS]      # default budget 150 s

fp16, B·N = 16k tokens, H = 16, one fixed block configuration per kernel (ATTNKIT_AUTOTUNE=0: each
variant compiles once, ~10-15 s). Cases run in priority order and a case is skipped when its
estimated compile and timing cost would pass the budget:
1. backward (suite "backward"): attnkit "two_kernels" and "atomic_dq" (flash.backward.backward: the DELTA
   pre-pass and the design's kernels; for atomic_dq also zeroing and converting the fp32 dQ buffer)
   against SDPA's cuDNN and flash backends (torch.autograd.grad through SDPA), N in {1k, 4k, 16k};
   "atomic_dq_alt": atomic_dq with its second candidate block configuration (D = 128, N = 4k);
2. forward (suite "forward_order"): causal D = 128 at N = 1k and 2k, the best Triton rung (BEST_TRITON) with the
   longest-first order on and off, against SDPA cuDNN.
Order (PLAN): backward D = 128 N = 4k causal and not, D = 64 N = 4k causal, D = 128 N = 1k causal; the
forward at 1k and 2k; the backward shapes that need no new compile (the other N at D = 128, and at
D = 64 causal); atomic_dq_alt; D = 64 non-causal last.
Checks, once per design, head dim and causal flag, with outputs poisoned with NaN, before any timing
(B = 1, H = 16, N = 1008: ragged against the 64- and 128-row tiles, same kernel specialisations as the
timed shapes): max error of dq, dk, dv (and the forward's o) against an fp32 PyTorch reference at most
2x that of plain fp16 PyTorch;
the two launch orders of the forward must give bit-identical o and lse. The backward's o and lse come
from SDPA's flash backend (torch.ops.aten._scaled_dot_product_flash_attention; its lse is checked
against an fp32 log-sum-exp first), else from attnkit's forward: that saves one forward compile per
head dim and causal flag. TFLOP/s count 4·H·D per visible (query, key) pair, x 2.5 for the backward.
Row columns: suite, impl, pass_, n, head_dim, causal, ms, tflops, vs_cudnn (cuDNN's time / this time:
above 1 is faster than cuDNN), batch, heads, config, check, reason.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

os.environ["ATTNKIT_AUTOTUNE"] = "0"          # fixed block configurations: one compile per kernel variant

import torch  # noqa: E402

from attnkit.bench.flash import implementation  # noqa: E402
from attnkit.bench.recorder import time_ms, write_results  # noqa: E402
from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import backward as backward_launch  # noqa: E402
from attnkit.kernels.flash import forward as forward_launch  # noqa: E402
from attnkit.kernels.flash import layout  # noqa: E402

DEVICE = "cuda"
TOKENS, HEADS = 16384, 16
CHECK_N = 1008                 # divisible by 16 (as every timed N: the same kernel specialisations), not by 64
COMPILE_S, CASE_S = 12.0, 4.0  # estimated cost of one new kernel variant, and of timing one case
DESIGNS = flash.TRITON_BACKWARDS      # the Gluon designs: scripts/gpu_flash_hopper_backward.py
# the atomic design's second candidate, 64x64 (the first is LAUNCHERS["bwd_atomic"]'s default, 64x128)
ATOMIC_ALTERNATIVE = flash.BlockConfig(64, 64, 8, 2)

START = time.perf_counter()


def log(*args):
    print(f"[{time.perf_counter() - START:6.1f} s]", *args, flush=True)


def elapsed() -> float:
    return time.perf_counter() - START


# ---------------------------------------------------------------------------------- shapes, FLOPs
def visible_pairs(n: int, causal: bool) -> float:
    """(query, key) pairs one head of one sequence of n tokens computes: n², or n(n + 1)/2 causal."""
    return n * (n + 1) / 2 if causal else float(n * n)


def tflops(ms: float, batch: int, heads: int, head_dim: int, n: int, causal: bool, backward: bool) -> float:
    """4·H·D FLOPs per visible pair (x 2.5 for the backward) per second, in TFLOP/s; nan without a time."""
    if not ms == ms or ms <= 0:
        return float("nan")
    flops = 4.0 * heads * head_dim * batch * visible_pairs(n, causal) * (2.5 if backward else 1.0)
    return flops / (ms * 1e-3) / 1e12


def random_inputs(batch, heads, n, head_dim, device=None, dtype=torch.float16, seed=0):
    """q, k, v, do [batch, heads, n, head_dim] N(0, 1) in ``dtype``."""
    device = device or DEVICE
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(batch, heads, n, head_dim, device=device, generator=gen).to(dtype) for _ in range(4)]


# ------------------------------------------------------------------------------------- references
def attention_plain(q, k, v, causal):
    """Plain PyTorch attention in the inputs' dtype (softmax in fp32, as SDPA's math path), differentiable."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        s = s.masked_fill(~visible, -math.inf)
    return torch.softmax(s.float(), -1).to(q.dtype) @ v


def reference_grads(q, k, v, do, causal, dtype):
    """(o, dq, dk, dv) of plain PyTorch attention computed in ``dtype``, returned in fp32."""
    leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = attention_plain(*leaves, causal)
    return [t.float() for t in (out.detach(), *torch.autograd.grad(out, leaves, do.to(dtype)))]


def reference_lse(q, k, causal):
    """fp32 log-sum-exp of each row's scaled scores [B, H, N]."""
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        s = s.masked_fill(~visible, -math.inf)
    return torch.logsumexp(s, -1)


def within_criterion(got, exact, plain, names) -> list[str]:
    """FlashAttention-2's criterion: each of ``got`` at most 2x the max error of ``plain`` against ``exact``."""
    failures = []
    for name, g, r, p in zip(names, got, exact, plain):
        err = (g.float() - r).abs().max().item()
        plain_err = (p - r).abs().max().item()
        if not err <= 2 * plain_err:
            failures.append(f"{name}: {err:.3g} > 2 x {plain_err:.3g}")
    return failures


# ------------------------------------------------------------------------------ forward for the backward
_SDPA_LSE = {"usable": False}   # set by check_sdpa_lse: SDPA flash's lse matches an fp32 log-sum-exp


def _sdpa_flash_forward(q, k, v, causal):
    """(o, lse) from SDPA's flash backend: o [B, H, N, D] (any strides), lse [B, H, N] fp32 natural log."""
    result = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False,
                                                                scale=1 / math.sqrt(q.shape[-1]))
    o, lse = result[0], result[1]
    if tuple(lse.shape) != tuple(q.shape[:3]) or lse.dtype != torch.float32:
        raise ValueError(f"lse of shape {tuple(lse.shape)} {lse.dtype}")
    return o, lse


def check_sdpa_lse(head_dims=(64, 128)) -> bool:
    """Use SDPA's flash forward for the backward's (o, lse) only where its lse matches an fp32
    log-sum-exp (and its o plain fp16 attention) on [1, 16, CHECK_N, D] inputs, causal and not."""
    try:
        worst = 0.0
        for head_dim in head_dims:
            for causal in (False, True):
                q, k, v, _ = random_inputs(1, HEADS, CHECK_N, head_dim, seed=11)
                o, lse = _sdpa_flash_forward(q, k, v, causal)
                worst = max(worst, (lse - reference_lse(q, k, causal)).abs().max().item(),
                            (o.float() - attention_plain(q, k, v, causal).float()).abs().max().item())
        _SDPA_LSE["usable"] = worst < 1e-2
        log(f"SDPA flash (o, lse) against fp32 / plain fp16: max error {worst:.2e}; "
            + ("used for the backward's inputs" if _SDPA_LSE["usable"] else "attnkit's forward used instead"))
    except Exception as exc:   # an SDPA without this operator or with another lse layout
        _SDPA_LSE["usable"] = False
        log(f"SDPA flash forward not usable for the backward ({type(exc).__name__}: {str(exc)[:100]})")
    return _SDPA_LSE["usable"]


def forward_for_backward(q, k, v, causal):
    """(o, lse) for the backward: SDPA's flash forward where check_sdpa_lse found it usable, else attnkit's."""
    if q.is_cuda and _SDPA_LSE["usable"]:
        return _sdpa_flash_forward(q, k, v, causal)
    return flash.flash_attention_forward(q, k, v, causal=causal)


def attnkit_backward(design, tensors, o, lse, causal, config=None, *, configs=None, desc=None):
    """A function running the backward ``design`` (a key of flash.BACKWARDS) with fixed configs: ``config``
    for the one-pass kernel, or ``configs`` (launcher name -> BlockConfig); ``desc`` as flash.backward.backward's."""
    q, k, v, do = tensors
    if config is not None:
        configs = {"bwd_atomic": config}
    scale = 1 / math.sqrt(q.shape[-1])
    return lambda: backward_launch.backward(do, q, k, v, o, lse, causal, scale, design=design, configs=configs,
                                            desc=desc)


# ------------------------------------------------------------------------------------------ checks
class poisoned_buffers:
    """Within it, every buffer attnkit's kernels write starts as NaN: an element left unwritten fails a check."""

    def __enter__(self):
        self.saved = layout.new_buffer
        layout.new_buffer = lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)

    def __exit__(self, *exc):
        layout.new_buffer = self.saved


def check_backward(design, head_dim, causal, *, config=None, configs=None, desc=None, device=None, n=None,
                   heads=None) -> list[str]:
    """Failures (empty: passed) of ``design``'s dq, dk, dv on one [1, heads, n, head_dim] fp16 case."""
    q, k, v, do = random_inputs(1, heads or HEADS, n or CHECK_N, head_dim, device=device, seed=head_dim + causal)
    o, lse = forward_for_backward(q, k, v, causal)
    with poisoned_buffers():
        got = attnkit_backward(design, (q, k, v, do), o, lse, causal, config, configs=configs, desc=desc)()
    exact = reference_grads(q, k, v, do, causal, torch.float32)
    plain = reference_grads(q, k, v, do, causal, q.dtype)
    failures = [f"not finite: {name}" for name, g in zip("dq dk dv".split(), got) if not torch.isfinite(g).all()]
    return failures + within_criterion(got, exact[1:], plain[1:], ("dq", "dk", "dv"))


def order_rungs():
    """The best Triton rung (BEST_TRITON) with the longest-first launch order on and off."""
    from dataclasses import replace

    best = flash.VARIANTS[flash.BEST_TRITON]
    return {"longest_first": replace(best, longest_first=True), "natural_order": replace(best, longest_first=False)}


def check_forward_order(head_dim, *, device=None, n=None, heads=None) -> list[str]:
    """Failures of the causal forward in both launch orders: bit-identical o and lse, o within the criterion."""
    q, k, v, _ = random_inputs(1, heads or HEADS, n or CHECK_N, head_dim, device=device, seed=3)
    scale = 1 / math.sqrt(head_dim)
    with poisoned_buffers():
        (o_on, lse_on), (o_off, lse_off) = (forward_launch.forward_rung(q, k, v, True, scale, rung)
                                            for rung in order_rungs().values())
    failures = [] if torch.equal(o_on, o_off) and torch.equal(lse_on, lse_off) else ["orders differ"]
    exact, plain = (attention_plain(q.to(dtype), k.to(dtype), v.to(dtype), True).float()
                    for dtype in (torch.float32, q.dtype))
    return failures + within_criterion([o_on], [exact], [plain], ["o"])


# ------------------------------------------------------------------------------------------ timing
def sdpa_backward(name, tensors, causal):
    q, k, v, do = tensors
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = implementation(name)(*leaves, causal)
    return lambda: torch.autograd.grad(out, leaves, do, retain_graph=True)


def timed(build) -> tuple[float, str]:
    """(median ms of the function ``build()`` returns, '') or (nan, the reason it did not build or run)."""
    try:
        return time_ms(build()), ""
    except Exception as exc:
        return float("nan"), f"{type(exc).__name__}: {str(exc)[:160]}"


def row(suite, impl, pass_, n, head_dim, causal, ms, *, batch, config="", check="", reason=""):
    return dict(suite=suite, impl=impl, pass_=pass_, n=n, head_dim=head_dim, causal=causal, ms=ms,
                tflops=tflops(ms, batch, HEADS, head_dim, n, causal, pass_ == "backward"), vs_cudnn=float("nan"),
                batch=batch, heads=HEADS, config=config, check=check, reason=reason)


def with_cudnn_ratio(rows):
    """Fill vs_cudnn (cuDNN's ms / this row's ms) from the sdpa_cudnn row of the same case."""
    cudnn = [r for r in rows if r["impl"] == "sdpa_cudnn"]
    for r in rows:
        if cudnn and r["ms"] == r["ms"] and cudnn[0]["ms"] == cudnn[0]["ms"]:
            r["vs_cudnn"] = cudnn[0]["ms"] / r["ms"]
    return rows


def config_name(config: flash.BlockConfig) -> str:
    return f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}"


def design_config(design: str, head_dim: int, config=None) -> str:
    """The block configurations a timed design runs with (ATTNKIT_AUTOTUNE=0: the launchers' defaults)."""
    if design == "atomic_dq":
        return config_name(config or flash.default_config("bwd_atomic", head_dim))
    return " + ".join(f"{name} {config_name(flash.default_config(name, head_dim))}" for name in ("bwd_dkdv", "bwd_dq"))


class Session:
    """The run's state: which (design, head dim, causal) passed their checks, which kernel variants are
    compiled (for the budget estimate), and the rows so far."""

    def __init__(self, out: Path, budget_s: float):
        self.out, self.budget_s = out, budget_s
        self.rows: list[dict] = []
        self.checks: dict = {}
        self.compiled: set = set()

    def new_variants(self, keys) -> int:
        """Kernels still to compile for ``keys`` (a "two_kernels" key stands for two kernels)."""
        return sum(2 if key[0] == "two_kernels" else 1 for key in set(keys) - self.compiled)

    def affordable(self, keys, label) -> bool:
        cost = COMPILE_S * self.new_variants(keys) + CASE_S
        if elapsed() + cost > self.budget_s:
            log(f"skipped {label}: about {cost:.0f} s more would pass the {self.budget_s:.0f} s budget")
            return False
        return True

    def save(self):
        if self.rows:
            write_results("flash_backward", self.rows, self.out)

    def check(self, key, run_check) -> str:
        """'pass' or 'FAIL: ...' of one check, run once per key; a crash is a failure."""
        if key not in self.checks:
            try:
                failures = run_check()
            except Exception as exc:
                failures = [f"{type(exc).__name__}: {str(exc)[:160]}"]
            self.checks[key] = "pass" if not failures else "FAIL: " + "; ".join(failures)
            log(f"check {key}: {self.checks[key]}")
        return self.checks[key]


def backward_case(session: Session, head_dim: int, n: int, causal: bool, alternative: bool = False):
    label = f"backward D={head_dim} N={n} causal={causal}" + (" (atomic_dq alternative config)" if alternative else "")
    designs = [("atomic_dq", ATOMIC_ALTERNATIVE)] if alternative else [(d, None) for d in DESIGNS]
    keys = [("preprocess", head_dim)] + [(d, head_dim, causal, design_config(d, head_dim, c)) for d, c in designs]
    if not session.affordable(keys, label):
        return
    batch = TOKENS // n
    try:
        tensors = random_inputs(batch, HEADS, n, head_dim)
        o, lse = forward_for_backward(*tensors[:3], causal)
        rows = []
        for impl in ("sdpa_cudnn", "sdpa_flash"):
            ms, why = timed(lambda i=impl: sdpa_backward(i, tensors, causal))
            rows.append(row("backward", impl, "backward", n, head_dim, causal, ms, batch=batch, reason=why))
        for design, config in designs:
            status = session.check((design, head_dim, causal, design_config(design, head_dim, config)),
                                   lambda d=design, c=config: check_backward(d, head_dim, causal, config=c))
            ms, why = timed(lambda d=design, c=config: attnkit_backward(d, tensors, o, lse, causal, c))
            impl = design + ("_alt" if alternative else "")
            rows.append(row("backward", impl, "backward", n, head_dim, causal, ms, batch=batch,
                             config=design_config(design, head_dim, config),
                             check=status, reason=why))
        session.rows += with_cudnn_ratio(rows)
        for r in rows:
            log(f"{r['impl']:>16} {r['ms']:.3f} ms {r['tflops']:.0f} TFLOP/s {r['vs_cudnn']:.2f}x cuDNN {r['reason']}")
    except Exception as exc:
        session.rows.append(row("backward", "case", "backward", n, head_dim, causal, float("nan"), batch=batch,
                                reason=f"{type(exc).__name__}: {str(exc)[:160]}"))
        log(f"{label} failed: {exc}")
    session.compiled |= set(keys)
    session.save()


def forward_order_case(session: Session, n: int, head_dim: int = 128):
    label = f"forward causal D={head_dim} N={n}, longest-first on/off"
    keys = [("fwd", head_dim, order) for order in order_rungs()]
    if not session.affordable(keys, label):
        return
    batch = TOKENS // n
    try:
        q, k, v, _ = random_inputs(batch, HEADS, n, head_dim)
        scale = 1 / math.sqrt(head_dim)
        status = session.check(("forward_order", head_dim), lambda: check_forward_order(head_dim))
        rows = []
        with torch.no_grad():
            ms, why = timed(lambda: lambda: implementation("sdpa_cudnn")(q, k, v, True))
            rows.append(row("forward_order", "sdpa_cudnn", "forward", n, head_dim, True, ms, batch=batch, reason=why))
            for order, rung in order_rungs().items():
                ms, why = timed(lambda r=rung: lambda: forward_launch.forward_rung(q, k, v, True, scale, r))
                config = config_name(flash.default_config("fwd_desc", head_dim))
                rows.append(row("forward_order", f"attnkit_{order}", "forward", n, head_dim, True, ms, batch=batch,
                                config=f"{flash.BEST_TRITON}, fwd_desc {config}", check=status, reason=why))
        session.rows += with_cudnn_ratio(rows)
        for r in rows:
            log(f"{r['impl']:>22} {r['ms']:.3f} ms {r['tflops']:.0f} TFLOP/s {r['vs_cudnn']:.2f}x cuDNN {r['reason']}")
    except Exception as exc:
        session.rows.append(row("forward_order", "case", "forward", n, head_dim, True, float("nan"), batch=batch,
                                reason=f"{type(exc).__name__}: {str(exc)[:160]}"))
        log(f"{label} failed: {exc}")
    session.compiled |= set(keys)
    session.save()


# the cases in priority order: (kind, arguments)
PLAN = [
    ("backward", (128, 4096, True)), ("backward", (128, 4096, False)), ("backward", (64, 4096, True)),
    ("backward", (128, 1024, True)), ("forward", (1024,)), ("forward", (2048,)),
    ("backward", (128, 16384, True)), ("backward", (128, 1024, False)), ("backward", (128, 16384, False)),
    ("backward", (64, 1024, True)), ("backward", (64, 16384, True)),
    ("alternative", (128, 4096, True)), ("alternative", (128, 4096, False)),
    ("backward", (64, 4096, False)), ("backward", (64, 1024, False)), ("backward", (64, 16384, False)),
]


def summary(rows):
    """attnkit / cuDNN per case, and atomic_dq's gain over two_kernels."""
    for r in rows:
        if r["impl"] in ("two_kernels", "atomic_dq", "atomic_dq_alt"):
            two = [x for x in rows if x["impl"] == "two_kernels" and
                   (x["n"], x["head_dim"], x["causal"]) == (r["n"], r["head_dim"], r["causal"])]
            gain = two[0]["ms"] / r["ms"] if two else float("nan")
            log(f"D={r['head_dim']} N={r['n']} causal={r['causal']} {r['impl']}: {r['vs_cudnn']:.2f}x cuDNN, "
                f"{gain:.2f}x two_kernels, check {r['check']}")
        if r["impl"].startswith("attnkit_"):
            log(f"forward causal N={r['n']} {r['impl']}: {r['vs_cudnn']:.2f}x cuDNN")


def main(argv) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    budget = float(argv[argv.index("--budget") + 1]) if "--budget" in argv else 150.0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    session = Session(Path(argv[0]), budget)
    log(f"{torch.cuda.get_device_name()}, budget {budget:.0f} s, designs {list(DESIGNS)}")
    check_sdpa_lse()
    for kind, args in PLAN:
        if kind == "forward":
            forward_order_case(session, *args)
        else:
            backward_case(session, *args, alternative=kind == "alternative")
    summary(session.rows)
    failed = [key for key, status in session.checks.items() if status != "pass"]
    log(f"done; {len(session.rows)} rows; checks failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
