"""Serving the tiny model: a paged KV cache and a continuous-batching scheduler.

    engine = Engine(tiny_model(), num_pages=24, page_size=8, max_batch=4)
    result = engine.run([Request(0, "the kernel", 40), Request(1, "a new request", 30, arrival=2), ...])
    result.completions[0].text, result.steps        # what each request got; what each step did

One scheduler step, under a budget of ``max_tokens_per_step`` tokens (None: no limit):
1. **Decode** every request whose context is cached: one token each, batched; each new K and V go into
   the request's pages and attention reads the cache through the page table (``paged_decode``). A
   request whose last page is full takes a fresh one; when none is free, the most recently admitted
   request is **preempted**: its pages are freed and it goes back to the front of the queue, keeping
   the tokens it generated (as vLLM's recompute preemption does).
2. **Prefill** in chunks: requests still prefilling, then newly admitted ones (first come, first served,
   while a batch slot is free and free pages cover the chunk), each get a chunk of their context
   (prompt, plus the tokens generated before a preemption) within the step's remaining budget. All the
   step's chunks run in one pass of the model, packed into one row of tokens: first chunks together
   through ``flash_attention_varlen``, later chunks together through ``paged_extend`` over the pages
   (each attends causally to the cached tokens before it and to itself, aligned to the end); the last
   chunk's last position gives the next token. Decodes and prefill chunks share a step
   (Sarathi-Serve's and vLLM's chunked prefill).
3. **Retire** requests that produced their stop token or reached max_new_tokens: their pages go back
   to the free list at once.
When nothing runs and nothing has arrived, the clock jumps to the next arrival.

The decode step (``decode``) runs on fixed buffers, so that on a GPU it can be replayed from a CUDA
graph (as vLLM does): B sequences are padded up to the next of ``graph_sizes`` (1, 2, 4, 8, …,
max_batch); their tokens, positions, write slots and page tables are packed on the host into one int64
tensor [size, 3 + table_width] and copied to the device in one transfer; the step reads everything from
that static buffer. A padded row decodes token 0 at position 0: it writes its K and V into a scratch
page past the allocator's pages (``scratch_page``: no sequence owns it) and attends to that one token,
so it reads nothing out of bounds and its output is dropped. The step makes no host synchronisation:
RoPE reads tables indexed on the device, K and V are stored by ``index_copy_`` at slot ids on the
device, ``paged_decode`` checks its inputs on the device (skipped while a graph is captured). With
``cuda_graphs`` (default on CUDA) the step of each padded size is captured once (after two warm-up
calls, all sizes in one memory pool) and replayed; on the CPU the same function runs eagerly on the same
padded buffers. What stays eager: the prefill chunks (their number and lengths change every step, and
``flash_attention_varlen`` reads the longest chunk on the host) and the scheduler itself. ``run`` reads
the step's logits back once per step, to choose the tokens on the host.

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

import functools
import math
import numbers
import time
import warnings
from dataclasses import dataclass, field

import torch

from ..kernels.paged import raise_pending_errors
from ..kernels.paged_extend import FP8, FP8_MAX, quantize_fp8
from ..reference.rope import rope_cache
from .allocator import PagedKVCache, PrefixCache, Slots
from .tinymodel import TinyModel, causal_attention_torch, greedy_no_cache


# ------------------------------------------------------------------------------- RoPE from tables
def rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split RoPE of one token per row, computed in float64 as ``apply_rope(mode="half")`` does:
    x [S, H, D], cos and sin [S, D/2] float64 (rows of ``rope_cache``) → [S, H, D] in x's dtype."""
    half = x.shape[-1] // 2
    x64 = x.to(torch.float64)
    a, b = x64[..., :half], x64[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]                                     # [S, 1, D/2]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1).to(x.dtype)


# --------------------------------------------------------------------------- attention, two backends
def paged_decode_torch(q, k_pages, v_pages, block_table, seq_lens):
    """Decode attention over a paged cache in plain PyTorch: gather each sequence's pages, then attend.

    q [B, Hq, D]; k_pages, v_pages [num_pages, page_size, Hkv, D]; block_table int32 [B, max_pages];
    seq_lens int32 [B] → [B, Hq, D]. Sequence b sees its first seq_lens[b] cached tokens.
    """
    batch, n_heads, head_dim = q.shape
    page_size, n_kv = k_pages.shape[1], k_pages.shape[2]
    max_len = block_table.shape[1] * page_size
    k = k_pages[block_table.long()].reshape(batch, max_len, n_kv, head_dim)    # [B, L, Hkv, D]
    v = v_pages[block_table.long()].reshape(batch, max_len, n_kv, head_dim)
    group = n_heads // n_kv
    k = k.repeat_interleave(group, dim=2).transpose(1, 2)                       # [B, Hq, L, D]
    v = v.repeat_interleave(group, dim=2).transpose(1, 2)
    scores = (k @ q[..., None])[..., 0] / math.sqrt(head_dim)                   # [B, Hq, L]
    visible = torch.arange(max_len, device=q.device)[None, :] < seq_lens[:, None].to(q.device)  # [B, L]
    scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
    return (torch.softmax(scores, dim=-1)[:, :, None, :] @ v)[:, :, 0, :]        # [B, Hq, D]


@dataclass(frozen=True)
class Backend:
    """How the engine attends: ``prefill(q, k, v)`` causal over a prompt, ``decode(...)`` over pages,
    and optionally ``extend(q, k_pages, v_pages, block_table, seq_lens, cu_seqlens_q)``: a chunk of new
    tokens over the paged cache (else a chunk after a cached prefix gathers the prefix for ``prefill``)."""

    name: str
    prefill: object
    decode: object
    extend: object = None
    prefill_packed: object = None     # prefill_packed(q, k, v, cu_seqlens): several prompts in one call


def kernel_backend() -> Backend:
    """The course's Triton kernels: flash_attention for prefill, paged_decode for decode (its values
    checked on the device, so a decode step makes no host synchronisation on any device)."""
    from ..kernels.flash import flash_attention, flash_attention_varlen
    from ..kernels.paged import paged_decode
    from ..kernels.paged_extend import paged_extend

    def prefill_packed(q, k, v, cu_seqlens):
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        return flash_attention_varlen(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=True)

    return Backend("kernels", lambda q, k, v: flash_attention(q, k, v, causal=True),
                   functools.partial(paged_decode, check_values="device"), paged_extend, prefill_packed)


def torch_backend() -> Backend:
    """The same attention written out in PyTorch (for comparison; no Triton)."""
    return Backend("torch", causal_attention_torch, paged_decode_torch)


# ------------------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class Request:
    """A prompt, how many tokens it may generate at most, and the scheduler step at which it arrives."""

    rid: int
    prompt: str
    max_new_tokens: int
    arrival: int = 0


@dataclass
class Completion:
    """What a request got: its new tokens and text, the logits each token was chosen from, its steps."""

    request: Request
    prompt_ids: list[int]
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    text: str = ""
    admitted: int = -1              # the step of its first prefill chunk
    finished: int = -1              # the step that produced its last token
    pages: list[int] = field(default_factory=list)   # the pages it held when it finished
    finish_reason: str = ""         # "stop" (its stop token) or "length" (max_new_tokens)
    preemptions: int = 0            # times its pages were taken back and its context recomputed
    reused: int = 0                 # context tokens found in the prefix cache instead of computed
    cached: int = 0                 # context tokens whose K and V are in its pages now
    first_token: int = -1           # the step that produced its first token

    @property
    def context(self) -> list[int]:
        """What its pages must hold before its next token: the prompt and all but the last new token;
        after a preemption the last new token too (it is recomputed with the rest)."""
        return self.prompt_ids + self.tokens


class WaitingQueue:
    """The scheduler's queue of requests that arrived and do not run, with its history kept in bounded memory.

    A request enters at the back (arrival) or the front (preempted, or not admitted after all) and leaves
    when admitted. Every entry is recorded once -- its place key (back: increasing, front: decreasing, so
    sorting by key gives the queue's order), its request id, and the events at which it entered and left
    -- so ``snapshot()`` costs O(1) memory however long the queue is; a step record holds a snapshot,
    not a copy of the queue (3,000 waiting requests would otherwise be copied into every step's record).
    """

    def __init__(self):
        self.items: list = []                 # the completions waiting now, in order
        self._log: list = []                  # [place key, rid, entered at event, left at event or None]
        self._entry: dict = {}                # id(completion) -> its open log entry
        self._event = 0
        self._back = 0

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __getitem__(self, i):
        return self.items[i]

    def __iter__(self):
        return iter(self.items)

    def __contains__(self, c) -> bool:
        return c in self.items

    def _enter(self, c, key: int) -> None:
        entry = [key, c.request.rid, self._event, None]
        self._event += 1
        self._log.append(entry)
        self._entry[id(c)] = entry

    def append(self, c) -> None:
        self._back += 1
        self.items.append(c)
        self._enter(c, self._back)

    def insert_front(self, c) -> None:
        self._back += 1
        self.items.insert(0, c)
        self._enter(c, -self._back)

    def remove(self, c) -> None:
        self.items.remove(c)
        self._entry.pop(id(c))[3] = self._event
        self._event += 1

    def snapshot(self) -> "WaitingSnapshot":
        return WaitingSnapshot(self._log, self._event, len(self.items))


class WaitingSnapshot:
    """The request ids that waited at one moment, read back from a ``WaitingQueue``'s log on demand:
    iterates, indexes, compares and prints as the tuple of those ids (queue order); ``len`` is kept."""

    __slots__ = ("_log", "_event", "_count")

    def __init__(self, log: list, event: int, count: int):
        self._log, self._event, self._count = log, event, count

    def ids(self) -> tuple[int, ...]:
        inside = [(key, rid) for key, rid, entered, left in self._log
                  if entered < self._event and (left is None or left >= self._event)]
        return tuple(rid for _, rid in sorted(inside))

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self):
        return iter(self.ids())

    def __getitem__(self, i):
        return self.ids()[i]

    def __eq__(self, other) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, (tuple, list, WaitingSnapshot)) else other)

    def __hash__(self) -> int:
        return hash(self.ids())

    def __repr__(self) -> str:
        return repr(self.ids())


@dataclass(frozen=True)
class StepRecord:
    """What one scheduler step did (request ids), and the cache after it. Its size is bounded by
    ``max_batch``: ``waiting`` is a ``WaitingSnapshot`` (the waiting ids, read on demand from the queue's
    log), never a copy of the queue."""

    step: int
    waiting: tuple[int, ...]        # arrived, not admitted (no batch slot or not enough free pages)
    prefill: tuple[int, ...]
    decode: tuple[int, ...]
    finished: tuple[int, ...]       # retired at the end of this step; their pages are free again
    pages_in_use: int
    tokens_cached: int
    preempted: tuple[int, ...] = ()  # pages taken back this step; back to the queue
    prefill_tokens: int = 0          # context tokens prefilled this step (all chunks together)
    seconds: float = 0.0             # wall clock since the run began, at the end of this step (after the
    #                                  step's logits reached the host when it produced tokens)


@dataclass
class ServeResult:
    completions: dict[int, Completion]
    steps: list[StepRecord]


# -------------------------------------------------------------------------------------------- engine
def stop_token(model: TinyModel, stop) -> int | None:
    """The token id of ``stop``: None (no stop token) or one character of the model's vocabulary (the
    model's tokens are characters, so a longer string could not be matched by one token)."""
    if stop is None:
        return None
    if not isinstance(stop, str) or len(stop) != 1:
        raise ValueError(f"stop: expected None or one character (one token of the model), got {stop!r}")
    try:
        return model.encode(stop)[0]
    except ValueError as exc:
        raise ValueError(f"stop: {exc}") from None


def _moved(t: torch.Tensor, device: torch.device) -> torch.Tensor:
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


DECODE_COLUMNS = ("token", "position", "slot")     # then the page table: columns 3 .. 3 + table_width


class Engine:
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
        self._init_decode_buffers()
        # CUDA graphs: on by default with CUDA, never on the CPU (the same padded step runs eagerly)
        self.cuda_graphs = self.device.type == "cuda" and cuda_graphs is not False
        self._graphs: dict[int, tuple | None] = {}       # size → (graph, its output logits), None: eager
        self._graph_pool = None

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

    def _init_decode_buffers(self) -> None:
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
        return self._prefill_chunks([(seq_id, list(token_ids), start)], [slots])[0]

    @torch.no_grad()
    def _prefill_chunks(self, chunks: list, slots: list) -> torch.Tensor:
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
        """attn[rows of chunk i] = chunk i's attention (see ``_prefill_chunks``); q, k, v [T, H, D]."""
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

    # -------------------------------------------------------------- the decode step
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

    def _pack(self, tokens, positions, block_table, slots: Slots) -> torch.Tensor:
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
        rows[:batch, 1] = _moved(positions, device)
        rows[:batch, 2] = _moved(slots.pages * self.page_size + slots.offsets, device)
        rows[:batch, 3:3 + width] = _moved(block_table, device)
        return rows

    def _load(self, rows: torch.Tensor) -> torch.Tensor:
        """Copy ``rows`` into the first rows of the static buffer (from pinned memory without waiting,
        when they come from the host to a GPU); returns that part of the buffer."""
        static = self._static[:rows.shape[0]]
        static.copy_(_moved(rows, static.device))
        return static

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
               slots: Slots) -> torch.Tensor:
        """One token for each of B sequences: tokens, positions [B]; the new K, V go to ``slots``.

        Sequence b then attends to its positions + 1 cached tokens. Returns logits [B, vocab]. The
        inputs are packed into the static buffer, padded to ``padded_batch(B)`` rows, and the step runs
        on it: replayed from its CUDA graph when ``cuda_graphs``, else eagerly (``_decode_step``).
        Writing the same slots again gives the same result, so a benchmark may call it repeatedly.
        """
        batch = tokens.shape[0]
        static = self._load(self._pack(tokens, positions, block_table, slots))
        if not self.cuda_graphs:
            return self._decode_step(static)[:batch]
        size = static.shape[0]
        if size not in self._graphs:
            self._graphs[size] = self._capture(size)
        if self._graphs[size] is None:                    # its capture failed: eager, said by a warning
            return self._decode_step(static)[:batch]
        graph, logits = self._graphs[size]
        graph.replay()
        return logits[:batch].clone()                     # the graph's buffer is overwritten by the next replay

    def capture_graphs(self) -> None:
        """Capture the decode step of every size in ``graph_sizes`` now (else each is captured at its
        first use), on padding rows only; nothing without ``cuda_graphs``."""
        if not self.cuda_graphs:
            return
        self._static.copy_(self._padding_rows(self.max_batch, self.device))
        for size in self.graph_sizes:
            if size not in self._graphs:
                self._graphs[size] = self._capture(size)

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
                    self._decode_step(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                logits = self._decode_step(static)
            return graph, logits
        except RuntimeError as exc:
            warnings.warn(f"cuda_graphs: the decode step of {size} rows could not be captured ({exc}); it runs "
                          f"eagerly", RuntimeWarning, stacklevel=3)
            return None

    @torch.no_grad()
    def _decode_step(self, static: torch.Tensor) -> torch.Tensor:
        """The decode step on the static rows [S, 3 + table_width] (see ``_pack``) → logits [S, vocab].

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

    # -------------------------------------------------------------- the scheduler
    def _emit(self, c: Completion, logits: torch.Tensor, step: int) -> None:
        """``c``'s next token, chosen from ``logits`` [vocab] (already on the host)."""
        c.logits.append(logits)
        c.tokens.append(int(logits.argmax()))
        if c.first_token < 0:
            c.first_token = step

    def _done(self, c: Completion) -> str:
        """Why ``c`` is finished ("stop", "length"), or "" while it goes on."""
        if c.tokens[-1] == self.stop_token:
            return "stop"
        return "length" if len(c.tokens) == c.request.max_new_tokens else ""

    def _preempt(self, c: Completion, running: list, queue: WaitingQueue) -> None:
        """Take ``c``'s pages back; it waits at the front of the queue and recomputes its context later."""
        running.remove(c)
        self.cache.free(c.request.rid)
        c.cached, c.preemptions = 0, c.preemptions + 1
        queue.insert_front(c)

    def _grow(self, decoding: list, running: list, queue: WaitingQueue) -> list:
        """A slot for each decoding request's next token; preempts the latest admitted while pages lack.
        Returns the requests preempted."""
        preempted = []
        while decoding:
            need = sum(self.cache.pages_needed(c.request.rid, 1) for c in decoding)
            if need <= self.cache.num_available_pages:
                return preempted
            victim = running[-1]                              # the most recently admitted
            self._preempt(victim, running, queue)
            preempted.append(victim)
            if victim in decoding:
                decoding.remove(victim)
        return preempted

    def _keep_pages(self, c: Completion) -> None:
        if self.prefix:
            self.prefix.register(c.request.rid, c.context[:c.cached])

    def _room(self, c: Completion) -> int:
        """Tokens ``c`` can still cache: the rest of its last page and every free page."""
        held = len(self.cache.tables.get(c.request.rid, ()))
        return (held + self.cache.num_available_pages) * self.page_size - c.cached

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
        budget_per_step = int(max_tokens_per_step) if max_tokens_per_step else math.inf
        future = [Completion(r, self.model.encode(r.prompt))
                  for r in sorted(requests, key=lambda r: (r.arrival, r.rid))]
        queue = WaitingQueue()                                # arrived, not running
        running: list[Completion] = []                        # admission order
        done: dict[int, Completion] = {}
        steps: list[StepRecord] = []
        step, started = 0, time.perf_counter()
        while future or queue or running:
            if not queue and not running and future[0].request.arrival > step:
                step = future[0].request.arrival              # idle: the clock jumps
            while future and future[0].request.arrival <= step:
                queue.append(future.pop(0))
            # 1. decode the requests whose context is cached
            decoding = [c for c in running if c.tokens and c.cached == len(c.context) - 1]
            preempted = self._grow(decoding, running, queue)
            if decoding:
                ids = [c.request.rid for c in decoding]
                positions = [len(c.context) - 1 for c in decoding]
                slots = self.cache.reserve_many(ids, 1)
                logits = self.decode(torch.tensor([c.tokens[-1] for c in decoding]), torch.tensor(positions),
                                     self.cache.block_table(ids), slots)      # host tensors: one copy in
                for c, row in zip(decoding, logits.float().cpu()):        # the step's one read-back
                    c.cached += 1
                    self._emit(c, row, step)
                    self._keep_pages(c)
            # 2. prefill chunks: requests part-way through first, then admissions
            budget = budget_per_step - len(decoding)
            prefilled, chunks, slots, chunk_tokens = [], [], [], 0
            candidates = [c for c in running if c not in decoding]
            while budget > 0:
                if candidates:
                    c = candidates.pop(0)
                elif queue and not preempted and len(running) < self.max_batch:
                    c = queue[0]
                else:
                    break
                n = int(min(len(c.context) - c.cached, budget, self._room(c)))
                if n == 0:
                    break                                     # no free page: wait for one
                if c not in running:                          # admit
                    queue.remove(c)
                    self.cache.add_sequence(c.request.rid)
                    running.append(c)
                    if self.prefix:                           # cached pages first; at least one token to compute
                        c.cached = self.prefix.match(c.request.rid, c.context[:-1])
                        n = int(min(len(c.context) - c.cached, budget, self._room(c)))
                        if n == 0:                            # no page for its first chunk: not admitted
                            running.remove(c)
                            self.cache.free(c.request.rid)    # the matched pages stay in the prefix cache
                            self.prefix.uncount(len(c.context) - 1, c.cached)
                            c.cached = 0
                            queue.insert_front(c)
                            break
                        c.reused += c.cached
                    c.admitted = step if c.admitted < 0 else c.admitted
                chunks.append((c.request.rid, c.context[c.cached:c.cached + n], c.cached))
                slots.append(self.cache.reserve(c.request.rid, n))
                c.cached += n
                budget -= n
                chunk_tokens += n
                prefilled.append(c)
            if chunks:                                        # every chunk of the step in one pass
                for c, logits in zip(prefilled, self._prefill_chunks(chunks, slots).float().cpu()):
                    self._keep_pages(c)
                    if c.cached == len(c.context):            # the whole context: the next token
                        self._emit(c, logits, step)
            # 3. retire
            finished = [c for c in running if c.tokens and c.cached == len(c.context) - 1 and self._done(c)]
            for c in finished:
                running.remove(c)
                c.pages = self.cache.pages_of(c.request.rid)
                self.cache.free(c.request.rid)
                c.finished, c.text, c.finish_reason = step, self.model.decode(c.tokens), self._done(c)
                done[c.request.rid] = c
            steps.append(StepRecord(
                step, queue.snapshot(),
                tuple(c.request.rid for c in prefilled), tuple(c.request.rid for c in decoding),
                tuple(c.request.rid for c in finished), self.cache.pages_in_use,
                sum(self.cache.lengths.values()), tuple(c.request.rid for c in preempted), chunk_tokens,
                time.perf_counter() - started))
            step += 1
        raise_pending_errors()        # the decode steps' value checks, made on the device, read once
        return ServeResult(dict(sorted(done.items())), steps)


# ------------------------------------------------------------------------------------ the check
@dataclass(frozen=True)
class Comparison:
    """Served tokens against the plain forward pass without a cache, request by request."""

    equal: dict[int, bool]                  # rid → every token identical
    served_logits: list[torch.Tensor]       # per request [n, vocab]: the logits the engine chose from
    reference_logits: list[torch.Tensor]    # the same positions by the no-cache forward pass

    @property
    def all_equal(self) -> bool:
        return all(self.equal.values())

    @property
    def max_logit_diff(self) -> float:
        """Largest |served logit − no-cache logit| over every position compared."""
        return max(float((s - r).abs().max()) for s, r in zip(self.served_logits, self.reference_logits))

    @property
    def min_margin(self) -> float:
        """Smallest gap between the best and the second-best no-cache logit: how close to a tie."""
        top2 = torch.cat(self.reference_logits).topk(2, dim=-1).values
        return float((top2[:, 0] - top2[:, 1]).min())


def compare_with_no_cache(model: TinyModel, result: ServeResult, stop: str | None = "\n") -> Comparison:
    """Regenerate every request greedily by the plain no-cache forward pass and compare token by token.

    Logits are compared over the positions both produced (all of them when the tokens are equal).
    """
    stop_id = stop_token(model, stop)
    equal, served, reference = {}, [], []
    for rid, c in result.completions.items():
        ref_tokens, ref_logits = greedy_no_cache(model, c.prompt_ids, c.request.max_new_tokens, stop_id)
        equal[rid] = ref_tokens == c.tokens
        n = min(len(ref_tokens), len(c.tokens))
        served.append(torch.stack(c.logits[:n]).to(ref_logits))
        reference.append(ref_logits[:n])
    return Comparison(equal, served, reference)


# ----------------------------------------------------------------------------------------- memory
def kv_memory(engine: Engine, result: ServeResult) -> dict:
    """Cache bytes: the paged cache's peak use against a contiguous cache of max_batch × max_seq_len."""
    per_token = engine.cfg.kv_bytes_per_token(engine.cache.k.element_size())
    peak_pages = max(s.pages_in_use for s in result.steps)
    return {
        "bytes_per_token": per_token,
        "contiguous_tokens": engine.max_batch * engine.cfg.max_seq_len,
        "contiguous_bytes": engine.max_batch * engine.cfg.max_seq_len * per_token,
        "pool_pages": engine.cache.num_pages,
        "pool_bytes": engine.cache.num_pages * engine.page_size * per_token,
        "peak_pages": peak_pages,
        "peak_bytes": peak_pages * engine.page_size * per_token,
        "peak_tokens_cached": max(s.tokens_cached for s in result.steps),
    }


# ------------------------------------------------------------------------------------------- pictures
TIMELINE_COLORS = {"waiting": "#d9d9d9", "prefill": "#e6862e", "decode": "#3b75af"}


def plot_timeline(result: ServeResult, ax=None):
    """One row per request, one column per scheduler step: waiting (grey), prefill or a prefill chunk
    (orange), decode (blue); a red cross where a request was preempted (its pages freed, its context
    recomputed later). Steps are the scheduler's own numbers: an idle clock jump leaves a gap."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3))
    for s in result.steps:
        for kind in ("waiting", "prefill", "decode"):
            for rid in getattr(s, kind):
                ax.broken_barh([(s.step - 0.5, 1.0)], (rid - 0.4, 0.8), color=TIMELINE_COLORS[kind])
        for rid in s.preempted:
            ax.plot(s.step, rid, marker="x", color="red", markersize=8, ls="")
    for c in result.completions.values():
        ax.plot(c.finished + 0.5, c.request.rid, marker="|", color="black", markersize=12)
    ax.set_xlabel("scheduler step")
    ax.set_ylabel("request id")
    ax.set_yticks(sorted(result.completions))
    steps = [s.step for s in result.steps] or [0]
    ax.set_xlim(min(steps) - 1, max(steps) + 1)
    ax.set_ylim(max(result.completions) + 0.6, -1.6)       # request 0 on top, a free row for the legend
    handles = [Patch(color=c, label=k) for k, c in TIMELINE_COLORS.items()]
    handles += [plt.Line2D([], [], color="black", marker="|", ls="", markersize=12, label="finished, pages freed"),
                plt.Line2D([], [], color="red", marker="x", ls="", label="preempted")]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=5)
    return ax


def plot_pages(engine: Engine, result: ServeResult, ax=None):
    """Pages in use after each step, against the pool and a contiguous max-length cache, in KiB."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.5))
    mem = kv_memory(engine, result)
    page_kib = engine.page_size * mem["bytes_per_token"] / 1024
    steps = [s.step for s in result.steps]
    ax.step(steps, [s.pages_in_use * page_kib for s in result.steps], where="mid", label="paged: pages in use")
    ax.step(steps, [s.tokens_cached * mem["bytes_per_token"] / 1024 for s in result.steps], where="mid",
            ls=":", label="tokens actually cached")
    ax.axhline(mem["pool_bytes"] / 1024, color="grey", ls="--", label="page pool")
    ax.axhline(mem["contiguous_bytes"] / 1024, color="red", ls="--",
               label=f"contiguous: {engine.max_batch} × {engine.cfg.max_seq_len} tokens")
    ax.set_xlabel("scheduler step")
    ax.set_ylabel("KV cache (KiB)")
    ax.legend(loc="center right", fontsize=8)
    return ax


__all__ = ["plot_timeline", "plot_pages", "Engine", "graph_batch_sizes", "rotate_half",
           "Request", "Completion", "StepRecord", "WaitingQueue", "WaitingSnapshot", "stop_token",
           "ServeResult", "Backend",
           "kernel_backend", "torch_backend", "paged_decode_torch", "compare_with_no_cache",
           "Comparison", "kv_memory"]
