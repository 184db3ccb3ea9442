# ruff: noqa: E501, B007, F841
"""Round 4 of fresh wrong answers for lab 07 (GQA and the KV cache), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; the kernel answers
are the solution's kernel and launch function with one student's edit (the docstring says which). New classes
here: a count that overflows a 32-bit integer, "at least one" where none fits, an exactly full budget, an
argument ignored for the value it usually has, a table cached between calls, q and k turned at different
positions, the partner read from the wrong tensor, K written where V belongs."""
import numpy as np
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


def cb_int32(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a. np.prod(..., dtype=np.int32) ('a count fits in 32 bits'): it wraps around past 2^31 bytes
    (2 GiB) without an error, and returns np.int32, not int."""
    return np.prod([2, num_layers, num_kv_heads, head_dim, tokens, batch, dtype_bytes], dtype=np.int32)


# ---------------------------------------------------------------- exercise 1b


def ms_at_least_one(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. max(1, ...) ('a server always serves someone'): says 1 when not even one sequence fits."""
    tokens = context if window is None else min(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return max(1, int(free_gib * 2**30 // per_sequence))


def ms_strictly_less(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. (free − 1) // per_sequence ('the sequences must take strictly less than what is free'): one
    too few when the sequences fill the free memory exactly."""
    tokens = context if window is None else min(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int((free_gib * 2**30 - 1) // per_sequence)


def ms_window_from_model_note(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Ignores the window argument and applies 4096 whenever the model's note mentions a sliding
    window ('the model knows its window'): Gemma 2 gets a window it has on half its layers only, and a
    window passed for another model is ignored."""
    window = 4096 if "sliding window" in model.note else None
    tokens = context if window is None else min(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)


# ---------------------------------------------------------------- exercise 2


def rp_positions_arange(x, positions, mode):
    """Exercise 2. Angles from torch.arange(S) ('token s is at position s'): the positions argument is
    ignored, right only when positions are 0 .. S − 1."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = torch.arange(S, dtype=torch.float64)[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


_tables = {}


def rp_table_cached(x, positions, mode):
    """Exercise 2. Caches cos and sin by (S, D) ('the table does not change'): a later call with other positions
    of the same length reuses the first call's angles."""
    S, D = x.shape
    if (S, D) not in _tables:
        j = torch.arange(D // 2, dtype=torch.float64)
        angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
        _tables[(S, D)] = (torch.cos(angle), torch.sin(angle))
    cos, sin = _tables[(S, D)]
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


def rope_half_exponent(x, positions, mode):
    """Exercise 2, correct: the frequency written base^(−j/(D/2)) (the same number as base^(−2j/D)), the
    result in x's dtype."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.to(torch.float64).unsqueeze(1) * torch.pow(10000.0, -j / (D // 2))
    cos, sin = angle.cos(), angle.sin()
    if mode == "half":
        a, b = x[:, : D // 2].double(), x[:, D // 2 :].double()
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    else:
        a, b = x[:, 0::2].double(), x[:, 1::2].double()
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(1)
    return out.to(x.dtype)


# ---------------------------------------------------------------- exercise 3

# ---------------------------------------------------------------- ra_q_at_previous_position

@triton.jit
def rope_append_kernel__ra_q_at_previous_position(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        c = tl.load(cos + tl.maximum(pos - 1, 0) * s_cos + freq)
        sn = tl.load(sin + tl.maximum(pos - 1, 0) * s_cos + freq)
        y = x * c + sign * tl.load(row + partner) * sn
        tl.store(q_out + b * sq_b + s * sq_s + head * sq_h + d, y)
    else:
        h = head - HQ
        row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_q_at_previous_position(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. Rotates the query at pos − 1 ("the query attends from the last cached position"), the keys at
    pos: q and k of the same token turn by different angles."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_q_at_previous_position[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# ---------------------------------------------------------------- ra_k_partner_from_v

@triton.jit
def rope_append_kernel__ra_k_partner_from_v(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        y = tl.load(row + d) * c + sign * tl.load(v + b * sk_b + s * sk_s + h * sk_h + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_k_partner_from_v(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. The key's partner element loaded from the V row (row + partner written with v's base, copied
    from the V line): each key is turned with its value's partner."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_k_partner_from_v[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# ---------------------------------------------------------------- ra_v_unrotated_is_k

@triton.jit
def rope_append_kernel__ra_v_unrotated_is_k(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        tl.store(v_cache + out, y)


def ra_v_unrotated_is_k(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. V written from the rotated key y ("the cache rows are the same for K and V") instead of
    copying v."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_v_unrotated_is_k[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# ---------------------------------------------------------------- rope_append_xor_partner

@triton.jit
def rope_append_kernel__rope_append_xor_partner(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        partner = d ^ (D // 2)
        freq = d % (D // 2)
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


def rope_append_xor_partner(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3, correct: the half-mode partner as d ^ (D // 2) and its frequency as d % (D // 2) (D is a power
    of two for tl.arange, so the bit D/2 is the half)."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__rope_append_xor_partner[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


WRONG = {
    "cache_bytes": [cb_int32],
    "max_sequences": [ms_at_least_one, ms_strictly_less, ms_window_from_model_note],
    "rope": [rp_positions_arange, rp_table_cached],
    "rope_append": [ra_q_at_previous_position, ra_k_partner_from_v, ra_v_unrotated_is_k],
}
CORRECT = {"rope": [rope, rope_half_exponent], "rope_append": [rope_append, rope_append_xor_partner]}

_LLAMA2_70B = next(m for m in MODELS if m.name == "Llama 2 70B")
_LLAMA3_8B = next(m for m in MODELS if m.name == "Llama 3 8B")
_GEMMA = next(m for m in MODELS if m.name == "Gemma 2 9B")


def _exact_fit(f):
    per = cache_bytes(_LLAMA3_8B.num_layers, _LLAMA3_8B.num_kv_heads, _LLAMA3_8B.head_dim, 8192, 2, 1)
    return f(_LLAMA3_8B, 8192, 3 * per / 2**30, 2)          # exactly three sequences' bytes


def _rope(f):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    f(x.clone(), torch.tensor([0, 1, 2, 3, 4]), "half")
    pos = torch.tensor([3, 9, 100, 4000, 4095])
    return f(x.clone(), pos, "half"), f(x.clone(), pos, "interleaved")


def _append(f):
    out = []
    for mode in ("half", "interleaved"):
        g = torch.Generator().manual_seed(4)
        B, S, HQ, HKV, D, SC = 2, 3, 4, 2, 16, 32
        q, k, v = (torch.randn(B, S, h, D, generator=g) for h in (HQ, HKV, HKV))
        k_cache = torch.zeros(B, HKV, SC, D)
        v_cache = torch.zeros(B, HKV, SC, D)
        seqlens_k = torch.tensor([9, 20], dtype=torch.int32)
        q_out = f(q, k, v, k_cache, v_cache, seqlens_k, mode)
        out += [q_out, k_cache, v_cache]
    return out


WITNESS = {
    "cb_int32": lambda f: int(f(80, 8, 128, 131072, 2, 8)),
    "ms_at_least_one": lambda f: f(_LLAMA2_70B, 4096, 0.5, 2),
    "ms_strictly_less": _exact_fit,
    "ms_window_from_model_note": lambda f: f(_GEMMA, 8192, 20.0, 2),
    "rp_positions_arange": _rope, "rp_table_cached": _rope,
    "ra_q_at_previous_position": _append, "ra_k_partner_from_v": _append, "ra_v_unrotated_is_k": _append,
}
