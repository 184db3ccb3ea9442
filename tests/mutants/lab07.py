"""Lab 07: wrong answers a student could write (WRONG) and right ones written differently (RIGHT).

The rope_append answers here are written in PyTorch (fast at 50 seeds); the Triton ones, each the
solution's kernel with one line changed, are in TRITON_WRONG (run at 10 seeds).
"""
import math

import numpy as np
import torch


# ------------------------------------------------------------------------------------ exercise 1: cache_bytes
def bytes_formula(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * dtype_bytes


def bytes_math_prod(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    return math.prod([2, num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch])


def bytes_per_layer_loop(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    per_token = 0
    for _ in range(num_layers):
        per_token += 2 * num_kv_heads * head_dim * dtype_bytes      # K and V of one layer
    return per_token * tokens * batch


def bytes_numpy_int64(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    return np.prod(np.array([2, num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch], dtype=np.int64))


BYTES_RIGHT = {"formula": bytes_formula, "math.prod": bytes_math_prod, "loop over layers": bytes_per_layer_loop,
               "numpy int64": bytes_numpy_int64}


def bytes_with_query_heads(num_layers, num_kv_heads, head_dim, tokens, dtype_bytes, batch):
    from attnkit.serving.model_configs import MODELS
    q_heads = {(m.num_layers, m.num_kv_heads, m.head_dim): m.num_q_heads for m in MODELS}
    return bytes_formula(num_layers, q_heads[(num_layers, num_kv_heads, head_dim)], head_dim, tokens,
                         dtype_bytes, batch)


BYTES_WRONG = {
    "K only, no V": lambda L, H, D, T, e, B: L * H * D * T * e * B,
    "forgets the batch": lambda L, H, D, T, e, B: 2 * L * H * D * T * e,
    "elements, not bytes": lambda L, H, D, T, e, B: 2 * L * H * D * T * B,
    "bits, not bytes": lambda L, H, D, T, e, B: 8 * bytes_formula(L, H, D, T, e, B),
    "one layer only": lambda L, H, D, T, e, B: 2 * H * D * T * e * B,
    "in MiB": lambda L, H, D, T, e, B: bytes_formula(L, H, D, T, e, B) / 2 ** 20,
    "sizes held as np.int32 (wraps past 2³¹)": lambda L, H, D, T, e, B: int(math.prod(
        [np.int32(2), *(np.int32(x) for x in (L, H, D, T, e, B))])),
    "one token too many": lambda L, H, D, T, e, B: bytes_formula(L, H, D, T + 1, e, B),
    "sizes held as np.float32 (exact only up to 2²⁴)": lambda L, H, D, T, e, B: float(math.prod(
        [np.float32(2), *(np.float32(x) for x in (L, H, D, T, e, B))])),
    "counts query heads": bytes_with_query_heads,
    "head_dim twice (K and V per dim)": lambda L, H, D, T, e, B: 2 * L * H * 2 * D * T * e * B,
    "calls the course's kv_cache_bytes": lambda L, H, D, T, e, B: __import__(
        "attnkit.serving.kv_cache", fromlist=["x"]).kv_cache_bytes(num_layers=L, num_kv_heads=H, head_dim=D,
                                                                   tokens=T, dtype_bytes=e, batch=B),
}


# ------------------------------------------------------------------------------------ exercise 1b: max_sequences
def _per_sequence(model, tokens, dtype_bytes, heads=None):
    return bytes_formula(model.num_layers, model.num_kv_heads if heads is None else heads, model.head_dim,
                         tokens, dtype_bytes, 1)


def sequences_formula(model, context, free_gib, dtype_bytes, window=None):
    tokens = context if window is None else min(context, window)
    return int(free_gib * 2**30 // _per_sequence(model, tokens, dtype_bytes))


def sequences_by_subtraction(model, context, free_gib, dtype_bytes, window=None):
    tokens = min(context, window or context)
    left, n, per = free_gib * 2**30, 0, _per_sequence(model, tokens, dtype_bytes)
    while left >= per:
        left -= per
        n += 1
    return n


def sequences_from_bytes_per_token(model, context, free_gib, dtype_bytes, window=None):
    tokens = context if window is None else min(context, window)
    return math.floor(free_gib * 1024**3 / (model.kv_bytes_per_token(dtype_bytes) * tokens))


def sequences_numpy_int64(model, context, free_gib, dtype_bytes, window=None):
    tokens = context if window is None else min(context, window)
    return np.int64(int(free_gib * 2**30) // _per_sequence(model, tokens, dtype_bytes))


SEQUENCES_RIGHT = {"formula": sequences_formula, "by subtraction": sequences_by_subtraction,
                   "bytes per token": sequences_from_bytes_per_token, "a NumPy int64": sequences_numpy_int64}


def _sequences_of(tokens, result=int):
    """max_sequences keeping ``tokens(context, window)`` tokens a sequence, its count passed to ``result``."""
    def max_sequences(model, context, free_gib, dtype_bytes, window=None):
        per = _per_sequence(model, tokens(context, window), dtype_bytes)
        return result(free_gib * 2**30 // per)
    return max_sequences


def _kept(context, window):
    return context if window is None else min(context, window)


def _sequences(*, unit=2**30, heads=None, window_rule="min", rounding=math.floor, offset=0):
    def max_sequences(model, context, free_gib, dtype_bytes, window=None):
        if window is None or window_rule == "ignored":
            tokens = context
        elif window_rule == "always":
            tokens = window
        else:
            tokens = min(context, window)
        per = _per_sequence(model, tokens, dtype_bytes, heads=None if heads is None else heads(model))
        return int(rounding(free_gib * unit / per)) + offset
    return max_sequences


SEQUENCES_WRONG = {
    "GB (10⁹ bytes) instead of GiB": _sequences(unit=1e9),
    "MiB for GiB": _sequences(unit=2**20),
    "query heads instead of KV heads": _sequences(heads=lambda m: m.num_q_heads),
    "the window ignored": _sequences(window_rule="ignored"),
    "the window even when the context is shorter": _sequences(window_rule="always"),
    "rounded to the nearest": _sequences(rounding=round),
    "rounded up": _sequences(rounding=math.ceil),
    "one spare sequence kept": _sequences(offset=-1),
    "a float, not a whole count": lambda model, context, free_gib, dtype_bytes, window=None: (
        free_gib * 2**30 / _per_sequence(model, context if window is None else min(context, window), dtype_bytes)),
    "K only": lambda model, context, free_gib, dtype_bytes, window=None: int(
        free_gib * 2**30 // (_per_sequence(model, context if window is None else min(context, window),
                                           dtype_bytes) // 2)),
    "the model's max_context, not the context": lambda model, context, free_gib, dtype_bytes, window=None:
        int(free_gib * 2**30 // _per_sequence(model, model.max_context if window is None else
                                             min(model.max_context, window), dtype_bytes)),
    # the window's edge, off by one token on either side (fresh round 3: window + 1)
    "the window and the token being generated (window + 1)": _sequences_of(
        lambda c, w: c if w is None else min(c, w + 1)),
    "window − 1 tokens": _sequences_of(lambda c, w: c if w is None else min(c, w - 1)),
    "one token more than min(context, window)": _sequences_of(lambda c, w: _kept(c, w) + 1),
    "context + 1 tokens (the token being generated)": _sequences_of(
        lambda c, w: c + 1 if w is None else min(c + 1, w)),
    "context − 1 tokens": _sequences_of(lambda c, w: c - 1 if w is None else min(c - 1, w)),
    # the right count, not an int (fresh round 3: // of a float gives 6.0)
    "// of a float: a float equal to the count": _sequences_of(_kept, result=lambda x: x),
    "np.floor: a NumPy float": _sequences_of(_kept, result=np.floor),
    "float(int(...))": _sequences_of(_kept, result=lambda x: float(int(x))),
    "a 0-d torch tensor": _sequences_of(_kept, result=lambda x: torch.tensor(int(x))),
    "calls the course's max_batch_size": lambda model, context, free_gib, dtype_bytes, window=None: __import__(
        "attnkit.serving.kv_cache", fromlist=["x"]).max_batch_size(
            model, context=context if window is None else min(context, window),
            memory_bytes=int(free_gib * 2**30), dtype_bytes=dtype_bytes),
}


# ------------------------------------------------------------------------------------ exercise 2: rope
def _angles(positions, d, *, exponent=lambda j, d: -2 * j / d, dtype=torch.float64, shift=0):
    j = torch.arange(d // 2, dtype=dtype)
    return (positions.to(dtype)[:, None] + shift) * torch.tensor(10000.0, dtype=dtype) ** exponent(j, d)


def rope_cat_stack(x, positions, mode):
    S, D = x.shape
    angle = _angles(positions, D)
    cos, sin = torch.cos(angle), torch.sin(angle)
    if mode == "half":
        a, b = x[:, : D // 2], x[:, D // 2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=2).reshape(S, D)


def rope_complex(x, positions, mode):
    S, D = x.shape
    turn = torch.polar(torch.ones(S, D // 2, dtype=torch.float64), _angles(positions, D))
    if mode == "half":
        z = torch.complex(x[:, : D // 2], x[:, D // 2:]) * turn
        return torch.cat([z.real, z.imag], dim=1)
    z = torch.view_as_complex(x.reshape(S, D // 2, 2).contiguous()) * turn
    return torch.view_as_real(z).reshape(S, D)


def rope_loops(x, positions, mode):
    S, D = x.shape
    out = torch.empty_like(x)
    for s in range(S):
        for j in range(D // 2):
            theta = float(positions[s]) * 10000.0 ** (-2 * j / D)
            i, k = (j, j + D // 2) if mode == "half" else (2 * j, 2 * j + 1)
            a, b = float(x[s, i]), float(x[s, k])
            out[s, i], out[s, k] = a * math.cos(theta) - b * math.sin(theta), b * math.cos(theta) + a * math.sin(theta)
    return out


def rope_matrices(x, positions, mode):
    S, D = x.shape
    angle = _angles(positions, D)
    first = torch.arange(D // 2) if mode == "half" else torch.arange(0, D, 2)
    second = first + D // 2 if mode == "half" else first + 1
    R = torch.zeros(S, D, D, dtype=torch.float64)
    R[:, first, first], R[:, second, second] = torch.cos(angle), torch.cos(angle)
    R[:, first, second], R[:, second, first] = -torch.sin(angle), torch.sin(angle)
    return torch.einsum("sij,sj->si", R, x)


ROPE_RIGHT = {"cat and stack": rope_cat_stack, "complex numbers": rope_complex, "loops": rope_loops,
              "rotation matrices": rope_matrices}


def _rope_with(x, positions, mode, *, swap_modes=False, sign=1.0, angles=None, funcs=(torch.cos, torch.sin),
               layout=None, pairs=None, second_turns=True):
    S, D = x.shape
    if swap_modes:
        mode = "interleaved" if mode == "half" else "half"
    angle = _angles(positions, D) if angles is None else angles(positions, D)
    cos, sin = funcs[0](angle), sign * funcs[1](angle)
    if pairs is not None:
        first, second = pairs(D)
    elif mode == "half":
        first, second = torch.arange(D // 2), torch.arange(D // 2, D)
    else:
        first, second = torch.arange(0, D, 2), torch.arange(1, D, 2)
    a, b = x[:, first], x[:, second]
    new_a, new_b = a * cos - b * sin, (b * cos + a * sin) if second_turns else b
    if layout == "halves":
        return torch.cat([new_a, new_b], dim=1)
    out = x.clone()
    out[:, first], out[:, second] = new_a, new_b
    return out


def _rope_cached(key):
    """rope whose angles are cached under ``key(x, positions, mode)`` and reused by every later call with
    that key ('the table does not change'), as a student keeps a table between calls."""
    tables = {}

    def rope(x, positions, mode):
        k = key(x, positions, mode)
        if k not in tables:
            tables[k] = _angles(positions, x.shape[1])
        return _rope_with(x, positions, mode, angles=lambda p, d: tables[k])
    return rope


ROPE_WRONG = {
    "modes swapped": lambda x, p, m: _rope_with(x, p, m, swap_modes=True),
    "turns the other way": lambda x, p, m: _rope_with(x, p, m, sign=-1.0),
    "exponent j/D instead of 2j/D": lambda x, p, m: _rope_with(x, p, m, angles=lambda p, d: _angles(
        p, d, exponent=lambda j, d: -j / d)),
    "positions from 1": lambda x, p, m: _rope_with(x, p, m, angles=lambda p, d: _angles(p, d, shift=1)),
    "0 .. S-1 instead of the positions": lambda x, p, m: _rope_with(x, p, m, angles=lambda p, d: _angles(
        torch.arange(len(p)), d)),
    "cos and sin swapped": lambda x, p, m: _rope_with(x, p, m, funcs=(torch.sin, torch.cos)),
    "interleaved written back in halves": lambda x, p, m: _rope_with(x, p, m, layout="halves"),
    "angles in float32": lambda x, p, m: _rope_with(x, p, m, angles=lambda p, d: _angles(
        p, d, dtype=torch.float32).double()),
    "half mode pairs j with D-1-j": lambda x, p, m: _rope_with(
        x, p, m, pairs=(lambda D: (torch.arange(D // 2), torch.arange(D - 1, D // 2 - 1, -1))) if m == "half"
        else None),
    "only the first of each pair turns": lambda x, p, m: _rope_with(x, p, m, second_turns=False),
    "inverse frequencies in float32": lambda x, p, m: _rope_with(x, p, m, angles=lambda p, d: p.double()[:, None] * (
        torch.tensor(10000.0) ** (-2 * torch.arange(d // 2) / d)).float().double()),
    "exponent (2j+1)/D": lambda x, p, m: _rope_with(x, p, m, angles=lambda p, d: _angles(
        p, d, exponent=lambda j, d: -(2 * j + 1) / d)),
    "the last position for every row": lambda x, p, m: _rope_with(x, p, m, angles=lambda p, d: _angles(
        p[-1:].expand_as(p), d)),
    "calls the course's apply_rope": lambda x, p, m: __import__(
        "attnkit.reference.rope", fromlist=["x"]).apply_rope(x, p, mode=m),
    # state kept between calls (round 4's class): a cos/sin table cached by what a later call may share
    "cos/sin cached by (S, D)": _rope_cached(lambda x, p, m: x.shape),
    "cos/sin cached by (S, D, mode)": _rope_cached(lambda x, p, m: (*x.shape, m)),
    "cos/sin cached by (S, D, first position)": _rope_cached(lambda x, p, m: (*x.shape, int(p[0]))),
}


# ------------------------------------------------------------------------------------ exercise 3: rope_append
def _rotate(x, pos, mode, *, sign=1.0):
    """x [B, S, H, D] rotated at pos [B, S], in float64; returns x's dtype."""
    D = x.shape[-1]
    angle = pos.double()[:, :, None, None] * 10000.0 ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    cos, sin = torch.cos(angle), sign * torch.sin(angle)
    x64 = x.double()
    if mode == "half":
        a, b = x64[..., : D // 2], x64[..., D // 2:]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = x64[..., 0::2], x64[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return out.to(x.dtype)


def append_torch(q, k, v, k_cache, v_cache, seqlens_k, mode="half", *, shift=0, rotate_q=True, q_pos=None,
                 q_mode=None, rotate_k=True, write_v=True, rotate_v=False, sign=1.0, k_head=None):
    B, S = q.shape[:2]
    past = seqlens_k.long() + 1 - S + shift                            # [B]
    pos = past[:, None] + torch.arange(S)[None, :]                     # [B, S]
    q_at = pos if q_pos is None else q_pos(pos)
    q_out = _rotate(q, q_at, q_mode or mode, sign=sign) if rotate_q else q.clone()
    k_new = _rotate(k, pos, mode, sign=sign) if rotate_k else k
    v_new = _rotate(v, pos, mode) if rotate_v else v
    for b in range(B):
        for s in range(S):
            row = int(pos[b, s])
            heads = k_new[b, s] if k_head is None else k_new[b, s][k_head(k.shape[2])]
            k_cache[b, :, row] = heads
            if write_v:
                v_cache[b, :, row] = v_new[b, s]
    return q_out


def append_scatter(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """The same, with one index_put per cache instead of loops, and the rotation as a complex product."""
    B, S, _, D = q.shape
    pos = (seqlens_k.long() + 1 - S)[:, None] + torch.arange(S)[None, :]
    angle = pos.double()[:, :, None, None] * 10000.0 ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    turn = torch.polar(torch.ones_like(angle), angle)

    def rotate(x):
        x64 = x.double()
        if mode == "half":
            z = torch.complex(x64[..., : D // 2], x64[..., D // 2:]) * turn
            return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)
        z = torch.view_as_complex(x64.reshape(*x.shape[:-1], D // 2, 2).contiguous()) * turn
        return torch.view_as_real(z).flatten(-2).to(x.dtype)

    b_idx = torch.arange(B)[:, None].expand(B, S)
    k_cache[b_idx, :, pos] = rotate(k)
    v_cache[b_idx, :, pos] = v
    return rotate(q)


def append_q_float64(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Right values, wrong dtype: the rotated q comes back in float64, not q's float32."""
    S = q.shape[1]
    append_torch(q, k, v, k_cache, v_cache, seqlens_k, mode)
    return _rotate(q.double(), (seqlens_k.long() + 1 - S)[:, None] + torch.arange(S)[None, :], mode)


def append_last_token_only(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Decoding's rule for a chunk: only the last new token reaches the caches."""
    q_rot = append_torch(q, k, v, k_cache.clone(), v_cache.clone(), seqlens_k, mode)
    append_torch(q[:, -1:], k[:, -1:], v[:, -1:], k_cache, v_cache, seqlens_k, mode)
    return q_rot


def append_one_row_past(q, k, v, k_cache, v_cache, seqlens_k, mode="half"):
    """Also copies the last new row into the row after it (a loop that runs one row too far)."""
    q_rot = append_torch(q, k, v, k_cache, v_cache, seqlens_k, mode)
    for b, last in enumerate(seqlens_k.tolist()):
        if last + 1 < k_cache.shape[2]:
            k_cache[b, :, last + 1], v_cache[b, :, last + 1] = k_cache[b, :, last], v_cache[b, :, last]
    return q_rot


APPEND_RIGHT = {"PyTorch loops": append_torch, "index_put and complex numbers": append_scatter}

APPEND_WRONG = {
    "seqlens_k taken as the length (a row too early)": lambda *a: append_torch(*a, shift=-1),
    "a row too late": lambda *a: append_torch(*a, shift=1),
    "q not rotated": lambda *a: append_torch(*a, rotate_q=False),
    "q rotated at position s, not past + s": lambda *a: append_torch(*a, q_pos=lambda pos: pos - pos[:, :1]),
    "q rotated at the chunk's first position": lambda *a: append_torch(*a, q_pos=lambda pos: pos[:, :1].expand_as(
        pos)),
    "q rotated in the other mode": lambda *a: append_torch(*a, q_mode="interleaved" if a[-1] == "half" else "half"),
    "modes swapped": lambda *a: append_torch(*a[:-1], "interleaved" if a[-1] == "half" else "half"),
    "turns the other way": lambda *a: append_torch(*a, sign=-1.0),
    "K written but not rotated": lambda *a: append_torch(*a, rotate_k=False),
    "V not written": lambda *a: append_torch(*a, write_v=False),
    "V rotated too": lambda *a: append_torch(*a, rotate_v=True),
    "KV heads written in reverse order": lambda *a: append_torch(*a, k_head=lambda h: torch.arange(h - 1, -1, -1)),
    "q_rot returned in float64": append_q_float64,
    "sequence 0's seqlens_k for every sequence": lambda q, k, v, kc, vc, sk, mode="half": append_torch(
        q, k, v, kc, vc, sk[:1].expand_as(sk).clone(), mode),
    "only the last new token written": append_last_token_only,
    "one row past the end written too": append_one_row_past,
    "calls the course's rope_append_torch": lambda q, k, v, kc, vc, sk, mode="half": __import__(
        "attnkit.kernels.rope_append", fromlist=["x"]).rope_append_torch(q, k, v, kc, vc, seqlens_k=sk, mode=mode)[0],
}

# The solution's kernel with one line changed: (line in the solution, its replacement).
TRITON_WRONG = {
    "seqlens_k taken as the length": ("past = tl.load(seqlens_k + b) + 1 - S", "past = tl.load(seqlens_k + b) - S"),
    "interleaved pairs turn the other way": ("sign = tl.where(d % 2 == 0, -1.0, 1.0)",
                                             "sign = tl.where(d % 2 == 0, 1.0, -1.0)"),
    "q not rotated": ("y = x * c + sign * tl.load(row + partner) * sn", "y = x"),
    "half mode pairs d with D-1-d": ("partner = tl.where(d < D // 2, d + D // 2, d - D // 2)",
                                     "partner = D - 1 - d"),
}

RIGHT = {"cache_bytes": BYTES_RIGHT, "max_sequences": SEQUENCES_RIGHT, "rope": ROPE_RIGHT, "rope_append": APPEND_RIGHT}
WRONG = {"cache_bytes": BYTES_WRONG, "max_sequences": SEQUENCES_WRONG, "rope": ROPE_WRONG, "rope_append": APPEND_WRONG}
