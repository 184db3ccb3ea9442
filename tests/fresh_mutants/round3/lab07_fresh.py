# ruff: noqa: E501, B007, F841
"""Round 3 of fresh wrong answers for lab 07 (GQA and the KV cache), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py; the kernel answers
are the solution's kernel and launch function with one student's edit (the docstring says which)."""
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

# ---------------------------------------------------------------- ra_past_batch0

@triton.jit
def rope_append_kernel__ra_past_batch0(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)                          # the last axis is contiguous (stride 1)
    past = tl.load(seqlens_k) + 1 - S        # seqlens_k = index of the last token
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



def ra_past_batch0(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. past from seqlens_k[0] (tl.load(seqlens_k), no + b): every sequence placed and rotated as sequence 0."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_past_batch0[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out

# ---------------------------------------------------------------- ra_rotate_at_past

@triton.jit
def rope_append_kernel__ra_rotate_at_past(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
    c = tl.load(cos + past * s_cos + freq)
    sn = tl.load(sin + past * s_cos + freq)
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



def ra_rotate_at_past(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. Writes row past + s but rotates every new token at the first new position, past."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_rotate_at_past[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out

# ---------------------------------------------------------------- rope_append_head_mod

@triton.jit
def rope_append_kernel__rope_append_head_mod(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        h = head % HQ
        row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))



def rope_append_head_mod(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3, correct: the KV head as head % HQ (the same as head − HQ, since Hkv ≤ Hq)."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__rope_append_head_mod[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out

# ---------------------------------------------------------------- exercise 1b


def ms_free_gib_truncated(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. int(free_gib) before converting to bytes: 12.75 GiB becomes 12."""
    tokens = context if window is None else min(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(int(free_gib) * 2**30 // per_sequence)


def ms_window_plus_one(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Keeps window + 1 tokens ('the window and the token being generated')."""
    tokens = context if window is None else min(context, window + 1)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)


def ms_returns_float(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Floor division of a float: returns 6.0, a float, where the lab asks for a whole number (int)."""
    tokens = context if window is None else min(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return free_gib * 2**30 // per_sequence


# ---------------------------------------------------------------- exercise 2


def rp_in_place_half(x, positions, mode):
    """Exercise 2. Half mode written into x in place: the second half is computed from the already rotated
    first half."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle), torch.sin(angle)
    x = x.double()
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        a[:] = a * cos - b * sin
        b[:] = b * cos + a * sin
        return x
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


def rp_freq_from_one(x, positions, mode):
    """Exercise 2. Pair index j from 1 to D/2 (torch.arange(1, D // 2 + 1)): every frequency one step lower."""
    S, D = x.shape
    j = torch.arange(1, D // 2 + 1, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


# ---------------------------------------------------------------- correct alternatives


def max_sequences_divmod(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b, correct: whole bytes first, then divmod."""
    tokens = min(context, window) if window else context
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    fits, _ = divmod(int(free_gib * 2**30), per_sequence)
    return fits


WRONG = {
    "max_sequences": [ms_free_gib_truncated, ms_window_plus_one, ms_returns_float],
    "rope": [rp_in_place_half, rp_freq_from_one],
    "rope_append": [ra_past_batch0, ra_rotate_at_past],
}
SOLUTION = {"cache_bytes": cache_bytes, "max_sequences": max_sequences, "rope": rope, "rope_append": rope_append}
CORRECT = {"max_sequences": [max_sequences, max_sequences_divmod], "rope_append": [rope_append, rope_append_head_mod]}

_LLAMA3_8B = next(m for m in MODELS if m.name == "Llama 3 8B")
_MISTRAL = next(m for m in MODELS if m.name == "Mistral 7B")


def _rope(f):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    pos = torch.tensor([0, 1, 7, 4000, 4095])
    return f(x.clone(), pos, "half"), f(x.clone(), pos, "interleaved")


def _append(f):
    out = []
    for mode in ("half", "interleaved"):
        g = torch.Generator().manual_seed(3)
        B, S, HQ, HKV, D, SC = 2, 3, 4, 2, 16, 32
        q, k, v = (torch.randn(B, S, h, D, generator=g) for h in (HQ, HKV, HKV))
        k_cache = torch.zeros(B, HKV, SC, D)
        v_cache = torch.zeros(B, HKV, SC, D)
        seqlens_k = torch.tensor([9, 20], dtype=torch.int32)
        q_out = f(q, k, v, k_cache, v_cache, seqlens_k, mode)
        out += [q_out, k_cache, v_cache]
    return out


WITNESS = {
    "ms_free_gib_truncated": lambda f: f(_LLAMA3_8B, 4096, 12.75, 2),
    "ms_window_plus_one": lambda f: f(_MISTRAL, 8192, 12.0, 2, window=4096),
    "ms_returns_float": lambda f: f(_LLAMA3_8B, 8192, 12.75, 2),
    "rp_in_place_half": _rope, "rp_freq_from_one": _rope,
    "ra_past_batch0": _append, "ra_rotate_at_past": _append,
}
