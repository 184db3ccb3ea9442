"""Former path of the warp-specialised Gluon forward, which lives in ``attnkit.kernels.flash.hopper`` (its
rules in ``attnkit.kernels.flash.dispatch``).

Kept because the forward's ladder (``flash.dispatch.LADDER``, printed in lessons' stored outputs) names
this path; importing it needs Gluon's Hopper API, as before.
"""
from .flash.dispatch import HEAD_DIMS, HEAD_GROUP  # noqa: F401
from .flash.hopper import COMPUTE_REGISTERS, _attn_fwd_persistent, _attn_fwd_ws, persistent_programs  # noqa: F401

# {(head dim, causal): (HALF_M, BLOCK_N, STAGES, compute groups)}, as the rows of dispatch.HEAD_DIMS give it
CONFIG = {(d, causal): config for d, rules in HEAD_DIMS.items() if rules.gluon_forward
          for causal, config in rules.gluon_forward.items()}
