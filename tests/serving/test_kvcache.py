"""KV cache: sizing, the model table, head pooling, and the rotate-and-append kernel against float64.

The kernel runs in Triton's interpreter here (CPU tensors), on small sizes chosen so that nothing is
a multiple of a block: S = 3 new tokens (block 4), D = 24 (block 32), past rows crossing a 16-row block.
"""

import pytest
import torch

import attnkit
from attnkit.kernels import rope_append
from attnkit.reference.attention import attention_ref
from attnkit.reference.rope import apply_rope
from attnkit.serving import kv_cache
from attnkit.serving.model_configs import MODELS, model
from attnkit.tolerances import assert_close, rel_error, tolerance


# ------------------------------------------------------------------------------------------ sizing
def test_kv_cache_bytes_is_the_formula():
    # Llama 2 7B (MHA), 4096 tokens in fp16: 2·32·32·128·4096·2 bytes = exactly 2 GiB
    assert kv_cache.kv_cache_bytes(num_layers=32, num_kv_heads=32, head_dim=128, tokens=4096) == 2 * 2 ** 30
    # Llama 3 8B (GQA, 8 KV heads): 128 KiB per token; batch and dtype multiply
    assert kv_cache.kv_cache_bytes(num_layers=32, num_kv_heads=8, head_dim=128, tokens=1) == 131072
    assert kv_cache.kv_cache_bytes(num_layers=32, num_kv_heads=8, head_dim=128, tokens=1000, dtype_bytes=4,
                             batch=3) == 131072 * 1000 * 2 * 3
    assert kv_cache.kv_cache_bytes(num_layers=1, num_kv_heads=1, head_dim=1, tokens=1, dtype_bytes=1) == 2
    assert attnkit.kv_cache_bytes is kv_cache.kv_cache_bytes


@pytest.mark.parametrize("name", ["num_layers", "num_kv_heads", "head_dim", "tokens", "dtype_bytes", "batch"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8", None])
def test_kv_cache_bytes_rejects_non_positive_or_non_integer_arguments(name, bad):
    args = dict(num_layers=32, num_kv_heads=8, head_dim=128, tokens=1024, dtype_bytes=2, batch=1)
    args[name] = bad
    with pytest.raises(ValueError, match=f"^{name}: "):
        kv_cache.kv_cache_bytes(**args)


def test_the_model_table():
    assert {m.name for m in MODELS} >= {"Llama 2 7B", "Llama 2 70B", "Llama 3 8B", "Llama 3 70B", "Mistral 7B",
                                        "Qwen2.5 7B", "Gemma 2 9B"}
    for m in MODELS:
        assert m.num_q_heads % m.num_kv_heads == 0, m.name
        assert m.source.startswith("https://huggingface.co/") and m.source.endswith("/config.json")
        assert m.kv_bytes_per_token(2) == kv_cache.model_cache_bytes(m, tokens=1)
    assert (model("Llama 2 7B").kind, model("Llama 3 70B").kind, model("Falcon 7B").kind) == ("MHA", "GQA", "MQA")
    assert model("Llama 3 70B").group_size == 8 and model("Qwen2.5 7B").group_size == 7
    assert model("Gemma 2 9B").head_dim == 256
    with pytest.raises(ValueError, match="name: unknown model"):
        model("Llama 5")


def test_max_batch_size():
    llama3 = model("Llama 3 8B")
    per_seq = kv_cache.model_cache_bytes(llama3, tokens=8192)                   # 1 GiB
    assert per_seq == 2 ** 30
    assert kv_cache.max_batch_size(llama3, context=8192, memory_bytes=80 * 2 ** 30) == 80
    assert kv_cache.max_batch_size(llama3, context=8192, memory_bytes=2 ** 30 - 1) == 0
    text = kv_cache.describe_cache(llama3, context=8192, batch=8, dtype_bytes=2, memory_gib=80)
    assert "8.00 GiB" in text and "largest batch in 80 GiB of cache memory: 80" in text


def test_calculator_builds_with_a_fixed_text_form():
    pytest.importorskip("ipywidgets")
    widget = kv_cache.calculator()
    assert repr(widget) == "KV-cache calculator (interactive with a running kernel)"


def test_pool_kv_heads():
    x = torch.randn(2, 8, 5, 4)
    assert torch.equal(kv_cache.pool_kv_heads(x, 8), x)
    assert torch.allclose(kv_cache.pool_kv_heads(x, 1), x.mean(dim=1, keepdim=True))
    pooled = kv_cache.pool_kv_heads(x, 2)
    assert torch.allclose(pooled[:, 1], x[:, 4:8].mean(dim=1))           # heads 4..7 form group 1
    with pytest.raises(ValueError, match="num_kv_heads: must divide"):
        kv_cache.pool_kv_heads(x, 3)


# ------------------------------------------------------------------------------- rotate and append
B, HQ, HKV, D, CACHE = 2, 6, 2, 24, 40


def make(new_len, dtype=torch.float32, seed=0, cache_len=CACHE):
    g = torch.Generator().manual_seed(seed)
    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)
    return (r(B, new_len, HQ, D), r(B, new_len, HKV, D), r(B, new_len, HKV, D),
            r(B, HKV, cache_len, D), r(B, HKV, cache_len, D))


# The operator's three position-id cases. seqlens_k[b] = index of the last token after the update.
CASES = {
    "first prompt": dict(new_len=5, kwargs=lambda: {}),
    "decoding": dict(new_len=1, kwargs=lambda: dict(seqlens_k=torch.tensor([19, 33], dtype=torch.int32))),
    # chunked prefill: 3 new tokens after 17 and 30 cached ones, positions given explicitly (shifted by
    # 2, as after a dropped prefix, so that they differ from the implicit past_len + s)
    "chunked prefill": dict(new_len=3, kwargs=lambda: dict(
        seqlens_k=torch.tensor([19, 32], dtype=torch.int32),
        position_ids=torch.tensor([[19, 20, 21], [32, 33, 34]]))),
}


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("share_buffer", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("mode", ["half", "interleaved"])
@pytest.mark.parametrize("case", list(CASES))
def test_rope_append_matches_the_reference(case, mode, share_buffer, backend):
    spec = CASES[case]
    q, k, v, k_cache, v_cache = make(spec["new_len"], seed=list(CASES).index(case) * 2 + (mode == "half"))
    kwargs = spec["kwargs"]()
    ref_q, ref_k, ref_v = rope_append.rope_append_reference(q, k, v, k_cache, v_cache, share_buffer=share_buffer,
                                                   mode=mode, **kwargs)
    past_k, past_v = k_cache.clone(), v_cache.clone()
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, share_buffer=share_buffer, mode=mode, backend=backend,
                         **kwargs)
    assert out.backend.name == backend
    assert_close(out.q, ref_q, torch.float32, what="q")
    assert_close(out.k_cache, ref_k, torch.float32, what="k cache")
    assert_close(out.v_cache, ref_v, torch.float32, what="v cache")
    if share_buffer:
        assert out.k_cache is k_cache and out.v_cache is v_cache          # written in place
    else:
        assert torch.equal(k_cache, past_k) and torch.equal(v_cache, past_v)   # the past is left alone
        assert out.k_cache.shape[2] == CACHE + spec["new_len"]


def test_the_reference_follows_the_seqlens_k_convention():
    """Decoding with seqlens_k = 541: the new token goes to row 541 and is rotated at position 541."""
    q, k, v, k_cache, v_cache = make(1, cache_len=600)
    seqlens = torch.tensor([541, 0], dtype=torch.int32)
    q_rot, present_k, present_v = rope_append.rope_append_reference(q, k, v, k_cache, v_cache, seqlens_k=seqlens)
    assert torch.equal(present_v[0, :, 541], v[0, 0].double())
    assert torch.equal(present_v[1, :, 0], v[1, 0].double())
    assert torch.equal(present_v[0, :, 542:], v_cache[0, :, 542:].double())     # later rows untouched
    assert torch.allclose(present_k[0, :, 541], apply_rope(k[0, 0].double(), 541))
    assert torch.allclose(q_rot[0, 0], apply_rope(q[0, 0].double(), 541))


def test_explicit_positions_rotate_but_do_not_move_the_write():
    q, k, v, k_cache, v_cache = make(2)
    seqlens = torch.tensor([9, 4], dtype=torch.int32)                      # rows 8, 9 and 3, 4
    pos = torch.tensor([[100, 101], [7, 7]])
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, seqlens_k=seqlens, position_ids=pos, backend="triton")
    assert torch.allclose(out.k_cache[0, :, 8:10].transpose(0, 1), apply_rope(k[0], pos[0][:, None]).float(),
                          atol=1e-5)
    assert torch.allclose(out.k_cache[1, :, 3:5].transpose(0, 1), apply_rope(k[1], pos[1][:, None]).float(),
                          atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("share_buffer", [True, False], ids=["shared", "separate"])
def test_low_precision(dtype, share_buffer):
    q, k, v, k_cache, v_cache = make(3, dtype=dtype, seed=7)
    kwargs = dict(seqlens_k=torch.tensor([10, 25], dtype=torch.int32), share_buffer=share_buffer,
                  mode="interleaved")
    ref = rope_append.rope_append_reference(q, k, v, k_cache, v_cache, **kwargs)
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, backend="triton", **kwargs)
    for got, want in zip((out.q, out.k_cache, out.v_cache), ref):
        assert got.dtype == dtype
        assert_close(got, want, dtype)


def test_strided_inputs_from_a_packed_qkv_tensor():
    """q, k, v as views of one packed [B, S, Hq + 2·Hkv, D] projection output (non-contiguous)."""
    packed = torch.randn(B, 3, HQ + 2 * HKV, D)
    q, k, v = packed[:, :, :HQ], packed[:, :, HQ:HQ + HKV], packed[:, :, HQ + HKV:]
    k_cache, v_cache = torch.randn(B, HKV, CACHE, D), torch.randn(B, HKV, CACHE, D)
    kwargs = dict(seqlens_k=torch.tensor([4, 20], dtype=torch.int32))
    ref = rope_append.rope_append_reference(q, k, v, k_cache, v_cache, **kwargs)
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, backend="triton", **kwargs)
    for got, want in zip((out.q, out.k_cache, out.v_cache), ref):
        assert_close(got, want, torch.float32)


def test_decoding_with_a_growing_cache_equals_full_causal_attention():
    torch.manual_seed(3)
    n, d = 7, 16
    q, k, v = torch.randn(1, n, HQ, d), torch.randn(1, n, HKV, d), torch.randn(1, n, HKV, d)
    k_cache, v_cache = torch.zeros(1, HKV, 12, d), torch.zeros(1, HKV, 12, d)
    prompt = 4
    out = rope_append.rope_append(q[:, :prompt], k[:, :prompt], v[:, :prompt], k_cache, v_cache, backend="triton")
    rows = [attention_ref(out.q.transpose(1, 2), k_cache[:, :, :prompt], v_cache[:, :, :prompt], causal=True)]
    for t in range(prompt, n):                                              # one token at a time
        step = rope_append.rope_append(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], k_cache, v_cache,
                              seqlens_k=torch.tensor([t], dtype=torch.int32), backend="triton")
        rows.append(attention_ref(step.q.transpose(1, 2), k_cache[:, :, :t + 1], v_cache[:, :, :t + 1]))
    incremental = torch.cat(rows, dim=2)                                    # [1, Hq, n, d]
    pos = torch.arange(n)[:, None]
    full = attention_ref(apply_rope(q, pos).transpose(1, 2), apply_rope(k, pos).transpose(1, 2),
                         v.transpose(1, 2), causal=True)
    assert rel_error(incremental, full) <= tolerance(torch.float32)


# ------------------------------------------------------------------------------------ backend choice
def test_choose_backend(monkeypatch):
    monkeypatch.delenv(rope_append.DISABLE_ENV, raising=False)
    q = torch.randn(1, 1, 4, 64, dtype=torch.float16)
    assert rope_append.choose_backend(q).name == "triton"
    assert str(rope_append.choose_backend(q)) == ("Triton kernel: dtype float16 is supported; "
                                                  "head size 64 is supported; the device runs Triton")
    assert rope_append.choose_backend(q.double()).reasons == ("dtype float64 is not supported",)
    assert rope_append.choose_backend(torch.randn(1, 1, 4, 20)).reasons == (
        "head size 20 is not a multiple of 8 in 8..256",)
    assert rope_append.choose_backend(q, capability=(7, 5)).reasons == ("compute capability sm_75 is below sm_80",)
    assert rope_append.choose_backend(q, capability=(9, 0)).name == "triton"
    monkeypatch.setenv(rope_append.DISABLE_ENV, "1")
    assert rope_append.choose_backend(q).name == "torch"
    assert rope_append.choose_backend(q).reasons == (f"{rope_append.DISABLE_ENV}=1 forces the fallback",)


def test_the_fallback_runs_and_agrees(monkeypatch):
    monkeypatch.setenv(rope_append.DISABLE_ENV, "1")
    q, k, v, k_cache, v_cache = make(2)
    kwargs = dict(seqlens_k=torch.tensor([5, 6], dtype=torch.int32))
    ref = rope_append.rope_append_reference(q, k, v, k_cache, v_cache, **kwargs)
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, **kwargs)
    assert out.backend.name == "torch"
    for got, want in zip((out.q, out.k_cache, out.v_cache), ref):
        assert_close(got, want, torch.float32)
    # float64 inputs always take the fallback
    q, k, v, k_cache, v_cache = (t.double() for t in make(2))
    monkeypatch.delenv(rope_append.DISABLE_ENV)
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, **kwargs)
    assert out.backend.name == "torch" and rel_error(out.q, rope_append.rope_append_reference(
        q, k, v, k_cache, v_cache, **kwargs)[0]) < 1e-12


# ------------------------------------------------------------------------------------------ errors
def _call(**changes):
    q, k, v, k_cache, v_cache = make(2)
    args = dict(q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache)
    args.update({key: val for key, val in changes.items() if key in args})
    kwargs = {key: val for key, val in changes.items() if key not in args}
    rope_append.rope_append(**args, **kwargs)


@pytest.mark.parametrize("changes, message", [
    (dict(seqlens_k=torch.tensor([0, 5], dtype=torch.int32)), r"seqlens_k: seqlens_k\[0\] = 0 .* must be >= S - 1 = 1"),
    (dict(seqlens_k=torch.tensor([40, 5], dtype=torch.int32)), "k_cache: sequence 0 needs 41 rows"),
    (dict(seqlens_k=torch.tensor([3.0, 5.0])), "seqlens_k: expected an int32 or int64 tensor"),
    (dict(k=torch.randn(B, 2, 4, D), v=torch.randn(B, 2, 4, D)), r"Hq % Hkv == 0"),
    (dict(v=torch.randn(B, 2, HKV, D).half()), "must share one dtype"),
    (dict(q=torch.randn(B, 2, HQ, D - 1)), "q, k: must agree"),
    (dict(k_cache=torch.randn(B, HKV, CACHE, D, 1)), "k_cache: expected 4 dimensions"),
    (dict(position_ids=torch.tensor([1, 2])), "position_ids: expected an int32 or int64 tensor"),
    (dict(position_ids=torch.tensor([[0, -1], [0, 1]])), "position_ids: must be >= 0"),
    (dict(share_buffer=False, total_sequence_length=1), "total_sequence_length: expected an integer >="),
    (dict(mode="rotate"), "mode: expected one of"),
    (dict(backend="cuda"), "backend: expected"),
    (dict(cos_cache=torch.ones(3, D // 2), sin_cache=torch.zeros(3, D // 2),
          seqlens_k=torch.tensor([5, 5], dtype=torch.int32)), "cos_cache: position 5 needs row 5"),
])
def test_bad_input_gets_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=message):
        _call(**changes)


def test_odd_head_dim_is_rejected():
    q, k, v = torch.randn(1, 1, 2, 7), torch.randn(1, 1, 1, 7), torch.randn(1, 1, 1, 7)
    with pytest.raises(ValueError, match="head dim must be even"):
        rope_append.rope_append(q, k, v, torch.zeros(1, 1, 4, 7), torch.zeros(1, 1, 4, 7))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_separate_buffer_when_the_past_fills_its_buffer(backend):
    """Every sequence's past is the whole past buffer (the PyTorch path then copies it in one go)."""
    q, k, v, k_cache, v_cache = make(2, cache_len=18)
    kwargs = dict(seqlens_k=torch.tensor([19, 19], dtype=torch.int32), share_buffer=False, mode="half")
    ref = rope_append.rope_append_reference(q, k, v, k_cache, v_cache, **kwargs)
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, backend=backend, **kwargs)
    for got, want in zip((out.q, out.k_cache, out.v_cache), ref):
        assert_close(got, want, torch.float32)


def test_calculator_reacts_to_its_controls():
    pytest.importorskip("ipywidgets")
    widget = kv_cache.calculator(model="Llama 2 7B", context=4096, batch=1)
    result = widget.children[-1]
    assert "2.00 GiB" in result.value                                     # 2·32·32·128·4096·2 bytes
    widget.children[2].value = 3                                          # the batch slider
    assert "6.00 GiB" in result.value


# ------------------------------------------------------------------ the layout benchmark's code paths
@pytest.mark.parametrize("new_len, past", [(1, 18), (3, 17)], ids=["decode", "chunked prefill"])
def test_benchmarks_append_into_a_bsnh_stored_cache_writes_what_the_bnsh_one_does(new_len, past):
    """bench_kvcache's layout rows: the timed fused update, into a cache stored BNSH and one stored BSNH."""
    from attnkit.bench import cache_append as bench

    results = {}
    for layout in bench.LAYOUTS:
        where = "cuda" if torch.cuda.is_available() else "cpu"    # the timed path takes the kernel's device
        q, k, v, k_cache, v_cache, seqlens = bench.append_inputs(2, HQ, HKV, D, new_len, past, True,
                                                           dtype=torch.float32, device=where, layout=layout)
        if layout == "BSNH":     # the memory is [B, S, Hkv, D]; the kernel sees a [B, Hkv, S, D] view
            assert k_cache.stride() == (k_cache.shape[2] * HKV * D, D, HKV * D, 1)
        ref = rope_append.rope_append_reference(q, k, v, k_cache, v_cache, seqlens_k=seqlens)
        fused, _ = bench.prepared_appends(q, k, v, k_cache, v_cache, seqlens, True)
        q_out, present_k, present_v = fused()
        assert present_k is k_cache and present_v is v_cache                # written in place, through the view
        for got, want in zip((q_out, present_k, present_v), ref):
            assert_close(got, want, torch.float32)
        results[layout] = [t.clone() for t in (q_out, present_k, present_v)]
    for bnsh, bsnh in zip(results["BNSH"], results["BSNH"]):
        assert torch.equal(bnsh, bsnh)


def test_stored_as_keeps_the_values_and_rejects_unknown_layouts():
    from attnkit.bench import cache_append as bench

    cache = torch.randn(2, HKV, 5, D)
    assert torch.equal(bench.stored_as(cache, "BNSH"), cache) and torch.equal(bench.stored_as(cache, "BSNH"), cache)
    assert bench.stored_as(cache, "BSNH").transpose(1, 2).is_contiguous()
    with pytest.raises(ValueError, match="layout: expected one of"):
        bench.stored_as(cache, "SBNH")


@pytest.mark.parametrize("layout", ["BNSH", "BSNH"])
def test_benchmarks_key_read_computes_the_scores_in_either_layout(layout):
    from attnkit.bench import cache_append as bench

    g = torch.Generator().manual_seed(4)
    keys = bench.stored_as(torch.randn(3, HKV, 37, D, generator=g), layout)      # 37 rows: not a block multiple
    query = torch.randn(3, HKV, D, generator=g)
    got = bench.key_scores(keys, query, block_s=16)
    want = torch.einsum("bhsd,bhd->bhs", keys.double(), query.double())
    assert got.shape == (3, HKV, 37)
    assert_close(got, want, torch.float32)
    with pytest.raises(ValueError, match="q: expected"):
        bench.key_scores(keys, query[:, :1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_rope_append_runs_more_pairs_than_one_grid_axis_holds():
    """1024 decoding sequences of 64 query and 8 KV heads: 73,728 (sequence, head) pairs, past the 65,535
    programs one axis of a CUDA grid holds (the kernel runs heads along one axis, sequences along another):
    every head of every sequence as the reference has it."""
    g = torch.Generator().manual_seed(5)
    b, hq, hkv, d, cache = 1024, 64, 8, 32, 8

    def r(*shape):
        return torch.randn(*shape, generator=g).cuda()
    q, k, v = r(b, 1, hq, d), r(b, 1, hkv, d), r(b, 1, hkv, d)
    k_cache, v_cache = r(b, hkv, cache, d), r(b, hkv, cache, d)
    seqlens = torch.randint(0, cache, (b,), generator=g, dtype=torch.int32).cuda()
    ref_q, ref_k, ref_v = rope_append.rope_append_reference(q, k, v, k_cache.clone(), v_cache.clone(),
                                                            seqlens_k=seqlens)
    out = rope_append.rope_append(q, k, v, k_cache, v_cache, seqlens_k=seqlens, backend="triton")
    assert_close(out.q, ref_q, torch.float32, what="q")
    assert_close(out.k_cache, ref_k, torch.float32, what="k cache")
    assert_close(out.v_cache, ref_v, torch.float32, what="v cache")


def test_more_sequences_or_heads_than_one_grid_axis_holds_are_refused():
    """The kernel's grid runs sequences along one axis: 65,536 of them are refused, naming the rule (any
    backend: one rule for the operator)."""
    q, k, v, k_cache, v_cache = (t[:1].expand(65536, *t.shape[1:]) for t in make(1))
    with pytest.raises(ValueError, match=r"q: batch B = 65536 is more than one launch runs \(65535"):
        rope_append.rope_append(q, k, v, k_cache, v_cache, share_buffer=False, backend="torch")


def test_kv_cache_bytes_takes_numpy_integers_without_wrapping():
    """NumPy's int64 wraps past 2**63; the product is taken in Python integers."""
    import numpy as np

    args = dict(num_layers=np.int64(80), num_kv_heads=np.int64(64), head_dim=np.int32(128), tokens=2 ** 40,
                dtype_bytes=np.int64(2), batch=np.int64(8))
    got = kv_cache.kv_cache_bytes(**args)
    assert type(got) is int and got == 2 * 80 * 64 * 128 * 2 ** 40 * 2 * 8 > 2 ** 63
    with pytest.raises(ValueError, match="tokens: expected a positive integer"):
        kv_cache.kv_cache_bytes(**{**args, "tokens": np.float64(4.0)})
