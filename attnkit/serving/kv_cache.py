"""The KV cache's size, and grouped heads.

- ``kv_cache_bytes(*, num_layers, num_kv_heads, head_dim, tokens, dtype_bytes=2, batch=1)``: bytes of K
  and V together, 2 · L · Hkv · D · tokens · batch · dtype_bytes.
- ``max_batch_size(config, *, context, memory_bytes, dtype_bytes=2)``: how many sequences of
  ``context`` tokens fit in ``memory_bytes`` of cache.
- ``calculator()``: an ipywidgets calculator over ``attnkit.serving.model_configs.MODELS`` (ipywidgets 7 and 8).
- ``pool_kv_heads(x, num_kv_heads)``: [B, H, N, D] -> [B, Hkv, N, D], the mean of each group of H/Hkv
  heads (how an MHA checkpoint is turned into GQA before fine-tuning).
"""
from __future__ import annotations

import torch

from ..validation import positive_int

GIB = 2 ** 30


def kv_cache_bytes(*, num_layers, num_kv_heads, head_dim, tokens, dtype_bytes=2, batch=1) -> int:
    """Bytes of the K and V caches together: 2 · num_layers · num_kv_heads · head_dim · tokens · batch · dtype_bytes.

    Every argument must be a positive integer, Python's or NumPy's (ValueError naming it otherwise). The
    product is taken in Python integers, which do not wrap (NumPy's int64 would past 2**63).
    """
    args = dict(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, tokens=tokens,
                dtype_bytes=dtype_bytes, batch=batch)
    total = 2
    for name, value in args.items():
        total *= positive_int(name, value)          # a Python int
    return total


def model_cache_bytes(config, *, tokens: int, batch: int = 1, dtype_bytes: int = 2) -> int:
    """``kv_cache_bytes`` for an ``attnkit.serving.model_configs.ModelConfig``."""
    return kv_cache_bytes(num_layers=config.num_layers, num_kv_heads=config.num_kv_heads,
                          head_dim=config.head_dim, tokens=tokens, dtype_bytes=dtype_bytes, batch=batch)


def max_batch_size(config, *, context: int, memory_bytes: int, dtype_bytes: int = 2) -> int:
    """The most sequences of ``context`` tokens whose cache fits in ``memory_bytes`` (0 if not even one)."""
    memory_bytes = positive_int("memory_bytes", memory_bytes)
    return memory_bytes // model_cache_bytes(config, tokens=context, dtype_bytes=dtype_bytes)


def describe_cache(config, *, context: int, batch: int, dtype_bytes: int, memory_gib: float) -> str:
    """The calculator's text: the cache of ``batch`` sequences and the largest batch that fits."""
    size = model_cache_bytes(config, tokens=context, batch=batch, dtype_bytes=dtype_bytes)
    per_seq = model_cache_bytes(config, tokens=context, dtype_bytes=dtype_bytes)
    fits = int(memory_gib * GIB) // per_seq
    return "\n".join([
        f"{config.name} ({config.kind}, Hq={config.num_q_heads}, Hkv={config.num_kv_heads}, "
        f"D={config.head_dim}, {config.num_layers} layers), {dtype_bytes}-byte elements",
        f"  per token:   2·{config.num_layers}·{config.num_kv_heads}·{config.head_dim}·{dtype_bytes} = "
        f"{config.kv_bytes_per_token(dtype_bytes):,} bytes",
        f"  cache for batch {batch} × {context:,} tokens: {size:,} bytes = {size / GIB:.2f} GiB",
        f"  largest batch in {memory_gib:g} GiB of cache memory: {fits} "
        f"({per_seq / GIB:.3f} GiB per sequence)",
    ])


class _CalculatorBox:
    """Mix-in: a fixed text form, so a saved notebook reads the same under ipywidgets 7 and 8."""

    def __repr__(self) -> str:
        return "KV-cache calculator (interactive with a running kernel)"


def calculator(*, model: str = "Llama 3 8B", context: int = 8192, batch: int = 8, dtype: str = "bf16",
               memory_gib: float = 80.0):
    """An ipywidgets calculator: model, context, batch, dtype, GPU memory -> cache GiB, largest batch.

    Uses only widgets and calls that ipywidgets 7 and 8 both have.
    """
    import ipywidgets as widgets

    from .model_configs import MODELS

    names = [m.name for m in MODELS]
    dtypes = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
    controls = dict(
        name=widgets.Dropdown(options=names, value=model, description="model"),
        context=widgets.IntSlider(value=context, min=512, max=131072, step=512, description="context"),
        batch=widgets.IntSlider(value=batch, min=1, max=256, description="batch"),
        dtype=widgets.Dropdown(options=list(dtypes), value=dtype, description="dtype"),
        memory_gib=widgets.FloatSlider(value=memory_gib, min=8.0, max=192.0, step=8.0, description="GiB"),
    )

    result = widgets.HTML()                      # a widget's value, not printed output: the same in 7 and 8

    def update(_change=None):
        from html import escape

        from .model_configs import model as lookup

        text = describe_cache(lookup(controls["name"].value), context=controls["context"].value,
                              batch=controls["batch"].value, dtype_bytes=dtypes[controls["dtype"].value],
                              memory_gib=controls["memory_gib"].value)
        result.value = f"<pre>{escape(text)}</pre>"

    for control in controls.values():
        control.observe(update, names="value")
    update()
    box_type = type("KVCacheCalculator", (_CalculatorBox, widgets.VBox), {})
    return box_type([widgets.HBox([controls["name"], controls["dtype"]]),
                     controls["context"], controls["batch"], controls["memory_gib"], result])


# ---------------------------------------------------------------------------------- grouped heads
def pool_kv_heads(x: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[B, H, N, D] -> [B, Hkv, N, D]: KV head r is the mean of heads r·g .. r·g + g − 1 (g = H / Hkv)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"x: expected a tensor [B, H, N, D], got {getattr(x, 'shape', type(x).__name__)}")
    num_kv_heads = positive_int("num_kv_heads", num_kv_heads)
    heads = x.shape[1]
    if heads % num_kv_heads:
        raise ValueError(f"num_kv_heads: must divide the {heads} heads of x (H % Hkv == 0), got {num_kv_heads}")
    b, _, n, d = x.shape
    return x.reshape(b, num_kv_heads, heads // num_kv_heads, n, d).mean(dim=2)
