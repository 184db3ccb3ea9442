# ruff: noqa: E501, B007, F841
"""Round 4 of fresh wrong answers for lab 05 (FlashAttention forward in Triton), written from the lab's text and
its solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: bf16 inputs, a scaled q rounded to fp16 (visible only when the scale is not a power of two), a
causal shift written the other way round, an empty row's LSE, and a last key tile of one key."""
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


# ---------------------------------------------------------------- f5_p_fp16_hardcoded

@triton.jit
def flash_forward_kernel__f5_p_fp16_hardcoded(
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
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_p_fp16_hardcoded(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Converts p with p.to(tl.float16) ('tl.dot takes fp16') instead of p.to(v.dtype): with bf16
    inputs the product mixes fp16 and bf16 tiles."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_p_fp16_hardcoded[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_q_prescaled_fp16

@triton.jit
def flash_forward_kernel__f5_q_prescaled_fp16(
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
    q = (q * sm_scale).to(q.dtype)
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
        s = tl.dot(q, tl.trans(k))                               # [BLOCK_M, BLOCK_N]
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


def f5_q_prescaled_fp16(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Scales q once after loading it, (q · sm_scale).to(q.dtype) ('one multiply per row, not per
    score'): the scaled q is rounded to fp16, exact only when the scale is a power of two (D = 16, 64, 256)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_q_prescaled_fp16[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_causal_shift_swapped

@triton.jit
def flash_forward_kernel__f5_causal_shift_swapped(
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
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_q - n_k, s, float("-inf"))
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


def f5_causal_shift_swapped(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. Mask j <= i + Nq − Nk (the shift written the other way round): right when Nq == Nk;
    with Nq < Nk a query hides keys it may see."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_causal_shift_swapped[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_empty_lse_zero

@triton.jit
def flash_forward_kernel__f5_empty_lse_zero(
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
    lse = tl.where(seen, m_i + tl.log(l_i), 0.0)
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_empty_lse_zero(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. A row that sees no key gets LSE 0 ('log of nothing, zero') instead of −inf."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_empty_lse_zero[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_last_single_key_tile

@triton.jit
def flash_forward_kernel__f5_last_single_key_tile(
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

    for start_n in range(0, hi - 1, BLOCK_N):
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


def f5_last_single_key_tile(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Key loop range(0, hi − 1, BLOCK_N) ('the last key is hi − 1'): a last key tile that holds exactly
    one key (hi ≡ 1 mod BLOCK_N, Nk = 1 included) is never visited."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_last_single_key_tile[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_state_keeps_zero

@triton.jit
def flash_forward_kernel__f5_state_keeps_zero(
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
        m_i = m_use

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_state_keeps_zero(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, correct: keeps m_use as the running maximum (m_i = m_use): a row that has seen no key carries 0
    instead of −inf, harmless because its l_i and acc are 0 and its first visible key lies in the first tile."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_state_keeps_zero[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


WRONG = {"forward": [f5_p_fp16_hardcoded, f5_q_prescaled_fp16, f5_causal_shift_swapped, f5_empty_lse_zero, f5_last_single_key_tile]}
SOLUTION = {"forward": flash_forward}
CORRECT = {"forward": [flash_forward, f5_state_keeps_zero]}


def _t(shape, seed, scale=1.0, perm=None, dtype=torch.float16):
    """A tensor of `shape` whose memory holds the axes in the order `perm` (a layout of its own)."""
    g = torch.Generator().manual_seed(seed)
    if perm is None:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)
    x = (torch.randn(*[shape[i] for i in perm], generator=g) * scale).to(dtype)
    return x.permute(*[perm.index(i) for i in range(len(shape))])


def _run(f, B, Hq, Hkv, Nq, Nk, D, causal, seed=0, scale=1.0, dtype=torch.float16):
    q = _t((B, Hq, Nq, D), seed, scale, perm=(2, 0, 1, 3), dtype=dtype)
    k = _t((B, Hkv, Nk, D), seed + 1, scale, perm=(0, 2, 1, 3), dtype=dtype)
    v = _t((B, Hkv, Nk, D), seed + 2, 1.0, perm=(1, 0, 3, 2), dtype=dtype)
    try:
        return f(q, k, v, causal)
    except Exception as exc:  # a kernel that does not compile for these inputs differs
        return f"{type(exc).__name__}"


WITNESS = {
    "f5_p_fp16_hardcoded": lambda f: _run(f, 1, 2, 1, 17, 20, 16, False, dtype=torch.bfloat16),
    "f5_q_prescaled_fp16": lambda f: _run(f, 1, 1, 1, 17, 20, 24, False, scale=3.0),
    "f5_causal_shift_swapped": lambda f: _run(f, 1, 1, 1, 18, 35, 16, True),
    "f5_empty_lse_zero": lambda f: _run(f, 1, 1, 1, 40, 21, 16, True),
    "f5_last_single_key_tile": lambda f: _run(f, 1, 1, 1, 5, 17, 16, False),
}
