"""What ptxas makes of the course's FlashAttention kernels for the H100 (sm_90a), on any machine.

A kernel is compiled by Triton for a Hopper target without a GPU, its PTX assembled by the ptxas that
ships with Triton, and ptxas's report read: registers a thread, bytes spilled to local memory, and
whether ptxas serialised the warpgroup matrix products (wgmma). That last one is ptxas's note C7515,
"wgmma.mma_async instructions are serialized due to ...": every matrix product of the kernel then waits
for the one before it, and the tensor cores idle while the next tile's operands are prepared. It
printed no warning at the default verbosity, and cost the course's dK/dV kernel a quarter of its speed.

    python -m attnkit.analysis.compiled                         # every launcher's defaults, D = 64, 128, 256
    python -m attnkit.analysis.compiled bwd_dkdv bwd_atomic     # some launchers
    python -m attnkit.analysis.compiled --waits                 # how the forwards wait for their products,
                                                                # in the PTX and in the machine code (SASS)

The launch is specialised as on the GPU for contiguous fp16 [B, H, N, D] tensors: the head dim's strides
are 1, the others and the pointers multiples of 16, one query head per K/V head. Run it where Triton
compiles (not under TRITON_INTERPRET=1: the command sets TRITON_INTERPRET=0 for itself); the register
counts belong to the installed Triton and its ptxas, which the report names.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

FP32_ARGUMENTS = {"LSE", "DELTA", "DQ_ACC", "qk_scale", "cap_scale", "sm_scale"}
SERIALISED_NOTE = "C7515"
# rows of a [1, 1, rows, D] descriptor block, by argument (DESC = 2)
DESCRIPTOR_ROWS = {"Q": "BLOCK_M", "O": "BLOCK_M", "DO": "BLOCK_M", "DQ": "BLOCK_M",
                   "K": "BLOCK_N", "V": "BLOCK_N", "DK": "BLOCK_N", "DV": "BLOCK_N"}


@dataclass(frozen=True)
class PtxasReport:
    registers: int
    spill_bytes: int          # bytes stored to local memory per thread (ptxas's "spill stores")
    wgmma_serialised: bool    # ptxas's note C7515

    def line(self) -> str:
        serial = "wgmma SERIALISED" if self.wgmma_serialised else "wgmma pipelined"
        return f"{self.registers:3d} registers, {self.spill_bytes:5d} B spilled, {serial}"


def _ptxas_path() -> str:
    from triton.backends.nvidia import compiler

    try:
        return compiler.get_ptxas(90).path      # newer Triton: one ptxas per architecture
    except TypeError:
        return compiler.get_ptxas().path


def ptxas_report(ptx: str) -> PtxasReport:
    """Assemble ``ptx`` for sm_90a with Triton's ptxas and read its verbose report."""
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        done = subprocess.run([_ptxas_path(), "-arch=sm_90a", "-v", source, "-o", os.path.join(folder, "k.cubin")],
                              capture_output=True, text=True, check=True)
    text = done.stdout + done.stderr
    return PtxasReport(registers=int(re.search(r"Used (\d+) registers", text).group(1)),
                       spill_bytes=int(re.search(r"(\d+) bytes spill stores", text).group(1)),
                       wgmma_serialised=SERIALISED_NOTE in text)


def sass(ptx: str) -> str:
    """The machine code (SASS) ptxas makes of ``ptx`` for sm_90a, as cuobjdump prints it."""
    with tempfile.TemporaryDirectory() as folder:
        source, cubin = os.path.join(folder, "kernel.ptx"), os.path.join(folder, "k.cubin")
        with open(source, "w") as f:
            f.write(ptx)
        subprocess.run([_ptxas_path(), "-arch=sm_90a", source, "-o", cubin], capture_output=True, check=True)
        cuobjdump = os.path.join(os.path.dirname(_ptxas_path()), "cuobjdump")
        return subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True, check=True).stdout


def softmax_beside_product(machine_code: str) -> list[bool]:
    """For each wait in ``machine_code`` (SASS) that leaves one warpgroup product in flight
    (``WARPGROUP.DEPBAR.LE gsb0, 0x1``): whether any exponential (``MUFU.EX2``) runs before the next wait
    for every product (``... 0x0``), that is, whether the softmax really runs beside O's product."""
    found, pending = [], None          # pending: None, or whether an exponential came since the wait
    for line in machine_code.splitlines():
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            pending = False
        elif "WARPGROUP.DEPBAR.LE gsb0, 0x0" in line:
            if pending is not None:
                found.append(pending)
            pending = None
        elif "MUFU.EX2" in line and pending is False:
            pending = True
    return found


def compile_ptx(fn, constexprs: dict, num_warps: int, num_stages: int, descriptors: bool = False) -> str:
    """PTX of the flash kernel ``fn`` for sm_90 with these constexprs, typed by the kernels' naming
    convention (upper-case arguments are fp16 tensors, FP32_ARGUMENTS fp32, CU_* int32 offsets, lower-case
    ones int32 scalars) and specialised as a launch on contiguous tensors; ``descriptors``: the tiled
    tensors are host-built descriptors (DESC = 2)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ones = {name for name in fn.arg_names if name == "group" or (name.startswith("stride_") and name.endswith("d"))}
    constexprs = dict(constexprs, **{name: 1 for name in ones})
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif descriptors and name in DESCRIPTOR_ROWS:
            head_dim = constexprs["HEAD_DIM_V" if name in ("V", "O", "DO", "DV") else "HEAD_DIM"]
            signature[name] = f"tensordesc<fp16[1,1,{constexprs[DESCRIPTOR_ROWS[name]]},{head_dim}]>"
        elif name in FP32_ARGUMENTS:
            signature[name] = "*fp32" if name.isupper() else "fp32"
        elif name.startswith("CU_"):
            signature[name] = "*i32"
        else:
            signature[name] = "*fp16" if name[0].isupper() else "i32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if signature[name] in ("i32", "*fp16", "*fp32")}
    source = ASTSource(fn=fn, signature=signature, attrs=aligned,
                       constexprs={(fn.arg_names.index(name),): value for name, value in constexprs.items()})
    options = dict(num_warps=num_warps, num_stages=num_stages)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def gluon_descriptor_type(rows: int, cols: int, fp32: bool = False) -> str:
    """The signature Triton gives a host-built Gluon descriptor moving fp16 (or fp32) [rows, cols] blocks."""
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import mangle_type

    base = torch.empty(4096, cols, dtype=torch.float32 if fp32 else torch.float16)
    layout = gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float32 if fp32 else gl.float16)
    return mangle_type(TensorDescriptor(base, list(base.shape), list(base.stride()), [rows, cols], layout))


def compile_gluon_ptx(fn, constexprs: dict, descriptor_rows: dict, num_warps: int,
                      any_size=("n_heads", "group", "n_q", "n_k"), int_pointers=("schedule", "starts")) -> str:
    """PTX of the Gluon kernel ``fn`` for sm_90a: arguments named in ``descriptor_rows`` are descriptors
    of [rows, HEAD_DIM] fp16 blocks (or, given (rows, cols), of fp32 [rows, cols] blocks), LSE, DELTA and
    DQ_ACC fp32 pointers, other upper-case names fp16 pointers, those in ``int_pointers`` int32 pointers,
    the scales (``*_scale``) fp32, the rest int32 (those in ``any_size`` not assumed to be multiples of 16);
    constexprs not in ``constexprs`` take their defaults."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constexprs = {**defaults, **constexprs}         # a constexpr left out takes its default, as at a launch
    signature = {name: gluon_descriptor_type(*rows, fp32=True) if isinstance(rows, tuple)
                 else gluon_descriptor_type(rows, constexprs["HEAD_DIM"]) for name, rows in descriptor_rows.items()}
    for name in fn.arg_names:
        if name in constexprs:
            kind = "constexpr"
        elif name.isupper():
            kind = "*fp32" if name in ("LSE", "DELTA", "DQ_ACC") else "*fp16"
        elif name in int_pointers:
            kind = "*i32"
        else:
            kind = "fp32" if name.endswith("_scale") else "i32"
        signature.setdefault(name, kind)
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if signature[name] in ("i32", "*i32", "*fp16", "*fp32") and name not in any_size}
    source = GluonASTSource(fn, signature, attrs=aligned,
                            constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    options = dict(num_warps=num_warps, num_stages=1)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def launcher_constexprs(name: str, head_dim: int, causal: bool, config) -> tuple[object, dict, bool]:
    """(kernel, constexprs, descriptors) of launcher ``name`` as the course launches it on the H100 for
    fp16 inputs at this head dim: the forward as its rung ("fwd": "autotuned", "fwd_desc": BEST_TRITON), the
    two-kernel backward with host descriptors (pointers at D = 256), the one-pass backward with pointers."""
    from ..kernels import flash
    from ..kernels.flash import triton_kernels

    kernel = getattr(triton_kernels, flash.LAUNCHERS[name][0])
    dims = dict(HEAD_DIM=head_dim, HEAD_DIM_V=head_dim, DIM_QK=head_dim, DIM_V=head_dim, BAND=causal,
                SOFTCAP=False, VARLEN=False, CAUSAL=causal, DOT_PRECISION="tf32",
                BLOCK_M=config.block_m, BLOCK_N=config.block_n)
    if name.startswith("fwd"):
        rung = flash.VARIANTS[flash.BEST_TRITON if name == "fwd_desc" else "autotuned"]
        desc = triton_kernels.HOST_DESCRIPTORS if name == "fwd_desc" else triton_kernels.POINTERS
        dims.update(USE_EXP2=rung.use_exp2, SPLIT=rung.split, DESC=desc, LONGEST_FIRST=causal and rung.longest_first)
        return kernel, dims, bool(desc)
    descriptors = name != "bwd_atomic" and flash.BACKWARDS["two_kernels"].descriptors and head_dim <= 128
    dims["DESC"] = triton_kernels.HOST_DESCRIPTORS if descriptors else triton_kernels.POINTERS
    if name != "bwd_dq":
        dims["ATOMIC_DQ"] = name == "bwd_atomic"
    return kernel, dims, descriptors


def report(name: str, head_dim: int, causal: bool, config=None) -> PtxasReport:
    """ptxas's report on launcher ``name`` at its default configuration (or ``config``)."""
    from ..kernels import flash

    config = config or flash.default_config(name, head_dim)
    kernel, constexprs, descriptors = launcher_constexprs(name, head_dim, causal, config)
    return ptxas_report(compile_ptx(kernel, constexprs, config.num_warps, config.num_stages, descriptors))


WAIT_ALL_BUT_ONE = "wgmma.wait_group.sync.aligned 1;"
ALL_WARP_BARRIER = re.compile(r"bar\.sync\s+\d+\s*;")         # bar.sync n; without a thread count


def forward_waits() -> list[str]:
    """How the Triton forward (BEST_TRITON, D = 128, its default tiles) and the warp-specialised Gluon forward
    (D = 128) wait for their warpgroup products and synchronise their warps, read from their PTX for
    sm_90a, and, where the PTX waits for the score product alone, from its SASS: facts that do not depend
    on the Triton version's exact instruction counts."""
    from ..kernels import flash

    config = flash.default_config("fwd_desc", 128)
    kernel, constexprs, descriptors = launcher_constexprs("fwd_desc", 128, False, config)
    lines = [("Triton forward", compile_ptx(kernel, constexprs, config.num_warps, config.num_stages, descriptors))]
    try:
        from ..kernels.flash import hopper
    except ImportError as missing:          # a Triton without Gluon's Hopper API
        return [f"{lines[0][0]}: {_wait_facts(lines[0][1])}", f"warp-specialised forward: needs Gluon ({missing})"]
    from ..kernels.flash.dispatch import HEAD_DIMS

    half_m, block_n, stages, groups = HEAD_DIMS[128].gluon_forward[False]
    ptx = compile_gluon_ptx(hopper._attn_fwd_ws, dict(HALF_M=half_m, BLOCK_N=block_n, HEAD_DIM=128, CAUSAL=False,
                                                      STAGES=stages, COMPUTE_REGS=hopper.COMPUTE_REGISTERS[groups],
                                                      GROUPS=groups),
                            dict(q_desc=half_m, k_desc=block_n, v_desc=block_n), 4)
    lines.append(("warp-specialised forward", ptx))
    return [f"{name}: {_wait_facts(ptx)}" for name, ptx in lines]


def _wait_facts(ptx: str) -> str:
    alone = WAIT_ALL_BUT_ONE in ptx
    facts = (("PTX waits for the score product alone (wait_group 1)" if alone else
              "PTX: every wait is for all products in flight (wait_group 0 only)")
             + ("; some barriers stop all warps" if ALL_WARP_BARRIER.search(ptx) else
                "; no barrier stops all warps (only per warp group)"))
    if alone:
        beside = softmax_beside_product(sass(ptx))
        facts += (f"; in the SASS, exponentials run beside O's product in {sum(beside)} of {len(beside)} loops"
                  + (" (ptxas moved the wait for all products above the softmax)" if not any(beside) else ""))
    return facts


def main(argv: list[str]) -> int:
    os.environ["TRITON_INTERPRET"] = "0"
    import triton

    from ..kernels import flash

    if argv == ["--waits"]:
        print("\n".join(forward_waits()))
        return 0
    names = argv or list(flash.LAUNCHERS)
    print(f"Triton {triton.__version__}, ptxas {os.path.basename(_ptxas_path())}, sm_90a, fp16")
    serialised = 0
    for name in names:
        for head_dim in (64, 128, 256):
            for causal in (False, True):
                config = flash.default_config(name, head_dim)
                result = report(name, head_dim, causal, config)
                serialised += result.wgmma_serialised
                print(f"{name:10} D={head_dim:3d} causal={causal!s:5} {config.block_m}x{config.block_n} "
                      f"w{config.num_warps} s{config.num_stages}: {result.line()}", flush=True)
    return 1 if serialised else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
