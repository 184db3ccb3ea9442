# ruff: noqa: E501, B007, F841
"""Round 5 of fresh wrong answers for lab 06 (FlashAttention backward in Triton), written from the lab's text and
its solution only (the checks unread). Each wrong answer is the solution's kernel and launch function with one
student's edit (its docstring says which). WRONG / CORRECT / SOLUTION / WITNESS as in lab01_fresh.py. New
classes here: a store at tile-relative rows, GQA accumulators reset for every head of the group, a causal
skip of query tiles rounded the wrong way, a key loop that starts at the diagonal, a count returned as a
float and a ratio in percent. The correct answers skip query tiles rounded down and put the causal mask on
dS instead of P."""
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


# ---------------------------------------------------------------- rt_store_tile_rows

@triton.jit
def row_term_kernel__rt_store_tile_rows(O, DO, DELTA,                            # o, do [B, H, Nq, D]; delta [B, H, Nq] fp32
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
    tl.store(DELTA + (batch * H + head) * n_q + tl.arange(0, BLOCK_M), delta, mask=offs_m < n_q)


def rt_store_tile_rows(o, do, block_m=16):
    """Exercise 1. Stores Δ at the tile's own row numbers, tl.arange(0, BLOCK_M) ('the rows of this tile'),
    instead of offs_m: every query tile writes rows 0 … BLOCK_M − 1, and the rows past the first tile are never
    written."""
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    row_term_kernel__rt_store_tile_rows[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                          do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m)
    return delta


# ---------------------------------------------------------------- dk_acc_reset_per_head

@triton.jit
def dkdv_kernel__dk_acc_reset_per_head(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
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


def dk_acc_reset_per_head(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Starts dk and dv from zero at the top of the loop over the group's heads ('each head starts
    fresh'): only the last query head of the group is in the stored dK and dV, where the lab asks for their
    sum."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk_acc_reset_per_head[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dk_skip_rounded_up

@triton.jit
def dkdv_kernel__dk_skip_rounded_up(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
        lo = 0
        if CAUSAL:
            first = tl.maximum(tile_n * BLOCK_N + n_q - n_k, 0)   # first row that sees this tile's first key
            lo = (first + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        for start_m in range(lo, n_q, BLOCK_M):
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


def dk_skip_rounded_up(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Causal: skips the query tiles that see none of this program's keys, starting at the first row
    that sees the tile's first key rounded UP to a tile ('whole tiles only'): when that row is not a multiple of
    BLOCK_M, the rows from it to the next multiple are skipped although they see this tile's keys."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk_skip_rounded_up[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dq_loop_starts_at_diagonal

@triton.jit
def dq_kernel__dq_loop_starts_at_diagonal(Q, K, V, DO, LSE, DELTA, DQ,
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
    lo = 0
    hi = n_k
    if CAUSAL:
        lo = tile_m * BLOCK_M
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1
        hi = tl.minimum(last_row + n_k - n_q + 1, n_k)
    for start_n in range(lo, hi, BLOCK_N):
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


def dq_loop_starts_at_diagonal(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Causal: the key loop starts at the tile's diagonal, tile_m · BLOCK_M, as well as ending after
    the last visible key ('causal attention only looks at the diagonal band'): every key before the tile's first
    row is left out of dQ, although each row sees all earlier keys."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_loop_starts_at_diagonal[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# ---------------------------------------------------------------- dk_skip_rounded_down

@triton.jit
def dkdv_kernel__dk_skip_rounded_down(Q, K, V, DO, LSE, DELTA, DK, DV,              # lse, delta [B, Hq, Nq]; dk, dv [B, Hkv, Nk, D]
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
        lo = 0
        if CAUSAL:
            first = tl.maximum(tile_n * BLOCK_N + n_q - n_k, 0)   # first row that sees this tile's first key
            lo = first // BLOCK_M * BLOCK_M
        for start_m in range(lo, n_q, BLOCK_M):
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


def dk_skip_rounded_down(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2, correct: causal, the query loop starts at the tile holding the first row that sees this
    program's first key (rounded down to a tile), as the lab allows."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    dkdv_kernel__dk_skip_rounded_down[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                      H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_M=block_m, BLOCK_N=block_n)
    return dk, dv


# ---------------------------------------------------------------- dq_mask_on_ds

@triton.jit
def dq_kernel__dq_mask_on_ds(Q, K, V, DO, LSE, DELTA, DQ,
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
        if CAUSAL:
            ds = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, ds, 0.0)
        dq += tl.dot(ds.to(k.dtype), k)
    dq = dq * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def dq_mask_on_ds(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3, correct: the causal mask applied to dS instead of P (dQ uses P only through dS)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    dq_kernel__dq_mask_on_ds[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                    H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    return dq


# ---------------------------------------------------------------- prediction

def pr_count_float():
    """Exercise 4. The count computed with a true division, (64 / 16) · (64 / 16) tile pairs ('a ratio of
    sizes'): 112.0, a float, where the lab asks for an int."""
    tile_pairs = (64 / 16) * (64 / 16)
    dots = 4 * tile_pairs + 3 * tile_pairs
    return dots, dots / (2 * tile_pairs)


def pr_ratio_percent():
    """Exercise 4. The ratio given in percent, 350 ('the backward costs 350% of the forward'): the lab asks for
    the ratio, 3.5."""
    tile_pairs = (64 // 16) * (64 // 16)
    dots = 4 * tile_pairs + 3 * tile_pairs
    return dots, 100 * dots / (2 * tile_pairs)


WRONG = {
    "row_term": [rt_store_tile_rows],
    "dkdv": [dk_acc_reset_per_head, dk_skip_rounded_up],
    "dq": [dq_loop_starts_at_diagonal],
    "prediction": [pr_count_float, pr_ratio_percent],
}
SOLUTION = {"row_term": row_term, "dkdv": flash_dkdv, "dq": flash_dq, "prediction": predict}
CORRECT = {"dkdv": [flash_dkdv, dk_skip_rounded_down], "dq": [flash_dq, dq_mask_on_ds]}


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


def _row_term(f):
    q, k, v, o, lse, do = _inputs(1, 2, 1, 37, 21, 16, False)
    return f(o, do)


WITNESS = {
    "rt_store_tile_rows": _row_term,
    "dk_acc_reset_per_head": lambda f: _bwd(f, 1, 4, 2, 19, 21, 16, False),
    "dk_skip_rounded_up": lambda f: _bwd(f, 1, 1, 1, 18, 35, 16, True, causal=True),
    "dq_loop_starts_at_diagonal": lambda f: _bwd(f, 1, 1, 1, 40, 40, 16, True, causal=True),
    "pr_count_float": lambda f: [type(x).__name__ for x in f()],
    "pr_ratio_percent": lambda f: f(),
}
