"""Calls of the student's code, recorded in the student's process and replayed in the checker's.

The lab's check runs in both processes with the same secret seed. In the student's process (after the
notebook's code has loaded) every call of a student's function is made for real and *recorded*: a digest
of the call (the name and every byte of its arguments), what it returned or raised, and the state of its
arguments afterwards (buffers it wrote into), all as plain data (``codec``). In the checker's process the
same check runs, and each call of the student's function is *answered* from the record whose digest
matches: the arguments get the recorded contents back, the result is decoded, a raise is raised again.
No code of the student's runs in the checker, and the checker computes its verdict from its own
references; a record that does not match a call the checker makes answers nothing (the call fails).

The student's process sees exactly what the checker will see: its check gets the decoded copy of each
result, not the object itself. An object of the student's own class stays in the student's process and
crosses as a handle; each use of it (attribute, call, ``len``, iteration, comparison) is one more
recorded call.
"""
from __future__ import annotations

import sys

from . import codec


class _Remote:
    """A stand-in for one of the student's objects: every use is a call named after the handle."""

    __slots__ = ("_handle",)

    def __init__(self, handle: int):
        object.__setattr__(self, "_handle", handle)

    def _op(self, op: str, *args):
        raise NotImplementedError

    def __getattr__(self, name):
        return self._op("getattr", name)

    def __setattr__(self, name, value):
        self._op("setattr", name, value)

    def __call__(self, *args, **kwargs):
        return self._op("call", args, kwargs)

    def __iter__(self):
        return self._op("iter")

    def __next__(self):
        value = self._op("next")
        if value is _STOP:
            raise StopIteration
        return value

    def __len__(self):
        value = self._op("len")
        return value if type(value) is int and value >= 0 else 0

    def __getitem__(self, key):
        return self._op("getitem", key)

    def __setitem__(self, key, value):
        self._op("setitem", key, value)

    def __contains__(self, item):
        return self._op("contains", item) is True

    def __bool__(self):
        return self._op("bool") is True

    def __eq__(self, other):
        return self._op("eq", other) is True

    def __hash__(self):
        value = self._op("hash")
        return value if type(value) is int else 0

    def __repr__(self):
        value = self._op("repr")
        return value[:2000] if type(value) is str else "<object>"


_STOP = ("__stop_iteration__",)       # what `next` records at the end of an iterator


def _perform(target, op: str, args):
    """The operation ``op`` of ``_Remote`` on the real object (in the student's process)."""
    if op == "getattr":
        return getattr(target, args[0])
    if op == "setattr":
        return setattr(target, args[0], args[1])
    if op == "call":
        return target(*args[0], **args[1])
    if op == "next":
        try:
            return next(target)
        except StopIteration:
            return _STOP
    simple = {"iter": iter, "len": len, "bool": bool, "hash": hash, "repr": repr}
    if op in simple:
        return simple[op](target)
    if op == "getitem":
        return target[args[0]]
    if op == "setitem":
        target[args[0]] = args[1]
        return None
    if op == "contains":
        return args[0] in target
    if op == "eq":
        return target == args[0]
    raise ValueError(f"op: unknown operation {op!r}")


def _holds_remote(value, depth: int = 0) -> bool:
    if isinstance(value, _Remote):
        return True
    if depth < 40 and type(value) in (tuple, list):
        return any(_holds_remote(v, depth + 1) for v in value)
    if depth < 40 and type(value) is dict:
        return any(_holds_remote(v, depth + 1) for v in value.values())
    return False


def _handle_of(value):
    return object.__getattribute__(value, "_handle") if isinstance(value, _Remote) else None


# --------------------------------------------------------------------------------- the student's side
class Recorder:
    """In the student's process: makes the calls, sends each record, hands the check decoded copies."""

    def __init__(self, send):
        self.send = send
        self.objects: dict[int, object] = {}     # handle -> the student's object
        self.handles: dict[int, int] = {}        # id(object) -> handle
        self.counts: dict[str, int] = {}

    def handle(self, value) -> int:
        existing = _handle_of(value)
        if existing is not None:
            return existing
        if id(value) not in self.handles:
            number = len(self.objects) + 1
            self.objects[number] = value
            self.handles[id(value)] = number
        return self.handles[id(value)]

    def proxy(self, number: int):
        if number not in self.objects:
            raise codec.CodecError(f"no object has handle {number}")
        return RecordingProxy(number, self)

    def unwrap(self, value, depth: int = 0):
        """``value`` with each stand-in replaced by the student's object it stands for (the same
        containers where they hold none, so that a function that appends to a list is seen doing it)."""
        if not _holds_remote(value):
            return value
        number = _handle_of(value)
        if number is not None:
            return self.objects[number]
        if depth < 40 and type(value) in (tuple, list):
            return type(value)(self.unwrap(v, depth + 1) for v in value)
        if depth < 40 and type(value) is dict:
            return {k: self.unwrap(v, depth + 1) for k, v in value.items()}
        return value

    def call(self, name: str, fn, args, kwargs):
        digest, shape = codec.keys(name, args, kwargs, _handle_of)
        n, m = _count(self.counts, digest), _count(self.counts, "shape:" + shape)
        saved = _random_state()
        try:
            result, error = fn(*self.unwrap(args), **self.unwrap(kwargs)), None
        except BaseException as exc:  # noqa: BLE001 - recorded, then raised again as the checker will see it
            result, error = None, exc
        finally:
            _restore_random_state(saved)
        frame = {"kind": "call", "key": digest, "n": n, "shape": shape, "m": m, "name": name[:200],
                 "after": _packed((args, kwargs), self.handle)}
        if error is not None:
            from ..checking import student_error

            frame["raised"] = codec.encode_exception(student_error(error))
        else:
            try:
                frame["returned"] = _packed(result, self.handle, codec.ArgumentRefs(args, kwargs))
            except codec.CodecError as exc:
                frame["raised"] = codec.encode_exception(TypeError(f"{name} returned a value that cannot be "
                                                                   f"graded: {exc}"))
        self.send(frame)
        return answer(frame, args, kwargs, self.proxy)

    def wrap(self, name: str, fn):
        recorder = self

        def call(*args, **kwargs):
            return recorder.call(name, fn, args, kwargs)
        call.__name__ = call.__qualname__ = name
        return call


class RecordingProxy(_Remote):
    __slots__ = ("_recorder",)

    def __init__(self, handle: int, recorder: Recorder):
        super().__init__(handle)
        object.__setattr__(self, "_recorder", recorder)

    def _op(self, op: str, *args):
        number = object.__getattribute__(self, "_handle")
        recorder = object.__getattribute__(self, "_recorder")
        target = recorder.objects[number]
        return recorder.call(f"#{number}.{op}", lambda *a: _perform(target, op, a), args, {})


def _packed(value, handle, refs=None) -> dict:
    tree, blobs = codec.encode(value, handle, refs)
    return codec.pack(tree, blobs)


def _random_state():
    """The global random generators' states: a student's function that draws from them must not move
    the check's later draws (the checker's process does not run it)."""
    import random

    import numpy as np

    torch = sys.modules.get("torch")
    state = [random.getstate(), np.random.get_state(), None, None]
    if torch is not None:
        state[2] = torch.random.get_rng_state()
        try:
            state[3] = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        except Exception:  # noqa: BLE001 - no CUDA
            state[3] = None
    return state


def _restore_random_state(state) -> None:
    import random

    import numpy as np

    random.setstate(state[0])
    np.random.set_state(state[1])
    torch = sys.modules.get("torch")
    if torch is not None and state[2] is not None:
        torch.random.set_rng_state(state[2])
        if state[3] is not None:
            torch.cuda.set_rng_state_all(state[3])


# --------------------------------------------------------------------------------------- both sides
def answer(frame: dict, args, kwargs, make_handle):
    """What a call returns in the check, from its record: the arguments get their recorded contents,
    then the recorded result is returned or the recorded exception raised."""
    tree, blobs = codec.unpack(frame.get("after"))
    after = codec.decode(tree, blobs, make_handle)
    if type(after) is tuple and len(after) == 2:
        assign(args, after[0])
        assign(kwargs, after[1])
    if "raised" in frame:
        raise codec.decode_exception(frame["raised"])
    tree, blobs = codec.unpack(frame.get("returned"))
    value = codec.decode(tree, blobs, make_handle, codec.ArgumentRefs(args, kwargs))
    return _STOP if type(value) is tuple and len(value) == 1 and type(value[0]) is str and value[0] == _STOP[0] \
        else value


def _count(counts: dict, key: str) -> int:
    """How many calls had ``key`` before this one (and count this one)."""
    n = counts.get(key, 0)
    counts[key] = n + 1
    return n


def assign(target, new, depth: int = 0) -> None:
    """Give ``target`` (an argument of the check's) the contents ``new`` (its recorded state after the
    call), in place: arrays and tensors whole buffers, lists, dicts and the course's objects item by item."""
    if depth > 40 or target is new:
        return
    import numpy as np

    torch = sys.modules.get("torch")
    if isinstance(target, np.ndarray) and isinstance(new, np.ndarray):
        _assign_array(target, new)
    elif torch is not None and isinstance(target, torch.Tensor) and isinstance(new, torch.Tensor):
        _assign_tensor(torch, target, new)
    elif type(target) is list and type(new) is list:
        if len(target) == len(new):
            for i, (a, b) in enumerate(zip(target, new)):
                if _mutable(a) and type(a) is type(b):
                    assign(a, b, depth + 1)
                elif not isinstance(b, _Remote) or isinstance(a, _Remote):
                    target[i] = b
        else:
            target[:] = new
    elif type(target) is tuple and type(new) is tuple and len(target) == len(new):
        for a, b in zip(target, new):
            assign(a, b, depth + 1)
    elif type(target) is dict and type(new) is dict:
        for k in [k for k in target if k not in new]:
            del target[k]
        for k, b in new.items():
            if k in target and _mutable(target[k]) and type(target[k]) is type(b):
                assign(target[k], b, depth + 1)
            else:
                target[k] = b
    elif type(target) is type(new) and codec._course_name(type(target).__module__) and hasattr(new, "__dict__"):
        for k, b in vars(new).items():
            a = vars(target).get(k, _MISSING) if hasattr(target, "__dict__") else _MISSING
            if a is not _MISSING and _mutable(a) and type(a) is type(b):
                assign(a, b, depth + 1)
            else:
                object.__setattr__(target, k, b)


_MISSING = object()


def _mutable(value) -> bool:
    import numpy as np

    torch = sys.modules.get("torch")
    return type(value) in (list, dict, tuple) or isinstance(value, np.ndarray) or \
        (torch is not None and isinstance(value, torch.Tensor)) or \
        (codec._course_name(type(value).__module__) and hasattr(value, "__dict__"))


def _assign_array(target, new) -> None:
    import numpy as np

    root_t, _ = codec._array_root(target)
    root_n, _ = codec._array_root(new)
    if root_t is not None and root_n is not None and root_t.nbytes == root_n.nbytes and root_t.flags.writeable \
            and root_t.flags.c_contiguous:
        mine, theirs = root_t.reshape(-1).view(np.uint8), root_n.reshape(-1).view(np.uint8)
        if not np.array_equal(mine, theirs):
            mine[:] = theirs
    elif target.flags.writeable and target.shape == new.shape:
        np.copyto(target, new, casting="unsafe")


def _assign_tensor(torch, target, new) -> None:
    mine, theirs = target.untyped_storage(), new.untyped_storage()
    with torch.no_grad():
        if mine.nbytes() == theirs.nbytes():
            a = torch.empty(0, dtype=torch.uint8, device=target.device).set_(mine)
            b = torch.empty(0, dtype=torch.uint8, device=new.device).set_(theirs)
            if not torch.equal(a, b.to(a.device)):
                a.copy_(b)
        elif target.shape == new.shape:
            target.copy_(new)


# --------------------------------------------------------------------------------------- the checker
class NoRecordedAnswer(Exception):
    """The checker made a call the student's process never answered."""


class Replayer:
    """In the checker's process: answers each call of the student's code from the records."""

    def __init__(self, frames: list):
        self.records = {}
        for frame in frames:
            if frame.get("kind") == "call" and all(type(frame.get(k)) is str for k in ("key", "shape")) and \
                    all(type(frame.get(k)) is int for k in ("n", "m")):
                self.records.setdefault((frame["key"], frame["n"]), frame)
                self.records.setdefault(("shape:" + frame["shape"], frame["m"]), frame)
        self.counts: dict[str, int] = {}

    def call(self, name: str, args, kwargs):
        digest, shape = codec.keys(name, args, kwargs, _handle_of)
        n, m = _count(self.counts, digest), _count(self.counts, "shape:" + shape)
        frame = self.records.get((digest, n)) or self.records.get(("shape:" + shape, m))
        if frame is None:
            raise NoRecordedAnswer(f"{name.split('.')[0]}: the notebook's process gave no answer for this call "
                                   f"(it stopped, ran out of its budget, or answered other inputs)")
        try:
            return answer(frame, args, kwargs, ReplayHandle)
        except codec.CodecError as exc:
            raise NoRecordedAnswer(f"{name}: the recorded answer is not plain data ({exc})") from None

    def wrap(self, name: str):
        replayer = self

        def call(*args, **kwargs):
            return replayer.call(name, args, kwargs)
        call.__name__ = call.__qualname__ = name
        return call


_REPLAYER: list = []          # the checker process's replayer, for the handles it decodes


class ReplayHandle(_Remote):
    __slots__ = ()

    def _op(self, op: str, *args):
        number = object.__getattribute__(self, "_handle")
        return _REPLAYER[0].call(f"#{number}.{op}", args, {})
