"""Shared plot style and the registry of diagrams that `make figures` draws into figures/.

A module registers a diagram with ``@diagram("name.png")``; ``python -m attnkit.classroom.figures`` imports
every module listed in ``DIAGRAM_MODULES`` and saves each registered figure.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

FIGURES = Path(__file__).resolve().parents[2] / "figures"
DIAGRAM_MODULES = ("attnkit.bench.iomodel", "attnkit.bench.flash", "attnkit.bench.flash_ladder",
                   "attnkit.bench.gpu_results")
_REGISTRY: dict[str, object] = {}


def diagram(filename: str):
    """Register a function that returns a matplotlib Figure, to be saved as figures/<filename>."""
    def register(fn):
        _REGISTRY[filename] = fn
        return fn
    return register


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    for module in DIAGRAM_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    # Run as `python -m attnkit.classroom.figures`, this file is __main__: the registry that the diagram modules
    # filled is the one of the imported module attnkit.classroom.figures.
    registry = importlib.import_module("attnkit.classroom.figures")._REGISTRY
    for filename, draw in sorted(registry.items()):
        fig = draw()
        fig.savefig(FIGURES / filename, dpi=120, bbox_inches="tight")
        print(f"drew figures/{filename}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
