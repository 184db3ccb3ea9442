"""Load a Python file that is not part of a package (a script, an experiment's model) as a module."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_file(relative: str, name: str | None = None):
    """The module in ROOT / ``relative``, loaded afresh under ``name`` (default: the file's stem)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
