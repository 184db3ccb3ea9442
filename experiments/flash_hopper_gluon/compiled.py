"""The Gluon forward compiled for the H100 (sm_90a) on any machine, and what its PTX says about the
overlap: how the key loop waits for its warpgroup matrix products.

    TRITON_INTERPRET=0 PYTHONPATH=. python experiments/flash_hopper_gluon/compiled.py

For each configuration it prints ptxas's registers, spills and wgmma verdict, and the counts of
``wgmma.wait_group.sync.aligned 1`` (wait for the score product only, the value product still
running) and ``... 0`` (wait for every product). With OVERLAP the loop must hold a ``1``.
"""
from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"   # compile for a GPU target, even on a CPU

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

from attnkit.bench.compiled import ptxas_report  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel  # noqa: E402

INTEGERS = ("n_heads", "group", "n_q", "n_k")   # not specialised: any size


def _descriptor_type(rows: int, head_dim: int) -> str:
    """The signature string Triton gives a host descriptor of fp16 [rows, head_dim] blocks."""
    base = torch.empty(4096, head_dim, dtype=torch.float16)
    layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.float16)
    return mangle_type(TensorDescriptor(base, list(base.shape), list(base.stride()), [rows, head_dim], layout))


def compile_ptx(block_m: int, block_n: int, head_dim: int, causal: bool, stages: int, warps: int,
                overlap: bool) -> str:
    fn = kernel._attn_fwd_hopper
    constexprs = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, CAUSAL=causal, STAGES=stages,
                      OVERLAP=overlap, num_warps=warps)
    signature = {"q_desc": _descriptor_type(block_m, head_dim), "k_desc": _descriptor_type(block_n, head_dim),
                 "v_desc": _descriptor_type(block_n, head_dim), "O": "*fp16", "LSE": "*fp32", "qk_scale": "fp32"}
    for name in fn.arg_names:
        signature.setdefault(name, "constexpr" if name in constexprs else "i32")
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if signature[name] in ("i32", "*fp16", "*fp32") and name not in INTEGERS}
    source = GluonASTSource(fn, signature, attrs=aligned,
                            constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=1))
    return compiled.asm["ptx"]


def main() -> int:
    print(f"Triton {triton.__version__}, sm_90a, fp16")
    for config in ((128, 128, 128, 2, 8), (64, 64, 128, 3, 4), (64, 128, 64, 2, 4)):
        for causal in (False, True):
            for overlap in (True, False):
                ptx = compile_ptx(*config[:3], causal, *config[3:], overlap)
                waits = [ptx.count(f"wgmma.wait_group.sync.aligned {n};") for n in (1, 0)]
                print(f"{'x'.join(map(str, config[:2]))} D={config[2]} s{config[3]} w{config[4]} causal={causal!s:5} "
                      f"overlap={overlap!s:5}: {ptxas_report(ptx).line()}, waits for 1: {waits[0]}, for 0: {waits[1]}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
