# ruff: noqa: E501, B007, F841
"""Round 6 of fresh wrong answers for lab 06 (FlashAttention backward in Triton), written from the lab's text and
its solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in round 5. New classes
here: the row term multiplied in fp16, the LSE and Δ read at the KV head's rows, dV accumulated before the
causal mask, a non-contiguous lse read as if contiguous, the dQ loop's end computed with BLOCK_N where
BLOCK_M belongs (right while the two are equal), Δ cached by shape across calls, dQ returned in fp32, a
count that includes the forward's products and a ratio floor-divided. The correct answers: the row term's
loads without other= (padding rows are never stored), Δ with its two arguments swapped, padding rows given
LSE = +inf (P = 0), and exp2 with the exact log2 e."""
import math

import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# ---------------------------------------------------------------- the solution

@triton.jit
def row_term_kernel(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
                    stride_ob, stride_oh, stride_on,            # element strides (the last dimension is contiguous)
                    stride_dob, stride_doh, stride_don,
                    n_q, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # Given: the rows this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H
    head = tl.program_id(1) % H
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    # Exercise 1: load the O and dO tiles, Δ = rowsum(dO ∘ O) in float32, store it.
    rows = offs_m[:, None] < n_q
    o = tl.load(O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=rows, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def row_term(o, do, block_m=16):
    """Launch row_term_kernel: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


def _check_shapes(q, k, v, causal):
    """The launch functions' input rules, as ValueErrors naming the argument."""
    B, Hq, Nq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] each, got {list(k.shape)} and {list(v.shape)}")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {k.shape[1]} KV heads")
    if causal and Nq > k.shape[2]:
        raise ValueError(f"q: causal attention here needs Nq <= Nk (got Nq = {Nq}, Nk = {k.shape[2]})")


def _strides(*ts):
    """Batch, head and row strides of each tensor, in order (the last dimension is contiguous)."""
    return [s for t in ts for s in (t.stride(0), t.stride(1), t.stride(2))]


@triton.jit
def dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
                stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                n_q, n_k, sm_scale,
                H_Q: tl.constexpr, H_KV: tl.constexpr, GROUP: tl.constexpr, CAUSAL: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Given: the keys this program owns, their K and V tiles, and the accumulators.
    tile_n = tl.program_id(0)
    batch = tl.program_id(1) // H_KV
    kv_head = tl.program_id(1) % H_KV
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < n_k
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=keys, other=0.0)
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=keys, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # Exercise 2: loop over the GROUP query heads of this KV head and over their query tiles.
    for g in range(GROUP):
        head = kv_head * GROUP + g
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DO + batch * stride_dob + head * stride_doh
        row_base = (batch * H_Q + head) * n_q
        for start_m in range(0, n_q, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(q_base + rows[:, None] * stride_qn + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_don + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            lse = tl.load(LSE + row_base + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(DELTA + row_base + rows, mask=rows < n_q, other=0.0)
            s = tl.dot(q, tl.trans(k)) * sm_scale
            p = tl.exp(s - lse[:, None])
            if CAUSAL:
                p = tl.where(offs_n[None, :] <= rows[:, None] + n_k - n_q, p, 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def flash_dkdv(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dK, dV [B, Hkv, Nk, D]: Δ by your row_term, then one program per (key tile, batch·KV head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


@triton.jit
def dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              n_q, n_k, sm_scale,
              H_Q: tl.constexpr, H_KV: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Given: the rows this program owns, their q and dO tiles, LSE and Δ.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < n_q
    q = tl.load(Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=rows, other=0.0)
    lse = tl.load(LSE + (batch * H_Q + head) * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    delta = tl.load(DELTA + (batch * H_Q + head) * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Exercise 3: the KV head this head reads, the loop over its key tiles (causal: where it ends), dq.
    kv_head = head // (H_Q // H_KV)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        p = tl.exp(s - lse[:, None])
        if CAUSAL:
            p = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def flash_dq(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


def predict():
    """(tl.dot calls of flash_dkdv + flash_dq, backward / forward FLOP ratio) for Nq = Nk = 64, D = 16."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs      # dK/dV kernel: S, dV, dP, dK; dQ kernel: S, dP, dQ
    return dots, dots / (2 * tile_pairs)



# ---------------------------------------------------------------- rt6_product_fp16

@triton.jit
def row_term_kernel__rt6_product_fp16(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
                    stride_ob, stride_oh, stride_on,            # element strides (the last dimension is contiguous)
                    stride_dob, stride_doh, stride_don,
                    n_q, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # Given: the rows this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H
    head = tl.program_id(1) % H
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    # Exercise 1: load the O and dO tiles, Δ = rowsum(dO ∘ O) in float32, store it.
    rows = offs_m[:, None] < n_q
    o = tl.load(O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=rows, other=0.0)
    delta = tl.sum((o * do).to(tl.float32), axis=1)
    tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def rt6_product_fp16(o, do, block_m=16):
    """Exercise 1. dO ∘ O multiplied in fp16 and only the sum in fp32 ('the products fit in fp16'): the lab says multiply in float32; each product loses fp16's rounding."""
    """Launch row_term_kernel: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt6_product_fp16[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# ---------------------------------------------------------------- dk6_lse_at_kv_head

@triton.jit
def dkdv_kernel__dk6_lse_at_kv_head(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
                stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                n_q, n_k, sm_scale,
                H_Q: tl.constexpr, H_KV: tl.constexpr, GROUP: tl.constexpr, CAUSAL: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Given: the keys this program owns, their K and V tiles, and the accumulators.
    tile_n = tl.program_id(0)
    batch = tl.program_id(1) // H_KV
    kv_head = tl.program_id(1) % H_KV
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < n_k
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=keys, other=0.0)
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=keys, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # Exercise 2: loop over the GROUP query heads of this KV head and over their query tiles.
    for g in range(GROUP):
        head = kv_head * GROUP + g
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DO + batch * stride_dob + head * stride_doh
        row_base = (batch * H_Q + kv_head) * n_q
        for start_m in range(0, n_q, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(q_base + rows[:, None] * stride_qn + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_don + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            lse = tl.load(LSE + row_base + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(DELTA + row_base + rows, mask=rows < n_q, other=0.0)
            s = tl.dot(q, tl.trans(k)) * sm_scale
            p = tl.exp(s - lse[:, None])
            if CAUSAL:
                p = tl.where(offs_n[None, :] <= rows[:, None] + n_k - n_q, p, 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk6_lse_at_kv_head(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. LSE and Δ read at row_base = (batch · H_Q + kv_head) · Nq ('this program's head is the KV head'): right without GQA; with it every query head of the group uses another head's LSE and Δ."""
    """dK, dV [B, Hkv, Nk, D]: Δ by your row_term, then one program per (key tile, batch·KV head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk6_lse_at_kv_head[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dk6_dv_before_mask

@triton.jit
def dkdv_kernel__dk6_dv_before_mask(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
                stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                n_q, n_k, sm_scale,
                H_Q: tl.constexpr, H_KV: tl.constexpr, GROUP: tl.constexpr, CAUSAL: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Given: the keys this program owns, their K and V tiles, and the accumulators.
    tile_n = tl.program_id(0)
    batch = tl.program_id(1) // H_KV
    kv_head = tl.program_id(1) % H_KV
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < n_k
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=keys, other=0.0)
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=keys, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # Exercise 2: loop over the GROUP query heads of this KV head and over their query tiles.
    for g in range(GROUP):
        head = kv_head * GROUP + g
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DO + batch * stride_dob + head * stride_doh
        row_base = (batch * H_Q + head) * n_q
        for start_m in range(0, n_q, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(q_base + rows[:, None] * stride_qn + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_don + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            lse = tl.load(LSE + row_base + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(DELTA + row_base + rows, mask=rows < n_q, other=0.0)
            s = tl.dot(q, tl.trans(k)) * sm_scale
            p = tl.exp(s - lse[:, None])
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            if CAUSAL:
                p = tl.where(offs_n[None, :] <= rows[:, None] + n_k - n_q, p, 0.0)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk6_dv_before_mask(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. dV += Pᵀ dO placed before the causal mask ('dV needs P first'): dV sums hidden keys' probabilities; dK is right."""
    """dK, dV [B, Hkv, Nk, D]: Δ by your row_term, then one program per (key tile, batch·KV head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk6_dv_before_mask[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dk6_lse_layout_assumed

def dk6_lse_layout_assumed(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. The launch passes lse as it comes, without .contiguous() ('it is already [B, Hq, Nq]'): the kernel indexes it as contiguous, so a transposed or strided lse is read at the wrong rows."""
    """dK, dV [B, Hkv, Nk, D]: Δ by your row_term, then one program per (key tile, batch·KV head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dq6_last_row_by_block_n

@triton.jit
def dq_kernel__dq6_last_row_by_block_n(Q, K, V, DO, LSE, DELTA, DQ,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              n_q, n_k, sm_scale,
              H_Q: tl.constexpr, H_KV: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Given: the rows this program owns, their q and dO tiles, LSE and Δ.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < n_q
    q = tl.load(Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=rows, other=0.0)
    lse = tl.load(LSE + (batch * H_Q + head) * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    delta = tl.load(DELTA + (batch * H_Q + head) * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Exercise 3: the KV head this head reads, the loop over its key tiles (causal: where it ends), dq.
    kv_head = head // (H_Q // H_KV)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_N, n_q) - 1
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        p = tl.exp(s - lse[:, None])
        if CAUSAL:
            p = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq6_last_row_by_block_n(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. The causal loop's end from (tile_m + 1) · BLOCK_N ('the block size'): right while BLOCK_M = BLOCK_N; with BLOCK_M > BLOCK_N the tile's later rows lose their last keys."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq6_last_row_by_block_n[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# ---------------------------------------------------------------- dq6_returns_fp32

def dq6_returns_fp32(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. dQ allocated in fp32 ('gradients accumulate in fp32'): the lab expects each gradient in its input's dtype, fp16."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# ---------------------------------------------------------------- dq6_delta_cached_by_shape

_DELTA_BY_SHAPE = {}


def dq6_delta_cached_by_shape(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Δ kept across calls by o's shape ('Δ is the same for every backward of this size'): the second call with new o, dO of the same shape uses the first call's Δ."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    if o.shape not in _DELTA_BY_SHAPE:
        _DELTA_BY_SHAPE[o.shape] = row_term(o, do)
    delta = _DELTA_BY_SHAPE[o.shape]
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# ---------------------------------------------------------------- prediction

def pr6_counts_forward_too():
    """Exercise 4. The forward's 2 products per tile pair added to the count ('the backward reruns the
    forward'): 144 dots and ratio 4.5, where the lab asks for the two backward kernels' dots alone."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs + 2 * tile_pairs
    return dots, dots / (2 * tile_pairs)


def pr6_ratio_floor_divided():
    """Exercise 4. The ratio computed with // ('counts are integers'): 3 where 3.5 is asked, outside the ± 0.05."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs
    return dots, dots // (2 * tile_pairs)

# ---------------------------------------------------------------- correct alternatives

# ---------------------------------------------------------------- rt6_no_other

@triton.jit
def row_term_kernel__rt6_no_other(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
                    stride_ob, stride_oh, stride_on,            # element strides (the last dimension is contiguous)
                    stride_dob, stride_doh, stride_don,
                    n_q, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    # Given: the rows this program owns.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H
    head = tl.program_id(1) % H
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    # Exercise 1: load the O and dO tiles, Δ = rowsum(dO ∘ O) in float32, store it.
    rows = offs_m[:, None] < n_q
    o = tl.load(O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=rows)
    do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=rows)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def rt6_no_other(o, do, block_m=16):
    """Exercise 1, correct: the loads masked on the rows without other= (padding rows may read anything, but each row's sum is its own and padding rows are never stored)."""
    """Launch row_term_kernel: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt6_no_other[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# ---------------------------------------------------------------- dk6_delta_args_swapped

def dk6_delta_args_swapped(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2, correct: Δ computed as row_term(do, o), the arguments swapped (rowsum(O ∘ dO) = rowsum(dO ∘ O))."""
    """dK, dV [B, Hkv, Nk, D]: Δ by your row_term, then one program per (key tile, batch·KV head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(do, o)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dk6_lse_other_inf

@triton.jit
def dkdv_kernel__dk6_lse_other_inf(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
                stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                n_q, n_k, sm_scale,
                H_Q: tl.constexpr, H_KV: tl.constexpr, GROUP: tl.constexpr, CAUSAL: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Given: the keys this program owns, their K and V tiles, and the accumulators.
    tile_n = tl.program_id(0)
    batch = tl.program_id(1) // H_KV
    kv_head = tl.program_id(1) % H_KV
    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n[:, None] < n_k
    k = tl.load(K + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=keys, other=0.0)
    v = tl.load(V + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=keys, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    # Exercise 2: loop over the GROUP query heads of this KV head and over their query tiles.
    for g in range(GROUP):
        head = kv_head * GROUP + g
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DO + batch * stride_dob + head * stride_doh
        row_base = (batch * H_Q + head) * n_q
        for start_m in range(0, n_q, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(q_base + rows[:, None] * stride_qn + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_don + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            lse = tl.load(LSE + row_base + rows, mask=rows < n_q, other=float("inf"))
            delta = tl.load(DELTA + row_base + rows, mask=rows < n_q, other=0.0)
            s = tl.dot(q, tl.trans(k)) * sm_scale
            p = tl.exp(s - lse[:, None])
            if CAUSAL:
                p = tl.where(offs_n[None, :] <= rows[:, None] + n_k - n_q, p, 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk6_lse_other_inf(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2, correct: padding rows load LSE = +inf, so their P is exactly 0 (instead of relying on their zero q and dO)."""
    """dK, dV [B, Hkv, Nk, D]: Δ by your row_term, then one program per (key tile, batch·KV head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk6_lse_other_inf[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dq6_exp2_exact

@triton.jit
def dq_kernel__dq6_exp2_exact(Q, K, V, DO, LSE, DELTA, DQ,
              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
              stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
              n_q, n_k, sm_scale,
              H_Q: tl.constexpr, H_KV: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Given: the rows this program owns, their q and dO tiles, LSE and Δ.
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < n_q
    q = tl.load(Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=rows, other=0.0)
    do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                 mask=rows, other=0.0)
    lse = tl.load(LSE + (batch * H_Q + head) * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    delta = tl.load(DELTA + (batch * H_Q + head) * n_q + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # Exercise 3: the KV head this head reads, the loop over its key tiles (causal: where it ends), dq.
    kv_head = head // (H_Q // H_KV)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        p = tl.exp2((s - lse[:, None]) * 1.4426950408889634)
        if CAUSAL:
            p = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq6_exp2_exact(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3, correct: P = exp2((s − LSE) · log2 e) with log2 e to all its digits."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq6_exp2_exact[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


WRONG = {
    "row_term": [rt6_product_fp16],
    "dkdv": [dk6_lse_at_kv_head, dk6_dv_before_mask, dk6_lse_layout_assumed],
    "dq": [dq6_last_row_by_block_n, dq6_returns_fp32, dq6_delta_cached_by_shape],
    "prediction": [pr6_counts_forward_too, pr6_ratio_floor_divided],
}
SOLUTION = {"row_term": row_term, "dkdv": flash_dkdv, "dq": flash_dq, "prediction": predict}
CORRECT = {"row_term": [row_term, rt6_no_other], "dkdv": [flash_dkdv, dk6_delta_args_swapped, dk6_lse_other_inf],
           "dq": [flash_dq, dq6_exp2_exact]}


def _t(shape, seed, perm, scale=1.0):
    """An fp16 tensor whose memory holds the axes in the order `perm` (last axis kept contiguous)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*[shape[i] for i in perm], generator=g) * scale).half()
    return x.permute(*[perm.index(i) for i in range(len(shape))])


def _inputs(B, Hq, Hkv, Nq, Nk, D, causal, seed=0, scale=1.0):
    q = _t((B, Hq, Nq, D), seed, (2, 0, 1, 3), scale)
    k = _t((B, Hkv, Nk, D), seed + 1, (0, 2, 1, 3), scale)
    v = _t((B, Hkv, Nk, D), seed + 2, (1, 0, 2, 3))
    do = _t((B, Hq, Nq, D), seed + 3, (1, 2, 0, 3), scale)
    g = Hq // Hkv
    kf = k.double().repeat_interleave(g, dim=1)
    vf = v.double().repeat_interleave(g, dim=1)
    s = q.double() @ kf.transpose(-1, -2) / math.sqrt(D)
    if causal:
        i = torch.arange(Nq)[:, None]
        j = torch.arange(Nk)[None, :]
        s = s.masked_fill(j > i + Nk - Nq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = (torch.softmax(s, dim=-1) @ vf).half()
    return q, k, v, o, lse.float(), do


def _bwd(f, *shape, **kw):
    return f(*_inputs(*shape), **kw)


def _row_term(f):
    q, k, v, o, lse, do = _inputs(1, 2, 1, 37, 21, 16, False, scale=3.0)
    return f(o, do)


def _lse_transposed(f):
    q, k, v, o, lse, do = _inputs(1, 3, 1, 19, 21, 16, False)
    lse_t = lse.transpose(1, 2).contiguous().transpose(1, 2)      # [B, Hq, Nq] stored as [B, Nq, Hq]
    return f(q, k, v, o, lse_t, do)


def _twice(f):
    f(*_inputs(1, 2, 2, 19, 21, 16, False, seed=0))
    return f(*_inputs(1, 2, 2, 19, 21, 16, False, seed=10))


WITNESS = {
    "rt6_product_fp16": _row_term,
    "dk6_lse_at_kv_head": lambda f: _bwd(f, 1, 4, 2, 19, 21, 16, False),
    "dk6_dv_before_mask": lambda f: _bwd(f, 1, 1, 1, 18, 35, 16, True, causal=True),
    "dk6_lse_layout_assumed": _lse_transposed,
    "dq6_last_row_by_block_n": lambda f: _bwd(f, 1, 1, 1, 40, 40, 16, True, causal=True, block_m=32, block_n=16),
    "dq6_returns_fp32": lambda f: str(_bwd(f, 1, 1, 1, 19, 21, 16, False).dtype),
    "dq6_delta_cached_by_shape": _twice,
    "pr6_counts_forward_too": lambda f: f(),
    "pr6_ratio_floor_divided": lambda f: f(),
}
