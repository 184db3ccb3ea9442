"""A paged KV cache: fixed-size pages, a free list, per-sequence page tables, reference counts and
copy-on-write prefix sharing. Bookkeeping in Python, storage in torch tensors.

Three layers, each usable alone:

``BlockAllocator(num_pages)``
    The free list and a reference count per page. ``allocate(n)`` hands out n pages (all or none),
    ``share(pages)`` adds a reference, ``release(pages)`` drops one (each page listed once); a page
    whose count reaches 0 returns to the free list.

``PageTables(num_pages, page_size)``
    Sequences on top of the allocator: each sequence id has a page table (a list of page ids) and a
    length in tokens. Token t of a sequence lives in page ``table[t // page_size]`` at offset
    ``t % page_size``. No storage: the lesson's workload simulation uses this alone.

``PagedKVCache(num_pages, page_size, num_layers, num_kv_heads, head_dim, dtype, device)``
    PageTables plus the storage ``k``, ``v``: tensors [num_layers, num_pages, page_size, Hkv, D];
    ``cache.k[layer]`` / ``cache.v[layer]`` are the [num_pages, page_size, Hkv, D] views that
    ``attnkit.kernels.paged.paged_decode`` reads.

Typical use (one decode step of a batch, in a model with L layers)::

    cache = PagedKVCache(num_pages=256, page_size=16, num_layers=L, num_kv_heads=8, head_dim=128,
                         dtype=torch.float16, device="cuda")
    cache.add_sequence(7)
    cache.append(7, k_prompt, v_prompt)          # [L, n, Hkv, D] each: reserve + write, all layers
    ...
    slots = cache.reserve_many(ids, 1)           # one more token each: pages taken as needed
    for layer in range(L):
        k_new, v_new = ...                       # [B, Hkv, D] for this layer
        cache.write(layer, slots, k_new, v_new)
        o = paged_decode(q, cache.k[layer], cache.v[layer], cache.block_table(ids), cache.seq_lens(ids))
    cache.free(7)                                # its pages go back (when no fork shares them)

Sharing a prefix: ``cache.fork(src, dst)`` gives dst the same pages as src (each page's count + 1);
nothing is copied. Full shared pages are never written again (appends go to later positions). When
either sequence appends into a shared, partly filled last page, that page is copied first into a new
page of its own (copy-on-write), all layers.

Prefix caching: ``PrefixCache(tables)`` keeps full pages after their sequences end, keyed by a hash of
their tokens and of every token before them (as vLLM's automatic prefix caching does): a new sequence
whose prompt starts with the same pages shares them (``match``) instead of computing them again. The
cache holds one reference to each page it keeps; when free pages run out, ``reserve`` evicts the least
recently used pages that no sequence holds.

Running out: ``reserve``/``append``/``fork``-then-append raise ``OutOfPagesError`` (a RuntimeError)
before changing anything, so the cache is exactly as it was and the caller can free or preempt a
sequence and try again.
"""
from __future__ import annotations

import hashlib
import numbers
import operator
from collections import OrderedDict
from dataclasses import dataclass

import torch


class OutOfPagesError(RuntimeError):
    """Raised when a request needs more free pages than the allocator has; nothing was changed."""


def _integer(name: str, value, low: int = 0) -> int:
    """``value`` as a Python int: an integer (Python's or NumPy's; bool refused) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer >= {low}")
        raise ValueError(f"{name}: expected {kind}, got {value!r}")
    return int(value)


# -------------------------------------------------------------------------------------- allocator
class BlockAllocator:
    """A free list of page ids 0..num_pages-1 and a reference count per page."""

    def __init__(self, num_pages: int):
        num_pages = _integer("num_pages", num_pages, 1)
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))     # pop() hands out the lowest id first
        self._refs = [0] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    @property
    def free_list(self) -> tuple[int, ...]:
        """The free pages in the free list's order (the last is handed out next): a copy."""
        return tuple(self._free)

    @property
    def refcounts(self) -> tuple[int, ...]:
        """Every page's reference count, by page id: a copy."""
        return tuple(self._refs)

    def refcount(self, page: int) -> int:
        return self._refs[self._check_page(page)]

    def allocate(self, n: int) -> list[int]:
        """n fresh pages (reference count 1 each), or OutOfPagesError and no change."""
        n = _integer("n", n)
        if n > len(self._free):
            raise OutOfPagesError(f"out of pages: {n} needed, {len(self._free)} free of {self.num_pages}")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def share(self, pages) -> None:
        """One more reference to each page (all must be in use, each listed once)."""
        pages = self._check_pages(pages)
        for p in pages:
            if self._refs[p] == 0:
                raise ValueError(f"pages: page {p} is free; only pages in use can be shared")
        for p in pages:
            self._refs[p] += 1

    def release(self, pages) -> None:
        """One reference less to each page (each listed once); a page at 0 returns to the free list.
        All pages are checked before any count changes."""
        pages = self._check_pages(pages)
        for p in pages:
            if self._refs[p] == 0:
                raise ValueError(f"pages: page {p} is already free")
        for p in reversed(pages):
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def _check_pages(self, pages) -> list[int]:
        pages = [self._check_page(p) for p in pages]
        if len(set(pages)) != len(pages):
            dup = next(p for p in pages if pages.count(p) > 1)
            raise ValueError(f"pages: page {dup} is listed more than once; each page may appear once")
        return pages

    def _check_page(self, page) -> int:
        """``page`` as a Python int (NumPy's integers accepted), or ValueError unless in [0, num_pages)."""
        if isinstance(page, bool) or not isinstance(page, numbers.Integral) or not 0 <= page < self.num_pages:
            raise ValueError(f"page: expected an integer in [0, num_pages) = [0, {self.num_pages}), got {page!r}")
        return int(page)


# ------------------------------------------------------------------------------------ page tables
@dataclass(frozen=True)
class Slots:
    """Where new tokens go: physical pages and offsets, int64 tensors [n] (on the CPU)."""

    pages: torch.Tensor
    offsets: torch.Tensor

    def __len__(self) -> int:
        return len(self.pages)


class PageTables:
    """Per-sequence page tables over a BlockAllocator, with fork (shared pages) and copy-on-write."""

    def __init__(self, num_pages: int, page_size: int):
        page_size = _integer("page_size", page_size, 1)
        self.allocator = BlockAllocator(num_pages)
        self.page_size = page_size
        self.tables: dict = {}           # seq id -> list of page ids
        self.lengths: dict = {}          # seq id -> tokens stored
        self.prefix_cache: PrefixCache | None = None     # set by PrefixCache(self)

    # ---- queries
    @property
    def num_pages(self) -> int:
        return self.allocator.num_pages

    @property
    def pages_in_use(self) -> int:
        """Pages held by at least one sequence (a shared page counts once)."""
        return self.allocator.num_used

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free

    @property
    def num_available_pages(self) -> int:
        """Free pages plus cached pages that no sequence holds (evicted on demand)."""
        return self.allocator.num_free + (self.prefix_cache.num_evictable if self.prefix_cache else 0)

    @property
    def sequences(self) -> list:
        return list(self.tables)

    def length(self, seq_id) -> int:
        self._check_seq(seq_id)
        return self.lengths[seq_id]

    def pages_of(self, seq_id) -> list[int]:
        self._check_seq(seq_id)
        return list(self.tables[seq_id])

    def pages_needed(self, seq_id, n_tokens: int) -> int:
        """Fresh pages that appending n_tokens to seq_id takes (copy-on-write included)."""
        self._check_seq(seq_id)
        return self._plan(seq_id, n_tokens)[0]

    def slot(self, seq_id, position: int) -> tuple[int, int]:
        """(page, offset) of token ``position`` of the sequence."""
        self._check_seq(seq_id)
        if not 0 <= position < self.lengths[seq_id]:
            raise ValueError(f"position: {position} is outside sequence {seq_id!r} "
                             f"(length {self.lengths[seq_id]})")
        return self.tables[seq_id][position // self.page_size], position % self.page_size

    def block_table(self, seq_ids, device=None, width: int | None = None) -> torch.Tensor:
        """int32 [B, width] page tables of ``seq_ids`` (width = the longest table unless given),
        padded with 0; paged_decode never reads past a sequence's seq_len."""
        ids = self._check_ids(seq_ids)
        longest = max(1, max(len(self.tables[s]) for s in ids))
        width = longest if width is None else width
        if width < longest:
            raise ValueError(f"width: {width} is less than the longest page table ({longest} pages)")
        rows = [self.tables[s] + [0] * (width - len(self.tables[s])) for s in ids]
        return torch.tensor(rows, dtype=torch.int32, device=device)

    def seq_lens(self, seq_ids, device=None) -> torch.Tensor:
        """int32 [B] tokens stored for each of ``seq_ids``."""
        ids = self._check_ids(seq_ids)
        return torch.tensor([self.lengths[s] for s in ids], dtype=torch.int32, device=device)

    # ---- changes
    def add_sequence(self, seq_id) -> None:
        """A new, empty sequence (no pages until tokens are appended)."""
        if seq_id in self.tables:
            raise ValueError(f"seq_id: sequence {seq_id!r} already exists")
        self.tables[seq_id], self.lengths[seq_id] = [], 0

    def reserve(self, seq_id, n_tokens: int) -> Slots:
        """Room for n_tokens more tokens at the end of seq_id; returns their slots.

        Takes fresh pages as needed; if the last page is shared and partly filled, it is replaced by a
        private copy first (copy-on-write). All or nothing: OutOfPagesError leaves everything unchanged.
        """
        self._check_seq(seq_id)
        n_tokens = _integer("n_tokens", n_tokens)
        needed, cow = self._plan(seq_id, n_tokens)
        self._make_room(needed)                            # raises before evicting anything
        fresh = self.allocator.allocate(needed)
        table = self.tables[seq_id]
        if cow:
            new_page = fresh.pop(0)
            old_page = table[-1]
            self._copy_page(old_page, new_page)
            table[-1] = new_page
            self.allocator.release([old_page])
        table.extend(fresh)
        start = self.lengths[seq_id]
        positions = torch.arange(start, start + n_tokens)
        page_ids = torch.tensor(table, dtype=torch.int64)
        self.lengths[seq_id] = start + n_tokens
        return Slots(page_ids[positions // self.page_size] if n_tokens else positions,
                     positions % self.page_size)

    def reserve_many(self, seq_ids, n_tokens: int = 1) -> Slots:
        """``reserve(s, n_tokens)`` for each sequence (each id once), all or nothing; slots
        concatenated in order. Every id and the page count are checked before anything changes."""
        ids = self._check_ids(seq_ids)
        if len(set(ids)) != len(ids):
            dup = next(s for s in ids if ids.count(s) > 1)
            raise ValueError(f"seq_ids: sequence {dup!r} is listed more than once; each id may appear once")
        n_tokens = _integer("n_tokens", n_tokens)
        total = sum(self._plan(s, n_tokens)[0] for s in ids)
        self._make_room(total, f" for {len(ids)} sequences")          # raises before evicting anything
        parts = [self.reserve(s, n_tokens) for s in ids]
        return Slots(torch.cat([p.pages for p in parts]), torch.cat([p.offsets for p in parts]))

    def fork(self, src, dst) -> None:
        """New sequence dst sharing every page of src (no copy; each page's reference count + 1)."""
        self._check_seq(src)
        if dst in self.tables:
            raise ValueError(f"dst: sequence {dst!r} already exists")
        self.allocator.share(self.tables[src])
        self.tables[dst] = list(self.tables[src])
        self.lengths[dst] = self.lengths[src]

    def free(self, seq_id) -> None:
        """Forget seq_id; its pages lose one reference (pages no other sequence shares become free)."""
        self._check_seq(seq_id)
        self.allocator.release(self.tables.pop(seq_id))
        del self.lengths[seq_id]

    # ---- internals
    def _plan(self, seq_id, n_tokens: int) -> tuple[int, bool]:
        """(fresh pages needed, whether the last page must be copied first) for appending n_tokens."""
        n_tokens = _integer("n_tokens", n_tokens)
        table, length = self.tables[seq_id], self.lengths[seq_id]
        pages_after = -(-(length + n_tokens) // self.page_size)
        needed = pages_after - len(table)
        partly_filled = length % self.page_size != 0
        cow = (n_tokens > 0 and partly_filled and self.allocator.refcount(table[-1]) > 1)
        return needed + int(cow), cow

    def _make_room(self, pages: int, what: str = "") -> None:
        """Evict cached pages no sequence holds until ``pages`` are free; OutOfPagesError first, evicting
        nothing, when free and evictable pages together are fewer (an operation that raises changes nothing)."""
        if pages > self.num_available_pages:
            cached = self.num_available_pages - self.allocator.num_free
            raise OutOfPagesError(f"out of pages: {pages} needed{what}, {self.allocator.num_free} free"
                                  + (f" and {cached} evictable" if self.prefix_cache else "")
                                  + f" of {self.num_pages}")
        if self.prefix_cache and pages > self.allocator.num_free:
            self.prefix_cache.evict(pages - self.allocator.num_free)

    def _copy_page(self, src: int, dst: int) -> None:
        """Copy a page's contents (nothing to copy without storage)."""

    def _check_seq(self, seq_id) -> None:
        if seq_id not in self.tables:
            raise ValueError(f"seq_id: no sequence {seq_id!r} (add_sequence it first)")

    def _check_ids(self, seq_ids) -> list:
        ids = list(seq_ids)
        if not ids:
            raise ValueError("seq_ids: expected at least one sequence id")
        for s in ids:
            self._check_seq(s)
        return ids


# ---------------------------------------------------------------------------------- with storage
class PagedKVCache(PageTables):
    """PageTables plus K and V storage [num_layers, num_pages, page_size, Hkv, D] (see module doc)."""

    def __init__(self, num_pages: int, page_size: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype=torch.float16, device=None):
        super().__init__(num_pages, page_size)
        num_layers, num_kv_heads, head_dim = (_integer(name, value, 1) for name, value in (
            ("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)))
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim

    @property
    def bytes_per_page(self) -> int:
        """K and V bytes of one page over all layers."""
        return 2 * self.k[:, 0].numel() * self.k.element_size()

    def write(self, layer: int, slots: Slots, k, v) -> None:
        """Store k, v [n, Hkv, D] (one row per slot) into ``layer`` at ``slots`` (from reserve)."""
        if isinstance(layer, bool) or not isinstance(layer, numbers.Integral) or not 0 <= layer < self.num_layers:
            raise ValueError(f"layer: expected an integer in [0, {self.num_layers}), got {layer!r}")
        layer = int(layer)
        expected = (len(slots), self.num_kv_heads, self.head_dim)
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != expected:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected shape [n, Hkv, D] = {list(expected)}, got {got}")
        pages, offsets = slots.pages.to(self.k.device), slots.offsets.to(self.k.device)
        self.k[layer, pages, offsets] = k.to(self.k.dtype)
        self.v[layer, pages, offsets] = v.to(self.v.dtype)

    def append(self, seq_id, k, v) -> Slots:
        """Append tokens to seq_id in every layer: k, v [num_layers, n, Hkv, D]. Returns the slots."""
        if not isinstance(k, torch.Tensor) or k.dim() != 4 or k.shape[0] != self.num_layers:
            got = tuple(k.shape) if isinstance(k, torch.Tensor) else type(k).__name__
            raise ValueError(f"k: expected shape [num_layers={self.num_layers}, n, Hkv, D], got {got}")
        if not isinstance(v, torch.Tensor) or v.shape != k.shape:
            raise ValueError(f"v: expected the shape of k {tuple(k.shape)}")
        n = k.shape[1]
        if tuple(k.shape[2:]) != (self.num_kv_heads, self.head_dim):
            raise ValueError(f"k: expected [.., Hkv, D] = [{self.num_kv_heads}, {self.head_dim}], "
                             f"got {list(k.shape[2:])}")
        slots = self.reserve(seq_id, n)
        for layer in range(self.num_layers):
            self.write(layer, slots, k[layer], v[layer])
        return slots

    def gather(self, seq_id, layer: int):
        """The sequence's k, v [n, Hkv, D] of one layer, in token order (a copy; for checks)."""
        n = self.length(seq_id)
        positions = torch.arange(n)
        pages = torch.tensor(self.tables[seq_id], dtype=torch.int64)[positions // self.page_size]
        offsets = positions % self.page_size
        return self.k[layer, pages, offsets], self.v[layer, pages, offsets]

    def _copy_page(self, src: int, dst: int) -> None:
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]


# --------------------------------------------------------------------------------- prefix caching
MAX_TOKEN_ID = 2 ** 31 - 1          # a token id is hashed as 4 bytes


def _token_ids(token_ids) -> list[int]:
    """``token_ids`` as Python ints: each an integer (Python's, NumPy's or a 0-d integer tensor; no float,
    which would be truncated into a collision, no bool) in [0, 2**31)."""
    try:
        items = list(token_ids)
    except TypeError:
        raise ValueError(f"token_ids: expected a sequence of integers, got {type(token_ids).__name__}") from None
    ids = []
    for i, t in enumerate(items):
        try:
            value = None if isinstance(t, bool) else operator.index(t)
        except TypeError:
            value = None
        if value is None or not 0 <= value <= MAX_TOKEN_ID:
            raise ValueError(f"token_ids: token_ids[{i}] = {t!r}; each token id must be an integer in "
                             f"[0, 2**31)")
        ids.append(value)
    return ids

class PrefixCache:
    """Full pages kept for reuse, keyed by their tokens and the tokens before them (see module doc).

    ``match(seq_id, token_ids)``: an empty sequence takes the longest run of cached pages that starts
    its ``token_ids``; returns the tokens it got without computing them.
    ``register(seq_id, token_ids)``: the sequence's full pages (``token_ids`` are its stored tokens)
    are kept for later sequences.
    """

    def __init__(self, tables: PageTables):
        if not isinstance(tables, PageTables):
            raise ValueError(f"tables: expected PageTables (or a PagedKVCache), got {type(tables).__name__}")
        if tables.prefix_cache is not None:
            # a second cache would take over eviction, and the first one's pages would never be released
            raise ValueError("tables: already have a PrefixCache (one per set of page tables: its pages are "
                             "released only by its own evictions); use tables.prefix_cache")
        self.tables = tables
        self.allocator = tables.allocator
        self.page_of: OrderedDict[bytes, int] = OrderedDict()     # key -> page, least recently used first
        self.key_of: dict[int, bytes] = {}
        self.lookup_tokens = 0          # tokens asked for by match
        self.hit_tokens = 0             # tokens match found cached
        tables.prefix_cache = self

    def page_keys(self, token_ids) -> list[bytes]:
        """One key per full page of ``token_ids``: a hash of the page's tokens chained to the previous key."""
        ids = _token_ids(token_ids)
        keys, parent, size = [], b"", self.tables.page_size
        for start in range(0, len(ids) - size + 1, size):
            page = b"".join(t.to_bytes(4, "little") for t in ids[start:start + size])
            parent = hashlib.sha256(parent + page).digest()
            keys.append(parent)
        return keys

    @property
    def num_cached(self) -> int:
        return len(self.page_of)

    @property
    def num_evictable(self) -> int:
        """Cached pages held by no sequence (the cache's own reference only)."""
        return sum(self.allocator.refcount(p) == 1 for p in self.page_of.values())

    def match(self, seq_id, token_ids) -> int:
        self.tables._check_seq(seq_id)
        if self.tables.lengths[seq_id]:
            raise ValueError(f"seq_id: sequence {seq_id!r} is not empty; match a prefix before its first token")
        pages = []
        for key in self.page_keys(token_ids):
            if key not in self.page_of:
                break
            self.page_of.move_to_end(key)                       # recently used
            pages.append(self.page_of[key])
        self.allocator.share(pages)
        self.tables.tables[seq_id] = pages
        self.tables.lengths[seq_id] = len(pages) * self.tables.page_size
        self.lookup_tokens += len(token_ids)
        self.hit_tokens += self.tables.lengths[seq_id]
        return self.tables.lengths[seq_id]

    def uncount(self, looked_up: int, hit: int) -> None:
        """Take back a lookup whose pages were given back unused (its request could not start), so
        that the hit rate counts only the pages that saved computation."""
        self.lookup_tokens -= looked_up
        self.hit_tokens -= hit

    def register(self, seq_id, token_ids) -> None:
        self.tables._check_seq(seq_id)
        if len(token_ids) != self.tables.lengths[seq_id]:
            raise ValueError(f"token_ids: expected the sequence's {self.tables.lengths[seq_id]} stored tokens, "
                             f"got {len(token_ids)}")
        for key, page in zip(self.page_keys(token_ids), self.tables.tables[seq_id]):
            if key in self.page_of or page in self.key_of:
                continue                                        # kept already (this page or an equal one)
            self.allocator.share([page])
            self.page_of[key], self.key_of[page] = page, key

    def evict(self, n: int) -> int:
        """Release up to ``n`` least recently used cached pages that no sequence holds; returns how many."""
        victims = [k for k, p in self.page_of.items() if self.allocator.refcount(p) == 1][:n]
        for key in victims:
            page = self.page_of.pop(key)
            del self.key_of[page]
            self.allocator.release([page])
        return len(victims)


__all__ = ["BlockAllocator", "PageTables", "PagedKVCache", "PrefixCache", "Slots", "OutOfPagesError"]
