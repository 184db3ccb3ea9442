"""The host's work in one eager paged_decode call, and the value checks the kernel makes itself.

An eager decode step at B = 1 is mostly host time, so what one call does on the host is counted on the
CPU: PyTorch operations (by a dispatch mode, with the Triton launches replaced by a counter, so the
interpreter's own tensor work is not counted), kernel launches and host synchronisations (reads of a
tensor's contents back to the host). With check_values="device" the decode kernel checks the values in
one of its programs; its reports must be those of the PyTorch-operation check (``value_checks.flag``)
call for call. Last, the kernels compile to PTX for an H100 (sm_90) on a CPU, with the check, an FP8
cache, split-KV and padded head dims.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch
from host_syncs import HostSyncs
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit.kernels import paged, paged_plans, value_checks
from attnkit.kernels.fp8_cache import fp8_scales, quantize_fp8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(seed=0, lens=(37, 9), hq=4, hkv=2, d=16, dv=16, page=8, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // page) for n in lens]
    num_pages = sum(per_seq) + 1
    k = torch.randn(num_pages, page, hkv, d, generator=gen)
    v = torch.randn(num_pages, page, hkv, dv, generator=gen)
    q = torch.randn(len(lens), hq, d, generator=gen)
    order = torch.randperm(num_pages, generator=gen)[:sum(per_seq)].tolist()
    table = torch.full((len(lens), max(per_seq)), -5, dtype=torch.int32)
    for b, n in enumerate(per_seq):
        table[b, :n] = torch.tensor([order.pop() for _ in range(n)], dtype=torch.int32)
    to = dict(device=DEVICE, dtype=dtype)
    return [q.to(**to), k.to(**to), v.to(**to), table.to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE)]


class TorchOps(TorchDispatchMode):
    """Records the name of every PyTorch operation dispatched while active."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def counted_launches(monkeypatch):
    """Kernel launches recorded as (kernel name, constexprs) instead of run."""
    launches = []

    def launch(kernel, grid, args, options, device):
        launches.append((kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__, dict(options)))

    monkeypatch.setattr(paged.RUNNERS, "launch", launch)
    return launches


@pytest.mark.parametrize("num_splits,kernels", [(1, ["_paged_kernel"]), (3, ["_paged_kernel", "_merge_splits_kernel"])])
def test_an_eager_call_is_one_launch_per_kernel_and_one_allocation_per_buffer(monkeypatch, counted_launches,
                                                                               num_splits, kernels):
    """After the first call of its kind: one launch (two with splits), one allocation (two), no other
    PyTorch operation and no host synchronisation; the values are checked inside the kernel."""
    case = make_case()
    paged.paged_decode(*case, num_splits=num_splits, check_values="device")        # the plan is made here
    counted_launches.clear()
    syncs = HostSyncs(monkeypatch)
    with TorchOps() as ops:
        paged.paged_decode(*case, num_splits=num_splits, check_values="device")
    assert syncs.calls == [], f"host synchronisations: {syncs.calls}"
    assert [name for name, _ in counted_launches] == kernels
    assert counted_launches[0][1]["CHECK"] is True
    assert ops.names == ["empty.memory_format"] * len(kernels), ops.names


def test_the_first_call_of_a_kind_makes_a_plan_and_later_calls_reuse_it(counted_launches):
    """Three kinds of call, three plans, and each call launches its kernels once (the decode kernel with
    its value check, CHECK=True). Compiled (on a GPU) the first call of a kind with check_values="device"
    also runs once unchecked before (CHECK=False: the kernel a CUDA graph captures, compiled outside the
    capture)."""
    paged_plans.PLANS.clear()
    case = make_case()
    calls = []                                        # (num_splits, that call's launches)

    def call(num_splits):
        before = len(counted_launches)
        paged.paged_decode(*case, check_values="device", num_splits=num_splits)
        calls.append((num_splits, [(name, options["CHECK"]) if "CHECK" in options else (name,)
                                   for name, options in counted_launches[before:]]))

    def launches(num_splits, first_of_its_kind):
        merge = [("_merge_splits_kernel",)] if num_splits > 1 else []
        warm_up = [("_paged_kernel", False), *merge] if first_of_its_kind and not paged.triton_interprets() else []
        return (num_splits, [*warm_up, ("_paged_kernel", True), *merge])

    for _ in range(3):                                # one split: one launch a call (a GPU's default may split)
        call(1)
    call(2)                                                                        # another kind of call
    case[0] = case[0][:1]                                                          # another shape
    case[3], case[4] = case[3][:1], case[4][:1]
    call(1)
    expected = [launches(1, True), launches(1, False), launches(1, False), launches(2, True), launches(1, True)]
    assert len(paged_plans.PLANS) == 3 and calls == expected, (
        f"{len(paged_plans.PLANS)} plans (expected 3); launches by call, as (num_splits, [(kernel, CHECK)]): "
        f"{calls}, expected {expected}")


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_splits=True), "num_splits"), (dict(sm_scale=float("nan")), "sm_scale"),
    (dict(window=[-2, 0]), "window"), (dict(variant=["grouped"]), "variant"),
    (dict(check_values="sometimes"), "check_values"),
])
def test_a_plan_never_lets_a_bad_option_through(kwargs, message):
    """Options equal to a good one's (True == 1) or unhashable still meet the full checks."""
    case = make_case()
    paged.paged_decode(*case, num_splits=1, sm_scale=0.25, window=[-1, 0], variant="grouped")
    good = dict(num_splits=1, sm_scale=0.25, window=[-1, 0], variant="grouped")
    with pytest.raises(ValueError, match=message):
        paged.paged_decode(*case, **{**good, **kwargs})


def test_strict_checks_still_read_every_call(monkeypatch):
    """A plan covers shapes, never values: a bad table in a later call of a known kind is refused."""
    case = make_case()
    paged.paged_decode(*case, check_values="strict")
    case[3] = case[3].clone()
    case[3][1, 0] = 99
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = 99 is not a page"):
        paged.paged_decode(*case, check_values="strict")


def bad_variants():
    """(name, arguments, rules): a good call and one call breaking each rule (and two rules at once)."""
    good = make_case(1, lens=(20, 5), page=4)
    lens = good[4].clone()
    lens[1] = 0                                                # uses no page: rule 1 alone
    table = good[3].clone()
    table[0, 2] = -1
    k_scale, v_scale = fp8_scales(good[1]), fp8_scales(good[2])
    k8, v8 = quantize_fp8(good[1], k_scale), quantize_fp8(good[2], v_scale)
    nan_scale = v_scale.clone()
    nan_scale[1] = float("nan")
    fp8 = dict(k_scale=k_scale, v_scale=v_scale)
    return [("good", good, {}, 0), ("length", [*good[:4], lens], {}, 1), ("page", [*good[:3], table, good[4]], {}, 2),
            ("length and page", [*good[:3], table, lens], {}, 3),
            ("good fp8", [good[0], k8, v8, *good[3:]], fp8, 0),
            ("scale", [good[0], k8, v8, *good[3:]], dict(fp8, v_scale=nan_scale), 4),
            ("zero scale", [good[0], k8, v8, *good[3:]], dict(fp8, k_scale=k_scale * 0), 4)]


def state_after(calls) -> list:
    with contextlib.suppress(ValueError):
        value_checks.raise_pending_errors()                 # start from an empty state
    for flagged in calls:
        flagged()
    return value_checks.state(torch.device(DEVICE) if DEVICE == "cpu" else torch.device("cuda", 0)).tolist()


@pytest.mark.parametrize("num_splits", [1, 2])
def test_the_kernel_check_records_what_the_pytorch_check_records(num_splits):
    """Every rule, alone and together, in every position of a run of calls: the state the kernel leaves
    equals the state value_checks.flag leaves (first bad call, count, its rules, calls)."""
    cases = bad_variants()
    for first in (0, 3):                                    # a good call first, then a bad one first
        order = cases[first:] + cases[:first]
        by_kernel = state_after([
            lambda a=args, kw=kw: paged.paged_decode(*a, **kw, num_splits=num_splits, check_values="device")
            for _, args, kw, _ in order])
        by_flag = state_after([
            lambda a=args, kw=kw: paged.check_paged_inputs(*a, **kw, check_values="device")
            for _, args, kw, _ in order])
        assert by_kernel == by_flag, (order[0][0], by_kernel, by_flag)
        bad = [i for i, (_, _, _, rules) in enumerate(order) if rules]
        assert by_kernel == [bad[0] * len(value_checks.KERNELS), len(bad), order[bad[0]][3], len(order)]


def test_the_kernel_check_is_reported_by_raise_pending_errors():
    name, args, kwargs, _ = bad_variants()[3]
    with contextlib.suppress(ValueError):
        value_checks.raise_pending_errors()
    good = make_case(1, lens=(20, 5), page=4)
    paged.paged_decode(*good, check_values="device")
    paged.paged_decode(*args, **kwargs, check_values="device")
    with pytest.raises(ValueError, match="1 of the last 2 calls .* The first was paged_decode call 2 of 2: seq_lens: "
                                         ".*; block_table: a used page id"):
        paged.raise_pending_errors()


COMPILE_FOR_SM90 = r'''
import os
os.environ["TRITON_INTERPRET"] = "0"   # compile for a GPU target, even on a CPU
import re
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnkit.kernels import paged
from attnkit.analysis.compiled import ptxas_report

fn = paged.paged_kernel
HQ, HKV, PAGE = 32, 8, 16


def compile_paged(cache, d, dv, config, grouped=True, split=False, check=True):
    # specialised as a launch on contiguous q [B, 32, d] and pages [P, 16, 8, d]: strides of 1 are
    # constants, the pointers and the arguments divisible by 16 are known to be (what Triton does)
    q = torch.empty(4, HQ, d, device="meta")
    k = torch.empty(10, PAGE, HKV, d, device="meta")
    v = torch.empty(10, PAGE, HKV, dv, device="meta")
    (d1, d2), (dv1, dv2) = paged.head_dim_tiles(d), paged.head_dim_tiles(dv)
    constexprs = dict(GROUP=HQ // HKV, BLOCK_G=16 if grouped else 1, DIM_QK=d, DIM_V=dv, BLOCK_D=d1, BLOCK_D2=d2,
                      BLOCK_DV=dv1, BLOCK_DV2=dv2, PAGE_SIZE=PAGE, BLOCK_N=config.block_n, SPLIT=split,
                      GROUPED=grouped, DOT_PRECISION="tf32", SCALED=cache == "*fp8e4nv", CHECK=check, BLOCK_KV=HKV,
                      CODE=0, N_KERNELS=2, Q_ALIGN=paged.row_alignment(q), K_ALIGN=paged.row_alignment(k),
                      V_ALIGN=paged.row_alignment(v))
    strides = dict(zip(("stride_qb", "stride_qh", "stride_qd"), q.stride()),
                   **dict(zip(("stride_kp", "stride_ks", "stride_kh", "stride_kd"), k.stride())),
                   **dict(zip(("stride_vp", "stride_vs", "stride_vh", "stride_vd"), v.stride())),
                   stride_btp=1, stride_lens=1, stride_btb=64, stride_os=dv + 2 if split else 0,
                   stride_oh=dv * (4 if split else 1), stride_ob=HQ * dv * (4 if split else 1))
    constexprs.update({name: 1 for name, value in strides.items() if value == 1})
    qtype = "*bf16" if cache == "*bf16" else "*fp16"
    types = {"q_ptr": qtype, "k_ptr": cache, "v_ptr": cache, "bt_ptr": "*i32", "lens_ptr": "*i32",
             "out_ptr": "*fp32" if split else qtype, "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
             "state_ptr": "*i64", "qk_scale": "fp32"}
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if signature[name].startswith("*") or strides.get(name, 1) % 16 == 0 and name in strides}
    source = ASTSource(fn=fn, signature=signature, attrs=aligned,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=config.num_warps, num_stages=config.num_stages))
    return compiled.asm["ptx"]


CASES = ((True, False, True, "*fp8e4nv", 80, 80), (True, True, True, "*bf16", 192, 128),
         (False, True, False, "*fp16", 120, 120))
for grouped, split, check, cache, d, dv in CASES:
    ptx = compile_paged(cache, d, dv, paged.LaunchConfig(128, 4, 3), grouped, split, check)
    assert ".entry" in ptx
    print("compiled", d, dv)

products = {}
for cache, d, dv in (("*fp16", 128, 128), ("*fp8e4nv", 128, 128), ("*fp16", 192, 128), ("*fp16", 192, 192),
                     ("*fp16", 256, 256),
                     ("*fp8e4nv", 256, 256), ("*fp16", 120, 120), ("*fp16", 80, 80)):
    config = paged.default_config("grouped", paged.FP8 if cache == "*fp8e4nv" else None, d, dv)
    ptx = compile_paged(cache, d, dv, config)
    spilled = ptxas_report(ptx).spill_bytes
    assert spilled <= 1024, f"{cache} D={d} Dv={dv} {config}: ptxas spills {spilled} bytes a thread"
    # K and V rows are read in 16-byte vectors (D = 120's rows once went one element at a time)
    scalar = re.findall(r"ld\.global(?:\.\w+)*\.b(?:8|16)\b", ptx)
    wide = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10|ld\.global(?:\.\w+)*\.v4", ptx)
    assert not scalar and wide, f"{cache} D={d} Dv={dv}: {len(scalar)} scalar loads, {len(wide)} of 16 bytes"
    # an FP8 cache: V's bytes are not read one at a time from shared memory (the select before p·v)
    assert "ld.shared.b8" not in ptx and "ld.shared.u8" not in ptx, f"{cache} D={d}: byte loads from shared"
    products[cache, d] = ptx.count("mma.sync")
    print("spills", cache, d, dv, spilled)
# D = 80 in two tiles (64 + 32 columns) has fewer matrix products a warp than D = 128 (one of 128)
assert 0 < products["*fp16", 80] < products["*fp16", 128], products
from attnkit.kernels import paged_extend
extend = paged_extend._extend_kernel
for cache, d in (("*fp16", 120), ("*fp8e4nv", 128)):       # paged_extend: the same two rules
    k = torch.empty(10, PAGE, HKV, d, device="meta")
    constexprs = dict(GROUP=HQ // HKV, PAGE=PAGE, D=d, BLOCK_D=128, DV=d, BLOCK_DV=128, BLOCK_M=16, BLOCK_N=32,
                      SCALED=cache == "*fp8e4nv", K_ALIGN=paged.row_alignment(k), V_ALIGN=paged.row_alignment(k),
                      s_qd=1, s_kd=1, s_vd=1, s_od=1, s_tp=1, s_len=1, s_cu=1)
    values = dict(zip(("s_kp", "s_ko", "s_kh", "s_vp", "s_vo", "s_vh"), k.stride()[:3] * 2), s_tb=64)
    types = {"q_ptr": "*fp16", "k_ptr": cache, "v_ptr": cache, "o_ptr": "*fp16", "table_ptr": "*i32",
             "lens_ptr": "*i32", "cu_ptr": "*i32", "k_scale_ptr": "*fp32", "v_scale_ptr": "*fp32",
             "sm_scale_log2": "fp32"}
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in extend.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(extend.arg_names)
               if signature[name].startswith("*") or name in values and values[name] % 16 == 0}
    source = ASTSource(fn=extend, signature=signature, attrs=aligned,
                       constexprs={(extend.arg_names.index(name),): value for name, value in constexprs.items()})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3)).asm["ptx"]
    wide = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10|ld\.global(?:\.\w+)*\.v4", ptx)
    assert wide and "ld.shared.b8" not in ptx, f"paged_extend {cache} D={d}: {len(wide)} loads of 16 bytes"
    print("compiled extend", cache, d)

merge = paged.merge_splits_kernel
constexprs = dict(DIM_V=72, BLOCK_DV=128, BLOCK_S=4)
signature = {name: "constexpr" if name in constexprs else {"ws_ptr": "*fp32", "o_ptr": "*fp16"}.get(name, "i32")
             for name in merge.arg_names}
source = ASTSource(fn=merge, signature=signature,
                   constexprs={(merge.arg_names.index(name),): value for name, value in constexprs.items()})
assert ".entry" in triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4)).asm["ptx"]
print("compiled merge")
'''


@pytest.mark.slow
def test_the_kernels_compile_for_an_h100():
    """The interpreter is lenient (loop-carried types, scalar branches): the decode kernel with its value
    check, an FP8 cache, splits and padded head dims, and the merge kernel, compile to PTX for sm_90; and
    at each head-dim class's default configuration ptxas spills at most 1 KB a thread (128 tokens at a
    padded 256 spilled about 10 KB), K and V are read in 16-byte vectors (D = 120 included: its rows were
    once read an element at a time), an FP8 cache's V is never read from shared memory byte by byte, and
    D = 80 (two tiles, 64 + 32) issues fewer matrix products than D = 128;
    paged_extend's kernel keeps the last two rules."""
    pytest.importorskip("triton.backends.nvidia")
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_SM90], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 6 and result.stdout.count("spills") == 8
