# ruff: noqa: E501, B007, F841
"""Round 5 of fresh wrong answers for lab 05 (FlashAttention forward in Triton), written from the lab's text and
its solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: the scale taken from the padded width BLOCK_D (visible only when D is not a power of two), the
causal mask left to the loop bound, the KV head taken from the program id that also counts the batch (visible
only for B > 1), the mask applied in the last key tile only (visible when Nk − Nq is not a multiple of the
tile), and the rescale applied after the new tile is added. The correct answers load k already transposed and
tell an empty row by its maximum."""
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


# ---------------------------------------------------------------- f5_scale_from_block_d

@triton.jit
def flash_forward_kernel__f5_scale_from_block_d(
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
        s = tl.dot(q, tl.trans(k)) * (1.0 / BLOCK_D ** 0.5)                    # [BLOCK_M, BLOCK_N]
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


def f5_scale_from_block_d(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. The scale written in the kernel as 1/sqrt(BLOCK_D) ('the tile is BLOCK_D wide'), sm_scale left
    unused: the same when D is a power of two of at least 16, wrong for D = 24 (BLOCK_D = 32)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_scale_from_block_d[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_causal_bound_only

@triton.jit
def flash_forward_kernel__f5_causal_bound_only(
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


def f5_causal_bound_only(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. The causal mask left to the loop bound hi ('the loop stops at the last key the tile
    sees'): inside the last tiles a row still sees the keys that only later rows of its tile may see."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_causal_bound_only[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_kv_head_from_program_id

@triton.jit
def flash_forward_kernel__f5_kv_head_from_program_id(
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
        kv_head = tl.program_id(1) // GROUP
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


def f5_kv_head_from_program_id(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, GQA. kv_head = tl.program_id(1) // GROUP ('the second grid axis counts the heads'): that axis
    counts batch · Hq + head, so for B > 1 the later batches read other KV heads (past Hkv)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_kv_head_from_program_id[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_mask_last_tile_only

@triton.jit
def flash_forward_kernel__f5_mask_last_tile_only(
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
        if CAUSAL and start_n + BLOCK_N >= hi:
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


def f5_mask_last_tile_only(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. Applies the causal mask only in the loop's last key tile, `if start_n + BLOCK_N >= hi`
    ('only the diagonal tile needs it'): when Nk − Nq is not a multiple of the tile, the keys a row may not see
    reach into the tile before."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_mask_last_tile_only[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_rescale_after_add

@triton.jit
def flash_forward_kernel__f5_rescale_after_add(
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
        acc = (acc + tl.dot(p.to(v.dtype), v)) * alpha[:, None]    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_rescale_after_add(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. acc = (acc + p·v) · alpha ('rescale the sum'): the new tile's contribution is scaled by alpha
    too, although p is already relative to the new maximum."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_rescale_after_add[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_k_loaded_transposed

@triton.jit
def flash_forward_kernel__f5_k_loaded_transposed(
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
        k = tl.load(k_base + keys[None, :] * stride_kn + offs_d[:, None] * stride_kd,
                    mask=(keys[None, :] < n_k) & (offs_d[:, None] < HEAD_DIM), other=0.0)
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


def f5_k_loaded_transposed(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, correct: the k tile loaded as [BLOCK_D, BLOCK_N] by swapping its index roles (its own mask), so
    tl.dot(q, k) needs no tl.trans."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_k_loaded_transposed[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f5_seen_from_max

@triton.jit
def flash_forward_kernel__f5_seen_from_max(
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

    seen = m_i > float("-inf")                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_seen_from_max(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, correct: a row that saw a key is told by its running maximum, m_i > −∞, instead of l_i > 0."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)        # one program per (query tile, batch·head)
    flash_forward_kernel__f5_seen_from_max[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


SOLUTION = {"forward": flash_forward}
WRONG = {"forward": [f5_scale_from_block_d, f5_causal_bound_only, f5_kv_head_from_program_id, f5_mask_last_tile_only, f5_rescale_after_add]}
CORRECT = {"forward": [flash_forward, f5_k_loaded_transposed, f5_seen_from_max]}


def _t(shape, seed, scale=1.0, perm=None, dtype=torch.float16):
    """A tensor of `shape` whose memory holds the axes in the order `perm` (a layout of its own)."""
    g = torch.Generator().manual_seed(seed)
    if perm is None:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)
    x = (torch.randn(*[shape[i] for i in perm], generator=g) * scale).to(dtype)
    return x.permute(*[perm.index(i) for i in range(len(shape))])


def _run(f, B, Hq, Hkv, Nq, Nk, D, causal, seed=0, scale=1.0):
    q = _t((B, Hq, Nq, D), seed, scale, perm=(2, 0, 1, 3))
    k = _t((B, Hkv, Nk, D), seed + 1, scale, perm=(0, 2, 1, 3))
    v = _t((B, Hkv, Nk, D), seed + 2, 1.0, perm=(1, 0, 3, 2))
    try:
        return f(q, k, v, causal)
    except Exception as exc:  # a kernel that does not compile for these inputs differs
        return f"{type(exc).__name__}"


def _run_batches(f):
    """B = 2, Hq = 4, Hkv = 2; k and v are the first half of buffers twice their size, so a read past the
    second batch's KV heads stays inside memory the witness owns."""
    q = _t((2, 4, 17, 16), 0)
    k = _t((4, 2, 20, 16), 1)[:2]
    v = _t((4, 2, 20, 16), 2)[:2]
    return f(q, k, v, False)


WITNESS = {
    "f5_scale_from_block_d": lambda f: _run(f, 1, 1, 1, 17, 20, 24, False),
    "f5_causal_bound_only": lambda f: _run(f, 1, 1, 1, 33, 33, 16, True),
    "f5_kv_head_from_program_id": _run_batches,
    "f5_mask_last_tile_only": lambda f: _run(f, 1, 1, 1, 18, 35, 16, True),
    "f5_rescale_after_add": lambda f: _run(f, 1, 1, 1, 17, 40, 16, False, scale=3.0),
}
