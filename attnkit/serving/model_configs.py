"""Attention shapes of real language models, each copied from its published ``config.json``.

Only the numbers that size a KV cache and a rotary embedding are kept: layers, query heads, key/value
heads, head dimension, the context the model was configured for and the RoPE base. ``source`` is the
address of the ``config.json`` on the Hugging Face hub that each number comes from; where a config
does not name ``head_dim``, it is ``hidden_size // num_attention_heads``.

    >>> from attnkit.serving.model_configs import MODELS, model
    >>> model("Llama 3 8B").group_size
    4
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """One model's attention shape."""

    name: str
    num_layers: int          # config: num_hidden_layers (n_layer)
    num_q_heads: int         # config: num_attention_heads (n_head)
    num_kv_heads: int        # config: num_key_value_heads (1 where "multi_query": true)
    head_dim: int            # config: head_dim, else hidden_size // num_attention_heads
    max_context: int         # config: max_position_embeddings (Falcon 7B names none: FalconConfig's 2048)
    rope_theta: float        # config: rope_theta (10000 where the config leaves the default)
    source: str              # the config.json these numbers come from
    note: str = ""

    @property
    def group_size(self) -> int:
        """g = Hq / Hkv: how many query heads share one K/V head."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def kind(self) -> str:
        """'MHA' (Hkv = Hq), 'MQA' (Hkv = 1) or 'GQA' (in between)."""
        if self.num_kv_heads == self.num_q_heads:
            return "MHA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "GQA"

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes of K and V one token adds to the cache, over all layers: 2 · L · Hkv · D · bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def _hub(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


MODELS: tuple[ModelConfig, ...] = (
    ModelConfig("Llama 2 7B", 32, 32, 32, 128, 4096, 10000.0, _hub("meta-llama/Llama-2-7b-hf")),
    ModelConfig("Llama 2 70B", 80, 64, 8, 128, 4096, 10000.0, _hub("meta-llama/Llama-2-70b-hf")),
    ModelConfig("Llama 3 8B", 32, 32, 8, 128, 8192, 500000.0, _hub("meta-llama/Meta-Llama-3-8B")),
    ModelConfig("Llama 3 70B", 80, 64, 8, 128, 8192, 500000.0, _hub("meta-llama/Meta-Llama-3-70B")),
    ModelConfig("Mistral 7B", 32, 32, 8, 128, 32768, 10000.0, _hub("mistralai/Mistral-7B-v0.1"),
                note="sliding window of 4096 tokens: a rolling cache never holds more than 4096"),
    ModelConfig("Qwen2.5 7B", 28, 28, 4, 128, 131072, 1000000.0, _hub("Qwen/Qwen2.5-7B")),
    ModelConfig("Gemma 2 9B", 42, 16, 8, 256, 8192, 10000.0, _hub("google/gemma-2-9b"),
                note="every other layer uses a 4096-token sliding window"),
    ModelConfig("Falcon 7B", 32, 71, 1, 64, 2048, 10000.0, _hub("tiiuae/falcon-7b"),
                note='"multi_query": true, so one K/V head; head_dim = 4544 / 71 = 64'),
)


def model(name: str) -> ModelConfig:
    """The configuration called ``name`` (see ``MODELS``); ValueError naming the known ones otherwise."""
    for m in MODELS:
        if m.name == name:
            return m
    raise ValueError(f"name: unknown model {name!r}; known: {[m.name for m in MODELS]}")


def table() -> str:
    """The model table as aligned text, with the cache bytes one token adds in 16-bit precision."""
    header = f"{'model':<12} {'layers':>6} {'Hq':>4} {'Hkv':>4} {'g':>3} {'D':>4} {'kind':>4} {'KiB/token':>10}"
    lines = [header, "-" * len(header)]
    for m in MODELS:
        lines.append(f"{m.name:<12} {m.num_layers:>6} {m.num_q_heads:>4} {m.num_kv_heads:>4} "
                     f"{m.group_size:>3} {m.head_dim:>4} {m.kind:>4} {m.kv_bytes_per_token() / 1024:>10.0f}")
    return "\n".join(lines)
