"""Naive (unfused) attention's time against N, for lesson 2's quadratic fit."""
from .iomodel import measure_naive_scaling


def run() -> list[dict]:
    return measure_naive_scaling((512, 1024, 2048, 4096, 8192), d=128, heads=32)
