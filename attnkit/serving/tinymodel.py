"""A tiny decoder-only transformer that lesson 9 serves: characters in, characters out.

Shape of the model (``TinyConfig``): token embedding → 2 blocks → RMSNorm → linear head to the
vocabulary. Each block is pre-norm: x + attention(norm(x)), then x + MLP(norm(x)). Attention is
grouped-query (4 query heads, 2 key/value heads, head dim 16) with rotary embeddings (half-split)
applied to queries and keys.

The attention itself is left to the caller, so the same weights run three ways:

- ``model(tokens)``: the plain forward pass over whole sequences, attention written out in PyTorch
  (causal, no cache). Training uses it, and it is the reference that serving is checked against.
- ``attnkit.serving.engine``: prefill with the course's ``flash_attention`` and decode with ``paged_decode``
  over a paged KV cache, through ``Block.project_qkv`` and ``Block.finish``.

The weights in ``attnkit/data/tiny_model.pt`` come from ``scripts/train_tiny_model.py``.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..reference.rope import apply_rope

DATA = Path(__file__).resolve().parents[1] / "data"
CORPUS_PATH = DATA / "tiny_corpus.txt"
WEIGHTS_PATH = DATA / "tiny_model.pt"


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4            # query heads Hq
    n_kv_heads: int = 2         # key/value heads Hkv (grouped-query: Hq / Hkv = 2 query heads per KV head)
    head_dim: int = 16
    d_ff: int = 256
    max_seq_len: int = 128      # the longest sequence (prompt + output) the model is served with
    rope_base: float = 10000.0

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads: must be a multiple of n_kv_heads ({self.n_heads} % {self.n_kv_heads} != 0)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even for rotary embeddings, got {self.head_dim}")

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Cache bytes one token adds, K and V over all layers: 2 · L · Hkv · D · bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes


# ----------------------------------------------------------------------------------- the plain path
def causal_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √D + causal mask) v written out in PyTorch; grouped-query heads by repetition.

    q [B, Hq, Tq, D]; k, v [B, Hkv, Tk, D] → [B, Hq, Tq, D]. With Tq < Tk the queries are the last Tq
    positions (a chunk after a cached prefix): the mask is aligned to the end, as in flash_attention.
    """
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)                          # [B, Hq, Tk, D]
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])      # [B, Hq, Tq, Tk]
    tq, tk = q.shape[2], k.shape[2]
    future = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(1 + tk - tq)
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# --------------------------------------------------------------------------------------- the model
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """One pre-norm transformer block, split around attention so the caller chooses how to attend."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.attn_norm = RMSNorm(cfg.d_model)
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.mlp_norm = RMSNorm(cfg.d_model)
        self.up = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def project_qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x [B, T, d_model], positions [B, T] → q [B, Hq, T, D], k and v [B, Hkv, T, D] (RoPE on q, k)."""
        cfg = self.cfg
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, t, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        pos = positions[:, None, :]                                # [B, 1, T]: broadcasts over heads
        rope = functools.partial(apply_rope, positions=pos, mode="half", base=cfg.rope_base)
        return rope(q), rope(k), v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """x [B, T, d_model], attn [B, Hq, T, D] → the block's output [B, T, d_model]."""
        b, _, t, _ = attn.shape
        x = x + self.wo(attn.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(nn.functional.gelu(self.up(self.mlp_norm(x))))


class TinyModel(nn.Module):
    """The tiny character-level decoder. ``vocab`` is the list of its characters, index = token id."""

    def __init__(self, cfg: TinyConfig, vocab: list[str]):
        super().__init__()
        if len(vocab) != cfg.vocab_size:
            raise ValueError(f"vocab: has {len(vocab)} characters, the config says vocab_size={cfg.vocab_size}")
        self.cfg = cfg
        self.vocab = list(vocab)
        self._ids = {ch: i for i, ch in enumerate(self.vocab)}
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.5)

    # text ↔ token ids
    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"text: characters {unknown} are not in the model's vocabulary")
        return [self._ids[ch] for ch in text]

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and head: [..., d_model] → [..., vocab]."""
        return self.head(self.norm(x))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """The plain forward pass, no cache: tokens [B, T] → logits [B, T, vocab]."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens: expected [B, T], got shape {tuple(tokens.shape)}")
        b, t = tokens.shape
        positions = torch.arange(t, device=tokens.device).expand(b, t)
        x = self.embed(tokens)                                     # [B, T, d_model]
        for block in self.blocks:
            q, k, v = block.project_qkv(x, positions)
            x = block.finish(x, causal_attention_torch(q, k, v))
        return self.logits(x)


@torch.no_grad()
def greedy_no_cache(model: TinyModel, prompt: list[int], max_new_tokens: int, stop_token: int | None = None):
    """Greedy decoding by the plain forward pass: the whole sequence is recomputed for every new token.

    Returns (new tokens, the logits [n_new, vocab] each was chosen from). Stops after ``stop_token``.
    """
    if not prompt:
        raise ValueError("prompt: needs at least one token")
    seq = list(prompt)
    device = model.head.weight.device
    tokens, logits = [], []
    for _ in range(max_new_tokens):
        last = model(torch.tensor([seq], device=device))[0, -1]    # [vocab]
        token = int(last.argmax())
        tokens.append(token)
        logits.append(last)
        seq.append(token)
        if token == stop_token:
            break
    return tokens, torch.stack(logits)


# -------------------------------------------------------------------------------------- save, load
def save_model(model: TinyModel, path: Path = WEIGHTS_PATH) -> None:
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"config": asdict(model.cfg), "vocab": model.vocab, "state_dict": state}, path)


def load_model(path: Path = WEIGHTS_PATH) -> TinyModel:
    """The trained tiny model from ``path``, in float32 on the CPU, in eval mode."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    model = TinyModel(TinyConfig(**saved["config"]), saved["vocab"])
    model.load_state_dict(saved["state_dict"])
    return model.eval().requires_grad_(False)


@functools.lru_cache(maxsize=1)
def _cached_model() -> TinyModel:
    return load_model()


def tiny_model() -> TinyModel:
    """The shipped model (loaded once)."""
    return _cached_model()


__all__ = ["TinyConfig", "TinyModel", "Block", "causal_attention_torch", "greedy_no_cache",
           "save_model", "load_model", "tiny_model", "CORPUS_PATH", "WEIGHTS_PATH"]
