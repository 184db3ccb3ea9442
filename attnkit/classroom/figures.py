"""The diagrams that `make figures` draws into figures/: one table, file name → the function that returns
its matplotlib Figure.

``python -m attnkit.classroom.figures`` saves every diagram of ``diagrams()``. The table imports the modules
that draw them (the cost model and the benchmark readers, floors below this one); they import nothing from
here. A new diagram is one line in the table.
"""
from __future__ import annotations

import sys
from pathlib import Path

FIGURES = Path(__file__).resolve().parents[2] / "figures"


def diagrams() -> dict:
    """{file name in figures/: function returning a matplotlib Figure}, drawn from code and recorded CSVs."""
    from ..analysis import iomodel
    from ..bench import flash, flash_ladder, gpu_results

    return {
        "roofline_attention.png": iomodel.roofline_attention_figure,
        "memory_hierarchy.png": iomodel.memory_hierarchy_figure,
        "flash_fwd_tflops.png": flash.recorded_forward_tflops,
        "flash_bwd_tflops.png": flash.recorded_backward_tflops,
        "flash_fwd_ratios.png": flash.recorded_forward_ratios,
        "flash_ladder.png": flash_ladder.recorded_ladder,
        "flash_sweep.png": gpu_results.plot_sweep,
        "flash_features.png": gpu_results.plot_features,
        "flash_backward_designs.png": gpu_results.plot_backward,
        "serving_features.png": gpu_results.plot_serving_features,
    }


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    for filename, draw in sorted(diagrams().items()):
        fig = draw()
        fig.savefig(FIGURES / filename, dpi=120, bbox_inches="tight")
        print(f"drew figures/{filename}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
