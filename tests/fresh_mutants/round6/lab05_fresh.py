# ruff: noqa: E501, B007, F841
"""Round 6 of fresh wrong answers for lab 05 (FlashAttention forward in Triton), written from the lab's text and
its solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in round 5. New classes
here: the causal loop bound from the tile's first row, the padding keys given a finite score, the running
maximum clamped at a finite floor, k and v addressed with q's batch stride, the LSE written at the KV head's
index, p and v rounded to bf16 for the product, alpha taken from the unguarded maximum, o stored through q's
strides. The correct answers: a loop bound from the padded tile end, the KV head as h · Hkv // Hq, exp2 with
log2 e to all its digits, and the p · v product in fp32."""
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



# ---------------------------------------------------------------- f6_hi_from_first_row

@triton.jit
def flash_forward_kernel__f6_hi_from_first_row(
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


def f6_hi_from_first_row(q, k, v, causal=False, block_m=16, block_n=16):
    """Causal loop bound from the tile's FIRST row (tile_m · BLOCK_M + Nk − Nq + 1): the tile's later rows may see keys past it; visible when Nk − Nq is not a multiple of BLOCK_N."""
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
    flash_forward_kernel__f6_hi_from_first_row[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_padding_minus_1e4

@triton.jit
def flash_forward_kernel__f6_padding_minus_1e4(
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
        s = tl.where(keys[None, :] < n_k, s, -1.0e4)
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


def f6_padding_minus_1e4(q, k, v, causal=False, block_m=16, block_n=16):
    """Keys j >= Nk scored -1e4 instead of -inf ('a large negative number is safer than inf'): a row whose real scores all lie below -1e4 takes the padding keys for its largest scores and averages in their zero values."""
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
    flash_forward_kernel__f6_padding_minus_1e4[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_max_clamped_at_minus_1e4

@triton.jit
def flash_forward_kernel__f6_max_clamped_at_minus_1e4(
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
        m_use = tl.maximum(m_new, -1.0e4)     # a row that has seen no key yet: exp(-inf) = 0
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


def f6_max_clamped_at_minus_1e4(q, k, v, causal=False, block_m=16, block_n=16):
    """The empty-row guard written as m_use = max(m_new, -1e4) ('never -inf'): right while a row's largest score is above -1e4; a row whose scores all lie below -1e4 - 88 underflows to l = 0 (o = 0, LSE = -inf)."""
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
    flash_forward_kernel__f6_max_clamped_at_minus_1e4[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_kv_batch_stride_from_q

@triton.jit
def flash_forward_kernel__f6_kv_batch_stride_from_q(
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
    k_base = K + batch * stride_qb + kv_head * stride_kh
    v_base = V + batch * stride_qb + kv_head * stride_vh

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


def f6_kv_batch_stride_from_q(q, k, v, causal=False, block_m=16, block_n=16):
    """k and v addressed with q's batch stride (batch · stride_qb, 'the batch stride is the same for all'): right when B = 1 or when k, v and q share a batch stride."""
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
    flash_forward_kernel__f6_kv_batch_stride_from_q[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_lse_at_kv_head

@triton.jit
def flash_forward_kernel__f6_lse_at_kv_head(
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


def f6_lse_at_kv_head(q, k, v, causal=False, block_m=16, block_n=16):
    """LSE stored at (batch · H_Q + kv_head) · Nq ('one LSE per KV head'): with GQA the heads of a group overwrite one another's LSE and the other rows of lse are never written."""
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
    flash_forward_kernel__f6_lse_at_kv_head[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_p_bf16

@triton.jit
def flash_forward_kernel__f6_p_bf16(
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
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v.to(tl.bfloat16))    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f6_p_bf16(q, k, v, causal=False, block_m=16, block_n=16):
    """p and v rounded to bf16 for the product ('bf16 has fp32's range'): the lab says convert p to v's dtype, fp16; bf16 keeps 8 bits of mantissa, fp16 11."""
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
    flash_forward_kernel__f6_p_bf16[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_alpha_from_m_new

@triton.jit
def flash_forward_kernel__f6_alpha_from_m_new(
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
        alpha = tl.exp(m_i - m_new)                              # how much the old state shrinks
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


def f6_alpha_from_m_new(q, k, v, causal=False, block_m=16, block_n=16):
    """alpha = exp(m_i − m_new) with the unguarded maximum (the guard used for p only): a row that has seen no key yet gets exp(−inf − (−inf)) = NaN in alpha, and l_i, acc become NaN."""
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
    flash_forward_kernel__f6_alpha_from_m_new[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_o_through_q_strides

@triton.jit
def flash_forward_kernel__f6_o_through_q_strides(
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


def f6_o_through_q_strides(q, k, v, causal=False, block_m=16, block_n=16):
    """o stored through q's strides ('o has q's shape'): the launch allocates o contiguous; right only when q is contiguous too."""
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
    flash_forward_kernel__f6_o_through_q_strides[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse

# ---------------------------------------------------------------- correct alternatives

# ---------------------------------------------------------------- f6_hi_from_padded_tile_end

@triton.jit
def flash_forward_kernel__f6_hi_from_padded_tile_end(
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


def f6_hi_from_padded_tile_end(q, k, v, causal=False, block_m=16, block_n=16):
    """Correct: the causal loop bound from the padded tile end (tile_m + 1) · BLOCK_M − 1, not clamped to Nq: at most a tile of extra keys, all hidden by the causal mask."""
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
    flash_forward_kernel__f6_hi_from_padded_tile_end[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_kv_head_by_product

@triton.jit
def flash_forward_kernel__f6_kv_head_by_product(
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
        kv_head = head * (H_Q // GROUP) // H_Q
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


def f6_kv_head_by_product(q, k, v, causal=False, block_m=16, block_n=16):
    """Correct: kv_head = head · Hkv // Hq (Hkv = H_Q // GROUP), equal to head // GROUP because GROUP divides Hq."""
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
    flash_forward_kernel__f6_kv_head_by_product[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_exp2_exact

@triton.jit
def flash_forward_kernel__f6_exp2_exact(
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
        alpha = tl.exp2((m_i - m_use) * 1.4426950408889634)                              # how much the old state shrinks
        p = tl.exp2((s - m_use[:, None]) * 1.4426950408889634)                           # [BLOCK_M, BLOCK_N]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f6_exp2_exact(q, k, v, causal=False, block_m=16, block_n=16):
    """Correct: exponentials in base 2 with log2 e = 1.4426950408889634 (all its digits); the maxima stay in natural units."""
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
    flash_forward_kernel__f6_exp2_exact[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


# ---------------------------------------------------------------- f6_dot_in_fp32

@triton.jit
def flash_forward_kernel__f6_dot_in_fp32(
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
        acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32))    # [BLOCK_M, BLOCK_D]
        m_i = m_new

    seen = l_i > 0                                               # rows that see at least one key
    acc = acc / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & dims)
    lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def f6_dot_in_fp32(q, k, v, causal=False, block_m=16, block_n=16):
    """Correct: p kept in fp32 and v converted to fp32 for the product (more precise than fp16 p on a CPU)."""
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
    flash_forward_kernel__f6_dot_in_fp32[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        Nq, Nk, 1.0 / math.sqrt(D),
        H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=block_m, BLOCK_N=block_n)
    return o, lse


SOLUTION = {"forward": flash_forward}
WRONG = {"forward": [f6_hi_from_first_row, f6_padding_minus_1e4, f6_max_clamped_at_minus_1e4, f6_kv_batch_stride_from_q, f6_lse_at_kv_head, f6_p_bf16, f6_alpha_from_m_new, f6_o_through_q_strides]}
CORRECT = {"forward": [flash_forward, f6_hi_from_padded_tile_end, f6_kv_head_by_product, f6_exp2_exact, f6_dot_in_fp32]}


def _t(shape, seed, scale=1.0, perm=None, dtype=torch.float16, shift=0.0):
    """A tensor of `shape` whose memory holds the axes in the order `perm` (a layout of its own)."""
    g = torch.Generator().manual_seed(seed)
    if perm is None:
        return (torch.randn(*shape, generator=g) * scale + shift).to(dtype)
    x = (torch.randn(*[shape[i] for i in perm], generator=g) * scale + shift).to(dtype)
    return x.permute(*[perm.index(i) for i in range(len(shape))])


def _run(f, B, Hq, Hkv, Nq, Nk, D, causal, seed=0, scale=1.0, q_perm=(2, 0, 1, 3)):
    q = _t((B, Hq, Nq, D), seed, scale, perm=q_perm)
    k = _t((B, Hkv, Nk, D), seed + 1, scale, perm=(0, 2, 1, 3))
    v = _t((B, Hkv, Nk, D), seed + 2, 1.0, perm=(1, 0, 3, 2))
    try:
        return f(q, k, v, causal)
    except Exception as exc:  # a kernel that does not compile for these inputs differs
        return f"{type(exc).__name__}"


def _run_low(f):
    """Every score near -14400: q near +60, k near -60 (fp16), D = 16."""
    q = _t((1, 1, 17, 16), 0, 1.0, shift=60.0)
    k = _t((1, 1, 20, 16), 1, 1.0, shift=-60.0)
    v = _t((1, 1, 20, 16), 2)
    return f(q, k, v, False)


WITNESS = {
    "f6_hi_from_first_row": lambda f: _run(f, 1, 1, 1, 18, 35, 16, True),
    "f6_padding_minus_1e4": _run_low,
    "f6_max_clamped_at_minus_1e4": _run_low,
    "f6_kv_batch_stride_from_q": lambda f: _run(f, 2, 2, 2, 17, 20, 16, False),
    "f6_lse_at_kv_head": lambda f: _run(f, 1, 4, 2, 17, 20, 16, False),
    "f6_p_bf16": lambda f: _run(f, 1, 1, 1, 17, 40, 16, False, scale=2.0),
    "f6_alpha_from_m_new": lambda f: _run(f, 1, 1, 1, 40, 21, 16, True),
    "f6_o_through_q_strides": lambda f: _run(f, 1, 2, 2, 17, 20, 16, False),
}
