"""A counter of host synchronisations for tests: the calls that read a tensor's contents back to the
host (on a GPU each one waits for the device). Shared by the paged-decode and engine tests."""
import torch


class HostSyncs:
    """Counts the calls that read a tensor's contents back to the host (a synchronisation on a GPU)."""

    NAMES = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.calls = []
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(t, *args, _name=name, _original=original, **kwargs):
                self.calls.append(_name)
                return _original(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)
