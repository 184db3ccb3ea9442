"""Fresh wrong answers (and alternative correct answers) for lab 06, written from the student notebook
and the solutions only. The variants of one exercise share one kernel whose constexpr MUT selects the
mistake (MUT = 0 and MUT >= 100 are correct bodies); each launch function is what one student would
hand in, and its docstring names the mistake."""
import math

import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


# ---------------------------------------------------------------- exercise 1: row term
@triton.jit
def _row_term_kernel(O, DO, DELTA, stride_ob, stride_oh, stride_on, stride_dob, stride_doh, stride_don,
                     n_q, H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MUT: tl.constexpr):
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H
    head = tl.program_id(1) % H
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None] < n_q
    o = tl.load(O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                mask=rows, other=0.0)
    if MUT == 2:   # dO through O's strides
        do = tl.load(DO + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
                     mask=rows, other=0.0)
    else:
        do = tl.load(DO + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :],
                     mask=rows, other=0.0)
    if MUT == 1:   # product and sum in fp16
        delta = tl.sum(o * do, axis=1).to(tl.float32)
    elif MUT == 3:  # sums over the rows instead of the head dimension (then broadcasts)
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=0)
        delta = tl.sum(delta) + tl.zeros([BLOCK_M], tl.float32)
    else:
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    if MUT == 4:   # forgets the batch in the output index
        tl.store(DELTA + head * n_q + offs_m, delta, mask=offs_m < n_q)
    else:
        tl.store(DELTA + (batch * H + head) * n_q + offs_m, delta, mask=offs_m < n_q)


def _row_term(o, do, mut=0, block_m=16):
    B, H, Nq, D = o.shape
    o, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (o, do))
    delta = torch.empty(B, H, Nq, dtype=torch.float32, device=o.device)
    grid = (triton.cdiv(Nq, block_m), B * H)
    _row_term_kernel[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                           do.stride(0), do.stride(1), do.stride(2), Nq, H=H, HEAD_DIM=D, BLOCK_M=block_m, MUT=mut)
    return delta


def row_term_fp16(o, do, block_m=16):
    """Exercise 1. Multiplies and sums in fp16 (the lab asks for float32)."""
    return _row_term(o, do, 1)


def row_term_do_with_o_strides(o, do, block_m=16):
    """Exercise 1. Loads dO through O's strides."""
    return _row_term(o, do, 2)


def row_term_wrong_axis(o, do, block_m=16):
    """Exercise 1. Sums over the rows (axis 0) instead of the head dimension."""
    return _row_term(o, do, 3)


def row_term_forgets_batch(o, do, block_m=16):
    """Exercise 1. Stores Δ at head * Nq + i (forgets the batch)."""
    return _row_term(o, do, 4)


def correct_row_term_einsum_style(o, do, block_m=16):
    """Exercise 1, correct: the unmodified kernel with BLOCK_M = 32 (a different tile)."""
    return _row_term(o, do, 0, block_m=32)


# ---------------------------------------------------------------- exercise 2: dK/dV
@triton.jit
def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV,
                 stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
                 n_q, n_k, sm_scale,
                 H_Q: tl.constexpr, H_KV: tl.constexpr, GROUP: tl.constexpr, CAUSAL: tl.constexpr,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MUT: tl.constexpr):
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
    if MUT == 6:
        dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float16)
    n_groups = GROUP
    if MUT == 1:     # only the first head of the group
        n_groups = 1
    for g in range(n_groups):
        if MUT == 2:   # heads of the group strided by H_KV
            head = kv_head + g * H_KV
        else:
            head = kv_head * GROUP + g
        q_base = Q + batch * stride_qb + head * stride_qh
        do_base = DO + batch * stride_dob + head * stride_doh
        row_base = (batch * H_Q + head) * n_q
        lo = 0
        if MUT == 8:
            if CAUSAL:   # skip query tiles assuming Nq == Nk
                lo = tile_n * BLOCK_N
        for start_m in range(lo, n_q, BLOCK_M):
            rows = start_m + offs_m
            q = tl.load(q_base + rows[:, None] * stride_qn + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            do = tl.load(do_base + rows[:, None] * stride_don + offs_d[None, :], mask=rows[:, None] < n_q, other=0.0)
            lse = tl.load(LSE + row_base + rows, mask=rows < n_q, other=0.0)
            delta = tl.load(DELTA + row_base + rows, mask=rows < n_q, other=0.0)
            s = tl.dot(q, tl.trans(k)) * sm_scale
            p = tl.exp(s - lse[:, None])
            if CAUSAL:
                if MUT == 4:
                    p = tl.where(offs_n[None, :] <= rows[:, None], p, 0.0)
                elif MUT == 7:   # masks only dS, not the P used for dV
                    p_dv = p
                    p = tl.where(offs_n[None, :] <= rows[:, None] + n_k - n_q, p, 0.0)
                else:
                    p = tl.where(offs_n[None, :] <= rows[:, None] + n_k - n_q, p, 0.0)
            if MUT == 7 and CAUSAL:
                dv += tl.dot(tl.trans(p_dv.to(do.dtype)), do)
            else:
                dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            if MUT == 5:
                ds = p * dp
            else:
                ds = p * (dp - delta[:, None])
            if MUT == 6:
                dk = (dk + tl.dot(tl.trans(ds.to(q.dtype)), q).to(tl.float16)).to(tl.float16)
            elif MUT == 100:   # scale each tile's contribution instead of once at the end
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q) * sm_scale
            else:
                dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    if MUT != 3 and MUT != 100:
        dk = dk.to(tl.float32) * sm_scale
    out = (batch * H_KV + kv_head) * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=keys)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=keys)


def _check_shapes(q, k, v, causal):
    B, Hq, Nq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] each, got {list(k.shape)} and {list(v.shape)}")
    if Hq % k.shape[1] != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {k.shape[1]} KV heads")
    if causal and Nq > k.shape[2]:
        raise ValueError(f"q: causal attention here needs Nq <= Nk (got Nq = {Nq}, Nk = {k.shape[2]})")


def _strides(*ts):
    return [s for t in ts for s in (t.stride(0), t.stride(1), t.stride(2))]


def _dkdv(q, k, v, o, lse, do, causal, mut, block_m=16, block_n=16):
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = _row_term(o, do)
    lse = lse.contiguous()
    dk = torch.empty(B, Hkv, Nk, D, dtype=q.dtype, device=q.device)
    dv = torch.empty_like(dk)
    grid = (triton.cdiv(Nk, block_n), B * Hkv)
    _dkdv_kernel[grid](q, k, v, do, lse, delta, dk, dv, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                       H_Q=Hq, H_KV=Hkv, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                       BLOCK_M=block_m, BLOCK_N=block_n, MUT=mut)
    return dk, dv


def dkdv_first_head_only(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Walks only the first query head of the group (no loop over GROUP)."""
    return _dkdv(q, k, v, o, lse, do, causal, 1)


def dkdv_group_strided(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Group heads kv_head + g * Hkv instead of kv_head * GROUP + g."""
    return _dkdv(q, k, v, o, lse, do, causal, 2)


def dkdv_no_final_scale(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Forgets to scale dk by sm_scale at the end."""
    return _dkdv(q, k, v, o, lse, do, causal, 3)


def dkdv_square_causal(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Causal mask j <= i, not aligned to the end."""
    return _dkdv(q, k, v, o, lse, do, causal, 4)


def dkdv_forgets_delta(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. dS = P * dP (forgets - Δ)."""
    return _dkdv(q, k, v, o, lse, do, causal, 5)


def dkdv_fp16_dk(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Accumulates dk in fp16."""
    return _dkdv(q, k, v, o, lse, do, causal, 6)


def dkdv_dv_unmasked(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Applies the causal mask to P for dS but uses the unmasked P for dV."""
    return _dkdv(q, k, v, o, lse, do, causal, 7)


def dkdv_skip_assumes_square(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2. Causal: starts the query loop at the key tile's start (right only when Nq == Nk)."""
    return _dkdv(q, k, v, o, lse, do, causal, 8)


def correct_dkdv_scale_each_tile(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 2, correct: scales each tile's dK contribution instead of once at the end."""
    return _dkdv(q, k, v, o, lse, do, causal, 100)


# ---------------------------------------------------------------- exercise 3: dQ
@triton.jit
def _dq_kernel(Q, K, V, DO, LSE, DELTA, DQ,
               stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
               stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_don,
               n_q, n_k, sm_scale,
               H_Q: tl.constexpr, H_KV: tl.constexpr, CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MUT: tl.constexpr):
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
    if MUT == 5:
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float16)
    else:
        dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if MUT == 2:
        kv_head = head % H_KV
    else:
        kv_head = head // (H_Q // H_KV)
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh
    hi = n_k
    if CAUSAL:
        last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1
        if MUT == 1:
            hi = tl.minimum(last_row + n_k - n_q, n_k)
        elif MUT == 8:   # the tile's first row instead of its last
            hi = tl.minimum(tile_m * BLOCK_M + n_k - n_q + 1, n_k)
        else:
            hi = tl.minimum(last_row + n_k - n_q + 1, n_k)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        if MUT == 4:
            v = tl.load(v_base + cols[:, None] * stride_kn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        else:
            v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=cols[:, None] < n_k, other=0.0)
        if MUT == 100:
            p = tl.exp2((tl.dot(q, tl.trans(k)) * sm_scale - lse[:, None]) * 1.4426950408889634)
        else:
            s = tl.dot(q, tl.trans(k)) * sm_scale
            p = tl.exp(s - lse[:, None])
        if CAUSAL:
            if MUT == 7:
                p = tl.where(cols[None, :] <= offs_m[:, None], p, 0.0)
            else:
                p = tl.where(cols[None, :] <= offs_m[:, None] + n_k - n_q, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        if MUT == 6:
            ds = p * dp
        else:
            ds = p * (dp - delta[:, None])
        if MUT == 5:
            dq = (dq + tl.dot(ds.to(k.dtype), k).to(tl.float16)).to(tl.float16)
        else:
            dq += tl.dot(ds.to(k.dtype), k)
    if MUT != 3:
        dq = dq.to(tl.float32) * sm_scale
    out = (batch * H_Q + head) * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQ + out, dq.to(DQ.dtype.element_ty), mask=rows)


def _dq(q, k, v, o, lse, do, causal, mut, block_m=16, block_n=16):
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    _check_shapes(q, k, v, causal)
    q, k, v, do = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, do))
    delta = _row_term(o, do)
    lse = lse.contiguous()
    dq = torch.empty(B, Hq, Nq, D, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    _dq_kernel[grid](q, k, v, do, lse, delta, dq, *_strides(q, k, v, do), Nq, Nk, 1.0 / math.sqrt(D),
                     H_Q=Hq, H_KV=Hkv, CAUSAL=causal, HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n, MUT=mut)
    return dq


def dq_hi_no_plus_one(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Causal loop end without its + 1."""
    return _dq(q, k, v, o, lse, do, causal, 1)


def dq_kv_head_modulo(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. KV head = head % Hkv."""
    return _dq(q, k, v, o, lse, do, causal, 2)


def dq_no_scale(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Forgets the final sm_scale."""
    return _dq(q, k, v, o, lse, do, causal, 3)


def dq_v_with_k_stride(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Loads v with k's row stride."""
    return _dq(q, k, v, o, lse, do, causal, 4)


def dq_fp16_acc(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Accumulates dq in fp16."""
    return _dq(q, k, v, o, lse, do, causal, 5)


def dq_forgets_delta(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. dS = P * dP (forgets - Δ)."""
    return _dq(q, k, v, o, lse, do, causal, 6)


def dq_square_causal(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Causal mask j <= i, not aligned to the end."""
    return _dq(q, k, v, o, lse, do, causal, 7)


def dq_hi_from_first_row(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3. Causal loop end computed from the tile's first row, not its last."""
    return _dq(q, k, v, o, lse, do, causal, 8)


def correct_dq_exp2(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3, correct: P rebuilt with exp2 and log2(e) to full precision."""
    return _dq(q, k, v, o, lse, do, causal, 100)


def correct_dq_solution_body(q, k, v, o, lse, do, causal=False, block_m=16, block_n=16):
    """Exercise 3, correct: the unmodified body (MUT = 0), a control for the shared kernel."""
    return _dq(q, k, v, o, lse, do, causal, 0)


# ---------------------------------------------------------------- exercise 4: prediction
def predict_lesson_count():
    """Exercise 4. Takes the lesson's 5 products per tile pair (the atomic design) and ratio 2.5."""
    return 5 * 16, 2.5


def predict_ratio_per_dot():
    """Exercise 4. Right count, ratio of products per tile pair not halved (7 instead of 3.5)."""
    return 112, 7.0


def predict_dq_recomputes_dv():
    """Exercise 4. Counts 4 products in each kernel (thinks dQ recomputes dV too)."""
    return 128, 4.0


def correct_predict_computed():
    """Exercise 4, correct: counted from the tile grid."""
    pairs = (64 // 16) ** 2
    return 7 * pairs, 7 * pairs / (2 * pairs)


WRONG = {
    "row_term": [row_term_fp16, row_term_do_with_o_strides, row_term_wrong_axis, row_term_forgets_batch],
    "dkdv": [dkdv_first_head_only, dkdv_group_strided, dkdv_no_final_scale, dkdv_square_causal, dkdv_forgets_delta,
             dkdv_fp16_dk, dkdv_dv_unmasked, dkdv_skip_assumes_square],
    "dq": [dq_hi_no_plus_one, dq_kv_head_modulo, dq_no_scale, dq_v_with_k_stride, dq_fp16_acc, dq_forgets_delta,
           dq_square_causal, dq_hi_from_first_row],
    "prediction": [predict_lesson_count, predict_ratio_per_dot, predict_dq_recomputes_dv],
}
CORRECT = {
    "row_term": [correct_row_term_einsum_style],
    "dkdv": [correct_dkdv_scale_each_tile],
    "dq": [correct_dq_exp2, correct_dq_solution_body],
    "prediction": [correct_predict_computed],
}
