"""torch.profiler's breakdown of naive attention into its steps, for lesson 2."""
from .iomodel import profile_naive


def run() -> list[dict]:
    return profile_naive(4096, d=128, heads=32)
