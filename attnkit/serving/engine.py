"""Serving the tiny model: a paged KV cache and a continuous-batching scheduler.

    engine = Engine(tiny_model(), num_pages=24, page_size=8, max_batch=4)
    result = engine.run([Request(0, "the kernel", 40), Request(1, "a new request", 30, arrival=2), ...])
    result.completions[0].text, result.steps        # what each request got; what each step did

The rooms of serving, each in its own module (every name below is importable from this one too):

- ``request``: ``Request``, ``Completion``, ``WaitingQueue``, ``StepRecord``, ``ServeResult``, ``stop_token``.
- ``scheduler``: one step decodes every request whose context is cached, prefills chunks within a
  token budget (admitting new requests first come, first served), retires finished requests, and
  preempts the most recently admitted when pages run out (``Scheduler``).
- ``engine`` (here): the model passes over the paged cache: ``prefill_chunks`` packs every prefill
  chunk of a step into one pass (first chunks through ``flash_attention_varlen``, later ones through
  ``paged_extend`` over the pages); ``run`` checks the requests and runs a ``Scheduler``.
- ``graphs``: the decode step on fixed, padded buffers, replayed from CUDA graphs on a GPU; ``run``
  reads the step's logits back once per step, to choose the tokens on the host.
- ``backends``: the course's kernels (``kernel_backend``) or plain PyTorch (``torch_backend``).
- ``comparison``: ``compare_with_no_cache`` and ``kv_memory``; ``plots``: ``plot_timeline``, ``plot_pages``.

With ``kv_dtype="fp8"`` the cache stores K and V as float8_e4m3fn (1 byte instead of the model's 2 or
4), divided by one scale per (layer, KV head) measured once on a calibration text (amax / 448, with
headroom); ``paged_extend`` multiplies them back in registers. Prefill attends to the fresh K and V;
only what is read back from the cache is rounded.

With ``prefix_caching=True`` full pages outlive their requests, keyed by their tokens and all tokens
before them (``allocator.PrefixCache``): an admitted request first takes the cached pages its context
starts with and prefills only the rest; cached pages no request holds are evicted, least recently used
first, when free pages run out.

Greedy decoding (argmax) throughout, so ``compare_with_no_cache`` can demand that every request's
tokens equal those of the plain forward pass that recomputes the whole sequence for each token.
"""
from __future__ import annotations

import numbers

import torch

from ..kernels.fp8_cache import FP8, FP8_MAX, quantize_fp8
from ..kernels.paged import raise_pending_errors
from .allocator import PagedKVCache, PrefixCache, Slots
from .backends import Backend, kernel_backend, paged_decode_torch, torch_backend
from .comparison import Comparison, compare_with_no_cache, kv_memory
from .graphs import DECODE_COLUMNS, GraphedDecode, graph_batch_sizes, rotate_half
from .plots import TIMELINE_COLORS, plot_pages, plot_timeline
from .request import Completion, Request, ServeResult, StepRecord, WaitingQueue, WaitingSnapshot, stop_token
from .scheduler import Scheduler
from .tinymodel import TinyModel, causal_attention_torch


class Engine(GraphedDecode):
    """Greedy generation for many requests at once over a paged KV cache (see the module docstring)."""

    def __init__(self, model: TinyModel, *, num_pages: int, page_size: int = 8, max_batch: int = 4,
                 backend: Backend | None = None, stop: str | None = "\n", prefix_caching: bool = False,
                 kv_dtype: str = "model", cuda_graphs: bool | None = None):
        for name, value in (("num_pages", num_pages), ("page_size", page_size), ("max_batch", max_batch)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
        num_pages, page_size, max_batch = int(num_pages), int(page_size), int(max_batch)
        if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs: expected None (on with CUDA), True or False, got {cuda_graphs!r}")
        self.model, self.cfg = model, model.cfg
        self.page_size, self.max_batch = page_size, max_batch
        self.backend = backend or kernel_backend()
        self.stop_token = stop_token(model, stop)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        # The course's paged cache: K and V [layers, num_pages, page_size, Hkv, D], a free list and
        # one page table per request; a page id names the same page in every layer.
        if kv_dtype not in ("model", "fp8"):
            raise ValueError(f"kv_dtype: expected 'model' or 'fp8', got {kv_dtype!r}")
        if kv_dtype == "fp8" and self.backend.extend is None:
            raise ValueError("kv_dtype: 'fp8' needs a backend that reads the cache through `extend` (the kernels)")
        self.kv_scales = self._calibrate() if kv_dtype == "fp8" else None      # [layers, 2, Hkv]
        self.cache = self._paged_cache(num_pages, FP8 if kv_dtype == "fp8" else self.dtype)
        if not isinstance(prefix_caching, bool):
            raise ValueError(f"prefix_caching: expected True or False, got {prefix_caching!r}")
        self.prefix = PrefixCache(self.cache) if prefix_caching else None
        self._init_decode_step(cuda_graphs)                 # graphs.GraphedDecode: buffers, CUDA graphs

    # -------------------------------------------------------------- the caches
    def _paged_cache(self, num_pages: int, dtype) -> PagedKVCache:
        """The paged cache, whose storage has one page more than its allocator hands out: page
        ``num_pages`` is the scratch page that the padded rows of a decode step write and read."""
        cfg = self.cfg
        cache = PagedKVCache(num_pages, self.page_size, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
                             dtype=dtype, device="meta")               # bookkeeping only
        shape = (cfg.n_layers, num_pages + 1, self.page_size, cfg.n_kv_heads, cfg.head_dim)
        cache.k = torch.zeros(shape, dtype=dtype, device=self.device)
        cache.v = torch.zeros(shape, dtype=dtype, device=self.device)
        self.scratch_page = num_pages
        return cache

    @torch.no_grad()
    def _calibrate(self, headroom: float = 2.0) -> torch.Tensor:
        """Scales [layers, 2 (K, V), Hkv]: headroom · amax / 448 of each layer's K and V heads over the
        first 256 characters of the training corpus."""
        from .tinymodel import CORPUS_PATH

        text = "".join(ch for ch in CORPUS_PATH.read_text()[:256] if ch in self.model.vocab)
        tokens = torch.tensor([self.model.encode(text)], device=self.device)
        x = self.model.embed(tokens)
        positions = torch.arange(tokens.shape[1], device=self.device)[None]
        scales = []
        for block in self.model.blocks:
            q, k, v = block.project_qkv(x, positions)                               # [1, H, T, D]
            scales.append(torch.stack([t.abs().amax(dim=(0, 2, 3)) for t in (k, v)]) * headroom / FP8_MAX)
            x = block.finish(x, causal_attention_torch(q, k, v))
        return torch.stack(scales).float()

    def _store(self, layer: int, slots: Slots, k, v) -> None:
        """k, v [n, Hkv, D] into the cache (divided by the layer's scales and rounded for an FP8 cache)."""
        if self.kv_scales is not None:
            k, v = quantize_fp8(k, self.kv_scales[layer, 0]), quantize_fp8(v, self.kv_scales[layer, 1])
        self.cache.write(layer, slots, k, v)

    def _scales(self, layer: int) -> dict:
        if self.kv_scales is None:
            return {}
        return dict(k_scale=self.kv_scales[layer, 0].contiguous(), v_scale=self.kv_scales[layer, 1].contiguous())

    # -------------------------------------------------------------- sizes
    def pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_size)

    def worst_case_pages(self, request: Request) -> int:
        """Pages a request may hold at most: its last new token is never cached."""
        return self.pages_for(len(request.prompt) + request.max_new_tokens - 1)

    def check_request(self, request: Request, index: int = 0) -> None:
        """ValueError naming the request and the field unless ``request`` can be served."""
        where = f"requests[{index}]"
        if not isinstance(request, Request):
            raise ValueError(f"{where}: expected Request objects, got {type(request).__name__}")
        for name, low in (("rid", 0), ("max_new_tokens", 1), ("arrival", 0)):
            value = getattr(request, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
                raise ValueError(f"{where}.{name}: expected an integer >= {low}, got {value!r}")
        if not isinstance(request.prompt, str) or not request.prompt:
            raise ValueError(f"{where}.prompt: expected a non-empty string, got {request.prompt!r}")
        try:
            self.model.encode(request.prompt)
        except ValueError as exc:
            raise ValueError(f"{where}.prompt: {exc}") from None
        total = len(request.prompt) + request.max_new_tokens
        if total > self.cfg.max_seq_len:
            raise ValueError(f"{where}: request {request.rid} needs {total} positions, more than the "
                             f"model's max_seq_len={self.cfg.max_seq_len}")
        if self.worst_case_pages(request) > self.cache.num_pages:
            raise ValueError(f"{where}: request {request.rid} may need {self.worst_case_pages(request)} "
                             f"pages, more than the cache's {self.cache.num_pages}")

    # -------------------------------------------------------------- model passes
    @torch.no_grad()
    def prefill(self, seq_id: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        """Cache the K and V of ``token_ids`` at positions start, start + 1, … of ``seq_id``, whose first
        ``start`` tokens are cached already; returns the last position's logits [vocab]."""
        slots = self.cache.reserve(seq_id, len(token_ids))                         # pages as needed
        return self.prefill_chunks([(seq_id, list(token_ids), start)], [slots])[0]

    @torch.no_grad()
    def prefill_chunks(self, chunks: list, slots: list) -> torch.Tensor:
        """One model pass over several chunks (seq_id, token_ids, start) whose pages are reserved
        (``slots``); returns each chunk's last-position logits [len(chunks), vocab].

        The chunks are packed into one row of tokens. A chunk's queries attend causally to themselves
        and to the sequence's cached tokens before them: first chunks (start 0) together through
        ``prefill_packed`` (flash_attention_varlen), later ones together through ``extend`` over the
        pages (paged_extend); a backend without those attends chunk by chunk.
        """
        lengths = [len(t) for _, t, _ in chunks]
        ends = torch.tensor(lengths).cumsum(0)                                      # [n_chunks]
        rows = [torch.arange(int(e) - n, int(e)) for e, n in zip(ends, lengths)]    # each chunk's rows
        tokens = torch.tensor([[t for _, toks, _ in chunks for t in toks]], device=self.device)     # [1, T]
        positions = torch.cat([torch.arange(s, s + n) for (_, _, s), n in zip(chunks, lengths)])[None]
        everything = Slots(torch.cat([sl.pages for sl in slots]), torch.cat([sl.offsets for sl in slots]))
        x = self.model.embed(tokens)                                                 # [1, T, d_model]
        for layer, block in enumerate(self.model.blocks):
            q, k, v = block.project_qkv(x, positions.to(self.device))               # [1, H, T, D]
            q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))                     # [T, H, D]
            self._store(layer, everything, k, v)
            attn = torch.empty_like(q)                                               # [T, Hq, D]
            self._attend_chunks(layer, chunks, rows, q, k, v, attn)
            x = block.finish(x, attn.transpose(0, 1)[None])
        return self.model.logits(x[0, ends - 1])

    def _attend_chunks(self, layer, chunks, rows, q, k, v, attn) -> None:
        """attn[rows of chunk i] = chunk i's attention (see ``prefill_chunks``); q, k, v [T, H, D]."""
        first = [i for i, (_, _, start) in enumerate(chunks) if start == 0]
        later = [i for i, (_, _, start) in enumerate(chunks) if start > 0]

        def packed(group):
            where = torch.cat([rows[i] for i in group]).to(self.device)
            cu = torch.tensor([0, *torch.tensor([len(rows[i]) for i in group]).cumsum(0).tolist()],
                              dtype=torch.int32, device=self.device)
            return where, cu

        if first and self.backend.prefill_packed:
            where, cu = packed(first)
            attn[where] = self.backend.prefill_packed(q[where], k[where], v[where], cu).to(attn.dtype)
            first = []
        if later and self.backend.extend:
            where, cu = packed(later)
            ids = [chunks[i][0] for i in later]
            lens = torch.tensor([chunks[i][2] + len(rows[i]) for i in later], dtype=torch.int32, device=self.device)
            attn[where] = self.backend.extend(q[where].contiguous(), self.cache.k[layer], self.cache.v[layer],
                                              self.cache.block_table(ids, self.device), lens, cu,
                                              max_q_len=max(len(rows[i]) for i in later), **self._scales(layer))
            later = []
        for i in first + later:                                                      # chunk by chunk
            seq_id, _, start = chunks[i]
            qi, ki, vi = (t[rows[i]].transpose(0, 1)[None] for t in (q, k, v))      # [1, H, n, D]
            if start:                                                                # the cached prefix too
                ki, vi = (t.transpose(0, 1)[None].to(q.dtype) for t in self.cache.gather(seq_id, layer))
            attn[rows[i]] = self.backend.prefill(qi, ki, vi)[0].transpose(0, 1)

    # -------------------------------------------------------------- serving
    def run(self, requests: list[Request], *, max_tokens_per_step: int | None = None) -> ServeResult:
        """Serve ``requests`` to completion with continuous batching; every step is recorded.

        ``max_tokens_per_step``: at most this many tokens (decodes + prefill chunk tokens) per step;
        None: every admitted context is prefilled whole in one step.
        """
        if not isinstance(requests, (list, tuple)):
            raise ValueError(f"requests: expected a list of Request objects, got {type(requests).__name__}")
        for i, r in enumerate(requests):
            self.check_request(r, i)
        if len({r.rid for r in requests}) != len(requests):
            raise ValueError("requests: request ids (rid) must be distinct")
        if max_tokens_per_step is not None and (isinstance(max_tokens_per_step, bool)
                                                or not isinstance(max_tokens_per_step, numbers.Integral)
                                                or max_tokens_per_step < self.max_batch):
            raise ValueError(f"max_tokens_per_step: expected None or an integer >= max_batch={self.max_batch} "
                             f"(room for every decode), got {max_tokens_per_step!r}")
        if self.cache.sequences:
            raise ValueError("run: the engine's cache is in use; make a new Engine")
        result = Scheduler(self, requests, max_tokens_per_step).run()
        raise_pending_errors()        # the decode steps' value checks, made on the device, read once
        return result


__all__ = ["plot_timeline", "plot_pages", "Engine", "graph_batch_sizes", "rotate_half",
           "Request", "Completion", "StepRecord", "WaitingQueue", "WaitingSnapshot", "stop_token",
           "ServeResult", "Backend", "Scheduler", "GraphedDecode", "DECODE_COLUMNS", "TIMELINE_COLORS",
           "kernel_backend", "torch_backend", "paged_decode_torch", "compare_with_no_cache",
           "Comparison", "kv_memory"]
