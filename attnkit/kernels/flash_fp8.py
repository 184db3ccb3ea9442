"""Former path of the FP8 FlashAttention forward, which lives in ``attnkit.kernels.flash.fp8``.

Kept only for the modules that still import this name (``attnkit``'s lazy top-level names).
"""
from .flash.fp8 import *  # noqa: F401,F403
from .flash.fp8 import __all__  # noqa: F401
