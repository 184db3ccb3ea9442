"""Serving: kv_cache (cache sizing, the calculator), model_configs (published model shapes),
allocator (pages, reference counts, copy-on-write), tinymodel (a small GQA decoder), and the engine in
its rooms: request (requests, the queue, step records), scheduler (continuous batching), engine (model
passes over the paged cache; every public serving name importable from it), graphs (the decode step on
fixed buffers, CUDA graphs), backends (kernels or PyTorch), comparison (against the no-cache pass),
plots (timeline, pages).
"""
