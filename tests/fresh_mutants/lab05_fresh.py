"""Fresh wrong answers (and alternative correct answers) for lab 05, written from the student notebook
and the solutions only. The variants share one kernel whose constexpr MUT selects the mistake (MUT = 0
and MUT >= 100 are correct bodies); each launch function is what one student would hand in, and its
docstring names the mistake."""
import math

import torch

from attnkit.device import ensure_triton_backend

ensure_triton_backend()
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE,
                stride_qb, stride_qh, stride_qn, stride_qd,
                stride_kb, stride_kh, stride_kn, stride_kd,
                stride_vb, stride_vh, stride_vn, stride_vd,
                stride_ob, stride_oh, stride_on, stride_od,
                n_q, n_k, sm_scale,
                H_Q: tl.constexpr, GROUP: tl.constexpr,
                CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MUT: tl.constexpr, L2E: tl.constexpr):
    tile_m = tl.program_id(0)
    batch = tl.program_id(1) // H_Q
    head = tl.program_id(1) % H_Q
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    if MUT == 12:   # no mask on the head dimension
        dims = offs_d[None, :] < BLOCK_D
    else:
        dims = offs_d[None, :] < HEAD_DIM
    if MUT == 6:    # q through k's strides
        q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_kn + offs_d[None, :] * stride_kd
    else:
        q_ptrs = Q + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & dims, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if MUT == 8:
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float16)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    if MUT == 4:    # kv head by modulo
        kv_head = head % (H_Q // GROUP)
    else:
        kv_head = head // GROUP
    k_base = K + batch * stride_kb + kv_head * stride_kh
    v_base = V + batch * stride_vb + kv_head * stride_vh

    hi = n_k
    if CAUSAL:
        if MUT != 101:
            last_row = tl.minimum((tile_m + 1) * BLOCK_M, n_q) - 1
            if MUT == 3:   # loop end without its + 1
                hi = tl.minimum(last_row + n_k - n_q, n_k)
            else:
                hi = tl.minimum(last_row + n_k - n_q + 1, n_k)
    if MUT == 7:
        qk_scale = 1.0
    else:
        qk_scale = sm_scale

    for start_n in range(0, hi, BLOCK_N):
        keys = start_n + offs_n
        kv_mask = (keys[:, None] < n_k) & dims
        k = tl.load(k_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        if MUT == 14:   # v through k's strides
            v = tl.load(v_base + keys[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        else:
            v = tl.load(v_base + keys[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        if MUT != 13:   # 13: padding keys keep their score of 0
            s = tl.where(keys[None, :] < n_k, s, float("-inf"))
        if MUT == 11:   # maximum taken before the causal mask
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if CAUSAL:
            if MUT == 2:
                s = tl.where(keys[None, :] <= offs_m[:, None], s, float("-inf"))
            else:
                s = tl.where(keys[None, :] <= offs_m[:, None] + n_k - n_q, s, float("-inf"))
        if MUT != 11:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if MUT == 9:    # no special case for rows that have seen no key
            m_use = m_new
        else:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        if MUT == 10 or MUT == 100:   # exp2 with log2(e) folded in
            alpha = tl.exp2((m_i - m_use) * L2E)
            p = tl.exp2((s - m_use[:, None]) * L2E)
        else:
            alpha = tl.exp(m_i - m_use)
            p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if MUT == 1:
            acc = acc + tl.dot(p.to(v.dtype), v)
        elif MUT == 8:
            acc = (acc * alpha[:, None].to(tl.float16) + tl.dot(p.to(v.dtype), v).to(tl.float16)).to(tl.float16)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if MUT == 9:
        seen = l_i == l_i
    else:
        seen = l_i > 0
    acc = acc.to(tl.float32) / tl.where(seen, l_i, 1.0)[:, None]
    o_ptrs = O + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM))
    if MUT == 5:    # forgets the maximum
        lse = tl.where(seen, tl.log(l_i), float("-inf"))
    else:
        lse = tl.where(seen, m_i + tl.log(l_i), float("-inf"))
    tl.store(LSE + (batch * H_Q + head) * n_q + offs_m, lse, mask=offs_m < n_q)


def _launch(q, k, v, causal, mut, l2e=LOG2E, block_m=16, block_n=16):
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k, v: expected [B={B}, Hkv, Nk, D={D}] both, got {list(k.shape)} and {list(v.shape)}")
    if Hq % Hkv != 0:
        raise ValueError(f"k: Hq = {Hq} query heads must be a multiple of Hkv = {Hkv} KV heads")
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    _fwd_kernel[grid](q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                      Nq, Nk, 1.0 / math.sqrt(D), H_Q=Hq, GROUP=Hq // Hkv, CAUSAL=causal, HEAD_DIM=D,
                      BLOCK_D=max(16, triton.next_power_of_2(D)), BLOCK_M=block_m, BLOCK_N=block_n, MUT=mut, L2E=l2e)
    return o, lse


def fwd_acc_not_rescaled(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward (checks 1-3). Rescales l_i by alpha but not acc."""
    return _launch(q, k, v, causal, 1)


def fwd_causal_square_mask(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. Mask j <= i, not aligned to the end of the keys."""
    return _launch(q, k, v, causal, 2)


def fwd_causal_hi_no_plus_one(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. Loop bound last_row + Nk - Nq without + 1."""
    return _launch(q, k, v, causal, 3)


def fwd_gqa_modulo(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, GQA. KV head = head % Hkv instead of head // group."""
    return _launch(q, k, v, causal, 4)


def fwd_lse_without_max(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. LSE = log(l) (forgets to add the running maximum m)."""
    return _launch(q, k, v, causal, 5)


def fwd_q_with_k_strides(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Loads q with k's row and column strides (the wrong tensor's strides)."""
    return _launch(q, k, v, causal, 6)


def fwd_no_scale(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Forgets sm_scale on the scores."""
    return _launch(q, k, v, causal, 7)


def fwd_fp16_acc(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Keeps acc in float16."""
    return _launch(q, k, v, causal, 8)


def fwd_no_empty_row_guard(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. No guard for rows that see no key (exp(-inf - -inf) = NaN, 0/0)."""
    return _launch(q, k, v, causal, 9)


def fwd_exp2_short_log2e(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. exp2 with log2(e) typed as 1.4427 (four decimals)."""
    return _launch(q, k, v, causal, 10, l2e=1.4427)


def fwd_max_before_mask(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, causal. Takes the row maximum before applying the causal mask."""
    return _launch(q, k, v, causal, 11)


def fwd_no_dim_mask(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Loads all BLOCK_D columns (no HEAD_DIM mask): D = 24 reads past each row."""
    return _launch(q, k, v, causal, 12)


def fwd_padding_keys_scored(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Does not set the scores of keys j >= Nk to -inf (zero-padded keys score 0)."""
    return _launch(q, k, v, causal, 13)


def fwd_v_with_k_strides(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward. Loads v through k's strides."""
    return _launch(q, k, v, causal, 14)


def correct_fwd_exp2(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, correct: exp2 with log2(e) to full double precision."""
    return _launch(q, k, v, causal, 100)


def correct_fwd_no_loop_bound(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, correct: causal by the mask alone, walking over every key tile (slower, same numbers)."""
    return _launch(q, k, v, causal, 101)


def correct_fwd_solution_body(q, k, v, causal=False, block_m=16, block_n=16):
    """Forward, correct: the unmodified body (MUT = 0), a control for the shared kernel."""
    return _launch(q, k, v, causal, 0)


WRONG = {
    "forward": [fwd_acc_not_rescaled, fwd_lse_without_max, fwd_q_with_k_strides, fwd_no_scale, fwd_fp16_acc,
                fwd_exp2_short_log2e, fwd_no_dim_mask, fwd_padding_keys_scored, fwd_v_with_k_strides],
    "causal": [fwd_causal_square_mask, fwd_causal_hi_no_plus_one, fwd_no_empty_row_guard, fwd_max_before_mask],
    "gqa": [fwd_gqa_modulo],
}
CORRECT = {
    "forward": [correct_fwd_solution_body, correct_fwd_exp2],
    "causal": [correct_fwd_no_loop_bound, correct_fwd_solution_body],
    "gqa": [correct_fwd_solution_body],
}
