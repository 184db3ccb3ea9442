"""Benchmark: the fused rotate-and-append kernel against the same steps as separate PyTorch operations.

Both implementations do the same work on the same preallocated buffers, with the input checks done
once outside the timed region: gather cos/sin at each token's position, rotate Q, rotate K, copy the
past (separate buffer only), write K and V into the cache. Bandwidth counts the fewest bytes the
update must move (each input read once, each output written once):

    new Q, K, V read + rotated Q written + K, V rows written [+ past K, V read and written]

and is compared with the ceilings of the course's one harness, ``streams.ceilings(timing="eager")``,
measured in the same run and timed as the kernels here are (eager, ``recorder.time_ms``): a 1 GiB
device-to-device copy (bytes read + bytes written), the read-only stream ``read_stream`` (bytes read)
and the datasheet figure. Each row carries the three and its ``fraction_of_copy``,
``fraction_of_read`` and ``fraction_of_datasheet``. The append reads the new rows and writes as
many, so the copy is its ceiling; the decode-style key read (below) only reads, so the read-only
stream is its ceiling. A row with ``scenario == "allocation"`` records torch's measured allocation
for a whole model's cache against ``kv_cache_bytes``.

Rows whose scenario starts with ``"layout: "`` compare the two cache layouts (column ``layout``):
the fused append (shared buffer) into a cache stored BNSH ``[B, Hkv, S, D]`` and into one stored
BSNH ``[B, S, Hkv, D]``, which the kernel writes through a transposed view (it addresses the cache by
strides); and a decode-style read (``key_scores``: one program reads a block of one sequence's keys for
one head and dots them with one query), from each layout.

    python -m attnkit.bench.suites kvcache           # on a GPU: writes attnkit/bench/results/bench_kvcache.csv
"""
from __future__ import annotations

import torch

from ..device import ensure_triton_backend, launch_options, on_device, to_kernel_device
from ..kernels import rope_append
from ..serving import kv_cache
from ..serving.model_configs import model
from ..tolerances import rel_error, tolerance
from .recorder import time_ms

ensure_triton_backend()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

# (scenario, B, Hq, Hkv, D, S_new, past): a Llama-3-8B-shaped layer (Hq=32, Hkv=8, D=128)
SCENARIOS = (
    ("decode", 64, 32, 8, 128, 1, 4095),
    ("chunked prefill", 8, 32, 8, 128, 512, 3584),
    ("first prompt", 8, 32, 8, 128, 4096, 0),
)
CEILING_TIMING = "eager"          # the kernels here are timed by recorder.time_ms (do_bench)


def measured_ceilings() -> dict:
    """The copy, read-only and datasheet ceilings of this GPU, timed eagerly as the kernels here are."""
    from .streams import ceilings

    return ceilings(timing=CEILING_TIMING)


def with_fractions(row: dict, gbps: float, ceils: dict) -> dict:
    """``row`` with GBps, the ceilings and the three fractions (rounded for the CSV)."""
    from .streams import with_ceilings

    full = with_ceilings({**row, "GBps": gbps}, gbps, ceils)
    return {k: (round(v, 1) if k.endswith("GBps") else round(v, 3) if k.startswith("fraction_of_") else v)
            for k, v in full.items()}


LAYOUTS = ("BNSH", "BSNH")


def stored_as(cache, layout):
    """``cache`` [B, Hkv, S, D] copied into memory laid out as ``layout``, returned as a [B, Hkv, S, D] view.

    BNSH: a contiguous copy. BSNH: a contiguous [B, S, Hkv, D] tensor seen through ``transpose(1, 2)``,
    so that index [b, h, s, d] addresses the same element in both.
    """
    if layout == "BNSH":
        return cache.contiguous()
    if layout == "BSNH":
        store = torch.empty(cache.shape[0], cache.shape[2], cache.shape[1], cache.shape[3], dtype=cache.dtype,
                            device=cache.device)
        view = store.transpose(1, 2)
        view.copy_(cache)
        return view
    raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


def append_inputs(batch, hq, hkv, d, new_len, past, share_buffer, dtype=torch.bfloat16, device="cuda", layout="BNSH"):
    """One update's inputs, seeded: new q [B, S_new, Hq, D], k, v [B, S_new, Hkv, D], the K and V caches stored
    in ``layout`` (past + S_new rows when the buffer is shared, else the past alone) and seqlens [B]."""
    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, device=device, generator=g).to(dtype)

    capacity = past + new_len
    q, k, v = r(batch, new_len, hq, d), r(batch, new_len, hkv, d), r(batch, new_len, hkv, d)
    rows = capacity if share_buffer else max(past, 1)
    k_cache, v_cache = (stored_as(r(batch, hkv, rows, d), layout) for _ in range(2))
    seqlens = torch.full((batch,), capacity - 1, dtype=torch.int32, device=device)
    return q, k, v, k_cache, v_cache, seqlens


def _bytes_moved(q, k, past, share_buffer) -> int:
    batch, new_len, hq, d = q.shape
    hkv = k.shape[2]
    size = q.element_size()
    new = batch * new_len * d * size * (hq + 2 * hkv)          # read Q, K, V
    out = batch * new_len * d * size * (hq + 2 * hkv)          # write rotated Q, K and V rows
    copy = 0 if share_buffer else 2 * 2 * batch * hkv * past * d * size   # K and V past: read + write
    return new + out + copy


def prepared_appends(q, k, v, k_cache, v_cache, seqlens, share_buffer):
    """Closures that run one update each way, with everything but the update done beforehand.

    Each returns (rotated q, present k, present v).
    """
    plan = rope_append._plan(q, k, v, k_cache, v_cache, seqlens, None, share_buffer, None, "half", 10000.0, None, None)
    cos, sin = rope_append._tables(plan, 10000.0, None, None, q.device)
    present_k, present_v = rope_append._present(k_cache, v_cache, plan, share_buffer)
    q_out = torch.empty_like(q)
    past_len, positions = plan.past_len.to(q.device), plan.positions.to(q.device)
    past_rows = int(plan.past_len.max())
    full_past = bool((plan.past_len == k_cache.shape[2]).all())

    def fused():
        rope_append._launch(q, k, v, q_out, present_k, present_v, k_cache, v_cache, cos, sin, seqlens, None,
                   mode="half", share_buffer=share_buffer, past_rows=past_rows)
        return q_out, present_k, present_v

    def separate_ops():
        q_rot = rope_append._torch_update(q, k, v, k_cache, v_cache, present_k, present_v, past_len, positions,
                                          cos, sin, "half", share_buffer, full_past=full_past)
        return q_rot, present_k, present_v

    return fused, separate_ops


# ---------------------------------------------------------------- a decode-style read of the keys
@triton.jit
def _key_scores_kernel(k_ptr, q_ptr, out_ptr, S, D, HKV,
                       skb, skh, sks, skd, sqb, sqh, sqd, sob, soh, sos,
                       BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program: rows pid_s·BLOCK_S .. + BLOCK_S − 1 of one sequence's keys for one head, dotted with q.

    The keys are addressed by strides alone, so the same kernel reads a BNSH or a BSNH cache.
    """
    pid_s = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // HKV).to(tl.int64)
    h = pid_bh % HKV
    offs_s = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_ok, d_ok = offs_s < S, offs_d < D
    keys = tl.load(k_ptr + b * skb + h * skh + offs_s[:, None] * sks + offs_d[None, :] * skd,
                   mask=s_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    query = tl.load(q_ptr + b * sqb + h * sqh + offs_d * sqd, mask=d_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + b * sob + h * soh + offs_s * sos, tl.sum(keys * query[None, :], axis=1), mask=s_ok)


def key_scores(k_cache, q, *, block_s=64, num_warps=4):
    """scores[b, h, s] = k_cache[b, h, s] · q[b, h] in fp32: every key of every sequence and head read once.

    k_cache: [B, Hkv, S, D] (any strides: BNSH, or BSNH seen through a transpose); q: [B, Hkv, D].
    Runs where ``attnkit.device.kernel_device`` says, as every kernel of the course.
    """
    batch, hkv, rows, d = k_cache.shape
    if tuple(q.shape) != (batch, hkv, d):
        raise ValueError(f"q: expected [B={batch}, Hkv={hkv}, D={d}], got {tuple(q.shape)}")
    where = k_cache.device
    k_cache, q = to_kernel_device(k_cache, q)
    out = torch.empty(batch, hkv, rows, dtype=torch.float32, device=k_cache.device)
    with on_device(k_cache.device):
        _key_scores_kernel[(triton.cdiv(rows, block_s), batch * hkv)](
            k_cache, q, out, rows, d, hkv, *k_cache.stride(), *q.stride(), *out.stride(),
            BLOCK_S=block_s, BLOCK_D=triton.next_power_of_2(d), **launch_options(num_warps=num_warps))
    return out.to(where)


# (scenario, B, Hq, Hkv, D, S_new, past) of the layout rows: the fused append in both layouts ...
LAYOUT_APPENDS = (
    ("layout: append, decode", 64, 32, 8, 128, 1, 4095),
    ("layout: append, chunked prefill", 8, 32, 8, 128, 512, 3584),
)
# ... and the decode-style read of the keys: (B, Hkv, D, rows)
LAYOUT_READ = (64, 8, 128, 4096)


def layout_rows(ceils: dict | None = None) -> list[dict]:
    """The fused append (shared buffer) and the key read, each from a BNSH and from a BSNH cache.
    ``ceils``: a ``streams.ceilings(timing="eager")`` dict (measured here when None)."""
    if ceils is None:
        ceils = measured_ceilings()
    rows = []
    for scenario, batch, hq, hkv, d, new_len, past in LAYOUT_APPENDS:
        for layout in LAYOUTS:
            q, k, v, k_cache, v_cache, seqlens = append_inputs(batch, hq, hkv, d, new_len, past, True, layout=layout)
            fused, _ = prepared_appends(q, k, v, k_cache, v_cache, seqlens, True)
            moved = _bytes_moved(q, k, past, True)
            ms = time_ms(fused)
            gbps = moved / (ms * 1e-3) / 1e9
            rows.append(with_fractions(dict(scenario=scenario, layout=layout, buffer="shared", impl="triton fused",
                                            B=batch, Hq=hq, Hkv=hkv, D=d, S_new=new_len, past=past,
                                            dtype="bfloat16", ms=round(ms, 5), bytes=moved), gbps, ceils))
            q = k = v = k_cache = v_cache = None  # free the memory before the next size
            torch.cuda.empty_cache()
    batch, hkv, d, past = LAYOUT_READ
    g = torch.Generator(device="cuda").manual_seed(1)
    query = torch.randn(batch, hkv, d, device="cuda", generator=g).to(torch.bfloat16)
    for layout in LAYOUTS:
        keys = stored_as(torch.randn(batch, hkv, past, d, device="cuda", generator=g).to(torch.bfloat16), layout)
        moved = keys.numel() * keys.element_size() + batch * hkv * past * 4     # keys read, fp32 scores written
        ms = time_ms(lambda: key_scores(keys, query))
        gbps = moved / (ms * 1e-3) / 1e9
        rows.append(with_fractions(dict(scenario="layout: read keys, decode", layout=layout, buffer="",
                                        impl="triton read", B=batch, Hq="", Hkv=hkv, D=d, S_new=0, past=past,
                                        dtype="bfloat16", ms=round(ms, 5), bytes=moved), gbps, ceils))
        keys = None  # free the memory before the next size
        torch.cuda.empty_cache()
    return rows


def check_on_gpu(device="cuda", head_dims=(64, 128, 96), dtypes=(torch.float32, torch.float16, torch.bfloat16)):
    """The kernel against the float64 reference on CUDA tensors: every mode, buffer mode, case, dtype."""
    lines = []
    cases = {
        "first prompt": (37, {}),
        "decoding": (1, dict(seqlens_k=torch.tensor([40, 77, 5], dtype=torch.int32, device=device))),
        "chunked prefill": (19, dict(seqlens_k=torch.tensor([40, 77, 25], dtype=torch.int32, device=device),
                                     position_ids=(torch.arange(19, device=device) + torch.tensor(
                                         [[22], [59], [7]], device=device)).to(torch.int64))),
    }
    for dtype in dtypes:
        for mode in ("half", "interleaved"):
            for share in (True, False):
                for name, (new_len, kwargs) in cases.items():
                    for d in head_dims:
                        g = torch.Generator(device=device).manual_seed(d + new_len)
                        q = torch.randn(3, new_len, 12, d, device=device, generator=g).to(dtype)
                        k = torch.randn(3, new_len, 4, d, device=device, generator=g).to(dtype)
                        v = torch.randn(3, new_len, 4, d, device=device, generator=g).to(dtype)
                        kc_ = torch.randn(3, 4, 100, d, device=device, generator=g).to(dtype)
                        vc_ = torch.randn(3, 4, 100, d, device=device, generator=g).to(dtype)
                        ref = rope_append.rope_append_reference(q, k, v, kc_, vc_, share_buffer=share, mode=mode,
                                                                **kwargs)
                        out = rope_append.rope_append(q, k, v, kc_.clone(), vc_.clone(), share_buffer=share, mode=mode,
                                             backend="triton", **kwargs)
                        errs = [rel_error(o, r) for o, r in zip((out.q, out.k_cache, out.v_cache), ref)]
                        bound = tolerance(dtype)
                        ok = max(errs) <= bound
                        lines.append(f"{'ok ' if ok else 'BAD'} {str(dtype)[6:]:8} {mode:11} "
                                     f"{'shared' if share else 'separate':8} {name:15} D={d:3} "
                                     f"max rel err {max(errs):.1e} (bound {bound:.0e})")
    return lines


def allocation_rows() -> list[dict]:
    """Measured CUDA allocation of a whole model's K and V caches against the formula."""
    rows = []
    for name, tokens, batch in (("Llama 3 8B", 8192, 1), ("Llama 2 7B", 4096, 2), ("Qwen2.5 7B", 32768, 1)):
        cfg = model(name)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        caches = [torch.empty(2, batch, cfg.num_kv_heads, tokens, cfg.head_dim, dtype=torch.bfloat16,
                              device="cuda") for _ in range(cfg.num_layers)]      # K and V per layer, BNSH
        measured = torch.cuda.memory_allocated() - before
        del caches  # free the memory before the next size
        rows.append(dict(scenario="allocation", model=name, B=batch, tokens=tokens, measured_bytes=measured,
                         formula_bytes=kv_cache.model_cache_bytes(cfg, tokens=tokens, batch=batch)))
    return rows


def run() -> list[dict]:
    """The benchmark rows (GPU only)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the kvcache benchmark needs a CUDA GPU")
    ceils = measured_ceilings()
    rows = []
    for scenario, batch, hq, hkv, d, new_len, past in SCENARIOS:
        for share in (True, False):
            if scenario == "first prompt" and not share:
                continue                                     # nothing to copy: same as shared
            q, k, v, k_cache, v_cache, seqlens = append_inputs(batch, hq, hkv, d, new_len, past, share)
            fused, separate_ops = prepared_appends(q, k, v, k_cache, v_cache, seqlens, share)
            moved = _bytes_moved(q, k, past, share)
            for impl, fn in (("triton fused", fused), ("pytorch ops", separate_ops)):
                ms = time_ms(fn)
                gbps = moved / (ms * 1e-3) / 1e9
                rows.append(with_fractions(dict(scenario=scenario, buffer="shared" if share else "separate",
                                                impl=impl, B=batch, Hq=hq, Hkv=hkv, D=d, S_new=new_len, past=past,
                                                dtype="bfloat16", ms=round(ms, 5), bytes=moved), gbps, ceils))
            q = k = v = k_cache = v_cache = None  # free the memory before the next size
            torch.cuda.empty_cache()
    return rows + layout_rows(ceils) + allocation_rows()


def main() -> int:
    import os
    from pathlib import Path

    from .recorder import write_results

    for line in check_on_gpu():
        print(line)
    rows = run()
    out = Path(os.environ.get("OUT", "figures"))
    print(f"wrote {write_results('kvcache', rows, directory=out)}")
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
