import math

import numpy as np
import pytest
import torch

from attnkit.tolerances import REL_TOL, assert_close, dtype_name, rel_error, tolerance


@pytest.mark.parametrize("dtype, name", [(torch.float16, "float16"), (torch.bfloat16, "bfloat16"),
                                         (torch.float32, "float32"), (np.float64, "float64"),
                                         ("fp16", "float16")])
def test_dtype_names(dtype, name):
    assert dtype_name(dtype) == name


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="dtype"):
        tolerance(torch.int32)


def test_float32_on_cuda_uses_the_tf32_bound():
    assert tolerance(torch.float32, "cpu") == REL_TOL["float32"]
    assert tolerance(torch.float32, "cuda:0") == REL_TOL["tf32"]


def test_bounds_grow_as_precision_falls():
    order = ["float64", "float32", "tf32", "float16", "bfloat16"]
    assert [REL_TOL[n] for n in order] == sorted(REL_TOL[n] for n in order)


def test_rel_error_catches_nan_and_shape_mismatch():
    ref = np.ones((2, 3))
    assert rel_error(ref, ref) == 0.0
    assert rel_error(np.full((2, 3), np.nan), ref) == math.inf
    assert rel_error(np.ones((3, 2)), ref) == math.inf
    assert rel_error(ref * 1.01, ref) == pytest.approx(0.01)


def test_assert_close_names_what_failed():
    ref = torch.randn(64, dtype=torch.float64)
    assert_close(ref.half(), ref, torch.float16)
    with pytest.raises(AssertionError, match="scores: relative error"):
        assert_close(ref + 0.1, ref, torch.float16, what="scores")
