"""Serving: kv_cache (cache sizing, the calculator), model_configs (published model shapes),
allocator (pages, reference counts, copy-on-write), tinymodel (a small GQA decoder), engine
(continuous batching over the paged cache).
"""
