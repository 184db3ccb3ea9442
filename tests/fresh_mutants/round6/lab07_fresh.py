# ruff: noqa: E501, B007, F841
"""Round 6 of fresh wrong answers for lab 07 (GQA and the KV cache), written from the lab's text and its
solution only (the checks unread). WRONG / CORRECT / SOLUTION / WITNESS as in round 5; the kernel answers are
the solution's kernel and launch function with one student's edit (the docstring says which). New classes
here: a size returned in GiB, a count rounded to nearest, a window taken with max, RoPE angles in float32,
positions rounded to fp16, the interleaved mode written back in the half layout, a cache row stride assumed
to be D, a token's batch found with the head count. The correct answers: a count by true division and
int(), interleaved RoPE through complex numbers, and the cos/sin row stride taken as D/2 (the table is
contiguous)."""
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

def cb_in_gib(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    """Exercise 1a. The size returned in GiB ('caches are quoted in GiB'): the lab asks for bytes, an int."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes / 2**30


# ---------------------------------------------------------------- exercise 1b

def ms_rounded(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. The count rounded to nearest, round(free / per_sequence) ('a whole number'): 2.6
    sequences become 3, one more than fits."""
    tokens = context if window is None else min(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return round(free_gib * 2**30 / per_sequence)


def ms_window_max(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b. The window applied as max(context, window) ('at least the window'): a context shorter than
    the window is charged the whole window, a longer one is not cut."""
    tokens = context if window is None else max(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 // per_sequence)


# ---------------------------------------------------------------- exercise 2

def rp_angles_float32(x, positions, mode):
    """Exercise 2. The angles computed in float32 ('enough for a rotation'): the lab says float64; at position
    4000 the angle is off by about 2e-4 rad."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float32)
    angle = positions.float()[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle).double(), torch.sin(angle).double()
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


def rp_positions_half(x, positions, mode):
    """Exercise 2. The positions converted with .half() ('as the model's dtype') before the float64 angle:
    fp16 holds whole numbers exactly only up to 2048, so position 4095 becomes 4096."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.half().double()[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


def rp_interleaved_written_half(x, positions, mode):
    """Exercise 2. The interleaved pairs rotated right and written back with torch.cat ('as in half mode'):
    the first halves of the pairs land in columns 0 .. D/2 − 1 instead of the even columns."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2 :]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)


# ---------------------------------------------------------------- exercise 3


# ---------------------------------------------------------------- ra_cache_row_stride_assumed

@triton.jit
def rope_append_kernel__ra_cache_row_stride_assumed(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
        out = b * sc_b + h * sc_h + pos * D + d
        tl.store(k_cache + out, y)
        tl.store(v_cache + out, tl.load(v + b * sk_b + s * sk_s + h * sk_h + d))


def ra_cache_row_stride_assumed(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. The cache row written at pos · D ('a row of the cache holds D numbers'): right for a contiguous cache, wrong for a cache whose rows are longer in memory than D."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_cache_row_stride_assumed[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


# ---------------------------------------------------------------- ra_batch_divided_by_hq

@triton.jit
def rope_append_kernel__ra_batch_divided_by_hq(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
                       S, HQ, D: tl.constexpr,
                       sq_b, sq_s, sq_h, sk_b, sk_s, sk_h, sc_b, sc_h, sc_s, s_cos,
                       INTERLEAVED: tl.constexpr):
    pid_token = tl.program_id(0)                 # b * S + s
    head = tl.program_id(1)                      # 0 .. HQ + HKV - 1
    b = pid_token // HQ
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


def ra_batch_divided_by_hq(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3. The token's sequence found as pid // HQ ('one program per head'): right when S = HQ; otherwise tokens are given another sequence's past and rows."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__ra_batch_divided_by_hq[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out

# ---------------------------------------------------------------- correct alternatives

def max_sequences_true_division(model, context, free_gib, dtype_bytes, window=None):
    """Exercise 1b, correct: int() of a true division (exact when the quotient is whole: both operands are exact
    floats and the division is correctly rounded)."""
    tokens = context if window is None else min(context, window)
    per_sequence = cache_bytes(model.num_layers, model.num_kv_heads, model.head_dim, tokens, dtype_bytes, 1)
    return int(free_gib * 2**30 / per_sequence)


def rope_complex(x, positions, mode):
    """Exercise 2, correct: each pair as a complex number a + ib multiplied by e^{i·angle}."""
    S, D = x.shape
    j = torch.arange(D // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * 10000.0 ** (-2 * j / D)
    rot = torch.polar(torch.ones_like(angle), angle)
    xd = x.double()
    if mode == "half":
        z = torch.complex(xd[:, : D // 2], xd[:, D // 2 :]) * rot
        return torch.cat([z.real, z.imag], dim=1)
    z = torch.complex(xd[:, 0::2], xd[:, 1::2]) * rot
    return torch.stack([z.real, z.imag], dim=2).reshape(S, D)


# ---------------------------------------------------------------- rope_append_cos_stride_half_d

@triton.jit
def rope_append_kernel__rope_append_cos_stride_half_d(q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k,
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
    c = tl.load(cos + pos * (D // 2) + freq)
    sn = tl.load(sin + pos * (D // 2) + freq)
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


def rope_append_cos_stride_half_d(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Exercise 3, correct: the cos/sin row stride taken as D/2 (the table of rope_cache is contiguous [positions, D/2])."""
    """Rotate q and k, append k and v to the caches in place; returns the rotated q."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    cos, sin = rope_cache(k_cache.shape[2], D, device=q.device)   # [S_cache, D/2] fp32
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q_out = torch.empty_like(q)
    rope_append_kernel__rope_append_cos_stride_half_d[(B * S, HQ + HKV)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, seqlens_k, S, HQ, D,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), cos.stride(0),
        INTERLEAVED=(mode == "interleaved"))
    return q_out


WRONG = {
    "cache_bytes": [cb_in_gib],
    "max_sequences": [ms_rounded, ms_window_max],
    "rope": [rp_angles_float32, rp_positions_half, rp_interleaved_written_half],
    "rope_append": [ra_cache_row_stride_assumed, ra_batch_divided_by_hq],
}
CORRECT = {"max_sequences": [max_sequences, max_sequences_true_division], "rope": [rope, rope_complex],
           "rope_append": [rope_append, rope_append_cos_stride_half_d]}

_LLAMA3_8B = next(m for m in MODELS if m.name == "Llama 3 8B")
_MISTRAL = next(m for m in MODELS if m.name == "Mistral 7B")


def _rope(f):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 8, generator=g, dtype=torch.float64)
    pos = torch.tensor([3, 9, 100, 4000, 4095])
    return [f(x, pos, "half"), f(x, pos, "interleaved")]


def _append(f, wide=0, S=3):
    out = []
    for mode in ("half", "interleaved"):
        g = torch.Generator().manual_seed(6)
        B, HQ, HKV, D, SC = 2, 4, 2, 16, 32
        q, k, v = (torch.randn(B, S, h, D, generator=g) for h in (HQ, HKV, HKV))
        k_buf = torch.zeros(B, HKV, SC, D + wide)
        v_buf = torch.zeros(B, HKV, SC, D + wide)
        k_cache, v_cache = k_buf[..., :D], v_buf[..., :D]
        seqlens_k = torch.tensor([9, 20], dtype=torch.int32)
        q_out = f(q, k, v, k_cache, v_cache, seqlens_k, mode)
        out += [q_out, k_buf, v_buf]
    return out


WITNESS = {
    "cb_in_gib": lambda f: f(32, 8, 128, 1000, 2, 1),
    "ms_rounded": lambda f: f(_LLAMA3_8B, 8192, 2.6, 2),
    "ms_window_max": lambda f: f(_MISTRAL, 1024, 40.0, 2, window=4096),
    "rp_angles_float32": _rope,
    "rp_positions_half": _rope,
    "rp_interleaved_written_half": _rope,
    "ra_cache_row_stride_assumed": lambda f: _append(f, wide=8),
    "ra_batch_divided_by_hq": _append,
}
