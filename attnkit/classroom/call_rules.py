"""The rules a check enforces while a student's function runs: course functions it may not call
(``forbidden_calls``), the memory it may allocate (``memory_peak``), and a stream it may read only once
(``OneShotStream``)."""
from __future__ import annotations

import tracemalloc
import types
from contextlib import contextmanager
from typing import Callable, Iterable, Sequence

import numpy as np


# ------------------------------------------------------------------ what a lesson claims about structure
class OneShotStream:
    """A stream of 1-D blocks that can be read once, like a generator: ``for block in stream``.

    Each block arrives in the same buffer, which the stream overwrites with the next block: keeping the
    blocks (``list(stream)``) keeps views of one buffer, and a second pass finds the stream exhausted.
    ``blocks`` holds the data, for the reference.
    """

    def __init__(self, blocks: Sequence[np.ndarray]):
        self.blocks = [np.array(b, dtype=np.float64).ravel() for b in blocks]
        self._next = 0
        self._buffer = np.empty(max((len(b) for b in self.blocks), default=0))

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        if self._next >= len(self.blocks):
            raise StopIteration
        block = self.blocks[self._next]
        self._next += 1
        view = self._buffer[:len(block)]
        view[:] = block
        return view

    def __repr__(self) -> str:
        return f"<a one-pass stream of {len(self.blocks)} blocks>"


class ForbiddenCall(Exception):
    """Raised by a course function that a student's answer may not call (see ``forbidden_calls``)."""


_FORBIDDEN: list[str] = []       # the forbidden functions called while a guard is on, in order


def _forbidden_body(*args, **kwargs):
    # Runs as the body of a forbidden function, with that function's globals: only builtins here.
    import sys as _sys

    from attnkit.classroom import call_rules as _rules
    return _rules._refuse(_sys._getframe().f_code.co_name)


def _refuse(name: str):
    _FORBIDDEN.append(name)
    raise ForbiddenCall(f"{name} is the course's own implementation: write this exercise yourself")


def module_functions(*modules) -> tuple[Callable, ...]:
    """The plain functions defined at the top level of ``modules`` (what ``forbidden_calls`` can guard)."""
    found = []
    for module in modules:
        for value in vars(module).values():
            if isinstance(value, types.FunctionType) and value.__module__ == module.__name__ \
                    and not value.__code__.co_freevars:
                found.append(value)
    return tuple(found)


@contextmanager
def forbidden_calls(functions: Iterable[Callable]):
    """While the block runs, each of ``functions`` raises ``ForbiddenCall`` when called, through any
    name a notebook imported it under; yields the list of the names called (also when the student's
    code caught the error)."""
    swapped, called = [], []
    start = len(_FORBIDDEN)
    try:
        for fn in dict.fromkeys(functions):          # each once, in order
            code = fn.__code__
            if code.co_freevars:
                raise ValueError(f"functions: {fn.__qualname__} is a closure; only module-level "
                                 f"functions can be forbidden")
            fn.__code__ = _forbidden_body.__code__.replace(co_name=fn.__name__, co_qualname=fn.__qualname__)
            swapped.append((fn, code))
        yield called
    finally:
        for fn, code in swapped:
            fn.__code__ = code
        called.extend(_FORBIDDEN[start:])
        del _FORBIDDEN[start:]


@contextmanager
def memory_peak():
    """Yields a one-item list that holds, after the block, the peak bytes allocated during it."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    peak = [0]
    try:
        yield peak
    finally:
        peak[0] = max(0, tracemalloc.get_traced_memory()[1] - base)
        if started:
            tracemalloc.stop()


def _megabytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
