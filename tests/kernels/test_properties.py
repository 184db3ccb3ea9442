"""Property-based tests of the public API under hostile input (Hypothesis), against float64 references.

Each property draws random shapes, dtypes, views (strided, transposed, offset, expanded, column slices of
every index tensor), causal flags, windows, softcaps, scales and page tables, and checks that the call
either gives the float64 reference's answer (NaN exactly where the reference has NaN) or raises a
ValueError -- never a silent wrong answer, never a crash. Memory safety: every buffer a kernel writes is
handed out as a view in the middle of a larger buffer filled with a sentinel; after the call the sentinel
around it must be intact (nothing written out of bounds) and gone from inside it (everything written).
The paged kernels, which read memory through page tables, run in a child process, so that a fault there
fails a test instead of ending the run.

The examples are derandomized (the same inputs on every run) and few and tiny (the kernels run in
Triton's interpreter on a CPU); the module reports how many inputs it tried. ATTNKIT_PROPERTY_EXAMPLES=N
sets every property's number of examples (for a longer run, on a GPU say).
"""
from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from attnkit.kernels.flash import flash_attention, flash_attention_varlen, layout
from attnkit.tolerances import tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL = 4096.0          # exact in fp16 and bf16; no output, log-sum-exp or partial state of these inputs
MARGIN = 16                # sentinel elements before and after every guarded buffer (keeps 16-byte alignment)
TRIED: dict = {}           # property -> inputs tried in this run
# No shrinking: one failing example, printed, is enough (shrinking re-runs interpreted kernels for minutes).
SETTINGS = dict(deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def report_inputs_tried(request):
    yield
    line = "test_properties: inputs tried: " + ", ".join(f"{k} {v}" for k, v in TRIED.items())
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    print(line)


def _count(name: str) -> None:
    TRIED[name] = TRIED.get(name, 0) + 1


# ------------------------------------------------------------------------------------------ guards
@contextmanager
def guarded_buffers(module, name="new_buffer"):
    """module.<name> (the function every output buffer comes from) hands out views inside sentinel-filled
    storage; on exit every view is checked."""
    handed = []
    original = getattr(module, name)

    def guarded(shape, dtype, device):
        n = math.prod(shape)
        storage = torch.full((n + 2 * MARGIN,), SENTINEL, dtype=dtype, device=device)
        handed.append((storage, n))
        return storage[MARGIN:MARGIN + n].view(shape)

    setattr(module, name, guarded)
    try:
        yield handed
    finally:
        setattr(module, name, original)
    for storage, n in handed:
        pad = torch.cat([storage[:MARGIN], storage[MARGIN + n:]]).float()
        assert bool((pad == SENTINEL).all()), "a kernel wrote outside its buffer"
        inside = storage[MARGIN:MARGIN + n].float()
        assert not bool((inside == SENTINEL).any()), "a kernel left part of its buffer unwritten"


def _close(got, ref, dtype, what: str, floor: float = 0.0) -> None:
    """NaN exactly where the float64 reference has NaN; elsewhere ‖got − ref‖ / max(‖ref‖, floor) within
    the dtype's tolerance (``floor``: for a reference that can be ~0, as dq with one key, the norm of
    what its rounding errors scale with)."""
    got = got.detach().float().cpu().double()
    nan_ref = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan_ref), f"{what}: NaN where the reference has none, or not where it has"
    if bool((~nan_ref).any()):
        diff = float((got[~nan_ref] - ref[~nan_ref]).norm())
        err = diff / max(float(ref[~nan_ref].norm()), floor, 1e-300)
        bound = tolerance(dtype, DEVICE)
        assert err <= bound, f"{what}: relative error {err:.3g} > {bound:.1g}"


# ---------------------------------------------------------------------------------------- tensors
VIEWS = ("contiguous", "strided", "transposed", "offset", "expanded")


def _as_view(x: torch.Tensor, how: str) -> torch.Tensor:
    """The values of x (4-D or 3-D) in a tensor laid out as ``how``: every other element of a wider tensor,
    a transposed copy read back through a transpose, a slice at an offset, or (along dim 0, when it has
    one row) an expanded view with stride 0."""
    if how == "strided":
        wide = torch.full((*x.shape[:-1], 2 * x.shape[-1]), float("nan"), dtype=x.dtype, device=x.device)
        view = wide[..., ::2]
    elif how == "transposed":
        view = torch.empty(x.shape[:-3] + (x.shape[-2], x.shape[-3], x.shape[-1]), dtype=x.dtype,
                           device=x.device).transpose(-3, -2)
    elif how == "offset":
        flat = torch.full((x.numel() + 5,), float("nan"), dtype=x.dtype, device=x.device)
        view = flat[5:].view(x.shape)
    elif how == "expanded" and x.shape[0] > 1:
        return x[:1].expand_as(x)             # all rows of dim 0 alias row 0 (the reference sees the same)
    else:
        return x.clone()
    view.copy_(x)
    return view


def _masked_scores64(q, k, v, causal, sm_scale, window, softcap):
    """Scores [B, Hq, Nq, Nk] with softcap and the causal / window mask (aligned to the end) as -inf, and v
    with its heads repeated for the query heads of each group."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * sm_scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    n_q, n_k = s.shape[-2:]
    diagonal = torch.arange(n_k)[None, :] - torch.arange(n_q)[:, None] - (n_k - n_q)
    left, right = window
    right = 0 if causal else right
    visible = torch.ones(n_q, n_k, dtype=torch.bool)
    if right >= 0:
        visible &= diagonal <= right
    if left >= 0:
        visible &= diagonal >= -left
    s = s.masked_fill(~visible, -math.inf)
    return s, v


def _attention64(q, k, v, causal, sm_scale, window, softcap):
    """float64 reference [B, Hq, Nq, Dv] with grouped heads, causal and window aligned to the end, softcap;
    a row that sees no key gives 0; NaN as the course's reference propagates it (docs/semantics.md)."""
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    s, v = _masked_scores64(q, k, v, causal, sm_scale, window, softcap)
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, torch.zeros_like(m), m)
    w = torch.exp(s - m)
    total = w.sum(-1, keepdim=True)
    p = torch.where(total == 0, torch.zeros_like(w), w / total.clamp_min(1e-300))
    return p @ v


def _options(data):
    causal = data.draw(st.booleans(), "causal")
    left = data.draw(st.integers(-1, 9), "left")
    right = data.draw(st.integers(-1, 9), "right")
    softcap = data.draw(st.sampled_from([None, None, 0.5, 5.0, 1e3, 1e8]), "softcap")
    sm_scale = data.draw(st.one_of(st.none(), st.floats(0.05, 3.0)), "sm_scale")
    return causal, (left, right), softcap, sm_scale


# ------------------------------------------------------------------------------------ dense flash
@settings(max_examples=int(os.environ.get("ATTNKIT_PROPERTY_EXAMPLES", 16)), **SETTINGS)
@given(st.data())
def test_flash_attention_matches_float64(data):
    """flash_attention's forward (and in fp32 its gradients) on random shapes, dtypes, views and options."""
    _count("flash_attention")
    b = data.draw(st.integers(1, 2), "B")
    hkv = data.draw(st.integers(1, 2), "Hkv")
    hq = hkv * data.draw(st.sampled_from([1, 2, 3]), "group")
    n_q, n_k = data.draw(st.integers(1, 20), "Nq"), data.draw(st.integers(1, 20), "Nk")
    d = data.draw(st.sampled_from([8, 16, 24, 40]), "D")
    dv = data.draw(st.sampled_from([d, 8, 32]), "Dv")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16]), "dtype")
    causal, window, softcap, sm_scale = _options(data)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), "seed"))
    q = torch.randn(b, hq, n_q, d, generator=gen)
    k = torch.randn(b, hkv, n_k, d, generator=gen)
    v = torch.randn(b, hkv, n_k, dv, generator=gen)
    if data.draw(st.booleans(), "nan_q"):
        q[0, 0, data.draw(st.integers(0, n_q - 1), "nan_row"), 0] = float("nan")   # one poisoned query row
    q, k, v = (_as_view(t.to(DEVICE, dtype), data.draw(st.sampled_from(VIEWS), f"view {name}"))
               for name, t in (("q", q), ("k", k), ("v", v)))
    grads = dtype == torch.float32 and data.draw(st.booleans(), "grads") and not bool(torch.isnan(q).any())
    scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    ref = _attention64(q, k, v, causal, scale, window, softcap)
    leaves = [t.detach().clone().requires_grad_(grads) for t in (q, k, v)] if grads else [q, k, v]
    with guarded_buffers(layout, "new_buffer"):
        o = flash_attention(*leaves, causal=causal, sm_scale=sm_scale, window=window, softcap=softcap)
        if grads:
            do = torch.randn(o.shape, generator=gen).to(DEVICE)
            got_grads = torch.autograd.grad(o, leaves, do)
    assert o.shape == (b, hq, n_q, dv) and o.dtype == dtype
    _close(o, ref, dtype, "out")
    if grads:
        leaves64 = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
        out64 = _attention64_diff(*leaves64, causal, scale, window, softcap)
        ref_grads = torch.autograd.grad(out64, leaves64, do.cpu().double())
        floor = max(float(r.norm()) for r in ref_grads)    # dq (or dk) is ~0 when a row sees one key
        for name, g, r in zip("qkv", got_grads, ref_grads):
            _close(g, r, dtype, f"d{name}", floor)


def _attention64_diff(q, k, v, causal, sm_scale, window, softcap):
    """_attention64 on float64 leaves, differentiable (the same arithmetic, no detach)."""
    s, v = _masked_scores64(q, k, v, causal, sm_scale, window, softcap)
    p = torch.softmax(s, -1).nan_to_num(0.0)                    # rows that see nothing: 0
    return p @ v


# ------------------------------------------------------------------------------------ packed flash
def _index_view(values: list[int], how: str) -> torch.Tensor:
    """int32 ``values`` as a contiguous tensor, one at a storage offset, every other entry of a longer
    tensor, or a column of a [n, 2] tensor (the last two are not contiguous)."""
    t = torch.tensor(values, dtype=torch.int32, device=DEVICE)
    if how == "offset":
        return torch.cat([torch.full((3,), 10 ** 6, dtype=torch.int32, device=DEVICE), t])[3:]
    if how in ("every_other", "column"):
        two = torch.full((len(values), 2), 10 ** 6, dtype=torch.int32, device=DEVICE)
        two[:, 0] = t
        return two[:, 0] if how == "column" else two.flatten()[::2]
    return t


@settings(max_examples=int(os.environ.get("ATTNKIT_PROPERTY_EXAMPLES", 16)), **SETTINGS)
@given(st.data())
def test_flash_attention_varlen_matches_each_sequence(data):
    """flash_attention_varlen on random lengths (empty ones too) and cu_seqlens views: each sequence's rows
    equal the float64 reference of that sequence alone; non-contiguous cu_seqlens are refused."""
    _count("flash_attention_varlen")
    batch = data.draw(st.integers(1, 3), "B")
    lens_q = data.draw(st.lists(st.integers(0, 12), min_size=batch, max_size=batch), "lens_q")
    lens_k = data.draw(st.lists(st.integers(0, 12), min_size=batch, max_size=batch), "lens_k")
    if sum(lens_q) == 0 or sum(lens_k) == 0:
        lens_q[0], lens_k[0] = max(lens_q[0], 1), max(lens_k[0], 1)
    hkv = data.draw(st.integers(1, 2), "Hkv")
    hq = hkv * data.draw(st.sampled_from([1, 2]), "group")
    d = data.draw(st.sampled_from([8, 16, 24]), "D")
    causal, window, softcap, sm_scale = _options(data)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), "seed"))
    q = torch.randn(sum(lens_q), hq, d, generator=gen).to(DEVICE)
    k = torch.randn(sum(lens_k), hkv, d, generator=gen).to(DEVICE)
    v = torch.randn(sum(lens_k), hkv, d, generator=gen).to(DEVICE)
    cu_q = [0, *torch.tensor(lens_q).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(lens_k).cumsum(0).tolist()]
    views = data.draw(st.sampled_from(["contiguous", "offset", "every_other", "column"]), "view q"), \
        data.draw(st.sampled_from(["contiguous", "offset", "contiguous", "column"]), "view k")
    args = (q, k, v, _index_view(cu_q, views[0]), _index_view(cu_k, views[1]), max(max(lens_q), 1),
            max(max(lens_k), 1))
    options = dict(causal=causal, window=window, softcap=softcap, sm_scale=sm_scale)
    if any(view in ("every_other", "column") for view in views):
        with pytest.raises(ValueError, match="must be contiguous"):
            flash_attention_varlen(*args, **options)
        return
    with guarded_buffers(layout, "new_buffer"):
        o = flash_attention_varlen(*args, **options)
    scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    for s in range(batch):
        rows = slice(cu_q[s], cu_q[s + 1])
        if lens_q[s] == 0:
            continue
        if lens_k[s] == 0:
            ref = torch.zeros(lens_q[s], hq, d, dtype=torch.float64)
        else:
            heads = [t[sl].transpose(0, 1)[None] for t, sl in ((q, rows), (k, slice(cu_k[s], cu_k[s + 1])),
                                                                (v, slice(cu_k[s], cu_k[s + 1])))]
            ref = _attention64(*heads, causal, scale, window, softcap)[0].transpose(0, 1)
        _close(o[rows], ref, torch.float32, f"sequence {s}")


# --------------------------------------------------------------------------- paged, in a child process
CHILD = '''
import json, math, os, sys
from contextlib import contextmanager
import torch
from hypothesis import HealthCheck, Phase, given, settings, strategies as st
from attnkit.kernels import paged, paged_extend as extend_module
from attnkit.kernels.paged import paged_decode, paged_decode_ref
from attnkit.kernels.paged_extend import FP8, fp8_scales, paged_extend, paged_extend_ref, quantize_fp8
from attnkit.tolerances import rel_error, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SENTINEL, MARGIN = %(sentinel)r, %(margin)r
SETTINGS = dict(deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TRIED = {"paged_decode": 0, "paged_extend": 0, "bad page ids clamped": 0}
%(guard)s

def close(got, ref, dtype, what):
    got = got.detach().float().cpu().double()
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), what + ": NaN pattern differs"
    ok = ~torch.isnan(ref)
    err = rel_error(got[ok], ref[ok]) if bool(ok.any()) else 0.0
    assert err <= tolerance(dtype, DEVICE), f"{what}: relative error {err:.3g}"


def index_view(t, how):
    """An index tensor (1-D or 2-D int32) as itself, a column of a wider tensor or a transposed copy."""
    if how == "column":
        wide = torch.full((*t.shape, 2), -(10 ** 6), dtype=t.dtype, device=t.device)
        wide[..., 0] = t
        return wide[..., 0]
    if how == "transposed" and t.dim() == 2:
        return t.t().contiguous().t()
    return t


def cache(data, gen, lens, hkv, d, dtype):
    """Pages [num_pages, page, Hkv, D] holding NaN where no sequence stores a token, a permuted table whose
    unused entries hold any int32, and an optional fp8 cache with its scales."""
    page = data.draw(st.sampled_from([1, 2, 4, 8]), "page")
    need = [-(-n // page) for n in lens]
    num_pages = sum(need) + data.draw(st.integers(0, 3), "spare")
    width = max(need) + data.draw(st.integers(0, 2), "extra columns")
    perm = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.randint(-(2 ** 31), 2 ** 31 - 1, (len(lens), width), generator=gen, dtype=torch.int64)
    k = torch.full((num_pages, page, hkv, d), float("nan"))
    v = torch.full((num_pages, page, hkv, d), float("nan"))
    for b, n in enumerate(lens):
        for p in range(need[b]):
            table[b, p] = perm.pop()
            rows = min(page, n - p * page)
            k[table[b, p], :rows] = torch.randn(rows, hkv, d, generator=gen)
            v[table[b, p], :rows] = torch.randn(rows, hkv, d, generator=gen)
    table = table.to(torch.int32)
    scales = {}
    if data.draw(st.booleans(), "fp8 cache"):
        k_scale, v_scale = fp8_scales(k.nan_to_num(0.0)), fp8_scales(v.nan_to_num(0.0))
        k, v = quantize_fp8(k.nan_to_num(0.0), k_scale), quantize_fp8(v.nan_to_num(0.0), v_scale)
        scales = dict(k_scale=k_scale.to(DEVICE), v_scale=v_scale.to(DEVICE))
    else:
        k, v = k.to(dtype), v.to(dtype)
    return k.to(DEVICE), v.to(DEVICE), table.to(DEVICE), need, scales


def break_a_page_id(data, gen, table, need, num_pages):
    """Unchecked, a used page id out of range must be clamped (no fault); strict, it must be refused."""
    b = data.draw(st.integers(0, table.shape[0] - 1), "bad row")
    bad = table.clone()
    bad[b, data.draw(st.integers(0, need[b] - 1), "bad column")] = data.draw(
        st.sampled_from([num_pages, 10 ** 6, -1, -(2 ** 31)]), "bad id")
    return bad


@settings(max_examples=%(n_decode)d, **SETTINGS)
@given(st.data())
def decode(data):
    TRIED["paged_decode"] += 1
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), "seed"))
    batch = data.draw(st.integers(1, 3), "B")
    lens = data.draw(st.lists(st.integers(1, 20), min_size=batch, max_size=batch), "lens")
    hkv = data.draw(st.integers(1, 2), "Hkv")
    hq = hkv * data.draw(st.sampled_from([1, 2, 4]), "group")
    d = data.draw(st.sampled_from([16, 32]), "D")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), "dtype")
    k, v, table, need, scales = cache(data, gen, lens, hkv, d, dtype)
    q = torch.randn(batch, hq, d, generator=gen).to(DEVICE, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    how = data.draw(st.sampled_from(["same", "column", "transposed"]), "index views")
    options = dict(variant=data.draw(st.sampled_from(["grouped", "per_head"]), "variant"),
                   num_splits=data.draw(st.sampled_from([None, 1, 2, 3]), "splits"),
                   window=(data.draw(st.integers(-1, 12), "left"), -1),
                   sm_scale=data.draw(st.one_of(st.none(), st.floats(0.05, 3.0)), "sm_scale"), **scales)
    with guarded_buffers(paged):
        o = paged_decode(q, k, v, index_view(table, how), index_view(seq_lens, how), **options)
    ref = paged_decode_ref(q, k, v, table, seq_lens, sm_scale=options["sm_scale"], window=options["window"],
                           **scales)
    close(o, ref, dtype, "paged_decode")
    if data.draw(st.booleans(), "break a page id"):
        TRIED["bad page ids clamped"] += 1
        bad = break_a_page_id(data, gen, table, need, k.shape[0])
        with guarded_buffers(paged):
            paged_decode(q, k, v, bad, seq_lens, check_values=False, **options)
        try:
            paged_decode(q, k, v, bad, seq_lens, check_values="strict", **options)
        except ValueError as exc:
            assert "block_table" in str(exc)
        else:
            raise AssertionError("a bad page id was accepted by the strict check")


@settings(max_examples=%(n_extend)d, **SETTINGS)
@given(st.data())
def extend(data):
    TRIED["paged_extend"] += 1
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 16), "seed"))
    batch = data.draw(st.integers(1, 3), "B")
    q_lens = data.draw(st.lists(st.integers(0, 6), min_size=batch, max_size=batch), "q_lens")
    if sum(q_lens) == 0:
        q_lens[0] = 1
    lens = [n + data.draw(st.integers(0 if n else 1, 14), "cached") for n in q_lens]
    hkv = data.draw(st.integers(1, 2), "Hkv")
    hq = hkv * data.draw(st.sampled_from([1, 2, 4]), "group")
    d = data.draw(st.sampled_from([16, 24]), "D")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]), "dtype")
    k, v, table, need, scales = cache(data, gen, lens, hkv, d, dtype)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(DEVICE, dtype)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    how = data.draw(st.sampled_from(["same", "column", "transposed"]), "index views")
    options = dict(sm_scale=data.draw(st.one_of(st.none(), st.floats(0.05, 3.0)), "sm_scale"),
                   max_q_len=data.draw(st.sampled_from([None, max(q_lens), max(q_lens) + 5]), "max_q_len"),
                   block_m=data.draw(st.sampled_from([16, 32]), "block_m"),
                   block_n=data.draw(st.sampled_from([16, 32]), "block_n"), **scales)
    with guarded_buffers(extend_module):
        o = paged_extend(q, k, v, index_view(table, how), index_view(seq_lens, how), index_view(cu, how),
                         **options)
    ref = paged_extend_ref(q, k, v, table, seq_lens, cu, sm_scale=options["sm_scale"], **scales)
    close(o, ref, dtype, "paged_extend")
    if data.draw(st.booleans(), "break a page id"):
        TRIED["bad page ids clamped"] += 1
        bad = break_a_page_id(data, gen, table, need, k.shape[0])
        with guarded_buffers(extend_module):
            paged_extend(q, k, v, bad, seq_lens, cu, check_values=False, **options)
        try:
            paged_extend(q, k, v, bad, seq_lens, cu, check_values="strict", **options)
        except ValueError as exc:
            assert "block_table" in str(exc)
        else:
            raise AssertionError("a bad page id was accepted by the strict check")


decode()
extend()
print("TRIED " + json.dumps(TRIED))
'''


def test_paged_kernels_match_float64_in_a_child_process():
    """paged_decode and paged_extend on random page tables (pages out of order, unused entries holding any
    int32, unused slots holding NaN), fp8 caches, windows, splits, tiles and index views; a used page id
    out of range is clamped when unchecked and refused when checked. In a child process: a fault there is
    a failed test (its exit status), not the end of the run."""
    script = CHILD % dict(sentinel=SENTINEL, margin=MARGIN, guard=inspect.getsource(guarded_buffers),
                          n_decode=int(os.environ.get("ATTNKIT_PROPERTY_EXAMPLES", 14)),
                          n_extend=int(os.environ.get("ATTNKIT_PROPERTY_EXAMPLES", 10)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert done.returncode == 0, (f"the child process ended with status {done.returncode} (negative: a signal, "
                                  f"e.g. -11 a segmentation fault)\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    tried = json.loads(done.stdout.strip().splitlines()[-1].removeprefix("TRIED "))
    assert tried["paged_decode"] >= 1 and tried["paged_extend"] >= 1
    TRIED.update(tried)


# ---------------------------------------------------------------------------------------- allocator
def _state(tables, prefix):
    """Everything an operation may change, as plain values."""
    return ({s: list(t) for s, t in tables.tables.items()}, dict(tables.lengths),
            list(tables.allocator.free_list), list(tables.allocator.refcounts), list(prefix.page_of.items()),
            dict(prefix.key_of), prefix.lookup_tokens, prefix.hit_tokens)


@settings(max_examples=int(os.environ.get("ATTNKIT_PROPERTY_EXAMPLES", 60)), **SETTINGS)
@given(st.data())
def test_allocator_operations_are_atomic(data):
    """Random operations on page tables with a prefix cache, bad arguments among them: an operation that
    raises leaves every structure exactly as it was; after each one the page accounting holds."""
    import numpy as np

    from attnkit.serving.allocator import OutOfPagesError, PageTables, PrefixCache

    _count("allocator operations")
    tables = PageTables(num_pages=data.draw(st.integers(1, 8), "pages"), page_size=data.draw(st.integers(1, 3)))
    prefix = PrefixCache(tables)
    contexts: dict = {}
    ids = st.sampled_from([0, 1, 2, 3])
    counts = st.one_of(st.integers(-1, 9), st.just(2.0), st.builds(np.int64, st.integers(0, 5)))
    tokens = st.lists(st.one_of(st.integers(0, 3), st.just(2 ** 31), st.just(1.5)), max_size=10)
    for _ in range(data.draw(st.integers(1, 25), "operations")):
        op = data.draw(st.sampled_from(["add", "reserve", "reserve_many", "fork", "free", "match", "register",
                                        "evict"]))
        before = _state(tables, prefix)
        try:
            if op == "add":
                sid = data.draw(ids)
                tables.add_sequence(sid)
                contexts[sid] = []
            elif op == "reserve":
                sid, n = data.draw(ids), data.draw(counts)
                tables.reserve(sid, n)
                contexts[sid] = contexts.get(sid, []) + [data.draw(st.integers(0, 3)) for _ in range(int(n))]
            elif op == "reserve_many":
                tables.reserve_many(data.draw(st.lists(ids, min_size=1, max_size=3)), data.draw(counts))
                contexts = {s: [0] * tables.lengths[s] for s in tables.tables}
            elif op == "fork":
                src, dst = data.draw(ids), data.draw(ids)
                tables.fork(src, dst)
                contexts[dst] = list(contexts[src])
            elif op == "free":
                tables.free(data.draw(ids))
            elif op == "match":
                sid = data.draw(ids)
                prefix.match(sid, data.draw(tokens))
                contexts[sid] = [0] * tables.lengths[sid]
            elif op == "register":
                sid = data.draw(ids)
                prefix.register(sid, data.draw(st.one_of(st.just(contexts.get(sid, [])), tokens)))
            else:
                prefix.evict(data.draw(st.integers(0, 4)))
        except (ValueError, OutOfPagesError):
            assert _state(tables, prefix) == before, f"{op} raised but changed the cache"
        held = {}
        for table in tables.tables.values():
            for p in table:
                held[p] = held.get(p, 0) + 1
        for p in range(tables.num_pages):
            expected = held.get(p, 0) + (p in prefix.key_of)
            assert tables.allocator.refcount(p) == expected, f"page {p}: count {tables.allocator.refcount(p)}"
            assert (p in tables.allocator.free_list) == (expected == 0)
