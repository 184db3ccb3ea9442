"""The fused softmax kernel of lesson 4 against the float64 reference, and its input checks."""
import numpy as np
import pytest
import torch

from attnkit import runtime
from attnkit.kernels.softmax import MAX_COLS, softmax
from attnkit.reference.attention import softmax_np
from attnkit.tolerances import rel_error, tolerance

DEVICE = runtime().device
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _random(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(shape, generator=g)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("shape", [(1, 1), (5, 7), (3, 100), (2, 3, 33), (4, 256), (2, 1000)])
def test_matches_float64_reference(shape, dtype):
    x = _random(shape, dtype, seed=sum(shape))
    y = softmax(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device
    expected = softmax_np(x.double().cpu().numpy())
    err = rel_error(y, expected)
    assert err <= tolerance(dtype, DEVICE), f"relative error {err:.2e}"


def test_rows_sum_to_one_and_large_scores_do_not_overflow():
    x = _random((6, 45), torch.float32, seed=1)
    torch.testing.assert_close(softmax(x).sum(-1), torch.ones(6, device=DEVICE), rtol=0, atol=1e-6)
    big = x + 1000.0                                            # exp(1000) overflows fp32 ...
    y = softmax(big)                                            # ... unless the max is subtracted
    assert rel_error(y, softmax_np(big.double().cpu().numpy())) <= tolerance(torch.float32, DEVICE)


def test_masked_lanes_do_not_leak():
    # 17 columns in a block of 32: if the 15 extra lanes were read as 0 instead of -inf, each row's
    # denominator would gain 15·exp(0 − max) and the result would be visibly wrong.
    x = torch.full((2, 17), -5.0, device=DEVICE)
    y = softmax(x)
    torch.testing.assert_close(y, torch.full_like(y, 1 / 17), rtol=1e-6, atol=0)


def test_strided_input():
    x = _random((8, 40), torch.float32, seed=3)[:, ::2]         # a view with column stride 2
    expected = softmax_np(x.double().cpu().numpy())
    assert rel_error(softmax(x), expected) <= tolerance(torch.float32, DEVICE)


def test_empty_batch():
    x = torch.empty((0, 5), device=DEVICE)
    assert softmax(x).shape == (0, 5)


@pytest.mark.parametrize("bad, words", [
    (np.zeros((2, 3), dtype=np.float32), "torch.Tensor"),
    (torch.tensor(1.0), "at least one dimension"),
    (torch.zeros((2, 3), dtype=torch.float64), "dtype"),
    (torch.zeros((2, 3), dtype=torch.int32), "dtype"),
    (torch.zeros((2, 0)), "at least 1"),
    (torch.zeros((1, MAX_COLS + 1)), "exceed"),
])
def test_bad_input_raises_value_error_naming_x(bad, words):
    if isinstance(bad, torch.Tensor):
        bad = bad.to(DEVICE)
    with pytest.raises(ValueError, match=r"^x: ") as info:
        softmax(bad)
    assert words in str(info.value)


def test_unsupported_device():
    with pytest.raises(ValueError, match="x: device meta is not supported"):
        softmax(torch.zeros((2, 3), device="meta"))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
def test_cpu_tensors_on_a_gpu_machine_come_back_on_the_cpu():
    x = _random((3, 20), torch.float32, seed=4).cpu()
    y = softmax(x)
    assert y.device == x.device and rel_error(y, softmax_np(x.double().numpy())) <= tolerance(torch.float32, "cuda")
