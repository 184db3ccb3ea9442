"""What a served run is checked and measured against: the plain forward pass without a cache (token by
token, greedy), and a contiguous cache of max_batch × max_seq_len tokens (bytes)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .request import ServeResult, stop_token
from .tinymodel import TinyModel, greedy_no_cache


@dataclass(frozen=True)
class Comparison:
    """Served tokens against the plain forward pass without a cache, request by request."""

    equal: dict[int, bool]                  # rid → every token identical
    served_logits: list[torch.Tensor]       # per request [n, vocab]: the logits the engine chose from
    reference_logits: list[torch.Tensor]    # the same positions by the no-cache forward pass

    @property
    def all_equal(self) -> bool:
        return all(self.equal.values())

    @property
    def max_logit_diff(self) -> float:
        """Largest |served logit − no-cache logit| over every position compared."""
        return max(float((s - r).abs().max()) for s, r in zip(self.served_logits, self.reference_logits))

    @property
    def min_margin(self) -> float:
        """Smallest gap between the best and the second-best no-cache logit: how close to a tie."""
        top2 = torch.cat(self.reference_logits).topk(2, dim=-1).values
        return float((top2[:, 0] - top2[:, 1]).min())


def compare_with_no_cache(model: TinyModel, result: ServeResult, stop: str | None = "\n") -> Comparison:
    """Regenerate every request greedily by the plain no-cache forward pass and compare token by token.

    Logits are compared over the positions both produced (all of them when the tokens are equal).
    """
    stop_id = stop_token(model, stop)
    equal, served, reference = {}, [], []
    for rid, c in result.completions.items():
        ref_tokens, ref_logits = greedy_no_cache(model, c.prompt_ids, c.request.max_new_tokens, stop_id)
        equal[rid] = ref_tokens == c.tokens
        n = min(len(ref_tokens), len(c.tokens))
        served.append(torch.stack(c.logits[:n]).to(ref_logits))
        reference.append(ref_logits[:n])
    return Comparison(equal, served, reference)


def kv_memory(engine, result: ServeResult) -> dict:
    """Cache bytes: the paged cache's peak use against a contiguous cache of max_batch × max_seq_len."""
    per_token = engine.cfg.kv_bytes_per_token(engine.cache.k.element_size())
    peak_pages = max(s.pages_in_use for s in result.steps)
    return {
        "bytes_per_token": per_token,
        "contiguous_tokens": engine.max_batch * engine.cfg.max_seq_len,
        "contiguous_bytes": engine.max_batch * engine.cfg.max_seq_len * per_token,
        "pool_pages": engine.cache.num_pages,
        "pool_bytes": engine.cache.num_pages * engine.page_size * per_token,
        "peak_pages": peak_pages,
        "peak_bytes": peak_pages * engine.page_size * per_token,
        "peak_tokens_cached": max(s.tokens_cached for s in result.steps),
    }
