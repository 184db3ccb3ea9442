"""Plain data between the student's process and the checker: what crosses is JSON with base64 buffers,
never a pickle, and decoding it runs none of the student's code.

What can cross: ``None``, bools, ints, floats, complex numbers, strings, bytes; tuples, lists and dicts
of these; NumPy arrays and scalars of numeric dtypes; torch tensors, dtypes, devices and sizes; objects
of the course's own classes (``attnkit.*``), as their class and their attributes; the course's functions
and classes by name; exceptions, as their class name, nearest trusted base class, plain arguments and
the student's line. Anything else (an object of the student's class, a generator, a bound method) is a
*handle*: a number that names it in the student's process, where calls on it are forwarded.

An array or tensor crosses as the whole buffer it views (every byte of the NumPy base array or torch
storage) with its own offset, shape and strides, so a function that writes into an output view of a
larger poisoned buffer, or past its edges, is seen doing exactly that; views of one buffer stay views of
one buffer on the other side.
"""
from __future__ import annotations

import base64
import builtins
import importlib

MAX_DEPTH = 40
NUMERIC_KINDS = "biufc"            # NumPy dtype kinds that cross: bool, ints, floats, complex
TEXT_LIMIT = 4000                  # characters of an exception's message


class CodecError(ValueError):
    """Data that is not plain data of the kinds listed in the module's doc."""


def _course_name(name) -> bool:
    return type(name) is str and (name == "attnkit" or name.startswith("attnkit."))


def _resolve(path: str):
    """The course's class or function named ``module:qualname`` (only ``attnkit.*``). The name comes from
    the data itself (an object of any of the course's classes may cross), so its module is loaded by name:
    a module of the course, which the checker's process may import anyway."""
    module_name, _, qualname = str(path).partition(":")
    if not _course_name(module_name) or not qualname:
        raise CodecError(f"{path!r} is not one of the course's names")
    value = importlib.import_module(module_name)
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _np():
    import numpy as np
    return np


def _torch():
    import sys
    return sys.modules.get("torch")


def _array_root(a):
    """(root array that owns the memory, byte offset of ``a`` in it), or (None, 0) when ``a``'s memory
    is not an ndarray's (then ``a`` crosses as a compact copy)."""
    np = _np()
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root.base is not None and not isinstance(root.base, (bytes, bytearray, memoryview)):
        return None, 0
    if not (root.flags.c_contiguous or root.flags.f_contiguous):
        return None, 0
    start = root.__array_interface__["data"][0]
    return root, a.__array_interface__["data"][0] - start


class Encoder:
    """Turns a value into (tree, blobs). ``handle(obj) -> int`` names what cannot cross (None: an
    opaque marker, which is enough for a key)."""

    def __init__(self, handle=None, refs=None):
        self.handle = handle
        self.refs = refs                # an ArgumentRefs: values that are (views of) the call's arguments
        self.blobs: list[bytes] = []
        self._roots: dict = {}          # id(root) -> blob index (views of one buffer share it)
        self._keep: list = []           # the roots, alive while their ids are in use

    def blob(self, key, data_fn) -> int:
        if key not in self._roots:
            self._roots[key] = len(self.blobs)
            self.blobs.append(bytes(data_fn()))
        return self._roots[key]

    def encode(self, v, depth: int = 0):
        if depth > MAX_DEPTH:
            raise CodecError("the value is nested too deeply")
        kind = type(v)
        if v is None or kind in (bool, int, float, str):
            return v
        if self.refs is not None:
            ref = self.refs.find(v)
            if ref is not None:
                return ref
        if kind is complex:
            return {"$": "c", "re": v.real, "im": v.imag}
        if kind in (bytes, bytearray):
            return {"$": "b", "i": self.blob(("bytes", len(self.blobs)), lambda: v)}
        if kind in (tuple, list):
            return {"$": "t" if kind is tuple else "l", "v": [self.encode(x, depth + 1) for x in v]}
        if kind is dict:
            return {"$": "d", "k": [self.encode(k, depth + 1) for k in v],
                    "v": [self.encode(x, depth + 1) for x in v.values()]}
        np, torch = _np(), _torch()
        if isinstance(v, np.ndarray) and v.dtype.kind in NUMERIC_KINDS:
            return self._array(v.view(np.ndarray) if kind is not np.ndarray else v)
        if isinstance(v, np.generic) and kind.__module__ == "numpy" and v.dtype.kind in NUMERIC_KINDS:
            return {"$": "s", "dt": v.dtype.str, "i": self.blob(("s", len(self.blobs)), v.tobytes)}
        if torch is not None:
            tree = self._torch_value(v, torch, depth)
            if tree is not None:
                return tree
        module = getattr(kind, "__module__", "")
        if _course_name(module) and not isinstance(v, type) and not callable(v):
            return self._course_object(v, depth)
        if (isinstance(v, type) or type(v).__name__ == "function") and _course_name(getattr(v, "__module__", "")):
            return {"$": "n", "q": f"{v.__module__}:{v.__qualname__}"}
        plain = _plain_base(v, np)
        if plain is not None:                # a subclass of a plain type crosses as that type's value
            return self.encode(plain[0], depth + 1)
        number = None if self.handle is None else self.handle(v)
        if type(number) is not int:
            return {"$": "x", "ty": kind.__name__ if type(kind.__name__) is str else "?"}
        return {"$": "h", "i": number}

    def _array(self, a):
        root, offset = _array_root(a)
        if root is None:
            a = a.copy()
            root, offset = a, 0
        order = "C" if root.flags.c_contiguous else "F"
        index = self.blob(("a", id(root)), lambda: root.tobytes(order=order))
        self._keep.append(root)
        return {"$": "a", "dt": a.dtype.str, "sh": list(a.shape), "st": list(a.strides), "off": int(offset),
                "i": index, "ro": not a.flags.writeable,
                "root": [root.dtype.str, list(root.shape), order] if root.dtype.kind in NUMERIC_KINDS else None}

    def _torch_value(self, v, torch, depth):
        if isinstance(v, torch.Tensor):
            t = v.detach()
            if type(t) is not torch.Tensor:
                t = t.as_subclass(torch.Tensor)
            if t.is_sparse or t.is_quantized or t.device.type == "meta":
                raise CodecError("sparse, quantized and meta tensors do not cross")
            storage = t.untyped_storage()

            def data():
                flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage)
                return flat.cpu().numpy().tobytes()
            index = self.blob(("p", storage.data_ptr(), str(t.device), storage.nbytes()), data)
            self._keep.append(storage)
            return {"$": "p", "dt": str(t.dtype).removeprefix("torch."), "dev": str(t.device),
                    "sh": list(t.shape), "st": list(t.stride()), "off": int(t.storage_offset()), "i": index,
                    "n": int(storage.nbytes())}
        if isinstance(v, torch.dtype):
            return {"$": "pd", "v": str(v).removeprefix("torch.")}
        if isinstance(v, torch.device):
            return {"$": "pv", "v": str(v)}
        if type(v) is torch.Size:
            return {"$": "ps", "v": [int(x) for x in v]}
        return None

    def _course_object(self, v, depth):
        import enum

        kind = type(v)
        path = f"{kind.__module__}:{kind.__qualname__}"
        if isinstance(v, enum.Enum):
            return {"$": "e", "c": path, "v": v.name}
        if isinstance(v, tuple):                      # a NamedTuple of the course's
            return {"$": "nt", "c": path, "v": [self.encode(x, depth + 1) for x in v]}
        state = {}
        names = list(vars(v)) if hasattr(v, "__dict__") else []
        for cls in kind.__mro__:
            slots = vars(cls).get("__slots__", ())
            names += [slots] if isinstance(slots, str) else list(slots)
        for name in dict.fromkeys(names):
            if name not in ("__dict__", "__weakref__"):
                try:
                    state[name] = object.__getattribute__(v, name)
                except AttributeError:
                    continue
        return {"$": "o", "c": path, "k": list(state), "v": [self.encode(x, depth + 1) for x in state.values()]}


def _plain_base(v, np):
    """``(value,)``: ``v``, an instance of a subclass of a plain type (a float that equals everything, a
    NumPy scalar with its own ``__eq__``), as a value of the plain type; None for anything else."""
    for base in (bool, int, float, complex, str, bytes):
        if isinstance(v, base):
            return (base(v),)
    if isinstance(v, np.generic) and v.dtype.kind in NUMERIC_KINDS:
        return (np.array(v, dtype=v.dtype)[()],)
    for base in (tuple, list):
        if isinstance(v, base):
            return (base(iter(v)),)
    if isinstance(v, dict):
        return (dict(v.items()),)
    return None


def encode(value, handle=None, refs=None) -> tuple[object, list[bytes]]:
    enc = Encoder(handle, refs)
    return enc.encode(value), enc.blobs


class ArgumentRefs:
    """A call's arguments by path, so that a returned value that *is* one of them (``return out``), or a
    tensor view of one's storage, comes back as that argument on the other side too."""

    def __init__(self, args, kwargs):
        self.root = (tuple(args), dict(kwargs))
        self.paths: dict[int, list] = {}
        self.storages: dict = {}
        self._walk(self.root, [], 0)

    def _walk(self, value, path, depth):
        if depth > 4 or len(self.paths) > 10_000:
            return
        if path and type(value) not in (bool, int, float, str, type(None)):
            self.paths.setdefault(id(value), path)
        torch = _torch()
        if torch is not None and isinstance(value, torch.Tensor):
            self.storages.setdefault((value.untyped_storage().data_ptr(), str(value.device)), path)
        if type(value) in (tuple, list):
            for i, item in enumerate(value):
                self._walk(item, path + [i], depth + 1)
        elif type(value) is dict:
            for k, item in value.items():
                if type(k) in (str, int):
                    self._walk(item, path + [k], depth + 1)

    def find(self, v):
        path = self.paths.get(id(v))
        if path is not None:
            return {"$": "r", "p": path}
        torch = _torch()
        if torch is not None and isinstance(v, torch.Tensor) and v.layout == torch.strided and \
                v.device.type != "meta":
            path = self.storages.get((v.untyped_storage().data_ptr(), str(v.device)))
            if path is not None:
                return {"$": "rv", "p": path, "sh": list(v.shape), "st": list(v.stride()),
                        "off": int(v.storage_offset())}
        return None

    def resolve(self, tree):
        value = self.root
        for step in _list(tree, "p"):
            try:
                value = value[step]
            except (KeyError, IndexError, TypeError):
                raise CodecError("a reference to an argument that is not there") from None
        if tree["$"] == "r":
            return value
        torch = _torch()
        if torch is None or not isinstance(value, torch.Tensor):
            raise CodecError("a view of an argument that is not a tensor")
        shape, strides, offset = _ints(tree, "sh"), _ints(tree, "st"), tree.get("off")
        storage = value.untyped_storage()
        itemsize = value.element_size()
        if type(offset) is not int or offset < 0 or len(shape) != len(strides) or min(strides, default=0) < 0 or \
                (0 not in shape and (offset + sum((n - 1) * st for n, st in zip(shape, strides)) + 1) * itemsize
                 > storage.nbytes()):
            raise CodecError("a view that does not fit its argument's storage")
        return torch.empty(0, dtype=value.dtype, device=value.device).set_(storage, offset, tuple(shape),
                                                                          tuple(strides))


def pack(tree, blobs) -> dict:
    return {"tree": tree, "blobs": [base64.b64encode(b).decode() for b in blobs]}


def unpack(message) -> tuple[object, list[bytes]]:
    if type(message) is not dict or type(message.get("blobs")) is not list:
        raise CodecError("not a packed value")
    try:
        return message.get("tree"), [base64.b64decode(b, validate=True) for b in message["blobs"]]
    except (TypeError, ValueError) as exc:
        raise CodecError(f"a buffer is not base64: {exc}") from None


class Decoder:
    """Rebuilds values from (tree, blobs); ``handle(i)`` makes the stand-in for handle ``i``."""

    def __init__(self, blobs: list[bytes], handle=None, refs: ArgumentRefs | None = None):
        self.blobs = blobs
        self.handle = handle
        self.refs = refs
        self._arrays: dict = {}          # blob index -> uint8 root array (views share it)
        self._storages: dict = {}        # (blob index, device) -> uint8 tensor

    def decode(self, tree, depth: int = 0):
        if depth > MAX_DEPTH:
            raise CodecError("the value is nested too deeply")
        if tree is None or type(tree) in (bool, int, float, str):
            return tree
        if type(tree) is not dict or type(tree.get("$")) is not str:
            raise CodecError(f"unexpected {type(tree).__name__} in the data")
        tag = tree["$"]
        if tag in ("t", "l"):
            items = [self.decode(x, depth + 1) for x in _list(tree, "v")]
            return tuple(items) if tag == "t" else items
        if tag == "d":
            keys, values = _list(tree, "k"), _list(tree, "v")
            if len(keys) != len(values):
                raise CodecError("a dict's keys and values differ in number")
            return {self.decode(k, depth + 1): self.decode(x, depth + 1) for k, x in zip(keys, values)}
        if tag == "c":
            return complex(float(tree["re"]), float(tree["im"]))
        if tag == "b":
            return bytes(self._blob(tree))
        if tag == "a":
            return self._array(tree)
        if tag == "s":
            np = _np()
            dtype = _numeric_dtype(tree.get("dt"))
            data = self._blob(tree)
            if len(data) != dtype.itemsize:
                raise CodecError("a NumPy scalar has the wrong number of bytes")
            return np.frombuffer(data, dtype=dtype)[0]
        if tag in ("p", "pd", "pv", "ps"):
            return self._torch_value(tag, tree)
        if tag in ("o", "e", "nt"):
            return self._course_object(tag, tree, depth)
        if tag == "n":
            return _resolve(tree.get("q"))
        if tag == "h":
            if self.handle is None or type(tree.get("i")) is not int:
                raise CodecError("a handle where none may be")
            return self.handle(tree["i"])
        if tag == "x":
            return None
        if tag in ("r", "rv") and self.refs is not None:
            return self.refs.resolve(tree)
        raise CodecError(f"unknown tag {tag!r}")

    def _blob(self, tree) -> bytes:
        i = tree.get("i")
        if type(i) is not int or not 0 <= i < len(self.blobs):
            raise CodecError("a buffer reference is out of range")
        return self.blobs[i]

    def _array(self, tree):
        np = _np()
        dtype = _numeric_dtype(tree.get("dt"))
        shape, strides, offset = _ints(tree, "sh"), _ints(tree, "st"), tree.get("off")
        if len(shape) != len(strides) or type(offset) is not int or offset < 0:
            raise CodecError("an array's shape, strides and offset do not agree")
        i = tree.get("i")
        if i not in self._arrays:
            self._arrays[i] = _root_array(self._blob(tree), tree.get("root"))
        try:                                 # NumPy checks that the view stays inside the buffer
            a = np.ndarray(tuple(shape), dtype=dtype, buffer=self._arrays[i], offset=offset, strides=tuple(strides))
        except (TypeError, ValueError) as exc:
            raise CodecError(f"an array does not fit its buffer: {exc}") from None
        if tree.get("ro"):
            a.flags.writeable = False
        return a

    def _torch_value(self, tag, tree):
        torch = _torch()
        if torch is None:
            import torch
        if tag == "pd":
            return _torch_dtype(torch, tree.get("v"))
        if tag == "pv":
            return torch.device(_device(tree.get("v")))
        if tag == "ps":
            return torch.Size(_ints(tree, "v"))
        dtype, device = _torch_dtype(torch, tree.get("dt")), _device(tree.get("dev"))
        shape, strides, offset = _ints(tree, "sh"), _ints(tree, "st"), tree.get("off")
        data = self._blob(tree)
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if len(shape) != len(strides) or type(offset) is not int or offset < 0 or min(strides, default=0) < 0:
            raise CodecError("a tensor's shape, strides and offset do not agree")
        if 0 not in shape:
            last = offset + sum((n - 1) * s for n, s in zip(shape, strides))
            if (last + 1) * itemsize > len(data):
                raise CodecError("a tensor does not fit its storage")
        slot = (tree.get("i"), device)
        if slot not in self._storages:
            flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
            self._storages[slot] = flat.to(device)
        storage = self._storages[slot].untyped_storage()
        return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, tuple(shape), tuple(strides))

    def _course_object(self, tag, tree, depth):
        import enum

        cls = _resolve(tree.get("c"))
        if not isinstance(cls, type) or not _course_name(cls.__module__):
            raise CodecError(f"{tree.get('c')!r} is not one of the course's classes")
        if tag == "e":
            if not issubclass(cls, enum.Enum):
                raise CodecError("not an enum")
            return cls[str(tree.get("v"))]
        if tag == "nt":
            if not issubclass(cls, tuple):
                raise CodecError("not a tuple class")
            return cls(*[self.decode(x, depth + 1) for x in _list(tree, "v")])
        obj = object.__new__(cls)
        keys, values = _list(tree, "k"), _list(tree, "v")
        for name, value in zip(keys, values):
            if type(name) is not str or not name.isidentifier():
                raise CodecError("an attribute name is not an identifier")
            object.__setattr__(obj, name, self.decode(value, depth + 1))
        return obj


def _root_array(data: bytes, root):
    """The buffer an array views, as the array it was (dtype, shape, order) where that is valid."""
    np = _np()
    flat = np.frombuffer(bytearray(data), dtype=np.uint8)
    try:
        dtype, shape, order = _numeric_dtype(root[0]), [int(n) for n in root[1]], root[2]
        if order in ("C", "F") and dtype.itemsize * int(np.prod(shape)) == len(data) and len(shape) <= 64:
            return flat.view(dtype).reshape(shape, order=order)
    except (TypeError, ValueError, IndexError, CodecError):
        pass
    return flat


def decode(tree, blobs, handle=None, refs=None):
    return Decoder(blobs, handle, refs).decode(tree)


def _list(tree, name) -> list:
    value = tree.get(name)
    if type(value) is not list:
        raise CodecError(f"{name!r} is not a list")
    return value


def _ints(tree, name) -> list[int]:
    values = _list(tree, name)
    if not all(type(x) is int for x in values) or len(values) > 64:
        raise CodecError(f"{name!r} is not a short list of integers")
    return values


def _numeric_dtype(text):
    np = _np()
    try:
        dtype = np.dtype(str(text))
    except TypeError:
        raise CodecError(f"{text!r} is not a dtype") from None
    if dtype.kind not in NUMERIC_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise CodecError(f"dtype {text!r} does not cross (numbers only)")
    return dtype


def _torch_dtype(torch, name):
    value = getattr(torch, str(name), None) if type(name) is str and name.isidentifier() else None
    if not isinstance(value, torch.dtype):
        raise CodecError(f"{name!r} is not a torch dtype")
    return value


def _device(text) -> str:
    text = str(text)
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise CodecError(f"{text!r} is not a cpu or cuda device")
    return text


# ------------------------------------------------------------------------------------------ exceptions
def _trusted_base(kind: type) -> str:
    """``module:qualname`` of the nearest class in ``kind``'s MRO that Python or the course defines."""
    for base in kind.__mro__:
        module, qualname = getattr(base, "__module__", ""), getattr(base, "__qualname__", "")
        try:                           # a class that only claims such a module is passed over
            real = getattr(builtins, qualname, None) if module == "builtins" else \
                _resolve(f"{module}:{qualname}") if _course_name(module) else None
        except Exception:  # noqa: BLE001 - no such name
            real = None
        if real is base:
            return f"{module}:{qualname}" if issubclass(base, Exception) else "builtins:Exception"
    return "builtins:Exception"


def _plain_text(value) -> str:
    try:
        text = value if type(value) is str else str(value)
    except Exception:  # noqa: BLE001 - a hostile __str__
        text = "<an object that could not be shown>"
    return text if type(text) is str and len(text) <= TEXT_LIMIT else str(text)[:TEXT_LIMIT] + "..."


def encode_exception(exc: BaseException, cells: tuple[str, ...] = ("<notebook cell",), depth: int = 0) -> dict:
    """An exception as plain data: class name, nearest trusted base, plain arguments, whether a blank
    caused it, the last line it went through in the notebook's code, and its cause."""
    from ..checking import is_not_implemented

    kind = type(exc)
    name = kind.__name__ if type(kind.__name__) is str and kind.__name__.isidentifier() else "Exception"
    args = []
    for a in exc.args if type(exc.args) is tuple else ():
        args.append(a if type(a) in (int, float, bool, type(None)) else _plain_text(a))
    where = None
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if type(filename) is str and filename.startswith(cells):
            import linecache

            where = [filename, tb.tb_lineno, linecache.getline(filename, tb.tb_lineno).strip()[:200]]
        tb = tb.tb_next
    cause = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return {"name": name[:80], "base": _trusted_base(kind), "args": args[:8], "where": where,
            "ni": bool(is_not_implemented(exc)),
            "cause": encode_exception(cause, cells, depth + 1) if cause is not None and depth < 4 else None}


class StudentError(Exception):
    """A student's exception whose own class could not be rebuilt."""


def stand_in(name: str, state: dict):
    """What the check gets for an exercise that is missing or refused: a function that raises."""
    def missing(*args, **kwargs):
        if state.get("state") == "missing":
            raise StudentError(f"the notebook defines no `{name}`")
        raise StudentError(f"`{name}` is not graded: see its report")
    missing.__name__ = name
    return missing


def decode_exception(data, depth: int = 0) -> BaseException:
    """The exception ``encode_exception`` described: its base class (Python's or the course's), under
    the student's class name, with its traceback ending at the student's line."""
    if type(data) is not dict:
        return StudentError("an error that could not be shown")
    if data.get("ni") and depth == 0:
        return NotImplementedError()
    name = str(data.get("name") or "Exception")
    name = name if name.isidentifier() else "Exception"
    module, _, qualname = str(data.get("base")).partition(":")
    try:
        base = getattr(builtins, qualname) if module == "builtins" else _resolve(f"{module}:{qualname}")
        if not (isinstance(base, type) and issubclass(base, Exception)):
            base = Exception
    except Exception:  # noqa: BLE001 - a base that does not resolve
        base = Exception
    from .reports import one_line  # the student's text on one line: never a line of a report of its own

    args = tuple(one_line(a, TEXT_LIMIT) if type(a) is str else a if type(a) in (int, float, bool, type(None))
                 else "?" for a in data.get("args") or [])
    try:
        cls = base if base.__name__ == name else type(name, (base,), {"__module__": "submission"})
        exc = cls(*args)
    except Exception:  # noqa: BLE001 - a course class that wants other arguments
        exc = type(name, (StudentError,), {"__module__": "submission"})(*args)
    if data.get("cause") is not None and depth < 4:
        exc.__cause__ = decode_exception(data["cause"], depth + 1)
    return _with_line(exc, data.get("where"))


def _with_line(exc: BaseException, where) -> BaseException:
    """``exc`` with a traceback whose last entry is the student's (cell, line): raised from code
    compiled under that cell's name at that line, with the line's text in linecache."""
    if type(where) is not list or len(where) != 3 or type(where[1]) is not int or not 0 < where[1] < 100_000:
        return exc
    import linecache

    from .reports import one_line

    filename, lineno, text = one_line(where[0], 100), where[1], one_line(where[2], 200)
    lines = ["\n"] * lineno
    lines[-1] = text + "\n"
    linecache.cache[filename] = (len("".join(lines)), None, lines, filename)
    code = compile("\n" * (lineno - 1) + "raise __exc__", filename, "exec")
    try:
        exec(code, {"__exc__": exc})
    except BaseException as raised:  # noqa: BLE001 - the exception itself, now with that traceback
        return raised
    return exc
