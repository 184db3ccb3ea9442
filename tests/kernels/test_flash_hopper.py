"""The warp-specialised Gluon forward (attnkit.kernels.flash.hopper): its scope refused with clear errors on
any machine; its PTX for the H100 read on a CPU (warp-specialised, overlapped, warp groups independent);
on an sm_90 GPU, its outputs and log-sum-exps against float64 on fresh random inputs."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from load_file import load_file  # noqa: E402
from test_runners import FakeTriton  # noqa: E402

from attnkit.bench.compiled import softmax_beside_product  # noqa: E402
from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import dispatch, hopper  # noqa: E402
from attnkit.kernels.flash.runners import Runners  # noqa: E402
from attnkit.reference.attention import attention_ref, lse_ref  # noqa: E402
from attnkit.tolerances import assert_close  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _qkv(b=1, hq=2, hkv=2, n_q=70, n_k=70, d=64, dtype=torch.float16, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, dtype=dtype, device=device, generator=gen)
                 for h, n in ((hq, n_q), (hkv, n_k), (hkv, n_k)))


# ---------------------------------------------------------------------------- the host's side, any machine
def test_the_launch_passes_each_argument_where_the_kernel_takes_it(monkeypatch):
    """What ``hopper.launch`` hands the kernel, read by the kernel's own argument names (the launch itself is
    stubbed: Gluon runs on an sm_90 GPU only): descriptors over q, k, v with the configuration's blocks,
    the new o and lse it returns, the scale in base 2, the sizes of a grouped-query call."""
    launched = {}

    class Kernel:
        arg_names = hopper.attn_fwd_ws.arg_names

        def __getitem__(self, grid):
            return lambda *args, **options: launched.update(grid=grid, args=args, options=options)
    monkeypatch.setattr(hopper, "attn_fwd_ws", Kernel())
    q, k, v = _qkv(b=2, hq=4, hkv=2, n_q=300, n_k=333, d=128)
    o, lse = hopper.launch(q, k, v, True, 0.125, 64, 128, 2, 3)
    named = dict(zip(Kernel.arg_names, launched["args"]))
    assert launched["grid"] == (2 * 8,)                                # cdiv(300, 3 · 64) row blocks × B · Hq
    assert named["O"] is o and named["LSE"] is lse and o.shape == q.shape and lse.shape == (2, 4, 300)
    for name, tensor, rows in (("q_desc", q, 64), ("k_desc", k, 128), ("v_desc", v, 128)):
        desc = named[name]
        assert desc.base.data_ptr() == tensor.data_ptr() and list(desc.shape) == [tensor.numel() // 128, 128]
        assert list(desc.block_shape) == [rows, 128]
    assert named["qk_scale"] == pytest.approx(0.125 / math.log(2))
    assert (named["n_heads"], named["group"], named["n_q"], named["n_k"]) == (4, 2, 300, 333)
    assert (named["stride_ob"], named["stride_om"], named["stride_lh"]) == (o.stride(0), o.stride(2), lse.stride(1))
    assert launched["options"] == dict(HALF_M=64, BLOCK_N=128, HEAD_DIM=128, CAUSAL=True, STAGES=2,
                                       COMPUTE_REGS=hopper.COMPUTE_REGISTERS[3], GROUPS=3,
                                       HEAD_GROUP=dispatch.HEAD_GROUP[True], num_warps=4)


def test_later_launches_of_a_shape_go_through_the_compiled_kernels_runner(monkeypatch):
    """The Gluon forward launches through attnkit.kernels.flash.runners: a shape's first call through the JIT,
    the next through the kept runner with the call's own tensors and every constexpr in the kernel's order
    (tests/kernels/test_runners.py checks the key and the fallback)."""
    kernel = FakeTriton(hopper.attn_fwd_ws.arg_names)
    monkeypatch.setattr(hopper, "attn_fwd_ws", kernel)
    monkeypatch.setattr(hopper, "RUNNERS", Runners())
    config = (64, 128, 2, 2)
    first, second, longer = (_qkv(b=2, hq=4, hkv=2, n_q=n, n_k=n, d=128, seed=n + seed)
                             for n, seed in ((300, 1), (300, 2), (301, 3)))
    for q, k, v in (first, second, longer, first):
        hopper.launch(q, k, v, True, 0.125, *config)
    assert [how for how, _, _ in kernel.launches] == ["jit", "runner", "jit", "runner"]
    _, grid, args = kernel.launches[1]
    assert grid == (3 * 8, 1, 1)                                       # cdiv(300, 2 · 64) × B · Hq
    named = dict(zip(kernel.arg_names, args))
    assert len(args) == len(kernel.arg_names)
    assert named["q_desc"].base.data_ptr() == second[0].data_ptr()     # the call's own tensors
    assert (named["HALF_M"], named["BLOCK_N"], named["HEAD_DIM"], named["CAUSAL"], named["STAGES"],
            named["GROUPS"]) == (64, 128, 128, True, 2, 2)


def test_the_persistent_launch_passes_its_tile_count_and_a_grid_of_one_program_per_sm(monkeypatch):
    """Persistent programs: the persistent kernel, launched with the tile count (its loop's bound) and a grid
    of one program per SM, as the runner sees it on a later call; the call's own tensors go in."""
    kernel = FakeTriton(hopper.attn_fwd_persistent.arg_names)
    monkeypatch.setattr(hopper, "attn_fwd_persistent", kernel)
    monkeypatch.setattr(hopper, "RUNNERS", Runners())
    monkeypatch.setattr(hopper, "sm_count", lambda device: 9)
    calls = [_qkv(b=2, hq=4, hkv=2, n_q=300, n_k=300, d=128, seed=seed) for seed in (1, 2)]
    outputs = [hopper.launch(q, k, v, True, 0.125, 64, 128, 2, 2, True) for q, k, v in calls]
    assert [how for how, _, _ in kernel.launches] == ["jit", "runner"]
    _, grid, args = kernel.launches[1]
    named = dict(zip(kernel.arg_names, args))
    assert len(args) == len(kernel.arg_names) and "GROUPS" not in named
    assert named["n_tiles"] == 3 * 8 and grid == (8, 1, 1)         # 9 SMs; 8: no factor in common with 3
    assert named["q_desc"].base.data_ptr() == calls[1][0].data_ptr() and named["O"] is outputs[1][0]
    assert (named["HALF_M"], named["BLOCK_N"], named["CAUSAL"], named["STAGES"]) == (64, 128, True, 2)


@pytest.mark.parametrize("n_tiles, n_m, causal, sms, grid", [
    (2048, 8, True, 132, 131), (2048, 8, False, 132, 132), (2048, 16, True, 132, 131), (100, 8, True, 132, 99),
    (24, 3, True, 10, 10), (24, 3, True, 9, 8), (7, 1, True, 132, 7), (1, 1, False, 132, 1)])
def test_persistent_programs_fill_the_sms_and_share_no_factor_with_the_query_blocks(n_tiles, n_m, causal, sms,
                                                                                       grid):
    """At most one program per SM and per tile; causal, a count coprime with the query blocks of a head, so
    that program p's tiles p, p + grid, ... go through every block length in turn."""
    assert hopper.persistent_programs(n_tiles, n_m, causal, sms) == grid
    if causal and grid > 1:
        lengths = [{(p + i * grid) % n_m for i in range(n_m)} for p in range(min(grid, 5))]
        assert all(seen == set(range(n_m)) for seen in lengths)


def test_the_persistent_grid_is_the_largest_coprime_count_for_every_size():
    for n_tiles, n_m, sms in ((t, m, s) for t in (1, 7, 64, 200, 2048) for m in (1, 2, 3, 8, 12, 16, 128)
                              for s in (1, 9, 78, 132)):
        fill = min(sms, n_tiles)
        assert hopper.persistent_programs(n_tiles, n_m, False, sms) == fill
        grid = hopper.persistent_programs(n_tiles, n_m, True, sms)
        assert 1 <= grid <= fill and (grid == 1 or math.gcd(grid, n_m) == 1)
        assert all(math.gcd(larger, n_m) != 1 for larger in range(grid + 1, fill + 1)), (n_tiles, n_m, sms)


@pytest.mark.parametrize("shape, causal, sms, persistent", [
    ((16, 16, 1024, 1024, 128), True, 132, True),      # the short causal call of target 2: 2048 tiles
    ((8, 16, 2048, 2048, 128), False, 132, True),
    ((16, 32, 1024, 1024, 64), True, 132, True),
    ((8, 16, 2049, 2049, 128), True, 132, False),      # one key past the limit
    ((4, 16, 4096, 4096, 128), True, 132, False),      # longer: round-robin tiles are uneven (measured)
    ((4, 16, 4096, 4096, 128), False, 132, True),      # not causal, D = 128: even tiles, every length
    ((1, 16, 16384, 16384, 128), False, 132, True),
    ((4, 32, 4096, 4096, 64), False, 132, False),      # D = 64 runs three groups there: not measured so
    ((1, 1, 16384, 16384, 128), False, 132, False),    # 128 tiles on 132 SMs: one each
    ((64, 16, 300, 4096, 128), True, 132, False),      # short queries, long keys: not measured, not taken
    ((1, 8, 1024, 1024, 128), True, 132, False),       # 64 tiles: no SM would get a second one
    ((1, 16, 1024, 1024, 128), True, 128, False),      # 128 tiles on 128 SMs: one each
    ((1, 16, 1024, 1024, 128), True, 127, True),       # one SM fewer: one program walks two
    ((16, 16, 1024, 1024, 128), True, None, False),    # not a CUDA device (the CPU here)
])
def test_persistent_programs_are_chosen_for_short_calls_with_more_tiles_than_sms(monkeypatch, shape, causal, sms,
                                                                                  persistent):
    b, h, n_q, n_k, d = shape
    monkeypatch.setattr(dispatch, "sm_count", lambda device: sms)
    q, k = torch.empty(b, h, n_q, d, device="meta"), torch.empty(b, h, n_k, d, device="meta")
    config = dispatch.hopper_launch_config(q, k, causal)
    assert config[-1] is persistent
    assert config[:4] == ((64, 128, 2, 2) if persistent else dispatch.HEAD_DIMS[d].gluon_forward[causal])


def test_the_plan_is_worked_out_once_per_kind_of_input(monkeypatch):
    """plan() answers as unsupported() and launch_config() do, asking them once per kind of input (shapes,
    dtypes, device, contiguity, causal): the same shapes non-causal, or as a non-contiguous view, are other
    kinds, and the view is refused with launch_config's answer left out."""
    monkeypatch.setattr(dispatch, "HOPPER_PLANS", {})
    monkeypatch.setattr(dispatch, "sm_major", lambda device: 9)
    monkeypatch.setattr(dispatch, "sm_count", lambda device: 132)
    asked = []
    real = dispatch.hopper_unsupported
    monkeypatch.setattr(dispatch, "hopper_unsupported", lambda *args: asked.append(args[3]) or real(*args))
    q, k, v = (torch.empty(16, 16, 1024, 128, dtype=torch.float16, device="meta") for _ in range(3))
    for _ in range(3):
        assert dispatch.hopper_plan(q, k, v, True) == (None, dispatch.hopper_launch_config(q, k, True))
    assert dispatch.hopper_plan(q, k, v, False) == (None, dispatch.hopper_launch_config(q, k, False))
    view = torch.empty(16, 1024, 16, 128, dtype=torch.float16, device="meta").transpose(1, 2)
    reason, config = dispatch.hopper_plan(view, k, v, True)
    assert "needs a contiguous" in reason and config is None
    assert asked == [True, False, True]


def test_persistent_programs_refuse_what_they_do_not_run():
    q, k, v = _qkv(d=128)
    with pytest.raises(ValueError, match="groups: persistent programs run two compute groups"):
        hopper.launch(q, k, v, True, 0.125, 64, 128, 2, 3, True)
    with pytest.raises(ValueError, match="head_group: persistent programs take the tiles head by head"):
        hopper.launch(q, k, v, True, 0.125, 64, 128, 2, 2, True, head_group=32)


def _tiles(n_m, n_bh, head_group, causal):
    """(batch · head, query block) of each program in launch order, by the kernel's own ``tile_of`` (its
    integer arithmetic read as Python: Gluon has no interpreter)."""
    n_programs = n_m * n_bh
    return [hopper.tile_of.fn(p, n_programs, n_m, head_group, causal) for p in range(n_programs)]


@pytest.mark.parametrize("n_m, n_bh", [(8, 256), (3, 7), (1, 5), (16, 33)])
@pytest.mark.parametrize("head_group", [1, 2, 32])
@pytest.mark.parametrize("causal", [False, True])
def test_each_tile_runs_once_in_the_order_of_its_head_group(n_m, n_bh, head_group, causal):
    """Every (head, query block) pair exactly once, whatever the group size (the last group may be short);
    the groups in turn; inside a group, causal query blocks from the last (the longest) down, the group's
    heads fastest."""
    tiles = _tiles(n_m, n_bh, head_group, causal)
    assert sorted(tiles) == [(bh, m) for bh in range(n_bh) for m in range(n_m)]
    for start in range(0, n_bh, head_group):
        heads = min(head_group, n_bh - start)
        group = tiles[start * n_m:(start + heads) * n_m]
        blocks = [n_m - 1 - r if causal else r for r in range(n_m)]
        assert group == [(start + h, m) for m in blocks for h in range(heads)]


@pytest.mark.parametrize("head_group", [0, -2, 1.5])
def test_a_head_group_that_is_not_a_positive_integer_is_refused(head_group):
    q, k, v = _qkv(d=128)
    with pytest.raises(ValueError, match="head_group"):
        hopper.launch(q, k, v, True, 0.125, 64, 128, 2, 2, head_group=head_group)


def test_head_group_one_is_head_by_head_and_matches_the_tail_models_order():
    """head_group 1: each head's blocks together (causal: longest first), the order the kernel had on a
    2-D grid; head_group g: the order whose fill experiments/flash_hopper_gluon/tail_model.py models."""
    assert _tiles(4, 2, 1, True) == [(0, 3), (0, 2), (0, 1), (0, 0), (1, 3), (1, 2), (1, 1), (1, 0)]
    assert _tiles(4, 2, 1, False) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]
    orders = load_file("experiments/flash_hopper_gluon/tail_model.py").orders(8, 256)
    for head_group, name in ((1, "head by head, longest first"), (32, "longest first in groups of 32 heads")):
        assert [m + 1 for _, m in _tiles(8, 256, head_group, True)] == orders[name]


# ------------------------------------------------------------------------------------ scope, any machine
@pytest.mark.parametrize("change, causal, words", [
    (dict(dtype=torch.float32), False, "q: dtype torch.float32"),
    (dict(d=96), False, "head dim 96"),
    (dict(n_q=80, n_k=40), True, "Nq <= Nk"),
    ({}, False, "sm_90 GPU"),                     # valid inputs, but on the CPU
])
def test_inputs_outside_the_scope_are_refused(change, causal, words):
    q, k, v = _qkv(**change)
    with pytest.raises(ValueError, match=re.escape(words)):
        flash.flash_attention_hopper(q, k, v, causal=causal)


def test_views_and_mixed_head_dims_are_refused():
    q, k, v = _qkv(d=128)
    with pytest.raises(ValueError, match="k: the warp-specialised forward needs a contiguous"):
        flash.flash_attention_hopper(q, k.transpose(1, 2).contiguous().transpose(1, 2), v)
    with pytest.raises(ValueError, match="v: head dim 64 differs from q's 128"):
        flash.flash_attention_hopper(q, k, v[..., :64].contiguous())


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("view", ["heads and rows swapped", "every other row", "heads expanded"])
def test_every_strided_or_expanded_view_is_refused_by_name(name, view):
    """TMA descriptors here span a contiguous [B·H·N, D] view: a transposed, sliced or expanded tensor
    (an expanded one shares memory between heads) must be refused, naming which argument."""
    tensors = dict(zip("qkv", _qkv(hq=2, hkv=2, n_q=64, n_k=64, d=64)))
    t = tensors[name]
    if view == "heads and rows swapped":
        t = t.transpose(1, 2).contiguous().transpose(1, 2)
    elif view == "every other row":
        t = torch.cat([t, t], dim=2)[:, :, ::2]
    else:
        t = t[:, :1].expand(-1, 2, -1, -1)
    assert not t.is_contiguous() and t.shape == tensors[name].shape
    tensors[name] = t
    with pytest.raises(ValueError, match=f"{name}: the warp-specialised forward needs a contiguous"):
        flash.flash_attention_hopper(**tensors)


def test_bad_arguments_are_named():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="q: expected 4 dimensions"):
        flash.flash_attention_hopper(q[0], k, v)
    with pytest.raises(ValueError, match="causal"):
        flash.flash_attention_hopper(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="sm_scale"):
        flash.flash_attention_hopper(q, k, v, sm_scale=-1.0)


# -------------------------------------------------------------------------------- compiled for an H100
PTX_FOR_SM90 = r'''
import os, re
os.environ["TRITON_INTERPRET"] = "0"
from attnkit.bench.compiled import compile_gluon_ptx, ptxas_report, sass, softmax_beside_product
from attnkit.kernels.flash import dispatch, hopper
for d, causal, persistent in ((128, True, False), (64, False, False), (128, True, True), (64, False, True)):
    half_m, block_n, stages, groups = (64, 128, 2, 2) if persistent else dispatch.HEAD_DIMS[d].gluon_forward[causal]
    constexprs = dict(HALF_M=half_m, BLOCK_N=block_n, HEAD_DIM=d, CAUSAL=causal, STAGES=stages,
                      COMPUTE_REGS=hopper.COMPUTE_REGISTERS[groups])
    if not persistent:
        constexprs["GROUPS"] = groups
    ptx = compile_gluon_ptx(hopper.attn_fwd_persistent if persistent else hopper.attn_fwd_ws, constexprs,
                            dict(q_desc=half_m, k_desc=block_n, v_desc=block_n), 4,
                            any_size=("n_heads", "group", "n_q", "n_k", "n_tiles"))
    report = ptxas_report(ptx)
    beside = softmax_beside_product(sass(ptx))
    print("persistent", int(persistent), "causal", int(causal), "groups", groups, "loops_read", len(beside),
          "softmax_beside_own_product", sum(beside),
          "spilled", report.spill_bytes, "serialised", report.wgmma_serialised,
          "waits_for_one", ptx.count("wgmma.wait_group.sync.aligned 1;"),
          "all_warp_barriers", len(re.findall(r"bar\.sync\s+\d+\s*;", ptx)),
          "group_barriers", len(re.findall(r"bar\.sync\s+\d+,\s*128;", ptx)),
          "producer_registers", int(re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx) is not None),
          "tma_copies", ptx.count("cp.async.bulk.tensor"))
'''


@pytest.mark.slow
def test_the_forward_is_warp_specialised_and_overlapped_on_an_h100():
    """Compiled for sm_90a: the producer warp's registers are cut to 24 (setmaxnreg: warp specialisation
    happened); each compute group waits for its score product alone (``wgmma.wait_group 1``) at least once; the
    only barriers are per warp group (128 threads), never all warps; copies go by TMA; no spills with two groups
    (with three, at D = 64, at most 32 bytes: their 160 registers a thread are tight; the persistent kernel,
    causal, at most 64: its loop over tiles keeps a few more values live), products not serialised by ptxas; the
    same for the persistent kernel. In the machine code (SASS) the key loops of every group are found, and in
    none does an exponential run before the wait for O's product: ptxas hoists that wait above the softmax (what
    lesson 5 and docs/flash_notes.md say; a new ptxas that keeps the overlap fails this test, and the lesson
    must then be updated)."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", PTX_FOR_SM90], capture_output=True, text=True, timeout=600,
                            env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.split() for line in result.stdout.splitlines()]
    assert len(lines) == 4, result.stdout
    for words in lines:
        found = dict(zip(words[::2], words[1::2]))
        spill_limit = 32 if found["groups"] == "3" else 64 if found["persistent"] == found["causal"] == "1" else 0
        assert int(found["spilled"]) <= spill_limit, found
        assert found["serialised"] == "False" and int(found["waits_for_one"]) >= int(found["groups"]), found
        assert found["all_warp_barriers"] == "0" and int(found["group_barriers"]) >= 2, found
        assert found["producer_registers"] == "1" and int(found["tma_copies"]) >= 3, found
        assert int(found["loops_read"]) >= int(found["groups"]) and found["softmax_beside_own_product"] == "0", found


SASS_WAIT_ABOVE_SOFTMAX = """
        /*3b10*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*3b20*/                   FMNMX R193, R24, R25, !PT ;
        /*3d70*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*3e50*/                   MUFU.EX2 R152, R152 ;
"""


def test_softmax_beside_product_reads_where_the_waits_fall():
    """The SASS reader tells a loop whose exponentials run between the two waits from one whose wait for
    every product comes first, and ignores waits for all products that follow no partial wait."""
    assert softmax_beside_product(SASS_WAIT_ABOVE_SOFTMAX) == [False]
    overlapped = SASS_WAIT_ABOVE_SOFTMAX.replace("FMNMX R193, R24, R25, !PT", "MUFU.EX2 R3, R3")
    assert softmax_beside_product(overlapped) == [True]
    assert softmax_beside_product(SASS_WAIT_ABOVE_SOFTMAX + overlapped) == [False, True]
    assert softmax_beside_product("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;\nMUFU.EX2 R1, R1 ;") == []


# ---------------------------------------------------------------------------------------- on an H100
def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("b, hq, hkv, n_q, n_k, d, causal", [
    (1, 2, 2, 1000, 1000, 128, False), (1, 2, 2, 1000, 1000, 128, True), (2, 4, 2, 777, 777, 64, True),
    (1, 4, 1, 300, 1000, 128, True), (1, 2, 2, 129, 4097, 64, False), (1, 3, 3, 1, 333, 128, True),
    (2, 8, 2, 200, 200, 64, False)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_matches_float64(b, hq, hkv, n_q, n_k, d, causal, dtype):
    q, k, v = _qkv(b, hq, hkv, n_q, n_k, d, dtype, "cuda", seed=n_q + 7 * n_k)
    o, lse = flash.flash_attention_hopper(q, k, v, causal=causal)
    assert_close(o, attention_ref(q, k, v, causal=causal), dtype, "cuda")
    assert (lse.cpu().double() - lse_ref(q, k, causal=causal)).abs().max().item() < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("head_group", [2, 3, 32])
@pytest.mark.parametrize("b, hq, hkv, n_q, n_k, d, causal", [
    (2, 4, 2, 1000, 1000, 128, True), (1, 5, 5, 300, 1000, 64, True), (3, 3, 1, 333, 333, 128, False)])
def test_every_tile_order_matches_float64_and_the_default_bit_for_bit(b, hq, hkv, n_q, n_k, d, causal, head_group):
    """Tiles handed out in groups of (batch, head) pairs, the last group short (B · H not a multiple of the
    group): every tile computed, and computed as in the default order (each tile's arithmetic is its own)."""
    q, k, v = _qkv(b, hq, hkv, n_q, n_k, d, torch.float16, "cuda", seed=head_group + n_q)
    config = dispatch.HEAD_DIMS[d].gluon_forward[causal]
    o, lse = hopper.launch(q, k, v, causal, d ** -0.5, *config, head_group=head_group)
    default = flash.flash_attention_hopper(q, k, v, causal=causal)
    assert torch.equal(o, default[0]) and torch.equal(lse, default[1])
    assert_close(o, attention_ref(q, k, v, causal=causal), torch.float16, "cuda")


class _CountingJit:
    """The real kernel, counting the launches that go through Triton's JIT."""

    def __init__(self, kernel):
        self.kernel, self.arg_names, self.calls = kernel, kernel.arg_names, 0

    def __getitem__(self, grid):
        self.calls += 1
        return self.kernel[grid]


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
def test_direct_launches_match_the_jits_bit_for_bit(monkeypatch):
    """Shapes in turn, each seen twice with fresh inputs: every call launched through a kept runner gives
    the JIT's o and lse bit for bit, and only a key's first call goes through the JIT."""
    jit = _CountingJit(hopper.attn_fwd_ws)
    runners = Runners()
    monkeypatch.setattr(hopper, "attn_fwd_ws", jit)
    monkeypatch.setattr(hopper, "RUNNERS", runners)
    shapes = [(1, 4, 2, 1000, 1000, 128, True), (2, 4, 4, 777, 777, 64, False), (1, 2, 2, 129, 4097, 64, False),
              (1, 3, 3, 1, 333, 128, True)]
    for seed, (b, hq, hkv, n_q, n_k, d, causal) in enumerate(shapes * 2):
        q, k, v = _qkv(b, hq, hkv, n_q, n_k, d, torch.float16, "cuda", seed=seed)
        runners.enabled = True
        direct = flash.flash_attention_hopper(q, k, v, causal=causal)
        runners.enabled = False
        through_jit = flash.flash_attention_hopper(q, k, v, causal=causal)
        assert torch.equal(direct[0], through_jit[0]) and torch.equal(direct[1], through_jit[1])
        assert_close(direct[0], attention_ref(q, k, v, causal=causal), torch.float16, "cuda")
    assert len(runners.by_key) == len(shapes)
    assert jit.calls == len(shapes) + 2 * len(shapes)       # each key's first direct call, every JIT call


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("sms", [1, 5, 132])
@pytest.mark.parametrize("b, hq, hkv, n_q, n_k, d, causal", [
    (2, 4, 2, 1000, 1000, 128, True), (1, 5, 5, 300, 1000, 64, True), (3, 3, 1, 333, 333, 128, False),
    (2, 4, 4, 777, 777, 64, False), (1, 3, 3, 1, 333, 128, True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_persistent_programs_match_one_program_a_tile_bit_for_bit(monkeypatch, b, hq, hkv, n_q, n_k, d, causal,
                                                                   sms, dtype):
    """Persistent programs on 1, 5 or 132 SMs' worth of programs (so each walks many tiles, the rings' and
    Q's barriers running on across them): every tile computed as the one-program-a-tile kernel computes it
    (same arithmetic, so bit for bit), and against float64."""
    monkeypatch.setattr(hopper, "sm_count", lambda device: sms)
    q, k, v = _qkv(b, hq, hkv, n_q, n_k, d, dtype, "cuda", seed=sms + n_q)
    o, lse = hopper.launch(q, k, v, causal, d ** -0.5, 64, 128, 2, 2, True)
    per_tile = hopper.launch(q, k, v, causal, d ** -0.5, 64, 128, 2, 2, False)
    assert torch.equal(o, per_tile[0]) and torch.equal(lse, per_tile[1])
    assert_close(o, attention_ref(q, k, v, causal=causal), dtype, "cuda")
    assert (lse.cpu().double() - lse_ref(q, k, causal=causal)).abs().max().item() < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_a_short_call_with_more_tiles_than_sms_runs_persistent_and_matches_float64(causal):
    """The public call picks persistent programs by its rule on this GPU (200 tiles of 5 query blocks)."""
    q, k, v = _qkv(1, 40, 8, 600, 600, 128, torch.float16, "cuda", seed=600 + causal)
    assert dispatch.hopper_launch_config(q, k, causal)[-1] is True
    o, lse = flash.flash_attention_hopper(q, k, v, causal=causal)
    assert_close(o, attention_ref(q, k, v, causal=causal), torch.float16, "cuda")
    assert (lse.cpu().double() - lse_ref(q, k, causal=causal)).abs().max().item() < 1e-3
