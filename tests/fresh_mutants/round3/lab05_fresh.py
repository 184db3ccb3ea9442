# ruff: noqa: E501, B007, F841
"""Round 3 of fresh wrong answers for lab 05 (FlashAttention forward in Triton), written from the lab's text and
its solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py."""
import math

import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ---------------------------------------------------------------- the solution

@triton.jit
def flash_forward_kernel(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)

def flash_forward(q, k, v, causal=False, block_m=16, block_n=16):
    """Launch flash_forward_kernel: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
    lse [B, Hq, Nq] fp32, the natural-log log-sum-exp of each row's scaled scores; −inf for a row that
    sees no key, whose o is 0)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_kv_first_head

@triton.jit
def flash_forward_kernel__f5_kv_first_head(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb
    v_base = V + batch * stride_vb

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_kv_first_head(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, GQA. The K and V bases leave out the KV head (kv_head · stride_kh): every query head reads KV head 0."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_kv_first_head[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_scale_twice

@triton.jit
def flash_forward_kernel__f5_scale_twice(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_scale_twice(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Multiplies the scores by sm_scale twice (scale 1/D instead of 1/sqrt(D))."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_scale_twice[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_lse_log2_units

@triton.jit
def flash_forward_kernel__f5_lse_log2_units(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * (sm_scale * 1.4426950408889634)                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp2(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp2(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log2(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_lse_log2_units(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Works in base 2 as the course's kernel does (scores times log2(e), exp2), and stores the LSE as m + log2(l): in log2 units, not natural log."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_lse_log2_units[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_lse_batch_missing

@triton.jit
def flash_forward_kernel__f5_lse_batch_missing(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + head * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_lse_batch_missing(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. LSE row index head · Nq + i (forgets the batch): right for B = 1 only."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_lse_batch_missing[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_causal_mask_tile_row

@triton.jit
def flash_forward_kernel__f5_causal_mask_tile_row(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= tile_m * BLOCK_M + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_causal_mask_tile_row(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. The mask compares keys with the tile's first row (tile_m · BLOCK_M) for every row of the tile."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_causal_mask_tile_row[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_q_flat_index

@triton.jit
def flash_forward_kernel__f5_q_flat_index(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_q_flat_index(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. q's address as the flat index of a contiguous [B, Hq, Nq, D] tensor ((b·Hq + h)·Nq·D + n·D + d), ignoring q's strides."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_q_flat_index[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_dot_no_trans

@triton.jit
def flash_forward_kernel__f5_dot_no_trans(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, k) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_dot_no_trans(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. tl.dot(q, k) without tl.trans: compiles only when BLOCK_D == BLOCK_N (D <= 16), and then multiplies q by k, not by kᵀ."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_dot_no_trans[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_kv_mask_uses_nq

@triton.jit
def flash_forward_kernel__f5_kv_mask_uses_nq(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_q) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_q, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_kv_mask_uses_nq(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. The K/V load mask and the key mask bound the keys by Nq (copied from q's mask): right when Nq == Nk only."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_kv_mask_uses_nq[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- f5_hi_padded_end

@triton.jit
def flash_forward_kernel__f5_hi_padded_end(
    Q, K, V, O, LSE,                             # pointers: q, o [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D]; lse [B, Hq, Nq]
    stride_qb, stride_qh, stride_qn, stride_qd,  # element strides of every dimension, each tensor its own
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    n_q, n_k, sm_scale,                          # Nq, Nk, and the softmax scale 1/√D
    H_Q: tl.constexpr, GROUP: tl.constexpr,      # query heads Hq, and query heads per KV head Hq // Hkv
    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,   # D, and the next power of two
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Given: which tile of query rows, which batch and which query head this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)            # [BLOCK_M] query row indices
    offs_n = tl.arange(0, BLOCK_N)                               # [BLOCK_N] key offsets in a tile
    offs_d = tl.arange(0, BLOCK_D)                               # [BLOCK_D]: columns past HEAD_DIM are padding
    # Your kernel: see the steps above.
    dims = offs_d[None, :] < HEAD_DIM
    q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)   # [BLOCK_M, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)          # running row maximum
    l_i = tl.zeros([BLOCK_M], tl.float32)                        # running row sum of exp
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)               # running unnormalised output

    kv_head = head
    if GROUP > 1:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        last_row = (tile_m + 1) * BLOCK_M - 1   # the tile's last real query row
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n                                  # [BLOCK_N] key indices of this tile
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale                    # [BLOCK_M, BLOCK_N]
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))               # [BLOCK_M] new running max
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_hi_padded_end(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, correct: the causal loop end from the tile's padded end, (tile_m + 1)·BLOCK_M + Nk − Nq, capped at Nk (the Triton tutorial's form): extra keys are hidden by the mask."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_hi_padded_end[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

WRONG = {"forward": [f5_kv_first_head, f5_scale_twice, f5_lse_log2_units, f5_lse_batch_missing, f5_causal_mask_tile_row,
                     f5_q_flat_index, f5_dot_no_trans, f5_kv_mask_uses_nq]}
SOLUTION = {"forward": flash_forward}
CORRECT = {"forward": [flash_forward, f5_hi_padded_end]}


def _t(shape, seed, scale=1.0, perm=None):
    """An fp16 tensor of `shape` whose memory holds the axes in the order `perm` (a layout of its own)."""
    g = torch.Generator().manual_seed(seed)
    if perm is None:
        return (torch.randn(*shape, generator=g) * scale).half()
    x = (torch.randn(*[shape[i] for i in perm], generator=g) * scale).half()
    return x.permute(*[perm.index(i) for i in range(len(shape))])


def _run(f, B, Hq, Hkv, Nq, Nk, D, causal, seed=0, scale=1.0, layouts=True):
    q = _t((B, Hq, Nq, D), seed, scale, perm=(2, 0, 1, 3) if layouts else None)
    k = _t((B, Hkv, Nk, D), seed + 1, scale, perm=(0, 2, 1, 3) if layouts else None)
    v = _t((B, Hkv, Nk, D), seed + 2, 1.0, perm=(1, 0, 3, 2) if layouts else None)
    return f(q, k, v, causal)


WITNESS = {
    "f5_kv_first_head": lambda f: _run(f, 1, 4, 2, 17, 20, 16, False),
    "f5_scale_twice": lambda f: _run(f, 1, 1, 1, 17, 20, 16, False),
    "f5_lse_log2_units": lambda f: _run(f, 1, 1, 1, 17, 20, 16, False),
    "f5_lse_batch_missing": lambda f: _run(f, 2, 2, 2, 17, 20, 16, False),
    "f5_causal_mask_tile_row": lambda f: _run(f, 1, 1, 1, 20, 20, 16, True),
    "f5_q_flat_index": lambda f: _run(f, 1, 2, 2, 17, 20, 16, False),
    "f5_dot_no_trans": lambda f: _run(f, 1, 1, 1, 17, 20, 16, False),
    "f5_kv_mask_uses_nq": lambda f: _run(f, 1, 1, 1, 17, 30, 16, False),
}
