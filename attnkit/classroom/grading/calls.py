"""Calls of the student's code, made in the student's process on the checker's behalf.

The lab's check runs in the checker's process with the secret seed. Each time it calls a student's
function, the call goes to the student's process as plain data (``codec``): the arguments, every byte
of every buffer included. The student's process makes the call and answers with what it returned or
raised and the state of the arguments afterwards (a function that writes into an output view of a
poisoned buffer, or past its edges, is seen doing exactly that); the checker gives its own arguments
that state and returns the result. No code of the student's runs in the checker, and nothing of the
checker's (its references, its expected values, the seed) reaches the student's process.

An object of the student's own class stays in the student's process and crosses as a handle; each
use of it (attribute, call, ``len``, iteration, comparison) is one more call.
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
        if name.startswith("__") and name.endswith("__"):      # never __array_struct__ and the like
            raise AttributeError(name)
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


def _handle_of(value):
    return object.__getattribute__(value, "_handle") if isinstance(value, _Remote) else None


# --------------------------------------------------------------------------------- the student's side
class Server:
    """In the student's process: answers the checker's calls of the student's functions and objects.

    Each request names a function (``fn``) or a handle's operation (``#3.call``) and carries its
    arguments as plain data; the answer carries the result (or the exception) and the arguments' state
    after the call. Nothing else of the checker's ever reaches this process.
    """

    def __init__(self, functions: dict, send, before=None):
        self.functions = functions               # exercise name -> the student's function
        self.send = send
        self.before = before                     # called with the request's name before each call
        self.objects: dict[int, object] = {}     # handle -> the student's object
        self.handles: dict[int, int] = {}        # id(object) -> handle

    def handle(self, value) -> int:
        if id(value) not in self.handles:
            number = len(self.objects) + 1
            self.objects[number] = value
            self.handles[id(value)] = number
        return self.handles[id(value)]

    def obj(self, number: int):
        if number not in self.objects:
            raise codec.CodecError(f"no object has handle {number}")
        return self.objects[number]

    def target(self, name: str, driver=None):
        if driver is not None:               # a course function that runs the student's function here
            run = codec._resolve(driver)
            if not callable(run) or name not in self.functions:
                raise codec.CodecError(f"{driver!r} cannot drive {name!r}")
            return run(self.functions[name])
        if name.startswith("#"):
            number, _, op = name[1:].partition(".")
            target = self.obj(int(number))
            return lambda *a, **k: _perform(target, op, a)
        if name not in self.functions:
            raise codec.CodecError(f"{name!r} is not an exercise's function")
        return self.functions[name]

    def answer(self, request: dict) -> dict:
        """The reply to one request (never raises for what the student's code does)."""
        name = str(request.get("name"))[:200]
        try:
            fn = self.target(name, request.get("driver"))
            tree, blobs = codec.unpack(request.get("args"))
            args = codec.decode(tree, blobs, self.obj)
            args, kwargs = (args[0], args[1]) if type(args) is tuple and len(args) == 2 else ((), {})
        except (codec.CodecError, ValueError) as exc:
            return {"kind": "answer", "raised": codec.encode_exception(TypeError(f"a request that is not plain "
                                                                                 f"data: {exc}"))}
        if self.before is not None:
            self.before(name)
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as exc:  # noqa: BLE001 - sent to the checker as plain data
            result, error = None, exc
        frame = {"kind": "answer", "after": _packed((args, kwargs), self.handle)}
        if error is not None:
            from ..checking import student_error

            frame["raised"] = codec.encode_exception(student_error(error))
            return frame
        try:
            frame["returned"] = _packed(result, self.handle, codec.ArgumentRefs(args, kwargs))
        except codec.CodecError as exc:
            frame["raised"] = codec.encode_exception(TypeError(f"{name} returned a value that cannot be graded: "
                                                               f"{exc}"))
        return frame


def _packed(value, handle, refs=None) -> dict:
    tree, blobs = codec.encode(value, handle, refs)
    return codec.pack(tree, blobs)


# --------------------------------------------------------------------------------------- both sides
def answer(frame: dict, args, kwargs, make_handle):
    """What a call returns in the check, from its answer: the arguments get the contents they had after
    the call, then the result is returned or the exception raised."""
    if "after" in frame:                     # absent when the request itself was refused
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
class NoAnswer(Exception):
    """The student's process gave no answer (it stopped, or ran past its budget)."""


class Caller:
    """In the checker's process: each call of the student's code is sent to the student's process and
    its answer applied. Forked children of the checker (a check that runs the student's function on
    several ranks) share the connection: one request and its answer at a time, under a lock."""

    def __init__(self, send, receive, lock_path: str | None = None):
        self.send, self.receive, self.lock_path = send, receive, lock_path
        self.closed = False

    def call(self, name: str, args, kwargs, driver: str | None = None):
        if self.closed:
            raise NoAnswer(f"{name.split('.')[0]}: the notebook's process stopped answering")
        request = {"kind": "call", "name": name, "args": _packed((tuple(args), dict(kwargs)), _handle_of),
                   "driver": driver}
        lock = None
        if self.lock_path is not None:
            import fcntl
            import os

            lock = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            self.send(request)
            frame = self.receive()
        except OSError:
            frame = None
        finally:
            if lock is not None:
                import os

                os.close(lock)
        request = None
        if type(frame) is not dict or frame.get("kind") != "answer":
            self.closed = True
            raise NoAnswer(f"{name.split('.')[0]}: the notebook's process stopped answering (it ended, or ran "
                           f"past its budget)")
        try:
            return answer(frame, args, kwargs, RemoteHandle)
        except codec.CodecError as exc:
            raise NoAnswer(f"{name}: the answer is not plain data ({exc})") from None
        finally:
            frame = None                     # the transport's copies freed before the peak starts again
            _forget_transport_peak()

    def wrap(self, name: str):
        caller = self

        def call(*args, **kwargs):
            return caller.call(name, args, kwargs)

        def through(driver: str):
            """``driver(student_fn)`` run in the student's process, ``driver`` a course function named
            ``"attnkit.module:name"``: for a check that must run the student's function in processes
            of its own (a process group), where the student's code lives."""
            def driven(*args, **kwargs):
                return caller.call(name, args, kwargs, driver=str(driver))
            return driven
        call.__name__ = call.__qualname__ = name
        call.through = through
        return call


def _forget_transport_peak() -> None:
    """A check that measures the memory a call allocates (tracemalloc) must not count the copies this
    transport makes: the peak starts again from what the call left. The student's own peak is measured
    where the function runs, in the student's process (``runner._own_check``)."""
    import tracemalloc

    if tracemalloc.is_tracing():
        tracemalloc.reset_peak()


_CALLER: list = []          # the checker process's caller, for the handles it decodes


def use(caller: Caller) -> None:
    """Make ``caller`` the one the handles of this process call through."""
    _CALLER[:] = [caller]


class RemoteHandle(_Remote):
    __slots__ = ()

    def _op(self, op: str, *args):
        number = object.__getattribute__(self, "_handle")
        return _CALLER[0].call(f"#{number}.{op}", args, {})
