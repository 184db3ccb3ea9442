"""What FlashAttention's dispatch chooses among: the forward's rungs and the backward's designs.

- the forward's performance ladder (``LADDER``: each rung in words; ``Rung``: the constexprs of the one
  forward kernel and how its block sizes are chosen; ``VARIANTS``: the rungs by name, ``variant=``);
- the backward's designs (``BackwardDesign``; ``BACKWARDS``: the designs by name, ``backward=``;
  ``TRITON_BACKWARDS``: those whose kernels run on every machine).

The rules that pick among them (the default rung and design, what a rung becomes on given tensors, where
a design's Gluon kernel runs) are in ``dispatch``, which re-exports these names.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import triton_kernels as kernels

# ------------------------------------------------------------------------------ the forward's ladder
# The forward's performance ladder: each rung keeps the ones before it and adds one idea.
LADDER = {
    "tiled": "online softmax over key tiles with exp; every tile masked; one fixed block size",
    "exp2": "exp2 with log2(e) folded into the score scale (one MUFU instruction, one multiply less)",
    "split": "key tiles split into unmasked ones and the masked causal diagonal / ragged end",
    "autotuned": "block sizes, warps and pipeline stages autotuned per shape",
    "descriptors": "tiles copied by the TMA engine through tensor descriptors (sm_90+), wider autotune space",
    "host_descriptors": "the descriptors built once per launch on the host and passed as arguments, "
                        "instead of four per program on the device (D = 64 and 128; host_descriptor_choice)",
    "warp_specialized": "on sm_90, where warp_specialized_choice picks it, the warp-specialised Gluon forward "
                        "(attnkit.kernels.flash_hopper: one producer warp, two compute warp groups; persistent "
                        "programs for short calls and non-causal ones at D = 128); host_descriptors elsewhere",
}


@dataclass(frozen=True)
class Rung:
    """One rung: the constexprs of the one forward kernel ``_attn_fwd`` and how its block sizes are chosen."""

    use_exp2: bool = True            # USE_EXP2
    split: bool = True               # SPLIT
    desc: int = kernels.POINTERS     # DESC: pointers, descriptors built per program, or built on the host
    tuned: bool = True               # autotuned block sizes (else one fixed configuration)
    rule: bool = False               # host_descriptor_choice decides per shape whether to use ``desc``
    longest_first: bool = True       # LONGEST_FIRST where the band is bounded on the right (causal):
                                     # the last query blocks, which read the most keys, start first
    warp_specialized: bool = False   # the Gluon kernel where warp_specialized_choice picks it and it runs


VARIANTS = {
    "tiled": Rung(use_exp2=False, split=False, tuned=False),
    "exp2": Rung(split=False, tuned=False),
    "split": Rung(tuned=False),
    "autotuned": Rung(),
    "descriptors": Rung(desc=kernels.DEVICE_DESCRIPTORS),
    "host_descriptors": Rung(desc=kernels.HOST_DESCRIPTORS, rule=True),
    "warp_specialized": Rung(desc=kernels.HOST_DESCRIPTORS, rule=True, warp_specialized=True),
}


# ------------------------------------------------------------------------------------ the backward
@dataclass(frozen=True)
class BackwardDesign:
    """One way to compute the backward: matrix products per (query block, key block) pair, and how
    (``attnkit.kernels.flash.backward`` runs it)."""

    products: int
    summary: str
    descriptors: bool    # tiles through host-built tensor descriptors (TMA) where the inputs allow
    gluon: bool = False  # a Gluon kernel on sm_90 (hopper_backward); "two_kernels" wherever it cannot run
    reproducible: bool = True   # the same gradients bit for bit on every run (no additions in a racing order)


# The backward designs, selected by ``backward=`` (or the environment variable ATTNKIT_FLASH_BACKWARD).
# ``descriptors``: whether a design's tiles move through host-built tensor descriptors where they can
# (docs/flash_notes.md, "Rule: backward descriptors": the one pass's dK/dV kernel spills with them at D = 128).
BACKWARDS = {
    "two_kernels": BackwardDesign(7, "dK/dV kernel over key blocks, then a dQ kernel over query blocks; "
                                     "no atomics, S and dP computed twice", True),
    "atomic_dq": BackwardDesign(5, "one kernel over key blocks: dK, dV stored, dQ accumulated with fp32 "
                                   "atomic adds, then converted (FlashAttention-2/3)", False, reproducible=False),
    "warp_specialized": BackwardDesign(7, "two kernels, the dK/dV one warp-specialised in Gluon on sm_90 "
                                          "(FlashAttention-3's layout) where it was measured faster, the "
                                          "Triton one elsewhere", True, gluon=True),
    "warp_specialized_atomic": BackwardDesign(5, "one warp-specialised Gluon kernel on sm_90, dQ added by "
                                                 "TMA bulk reductions from a writer warp; two_kernels elsewhere",
                                              True, gluon=True, reproducible=False),
}
# Designs whose kernels run on every machine (the interpreter, any GPU); the Gluon ones fall back to two_kernels.
TRITON_BACKWARDS = tuple(name for name, design in BACKWARDS.items() if not design.gluon)
