"""The pipes between the grader and its workers: the spec on stdin, one line of progress at a time on
the progress pipe, length-prefixed JSON frames on the channel. The grader's readers never block on a
worker and never hold more than their caps."""
from __future__ import annotations

import os
import struct
from json import dumps as _dumps
from json import loads as _loads  # bound at import: the notebook's code replacing json's own is its loss

HEADER = struct.Struct(">Q")
LINE_LIMIT = 200                   # characters of one progress line the grader keeps
REPLACED = ("executed",)           # frame kinds of which only the last one is kept


def spec_line(spec: dict) -> bytes:
    return _dumps(spec).encode() + b"\n"


def worker_fds() -> tuple[int, int, int | None]:
    """(progress, channel, calls) file descriptors the grader passed to this worker; calls is the
    connection between the student's process and the checker's (None for the notebook's run)."""
    fds = [int(f) for f in os.environ["ATTNKIT_GRADING_FDS"].split(",")]
    return fds[0], fds[1], fds[2] if len(fds) > 2 else None


def read_frame(fd: int, limit: int) -> dict | None:
    """The next frame on ``fd``, waiting for it; None at the end or past ``limit`` bytes."""
    def exactly(n: int) -> bytes | None:
        chunks = []
        while n:
            chunk = os.read(fd, min(n, 2**20))
            if not chunk:
                return None
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    try:
        head = exactly(HEADER.size)
        if head is None or HEADER.unpack(head)[0] > limit:
            return None
        data = exactly(HEADER.unpack(head)[0])
        frame = _loads(data) if data is not None else None
    except (OSError, ValueError):
        return None
    return frame if type(frame) is dict else None


class Writer:
    """The worker's end of the channel. Frames from forked children of the worker (a check that runs
    the student's function in several processes) stay whole: each is written under a lock."""

    def __init__(self, fd: int, lock_path: str | None = None):
        self.fd = fd
        self.lock_path = lock_path

    def send(self, frame: dict) -> None:
        data = _dumps(frame).encode()
        payload = HEADER.pack(len(data)) + data
        lock = None
        if self.lock_path is not None:
            import fcntl

            lock = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(self.fd, view):]
        finally:
            if lock is not None:
                os.close(lock)


class Reader:
    """The grader's end of the channel: frames decoded until the pipe closes or ``limit`` bytes came."""

    def __init__(self, fd: int, limit: int):
        self.fd, self.limit = fd, limit
        self.frames: list = []
        self.overflow = False
        self.received = 0

    def _exactly(self, n: int) -> bytes | None:
        chunks = []
        while n:
            chunk = os.read(self.fd, min(n, 2**20))
            if not chunk:
                return None
            self.received += len(chunk)
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def run(self) -> None:
        try:
            while True:
                head = self._exactly(HEADER.size)
                if head is None:
                    return
                (size,) = HEADER.unpack(head)
                if self.received + size > self.limit:
                    self.overflow = True
                    return
                data = self._exactly(size)
                if data is None:
                    return
                try:
                    frame = _loads(data)
                except ValueError:
                    frame = {"kind": "garbled"}
                if type(frame) is not dict:
                    frame = {"kind": "garbled"}
                if frame.get("kind") in REPLACED:
                    self.frames = [f for f in self.frames if f.get("kind") != frame.get("kind")]
                self.frames.append(frame)
        except OSError:
            return
        finally:
            os.close(self.fd)


class Tail:
    """The last ``keep`` bytes of a stream (a worker's stderr), the rest read and dropped."""

    def __init__(self, fd: int, keep: int):
        self.fd, self.keep = fd, keep
        self.data = b""

    def run(self) -> None:
        try:
            while True:
                chunk = os.read(self.fd, 2**16)
                if not chunk:
                    return
                self.data = (self.data + chunk)[-self.keep:]
        except OSError:
            return

    def text(self) -> str:
        return self.data.decode(errors="replace")


class Lines:
    """Progress lines from a non-blocking pipe: at most 64 KiB read per call, lines cut to
    ``LINE_LIMIT`` characters, only the last 100 of a call returned."""

    def __init__(self, fd: int):
        import fcntl

        self.fd = fd
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        self.partial = b""

    def read(self) -> list[str]:
        try:
            data = os.read(self.fd, 2**16)
        except (BlockingIOError, OSError):
            return []
        data = self.partial + data
        *lines, rest = data.split(b"\n")
        self.partial = rest[-LINE_LIMIT:]
        return [l[:LINE_LIMIT].decode(errors="replace").strip() for l in lines[-100:]]


def progress_writer(fd: int):
    """``say(text)``: one line on the progress pipe."""
    def say(text: str) -> None:
        try:
            os.write(fd, (str(text).replace("\n", " ")[:LINE_LIMIT] + "\n").encode())
        except OSError:
            pass
    return say
