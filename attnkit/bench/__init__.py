"""Measuring: recorder (timing, provenance, recorded results shipped in results/), iomodel (FLOPs,
bytes, rooflines, naive attention timed), and one suite per kernel (flash, flash_ladder, kvcache,
paged, serving), each with ``run() -> rows``.
"""
