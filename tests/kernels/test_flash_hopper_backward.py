"""The warp-specialised Gluon backward (attnkit.kernels.flash.hopper_backward) and its two designs in
flash.BACKWARDS: the scope refused by name; on a machine without an sm_90 GPU the designs are the
two-kernel design, bit for bit; compiled for the H100 on a CPU (warp-specialised, TMA, atomics only in the
one-pass variant); on an sm_90 GPU, dq, dk, dv against float64 on fresh random inputs, with the Gluon
kernel counted, and its fallbacks (window, softcap, strided views, fp32) taken."""
from __future__ import annotations

import importlib.abc
import importlib.util
import math
import os
import re
import subprocess
import sys
import types

import pytest
import torch

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")

from test_runners import FakeTriton  # noqa: E402

from attnkit.kernels import flash  # noqa: E402
from attnkit.kernels.flash import backward as backward_launch  # noqa: E402
from attnkit.kernels.flash import (  # noqa: E402
    dispatch,
    hopper_backward,
    layout,  # noqa: E402
)
from attnkit.kernels.flash.runners import Runners  # noqa: E402
from attnkit.reference.attention import attention_grads_ref  # noqa: E402
from attnkit.tolerances import assert_close  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GLUON_DESIGNS = [name for name, design in flash.BACKWARDS.items() if design.gluon]


def _inputs(b, hq, hkv, n_q, n_k, d, dtype=torch.float16, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    shapes = ((hq, n_q), (hkv, n_k), (hkv, n_k), (hq, n_q))
    return tuple(torch.randn(b, h, n, d, dtype=dtype, device=device, generator=gen) for h, n in shapes)


def test_gluon_designs_are_named():
    assert GLUON_DESIGNS == ["warp_specialized", "warp_specialized_atomic"]


@pytest.mark.parametrize("change, causal, words", [
    (dict(dtype=torch.float32), False, "q: dtype torch.float32 is not supported by the warp-specialised backward"),
    (dict(d=96), False, "head dim 96 is not supported by the warp-specialised backward"),
    (dict(n_q=80, n_k=40), True, "Nq <= Nk"),
    ({}, False, "the warp-specialised backward runs on an sm_90 GPU"),
])
def test_inputs_outside_the_scope_are_named(change, causal, words):
    args = dict(b=1, hq=2, hkv=2, n_q=64, n_k=64, d=64) | change
    q, k, v, _ = _inputs(**args)
    assert words in dispatch.gluon_backward_unsupported(q, k, v, causal)


@pytest.mark.parametrize("design", GLUON_DESIGNS)
def test_without_an_h100_the_designs_are_the_two_kernel_design(design):
    """Where the Gluon kernel cannot run (here: no sm_90 GPU), a Gluon design is the Triton two-kernel
    design: the same gradients, bit for bit."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9:
        pytest.skip("on an sm_90 GPU the Gluon kernel runs")
    q, k, v, do = _inputs(1, 4, 2, 21, 27, 16, torch.float32)
    o, lse = flash.flash_attention_forward(q, k, v, causal=True)
    got = backward_launch.backward(do, q, k, v, o, lse, True, 0.25, design=design)
    want = backward_launch.backward(do, q, k, v, o, lse, True, 0.25, design="two_kernels")
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def _broken_gluon():
    """A Gluon module whose kernel fails as it would with a Triton whose Gluon API differs."""
    module = types.ModuleType("attnkit.kernels.broken_gluon")

    def dkdv(*args, **kwargs):
        raise TypeError("warp_specialize() got an unexpected keyword argument 'worker_num_regs'")
    module.dkdv = dkdv
    return module


@pytest.mark.parametrize("design", GLUON_DESIGNS)
def test_a_gluon_kernel_that_fails_leaves_the_triton_kernels_with_a_warning(monkeypatch, design):
    """On an H100 whose Triton builds the Gluon kernel differently (Colab's, say), the backward warns once and
    is the two-kernel design, bit for bit, instead of failing."""
    monkeypatch.setattr(dispatch, "GLUON_FAILED", set())
    monkeypatch.setattr(backward_launch, "gluon_backward", lambda plan: _broken_gluon())
    monkeypatch.setattr(dispatch, "warp_specialized_backward_choice", lambda *sizes: True)
    q, k, v, do = _inputs(1, 4, 2, 21, 27, 16, torch.float32)
    o, lse = flash.flash_attention_forward(q, k, v, causal=True)
    with pytest.warns(RuntimeWarning, match=r"broken_gluon: the Gluon kernel failed with Triton \S+ \(TypeError: "
                                            r"warp_specialize.*\); the Triton kernels run instead"):
        got = backward_launch.backward(do, q, k, v, o, lse, True, 0.25, design=design)
    want = backward_launch.backward(do, q, k, v, o, lse, True, 0.25, design="two_kernels")
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert dispatch.GLUON_FAILED == {"attnkit.kernels.broken_gluon"}


def test_a_failed_gluon_module_is_not_tried_again_and_running_out_of_memory_is_no_failure(monkeypatch):
    monkeypatch.setattr(dispatch, "GLUON_FAILED", set())

    def out_of_memory():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(torch.cuda.OutOfMemoryError):
        dispatch.run_gluon(hopper_backward, out_of_memory)
    assert dispatch.gluon_module("hopper_backward") is hopper_backward
    with pytest.warns(RuntimeWarning, match="hopper_backward: the Gluon kernel failed"):
        assert dispatch.run_gluon(hopper_backward, lambda: 1 / 0) is None
    assert dispatch.gluon_module("hopper_backward") is None
    assert dispatch.gluon_module("hopper") is not None           # the forward's module is another


class _FailingImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``name`` by raising ``error``, as importing a Gluon module fails with a Triton without Gluon's
    Hopper API (ImportError) or with one whose decorators or layouts take other arguments."""

    def __init__(self, name, error):
        self.name, self.error = name, error

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == self.name else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise self.error


def test_a_gluon_module_that_fails_to_import_is_left_with_a_warning(monkeypatch):
    """Without Gluon (ImportError) the module is simply absent; any other failure while importing it (a
    decorator or layout that takes other arguments in this Triton) warns once and is remembered."""
    name = "attnkit.kernels.flash.hopper_backward"
    for error in (ImportError("cannot import name 'gluon' from 'triton.experimental'"),
                  TypeError("NVMMASharedLayout.__init__() got an unexpected keyword argument 'swizzle_byte_width'")):
        monkeypatch.setattr(dispatch, "GLUON_FAILED", set())
        monkeypatch.delattr(flash, "hopper_backward")               # not yet imported, as in a fresh process
        monkeypatch.delitem(sys.modules, name)
        monkeypatch.setattr(sys, "meta_path", [_FailingImport(name, error), *sys.meta_path])
        if isinstance(error, ImportError):
            assert dispatch.gluon_module("hopper_backward") is None and dispatch.GLUON_FAILED == set()
        else:
            with pytest.warns(RuntimeWarning, match=rf"{name}: the Gluon kernel failed .*TypeError"):
                assert dispatch.gluon_module("hopper_backward") is None
            assert dispatch.GLUON_FAILED == {name}
        monkeypatch.undo()
    assert dispatch.gluon_module("hopper_backward") is hopper_backward


# ------------------------------------------------------------------------ the host's side, any machine
def _rules(**changes):
    """dkdv's configuration, dQ writer and query-block order as the dispatch module picks them at D = 128."""
    return dict(config=dispatch.gluon_backward_config(128), dq_writer=dispatch.GLUON_DQ_WRITER,
                descending=dispatch.GLUON_DESCENDING) | changes


def _launch_inputs(writer_dq=True, seed=0):
    q, k, v, do = _inputs(2, 4, 2, 300, 333, 128, seed=seed)
    lse, delta = (torch.randn(2, 4, 300) for _ in range(2))
    dq_acc = torch.zeros(q.shape) if writer_dq else None
    return q, k, v, do, lse, delta, dq_acc


@pytest.mark.parametrize("writer", hopper_backward.DQ_WRITERS)
def test_the_launch_passes_each_argument_where_the_kernel_takes_it(monkeypatch, writer):
    """What ``dkdv`` hands the Gluon kernel, read by its own argument names (the launch is a stand-in: Gluon
    runs on an sm_90 GPU only): descriptors over q, k, v, dO; with the TMA writer a descriptor over the fp32
    dQ buffer in [BLOCK_M, D / groups] blocks (else q's, unread); the buffer, the scale in base 2, the sizes
    of a grouped-query call, a grid of key blocks × K/V heads × batch, and each writer's constexprs."""
    kernel = FakeTriton(hopper_backward.attn_bwd_dkdv_ws.arg_names)
    monkeypatch.setattr(hopper_backward, "attn_bwd_dkdv_ws", kernel)
    monkeypatch.setattr(hopper_backward, "RUNNERS", Runners())
    q, k, v, do, lse, delta, dq_acc = _launch_inputs()
    dk, dv = hopper_backward.dkdv(q, k, v, do, lse, delta, True, 0.125, dq_acc=dq_acc, **_rules(dq_writer=writer))
    (how, grid, args), = kernel.launches
    named = dict(zip(kernel.arg_names, args))
    block_m, part_n, _, groups = dispatch.gluon_backward_config(128)
    assert how == "jit" and grid == (3, 2, 2)                          # cdiv(333, 2 · 64) × Hkv × B
    assert named["DK"] is dk and named["DV"] is dv and dk.shape == k.shape and named["DQ_ACC"] is dq_acc
    for name, tensor, rows in (("q_desc", q, block_m), ("k_desc", k, part_n), ("v_desc", v, part_n),
                               ("do_desc", do, block_m)):
        assert named[name].base.data_ptr() == tensor.data_ptr() and list(named[name].block_shape) == [rows, 128]
    dq_desc = named["dq_desc"]
    if writer == "tma":
        assert dq_desc.base.data_ptr() == dq_acc.data_ptr() and dq_desc.base.dtype == torch.float32
        assert list(dq_desc.shape) == [2 * 4 * 300, 128] and list(dq_desc.block_shape) == [block_m, 128 // groups]
    else:
        assert dq_desc is named["q_desc"]
    assert named["qk_scale"] == pytest.approx(0.125 / math.log(2)) and named["sm_scale"] == 0.125
    assert (named["n_heads"], named["group"], named["n_q"], named["n_k"]) == (4, 2, 300, 333)
    assert len(args) == kernel.arg_names.index("BLOCK_M")             # every runtime argument, in order


@pytest.mark.parametrize("writer, registers", [(None, 240), ("atomic", 232), ("tma", 240)])
def test_each_dq_writer_gets_its_constexprs_and_registers(monkeypatch, writer, registers):
    """The writer named picks the kernel's partitions: TMA (1 warp, so the compute threads keep 240
    registers), atomic adds (4 warps, 232), or the compute groups themselves; without a dQ buffer no writer."""
    launched = []
    monkeypatch.setattr(hopper_backward, "RUNNERS", types.SimpleNamespace(
        launch=lambda kernel, grid, args, options, device: launched.append(options)))
    q, k, v, do, lse, delta, dq_acc = _launch_inputs()
    hopper_backward.dkdv(q, k, v, do, lse, delta, False, 0.125, dq_acc=dq_acc, **_rules(dq_writer=writer))
    hopper_backward.dkdv(q, k, v, do, lse, delta, False, 0.125, **_rules(dq_writer=writer))
    one_pass, dkdv_only = launched
    assert (one_pass["ATOMIC_DQ"], one_pass["DQ_WRITER"], one_pass["DQ_TMA"]) == (True, writer is not None,
                                                                                   writer == "tma")
    assert one_pass["COMPUTE_REGS"] == registers
    assert (dkdv_only["ATOMIC_DQ"], dkdv_only["DQ_WRITER"], dkdv_only["DQ_TMA"]) == (False, False, False)
    assert dkdv_only["COMPUTE_REGS"] == 240


def test_the_default_writer_is_tma_and_a_bad_one_is_named(monkeypatch):
    launched = []
    monkeypatch.setattr(hopper_backward, "RUNNERS", types.SimpleNamespace(
        launch=lambda kernel, grid, args, options, device: launched.append(options)))
    q, k, v, do, lse, delta, dq_acc = _launch_inputs()
    hopper_backward.dkdv(q, k, v, do, lse, delta, True, 0.125, dq_acc=dq_acc, **_rules())
    assert dispatch.GLUON_DQ_WRITER == "tma" and launched[0]["DQ_TMA"]
    for bad in ("TMA", True, "red"):
        with pytest.raises(ValueError, match=r"dq_writer: must be one of \(None, 'atomic', 'tma'\)"):
            hopper_backward.dkdv(q, k, v, do, lse, delta, True, 0.125, dq_acc=dq_acc, **_rules(dq_writer=bad))


def test_later_launches_of_a_kind_of_call_go_through_the_runner(monkeypatch):
    """The Gluon backward launches through attnkit.kernels.flash.runners: the first call of a kind through the JIT,
    the next through the kept runner with the call's own tensors; another length is another kind."""
    kernel = FakeTriton(hopper_backward.attn_bwd_dkdv_ws.arg_names)
    monkeypatch.setattr(hopper_backward, "attn_bwd_dkdv_ws", kernel)
    monkeypatch.setattr(hopper_backward, "RUNNERS", Runners())
    first, second = _launch_inputs(seed=1), _launch_inputs(seed=2)
    for inputs in (first, second):
        hopper_backward.dkdv(*inputs[:6], True, 0.125, dq_acc=inputs[6], **_rules())
    q, k, v, do = _inputs(2, 4, 2, 301, 333, 128, seed=3)
    hopper_backward.dkdv(q, k, v, do, *first[4:6], True, 0.125, **_rules())
    assert [how for how, _, _ in kernel.launches] == ["jit", "runner", "jit"]
    _, grid, args = kernel.launches[1]
    named = dict(zip(kernel.arg_names, args))
    assert grid == (3, 2, 2) and len(args) == len(kernel.arg_names)
    assert named["dq_desc"].base.data_ptr() == second[6].data_ptr() and named["DQ_ACC"] is second[6]
    assert named["DQ_TMA"] and named["ATOMIC_DQ"] and named["CAUSAL"]


# -------------------------------------------------------------------------------- compiled for an H100
PTX_FOR_SM90 = r'''
import os, re
os.environ["TRITON_INTERPRET"] = "0"
from attnkit.bench.compiled import compile_gluon_ptx, ptxas_report
from attnkit.kernels.flash import dispatch, hopper_backward
for d, causal, writer in ((128, True, "none"), (64, False, "atomic"), (128, False, "tma"), (64, True, "tma")):
    block_m, part_n, stages, groups = dispatch.gluon_backward_config(d)
    one_pass = writer != "none"
    ptx = compile_gluon_ptx(hopper_backward.attn_bwd_dkdv_ws, dict(BLOCK_M=block_m, PART_N=part_n, HEAD_DIM=d,
                                                                     CAUSAL=causal,
                            STAGES=stages, COMPUTE_REGS=hopper_backward.COMPUTE_REGISTERS[writer if one_pass else None],
                            ATOMIC_DQ=one_pass, DESCENDING=True, DQ_WRITER=one_pass, DQ_TMA=writer == "tma",
                            GROUPS=groups),
                            dict(q_desc=block_m, k_desc=part_n, v_desc=part_n, do_desc=block_m,
                                 dq_desc=(block_m, d // groups) if writer == "tma" else block_m), 4)
    report = ptxas_report(ptx)
    print("d", d, "writer", writer, "spilled", report.spill_bytes, "serialised", report.wgmma_serialised,
          "producer_registers", int(re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx) is not None),
          "tma_copies", ptx.count("cp.async.bulk.tensor"),
          "tma_adds", len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.2d\.global\.shared::cta\.add", ptx)),
          "atomic_adds", len(re.findall(r"\b(?:atom|red)\.global", ptx)),
          "vector4_adds", len(re.findall(r"\b(?:atom|red)\.global[\w.]*\.v4\.f32", ptx)),
          "all_warp_barriers", len(re.findall(r"bar\.sync\s+\d+\s*;", ptx)))
'''


@pytest.mark.slow
def test_the_backward_is_warp_specialised_on_an_h100():
    """Compiled for sm_90a: the producer warp cut to 24 registers, Q, dO, K and V moved by TMA, products
    not serialised by ptxas, no barrier across all warps; dQ added only in the one-pass variants: by TMA
    bulk reductions (each group's [BLOCK_M, D / 2] fp32 share in boxes of 128 bytes a row) from the TMA
    writer, by fp32 atomic adds (four floats an instruction) from the atomic writer; no spills at D = 64
    (at D = 128 dK, dV and the scores fill the 240 registers a compute thread has: a few hundred bytes
    spill, measured in docs/flash_notes.md)."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", PTX_FOR_SM90], capture_output=True, text=True, timeout=600,
                            env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [dict(zip(words[::2], words[1::2])) for words in (line.split() for line in result.stdout.splitlines())]
    assert len(lines) == 4, result.stdout
    for found in lines:
        assert found["serialised"] == "False" and found["producer_registers"] == "1", found
        assert int(found["tma_copies"]) >= 4 and found["all_warp_barriers"] == "0", found
        assert (int(found["atomic_adds"]) > 0) == (found["writer"] == "atomic"), found
        assert int(found["vector4_adds"]) == int(found["atomic_adds"]), found
        # two groups' shares a step, each [64, D / 2] fp32 rows of D / 2 · 4 bytes in 128-byte boxes
        boxes = 2 * (int(found["d"]) // 2 * 4 // 128) if found["writer"] == "tma" else 0
        assert int(found["tma_adds"]) == boxes, found
        assert int(found["spilled"]) <= (0 if found["d"] == "64" else 640), found


# ---------------------------------------------------------------------------------------- on an H100
def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def test_the_rule_keeps_to_the_measured_wins():
    """The warp_specialized design runs the Gluon kernel at D = 64 and 128 from 2k (where it was faster than
    the Triton dK/dV kernel on the H100), never at other head dims or shorter lengths."""
    choice = flash.warp_specialized_backward_choice
    assert choice(128, 2048, 2048) and choice(128, 16384, 20000) and choice(64, 2048, 4096)
    assert not choice(128, 2047, 4096) and not choice(64, 4096, 1024)
    assert not any(choice(d, 16384, 16384) for d in (16, 32, 96, 256))


@pytest.fixture
def gluon_calls(monkeypatch):
    """The Gluon kernel's calls, counted; its rule forced on (the kernel is what is tested here)."""
    monkeypatch.setattr(dispatch, "warp_specialized_backward_choice", lambda *args: True)
    calls = []
    real = hopper_backward.dkdv
    monkeypatch.setattr(hopper_backward, "dkdv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(layout, "new_buffer",      # every buffer the kernels write starts as NaN
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))
    return calls


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("design", GLUON_DESIGNS)
@pytest.mark.parametrize("b, hq, hkv, n_q, n_k, d, causal, dtype", [
    (1, 2, 2, 1000, 1000, 128, False, torch.float16), (1, 2, 2, 1000, 1000, 128, True, torch.bfloat16),
    (2, 4, 2, 333, 333, 64, True, torch.float16), (1, 4, 1, 300, 1000, 128, True, torch.float16),
    (1, 2, 2, 129, 517, 64, False, torch.bfloat16), (1, 3, 3, 1, 333, 128, True, torch.float16),
    (1, 2, 1, 600, 130, 64, False, torch.float16), (2, 4, 4, 65, 33, 128, False, torch.bfloat16),
    (2048, 33, 33, 5, 7, 64, True, torch.float16)])       # B · Hkv past one grid axis's 65,535 programs
def test_matches_float64(gluon_calls, design, b, hq, hkv, n_q, n_k, d, causal, dtype):
    q, k, v, do = _inputs(b, hq, hkv, n_q, n_k, d, dtype, "cuda", seed=n_q + 7 * n_k)
    o, lse = flash.flash_attention_forward(q, k, v, causal=causal)
    got = backward_launch.backward(do, q, k, v, o, lse, causal, 1 / math.sqrt(d), design=design)
    assert len(gluon_calls) == 1
    for name, g, want in zip(("dq", "dk", "dv"), got, attention_grads_ref(q, k, v, do, causal=causal)):
        assert_close(g, want, dtype, "cuda", f"{name} ({design})")


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("design", GLUON_DESIGNS)
@pytest.mark.parametrize("case", ["window", "softcap", "strided q", "expanded k", "float32"])
def test_outside_its_scope_the_triton_kernels_run(gluon_calls, design, case):
    """A window, softcap, a strided or expanded view (K heads sharing one head's memory) or fp32 inputs: the
    two-kernel design runs instead, correctly."""
    dtype = torch.float32 if case == "float32" else torch.float16
    q, k, v, do = _inputs(1, 2, 2, 200, 200, 64, dtype, "cuda", seed=3)
    if case == "strided q":
        q = torch.cat([q, q], 2)[:, :, ::2]
    elif case == "expanded k":
        k = k[:, :1].expand(-1, 2, -1, -1)
    options = dict(window=(16, -1)) if case == "window" else dict(softcap=5.0) if case == "softcap" else {}
    o, lse = flash.flash_attention_forward(q, k, v, causal=True, **options)
    got = backward_launch.backward(do, q, k, v, o, lse, True, 0.125, design=design, **options)
    want = backward_launch.backward(do, q, k, v, o, lse, True, 0.125, design="two_kernels", **options)
    assert gluon_calls == []
    assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
@pytest.mark.parametrize("design", GLUON_DESIGNS)
@pytest.mark.parametrize("case", ["o.sum()", "strided do"])
def test_a_broadcast_or_strided_do_runs_the_gluon_kernel(gluon_calls, design, case):
    """dO from ``o.sum().backward()`` (expanded, every stride 0) or a strided view: laid out contiguously
    (``dispatch.backward_do``), it takes the Gluon kernel as a contiguous dO does, with the same gradients."""
    q, k, v, do = _inputs(1, 2, 2, 200, 200, 64, torch.float16, "cuda", seed=5)
    do = torch.ones((), dtype=do.dtype, device="cuda").expand(do.shape) if case == "o.sum()" else \
        do.transpose(1, 2).contiguous().transpose(1, 2)
    o, lse = flash.flash_attention_forward(q, k, v, causal=True)
    got = backward_launch.backward(do, q, k, v, o, lse, True, 0.125, design=design)
    want = backward_launch.backward(do.contiguous(), q, k, v, o, lse, True, 0.125, design=design)
    assert len(gluon_calls) == 2
    if flash.BACKWARDS[design].reproducible:                         # the one pass adds dQ in no fixed order
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    for name, g, w in zip(("dq", "dk", "dv"), got, attention_grads_ref(q, k, v, do, causal=True, sm_scale=0.125)):
        assert_close(g, w, torch.float16, "cuda", f"{name} ({design}, {case})")


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU")
def test_the_design_runs_the_gluon_kernel_only_where_its_rule_says(monkeypatch):
    calls = []
    real = hopper_backward.dkdv
    monkeypatch.setattr(hopper_backward, "dkdv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for n, d, runs in ((2048, 128, 1), (1024, 128, 0), (2048, 64, 1), (1024, 64, 0)):
        q, k, v, do = _inputs(1, 2, 2, n, n, d, torch.float16, "cuda", seed=n)
        o, lse = flash.flash_attention_forward(q, k, v, causal=True)
        calls.clear()
        backward_launch.backward(do, q, k, v, o, lse, True, 1 / math.sqrt(d), design="warp_specialized")
        assert len(calls) == runs, (n, d)


def test_scope_words_match_the_forwards():
    """The backward's reasons are the forward's, naming the backward (one rule, written once)."""
    q, k, v, _ = _inputs(1, 2, 2, 64, 64, 96)
    reason = dispatch.gluon_backward_unsupported(q, k, v, False)
    assert re.search(r"q: head dim 96 is not supported by the warp-specialised backward", reason)
