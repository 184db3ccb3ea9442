# ruff: noqa: E501, B007, F841
"""Round 4 of fresh wrong answers for lab 06 (FlashAttention backward in Triton), written from the lab's text and
its solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: a scale applied to the gradient that does not carry it, a loop over the wrong count of heads,
tile-relative indices where absolute ones belong, one normaliser per tile, and a count that includes work
that is not a product."""
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


# ---------------------------------------------------------------- dk_dv_scaled

@triton.jit
def dkdv_kernel__dk_dv_scaled(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
    dv = dv * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_dv_scaled(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Scales dv by sm_scale at the end too ('scale the gradients once at the end'): only dK carries
    the scale of S = q kᵀ · scale; dV = Pᵀ dO does not."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk_dv_scaled[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dk_loop_over_hkv

@triton.jit
def dkdv_kernel__dk_loop_over_hkv(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
    for g in range(H_KV):
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


def dk_loop_over_hkv(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. for g in range(H_KV) ('one pass per KV head'): walks Hkv query heads of the group instead of
    GROUP = Hq // Hkv; right only when the two are equal."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk_loop_over_hkv[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dk_mask_tile_relative_rows

@triton.jit
def dkdv_kernel__dk_mask_tile_relative_rows(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
                p = tl.where(offs_n[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_mask_tile_relative_rows(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Causal mask written with offs_m (the offsets 0 … BLOCK_M − 1 inside a tile) instead of rows =
    start_m + offs_m: right in the first query tile only."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk_mask_tile_relative_rows[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dq_lse_first_row

@triton.jit
def dq_kernel__dq_lse_first_row(Q, K, V, DO, LSE, DELTA, DQ,
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
        p = tl.exp(s - tl.sum(tl.where(offs_m == tile_m * BLOCK_M, lse, 0.0), axis=0))
        if CAUSAL:
            p = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_lse_first_row(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. P rebuilt with the tile's first LSE, lse[0] broadcast ('one normaliser per tile', as one
    maximum per tile): each row of P is divided by another row's sum."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_lse_first_row[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# ---------------------------------------------------------------- dq_hi_unclamped

@triton.jit
def dq_kernel__dq_hi_unclamped(Q, K, V, DO, LSE, DELTA, DQ,
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
        hi = last_row + n_k - n_q + 1
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


def dq_hi_unclamped(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3, correct: the causal loop end without tl.minimum(…, n_k): the last real row is at most Nq − 1,
    so last_row + Nk − Nq + 1 never exceeds Nk."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_hi_unclamped[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# ---------------------------------------------------------------- pr_counts_row_term

def pr_counts_row_term():
    """Exercise 4. Counts the row term Δ = rowsum(dO ∘ O) as one product per query tile (4 more 'dots'): 116
    calls and ratio 116 / 32."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs + 64 // 16
    return dots, dots / (2 * tile_pairs)


WRONG = {
    "dkdv": [dk_dv_scaled, dk_loop_over_hkv, dk_mask_tile_relative_rows],
    "dq": [dq_lse_first_row],
    "prediction": [pr_counts_row_term],
}
SOLUTION = {"row_term": row_term, "dkdv": flash_dkdv, "dq": flash_dq, "prediction": predict}
CORRECT = {"dq": [flash_dq, dq_hi_unclamped]}


def _t(shape, seed, perm, scale=1.0):
    """An fp16 tensor whose memory holds the axes in the order `perm` (last axis kept contiguous)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*[shape[i] for i in perm], generator=g) * scale).half()
    return x.permute(*[perm.index(i) for i in range(len(shape))])


def _inputs(B, Hq, Hkv, Nq, Nk, D, causal, seed=0):
    q = _t((B, Hq, Nq, D), seed, (2, 0, 1, 3))
    k = _t((B, Hkv, Nk, D), seed + 1, (0, 2, 1, 3))
    v = _t((B, Hkv, Nk, D), seed + 2, (1, 0, 2, 3))
    do = _t((B, Hq, Nq, D), seed + 3, (1, 2, 0, 3))
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


WITNESS = {
    "dk_dv_scaled": lambda f: _bwd(f, 1, 2, 1, 19, 21, 16, False),
    "dk_loop_over_hkv": lambda f: _bwd(f, 1, 6, 2, 19, 21, 16, False),
    "dk_mask_tile_relative_rows": lambda f: _bwd(f, 1, 1, 1, 19, 40, 16, True, causal=True),
    "dq_lse_first_row": lambda f: _bwd(f, 1, 1, 1, 19, 21, 16, False),
    "pr_counts_row_term": lambda f: f(),
}
