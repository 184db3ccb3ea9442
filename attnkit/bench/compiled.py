"""The old path of ``attnkit.analysis.compiled`` (what ptxas makes of the course's kernels for the H100):
lesson 5b's cell runs ``python -m attnkit.bench.compiled --waits``, so the command keeps working here.
New code imports ``attnkit.analysis.compiled``.
"""
from __future__ import annotations

import sys

from ..analysis.compiled import (  # noqa: F401
    ALL_WARP_BARRIER,
    DESCRIPTOR_ROWS,
    FP32_ARGUMENTS,
    SERIALISED_NOTE,
    WAIT_ALL_BUT_ONE,
    PtxasReport,
    compile_gluon_ptx,
    compile_ptx,
    forward_waits,
    gluon_descriptor_type,
    launcher_constexprs,
    main,
    ptxas_report,
    report,
    sass,
    softmax_beside_product,
)

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
