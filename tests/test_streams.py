"""The read-only stream that lesson 8 and the decode benchmarks use as a bandwidth ceiling."""
import pytest
import torch

from attnkit.bench.streams import five_passes, read_stream

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n", [1, 4095, 100_003])
def test_read_stream_reads_every_element_once(n):
    x = torch.randn(n, dtype=torch.float16, device=DEVICE) * 3
    partial = read_stream(x, block=64, blocks_per_program=4)
    assert partial.numel() == -(-n // 256)
    torch.testing.assert_close(partial.sum().double(), x.double().sum(), rtol=1e-5, atol=1e-3)


def test_read_stream_refuses_a_strided_view():
    x = torch.randn(64, 8, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="x"):
        read_stream(x.t())


def test_five_passes_is_softmax():
    x = torch.randn(5, 37, dtype=torch.float64)
    torch.testing.assert_close(five_passes(x), torch.softmax(x, dim=1))
