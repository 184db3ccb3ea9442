"""Shared test set-up: the device is decided before anything imports Triton."""
from pathlib import Path

import pytest

from attnkit.device import ensure_triton_backend

ensure_triton_backend()

ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
