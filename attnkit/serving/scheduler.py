"""Continuous batching: which requests decode, which prefill (in chunks) and which retire at each step.

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

The scheduler runs on the host; it calls the engine's model passes (``Engine.decode`` and
``Engine.prefill_chunks``) and reads the step's logits back once per pass, to choose the tokens (greedy).
"""
from __future__ import annotations

import math
import time

import torch

from .request import Completion, Request, ServeResult, StepRecord, WaitingQueue


class Scheduler:
    """One run of continuous batching over ``engine``'s paged cache (see the module docstring):
    ``Scheduler(engine, requests, max_tokens_per_step).run()`` serves every request to completion and
    records each step. ``Engine.run`` checks the requests and makes one scheduler per run."""

    def __init__(self, engine, requests: list[Request], max_tokens_per_step: int | None = None):
        self.engine, self.cache, self.prefix = engine, engine.cache, engine.prefix
        self.budget_per_step = int(max_tokens_per_step) if max_tokens_per_step else math.inf
        self.future = [Completion(r, engine.model.encode(r.prompt))
                       for r in sorted(requests, key=lambda r: (r.arrival, r.rid))]
        self.queue = WaitingQueue()                           # arrived, not running
        self.running: list[Completion] = []                   # admission order
        self.done: dict[int, Completion] = {}
        self.steps: list[StepRecord] = []
        self.step = 0

    def run(self) -> ServeResult:
        """Steps until every request is retired: arrivals, decode, prefill chunks, retire, record."""
        started = time.perf_counter()
        while self.future or self.queue or self.running:
            self.arrive()
            decoding, preempted = self.decode_cached()
            prefilled, chunk_tokens = self.prefill(self.budget_per_step - len(decoding), decoding, preempted)
            finished = self.retire()
            self.steps.append(StepRecord(
                self.step, self.queue.snapshot(),
                tuple(c.request.rid for c in prefilled), tuple(c.request.rid for c in decoding),
                tuple(c.request.rid for c in finished), self.cache.pages_in_use,
                sum(self.cache.lengths.values()), tuple(c.request.rid for c in preempted), chunk_tokens,
                time.perf_counter() - started))
            self.step += 1
        return ServeResult(dict(sorted(self.done.items())), self.steps)

    # -------------------------------------------------------------- the parts of a step
    def arrive(self) -> None:
        """Requests whose arrival step has come join the queue; when idle, the clock jumps to the next."""
        future = self.future
        if not self.queue and not self.running and future[0].request.arrival > self.step:
            self.step = future[0].request.arrival                       # idle: the clock jumps
        while future and future[0].request.arrival <= self.step:
            self.queue.append(future.pop(0))

    def decode_cached(self) -> tuple[list, list]:
        """1. One token for every request whose context is cached, in one batched decode; pages for
        their new tokens first, preempting while pages lack. Returns (decoded, preempted)."""
        decoding = [c for c in self.running if c.tokens and c.cached == len(c.context) - 1]
        preempted = self._grow(decoding)
        if decoding:
            ids = [c.request.rid for c in decoding]
            positions = [len(c.context) - 1 for c in decoding]
            slots = self.cache.reserve_many(ids, 1)
            logits = self.engine.decode(torch.tensor([c.tokens[-1] for c in decoding]), torch.tensor(positions),
                                        self.cache.block_table(ids), slots)   # host tensors: one copy in
            for c, row in zip(decoding, logits.float().cpu()):                # the step's one read-back
                c.cached += 1
                self._emit(c, row)
                self._keep_pages(c)
        return decoding, preempted

    def prefill(self, budget, decoding: list, preempted: list) -> tuple[list, int]:
        """2. Prefill chunks within ``budget`` tokens: requests part-way through first, then admissions;
        every chunk of the step in one model pass. Returns (prefilled, tokens prefilled)."""
        prefilled, chunks, slots, chunk_tokens = [], [], [], 0
        candidates = [c for c in self.running if c not in decoding]
        while budget > 0:
            if candidates:
                c = candidates.pop(0)
            elif self.queue and not preempted and len(self.running) < self.engine.max_batch:
                c = self.queue[0]
            else:
                break
            n = self._chunk_length(c, budget)
            if n == 0:
                break                                                   # no free page: wait for one
            if c not in self.running:
                n = self._admit(c, n, budget)
                if n == 0:
                    break
            chunks.append((c.request.rid, c.context[c.cached:c.cached + n], c.cached))
            slots.append(self.cache.reserve(c.request.rid, n))
            c.cached += n
            budget -= n
            chunk_tokens += n
            prefilled.append(c)
        if chunks:                                                      # every chunk of the step in one pass
            for c, logits in zip(prefilled, self.engine.prefill_chunks(chunks, slots).float().cpu()):
                self._keep_pages(c)
                if c.cached == len(c.context):                          # the whole context: the next token
                    self._emit(c, logits)
        return prefilled, chunk_tokens

    def retire(self) -> list:
        """3. Requests that produced their stop token or their last token leave; their pages are freed."""
        finished = [c for c in self.running if c.tokens and c.cached == len(c.context) - 1 and self._done(c)]
        for c in finished:
            self.running.remove(c)
            c.pages = self.cache.pages_of(c.request.rid)
            self.cache.free(c.request.rid)
            c.finished, c.text, c.finish_reason = self.step, self.engine.model.decode(c.tokens), self._done(c)
            self.done[c.request.rid] = c
        return finished

    # -------------------------------------------------------------- helpers
    def _admit(self, c: Completion, n: int, budget) -> int:
        """Admit ``c`` from the queue; with prefix caching its cached pages come first, and at least one
        token is left to compute. Returns the length of its first chunk; 0 if no page is left for it
        (then it is not admitted: back to the front of the queue, its lookup not counted)."""
        self.queue.remove(c)
        self.cache.add_sequence(c.request.rid)
        self.running.append(c)
        if self.prefix:
            c.cached = self.prefix.match(c.request.rid, c.context[:-1])
            n = self._chunk_length(c, budget)
            if n == 0:
                self.running.remove(c)
                self.cache.free(c.request.rid)                          # the matched pages stay in the prefix cache
                self.prefix.uncount(len(c.context) - 1, c.cached)
                c.cached = 0
                self.queue.insert_front(c)
                return 0
            c.reused += c.cached
        c.admitted = self.step if c.admitted < 0 else c.admitted
        return n

    def _chunk_length(self, c: Completion, budget) -> int:
        """Tokens of ``c``'s context to prefill now: what is left, within the budget and the free pages."""
        return int(min(len(c.context) - c.cached, budget, self._room(c)))

    def _emit(self, c: Completion, logits: torch.Tensor) -> None:
        """``c``'s next token, chosen from ``logits`` [vocab] (already on the host)."""
        c.logits.append(logits)
        c.tokens.append(int(logits.argmax()))
        if c.first_token < 0:
            c.first_token = self.step

    def _done(self, c: Completion) -> str:
        """Why ``c`` is finished ("stop", "length"), or "" while it goes on."""
        if c.tokens[-1] == self.engine.stop_token:
            return "stop"
        return "length" if len(c.tokens) == c.request.max_new_tokens else ""

    def _preempt(self, c: Completion) -> None:
        """Take ``c``'s pages back; it waits at the front of the queue and recomputes its context later."""
        self.running.remove(c)
        self.cache.free(c.request.rid)
        c.cached, c.preemptions = 0, c.preemptions + 1
        self.queue.insert_front(c)

    def _grow(self, decoding: list) -> list:
        """A slot for each decoding request's next token; preempts the latest admitted while pages lack.
        Returns the requests preempted."""
        preempted = []
        while decoding:
            need = sum(self.cache.pages_needed(c.request.rid, 1) for c in decoding)
            if need <= self.cache.num_available_pages:
                return preempted
            victim = self.running[-1]                                   # the most recently admitted
            self._preempt(victim)
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
        return (held + self.cache.num_available_pages) * self.engine.page_size - c.cached
