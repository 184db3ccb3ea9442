"""The kernels the leaderboard times (labs 04, 05, 06 and 08), each on one fixed shape: its inputs from a fixed
seed, the student's call, the course's kernel and the library's call (``Timed``, ``timed_kernels``). The timing
worker (``timing``) runs them; the leaderboard (``leaderboard``) names and ranks them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SEED = 36_006                  # the inputs of every timed kernel


@dataclass(frozen=True)
class Timed:
    """One kernel of a lab timed on one fixed shape.

    ``functions``: the exercises' functions it uses; it is timed only when every exercise of each
    passed. ``shapes``: "gpu" (what the leaderboard times) and "tiny" (for the interpreter). Rule: a "gpu"
    shape keeps the course's kernel busy on the GPU for several times its host time per call, so that the
    board ranks kernels, not host paths (docs/leaderboard.md, "Rule: shapes where the GPU is the bound").
    ``inputs(shape, device)`` -> a dict of tensors; ``student(fns, x)``, ``course(x)`` and
    ``library(x, device)`` -> a call without arguments (``course`` None: the course has no kernel for
    it). ``reference``: which call's output the student's is compared with at the timed shape.
    ``fused_library``: the library's call is one fused kernel of the same operation (cuDNN's attention),
    so a student time far below it is not believed; PyTorch's unfused ops (lab 04) are no such bound.
    ``moved_bytes(x)``: the bytes the kernel must read and write at least once (its floor, ``floor_ms``).
    """

    lab: int
    name: str
    functions: tuple[str, ...]
    shapes: dict
    inputs: Callable
    student: Callable
    course: Callable | None
    library: Callable
    library_gpu: str                 # the library's call on a GPU, named in the leaderboard
    reference: str = "course"
    library_cpu: str = ""            # its name on a CPU, where it differs ("cuDNN" is not there)
    fused_library: bool = True
    moved_bytes: Callable | None = None

    def shape(self, size: str) -> dict:
        if size not in self.shapes:
            raise ValueError(f"size: expected one of {sorted(self.shapes)}, got {size!r}")
        return self.shapes[size]

    def label(self, size: str) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.shape(size).items())

    def library_name(self, device: str) -> str:
        return self.library_gpu if device == "cuda" else (self.library_cpu or f"{self.library_gpu} on the CPU")


def _gen(device):
    import torch

    return torch.Generator(device=device).manual_seed(SEED)


def _randn(gen, *shape, dtype=None, device="cpu", scale=1.0):
    import torch

    return (torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype or torch.float32)


# Lab 04: each puzzle's launch function fills ``out``; the library is PyTorch's own op (the course has
# no kernel for a puzzle).
def _puzzle(name, make, torch_op, library_gpu, gpu, tiny):
    def inputs(shape, device):
        return make(shape, device)

    def student(fns, x):
        return lambda: fns[name](*x["args"], x["out"])

    def library(x, device):
        return lambda: torch_op(*x["args"], **x.get("extra", {}))
    return Timed(4, name, (name,), {"gpu": gpu, "tiny": tiny}, inputs, student, None, library, library_gpu,
                 reference="library", fused_library=False, moved_bytes=_puzzle_bytes)


def _puzzle_bytes(x) -> int:
    """A puzzle reads every input array once and writes ``out`` once."""
    import torch

    arrays = [a for a in x["args"] if isinstance(a, torch.Tensor)] + [x["out"]]
    return sum(a.numel() * a.element_size() for a in arrays)


def _vec(shape, device):
    import torch

    gen = _gen(device)
    x, y = _randn(gen, shape["n"], device=device), _randn(gen, shape["n"], device=device)
    return {"args": (x, y, 0.5), "out": torch.empty_like(x)}


def _one(shape, device):
    import torch

    x = _randn(_gen(device), shape["n"], device=device)
    return {"args": (x,), "out": torch.empty(1, device=device)}


def _affine(shape, device):
    import torch

    gen = _gen(device)
    m, n = shape["M"], shape["N"]
    x, scale, bias = _randn(gen, m, n, device=device), _randn(gen, n, device=device), _randn(gen, n, device=device)
    return {"args": (x, scale, bias), "out": torch.empty(m, n, device=device)}


def _rows(shape, device, spread=1.0):
    import torch

    x = _randn(_gen(device), shape["M"], shape["N"], device=device, scale=spread)
    return {"args": (x,), "out": torch.empty(shape["M"], device=device)}


def _mat(shape, device):
    import torch

    gen = _gen(device)
    a = _randn(gen, shape["M"], shape["K"], dtype=torch.float16, device=device)
    b = _randn(gen, shape["K"], shape["N"], dtype=torch.float16, device=device)
    return {"args": (a, b), "out": torch.empty(shape["M"], shape["N"], device=device)}


def _causal(shape, device):
    import torch

    s = _randn(_gen(device), shape["Nq"], shape["Nk"], device=device, scale=3.0)
    n_q, n_k = s.shape
    hidden = torch.arange(n_k, device=device)[None, :] > torch.arange(n_q, device=device)[:, None] + (n_k - n_q)
    return {"args": (s, 0.125), "out": torch.empty_like(s), "extra": {"hidden": hidden}}


def _masked_softmax(s, scale, hidden):
    """PyTorch's causal softmax, its mask made beforehand (not timed)."""
    import torch

    return torch.softmax((s * scale).masked_fill(hidden, float("-inf")), dim=-1)


def _weighted(shape, device):
    import torch

    gen = _gen(device)
    s = _randn(gen, shape["M"], shape["N"], device=device, scale=3.0)
    v = _randn(gen, shape["N"], shape["D"], device=device)
    return {"args": (s, v), "out": torch.empty(shape["M"], shape["D"], device=device)}


def _lab04() -> list[Timed]:
    import torch

    return [
        _puzzle("scaled_add", _vec, lambda x, y, a: torch.add(y, x, alpha=a), "torch.add",
                {"n": 2**26}, {"n": 100}),
        _puzzle("block_max", _one, lambda x: x.max().reshape(1), "torch.max", {"n": 2**18}, {"n": 100}),
        _puzzle("affine_columns", _affine, lambda x, s, b: x * s + b, "x * scale + bias",
                {"M": 8192, "N": 8192}, {"M": 9, "N": 20}),
        _puzzle("row_sums", _rows, lambda x: x.sum(1), "torch.sum", {"M": 8192, "N": 8192}, {"M": 5, "N": 40}),
        _puzzle("matmul", _mat, lambda a, b: a @ b, "torch.matmul (fp16)",
                {"M": 2048, "N": 2048, "K": 2048}, {"M": 20, "N": 20, "K": 20}),
        _puzzle("causal_softmax", _causal, _masked_softmax, "torch.softmax (masked)",
                {"Nq": 4096, "Nk": 4096}, {"Nq": 6, "Nk": 20}),
        _puzzle("row_logsumexp", _rows, lambda x: torch.logsumexp(x, 1), "torch.logsumexp",
                {"M": 8192, "N": 8192}, {"M": 5, "N": 40}),
        _puzzle("softmax_weighted_sum", _weighted, lambda s, v: torch.softmax(s, -1) @ v,
                "torch.softmax, torch.matmul", {"M": 4096, "N": 4096, "D": 64}, {"M": 5, "N": 40, "D": 16}),
    ]


# Labs 05 and 06: fp16 q, k, v [B, H, N, D], one KV head per query head; the library is cuDNN's SDPA.
def _sdpa(q, k, v, causal, device):
    import torch.nn.functional as F

    if device != "cuda":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def _qkv(shape, device):
    import torch

    gen = _gen(device)
    b, h, n, d = shape["B"], shape["H"], shape["N"], shape["D"]
    return {k: _randn(gen, b, h, n, d, dtype=torch.float16, device=device) for k in ("q", "k", "v", "do")}


def _forward(causal: bool) -> Timed:
    def inputs(shape, device):
        x = _qkv(shape, device)
        x.pop("do")
        return x

    def student(fns, x):
        return lambda: fns["flash_forward"](x["q"], x["k"], x["v"], causal=causal)

    def course(x):
        from ...kernels.flash import flash_attention_forward

        return lambda: flash_attention_forward(x["q"], x["k"], x["v"], causal=causal)

    def library(x, device):
        return lambda: _sdpa(x["q"], x["k"], x["v"], causal, device)

    return Timed(5, f"flash_forward{' causal' if causal else ''}", ("flash_forward",),
                 {"gpu": {"B": 8, "H": 16, "N": 4096, "D": 64}, "tiny": {"B": 1, "H": 1, "N": 20, "D": 16}},
                 inputs, student, course, library, "cuDNN SDPA", library_cpu="PyTorch SDPA on the CPU")


def _backward(causal: bool) -> Timed:
    def inputs(shape, device):
        from ...kernels.flash import flash_attention_forward

        x = _qkv(shape, device)
        x["o"], x["lse"] = flash_attention_forward(x["q"], x["k"], x["v"], causal=causal)
        return x

    def student(fns, x):
        args = (x["q"], x["k"], x["v"], x["o"], x["lse"], x["do"])

        def call():
            dq = fns["flash_dq"](*args, causal=causal)
            dk, dv = fns["flash_dkdv"](*args, causal=causal)
            return dq, dk, dv
        return call

    def course(x):
        from ...kernels.flash import flash_attention_backward

        return lambda: flash_attention_backward(x["do"], x["q"], x["k"], x["v"], x["o"], x["lse"], causal=causal)

    def library(x, device):
        import torch

        q, k, v = (x[n].detach().clone().requires_grad_() for n in ("q", "k", "v"))
        o = _sdpa(q, k, v, causal, device)
        return lambda: torch.autograd.grad(o, (q, k, v), x["do"], retain_graph=True)

    return Timed(6, f"backward{' causal' if causal else ''}", ("row_term", "flash_dkdv", "flash_dq"),
                 {"gpu": {"B": 4, "H": 16, "N": 4096, "D": 64}, "tiny": {"B": 1, "H": 1, "N": 20, "D": 16}},
                 inputs, student, course, library, "cuDNN SDPA backward",
                 library_cpu="PyTorch SDPA backward on the CPU")


# Lab 08: one decode step over a paged cache (pages in a random order); the library is cuDNN's SDPA on
# the same cache gathered into a contiguous [B, Hkv, N, D] copy beforehand (the gather is not timed), the
# query heads of a KV head passed as its query rows.
def _paged_inputs(shape, device):
    import torch

    gen = _gen(device)
    b, hq, hkv, d, n, page = shape["B"], shape["Hq"], shape["Hkv"], shape["D"], shape["N"], shape["page"]
    per_seq = n // page
    k = _randn(gen, b, hkv, n, d, dtype=torch.float16, device=device)
    v = _randn(gen, b, hkv, n, d, dtype=torch.float16, device=device)
    q = _randn(gen, b, hq, d, dtype=torch.float16, device=device)
    table = torch.randperm(b * per_seq, generator=gen, device=device).reshape(b, per_seq).int()
    k_pages = torch.empty(b * per_seq, page, hkv, d, dtype=torch.float16, device=device)
    v_pages = torch.empty_like(k_pages)
    k_pages[table.long()] = k.transpose(1, 2).reshape(b, per_seq, page, hkv, d)
    v_pages[table.long()] = v.transpose(1, 2).reshape(b, per_seq, page, hkv, d)
    lens = torch.full((b,), n, dtype=torch.int32, device=device)
    return {"q": q, "k_pages": k_pages, "v_pages": v_pages, "table": table, "lens": lens, "k": k, "v": v}


def _paged() -> Timed:
    def student(fns, x):
        return lambda: fns["paged_decode"](x["q"], x["k_pages"], x["v_pages"], x["table"], x["lens"])

    def course(x):
        from ...kernels.paged import paged_decode

        return lambda: paged_decode(x["q"], x["k_pages"], x["v_pages"], x["table"], x["lens"])

    def library(x, device):
        b, hq, d = x["q"].shape
        hkv = x["k"].shape[1]
        rows = x["q"].view(b, hkv, hq // hkv, d)
        return lambda: _sdpa(rows, x["k"], x["v"], False, device).reshape(b, hq, d)

    return Timed(8, "paged_decode", ("paged_decode",),
                 {"gpu": {"B": 64, "Hq": 32, "Hkv": 8, "D": 128, "N": 4096, "page": 16},
                  "tiny": {"B": 2, "Hq": 4, "Hkv": 2, "D": 16, "N": 32, "page": 16}},
                 _paged_inputs, student, course, library, "cuDNN SDPA on the gathered contiguous cache",
                 library_cpu="PyTorch SDPA on the gathered contiguous cache, on the CPU")


def timed_kernels() -> dict[int, list[Timed]]:
    """Lab number -> its timed kernels, in the order the leaderboard lists them."""
    return {4: _lab04(), 5: [_forward(False), _forward(True)], 6: [_backward(False), _backward(True)],
            8: [_paged()]}


TIMED_LABS = (4, 5, 6, 8)
