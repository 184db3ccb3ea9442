"""Shared test set-up: the device is decided before anything imports Triton."""
from pathlib import Path

import pytest

from attnkit.device import ensure_triton_backend

ensure_triton_backend()

ROOT = Path(__file__).resolve().parent.parent


# The longest files first. `make test` runs files on two workers in collection order (`-n 2 --dist
# loadfile --no-loadscope-reorder`): started first, no long file is left running alone at the end.
# tests/integration/test_no_triton.py (the second longest) stays in its place: it waits for the environment that
# tests/integration/test_colab_install.py builds on a fresh machine, and by then that is built.
LONGEST_FIRST = ("tests/integration/test_colab_install.py", "notebooks/09_capstone_serving.ipynb",
                 "notebooks/05b_forward_tuning.ipynb", "notebooks/05_flash_attention.ipynb",
                 "notebooks/10_beyond_one_gpu.ipynb")


@pytest.fixture(autouse=True)
def _no_device_check_left_over():
    """Device-side value checks keep per-process state until it is read (attnkit.kernels.value_checks):
    each test starts with none left by an earlier one in the same worker, on a GPU as on a CPU."""
    yield
    import sys

    checks = sys.modules.get("attnkit.kernels.value_checks")
    if checks is not None:
        try:
            checks.raise_pending_errors()
        except ValueError:
            pass


def _file_rank(item) -> int:
    path = Path(str(item.fspath)).resolve()
    relative = path.relative_to(ROOT).as_posix() if ROOT in path.parents else ""
    return LONGEST_FIRST.index(relative) if relative in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    import torch

    items.sort(key=_file_rank)          # stable: each file's tests keep their order
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
