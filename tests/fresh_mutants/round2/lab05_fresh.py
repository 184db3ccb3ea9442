# ruff: noqa: E501, B007, F841
"""Round 2 of fresh wrong answers for lab 05 (FlashAttention forward in Triton), written from the lab's
text and its solution only. Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
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


# forward: f5_q_rows_mask_only
@triton.jit
def flash_forward_kernel__f5_q_rows_mask_only(
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
    q = tl.load(q_ptrs, mask=offs_m[:, None] < n_q, other=0.0)   # [BLOCK_M, BLOCK_D]
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


def f5_q_rows_mask_only(q, k, v, causal=False, block_m=16, block_n=16):
    """q's load masked on rows only: columns past D read the next row."""
    """Launch flash_forward_kernel__f5_q_rows_mask_only: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_q_rows_mask_only[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_kv_head_mod_hkv
@triton.jit
def flash_forward_kernel__f5_kv_head_mod_hkv(
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
        kv_head = head % (H_Q // GROUP)
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


def f5_kv_head_mod_hkv(q, k, v, causal=False, block_m=16, block_n=16):
    """KV head h % Hkv."""
    """Launch flash_forward_kernel__f5_kv_head_mod_hkv: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_kv_head_mod_hkv[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_kv_head_div_hkv
@triton.jit
def flash_forward_kernel__f5_kv_head_div_hkv(
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
        kv_head = head // (H_Q // GROUP)
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


def f5_kv_head_div_hkv(q, k, v, causal=False, block_m=16, block_n=16):
    """KV head h // Hkv."""
    """Launch flash_forward_kernel__f5_kv_head_div_hkv: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_kv_head_div_hkv[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_hi_without_plus_one
@triton.jit
def flash_forward_kernel__f5_hi_without_plus_one(
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
        hi = tl.minimum(last_row + n_k - n_q, n_k)

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


def f5_hi_without_plus_one(q, k, v, causal=False, block_m=16, block_n=16):
    """Causal loop end without its + 1."""
    """Launch flash_forward_kernel__f5_hi_without_plus_one: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_hi_without_plus_one[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_hi_from_first_row
@triton.jit
def flash_forward_kernel__f5_hi_from_first_row(
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
        last_row = tile_m * BLOCK_M   # the tile's last real query row
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


def f5_hi_from_first_row(q, k, v, causal=False, block_m=16, block_n=16):
    """Causal loop end from the tile's first row."""
    """Launch flash_forward_kernel__f5_hi_from_first_row: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_hi_from_first_row[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_causal_not_aligned
@triton.jit
def flash_forward_kernel__f5_causal_not_aligned(
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
            s = tl.where(keys[None, :] <= offs_m[:, None], s, float("-inf"))
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


def f5_causal_not_aligned(q, k, v, causal=False, block_m=16, block_n=16):
    """Causal mask j <= i (not aligned to the end)."""
    """Launch flash_forward_kernel__f5_causal_not_aligned: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_causal_not_aligned[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_max_before_causal_mask
@triton.jit
def flash_forward_kernel__f5_max_before_causal_mask(
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
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))               # [BLOCK_M] new running max
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


def f5_max_before_causal_mask(q, k, v, causal=False, block_m=16, block_n=16):
    """Row maximum taken before the causal mask."""
    """Launch flash_forward_kernel__f5_max_before_causal_mask: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_max_before_causal_mask[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_acc_not_rescaled
@triton.jit
def flash_forward_kernel__f5_acc_not_rescaled(
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
        acc = acc + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_acc_not_rescaled(q, k, v, causal=False, block_m=16, block_n=16):
    """acc not multiplied by alpha."""
    """Launch flash_forward_kernel__f5_acc_not_rescaled: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_acc_not_rescaled[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_padded_keys_scored
@triton.jit
def flash_forward_kernel__f5_padded_keys_scored(
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


def f5_padded_keys_scored(q, k, v, causal=False, block_m=16, block_n=16):
    """Keys past Nk not set to -inf (their k rows load as 0: score 0)."""
    """Launch flash_forward_kernel__f5_padded_keys_scored: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_padded_keys_scored[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_fp16_acc
@triton.jit
def flash_forward_kernel__f5_fp16_acc(
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
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float16)               # running unnormalised output

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
        acc = (acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)).to(tl.float16)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_fp16_acc(q, k, v, causal=False, block_m=16, block_n=16):
    """acc kept in fp16."""
    """Launch flash_forward_kernel__f5_fp16_acc: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_fp16_acc[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_fp16_l
@triton.jit
def flash_forward_kernel__f5_fp16_l(
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
    l_i = tl.zeros([BLOCK_M], tl.float16)                        # running row sum of exp
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
        l_i = (l_i * alpha + tl.sum(p, axis=1)).to(tl.float16)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    l_i = l_i.to(tl.float32)
    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_fp16_l(q, k, v, causal=False, block_m=16, block_n=16):
    """l_i kept in fp16."""
    """Launch flash_forward_kernel__f5_fp16_l: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_fp16_l[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_exp2_log2e_1443
@triton.jit
def flash_forward_kernel__f5_exp2_log2e_1443(
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
        alpha = tl.exp2((m_i - m_use) * 1.443)                              # how much the old state shrinks
        p = tl.exp2((s - m_use[:, None]) * 1.443)                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_exp2_log2e_1443(q, k, v, causal=False, block_m=16, block_n=16):
    """exp2 with log2(e) written as 1.443."""
    """Launch flash_forward_kernel__f5_exp2_log2e_1443: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_exp2_log2e_1443[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_lse_without_m
@triton.jit
def flash_forward_kernel__f5_lse_without_m(
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
    lse = tl.where(seen, tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_lse_without_m(q, k, v, causal=False, block_m=16, block_n=16):
    """LSE stored as log(l) (forgot m)."""
    """Launch flash_forward_kernel__f5_lse_without_m: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_lse_without_m[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_no_key_rows_divide
@triton.jit
def flash_forward_kernel__f5_no_key_rows_divide(
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
    acc = acc / l_i[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_no_key_rows_divide(q, k, v, causal=False, block_m=16, block_n=16):
    """o = acc / l_i with no guard: rows that see no key get 0/0."""
    """Launch flash_forward_kernel__f5_no_key_rows_divide: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_no_key_rows_divide[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_no_m_use
@triton.jit
def flash_forward_kernel__f5_no_m_use(
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
        m_use = m_new     # a row that has seen no key yet: exp(-inf) = 0
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


def f5_no_m_use(q, k, v, causal=False, block_m=16, block_n=16):
    """exp(m_i - m_new) with both -inf: NaN for rows that see no key yet."""
    """Launch flash_forward_kernel__f5_no_m_use: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_no_m_use[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_v_through_k_strides
@triton.jit
def flash_forward_kernel__f5_v_through_k_strides(
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
        v = tl.load(v_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
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


def f5_v_through_k_strides(q, k, v, causal=False, block_m=16, block_n=16):
    """v read through k's strides."""
    """Launch flash_forward_kernel__f5_v_through_k_strides: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_v_through_k_strides[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_o_through_q_strides
@triton.jit
def flash_forward_kernel__f5_o_through_q_strides(
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
    o_ptrs = O + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_o_through_q_strides(q, k, v, causal=False, block_m=16, block_n=16):
    """o stored through q's strides."""
    """Launch flash_forward_kernel__f5_o_through_q_strides: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_o_through_q_strides[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_lse_at_kv_head
@triton.jit
def flash_forward_kernel__f5_lse_at_kv_head(
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
    tl.store(LSE + (batch * H_Q + kv_head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_lse_at_kv_head(q, k, v, causal=False, block_m=16, block_n=16):
    """LSE row indexed with the KV head."""
    """Launch flash_forward_kernel__f5_lse_at_kv_head: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_lse_at_kv_head[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_k_batch_stride_missing
@triton.jit
def flash_forward_kernel__f5_k_batch_stride_missing(
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
    k_base = K + kv_head * stride_kh
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


def f5_k_batch_stride_missing(q, k, v, causal=False, block_m=16, block_n=16):
    """K's batch offset forgotten."""
    """Launch flash_forward_kernel__f5_k_batch_stride_missing: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_k_batch_stride_missing[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_m_updated_before_alpha
@triton.jit
def flash_forward_kernel__f5_m_updated_before_alpha(
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
        m_i = m_new
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)     # a row that has seen no key yet: exp(-inf) = 0
        alpha = tl.exp(m_i - m_use)                              # how much the old state shrinks
        p = tl.exp(s - m_use[:, None])                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f5_m_updated_before_alpha(q, k, v, causal=False, block_m=16, block_n=16):
    """m_i = m_new before alpha (alpha is always 1)."""
    """Launch flash_forward_kernel__f5_m_updated_before_alpha: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_m_updated_before_alpha[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_kv_rows_mask_only
@triton.jit
def flash_forward_kernel__f5_kv_rows_mask_only(
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
        kv_mask = keys[:, None] < n_k
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


def f5_kv_rows_mask_only(q, k, v, causal=False, block_m=16, block_n=16):
    """k and v loaded with the key mask only (columns past D read the next row)."""
    """Launch flash_forward_kernel__f5_kv_rows_mask_only: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_kv_rows_mask_only[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# forward: f5_max_of_unscaled
@triton.jit
def flash_forward_kernel__f5_max_of_unscaled(
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
        s_raw = tl.dot(q, tl.trans(k))
        s = s_raw * sm_scale
        s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if CAUSAL:
            s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(tl.where(s == float("-inf"), float("-inf"), s_raw), axis=1))               # [BLOCK_M] new running max
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


def f5_max_of_unscaled(q, k, v, causal=False, block_m=16, block_n=16):
    """Running maximum of the unscaled scores, subtracted from the scaled ones."""
    """Launch flash_forward_kernel__f5_max_of_unscaled: q [B, Hq, Nq, D]; k, v [B, Hkv, Nk, D] → (o [B, Hq, Nq, D],
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
    flash_forward_kernel__f5_max_of_unscaled[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


WRONG = {
    "forward": [f5_q_rows_mask_only, f5_kv_head_mod_hkv, f5_kv_head_div_hkv, f5_hi_without_plus_one, f5_hi_from_first_row, f5_causal_not_aligned, f5_max_before_causal_mask, f5_acc_not_rescaled, f5_padded_keys_scored, f5_fp16_acc, f5_fp16_l, f5_exp2_log2e_1443, f5_lse_without_m, f5_no_key_rows_divide, f5_no_m_use, f5_v_through_k_strides, f5_o_through_q_strides, f5_lse_at_kv_head, f5_k_batch_stride_missing, f5_m_updated_before_alpha, f5_kv_rows_mask_only, f5_max_of_unscaled],
}
SOLUTION = {"forward": flash_forward}
CORRECT = {"forward": [flash_forward]}


def _t(shape, seed, scale=1.0, perm=None):
    """fp16 tensor of `shape`, stored in the axis order `perm` (a layout of its own)."""
    g = torch.Generator().manual_seed(seed)
    if perm is None:
        return (torch.randn(*shape, generator=g) * scale).half()
    stored = [shape[i] for i in perm]
    x = (torch.randn(*stored, generator=g) * scale).half()
    inv = [perm.index(i) for i in range(len(shape))]
    return x.permute(*inv)


def _run(f, B, Hq, Hkv, Nq, Nk, D, causal, seed=0, scale=1.0):
    q = _t((B, Hq, Nq, D), seed, scale, perm=(2, 0, 1, 3))
    k = _t((B, Hkv, Nk, D), seed + 1, scale, perm=(0, 2, 1, 3))
    v = _t((B, Hkv, Nk, D), seed + 2, 1.0, perm=(1, 0, 3, 2))     # d not contiguous
    return f(q, k, v, causal)


def _hidden_above(f):
    """Nq = Nk = 16, causal: row 0's only visible key scores -200, its hidden keys +200."""
    D = 16
    u = torch.zeros(D)
    u[0] = math.sqrt(800.0)
    q = u.expand(1, 1, 16, D).clone().half()
    k = u.expand(1, 1, 16, D).clone()
    k[0, 0, 0] = -k[0, 0, 0]
    v = torch.randn(1, 1, 16, D, generator=torch.Generator().manual_seed(3)).half()
    return f(q, k.half(), v, True)


WITNESS = {n.__name__: (lambda f: _run(f, 2, 2, 2, 33, 37, 24, False)) for n in WRONG["forward"]}
def _q_in_nan(f):
    """q inside a buffer of NaN (D = 24, BLOCK_D = 32: columns 24..31 of q are NaN)."""
    buf = torch.full((1, 2, 33, 32), float("nan")).half()
    buf[..., :24] = _t((1, 2, 33, 24), 5)
    return f(buf[..., :24], _t((1, 2, 37, 24), 6), _t((1, 2, 37, 24), 7), False)


def _kv_in_nan(f):
    """k and v inside buffers of NaN (D = 24, BLOCK_D = 32: columns 24..31 are NaN)."""
    bufs = []
    for seed in (6, 7):
        buf = torch.full((1, 2, 37, 32), float("nan")).half()
        buf[..., :24] = _t((1, 2, 37, 24), seed)
        bufs.append(buf[..., :24])
    return f(_t((1, 2, 33, 24), 5), bufs[0], bufs[1], False)


WITNESS.update({
    "f5_kv_rows_mask_only": _kv_in_nan,
    "f5_q_rows_mask_only": _q_in_nan,
    "f5_kv_head_mod_hkv": lambda f: _run(f, 1, 6, 3, 17, 20, 16, False),
    "f5_kv_head_div_hkv": lambda f: _run(f, 1, 6, 3, 17, 20, 16, False),
    "f5_hi_without_plus_one": lambda f: _run(f, 1, 1, 1, 33, 33, 16, True),
    "f5_hi_from_first_row": lambda f: _run(f, 1, 1, 1, 18, 28, 16, True),
    "f5_causal_not_aligned": lambda f: _run(f, 1, 2, 2, 18, 35, 16, True),
    "f5_max_before_causal_mask": _hidden_above,
    "f5_no_key_rows_divide": lambda f: _run(f, 1, 1, 1, 40, 21, 16, True),
    "f5_no_m_use": lambda f: _run(f, 1, 1, 1, 40, 21, 16, True),
    "f5_lse_at_kv_head": lambda f: _run(f, 1, 4, 2, 17, 20, 16, False),
    "f5_acc_not_rescaled": lambda f: _run(f, 1, 1, 1, 17, 50, 16, False, scale=6.0),
})
