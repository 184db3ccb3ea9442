# ruff: noqa: E501, B007, F841
"""Round 5 of fresh wrong answers for lab 07 (GQA and the KV cache), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; the kernel answers
are the solution's kernel and launch function with one student's edit (the docstring says which). New classes
here: an allocation granularity the exercise does not have (whole pages), a context capped by a model field
the exercise does not use, an input rotated in place with the right result, the two modes mixed between q
and k, keys cached unrotated. The correct answers rotate with rotate_half and take the sign from the
partner's side."""
import math

import torch

from attnkit.device import ensure_triton_backend
from attnkit.reference.rope import rope_cache
from attnkit.serving.model_configs import MODELS

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ---------------------------------------------------------------- the solution

def cache_bytes(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes


def max_sequences(model, context, free_gib, dtype_bytes, window=None):
    tokens = context if window is None else min(context, window)       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)                       # whole sequences only


def rope(x, positions, mode):
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


@triton.jit
def rope_append_kernel(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)                          # the last axis is contiguous (stride 1)
    past = tl.load(seqlens_k + b) + 1 - S        # seqlens_k = index of the last token
    pos = past + s
    if INTERLEAVED:
        partner = d ^ 1
        freq = d // 2
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    else:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        freq = tl.where(d < D // 2, d, d - D // 2)
        sign = tl.where(d < D // 2, -1.0, 1.0)
    c = tl.load(cos + pos * s_cos + freq)
    sn = tl.load(sin + pos * s_cos + freq)
    if head < HQ:
        row = q + b * sq_b + s * sq_s + head * sq_h
        x = tl.load(row + d)
        y = x * c + sign * tl.load(row + partner) * sn
        tl.store(q_out + b * sq_b + s * sq_s + head * sq_h + d, y)
    else:
        h = head - HQ
        row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


SOLUTION = {"cache_bytes": cache_bytes, "max_sequences": max_sequences, "rope": rope, "rope_append": rope_append}


# ---------------------------------------------------------------- exercise 1a


def cb_rounded_to_pages(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a. Tokens rounded up to whole pages of 16 ('a paged cache allocates pages'): the exercise
    counts the tokens' K and V vectors, with no page size."""
    tokens = math.ceil(tokens / 16) * 16
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes


# ---------------------------------------------------------------- exercise 1b


def ms_capped_at_max_context(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Tokens capped at model.max_context ('the model never holds more than its context
    length'): the exercise sizes sequences of `context` tokens whatever the model's field says."""
    tokens = context if window is None else min(context, window)
    tokens = min(tokens, model.max_context)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)


# ---------------------------------------------------------------- exercise 2


def rp_interleaved_in_place(x, positions, mode):
    """Exercise 2. Interleaved mode written back into x, x[:, 0::2], x[:, 1::2] = ..., and x returned ('no new
    tensor'): the right numbers (the right-hand side is computed first), but the caller's x is rotated."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    x[:, 0::2], x[:, 1::2] = a * cos - b * sin, b * cos + a * sin
    return x


def rope_rotate_half(x, positions, mode):
    """Exercise 2, correct: x · cos + rotate_half(x) · sin with the angles repeated over the two halves (the
    Hugging Face form); the interleaved mode by the same formula on the de-interleaved columns."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    cos = torch.cat([torch.cos(angle)] * 2, dim=1)
    sin = torch.cat([torch.sin(angle)] * 2, dim=1)
    order = torch.arange(D) if mode == "half" else torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])
    y = x[:, order]
    rotated = torch.cat([-y[:, D // 2:], y[:, : D // 2]], dim=1)
    out = y * cos + rotated * sin
    result = torch.empty_like(out)
    result[:, order] = out
    return result


# ---------------------------------------------------------------- exercise 3


# ---------------------------------------------------------------- ra_q_always_half

@triton.jit
def rope_append_kernel__ra_q_always_half(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)                          # the last axis is contiguous (stride 1)
    past = tl.load(seqlens_k + b) + 1 - S        # seqlens_k = index of the last token
    pos = past + s
    if INTERLEAVED:
        partner = d ^ 1
        freq = d // 2
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    else:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        freq = tl.where(d < D // 2, d, d - D // 2)
        sign = tl.where(d < D // 2, -1.0, 1.0)
    c = tl.load(cos + pos * s_cos + freq)
    sn = tl.load(sin + pos * s_cos + freq)
    if head < HQ:
        row = q + b * sq_b + s * sq_s + head * sq_h
        hp = tl.where(d < D // 2, d + D // 2, d - D // 2)
        hf = tl.where(d < D // 2, d, d - D // 2)
        hs = tl.where(d < D // 2, -1.0, 1.0)
        x = tl.load(row + d)
        y = x * tl.load(cos + pos * s_cos + hf) + hs * tl.load(row + hp) * tl.load(sin + pos * s_cos + hf)
        tl.store(q_out + b * sq_b + s * sq_s + head * sq_h + d, y)
    else:
        h = head - HQ
        row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_q_always_half(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. The query's rotation written with its own half-mode partner, frequency and sign (copied from
    lesson 7's half-mode cell), the key's with the mode's: in interleaved mode q and k are turned by different
    pairings."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_q_always_half[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# ---------------------------------------------------------------- ra_k_cached_unrotated

@triton.jit
def rope_append_kernel__ra_k_cached_unrotated(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)                          # the last axis is contiguous (stride 1)
    past = tl.load(seqlens_k + b) + 1 - S        # seqlens_k = index of the last token
    pos = past + s
    if INTERLEAVED:
        partner = d ^ 1
        freq = d // 2
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    else:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        freq = tl.where(d < D // 2, d, d - D // 2)
        sign = tl.where(d < D // 2, -1.0, 1.0)
    c = tl.load(cos + pos * s_cos + freq)
    sn = tl.load(sin + pos * s_cos + freq)
    if head < HQ:
        row = q + b * sq_b + s * sq_s + head * sq_h
        x = tl.load(row + d)
        y = x * c + sign * tl.load(row + partner) * sn
        tl.store(q_out + b * sq_b + s * sq_s + head * sq_h + d, y)
    else:
        h = head - HQ
        row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d)
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_k_cached_unrotated(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. Writes the new keys into the cache unrotated, y = tl.load(row + d) ('the keys are turned when
    attention reads them'): the exercise caches rotated keys."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_k_cached_unrotated[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# ---------------------------------------------------------------- rope_append_sign_from_partner

@triton.jit
def rope_append_kernel__rope_append_sign_from_partner(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)                          # the last axis is contiguous (stride 1)
    past = tl.load(seqlens_k + b) + 1 - S        # seqlens_k = index of the last token
    pos = past + s
    if INTERLEAVED:
        partner = d ^ 1
        freq = d // 2
        sign = tl.where(partner > d, -1.0, 1.0)
    else:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        freq = tl.where(d < D // 2, d, d - D // 2)
        sign = tl.where(partner > d, -1.0, 1.0)
    c = tl.load(cos + pos * s_cos + freq)
    sn = tl.load(sin + pos * s_cos + freq)
    if head < HQ:
        row = q + b * sq_b + s * sq_s + head * sq_h
        x = tl.load(row + d)
        y = x * c + sign * tl.load(row + partner) * sn
        tl.store(q_out + b * sq_b + s * sq_s + head * sq_h + d, y)
    else:
        h = head - HQ
        row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def rope_append_sign_from_partner(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3, correct: the sign from the partner's side, −1 when the partner lies after d (the first of its
    pair), in both modes."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__rope_append_sign_from_partner[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


WRONG = {
    "cache_bytes": [cb_rounded_to_pages],
    "max_sequences": [ms_capped_at_max_context],
    "rope": [rp_interleaved_in_place],
    "rope_append": [ra_q_always_half, ra_k_cached_unrotated],
}
CORRECT = {"rope": [rope, rope_rotate_half], "rope_append": [rope_append, rope_append_sign_from_partner]}

_LLAMA2_7B = next(m for m in MODELS if m.name == "Llama 2 7B")


def _rope_and_input(f):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    pos = torch.tensor([3, 9, 100, 4000, 4095])
    out = f(x, pos, "interleaved").clone()
    return [out, x]


def _append(f):
    out = []
    for mode in ("half", "interleaved"):
        g = torch.Generator().manual_seed(5)
        B, S, HQ, HKV, D, SC = 2, 3, 4, 2, 16, 32
        q, k, v = (torch.randn(B, S, h, D, generator=g) for h in (HQ, HKV, HKV))
        k_cache = torch.zeros(B, HKV, SC, D)
        v_cache = torch.zeros(B, HKV, SC, D)
        seqlens_k = torch.tensor([9, 20], dtype=torch.int32)
        q_out = f(q, k, v, k_cache, v_cache, seqlens_k, mode)
        out += [q_out, k_cache, v_cache]
    return out


WITNESS = {
    "cb_rounded_to_pages": lambda f: f(32, 8, 128, 1000, 2, 1),
    "ms_capped_at_max_context": lambda f: f(_LLAMA2_7B, 8192, 40.0, 2),
    "rp_interleaved_in_place": _rope_and_input,
    "ra_q_always_half": _append, "ra_k_cached_unrotated": _append,
}
