"""Count what this process hands to torch.distributed: every call, its peer and the bytes this rank receives.

    with count_traffic() as log:
        o = ring_attention(q, k, v)
    received = sum(c.received for c in log if c.floating)

While the block runs, ``isend``, ``irecv``, ``send``, ``recv`` (also inside ``batch_isend_irecv``) and the
collectives ``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``,
``all_to_all``, ``all_to_all_single``, ``all_reduce``, ``broadcast``, ``gather``, ``scatter`` and
``all_gather_object`` are wrapped in this process; each call appends a ``Call`` and then runs the real one.

Bytes received per rank, for W ranks (the bandwidth-optimal algorithms, which NCCL's ring and gloo's
ring implementations follow):

- a receive: the buffer's bytes; a send: 0;
- all-gather: the W − 1 pieces that come from the others, (W − 1) × the input's bytes;
- reduce-scatter: the ring passes W − 1 partial sums of one output each, (W − 1) × the output's bytes;
- all-to-all: every output piece except the one from this rank;
- all-reduce: reduce-scatter then all-gather, 2 (W − 1)/W × the tensor's bytes;
- broadcast, gather, scatter, all_gather_object: recorded with the bytes of the tensors passed (the
  course's attention never calls them; a lab's check refuses them).

``on_call(call, tensors, sent)``, when given, runs before the real call with the tensors the call writes
into (its receive buffers) and, for a point-to-point send, the tensor it sends: a check can refuse a call,
judge the tensors' layouts or poison a receive buffer there (see ``attnkit.classroom.labchecks.lab10``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

P2P = ("isend", "irecv", "send", "recv")
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
               "all_to_all_single", "all_reduce", "broadcast", "gather", "scatter", "all_gather_object")


@dataclass(frozen=True)
class Call:
    """One torch.distributed call: its name, the peer (P2P only), bytes received here, the data's dtype."""
    op: str
    peer: int | None
    received: int
    dtype: torch.dtype | None

    @property
    def floating(self) -> bool:
        """A call that moves attention data (not the few integers of a shape check)."""
        return self.dtype is not None and self.dtype.is_floating_point


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _peer(name, args, kwargs):
    for key in ("dst", "src", "group_dst", "group_src"):
        if kwargs.get(key) is not None:
            return int(kwargs[key])
    return int(args[1]) if len(args) > 1 and isinstance(args[1], int) else None


def _describe(name, args, kwargs) -> tuple[Call, list]:
    """The Call for ``name(*args, **kwargs)`` and the tensors it writes into (its receive buffers)."""
    world = dist.get_world_size(kwargs.get("group"))
    first = args[0] if args else None
    if name in P2P:
        t = first
        received = _nbytes(t) if name in ("irecv", "recv") else 0
        return Call(name, _peer(name, args, kwargs), received, t.dtype), [t] if received else []
    if name == "all_gather":                        # (output list, input)
        outs, inp = first, args[1]
        return Call(name, None, (world - 1) * _nbytes(inp), inp.dtype), list(outs)
    if name == "all_gather_into_tensor":            # (output, input)
        return Call(name, None, (world - 1) * _nbytes(args[1]), args[1].dtype), [first]
    if name in ("reduce_scatter", "reduce_scatter_tensor"):   # (output, input list | input)
        return Call(name, None, (world - 1) * _nbytes(first), first.dtype), [first]
    if name == "all_to_all":                        # (output list, input list)
        rank = dist.get_rank(kwargs.get("group"))
        return Call(name, None, sum(_nbytes(t) for i, t in enumerate(first) if i != rank), first[0].dtype), list(first)
    if name == "all_to_all_single":                 # (output, input): equal splits assumed
        return Call(name, None, _nbytes(first) * (world - 1) // world, first.dtype), [first]
    if name == "all_reduce":
        return Call(name, None, 2 * (world - 1) * _nbytes(first) // world, first.dtype), [first]
    tensors = [t for t in (first if isinstance(first, (list, tuple)) else [first]) if isinstance(t, torch.Tensor)]
    return Call(name, None, sum(map(_nbytes, tensors)), tensors[0].dtype if tensors else None), tensors


@contextlib.contextmanager
def count_traffic(on_call=None):
    """A list that fills with one ``Call`` per torch.distributed call made in this process (see the module doc)."""
    log: list[Call] = []
    originals = {name: getattr(c10d, name) for name in P2P + COLLECTIVES if hasattr(c10d, name)}

    def wrap(name, fn):
        def wrapper(*args, **kwargs):
            call, buffers = _describe(name, args, kwargs)
            log.append(call)
            if on_call is not None:
                sent = [args[0]] if name in ("isend", "send") and args else []
                on_call(call, buffers, sent)
            return fn(*args, **kwargs)
        wrapper.__name__ = wrapper.__qualname__ = name
        return wrapper

    wrappers = {name: wrap(name, fn) for name, fn in originals.items()}
    # Both names: P2POp and batch_isend_irecv compare ``op`` with distributed_c10d's isend/irecv, and a
    # notebook calls torch.distributed's.
    try:
        for name, w in wrappers.items():
            setattr(c10d, name, w)
            setattr(dist, name, w)
        yield log
    finally:
        for name, fn in originals.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)


def received_bytes(log, *, floating_only: bool = True) -> int:
    """Bytes this rank received over the calls of ``log`` (attention data only by default)."""
    return sum(c.received for c in log if c.floating or not floating_only)


__all__ = ["Call", "count_traffic", "received_bytes", "P2P", "COLLECTIVES"]
