"""Where the course's code runs, decided once: a CUDA GPU when there is one, Triton's interpreter otherwise.

Every notebook starts with ``attnkit.setup()``. Every module that imports Triton calls
``ensure_triton_backend()`` first, so the interpreter is switched on before Triton is imported even
when a student skips the setup cell.

Internal API for tests and scripts: ``package_version`` (an installed package's version, which the runtime
summary and the interpreter check read through this name, so a test may replace it) and ``cuda_sm_count``
(the per-GPU cache behind ``sm_count``; a test that fakes the count clears it).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field

# Triton supports GPUs of compute capability 8.0 (Ampere) and newer. Older ones (Colab's free T4 is 7.5)
# still run Triton, but tl.dot falls back to slow FMA code and bf16 kernels fail to compile.
TRITON_MIN_CAPABILITY = (8, 0)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def ensure_triton_backend() -> None:
    """Switch on Triton's interpreter when no CUDA GPU is present. Call before ``import triton``: once
    Triton is imported the choice is made (``triton_interprets``) and this changes nothing."""
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and not _cuda_available():
        os.environ["TRITON_INTERPRET"] = "1"
    _mend_old_interpreter()
    _skip_discarded_overflow_checks()
    _patch_the_language_once_per_kernel()


def _mend_old_interpreter() -> None:
    """Let older Triton interpreters (3.4 to 3.6 at least) run under NumPy 2.4 and newer.

    They turn a scalar tensor into a Python int with ``int(array)``, which NumPy 2.4 rejects for the
    1-element arrays the interpreter uses for scalars, so a loop such as ``range(lo, hi, BLOCK)`` with
    computed bounds fails. Newer Triton squeezes the array first; this does the same for older ones.
    """
    if not interpreter_breaks_on_new_numpy():
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "mended_by_attnkit", False):
        return

    def patch_lang_tensor(tensor, *args, **kwargs):
        original(tensor, *args, **kwargs)
        tensor.__index__ = lambda self: int(self.handle.data.squeeze())

    patch_lang_tensor.mended_by_attnkit = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def _skip_discarded_overflow_checks() -> None:
    """Stop the interpreter from building integer-overflow checks that it then throws away.

    For every int32 ``+``, ``-`` and ``*`` in a kernel, Triton builds a check (both operands cast to
    int64, the operation again, two comparisons with the int32 limits) and hands it to
    ``device_assert``, which keeps it only in debug mode; the interpreter's options never turn debug on,
    so the check is built and dropped. A compiled kernel loses it at compile time; the interpreter pays
    for it at every operation of every program (about 40% of a paged-attention kernel's time there).
    This sets the interpreter's ``sanitize_overflow`` off while its ``debug`` is off: no result and no
    assertion changes. Triton versions without these options are left as they are.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if getattr(options, "debug", True) or not getattr(options, "sanitize_overflow", False):
        return
    import dataclasses

    if dataclasses.is_dataclass(options):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _patch_the_language_once_per_kernel() -> None:
    """Stop the interpreter from patching ``triton.language`` again at every call of a helper.

    The interpreter runs a kernel with the language's builtins patched (each launch patches, then
    restores). Each call of a ``@triton.jit`` helper inside the kernel patches them again
    (``_patch_lang``: ``inspect.getmembers`` over the language), although they are patched already: most
    of an interpreted kernel's time with many helpers (docs/authoring.md, "Notebooks"). This patches
    the language modules a helper sees (``tl``, ``tl.core``) on the first call that needs each, once per
    launch, and calls helpers directly after; outside a launch, as before. No result changes.
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    function, executor = interpreter.InterpretedFunction, getattr(interpreter, "GridExecutor", None)
    if executor is None or getattr(function.__call__, "mended_by_attnkit", False) or \
            not hasattr(interpreter, "_patch_lang") or not hasattr(function, "rewrite"):
        return
    patched: list[set] = []                          # per running launch: ids of the language modules patched
    launch, helper_call = executor.__call__, function.__call__

    def languages(fn) -> set:
        lang = interpreter.tl
        return {id(v) for v in fn.__globals__.values() if isinstance(v, type(lang)) and v in (lang, lang.core)}

    def running_launch(self, *args, **kwargs):
        patched.append(languages(self.fn))           # what the launch's own patch covers
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.pop()

    def call(self, *args, **kwargs):
        if not patched:
            return helper_call(self, *args, **kwargs)
        needed = languages(self.fn)
        if not needed <= patched[-1]:
            interpreter._patch_lang(self.fn)         # as Triton does, once per launch and module
            patched[-1] |= needed
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    running_launch.mended_by_attnkit = call.mended_by_attnkit = True
    executor.__call__, function.__call__ = running_launch, call


def package_version(package: str) -> str | None:
    """The installed version of ``package``; None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Runtime:
    """What runs where on this machine."""

    device: str                      # "cuda" or "cpu": where tensors go and kernels run
    gpu_name: str | None             # e.g. "NVIDIA H100 80GB HBM3"; None on a CPU
    capability: tuple[int, int] | None
    triton: str | None               # Triton's version, None when Triton is not installed
    interpreter: bool                # True when Triton kernels run in the interpreter on the CPU
    in_colab: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def has_triton(self) -> bool:
        return self.triton is not None

    @property
    def triton_supported_gpu(self) -> bool:
        return self.capability is not None and self.capability >= TRITON_MIN_CAPABILITY

    @property
    def bf16_kernels(self) -> bool:
        """Can Triton kernels take bf16 here? (On the CPU they compute bf16 in fp32 instead.)"""
        return self.device == "cpu" or self.triton_supported_gpu

    def summary(self) -> str:
        if self.device == "cuda":
            cc = f"sm_{self.capability[0]}{self.capability[1]}"
            where = f"GPU {self.gpu_name} ({cc})"
            kernels = "compiled Triton kernels" if self.has_triton else "no Triton (kernel cells skip)"
        else:
            where = "CPU"
            kernels = ("Triton interpreter, small sizes" if self.has_triton
                       else "no Triton (kernel cells skip)")
        colab = " in Colab" if self.in_colab else ""
        return f"attnkit: {where}{colab} · {kernels} · torch {package_version('torch')} · triton {self.triton or '-'}"


def detect() -> Runtime:
    """The machine's runtime, detected afresh (``runtime()`` detects it once and keeps it)."""
    ensure_triton_backend()
    notes: list[str] = []
    in_colab = "google.colab" in sys.modules
    triton = package_version("triton")
    if _cuda_available():
        import torch

        name = torch.cuda.get_device_name()
        capability = torch.cuda.get_device_capability()
        if capability < TRITON_MIN_CAPABILITY:
            notes.append(
                f"{name} has compute capability {capability[0]}.{capability[1]}, below the 8.0 that Triton "
                "supports: kernels run, but tl.dot uses slow FMA code (timings are not representative) and "
                "bf16 kernels do not compile, so the course's kernels compute bf16 inputs in fp32 and round "
                "the result to bf16. "
                "(torch.cuda.is_bf16_supported() may still say True: it speaks of PyTorch, not Triton.)"
            )
        interpreter = os.environ.get("TRITON_INTERPRET") == "1"
        return Runtime("cuda", name, capability, triton, interpreter, in_colab, tuple(notes))
    if triton is None:
        notes.append("Triton is not installed: kernel cells are skipped; the NumPy and PyTorch parts run.")
    else:
        notes.append("No GPU: Triton kernels run in Triton's interpreter on small sizes, and bf16 kernels "
                     "compute in fp32 (the interpreter's bf16 arithmetic is not faithful).")
    return Runtime("cpu", None, None, triton, triton is not None, in_colab, tuple(notes))


def interpreter_breaks_on_new_numpy() -> bool:
    """Older Triton interpreters turn a scalar tensor into an int with int(array), which NumPy 2.4
    rejects for 1-element arrays; newer ones squeeze first. Read the installed source, import nothing."""
    import importlib.util

    numpy_version = package_version("numpy") or "0"
    if tuple(int(p) for p in numpy_version.split(".")[:2] if p.isdigit()) < (2, 4):
        return False
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return False
    source = os.path.join(spec.submodule_search_locations[0], "runtime", "interpreter.py")
    try:
        text = open(source, encoding="utf-8").read()
    except OSError:
        return False
    return "int(self.handle.data)" in text and "handle.data.squeeze()" not in text


def bf16_computed_in_fp32(device) -> bool:
    """True where the course's Triton kernels must compute bf16 inputs in fp32 (and round the result
    back to bf16): in the interpreter (its bf16 arithmetic is not faithful) and on GPUs below compute
    capability 8.0 (Triton cannot compile bf16 there). ``device`` is a torch.device or a string."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or triton_interprets():
        return True
    return torch.cuda.get_device_capability(device) < TRITON_MIN_CAPABILITY


@functools.lru_cache(maxsize=1)
def triton_interprets() -> bool:
    """True when this process's Triton runs kernels in its interpreter (it was imported with
    TRITON_INTERPRET=1: no GPU, or asked for). Triton decides once, at import, for its own standard
    library (tl.max, tl.sum, ...) and for every kernel decorated by then, so this never changes
    (and is asked once: every kernel launch consults it)."""
    ensure_triton_backend()
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.max, InterpretedFunction)


def kernel_device(device):
    """Where the course's Triton kernels run for tensors on ``device`` -- the one rule every kernel follows:

    - CUDA tensors: on their GPU (compiled), or in the interpreter when Triton interprets;
    - CPU tensors, Triton interpreting (a machine without a GPU): in the interpreter, on the CPU;
    - CPU tensors on a machine whose Triton compiles (it has a GPU): on the current GPU. Triton
      cannot interpret there (its standard library was built compiled), so the kernel's callers copy
      the tensors to the GPU and the results back (``to_kernel_device``).
    """
    import torch

    device = torch.device(device)
    if device.type == "cpu" and not triton_interprets():
        return torch.device("cuda", torch.cuda.current_device())
    return device


def to_kernel_device(*tensors):
    """The tensors (None passes through) on ``kernel_device`` of the first one's device: unchanged
    where they already are, else copied (CPU tensors on a machine whose Triton compiles)."""
    where = kernel_device(tensors[0].device)
    return tuple(t if t is None or t.device == where else t.to(where) for t in tensors)


def on_device(device):
    """The context a kernel launch runs in. Triton launches on the current CUDA device: for a tensor on
    another GPU, this makes its GPU current for the launch; otherwise it does nothing. (``with
    torch.device(...)`` would do the same, but it also routes every tensor method called inside the
    launch through PyTorch's function-mode dispatch, which made a launch about 1.5 times as costly for
    the host: 67 against 45 µs on the H100 machine, docs/flash_notes.md.)"""
    import torch

    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def sm_major(device) -> int | None:
    """The compute capability's major number of a CUDA device (9 for the H100), read once per GPU (a fresh
    read costs about 6 µs of host time on the H100 machine, where a short attention call takes about 220).
    None for any other device."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())[0]


def sm_count(device) -> int | None:
    """The streaming multiprocessors of a CUDA device (132 on the H100 SXM), read once per GPU; None for any
    other device."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    return cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def cuda_sm_count(index: int) -> int:
    """The SM count of CUDA device ``index``, read once (``cuda_sm_count.cache_clear()`` forgets it)."""
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability(index)


def launch_options(**options) -> dict:
    """``options`` (num_warps, num_stages, ...) for a compiled launch; none in the interpreter, which
    runs one program at a time and has no warps."""
    return {} if triton_interprets() else options


@functools.lru_cache(maxsize=1)
def runtime() -> Runtime:
    """The machine's runtime, detected once."""
    return detect()


def setup(verbose: bool = True) -> Runtime:
    """Call at the top of every notebook: picks the device and prints one line of what runs where."""
    rt = runtime()
    if verbose:
        print(rt.summary())
        for note in rt.notes:
            print("  note:", note)
    return rt


def versions() -> dict[str, str | None]:
    """Library versions recorded beside every benchmark result."""
    info = {name: package_version(name) for name in ("torch", "triton", "numpy")}
    info["python"] = sys.version.split()[0]
    if _cuda_available():
        import torch

        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
        info["cudnn"] = str(torch.backends.cudnn.version())
    return info
