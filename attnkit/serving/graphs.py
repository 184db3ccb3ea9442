"""The engine's decode step on fixed buffers, replayed from CUDA graphs on a GPU (as vLLM does).

B sequences are padded up to the next of ``graph_sizes`` (1, 2, 4, 8, …, max_batch); their tokens,
positions, write slots and page tables are packed on the host into one int64 tensor
[size, 3 + table_width] and copied to the device in one transfer; the step reads everything from that
static buffer. A padded row decodes token 0 at position 0: it writes its K and V into a scratch page
past the allocator's pages (``scratch_page``: no sequence owns it) and attends to that one token, so it
reads nothing out of bounds and its output is dropped. The step makes no host synchronisation: RoPE
reads tables indexed on the device, K and V are stored by ``index_copy_`` at slot ids on the device,
``paged_decode`` checks its inputs on the device (skipped while a graph is captured). With
``cuda_graphs`` (default on CUDA) the step of each padded size is captured once (after two warm-up
calls, all sizes in one memory pool) and replayed; on the CPU the same function runs eagerly on the same
padded buffers. What stays eager: the prefill chunks (their number and lengths change every step, and
``flash_attention_varlen`` reads the longest chunk on the host) and the scheduler itself.
"""
from __future__ import annotations

import warnings

import torch

from ..kernels.fp8_cache import FP8, quantize_fp8
from ..reference.rope import rope_cache
from .allocator import Slots

DECODE_COLUMNS = ("token", "position", "slot")     # then the page table: columns 3 .. 3 + table_width


def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE of one token per row, computed in float64 as ``apply_rope(mode="half")`` does:
    x [S, H, D], cos and sin [S, D/2] float64 (rows of ``rope_cache``) → [S, H, D] in x's dtype."""
    half = x.shape[-1] // 2
    x64 = x.to(torch.float64)
    a, b = x64[..., :half], x64[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]                                     # [S, 1, D/2]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(x.dtype)


def moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; from the host to a GPU through pinned memory, without waiting for the copy."""
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def graph_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The padded batch sizes of the decode step: powers of two below max_batch, then max_batch."""
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return (*sizes, max_batch)


class GraphedDecode:
    """The decode step of ``Engine`` (this class is one of its bases): ``decode`` packs B sequences into
    the static buffer and runs ``decode_step`` on it, replayed from a CUDA graph when ``cuda_graphs``.

    It reads the engine's model, cfg, cache, backend, kv_scales, page_size, max_batch, device,
    scratch_page and ``pages_for``; ``_init_decode_step`` makes its buffers once they exist.
    """

    def _init_decode_step(self, cuda_graphs: bool | None) -> None:
        """The decode step's static inputs and constant tables, on the model's device."""
        cfg = self.cfg
        self.graph_sizes = graph_batch_sizes(self.max_batch)
        self.table_width = self.pages_for(cfg.max_seq_len)           # pages of the longest sequence
        # one row per sequence: token, position, slot id (page · page_size + offset), page table
        self._static = torch.empty((self.max_batch, len(DECODE_COLUMNS) + self.table_width), dtype=torch.int64,
                                   device=self.device)
        self._static.copy_(self._padding_rows(self.max_batch, self.device))
        cos, sin = rope_cache(cfg.max_seq_len, cfg.head_dim, base=cfg.rope_base, dtype=torch.float64,
                              device=self.device)                       # [max_seq_len, D/2] each
        self._rope = (cos, sin)
        self._decode_cu = torch.arange(self.max_batch + 1, dtype=torch.int32, device=self.device)
        self._layer_scales = [self._scales(layer) for layer in range(cfg.n_layers)]
        # CUDA graphs: on by default with CUDA, never on the CPU (the same padded step runs eagerly)
        self.cuda_graphs = self.device.type == "cuda" and cuda_graphs is not False
        self.graphs: dict[int, tuple | None] = {}        # size → (graph, its output logits), None: eager
        self._graph_pool = None

    def padded_batch(self, batch: int) -> int:
        """The smallest of ``graph_sizes`` that holds ``batch`` sequences."""
        return next(size for size in self.graph_sizes if size >= batch)

    def _padding_rows(self, size: int, device="cpu") -> torch.Tensor:
        """int64 [size, 3 + table_width] on ``device``: token 0 at position 0, written to slot 0 of the
        scratch page, whose table is the scratch page only: a harmless row (see the module docstring)."""
        rows = torch.full((size, len(DECODE_COLUMNS) + self.table_width), self.scratch_page, dtype=torch.int64,
                          device=device)
        rows[:, 0], rows[:, 1], rows[:, 2] = 0, 0, self.scratch_page * self.page_size
        return rows

    def pack_rows(self, tokens, positions, block_table, slots: Slots) -> torch.Tensor:
        """The rows of the decode step's static buffer for B sequences, padded to ``padded_batch(B)``:
        int64 [size, 3 + table_width] on the device of ``tokens`` (no read-back)."""
        batch, width = tokens.shape[0], block_table.shape[1]
        if not 1 <= batch <= self.max_batch:
            raise ValueError(f"tokens: expected 1 to max_batch={self.max_batch} sequences, got {batch}")
        if positions.shape != (batch,) or block_table.shape[0] != batch or len(slots) != batch:
            raise ValueError(f"positions, block_table, slots: expected one entry (row) per token, {batch}, got "
                             f"{tuple(positions.shape)}, {tuple(block_table.shape)}, {len(slots)}")
        if width > self.table_width:
            raise ValueError(f"block_table: {width} pages per row, more than table_width={self.table_width} "
                             f"(the pages of max_seq_len={self.cfg.max_seq_len} tokens)")
        device = tokens.device
        rows = self._padding_rows(self.padded_batch(batch), device)
        rows[:batch, 0] = tokens
        rows[:batch, 1] = moved(positions, device)
        rows[:batch, 2] = moved(slots.pages * self.page_size + slots.offsets, device)
        rows[:batch, 3:3 + width] = moved(block_table, device)
        return rows

    def load_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Copy ``rows`` into the first rows of the static buffer (from pinned memory without waiting,
        when they come from the host to a GPU); returns that part of the buffer."""
        static = self._static[:rows.shape[0]]
        static.copy_(moved(rows, static.device))
        return static

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
               slots: Slots) -> torch.Tensor:
        """One token for each of B sequences: tokens, positions [B]; the new K, V go to ``slots``.

        Sequence b then attends to its positions + 1 cached tokens. Returns logits [B, vocab]. The
        inputs are packed into the static buffer, padded to ``padded_batch(B)`` rows, and the step runs
        on it: replayed from its CUDA graph when ``cuda_graphs``, else eagerly (``decode_step``).
        Writing the same slots again gives the same result, so a benchmark may call it repeatedly.
        """
        batch = tokens.shape[0]
        static = self.load_rows(self.pack_rows(tokens, positions, block_table, slots))
        if not self.cuda_graphs:
            return self.decode_step(static)[:batch]
        size = static.shape[0]
        if size not in self.graphs:
            self.graphs[size] = self._capture(size)
        if self.graphs[size] is None:                     # its capture failed: eager, said by a warning
            return self.decode_step(static)[:batch]
        graph, logits = self.graphs[size]
        graph.replay()
        return logits[:batch].clone()                     # the graph's buffer is overwritten by the next replay

    def capture_graphs(self) -> None:
        """Capture the decode step of every size in ``graph_sizes`` now (else each is captured at its
        first use), on padding rows only; nothing without ``cuda_graphs``."""
        if not self.cuda_graphs:
            return
        self._static.copy_(self._padding_rows(self.max_batch, self.device))
        for size in self.graph_sizes:
            if size not in self.graphs:
                self.graphs[size] = self._capture(size)

    def _capture(self, size: int):
        """(graph, its output logits [size, vocab]) of the decode step on the first ``size`` rows of the
        static buffer, after two warm-up calls on a side stream (they run the step for real on the rows
        there, which rewrites the same K and V); all graphs share one memory pool. None, with a
        warning, if the capture fails (that size then runs eagerly)."""
        static = self._static[:size]
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self.decode_step(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                logits = self.decode_step(static)
            return graph, logits
        except RuntimeError as exc:
            warnings.warn(f"cuda_graphs: the decode step of {size} rows could not be captured ({exc}); it runs "
                          f"eagerly", RuntimeWarning, stacklevel=3)
            return None

    @torch.no_grad()
    def decode_step(self, static: torch.Tensor) -> torch.Tensor:
        """The decode step on the static rows [S, 3 + table_width] (see ``pack_rows``) → logits [S, vocab].

        No host synchronisation, no branch on a tensor's value: the same calls run eagerly or under
        capture. Padded rows are computed like the others, on the scratch page.
        """
        tokens, positions, slot_ids = static[:, 0], static[:, 1], static[:, 2]  # [S] each
        table = static[:, len(DECODE_COLUMNS):].to(torch.int32)                  # [S, table_width]
        seq_lens = (positions + 1).to(torch.int32)                               # [S]
        cos, sin = (t[positions] for t in self._rope)                            # [S, D/2] float64
        x = self.model.embed(tokens[:, None])                                    # [S, 1, d_model]
        for layer, block in enumerate(self.model.blocks):
            q, k, v = self._project_one(block, x, cos, sin)                      # [S, H, D]
            self._store_rows(layer, slot_ids, k, v)
            attn = self._attend_one(layer, q, table, seq_lens)                   # [S, Hq, D]
            x = block.finish(x, attn[:, :, None])
        return self.model.logits(x[:, 0])

    def _project_one(self, block, x, cos, sin):
        """``block.project_qkv`` for one token per row, RoPE from tables indexed on the device (the
        reference ``apply_rope`` checks positions on the host): x [S, 1, d_model], cos, sin [S, D/2]
        float64 → q [S, Hq, D], k, v [S, Hkv, D]."""
        cfg = self.cfg
        rows = x.shape[0]
        h = block.attn_norm(x)
        q = block.wq(h).view(rows, cfg.n_heads, cfg.head_dim)
        k = block.wk(h).view(rows, cfg.n_kv_heads, cfg.head_dim)
        v = block.wv(h).view(rows, cfg.n_kv_heads, cfg.head_dim)
        return rotate_half(q, cos, sin), rotate_half(k, cos, sin), v

    def _store_rows(self, layer: int, slot_ids, k, v) -> None:
        """k, v [S, Hkv, D] into the cache at slot ids (page · page_size + offset), on the device."""
        if self.kv_scales is not None:
            k, v = quantize_fp8(k, self.kv_scales[layer, 0]), quantize_fp8(v, self.kv_scales[layer, 1])
        for store, new in ((self.cache.k[layer], k), (self.cache.v[layer], v)):
            store, new = store.view(-1, *store.shape[2:]), new.to(store.dtype)     # [slots, Hkv, D], [S, Hkv, D]
            if store.dtype == FP8:                    # index_copy_ has no float8 kernel: copy the bytes
                store, new = store.view(torch.uint8), new.view(torch.uint8)
            store.index_copy_(0, slot_ids, new)

    def _attend_one(self, layer: int, q, table, seq_lens):
        """q [S, Hq, D] over each row's first seq_lens cached tokens → [S, Hq, D]."""
        k_pages, v_pages = self.cache.k[layer], self.cache.v[layer]
        if self.kv_scales is None:
            return self.backend.decode(q.contiguous(), k_pages, v_pages, table, seq_lens)
        cu = self._decode_cu[:q.shape[0] + 1]                                    # one new token each
        return self.backend.extend(q.contiguous(), k_pages, v_pages, table, seq_lens, cu, max_q_len=1,
                                   **self._layer_scales[layer])
