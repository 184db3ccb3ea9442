"""The FlashAttention backward designs (attnkit.kernels.flash.BACKWARDS) and the forward's launch order.

"atomic_dq" (one pass over key blocks, dQ by fp32 atomic adds) is checked against float64 autograd for
dq, dk and dv on every feature the two-kernel design has: causal and not, GQA, windows narrower and
wider than a tile, softcap, padded head dims, Dv != D, ragged lengths, strided views, packed
sequences. Both designs must agree; the forward's longest-first order must change nothing in the
results. On a CPU the kernels run in Triton's interpreter with 16-row tiles, so the sizes are small
and not multiples of 16.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from attnkit.kernels import flash
from attnkit.kernels.flash import (
    BACKWARDS,
    TRITON_BACKWARDS,
    dispatch,
    flash_attention,
    flash_attention_backward,
    flash_attention_varlen,
    layout,
    plans,
    triton_kernels,
)
from attnkit.kernels.flash import backward as backward_launch
from attnkit.kernels.flash import forward as forward_launch
from attnkit.tolerances import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every buffer the kernels write starts as NaN: an element left unwritten fails the comparison."""
    monkeypatch.setattr(layout, "new_buffer",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))
    monkeypatch.delenv(flash.BACKWARD_ENV, raising=False)


# ------------------------------------------------------------------------------------- references
def attention_float64(q, k, v, *, causal=False, window=(-1, -1), softcap=None):
    """Attention in float64 on the CPU, differentiable: q [B, Hq, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv].
    Query i sees key j when -left <= j - i - (Nk - Nq) <= right (-1: unbounded; causal: right = 0);
    logits s = q·k / sqrt(D), softcapped to softcap · tanh(s / softcap); a row that sees no key gives 0."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    diagonal = torch.arange(n_k)[None, :] - torch.arange(n_q)[:, None] - (n_k - n_q)
    left, right = window[0], 0 if causal else window[1]
    visible = torch.ones(n_q, n_k, dtype=torch.bool)
    if right >= 0:
        visible &= diagonal <= right
    if left >= 0:
        visible &= diagonal >= -left
    return torch.softmax(s.masked_fill(~visible, -math.inf), -1).nan_to_num(0.0) @ v


def reference_grads(q, k, v, do, **options):
    """(dq, dk, dv) by float64 autograd."""
    leaves = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    out = attention_float64(*leaves, **options)
    return torch.autograd.grad(out, leaves, do.detach().cpu().double())


def kernel_grads(q, k, v, do, backward, **options):
    """(dq, dk, dv) of flash_attention with the backward design ``backward``, through autograd."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attention(*leaves, backward=backward, **options)
    return torch.autograd.grad(out, leaves, do)


def random_case(seed, b, hq, hkv, nq, nk, d, dv=None, dtype=torch.float32):
    """q [b, hq, nq, d], k [b, hkv, nk, d], v [b, hkv, nk, dv], dO [b, hq, nq, dv]: N(0, 1) in ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    shapes = ((b, hq, nq, d), (b, hkv, nk, d), (b, hkv, nk, dv or d), (b, hq, nq, dv or d))
    return [torch.randn(*shape, generator=gen).to(DEVICE, dtype) for shape in shapes]


def check_atomic_against_float64(q, k, v, do, what, **options):
    got = kernel_grads(q, k, v, do, "atomic_dq", **options)
    for name, g, t, r in zip(("dq", "dk", "dv"), got, (q, k, v), reference_grads(q, k, v, do, **options)):
        assert g.shape == t.shape and g.dtype == t.dtype, f"{what} {name}: shape or dtype"
        assert torch.isfinite(g).all(), f"{what} {name}: not finite"
        assert_close(g, r, g.dtype, DEVICE, f"{what} {name}")


# --------------------------------------------------------------------- atomic dQ against float64
# (B, Hq, Hkv, Nq, Nk, D, Dv, options)
ATOMIC_CASES = [
    (1, 2, 2, 37, 37, 32, None, dict()),                                  # MHA, not causal
    (2, 4, 2, 21, 45, 32, None, dict(causal=True)),                       # GQA 2, causal, Nq < Nk
    (1, 8, 2, 33, 19, 16, None, dict(causal=True)),                       # GQA 4, Nq > Nk: rows that see no key
    (1, 3, 1, 29, 29, 16, None, dict()),                                  # MQA
    (1, 2, 1, 41, 41, 16, None, dict(causal=True, window=(5, -1))),       # window narrower than a tile
    (1, 2, 1, 41, 50, 16, None, dict(window=(20, 7))),                    # window wider than a tile, both sides
    (1, 2, 2, 30, 30, 16, None, dict(softcap=1.5)),                       # softcap (scaled-up logits below)
    (1, 2, 1, 23, 27, 40, None, dict(causal=True)),                       # D = 40: padded to 64
    (1, 2, 1, 19, 22, 80, None, dict()),                                  # D = 80: padded to 128
    (1, 4, 2, 25, 31, 48, 24, dict(causal=True)),                         # Dv != D
]


@pytest.mark.parametrize("case", ATOMIC_CASES, ids=str)
def test_atomic_dq_matches_float64(case):
    b, hq, hkv, nq, nk, d, dv, options = case
    q, k, v, do = random_case(hash(str(case)) % 2**31, b, hq, hkv, nq, nk, d, dv)
    if "softcap" in options:
        q = q * 4                                                        # logits past the cap's knee
    check_atomic_against_float64(q, k, v, do, str(case), **options)


def test_atomic_dq_on_strided_views():
    """[B, N, H, D] tensors viewed as [B, H, N, D], and v every other element of its head dim."""
    gen = torch.Generator().manual_seed(5)
    b, n, hq, hkv, d = 2, 21, 4, 2, 32
    q = torch.randn(b, n, hq, d, generator=gen).to(DEVICE).transpose(1, 2)
    k = torch.randn(b, n + 3, hkv, d, generator=gen).to(DEVICE).transpose(1, 2)
    v = torch.randn(b, hkv, n + 3, 2 * d, generator=gen).to(DEVICE)[..., ::2]
    do = torch.randn(b, n, hq, d, generator=gen).to(DEVICE).transpose(1, 2)
    assert not any(t.is_contiguous() for t in (q, k, v, do))
    check_atomic_against_float64(q, k, v, do, "strided", causal=True)


def test_atomic_dq_low_precision():
    """fp16 by FlashAttention-2's criterion: max error against fp32 autograd at most twice that of plain
    PyTorch attention run in fp16."""
    q, k, v, do = random_case(31, 1, 4, 2, 35, 35, 32, dtype=torch.float16)
    got = kernel_grads(q, k, v, do, "atomic_dq", causal=True)
    leaves32 = [t.detach().cpu().float().requires_grad_() for t in (q, k, v)]
    exact = torch.autograd.grad(attention_float64(*leaves32, causal=True), leaves32, do.cpu().float())
    leaves16 = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
    plain = torch.autograd.grad(attention_float64(*leaves16, causal=True), leaves16, do.cpu())
    for name, g, p, r in zip(("dq", "dk", "dv"), got, plain, exact):
        assert g.dtype == torch.float16
        err = (g.cpu().float() - r).abs().max().item()
        plain_err = (p.float() - r).abs().max().item()
        assert err <= 2 * plain_err, f"{name}: error {err:.3g} > 2 x plain fp16 PyTorch's {plain_err:.3g}"


def test_atomic_dq_packed_sequences():
    """flash_attention_varlen with the atomic design: each packed sequence against its own float64 reference
    (an empty sequence, a one-token one, lengths across tile boundaries)."""
    lens_q, lens_k = [0, 1, 23, 17, 40], [3, 1, 23, 30, 33]
    hq, hkv, d = 4, 2, 16
    gen = torch.Generator().manual_seed(9)
    q, do = (torch.randn(sum(lens_q), hq, d, generator=gen).to(DEVICE) for _ in range(2))
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=gen).to(DEVICE) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
                  for lens in (lens_q, lens_k))
    options = dict(causal=True, window=(12, -1))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = flash_attention_varlen(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), backward="atomic_dq", **options)
    got = torch.autograd.grad(out, leaves, do)
    def as_heads(t, a, z):                                              # rows [a, z) as [1, H, z - a, D]
        return t[a:z].transpose(0, 1)[None]

    spans_q, spans_k = (list(zip(cu[:-1].tolist(), cu[1:].tolist())) for cu in (cu_q, cu_k))
    for (qa, qb), (ka, kb) in zip(spans_q, spans_k):
        ref = reference_grads(as_heads(q, qa, qb), as_heads(k, ka, kb), as_heads(v, ka, kb), as_heads(do, qa, qb),
                              **options)
        for name, g, r, (a, z) in zip(("dq", "dk", "dv"), got, ref, ((qa, qb), (ka, kb), (ka, kb))):
            if z > a:
                assert_close(as_heads(g, a, z), r, torch.float32, DEVICE, f"{name} of sequence [{a}, {z})")


# ------------------------------------------------------------------------------ the two designs agree
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("options", [dict(), dict(causal=True), dict(causal=True, window=(9, -1), softcap=2.0)],
                         ids=str)
def test_designs_agree(options, dtype):
    q, k, v, do = random_case(hash(str(options)) % 2**31, 1, 4, 2, 27, 34, 32, dtype=dtype)
    two = kernel_grads(q, k, v, do, "two_kernels", **options)
    one = kernel_grads(q, k, v, do, "atomic_dq", **options)
    for name, a, b in zip(("dq", "dk", "dv"), two, one):
        assert_close(b, a.double(), dtype, DEVICE, f"{name}: atomic_dq against two_kernels")


def test_backward_entry_point_takes_the_design(monkeypatch):
    """flash_attention_backward(..., backward=) and $ATTNKIT_FLASH_BACKWARD launch the design they name."""
    q, k, v, do = random_case(3, 1, 2, 1, 18, 25, 16)
    o, lse = flash.flash_attention_forward(q, k, v, causal=True)
    launched = []
    real_launch = plans.launch
    monkeypatch.setattr(plans, "launch", lambda name, *a, **kw: launched.append(name) or real_launch(name, *a, **kw))
    expected = reference_grads(q, k, v, do, causal=True)
    for design, kernels in (("atomic_dq", ["bwd_atomic"]), ("two_kernels", ["bwd_dkdv", "bwd_dq"])):
        launched.clear()
        got = flash_attention_backward(do, q, k, v, o, lse, causal=True, backward=design)
        assert launched == kernels
        for name, g, r in zip(("dq", "dk", "dv"), got, expected):
            assert_close(g, r, torch.float32, DEVICE, f"{name} ({design})")
    monkeypatch.delenv(flash.BACKWARD_ENV, raising=False)
    launched.clear()
    flash_attention_backward(do, q, k, v, o, lse, causal=True)     # the default, warp_specialized: at 25 keys
    assert launched == ["bwd_dkdv", "bwd_dq"]                         # (anywhere but sm_90: always) two kernels
    monkeypatch.setenv(flash.BACKWARD_ENV, "atomic_dq")
    launched.clear()
    flash_attention_backward(do, q, k, v, o, lse, causal=True)
    assert launched == ["bwd_atomic"]
    launched.clear()
    flash_attention_backward(do, q, k, v, o, lse, causal=True, backward="two_kernels")   # the argument wins
    assert launched == ["bwd_dkdv", "bwd_dq"]


def test_designs_are_named_in_one_place():
    assert set(BACKWARDS) == {"two_kernels", "atomic_dq", "warp_specialized", "warp_specialized_atomic"}
    assert TRITON_BACKWARDS == ("two_kernels", "atomic_dq")
    assert flash.DEFAULT_BACKWARD == "warp_specialized_atomic"        # the one pass, measured fastest
    assert flash.DETERMINISTIC_BACKWARD == "warp_specialized"         # no additions in a racing order
    assert [name for name, d in BACKWARDS.items() if not d.reproducible] == ["atomic_dq", "warp_specialized_atomic"]
    assert BACKWARDS["atomic_dq"].products == 5 and BACKWARDS["two_kernels"].products == 7
    assert BACKWARDS["warp_specialized_atomic"].products == 5 and BACKWARDS["warp_specialized"].products == 7
    assert "bwd_atomic" in flash.LAUNCHERS and flash.LAUNCHERS["bwd_atomic"][0] == "bwd_dkdv"


def test_bad_backward_name_raises_value_error(monkeypatch):
    q, k, v, do = random_case(4, 1, 2, 1, 8, 8, 16)
    for bad in ("fastest", "", 5, "ATOMIC_DQ"):
        with pytest.raises(ValueError, match="backward: expected one of"):
            flash_attention(q, k, v, backward=bad)
    o, lse = flash.flash_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="backward: expected one of"):
        flash_attention_backward(do, q, k, v, o, lse, backward="atomic")
    cu = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="backward: expected one of"):
        flash_attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, 8, 8,
                               backward="one_kernel")
    monkeypatch.setenv(flash.BACKWARD_ENV, "atomics")
    with pytest.raises(ValueError, match=r"ATTNKIT_FLASH_BACKWARD.*expected one of"):
        flash_attention(q, k, v)


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for the test: yields the setter (for warn_only); restored."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield torch.use_deterministic_algorithms
    torch.use_deterministic_algorithms(was, warn_only=warn_only)


def test_deterministic_algorithms_get_the_reproducible_design(deterministic, monkeypatch):
    """Under torch.use_deterministic_algorithms(True) the default is the design whose dQ is added in a fixed
    order; naming a design that adds dQ atomically (by argument or by $ATTNKIT_FLASH_BACKWARD) is refused by
    name, or with warn_only=True warned about and run, as PyTorch treats its own nondeterministic kernels."""
    assert flash.check_backward(None) == flash.DETERMINISTIC_BACKWARD
    assert flash.check_backward("two_kernels") == "two_kernels"
    for racing in ("atomic_dq", "warp_specialized_atomic"):
        with pytest.raises(ValueError, match=rf"backward: '{racing}' adds dQ in no fixed order.*use_deterministic"):
            flash.check_backward(racing)
    monkeypatch.setenv(flash.BACKWARD_ENV, "atomic_dq")
    with pytest.raises(ValueError, match=r"from \$ATTNKIT_FLASH_BACKWARD\): 'atomic_dq' adds dQ"):
        flash.check_backward(None)
    deterministic(True, warn_only=True)
    with pytest.warns(UserWarning, match="not reproducible"):
        assert flash.check_backward(None) == "atomic_dq"
    monkeypatch.delenv(flash.BACKWARD_ENV)
    q, k, v, do = random_case(9, 1, 2, 1, 19, 23, 16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                # the default design warns about nothing
        got = torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)
    want = torch.autograd.grad(flash_attention(q, k, v, causal=True, backward="warp_specialized"), (q, k, v), do)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_without_deterministic_algorithms_the_default_is_the_one_pass():
    assert not torch.are_deterministic_algorithms_enabled()
    assert flash.check_backward(None) == "warp_specialized_atomic"


# --------------------------------------------------------------------- forward: longest blocks first
@pytest.mark.parametrize("options", [dict(causal=True), dict(causal=True, window=(7, -1)), dict(window=(-1, 3)),
                                     dict()], ids=str)
def test_longest_first_changes_only_the_order(monkeypatch, options):
    """The forward with LONGEST_FIRST on and off gives bit-identical o and lse; it is on exactly where the
    band is bounded on the right, and the results match float64."""
    q, k, v, _ = random_case(hash(str(options)) % 2**31, 2, 4, 2, 53, 45, 32)
    seen = []
    real_launch = plans.launch
    monkeypatch.setattr(plans, "launch", lambda *a, **kw: seen.append(kw["LONGEST_FIRST"]) or real_launch(*a, **kw))
    causal, window = options.get("causal", False), options.get("window", (-1, -1))
    runs = [forward_launch.forward_rung(q, k, v, causal, 1 / math.sqrt(32), flash.Rung(longest_first=on), window=window)
            for on in (True, False)]
    assert seen == [flash.right_bounded(causal, window), False]
    assert seen[0] == (causal or window[1] >= 0)
    (o_on, lse_on), (o_off, lse_off) = runs
    assert torch.equal(o_on, o_off) and torch.equal(lse_on, lse_off)
    ref = attention_float64(q.cpu().double(), k.cpu().double(), v.cpu().double(), causal=causal, window=window)
    assert_close(o_on, ref, torch.float32, DEVICE, f"o with longest-first order, {options}")


def test_default_rung_runs_longest_first():
    assert all(rung.longest_first for rung in flash.VARIANTS.values())


# ------------------------------------------------------------------------------ compiled for a GPU
COMPILE_FOR_SM90 = r'''
import os
import re
os.environ["TRITON_INTERPRET"] = "0"   # compile for a GPU target, even on a CPU
from attnkit.bench.compiled import compile_ptx
from attnkit.kernels.flash import triton_kernels as kernels

plain = dict(HEAD_DIM=128, HEAD_DIM_V=128, DIM_QK=128, DIM_V=128, BAND=False, SOFTCAP=False, VARLEN=False)
every_feature = dict(HEAD_DIM=128, HEAD_DIM_V=64, DIM_QK=80, DIM_V=48, BAND=True, SOFTCAP=True, VARLEN=True)


def compile_sm90(fn, constexprs, desc):
    """PTX of ``fn`` for sm_90; with ``desc`` the tiled tensors are host-built descriptors (DESC = 2)."""
    constexprs = dict(BLOCK_M=64, BLOCK_N=64, CAUSAL=True, DOT_PRECISION="tf32", DESC=2 if desc else 0, **constexprs)
    return compile_ptx(fn, constexprs, num_warps=8, num_stages=2, descriptors=desc)


for dims, atomic in ((plain, True), (every_feature, True), (plain, False)):
    ptx = compile_sm90(kernels._bwd_dkdv, dict(ATOMIC_DQ=atomic, **dims), desc=False)
    has_atomics = re.search(r"\b(red|atom)\.global", ptx) is not None  # not cp.async.ca.shared.global
    assert has_atomics == atomic, f"ATOMIC_DQ={atomic}, atomic adds in the PTX: {has_atomics}"
    print("compiled _bwd_dkdv")
# the descriptor backward: its tiles move by TMA (bulk tensor copies), dQ still by atomic adds
for fn, extra in ((kernels._bwd_dkdv, dict(ATOMIC_DQ=True)), (kernels._bwd_dkdv, dict(ATOMIC_DQ=False)),
                  (kernels._bwd_dq, {})):
    ptx = compile_sm90(fn, dict(extra, **plain), desc=True)
    assert "cp.async.bulk.tensor" in ptx, f"{fn.__name__} {extra}: no TMA copy in the PTX"
    has_atomics = re.search(r"\b(red|atom)\.global", ptx) is not None
    assert has_atomics == bool(extra.get("ATOMIC_DQ")), f"{fn.__name__} {extra}: atomic adds {has_atomics}"
    print("compiled", fn.__name__, "with descriptors")
'''


@pytest.mark.slow
def test_atomic_kernel_compiles_for_an_h100():
    """The interpreter is lenient: the one-pass kernel (``_bwd_dkdv`` with ATOMIC_DQ), plain and with every
    feature on, must also compile to PTX for sm_90 with its atomic adds, and without ATOMIC_DQ have none;
    with host-built descriptors (DESC = 2) both backward kernels must move their tiles by TMA copies."""
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 6


@pytest.mark.slow
def test_backward_defaults_keep_their_matrix_products_pipelined_on_an_h100():
    """Every backward launcher's default configuration, D = 64, 128 and 256, causal and not, compiled for
    sm_90a: ptxas must not serialise its warpgroup matrix products (note C7515; three query loops in the
    dK/dV kernel did, at a quarter of its speed) and at D <= 128 may spill at most 32 bytes a thread (at
    D = 256, where 64x32 tiles with 4 warps were the fastest measured, Triton 3.6 spills 24-64 bytes).
    The verdict belongs to the installed Triton's ptxas: Triton 3.6's serialised the three-loop kernel,
    3.9's does not, so on
    a GPU machine ``gpu_session.sh record-backward-warm`` runs the same report with the Triton there."""
    import os
    import re
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-m", "attnkit.bench.compiled", "bwd_dkdv", "bwd_dq", "bwd_atomic"],
                            capture_output=True, text=True, timeout=600, env=env)
    lines = [line for line in result.stdout.splitlines() if "registers" in line]
    assert len(lines) == 18, result.stdout + result.stderr[-3000:]
    for line in lines:
        assert "wgmma pipelined" in line, line
        if "D=256" not in line:
            assert int(re.search(r"(\d+) B spilled", line).group(1)) <= 32, line
    assert result.returncode == 0, result.stdout


def test_autotuner_zeroes_the_dq_buffer_between_trials():
    """The autotuner runs each candidate several times on the same buffers: atomic adds would pile up in
    dQ unless it zeroes DQ_ACC before each trial (and before the real launch)."""
    assert "DQ_ACC" in plans.tuned_launcher("bwd_atomic").reset_to_zero
    assert not plans.tuned_launcher("bwd_dkdv").reset_to_zero


# ------------------------------------------------------------------------------ tiles by descriptors
def _interpreted_descriptors() -> bool:
    import triton.language as tl

    from attnkit.device import triton_interprets

    return triton_interprets() and hasattr(tl, "make_tensor_descriptor")


@pytest.mark.skipif(not _interpreted_descriptors(), reason="needs Triton's interpreter with tensor descriptors")
@pytest.mark.parametrize("design", TRITON_BACKWARDS)
@pytest.mark.parametrize("options", [dict(window=(7, -1), softcap=3.0), dict(window=(5, 4))], ids=str)
def test_descriptor_backward_with_windows_and_softcap(monkeypatch, design, options):
    """The descriptor tiles under the band bounds and softcap's 1 - tanh² (GQA, ragged lengths)."""
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    causal = options.get("window", (0, 0))[1] == -1
    q, k, v, do = random_case(11, 1, 4, 2, 29, 37, 16)
    o, lse = flash.flash_attention_forward(q, k, v, causal=causal, **options)
    got = backward_launch.backward(do, q, k, v, o, lse, causal, 0.25, design=design, desc=True,
                          window=options["window"], softcap=options.get("softcap"))
    for name, g, r in zip(("dq", "dk", "dv"), got, reference_grads(q, k, v, do, causal=causal, **options)):
        assert_close(g, r, torch.float32, DEVICE, f"{name} ({design}, descriptors, {options})")


@pytest.mark.skipif(not _interpreted_descriptors(), reason="needs Triton's interpreter with tensor descriptors")
@pytest.mark.parametrize("design", TRITON_BACKWARDS)
@pytest.mark.parametrize("shape", [(1, 4, 2, 35, 27, 32, True), (2, 2, 1, 21, 45, 16, True),
                                   (1, 2, 2, 40, 19, 16, False)], ids=str)
def test_descriptor_backward_in_the_interpreter(monkeypatch, design, shape):
    """DESC = 2 (the GPU's TMA tiles) in the interpreter: descriptor loads pad ragged ends with zeros and
    descriptor stores clip them, so dq, dk, dv match float64 at lengths that are not multiples of a tile."""
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    launched = []
    real_launch = plans.launch
    monkeypatch.setattr(plans, "launch", lambda *a, **kw: launched.append(kw["DESC"]) or real_launch(*a, **kw))
    b, hq, hkv, nq, nk, d, causal = shape
    q, k, v, do = random_case(hash(shape) % 2**31, b, hq, hkv, nq, nk, d)
    o, lse = flash.flash_attention_forward(q, k, v, causal=causal)
    launched.clear()
    got = backward_launch.backward(do, q, k, v, o, lse, causal, 1 / math.sqrt(d), design=design, desc=True)
    assert launched and set(launched) == {triton_kernels.HOST_DESCRIPTORS}
    for name, g, r in zip(("dq", "dk", "dv"), got, reference_grads(q, k, v, do, causal=causal)):
        assert_close(g, r, torch.float32, DEVICE, f"{name} ({design}, descriptors)")


def test_descriptors_only_where_the_backward_can_take_them(monkeypatch):
    """Packed sequences, a padded head dim, Dv != D and strides TMA cannot take fall back to pointers."""
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    q, k, v, do = random_case(5, 1, 2, 1, 32, 32, 32)
    dq = torch.empty_like(q)
    host, pointers = triton_kernels.HOST_DESCRIPTORS, triton_kernels.POINTERS
    choose = dispatch.backward_descriptors
    tensors = (q, k, v, do, dq, k, v)
    assert choose(True, "atomic_dq", False, *tensors) == host
    assert choose(None, "two_kernels", False, *tensors) == host          # each design's own choice
    assert choose(None, "atomic_dq", False, *tensors) == pointers
    assert choose(False, "two_kernels", False, *tensors) == pointers
    assert choose(True, "two_kernels", True, *tensors) == pointers             # packed
    q20, k20, v20 = (t[..., :20] for t in (q, k, v))                          # D = 20: padded
    assert choose(True, "two_kernels", False, q20, k20, v20, do, dq, k, v) == pointers
    v16 = v[..., :16].contiguous()                                             # Dv != D
    assert choose(True, "two_kernels", False, q, k, v16, do, dq, k, v16) == pointers
    odd = torch.randn(1, 2, 32, 33)[..., :32]               # rows 33 elements apart: not 16-byte multiples
    assert choose(True, "two_kernels", False, odd, k, v, do, dq, k, v) == pointers
    wide = [torch.randn(1, 2, 32, 256) for _ in range(7)]                      # D = 256: the design's choice
    assert choose(None, "two_kernels", False, *wide) == pointers               # is pointers (measured faster)
    assert choose(True, "two_kernels", False, *wide) == host                   # unless asked
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: False)
    assert choose(True, "two_kernels", False, *tensors) == pointers


def test_default_configs_by_head_dim():
    """Without autotuning each launcher has one configuration per head-dim class: D <= 64, <= 128, <= 192, 256."""
    for name, (_, candidates, by_head_dim) in flash.LAUNCHERS.items():
        assert set(by_head_dim) == {64, 128, 192, 256}, name
        assert flash.default_config(name, 32) == flash.default_config(name, 64) == by_head_dim[64]
        assert flash.default_config(name, 128) == by_head_dim[128]
        assert flash.default_config(name, 160) == flash.default_config(name, 192) == by_head_dim[192]
        assert flash.default_config(name, 256) == by_head_dim[256]
        big = by_head_dim[256]      # twice the shared memory per row: two stages at most
        assert big.block_m * big.block_n <= 128 * 64 and big.num_stages == 2
        assert candidates and all(len(c) == 4 for c in candidates)
    # the H100 sweeps' winners (docs/flash_notes.md; the backward's after its dK/dV kernel became one loop)
    assert flash.default_config("fwd_desc", 128) == flash.BlockConfig(128, 128, 8, 3)
    assert flash.default_config("bwd_dkdv", 128) == flash.BlockConfig(64, 128, 8, 3)
    assert flash.default_config("bwd_dkdv", 64) == flash.BlockConfig(32, 128, 4, 3)
    assert flash.default_config("fwd", 256) == flash.BlockConfig(128, 64, 8, 2)        # the D = 256 sweep
    assert flash.default_config("bwd_atomic", 256) == flash.BlockConfig(32, 32, 4, 2)


def test_head_dims_above_128_launch_their_defaults_without_the_autotuner(monkeypatch):
    """Rows 192 and 256 (twice the shared memory a row) run each launcher's default, falling back to smaller
    tiles where shared memory is short; 64 and 128 autotune unless ATTNKIT_AUTOTUNE=0."""
    monkeypatch.setenv("ATTNKIT_AUTOTUNE", "1")
    assert [d for d in range(8, 257) if not dispatch.autotuned(d)] == list(range(129, 257))
    monkeypatch.setenv("ATTNKIT_AUTOTUNE", "0")
    assert not any(dispatch.autotuned(d) for d in (64, 128))
    assert flash.default_config("fwd", 192) == flash.BlockConfig(128, 64, 8, 3)       # the D = 192 sweep
    assert flash.default_config("fwd", 193) == flash.default_config("fwd", 256) == flash.BlockConfig(128, 64, 8, 2)


def test_a_default_that_does_not_fit_falls_back_to_smaller_tiles(monkeypatch):
    """fp32 tiles take twice fp16's shared memory: where a launcher's default does not fit, the launch
    drops to two stages, then to smaller tiles, and remembers what fitted; a configuration the caller
    fixed is not changed behind its back."""
    from triton.runtime.errors import OutOfResources

    launched = []

    class TooBigKernel:                              # stands in for _attn_fwd: only 64 x 64 tiles fit
        arg_names = ["Q"]

        def __getitem__(self, grid):
            def run(*args, **meta):
                launched.append((meta["BLOCK_M"], meta["BLOCK_N"], meta["num_stages"]))
                if meta["BLOCK_M"] * meta["BLOCK_N"] > 64 * 64:
                    raise OutOfResources(300_000, 232_448, "shared memory")
            return run

    monkeypatch.setattr(triton_kernels, "attn_fwd", TooBigKernel())
    monkeypatch.setattr(plans, "triton_interprets", lambda: False)
    monkeypatch.setattr(dispatch, "launch_options", lambda **options: options)   # a CPU Triton drops them
    monkeypatch.setattr(plans, "PLANS", {})
    launch = lambda fixed=None: plans.launch("fwd_desc", torch.device("cpu"), False, fixed, 100, (2, 1),  # noqa: E731
                                              torch.zeros(1, dtype=torch.float16), HEAD_DIM=128, HEAD_DIM_V=128)
    assert flash.default_config("fwd_desc", 128) == flash.BlockConfig(128, 128, 8, 3)
    launch()
    assert launched == [(128, 128, 3), (128, 128, 2), (64, 64, 2)]
    launched.clear()
    launch()                                         # remembered: straight to the tiles that fitted
    assert launched == [(64, 64, 2)]
    with pytest.raises(OutOfResources):
        launch(flash.BlockConfig(128, 64, 4, 3))
    launched.clear()
    plans.launch("fwd_desc", torch.device("cpu"), False, None, 100, (2, 1), torch.zeros(1, dtype=torch.float32),
                  HEAD_DIM=128, HEAD_DIM_V=128, DOT_PRECISION="ieee")
    assert launched == [(64, 32, 2)]                 # fp32: within dispatch.FP32_TILE_PRODUCT from the start

    class TooBigAutotuner:                           # none of its candidates fits
        def __getitem__(self, grid):
            def run(*args, **constexprs):
                launched.append("autotuned")
                raise OutOfResources(300_000, 232_448, "shared memory")
            return run

    monkeypatch.setattr(plans, "tuned_launcher", lambda name: TooBigAutotuner())
    monkeypatch.setenv("ATTNKIT_AUTOTUNE", "1")
    launched.clear()
    plans.launch("fwd_desc", torch.device("cpu"), True, None, 100, (2, 1), torch.zeros(1, dtype=torch.float32),
                  HEAD_DIM=64, HEAD_DIM_V=64, DOT_PRECISION="ieee")
    assert launched == ["autotuned", (64, 64, 2)]    # then the fallback, as without autotuning
    for head_dim, tile in ((128, (64, 32, 2)), (256, (32, 32, 2))):
        launched.clear()
        plans.launch("fwd_desc", torch.device("cpu"), True, None, 100, (2, 1), torch.zeros(1, dtype=torch.float32),
                      HEAD_DIM=head_dim, HEAD_DIM_V=head_dim, DOT_PRECISION="ieee")
        assert launched == [tile]                    # fp32 wider than 64: no autotuner (dispatch.autotuned)


@pytest.mark.parametrize("design", TRITON_BACKWARDS)
def test_interleaved_shapes_reuse_their_own_plans(design):
    """Two kinds of call interleaved (A, B, A, B): each later call takes its own kind's plan, so its
    forward and gradients equal the first call's bit for bit (but the one-pass dQ on a GPU, whose
    atomic adds land in any order), and both match float64 (ragged sizes, a GQA group, causal and not)."""
    cases = {"A": ((11, 1, 4, 2, 37, 45, 16), dict(causal=True)),
             "B": ((12, 2, 2, 1, 20, 20, 32), dict(causal=False))}
    first = {}
    for _ in range(2):
        for name, (shape, options) in cases.items():
            q, k, v, do = random_case(*shape)
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = flash_attention(*leaves, backward=design, **options)
            got = (out.detach(), *torch.autograd.grad(out, leaves, do))
            if name not in first:
                first[name] = got
                reference = (attention_float64(*(t.cpu().double() for t in (q, k, v)), **options),
                             *reference_grads(q, k, v, do, **options))
                for label, g, r in zip(("o", "dq", "dk", "dv"), got, reference):
                    assert_close(g, r, g.dtype, DEVICE, f"{name} {label}")
            else:
                for label, g, f in zip(("o", "dq", "dk", "dv"), got, first[name]):
                    if design == "atomic_dq" and label == "dq" and DEVICE == "cuda":   # atomic adds land in
                        assert_close(g, f, g.dtype, DEVICE, f"{name} dq")          # any order on a GPU
                    else:
                        assert torch.equal(g, f), f"{name} {label}: a later call differs from the first"


def test_later_calls_of_a_kind_reuse_the_first_calls_plan(monkeypatch):
    """The first call of a kind decides the configuration (here the autotuner's choice); later calls of
    that kind skip the autotuner and go straight to the kernel with it, the descriptors' block shapes set
    for it; a call with another size decides again."""
    triton = pytest.importorskip("triton")
    events = []

    class Kernel:                                    # stands in for _attn_fwd
        arg_names = ["Q", "n_q"]

        def __getitem__(self, grid):
            return lambda *args, **meta: events.append(("kernel", grid, meta["BLOCK_M"], meta["num_warps"]))

    class Autotuner:
        def __getitem__(self, grid):
            def run(*args, **constexprs):
                self.best_config = triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=2)
                events.append(("autotuned", grid(self.best_config.kwargs)))
            return run

    class Descriptor:                                # as triton.tools.tensor_descriptor.TensorDescriptor
        base = torch.zeros(1, dtype=torch.float16)
        block_shape = None

    monkeypatch.setattr(triton_kernels, "attn_fwd", Kernel())
    monkeypatch.setattr(plans, "tuned_launcher", lambda name: Autotuner())
    monkeypatch.setattr(plans, "triton_interprets", lambda: False)
    monkeypatch.setattr(plans, "PLANS", {})
    monkeypatch.setenv("ATTNKIT_AUTOTUNE", "1")
    host = triton_kernels.HOST_DESCRIPTORS

    def launch(n_q, desc):
        plans.launch("fwd_desc", torch.device("cpu"), True, None, n_q, (3, 1), desc, n_q, HEAD_DIM=128, DESC=host)

    launch(1000, Descriptor())
    assert events == [("autotuned", (16, 3, 1))]
    desc = Descriptor()
    launch(1000, desc)
    assert events[1:] == [("kernel", (16, 3, 1), 64, 4)] and desc.block_shape == [1, 1, 64, 128]
    launch(2000, Descriptor())                       # another size: the autotuner decides again
    assert events[2:] == [("autotuned", (32, 3, 1))] and len(plans.PLANS) == 2
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    launch(3000, Descriptor())                       # past MAX_PLANS the plans start over
    assert events[3:] == [("autotuned", (47, 3, 1))] and len(plans.PLANS) == 1


@pytest.mark.skipif(not _interpreted_descriptors(), reason="needs Triton's interpreter with tensor descriptors")
@pytest.mark.parametrize("design", TRITON_BACKWARDS)
def test_descriptor_backward_on_strided_and_expanded_views(monkeypatch, design):
    """Descriptors span views by their strides: q, k, v, dO as transposes of [B, N, H, D] buffers, and K/V
    heads expanded from one (stride 0), against float64."""
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    b, hq, n, d = 1, 4, 27, 16
    gen = torch.Generator().manual_seed(21)
    q, do = (torch.randn(b, n, hq, d, generator=gen).to(DEVICE).transpose(1, 2) for _ in range(2))
    k, v = (torch.randn(b, n, 1, d, generator=gen).to(DEVICE).transpose(1, 2).expand(b, 2, n, d) for _ in range(2))
    assert not q.is_contiguous() and k.stride(1) == 0
    o, lse = flash.flash_attention_forward(q, k, v, causal=True)
    got = backward_launch.backward(do, q, k, v, o, lse, True, 1 / math.sqrt(d), design=design, desc=True)
    for name, g, r in zip(("dq", "dk", "dv"), got, reference_grads(q, k, v, do, causal=True)):
        assert_close(g, r, torch.float32, DEVICE, f"{name} ({design}, descriptors over views)")
