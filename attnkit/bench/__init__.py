"""Measuring: recorder (timing, provenance, recorded results shipped in results/), iomodel (FLOPs,
bytes, rooflines, naive attention timed), compiled (what ptxas makes of a kernel for the H100, on any
machine), one suite per kernel (flash, flash_ladder, kvcache, paged, serving), each with
``run() -> rows``, and targets (the performance targets' table, target / measured / met, from the recorded CSVs).
"""
