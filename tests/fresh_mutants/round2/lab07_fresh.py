# ruff: noqa: E501, B007, F841
"""Round 2 of fresh wrong answers for lab 07 (GQA and the KV cache), written from the lab's text and its
solution only. Each wrong answer is the solution with one student's edit (its docstring says which).
WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
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


# cache_bytes: cb_k_only
def cb_k_only(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Forgot V (no factor 2)."""
    return num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes


# cache_bytes: cb_no_batch
def cb_no_batch(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Forgot the batch."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * dtype_bytes


# cache_bytes: cb_bits
def cb_bits(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Counted bits (dtype_bytes · 8)."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes * 8


# cache_bytes: cb_no_layers
def cb_no_layers(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Forgot the layers."""
    return 2 * num_kv_heads * head_dim * tokens * batch * dtype_bytes


# max_sequences: ms_gb
def ms_gb(model, context, free_gib, dtype_bytes, window=None):
    """GiB read as 10^9 bytes."""
    tokens = context if window is None else min(context, window)       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 1e9 // per_sequence)                       # whole sequences only


# max_sequences: ms_query_heads
def ms_query_heads(model, context, free_gib, dtype_bytes, window=None):
    """Counted the query heads."""
    tokens = context if window is None else min(context, window)       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_q_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)                       # whole sequences only


# max_sequences: ms_round
def ms_round(model, context, free_gib, dtype_bytes, window=None):
    """round() instead of a floor."""
    tokens = context if window is None else min(context, window)       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return round(free_gib * 2**30 / per_sequence)                       # whole sequences only


# max_sequences: ms_window_ignored
def ms_window_ignored(model, context, free_gib, dtype_bytes, window=None):
    """Ignored the sliding window."""
    tokens = context       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)                       # whole sequences only


# max_sequences: ms_window_max
def ms_window_max(model, context, free_gib, dtype_bytes, window=None):
    """max(context, window)."""
    tokens = context if window is None else max(context, window)       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)                       # whole sequences only


# max_sequences: ms_window_always
def ms_window_always(model, context, free_gib, dtype_bytes, window=None):
    """The window's tokens whenever a window is given."""
    tokens = context if window is None else window       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)                       # whole sequences only


# max_sequences: ms_ceil
def ms_ceil(model, context, free_gib, dtype_bytes, window=None):
    """Rounded up."""
    tokens = context if window is None else min(context, window)       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return -(-int(free_gib * 2**30) // per_sequence)                       # whole sequences only


# max_sequences: ms_mib
def ms_mib(model, context, free_gib, dtype_bytes, window=None):
    """GiB as 2^20."""
    tokens = context if window is None else min(context, window)       # a rolling cache keeps the window
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**20 // per_sequence)                       # whole sequences only


# rope: rp_modes_swapped
def rp_modes_swapped(x, positions, mode):
    """The two modes' pairings swapped."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode != "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


# rope: rp_turns_backwards
def rp_turns_backwards(x, positions, mode):
    """(a cos + b sin, b cos − a sin): turns the other way."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos + b * sin, b * cos - a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos + b * sin, b * cos - a * sin], dim=2).reshape(S, D)


# rope: rp_float32_angles
def rp_float32_angles(x, positions, mode):
    """Angles computed in float32."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float32)
    angle = positions.float()[:, None] * 10000.0 ** (-2 * j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


# rope: rp_frequency_j_over_d
def rp_frequency_j_over_d(x, positions, mode):
    """Frequency base^(−j/D)."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


# rope: rp_interleaved_concatenated
def rp_interleaved_concatenated(x, positions, mode):
    """Interleaved result concatenated as [firsts | seconds]."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)


# rope: rp_positions_plus_one
def rp_positions_plus_one(x, positions, mode):
    """Positions counted from 1."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = (positions.double() + 1)[:, None] * 10000.0 ** (-2 * j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


# rope: rp_half_pairs_adjacent_halves
def rp_half_pairs_adjacent_halves(x, positions, mode):
    """Half mode pairs j with D/2 − 1 − j."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)      # [S, D/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :].flip(1)
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


# rope_append: ra_seqlens_as_length
@triton.jit
def rope_append_kernel__ra_seqlens_as_length(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)                          # the last axis is contiguous (stride 1)
    past = tl.load(seqlens_k + b) - S        # seqlens_k = index of the last token
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


def ra_seqlens_as_length(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """past = seqlens_k − S (read seqlens_k as the length)."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_seqlens_as_length[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_position_s
@triton.jit
def rope_append_kernel__ra_position_s(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)                          # the last axis is contiguous (stride 1)
    past = tl.load(seqlens_k + b) + 1 - S        # seqlens_k = index of the last token
    pos = s
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
        out = b * sc_b + h * sc_h + (past + s) * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_position_s(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Rotated at position s (forgot past)."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_position_s[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_cache_row_s
@triton.jit
def rope_append_kernel__ra_cache_row_s(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        out = b * sc_b + h * sc_h + s * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_cache_row_s(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Wrote the cache at row s."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_cache_row_s[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_sign_flipped
@triton.jit
def rope_append_kernel__ra_sign_flipped(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        sign = tl.where(d % 2 == 0, 1.0, -1.0)
    else:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        freq = tl.where(d < D // 2, d, d - D // 2)
        sign = tl.where(d < D // 2, 1.0, -1.0)
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


def ra_sign_flipped(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Sign +1 for the first of a pair."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_sign_flipped[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_partner_d_plus_one
@triton.jit
def rope_append_kernel__ra_partner_d_plus_one(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        partner = tl.minimum(d + 1, D - 1)
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


def ra_partner_d_plus_one(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Interleaved partner d + 1."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_partner_d_plus_one[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_interleaved_freq_d
@triton.jit
def rope_append_kernel__ra_interleaved_freq_d(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        freq = tl.minimum(d, D // 2 - 1)
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


def ra_interleaved_freq_d(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Interleaved frequency index d (not d // 2)."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_interleaved_freq_d[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_v_rotated
@triton.jit
def rope_append_kernel__ra_v_rotated(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        vrow = v + b * sk_b + s * sk_s + h * sk_h
        tl.store(v_cache + out, tl.load(vrow + d) * c + sign * tl.load(vrow + partner) * sn)


def ra_v_rotated(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """V rotated like K."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_v_rotated[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_cache_strides_swapped
@triton.jit
def rope_append_kernel__ra_cache_strides_swapped(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        out = b * sc_b + h * sc_s + pos * sc_h + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_cache_strides_swapped(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Cache head and row strides swapped."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_cache_strides_swapped[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_q_not_rotated
@triton.jit
def rope_append_kernel__ra_q_not_rotated(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        tl.store(q_out + b * sq_b + s * sq_s + head * sq_h + d, x)
    else:
        h = head - HQ
        row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_q_not_rotated(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """q copied without rotation."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_q_not_rotated[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_cache_head_unshifted
@triton.jit
def rope_append_kernel__ra_cache_head_unshifted(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        out = b * sc_b + head * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_cache_head_unshifted(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Cache written at head (not head − HQ)."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_cache_head_unshifted[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# rope_append: ra_v_from_k
@triton.jit
def rope_append_kernel__ra_v_from_k(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        tl.store(v_cache + out, tl.load(k + b * sk_b + s * sk_s + h * sk_h + d))


def ra_v_from_k(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Copied the new k (unrotated) into v_cache."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_v_from_k[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


WRONG = {
    "cache_bytes": [cb_k_only, cb_no_batch, cb_bits, cb_no_layers],
    "max_sequences": [ms_gb, ms_query_heads, ms_round, ms_window_ignored, ms_window_max, ms_window_always, ms_ceil, ms_mib],
    "rope": [rp_modes_swapped, rp_turns_backwards, rp_float32_angles, rp_frequency_j_over_d, rp_interleaved_concatenated, rp_positions_plus_one, rp_half_pairs_adjacent_halves],
    "rope_append": [ra_seqlens_as_length, ra_position_s, ra_cache_row_s, ra_sign_flipped, ra_partner_d_plus_one, ra_interleaved_freq_d, ra_v_rotated, ra_cache_strides_swapped, ra_q_not_rotated, ra_cache_head_unshifted, ra_v_from_k],
}
SOLUTION = {"cache_bytes": cache_bytes, "max_sequences": max_sequences, "rope": rope, "rope_append": rope_append}
CORRECT = {k: [v] for k, v in SOLUTION.items()}

_LLAMA3_8B = next(m for m in MODELS if m.name == "Llama 3 8B")
_MISTRAL = next(m for m in MODELS if m.name == "Mistral 7B")


def _rope(f):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=g)
    pos = torch.tensor([0, 1, 7, 4000, 4095])
    return f(x, pos, "half"), f(x, pos, "interleaved")


def _append(f):
    out = []
    for mode in ("half", "interleaved"):
        g = torch.Generator().manual_seed(1)
        B, S, HQ, HKV, D, SC = 2, 3, 4, 2, 16, 32
        q, k, v = (torch.randn(B, S, h, D, generator=g) for h in (HQ, HKV, HKV))
        k_big = torch.zeros(40 * B, HKV, SC, D)          # room for a store far past the cache
        v_big = torch.zeros(40 * B, HKV, SC, D)
        seqlens_k = torch.tensor([9, 20], dtype=torch.int32)
        q_out = f(q, k, v, k_big[:B], v_big[:B], seqlens_k, mode)
        out += [q_out, k_big, v_big]
    return out


WITNESS = {
    **{n.__name__: (lambda f: f(32, 8, 128, 8192, 2, 3)) for n in WRONG["cache_bytes"]},
    **{n.__name__: (lambda f: f(_LLAMA3_8B, 8192, 12.75, 2)) for n in WRONG["max_sequences"]},
    "ms_window_ignored": lambda f: f(_MISTRAL, 8192, 12.75, 2, window=4096),
    "ms_window_max": lambda f: f(_MISTRAL, 8192, 12.75, 2, window=4096),
    "ms_window_always": lambda f: f(_MISTRAL, 2048, 12.75, 2, window=4096),
    **{n.__name__: _rope for n in WRONG["rope"]},
    **{n.__name__: _append for n in WRONG["rope_append"]},
}
