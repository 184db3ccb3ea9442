"""What the serving engine takes and gives back: a request, what it got, and the record of each step.

    Request(rid, prompt, max_new_tokens, arrival)     # a prompt and the step at which it arrives
    Completion                                        # its tokens, text, logits and the steps it ran
    WaitingQueue, WaitingSnapshot                     # the scheduler's queue, and its contents at one step
    StepRecord                                        # what one scheduler step did, and the cache after it
    ServeResult(completions, steps)                   # what ``Engine.run`` returns
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .tinymodel import TinyModel


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

    @property
    def entries(self) -> int:
        """How many times a request entered the queue: the length of its log, whatever its snapshots."""
        return len(self._log)


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
