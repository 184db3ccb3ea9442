"""Fresh wrong answers (and alternative correct answers) for lab 07, written from the student notebook
and the solutions only. Each function's docstring names the exercise it answers and the mistake; the
kernel variants share one kernel whose constexpr MUT selects the mistake (MUT = 0 is correct)."""
import torch

from attnkit.device import ensure_triton_backend
from attnkit.reference.rope import rope_cache

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _cache_bytes(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes


# ---------------------------------------------------------------- exercise 1a: cache_bytes
def cache_bytes_k_only(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a. Counts K only (forgets the V vectors)."""
    return num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes


def cache_bytes_no_batch(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a. Ignores the batch argument."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * dtype_bytes


def cache_bytes_float(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a. Returns a float (computes in GiB, then multiplies back by 2**30)."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes / 2**30 * 2**30


def cache_bytes_bits(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a. Treats dtype_bytes as bits per element and divides by 8."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes // 8


# ---------------------------------------------------------------- exercise 1b: max_sequences
def max_sequences_gb(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Reads GiB as 10**9 bytes."""
    tokens = context if window is None else min(context, window)
    per = _cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 1e9 // per)


def max_sequences_q_heads(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Counts the query heads instead of the KV heads."""
    tokens = context if window is None else min(context, window)
    per = _cache_bytes(model.num_layers, model.num_q_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per)


def max_sequences_ignores_window(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Ignores the sliding window."""
    per = _cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, context, dtype_bytes, 1)
    return int(free_gib * 2**30 // per)


def max_sequences_rounds(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. Rounds to the nearest whole number instead of flooring."""
    tokens = context if window is None else min(context, window)
    per = _cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return round(free_gib * 2**30 / per)


def max_sequences_window_always(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. With a window, keeps `window` tokens even when the context is shorter."""
    tokens = context if window is None else window
    per = _cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per)


# ---------------------------------------------------------------- exercise 2: rope
def _rope(x, positions, mode, dtype=torch.float64, sign=1.0, exponent=2.0, force_half=False):
    S, D = x.shape
    j = torch.arange(D // 2, dtype=dtype)
    angle = positions.to(dtype)[:, None] * 10000.0 ** (-exponent * j / D)
    cos, sin = torch.cos(angle).to(x.dtype), (sign * torch.sin(angle)).to(x.dtype)
    if mode == "half" or force_half:
        a, b = x[:, : D // 2], x[:, D // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


def rope_float32_angles(x, positions, mode):
    """Exercise 2. Angles in float32 (the lab says float64: positions reach the thousands)."""
    return _rope(x, positions, mode, dtype=torch.float32)


def rope_turns_backwards(x, positions, mode):
    """Exercise 2. Sign of sin flipped: rotates by -angle."""
    return _rope(x, positions, mode, sign=-1.0)


def rope_exponent_j(x, positions, mode):
    """Exercise 2. Frequency base^(-j/D) instead of base^(-2j/D)."""
    return _rope(x, positions, mode, exponent=1.0)


def rope_ignores_mode(x, positions, mode):
    """Exercise 2. Always pairs (x[j], x[j + D/2]) whatever the mode."""
    return _rope(x, positions, mode, force_half=True)


def rope_interleaved_concat(x, positions, mode):
    """Exercise 2. Interleaved mode rotates the right pairs but concatenates the halves (no re-interleave)."""
    S, D = x.shape
    if mode == "half":
        return _rope(x, positions, mode)
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)


# ---------------------------------------------------------------- exercise 3: rope_append kernel
@triton.jit
def _rope_append_kernel(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                        S, HQ, D: tl.constexpr,
                        sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                        INTERLEAVED: tl.constexpr, MUT: tl.constexpr):
    pid_token = tl.program_id(0)
    head = tl.program_id(1)
    b = pid_token // S
    s = pid_token % S
    d = tl.arange(0, D)
    if MUT == 1:     # seqlens_k read as the number of tokens before the append
        past = tl.load(seqlens_k + b) - S
    elif MUT == 2:   # seqlens_k read as the number of past tokens
        past = tl.load(seqlens_k + b)
    else:
        past = tl.load(seqlens_k + b) + 1 - S
    pos = past + s
    rot_pos = pos
    if MUT == 3:     # rotates at the token's index in the new chunk
        rot_pos = s
    if INTERLEAVED or MUT == 4:   # 4: interleaved pairing whatever the mode
        partner = d ^ 1
        freq = d // 2
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    else:
        partner = tl.where(d < D // 2, d + D // 2, d - D // 2)
        freq = tl.where(d < D // 2, d, d - D // 2)
        sign = tl.where(d < D // 2, -1.0, 1.0)
    c = tl.load(cos + rot_pos * s_cos + freq)
    sn = tl.load(sin + rot_pos * s_cos + freq)
    if head < HQ:
        row = q + b * sq_b + s * sq_s + head * sq_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        tl.store(q_out + b * sq_b + s * sq_s + head * sq_h + d, y)
    else:
        h = head - HQ
        if MUT == 5:   # k addressed with q's strides
            row = k + b * sq_b + s * sq_s + h * sq_h
        else:
            row = k + b * sk_b + s * sk_s + h * sk_h
        y = tl.load(row + d) * c + sign * tl.load(row + partner) * sn
        out = b * sc_b + h * sc_h + pos * sc_s + d
        tl.store(k_cache + out, y)
        vrow = v + b * sk_b + s * sk_s + h * sk_h
        if MUT == 6:   # rotates V as well
            tl.store(v_cache + out, tl.load(vrow + d) * c + sign * tl.load(vrow + partner) * sn)
        else:
            tl.store(v_cache + out, tl.load(vrow + d))


def _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, mut):
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    _rope_append_kernel[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"), MUT=mut)
    return q_out


def append_past_minus_one(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. past = seqlens_k[b] - S (reads seqlens_k as a length, one row too early)."""
    return _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, 1)


def append_past_is_seqlen(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. past = seqlens_k[b] (reads it as the tokens already cached)."""
    return _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, 2)


def append_rotates_at_chunk_index(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. Writes the right cache row but rotates at position s, not past + s."""
    return _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, 3)


def append_always_interleaved(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. Pairs d with d ^ 1 in both modes."""
    return _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, 4)


def append_k_with_q_strides(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. Addresses k with q's strides (wrong when Hq != Hkv)."""
    return _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, 5)


def append_rotates_v(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. Rotates V before caching it."""
    return _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, 6)


# ---------------------------------------------------------------- correct alternatives
def correct_cache_bytes(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a, correct: per token first, then tokens and sequences."""
    per_token = num_layers * 2 * num_kv_heads * head_dim * dtype_bytes
    return per_token * tokens * batch


def correct_rope_complex(x, positions, mode):
    """Exercise 2, correct: pairs as complex numbers times e^(i·angle)."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    rot = torch.polar(torch.ones_like(angle), angle)
    if mode == "half":
        z = torch.complex(x[:, : D // 2].double(), x[:, D // 2:].double()) * rot
        return torch.cat([z.real, z.imag], dim=1).to(x.dtype)
    z = torch.complex(x[:, 0::2].double(), x[:, 1::2].double()) * rot
    return torch.stack([z.real, z.imag], dim=2).reshape(S, D).to(x.dtype)


def correct_append(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3, correct: the unmodified kernel body (a control for the shared kernel)."""
    return _rope_append(q, k, v, k_cache, v_cache, seqlens_k, mode, 0)


WRONG = {
    "cache_bytes": [cache_bytes_k_only, cache_bytes_no_batch, cache_bytes_float, cache_bytes_bits],
    "max_sequences": [max_sequences_gb, max_sequences_q_heads, max_sequences_ignores_window, max_sequences_rounds,
                      max_sequences_window_always],
    "rope": [rope_float32_angles, rope_turns_backwards, rope_exponent_j, rope_ignores_mode, rope_interleaved_concat],
    "rope_append": [append_past_minus_one, append_past_is_seqlen, append_rotates_at_chunk_index,
                    append_always_interleaved, append_k_with_q_strides, append_rotates_v],
}
CORRECT = {
    "cache_bytes": [correct_cache_bytes],
    "rope": [correct_rope_complex],
    "rope_append": [correct_append],
}
