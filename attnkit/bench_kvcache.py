"""Benchmark: the fused rotate-and-append kernel against the same steps as separate PyTorch operations.

Both implementations do the same work on the same preallocated buffers, with the input checks done
once outside the timed region: gather cos/sin at each token's position, rotate Q, rotate K, copy the
past (separate buffer only), write K and V into the cache. Bandwidth counts the fewest bytes the
update must move (each input read once, each output written once):

    new Q, K, V read + rotated Q written + K, V rows written [+ past K, V read and written]

and is compared with the copy bandwidth of the same GPU, measured in the same run by a large
device-to-device copy (bytes read + bytes written). A row with ``scenario == "allocation"`` records
torch's measured allocation for a whole model's cache against ``kv_cache_bytes``.

    python -m attnkit.benchmarking kvcache         # on a GPU: writes figures/bench_kvcache.csv
"""
from __future__ import annotations

import torch

from . import kvcache as kc
from .benchmarking import time_ms
from .models import model
from .tolerances import rel_error, tolerance

# (scenario, B, Hq, Hkv, D, S_new, past): a Llama-3-8B-shaped layer (Hq=32, Hkv=8, D=128)
SCENARIOS = (
    ("decode", 64, 32, 8, 128, 1, 4095),
    ("chunked prefill", 8, 32, 8, 128, 512, 3584),
    ("first prompt", 8, 32, 8, 128, 4096, 0),
)
COPY_BYTES = 2 ** 30


def copy_bandwidth_gbps() -> float:
    """GB/s of a 1 GiB device-to-device copy, counting bytes read plus bytes written."""
    src = torch.randn(COPY_BYTES // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def _inputs(batch, hq, hkv, d, new_len, past, share_buffer, dtype=torch.bfloat16, device="cuda"):
    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, device=device, generator=g).to(dtype)

    capacity = past + new_len
    q, k, v = r(batch, new_len, hq, d), r(batch, new_len, hkv, d), r(batch, new_len, hkv, d)
    if share_buffer:
        k_cache, v_cache = r(batch, hkv, capacity, d), r(batch, hkv, capacity, d)
    else:
        k_cache, v_cache = r(batch, hkv, max(past, 1), d), r(batch, hkv, max(past, 1), d)
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


def _prepared(q, k, v, k_cache, v_cache, seqlens, share_buffer):
    """Closures that run one update each way, with everything but the update done beforehand."""
    plan = kc._plan(q, k, v, k_cache, v_cache, seqlens, None, share_buffer, None, "half", 10000.0, None, None)
    cos, sin = kc._tables(plan, 10000.0, None, None, q.device)
    present_k, present_v = kc._present(k_cache, v_cache, plan, share_buffer)
    q_out = torch.empty_like(q)
    past_len, positions = plan.past_len.to(q.device), plan.positions.to(q.device)
    past_rows = int(plan.past_len.max())
    full_past = bool((plan.past_len == k_cache.shape[2]).all())

    def fused():
        kc._launch(q, k, v, q_out, present_k, present_v, k_cache, v_cache, cos, sin, seqlens, None,
                   mode="half", share_buffer=share_buffer, past_rows=past_rows)

    def separate_ops():
        kc._torch_update(q, k, v, k_cache, v_cache, present_k, present_v, past_len, positions, cos, sin,
                         "half", share_buffer, full_past=full_past)

    return fused, separate_ops


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
                        ref = kc.rope_append_reference(q, k, v, kc_, vc_, share_buffer=share, mode=mode, **kwargs)
                        out = kc.rope_append(q, k, v, kc_.clone(), vc_.clone(), share_buffer=share, mode=mode,
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
        del caches
        rows.append(dict(scenario="allocation", model=name, B=batch, tokens=tokens, measured_bytes=measured,
                         formula_bytes=kc.model_cache_bytes(cfg, tokens=tokens, batch=batch)))
    return rows


def run() -> list[dict]:
    """The benchmark rows (GPU only)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the kvcache benchmark needs a CUDA GPU")
    copy_gbps = copy_bandwidth_gbps()
    rows = []
    for scenario, batch, hq, hkv, d, new_len, past in SCENARIOS:
        for share in (True, False):
            if scenario == "first prompt" and not share:
                continue                                     # nothing to copy: same as shared
            q, k, v, k_cache, v_cache, seqlens = _inputs(batch, hq, hkv, d, new_len, past, share)
            fused, separate_ops = _prepared(q, k, v, k_cache, v_cache, seqlens, share)
            moved = _bytes_moved(q, k, past, share)
            for impl, fn in (("triton fused", fused), ("pytorch ops", separate_ops)):
                ms = time_ms(fn)
                gbps = moved / (ms * 1e-3) / 1e9
                rows.append(dict(scenario=scenario, buffer="shared" if share else "separate", impl=impl,
                                 B=batch, Hq=hq, Hkv=hkv, D=d, S_new=new_len, past=past, dtype="bfloat16",
                                 ms=round(ms, 5), bytes=moved, GBps=round(gbps, 1),
                                 copy_GBps=round(copy_gbps, 1), fraction_of_copy=round(gbps / copy_gbps, 3)))
            del q, k, v, k_cache, v_cache
            torch.cuda.empty_cache()
    return rows + allocation_rows()


def main() -> int:
    import os
    from pathlib import Path

    from .benchmarking import write_results

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
