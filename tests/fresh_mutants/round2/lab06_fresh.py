# ruff: noqa: E501, B007, F841
"""Round 2 of fresh wrong answers for lab 06 (FlashAttention backward in Triton), written from the lab's
text and its solution only. Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / WITNESS as in lab01_fresh.py."""
import math

import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


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


# row_term: rt_fp16_products
@triton.jit
def row_term_kernel__rt_fp16_products(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
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
    delta = tl.sum(o * do, axis=1).to(tl.float32)
    tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def rt_fp16_products(o, do, block_m=16):
    """Multiplied in fp16 (no .to(tl.float32))."""
    """Launch row_term_kernel__rt_fp16_products: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt_fp16_products[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# row_term: rt_do_through_o_strides
@triton.jit
def row_term_kernel__rt_do_through_o_strides(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
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
    do = tl.load(DO + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                 mask=rows, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def rt_do_through_o_strides(o, do, block_m=16):
    """dO read through O's strides."""
    """Launch row_term_kernel__rt_do_through_o_strides: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt_do_through_o_strides[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# row_term: rt_mean
@triton.jit
def row_term_kernel__rt_mean(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
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
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1) / HEAD_DIM
    tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def rt_mean(o, do, block_m=16):
    """Mean over d instead of the sum."""
    """Launch row_term_kernel__rt_mean: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt_mean[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# row_term: rt_head_major_index
@triton.jit
def row_term_kernel__rt_head_major_index(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
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
    tl.store(DELTA + (head * (tl.num_programs(1) // H) + batch) * n_q + offs_m, delta, mask=offs_m < n_q)


def rt_head_major_index(o, do, block_m=16):
    """Δ stored at (head · B + batch) · Nq + i."""
    """Launch row_term_kernel__rt_head_major_index: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt_head_major_index[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# row_term: rt_sum_squares
@triton.jit
def row_term_kernel__rt_sum_squares(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
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
    delta = tl.sum(do.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def rt_sum_squares(o, do, block_m=16):
    """rowsum(dO ∘ dO) (loaded dO twice)."""
    """Launch row_term_kernel__rt_sum_squares: o, do [B, H, Nq, D] → Δ [B, H, Nq] fp32."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt_sum_squares[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# dkdv: dk_no_final_scale
@triton.jit
def dkdv_kernel__dk_no_final_scale(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_no_final_scale(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dK not scaled by sm_scale at the end."""
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
    dkdv_kernel__dk_no_final_scale[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_scaled_twice
@triton.jit
def dkdv_kernel__dk_scaled_twice(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            ds = p * (dp - delta[:, None]) * sm_scale
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_scaled_twice(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """ds scaled and dK scaled again."""
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
    dkdv_kernel__dk_scaled_twice[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_strided_group
@triton.jit
def dkdv_kernel__dk_strided_group(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
        head = g * H_KV + kv_head
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


def dk_strided_group(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Query heads of the group taken as g · Hkv + kv_head."""
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
    dkdv_kernel__dk_strided_group[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_mask_not_aligned
@triton.jit
def dkdv_kernel__dk_mask_not_aligned(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
                p = tl.where(offs_n[None, :] <= rows[:, None], p, 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_mask_not_aligned(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Causal mask j <= i."""
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
    dkdv_kernel__dk_mask_not_aligned[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_lse_of_kv_head
@triton.jit
def dkdv_kernel__dk_lse_of_kv_head(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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


def dk_lse_of_kv_head(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """LSE and Δ read at the KV head's rows."""
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
    dkdv_kernel__dk_lse_of_kv_head[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_no_delta
@triton.jit
def dkdv_kernel__dk_no_delta(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            ds = p * dp
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_no_delta(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dS = P ∘ dP (Δ forgotten)."""
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
    dkdv_kernel__dk_no_delta[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_do_through_q_strides
@triton.jit
def dkdv_kernel__dk_do_through_q_strides(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            do = tl.load(do_base + rows[:, None] * stride_qn + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
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


def dk_do_through_q_strides(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dO read through Q's strides."""
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
    dkdv_kernel__dk_do_through_q_strides[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_first_head_only
@triton.jit
def dkdv_kernel__dk_first_head_only(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
    for g in range(1):
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


def dk_first_head_only(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Loop over range(1): only the first head of the group."""
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
    dkdv_kernel__dk_first_head_only[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_q_rows_unmasked
@triton.jit
def dkdv_kernel__dk_q_rows_unmasked(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            q = tl.load(q_base + rows[:, None] * stride_qn + offs_d[None, :])
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


def dk_q_rows_unmasked(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """q loaded without its row mask."""
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
    dkdv_kernel__dk_q_rows_unmasked[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_dv_transposed
@triton.jit
def dkdv_kernel__dk_dv_transposed(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            dv += tl.dot(tl.trans(do), p.to(do.dtype))
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_dv_transposed(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dV += dOᵀ P (the transpose)."""
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
    dkdv_kernel__dk_dv_transposed[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_p_before_scale
@triton.jit
def dkdv_kernel__dk_p_before_scale(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            s = tl.dot(q, tl.trans(k))
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


def dk_p_before_scale(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """P = exp(q kᵀ − LSE) without the scale."""
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
    dkdv_kernel__dk_p_before_scale[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_dk_from_dp
@triton.jit
def dkdv_kernel__dk_dk_from_dp(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            dk += tl.dot(tl.trans(dp.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_dk_from_dp(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dK += dPᵀ Q (used dP instead of dS)."""
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
    dkdv_kernel__dk_dk_from_dp[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dq: dq_hi_not_aligned
@triton.jit
def dq_kernel__dq_hi_not_aligned(Q, K, V, DO, LSE, DELTA, DQ,
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
        hi = tl.minimum(last_row + 1, n_k)
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


def dq_hi_not_aligned(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Causal loop end last_row + 1 (without Nk − Nq)."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_hi_not_aligned[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_no_final_scale
@triton.jit
def dq_kernel__dq_no_final_scale(Q, K, V, DO, LSE, DELTA, DQ,
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
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_no_final_scale(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dQ not scaled at the end."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_no_final_scale[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_kv_head_mod
@triton.jit
def dq_kernel__dq_kv_head_mod(Q, K, V, DO, LSE, DELTA, DQ,
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
    kv_head = head % H_KV
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


def dq_kv_head_mod(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """KV head h % Hkv."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_kv_head_mod[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_dot_with_v
@triton.jit
def dq_kernel__dq_dot_with_v(Q, K, V, DO, LSE, DELTA, DQ,
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
        dq += tl.dot(ds.to(v.dtype), v)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_dot_with_v(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dQ += dS V."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_dot_with_v[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_mask_hides_diagonal
@triton.jit
def dq_kernel__dq_mask_hides_diagonal(Q, K, V, DO, LSE, DELTA, DQ,
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
            p = tl.where(cols[None, :] < offs_m[:, None] + n_k - n_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_mask_hides_diagonal(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Causal mask j < i + Nk − Nq."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_mask_hides_diagonal[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_delta_sign
@triton.jit
def dq_kernel__dq_delta_sign(Q, K, V, DO, LSE, DELTA, DQ,
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
        ds = p * (dp + delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_delta_sign(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dS = P ∘ (dP + Δ)."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_delta_sign[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_exp2_of_lse
@triton.jit
def dq_kernel__dq_exp2_of_lse(Q, K, V, DO, LSE, DELTA, DQ,
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
        p = tl.exp2(s - lse[:, None])
        if CAUSAL:
            p = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_exp2_of_lse(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """exp2 on a natural-log LSE."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_exp2_of_lse[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_loop_bound_without_mask
@triton.jit
def dq_kernel__dq_loop_bound_without_mask(Q, K, V, DO, LSE, DELTA, DQ,
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
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_loop_bound_without_mask(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Causal loop bound right, but no mask inside the last tile."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_loop_bound_without_mask[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_k_through_v_strides
@triton.jit
def dq_kernel__dq_k_through_v_strides(Q, K, V, DO, LSE, DELTA, DQ,
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
        k = tl.load(k_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
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


def dq_k_through_v_strides(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """k read through v's strides."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_k_through_v_strides[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# dq: dq_hi_no_plus_one
@triton.jit
def dq_kernel__dq_hi_no_plus_one(Q, K, V, DO, LSE, DELTA, DQ,
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
        hi = tl.minimum(last_row + n_k - n_q, n_k)
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


def dq_hi_no_plus_one(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Causal loop end without + 1."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_hi_no_plus_one[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# prediction: pr_lesson_five
def pr_lesson_five():
    """The lesson's 5 products per tile pair."""
    """(tl.dot calls of flash_dkdv + flash_dq, backward / forward FLOP ratio) for Nq = Nk = 64, D = 16."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 5 * tile_pairs      # dK/dV kernel: S, dV, dP, dK; dQ kernel: S, dP, dQ
    return dots, dots / (2 * tile_pairs)


# prediction: pr_three_and_three
def pr_three_and_three():
    """3 products in each kernel."""
    """(tl.dot calls of flash_dkdv + flash_dq, backward / forward FLOP ratio) for Nq = Nk = 64, D = 16."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 3 * tile_pairs + 3 * tile_pairs      # dK/dV kernel: S, dV, dP, dK; dQ kernel: S, dP, dQ
    return dots, dots / (2 * tile_pairs)


# prediction: pr_ratio_one_forward_dot
def pr_ratio_one_forward_dot():
    """Forward counted as 1 product per tile pair."""
    """(tl.dot calls of flash_dkdv + flash_dq, backward / forward FLOP ratio) for Nq = Nk = 64, D = 16."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs      # dK/dV kernel: S, dV, dP, dK; dQ kernel: S, dP, dQ
    return dots, dots / tile_pairs


# prediction: pr_per_tile_pair
def pr_per_tile_pair():
    """Counted per tile pair, not in total."""
    """(tl.dot calls of flash_dkdv + flash_dq, backward / forward FLOP ratio) for Nq = Nk = 64, D = 16."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs      # dK/dV kernel: S, dV, dP, dK; dQ kernel: S, dP, dQ
    return dots // tile_pairs, dots / (2 * tile_pairs)


# prediction: pr_four_and_four
def pr_four_and_four():
    """4 products in the dQ kernel too."""
    """(tl.dot calls of flash_dkdv + flash_dq, backward / forward FLOP ratio) for Nq = Nk = 64, D = 16."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 4 * tile_pairs      # dK/dV kernel: S, dV, dP, dK; dQ kernel: S, dP, dQ
    return dots, dots / (2 * tile_pairs)


# prediction: pr_tiles_of_d
def pr_tiles_of_d():
    """Tile pairs counted as (64 // 16) · (16 // 16)."""
    """(tl.dot calls of flash_dkdv + flash_dq, backward / forward FLOP ratio) for Nq = Nk = 64, D = 16."""
    tile_pairs = (64 // 16) * (16 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs      # dK/dV kernel: S, dV, dP, dK; dQ kernel: S, dP, dQ
    return dots, dots / (2 * tile_pairs)


# dkdv: dk_skip_from_key_tile
@triton.jit
def dkdv_kernel__dk_skip_from_key_tile(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
        for start_m in range((tile_n * BLOCK_N) // BLOCK_M * BLOCK_M if CAUSAL else 0, n_q, BLOCK_M):
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


def dk_skip_from_key_tile(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Causal: query tiles from the key tile's start (ignores the Nk − Nq shift)."""
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
    dkdv_kernel__dk_skip_from_key_tile[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_dv_fp16_acc
@triton.jit
def dkdv_kernel__dk_dv_fp16_acc(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float16)
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
            dv = (dv + tl.dot(tl.trans(p.to(do.dtype)), do)).to(tl.float16)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    dk = dk * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def dk_dv_fp16_acc(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dV accumulated in fp16."""
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
    dkdv_kernel__dk_dv_fp16_acc[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dkdv: dk_lse_other_neg_inf
@triton.jit
def dkdv_kernel__dk_lse_other_neg_inf(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
            lse = tl.load(LSE + row_base + rows, mask=rows < n_q, other=float("-inf"))
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


def dk_lse_other_neg_inf(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Padding rows' LSE read as −inf."""
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
    dkdv_kernel__dk_lse_other_neg_inf[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# dq: dq_fp16_acc
@triton.jit
def dq_kernel__dq_fp16_acc(Q, K, V, DO, LSE, DELTA, DQ,
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
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float16)
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
        dq = (dq + tl.dot(ds.to(k.dtype), k)).to(tl.float16)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_fp16_acc(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """dQ accumulated in fp16."""
    """dQ [B, Hq, Nq, D]: Δ by your row_term, then one program per (query tile, batch·head)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_fp16_acc[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


WRONG = {
    "row_term": [rt_fp16_products, rt_do_through_o_strides, rt_mean, rt_head_major_index, rt_sum_squares],
    "dkdv": [dk_no_final_scale, dk_scaled_twice, dk_strided_group, dk_mask_not_aligned, dk_lse_of_kv_head, dk_no_delta, dk_do_through_q_strides, dk_first_head_only, dk_q_rows_unmasked, dk_dv_transposed, dk_p_before_scale, dk_dk_from_dp, dk_skip_from_key_tile, dk_dv_fp16_acc, dk_lse_other_neg_inf],
    "dq": [dq_hi_not_aligned, dq_no_final_scale, dq_kv_head_mod, dq_dot_with_v, dq_mask_hides_diagonal, dq_delta_sign, dq_exp2_of_lse, dq_loop_bound_without_mask, dq_k_through_v_strides, dq_hi_no_plus_one, dq_fp16_acc],
    "prediction": [pr_lesson_five, pr_three_and_three, pr_ratio_one_forward_dot, pr_per_tile_pair, pr_four_and_four, pr_tiles_of_d],
}
SOLUTION = {"row_term": row_term, "dkdv": flash_dkdv, "dq": flash_dq, "prediction": predict}
CORRECT = {k: [v] for k, v in SOLUTION.items()}


def _t(shape, seed, perm, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    stored = [shape[i] for i in perm]
    x = (torch.randn(*stored, generator=g) * scale).half()
    return x.permute(*[perm.index(i) for i in range(4)])


def _inputs(B, Hq, Hkv, Nq, Nk, D, causal, seed=0, q_in_nan=False):
    q = _t((B, Hq, Nq, D), seed, (2, 0, 1, 3))
    k = _t((B, Hkv, Nk, D), seed + 1, (0, 2, 1, 3))
    v = _t((B, Hkv, Nk, D), seed + 2, (1, 0, 2, 3))
    do = _t((B, Hq, Nq, D), seed + 3, (0, 2, 1, 3))
    if q_in_nan:
        buf = torch.full((B, Hq, Nq + 16, D), float("nan")).half()
        buf[:, :, :Nq] = q
        q = buf[:, :, :Nq]
    g = Hq // Hkv
    qd, kd, vd = q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = qd @ kd.transpose(-1, -2) / math.sqrt(D)
    if causal:
        i = torch.arange(Nq)[:, None]
        j = torch.arange(Nk)[None, :]
        s = s.masked_fill(j > i + Nk - Nq, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = (torch.softmax(s, -1) @ vd).half()
    return q, k, v, o, lse.float(), do, causal


def _bwd(f, *shape, **kw):
    q, k, v, o, lse, do, causal = _inputs(*shape, **kw)
    return f(q, k, v, o, lse, do, causal)


def _row_term(f, B=2, H=3, Nq=19, D=16):
    o = _t((B, H, Nq, D), 7, (2, 0, 1, 3))
    do = _t((B, H, Nq, D), 8, (0, 2, 1, 3))
    return f(o, do)


WITNESS = {
    **{n.__name__: _row_term for n in WRONG["row_term"]},
    **{n.__name__: (lambda f: _bwd(f, 2, 4, 2, 21, 37, 16, True)) for n in WRONG["dkdv"]},
    "dk_q_rows_unmasked": lambda f: _bwd(f, 1, 1, 1, 21, 37, 16, False, q_in_nan=True),
    **{n.__name__: (lambda f: _bwd(f, 2, 4, 2, 21, 37, 16, True)) for n in WRONG["dq"]},
    "dq_kv_head_mod": lambda f: _bwd(f, 1, 6, 3, 21, 37, 16, False),
    "dq_hi_no_plus_one": lambda f: _bwd(f, 1, 1, 1, 33, 33, 16, True),
    **{n.__name__: (lambda f: f()) for n in WRONG["prediction"]},
}
