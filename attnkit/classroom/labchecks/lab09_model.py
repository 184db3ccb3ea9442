"""Lab 09's model of the scheduler: the request state (``Seq``, ``StepPlan``, ``queue_order``), the rules
the checks hold a student's functions to (``reference_*``), the helpers that call a student's function
under the guard, and ``serve``, which runs a workload step by step on the ledger model. The checks
are in ``lab09``, which re-exports these names."""
from __future__ import annotations

import copy
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...serving.allocator import OutOfPagesError, PageTables
from ..checking import (
    FAILED,
    CheckResult,
    ForbiddenCall,
    forbidden_calls,
    module_functions,
    not_implemented,
)


# ------------------------------------------------------------------------------------------- the state
@dataclass
class Seq:
    """A request: its prompt tokens, how many it may generate, when it arrives, what it generated."""

    rid: int
    prompt: list
    max_new_tokens: int
    arrival: int = 0
    generated: list = field(default_factory=list)

    @property
    def tokens(self) -> list:
        """Every token the model has seen or produced: the prompt, then the generated ones."""
        return self.prompt + self.generated

    def __repr__(self) -> str:
        return (f"Seq(rid={self.rid}, {len(self.prompt)} prompt + {len(self.generated)} generated tokens, "
                f"arrival={self.arrival})")


@dataclass
class StepPlan:
    """What one scheduler step decided: who runs this step (admission order), who waits (queue order)."""

    running: list
    waiting: list
    admitted: list
    preempted: list


def queue_order(seq: Seq):
    """The waiting queue's order: by arrival, then request id."""
    return (seq.arrival, seq.rid)


# ------------------------------------------------------------------------------------- the rule itself
def reference_pages_needed(n_tokens: int, pages_held: int, page_size: int) -> int:
    return max(0, -(-n_tokens // page_size) - pages_held)


def reference_grow(running, pool):
    ps = pool.page_size
    kept, preempted = list(running), []

    def need():
        return sum(reference_pages_needed(len(s.tokens), len(pool.pages_of(s.rid)), ps) for s in kept)

    while kept and need() > pool.num_free_pages:
        victim = kept.pop()
        pool.free(victim.rid)
        preempted.append(victim)
    for s in kept:
        pool.reserve(s.rid, 1)
    return kept, preempted


def reference_admit(waiting, n_running, pool, max_batch):
    admitted = []
    for s in waiting:
        if n_running + len(admitted) >= max_batch:
            break
        if reference_pages_needed(len(s.tokens), 0, pool.page_size) > pool.num_free_pages:
            break
        pool.add_sequence(s.rid)
        pool.reserve(s.rid, len(s.tokens))
        admitted.append(s)
    return admitted


def reference_step(running, waiting, pool, max_batch) -> StepPlan:
    kept, preempted = reference_grow(running, pool)
    queue = sorted(list(waiting) + preempted, key=queue_order)
    admitted = reference_admit(queue, len(kept), pool, max_batch)
    return StepPlan(kept + admitted, [s for s in queue if s not in admitted], admitted, preempted)


# ---------------------------------------------------------------------------------------- helpers
def _seed(seed):
    return int(np.random.SeedSequence().entropy % 2**31) if seed is None else seed


def _failed(name, where, text, hint):
    return CheckResult(name, FAILED, f"❌ {name}: {where}: {text}\n   hint: {hint}")


# The modules whose functions refuse to run while a student's function does: this one (the rule itself) and
# lab09, which adds itself when it loads (so this module never imports the one above it).
GUARDED_MODULES: list = [sys.modules[__name__]]


def _guard():
    """While a student's function runs, the functions of lab09 and of this module (the rule itself) refuse to run;
    queue_order, the queue's sort key, is given to the student."""
    return forbidden_calls(f for f in module_functions(*GUARDED_MODULES) if f is not queue_order)


def _call(name, fn, args, where, hint, guard: bool = True):
    """(result, None) or (None, CheckResult) for a raise; NotImplementedError → not implemented."""
    try:
        with _guard() if guard else nullcontext():
            return fn(*args), None
    except NotImplementedError:
        return None, not_implemented(name)
    except ForbiddenCall as exc:
        return None, _failed(name, where, str(exc), hint)
    except ServeError as exc:
        return None, _failed(name, where, str(exc), hint)
    except OutOfPagesError as exc:
        return None, _failed(name, where, f"the pool ran out of pages ({exc}): something asked for pages "
                                          f"the budget does not have", hint)
    except Exception as exc:
        return None, _failed(name, where, f"your function raised {type(exc).__name__}: {exc}", hint)


def _pool_state(pool) -> dict:
    """rid -> (tokens held, pages held), plus the free page count."""
    return {"sequences": {rid: (pool.length(rid), len(pool.pages_of(rid))) for rid in sorted(pool.sequences)},
            "free pages": pool.num_free_pages}


def _clone(pool: PageTables) -> PageTables:
    """A copy of a pool's bookkeeping (no storage), for running the rule beside the student's step."""
    twin = PageTables(pool.num_pages, pool.page_size)
    twin.allocator._free = list(pool.allocator._free)
    twin.allocator._refs = list(pool.allocator._refs)
    twin.tables = {rid: list(t) for rid, t in pool.tables.items()}
    twin.lengths = dict(pool.lengths)
    return twin


def _rids(seqs) -> list:
    return [s.rid for s in seqs]


def _differences(expected: dict, found: dict) -> str:
    lines = []
    for key in expected:
        if expected[key] != found.get(key):
            lines.append(f"\n   {key}: expected {expected[key]}, got {found.get(key)}")
    return "differs from the rule (sequences: rid -> (tokens, pages)):" + "".join(lines)


# ------------------------------------------------------------------------------- the ledger model
LEDGER_VOCAB = 50


def ledger_next(tokens) -> int:
    """The ledger model's next token: a function of every token of the sequence and its position."""
    return (sum((i + 1) * (t + 1) for i, t in enumerate(tokens)) * 7 + len(tokens)) % LEDGER_VOCAB


def ledger_no_cache(prompt, max_new_tokens) -> list:
    """The ledger model run without a cache: each token from the whole true sequence."""
    seq = list(prompt)
    for _ in range(max_new_tokens):
        seq.append(ledger_next(seq))
    return seq[len(prompt):]


class ServeError(Exception):
    """A scheduler step left the pool or the queues in a state the rule forbids."""


HINT_INPUTS = ("work on new lists (kept = list(running); queue = sorted(waiting + preempted, key=queue_order)) "
               "and leave the lists and requests you are given as they were: the caller still holds them.")


class _Inputs:
    """The caller's lists of requests as they were before a call, to report any change the call made to them
    (the lab: leave the lists you are given as they were). A class, not a function: the guard that refuses
    this module's functions during a student's call leaves it working."""

    FIELDS = ("rid", "prompt", "generated", "arrival", "max_new_tokens")

    def __init__(self, **lists):
        self.lists = lists
        self.before = {name: self.state(items) for name, items in lists.items()}

    @classmethod
    def state(cls, items) -> list:
        out = []
        for s in list(items):
            values = tuple(list(v) if isinstance(v, list) else v
                           for v in (getattr(s, f, None) for f in cls.FIELDS))
            out.append((id(s), values))
        return out

    @staticmethod
    def same(a, b) -> bool:
        """a == b as one bool; False where the comparison has no single answer (an array put in a field)."""
        try:
            return type(a) is type(b) and bool(a == b)
        except Exception:
            return False

    @staticmethod
    def rid_list(state) -> list:
        return [values[0] for _, values in state]

    def changed(self) -> str | None:
        """None when every list holds the same requests in the same order, each unchanged; else the change."""
        for name, items in self.lists.items():
            before, after = self.before[name], self.state(items)
            if [i for i, _ in before] != [i for i, _ in after]:
                return (f"your function changed the caller's `{name}` list: rids {self.rid_list(before)} before "
                        f"the call, {self.rid_list(after)} after it")
            for (_, old), (_, new) in zip(before, after):
                fields = [f"{f}: {a!r} -> {b!r}" for f, a, b in zip(self.FIELDS, old, new) if not self.same(a, b)]
                if fields:
                    return (f"your function changed request {old[0]} of the caller's `{name}` list "
                            f"({'; '.join(fields)})")
        return None


class _WatchedStep:
    """A student's scheduler_step as serve calls it: `waiting` handed over in an order drawn from ``rng`` (the
    step sorts the queue itself), and a change to the caller's lists reported as a ServeError."""

    def __init__(self, scheduler_step, rng):
        self.scheduler_step, self.rng, self.calls = scheduler_step, rng, 0

    def __call__(self, running, waiting, pool, max_batch):
        step, self.calls = self.calls, self.calls + 1
        waiting = [waiting[i] for i in self.rng.permutation(len(waiting))]
        given = ", ".join(f"rid {s.rid} (arrival {s.arrival})" for s in waiting)
        watch = _Inputs(running=running, waiting=waiting)
        plan = self.scheduler_step(running, waiting, pool, max_batch)
        changed = watch.changed()
        if changed is not None:
            raise ServeError(f"step {step} (waiting given as [{given}]): {changed}. {HINT_INPUTS}")
        return plan


@dataclass
class ServeRecord:
    """What a served workload did, step by step, and what each request generated."""

    steps: list = field(default_factory=list)       # (step, running rids, admitted, preempted, waiting)
    generated: dict = field(default_factory=dict)   # rid -> tokens
    recomputed_tokens: int = 0                       # tokens prefilled again after a preemption
    pages_in_use: list = field(default_factory=list)

    @property
    def preemptions(self) -> int:
        return sum(len(s[3]) for s in self.steps)

    @property
    def tokens_generated(self) -> int:
        return sum(len(t) for t in self.generated.values())


def _validate(plan, before_rids, pool, max_batch, step) -> None:
    if not isinstance(plan, StepPlan):
        raise ServeError(f"step {step}: expected a StepPlan, got {type(plan).__name__}")
    rids = _rids(plan.running) + _rids(plan.waiting)
    if sorted(rids) != sorted(before_rids) or len(set(rids)) != len(rids):
        raise ServeError(f"step {step}: every request that was running or waiting must be in exactly one of "
                         f"plan.running, plan.waiting (before: {sorted(before_rids)}; running "
                         f"{_rids(plan.running)}, waiting {_rids(plan.waiting)})")
    if len(plan.running) > max_batch:
        raise ServeError(f"step {step}: {len(plan.running)} requests running, more than max_batch={max_batch}")
    holders = sorted(pool.sequences, key=str)
    if sorted(_rids(plan.running)) != sorted(holders):
        raise ServeError(f"step {step}: the pool holds pages for {holders} but the running requests are "
                         f"{_rids(plan.running)} (a waiting or preempted request must hold no pages)")
    for s in plan.running:
        n, pages = pool.length(s.rid), len(pool.pages_of(s.rid))
        if n != len(s.tokens):
            raise ServeError(f"step {step}: request {s.rid} has room for {n} tokens in the pool but has "
                             f"{len(s.tokens)} tokens, all of which this step caches (a resumed request is "
                             f"recomputed: prompt and generated tokens)")
        if pages != -(-n // pool.page_size):
            raise ServeError(f"step {step}: request {s.rid} holds {pages} pages for {n} tokens "
                             f"(page_size {pool.page_size}); it should hold {-(-n // pool.page_size)}")


def serve(scheduler_step: Callable, requests, *, num_pages: int, page_size: int, max_batch: int,
          model=None, compare_rule: bool = False, guard: bool = False, max_steps: int = 500) -> ServeRecord:
    """Run ``requests`` (Seq objects, nothing generated yet) to completion with ``scheduler_step``.

    Each step: requests arriving now join the waiting queue; ``scheduler_step(running, waiting, pool,
    max_batch)`` returns a StepPlan; every running request then computes one new token: an admitted one
    from all its tokens (prefill), the others from their newest token and their cache (decode); a
    request that reached max_new_tokens leaves and its pages are freed. ``model=None`` runs the ledger
    model; a TinyModel runs the real one over a PagedKVCache. ``compare_rule`` compares every plan with
    ``reference_step`` on a copy of the same state; ``guard`` refuses this module's functions while
    ``scheduler_step`` runs. Raises ServeError when a step breaks the rule.
    """
    pending = sorted((copy.deepcopy(r) for r in requests), key=queue_order)
    runner = _Ledger(num_pages, page_size) if model is None else _TinyRunner(model, num_pages, page_size)
    pool = runner.pool
    running, waiting, record = [], [], ServeRecord()
    for step in range(max_steps):
        waiting += [r for r in pending if r.arrival == step]
        waiting.sort(key=queue_order)
        pending = [r for r in pending if r.arrival > step]
        if not (running or waiting or pending):
            return record
        before = _rids(running) + _rids(waiting)
        if compare_rule:
            ref_pool = _clone(pool)
            ref_plan = reference_step(list(running), list(waiting), ref_pool, max_batch)
        with _guard() if guard else nullcontext():
            plan = scheduler_step(list(running), list(waiting), pool, max_batch)
        _validate(plan, before, pool, max_batch, step)
        if compare_rule:
            got = {name: _rids(getattr(plan, name)) for name in ("running", "waiting", "admitted")}
            want = {name: _rids(getattr(ref_plan, name)) for name in ("running", "waiting", "admitted")}
            got["preempted"], want["preempted"] = sorted(_rids(plan.preempted)), sorted(_rids(ref_plan.preempted))
            got.update(_pool_state(pool))
            want.update(_pool_state(ref_pool))
            if got != want:
                raise ServeError(f"step {step}: " + _differences(want, got))
        admitted = {s.rid for s in plan.admitted}
        record.recomputed_tokens += sum(len(s.generated) for s in plan.admitted)
        new_tokens = runner.step(plan.running, admitted, step)
        for s, token in zip(plan.running, new_tokens):
            s.generated.append(token)
        running, waiting = [], list(plan.waiting)
        for s in plan.running:
            if len(s.generated) >= s.max_new_tokens:
                record.generated[s.rid] = list(s.generated)
                pool.free(s.rid)
            else:
                running.append(s)
        record.steps.append((step, _rids(plan.running), _rids(plan.admitted), _rids(plan.preempted),
                             _rids(plan.waiting)))
        record.pages_in_use.append(pool.pages_in_use)
    raise ServeError(f"the workload did not finish in {max_steps} steps")


class _Ledger:
    """The ledger model: the cache stores (rid, position, token) at each slot, read back through the table."""

    def __init__(self, num_pages, page_size):
        self.pool = PageTables(num_pages, page_size)
        self.slots = {}

    def step(self, running, admitted, step):
        out = []
        for s in running:
            tokens = s.tokens
            first = 0 if s.rid in admitted else len(tokens) - 1
            for pos in range(first, len(tokens)):
                self.slots[self.pool.slot(s.rid, pos)] = (s.rid, pos, tokens[pos])
            seen = []
            for pos in range(len(tokens)):
                rid, at, token = self.slots.get(self.pool.slot(s.rid, pos), (None, None, None))
                if (rid, at) != (s.rid, pos):
                    raise ServeError(f"step {step}: request {s.rid} reads position {pos} of its cache and finds "
                                     f"{'nothing' if rid is None else f'request {rid} position {at}'}: "
                                     f"its cache was not {'recomputed' if s.generated else 'written'} (was it "
                                     f"admitted again without being listed in plan.admitted?)")
                seen.append(token)
            out.append(ledger_next(seen))
        return out


class _TinyRunner:
    """The tiny model over a PagedKVCache: prefill for admitted requests, batched paged decode for the rest."""

    def __init__(self, model, num_pages, page_size):
        from ...serving.allocator import PagedKVCache

        self.model, cfg = model, model.cfg
        self.pool = PagedKVCache(num_pages, page_size, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim,
                                 dtype=next(model.parameters()).dtype)

    def _slots(self, rid, positions):
        import torch

        from ...serving.allocator import Slots

        where = [self.pool.slot(rid, p) for p in positions]
        return Slots(torch.tensor([w[0] for w in where]), torch.tensor([w[1] for w in where]))

    def step(self, running, admitted, step):
        import torch

        from ...serving.engine import paged_decode_torch
        from ...serving.tinymodel import causal_attention_torch

        out = {}
        with torch.no_grad():
            for s in running:
                if s.rid not in admitted:
                    continue
                n = len(s.tokens)
                slots = self._slots(s.rid, range(n))
                x = self.model.embed(torch.tensor([s.tokens]))
                positions = torch.arange(n)[None]
                for layer, block in enumerate(self.model.blocks):
                    q, k, v = block.project_qkv(x, positions)
                    self.pool.write(layer, slots, k[0].transpose(0, 1), v[0].transpose(0, 1))
                    x = block.finish(x, causal_attention_torch(q, k, v))
                out[s.rid] = int(self.model.logits(x[0, -1]).argmax())
            decoding = [s for s in running if s.rid not in admitted]
            if decoding:
                ids = [s.rid for s in decoding]
                pos = torch.tensor([len(s.tokens) - 1 for s in decoding])
                parts = [self._slots(s.rid, [len(s.tokens) - 1]) for s in decoding]
                from ...serving.allocator import Slots

                slots = Slots(torch.cat([p.pages for p in parts]), torch.cat([p.offsets for p in parts]))
                table = self.pool.block_table(ids)
                x = self.model.embed(torch.tensor([s.tokens[-1] for s in decoding])[:, None])
                for layer, block in enumerate(self.model.blocks):
                    q, k, v = block.project_qkv(x, pos[:, None])
                    self.pool.write(layer, slots, k[:, :, 0], v[:, :, 0])
                    attn = paged_decode_torch(q[:, :, 0].contiguous(), self.pool.k[layer], self.pool.v[layer],
                                              table, (pos + 1).to(torch.int32))
                    x = block.finish(x, attn[:, :, None])
                for s, row in zip(decoding, self.model.logits(x[:, 0])):
                    out[s.rid] = int(row.argmax())
        return [out[s.rid] for s in running]
