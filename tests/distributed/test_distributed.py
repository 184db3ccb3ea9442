"""Context parallelism on torch.distributed (gloo, CPU processes): ring, all-gather and Ulysses attention,
both layouts, forward and backward, equal to single-process attention for world sizes 2, 3 and 4; the
bytes each collective moves equal the model's count; uneven shards are refused by name."""
import functools
import math
import time

import pytest
import torch
import torch.distributed as dist

from attnkit.distributed import context_parallel as cp
from attnkit.distributed.launch import run_group
from attnkit.reference.attention import attention_ref

CASES = [  # (variant, layout, causal, Hq, Hkv)
    ("ring", "contiguous", False, 4, 4),
    ("ring", "contiguous", True, 4, 2),
    ("ring", "zigzag", True, 4, 1),
    ("all_gather_kv", "contiguous", True, 4, 2),
    ("all_gather_kv", "zigzag", True, 2, 2),
    ("ulysses", "contiguous", False, 12, 12),
    ("ulysses", "zigzag", True, 24, 12),
]
ATTEND = cp.ATTEND


def _inputs(world, hq, hkv, seed, dtype=torch.float64, n_per_chunk=3, d=16):
    gen = torch.Generator().manual_seed(seed)
    n = 2 * world * n_per_chunk                          # a multiple of both layouts' chunk counts
    q = torch.randn(2, hq, n, d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, hkv, n, d, generator=gen, dtype=torch.float64) for _ in range(2))
    do = torch.randn(2, hq, n, d, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype) for t in (q, k, v, do))       # the same numbers in every dtype


def _rank_cases(rank, world, block, dtype, which=None):
    """The cases ``which`` (all by default) on this rank: (o, dq, dk, dv) of its shard."""
    out = {}
    for i, (variant, layout, causal, hq, hkv) in enumerate(CASES):
        if which is not None and i not in which:
            continue
        q, k, v, do = (cp.shard(t, rank, world, layout) for t in _inputs(world, hq, hkv, seed=i, dtype=dtype))
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        o = ATTEND[variant](q, k, v, causal=causal, layout=layout, block=block)
        o.backward(do)
        out[i] = tuple(t.detach() for t in (o, q.grad, k.grad, v.grad))
    return out


def _expected(world, i):
    """Single-process attention on the whole sequence, float64: PyTorch's SDPA and its autograd."""
    variant, layout, causal, hq, hkv = CASES[i]
    q, k, v, do = _inputs(world, hq, hkv, seed=i)
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    group = hq // hkv
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=causal)
    torch.testing.assert_close(o, attention_ref(q, k, v, causal=causal))     # two references agree
    o.backward(do)
    return o.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_all_gather_and_ulysses_equal_one_process_in_float64(world):
    per_rank = run_group(_rank_cases, world, args=("torch", torch.float64))
    for i, (variant, layout, *_rest) in enumerate(CASES):
        expected = _expected(world, i)
        for name, j in (("o", 0), ("dq", 1), ("dk", 2), ("dv", 3)):
            got = cp.unshard([per_rank[r][i][j] for r in range(world)], layout)
            torch.testing.assert_close(got, expected[j].to(got.dtype), rtol=1e-10, atol=1e-10,
                                       msg=f"{variant}/{layout} world {world}: {name}")


@pytest.mark.slow
def test_the_course_kernel_as_the_block_in_float32():
    """flash_attention_forward / _backward (Triton, in the interpreter here) on each block, world 2:
    a causal GQA ring on the contiguous split and an MQA ring on the zig-zag split."""
    which = (1, 2)
    per_rank = run_group(_rank_cases, 2, args=("kernel", torch.float32, which), timeout_s=600)
    for i in which:
        variant, layout, *_rest = CASES[i]
        expected = _expected(2, i)
        for j in range(4):
            got = cp.unshard([per_rank[r][i][j] for r in range(2)], layout)
            torch.testing.assert_close(got.double(), expected[j], rtol=1e-4, atol=1e-4)


def test_zigzag_balances_causal_work():
    for world in (2, 3, 4, 8):
        contiguous, zigzag = cp.causal_work(world, "contiguous"), cp.causal_work(world, "zigzag")
        assert sum(contiguous) == pytest.approx(sum(zigzag)) == pytest.approx(world * world / 2)
        assert contiguous[-1] / contiguous[0] == pytest.approx(2 * world - 1)
        assert max(zigzag) == pytest.approx(min(zigzag))


def test_shard_and_unshard_invert_each_other():
    x = torch.arange(2 * 3 * 24).reshape(2, 3, 24, 1)
    for layout in cp.LAYOUTS:
        for world in (2, 3, 4):
            assert torch.equal(cp.unshard([cp.shard(x, r, world, layout) for r in range(world)], layout), x)
    with pytest.raises(ValueError, match="multiple of 8 chunks"):
        cp.shard(x[:, :, :20], 0, 4, "zigzag")


def test_communication_volume_shrinks_with_the_gqa_ratio():
    kw = dict(batch=1, seq_len=8192, head_dim=128, world_size=4)
    mha = cp.comm_bytes("ring", kv_heads=32, **kw)
    assert mha == 3 * 2 * 32 * 2048 * 128 * 2
    for g in (1, 4, 8):
        assert cp.comm_bytes("ring", kv_heads=32 // g, **kw) * g == mha
        assert cp.comm_bytes("all_gather_kv", kv_heads=32 // g, **kw) * g == mha


def _hang(rank, world):
    if rank == 0:
        dist.recv(torch.empty(1), src=1)                  # rank 1 never sends
    return rank


def test_a_hung_peer_times_out_with_a_clear_error():
    start = time.time()
    with pytest.raises((TimeoutError, RuntimeError), match="did not finish|rank 0 failed"):
        run_group(_hang, 2, timeout_s=5)
    assert time.time() - start < 60


@pytest.mark.parametrize("kw, rule", [({"layout": "striped"}, "layout"), ({"causal": 1}, "causal"),
                                      ({"block": "cuda"}, "block")])
def test_bad_arguments_are_named(kw, rule):
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match=rule):
        cp.ring_attention(q, q, q, **kw)


# ------------------------------------------------------------------------------- tensor parallel
def test_kv_heads_per_gpu_stop_shrinking_at_the_kv_head_count():
    from attnkit.distributed.tensor_parallel import heads_of_rank, kv_heads_per_gpu

    assert [kv_heads_per_gpu(tp, 32, 8) for tp in (1, 2, 4, 8, 16, 32)] == [8, 4, 2, 1, 1, 1]
    assert heads_of_rank(5, 16, 32, 8) == ([10, 11], [2])             # ranks 4..7 share KV head 2
    assert heads_of_rank(1, 2, 32, 8) == (list(range(16, 32)), [4, 5, 6, 7])
    for bad, rule in (((0, 3, 32, 8), "tp"), ((0, 16, 32, 6), "num_q_heads"), ((2, 2, 32, 8), "rank")):
        with pytest.raises(ValueError, match=rule):
            heads_of_rank(*bad)


def test_cache_bytes_per_gpu_for_llama_3_8b():
    from attnkit.distributed.tensor_parallel import kv_cache_bytes_per_gpu
    from attnkit.serving.kv_cache import model_cache_bytes
    from attnkit.serving.model_configs import model

    cfg = model("Llama 3 8B")                                          # 32 layers, Hq 32, Hkv 8, D 128
    full = model_cache_bytes(cfg, tokens=8192)
    assert kv_cache_bytes_per_gpu(cfg, 1, tokens=8192) == full == 2 * 32 * 8 * 128 * 8192 * 2
    assert kv_cache_bytes_per_gpu(cfg, 4, tokens=8192) == full // 4
    assert kv_cache_bytes_per_gpu(cfg, 16, tokens=8192) == full // 8  # replicated past 8 ranks


def _tp_decode(rank, world, prompt, max_new):
    from attnkit.distributed.tensor_parallel import tp_generate
    from attnkit.serving.tinymodel import load_model

    model = load_model()
    return tp_generate(rank, world, model, model.encode(prompt), max_new, stop_token=model.encode("\n")[0])


@pytest.mark.parametrize("world", [2, 4])
def test_tensor_parallel_decode_equals_the_no_cache_model(world):
    """The tiny model has Hq = 4, Hkv = 2: with 2 ranks each holds one KV head, with 4 each KV head
    lives on two ranks (replicated)."""
    from attnkit.serving.tinymodel import greedy_no_cache, load_model

    model = load_model()
    results = run_group(_tp_decode, world, args=("the kernel reads", 12))
    expected, _ = greedy_no_cache(model, model.encode("the kernel reads"), 12, model.encode("\n")[0])
    assert all(r["tokens"] == expected for r in results)
    assert [r["kv_heads"] for r in results] == ([[0], [1]] if world == 2 else [[0], [0], [1], [1]])
    assert len({r["cache_bytes"] for r in results}) == 1


# ------------------------------------------------------------------------------- bytes moved
BYTE_CASES = [("ring", "contiguous", True, 4, 2), ("ring", "zigzag", True, 6, 3),
              ("all_gather_kv", "contiguous", False, 4, 2), ("all_gather_kv", "zigzag", True, 6, 1),
              ("ulysses", "zigzag", True, 12, 6)]


def _counted_bytes(rank, world):
    """Per case: bytes this rank received in the forward and in the backward, counted at the
    torch.distributed calls (float16 inputs: K/V in 2 bytes, the ring's and reduce-scatter's dK/dV in 4),
    and the non-floating calls (the shape check)."""
    from attnkit.distributed.traffic import count_traffic, received_bytes

    out = []
    for variant, layout, causal, hq, hkv in BYTE_CASES:
        q, k, v, do = (cp.shard(t, rank, world, layout)
                       for t in _inputs(world, hq, hkv, seed=0, dtype=torch.float16))
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        with count_traffic() as fwd_log:
            o = ATTEND[variant](q, k, v, causal=causal, layout=layout, block="torch")
        with count_traffic() as bwd_log:
            o.backward(do)
        checks = [(c.op, c.received) for c in fwd_log if not c.floating]
        out.append((received_bytes(fwd_log), received_bytes(bwd_log), checks))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_the_bytes_each_collective_moves_equal_the_model(world):
    counted = run_group(_counted_bytes, world)
    for i, (variant, layout, _causal, hq, hkv) in enumerate(BYTE_CASES):
        kw = dict(batch=2, kv_heads=hkv, q_heads=hq, seq_len=2 * world * 3, head_dim=16, world_size=world,
                  itemsize=2, grad_itemsize=4)
        fwd, both = cp.comm_bytes(variant, **kw), cp.comm_bytes(variant, backward=True, **kw)
        for rank in range(world):
            got_fwd, got_bwd, checks = counted[rank][i]
            where = f"{variant}/{layout}, rank {rank} of {world}"
            assert got_fwd == fwd, f"{where}: forward received {got_fwd} bytes, the model says {fwd}"
            assert got_fwd + got_bwd == both, f"{where}: forward+backward {got_fwd + got_bwd}, model {both}"
            assert checks == [("all_gather", (world - 1) * 5 * 8)]   # the shape check: five int64 per rank


def test_all_gather_backward_is_a_reduce_scatter_and_keeps_no_gathered_kv():
    def ops(rank, world):
        from attnkit.distributed.traffic import count_traffic

        q, k, v, do = (cp.shard(t, rank, world, "contiguous") for t in _inputs(world, 4, 2, seed=1))
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        o = cp.all_gather_kv_attention(q, k, v, causal=True, block="torch")
        saved = sum(t.numel() for t in o.grad_fn.saved_tensors)
        with count_traffic() as log:
            o.backward(do)
        return [c.op for c in log], saved, sum(t.numel() for t in (q, k, v, o)) + o.shape[:3].numel()

    for called, saved, own in run_group(ops, 2):
        assert called == ["all_gather", "reduce_scatter"]
        assert saved == own                  # q, k, v, o and lse of this rank only: no gathered K/V kept


# ------------------------------------------------------------------------------- refused inputs
def _uneven(rank, world, variant):
    n = 6 if rank == 0 else 4
    q = torch.zeros(1, 4, n, 8)
    try:
        ATTEND[variant](q, q, q, block="torch")
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.parametrize("variant", cp.VARIANTS)
def test_uneven_shards_are_refused_by_every_rank_at_once(variant):
    start = time.time()
    messages = run_group(_uneven, 2, args=(variant,), timeout_s=20)
    assert all("rank 0: n=6, rank 1: n=4" in m for m in messages), messages
    assert time.time() - start < 15


def _ulysses_heads(rank, world, hq, hkv):
    q, k = torch.zeros(1, hq, 4, 8), torch.zeros(1, hkv, 4, 8)
    try:
        cp.ulysses_attention(q, k, k, block="torch")
    except ValueError as exc:
        return str(exc)
    return "accepted"


def test_ulysses_needs_heads_divisible_by_the_world_size():
    assert all("Hkv=2 must be multiples of 4" in m for m in run_group(_ulysses_heads, 4, args=(8, 2)))
    assert all("Hq=6 and Hkv=6 must be multiples of 4" in m for m in run_group(_ulysses_heads, 4, args=(6, 6)))
    with pytest.raises(ValueError, match="multiples of 4"):
        cp.comm_bytes("ulysses", batch=1, q_heads=8, kv_heads=2, seq_len=64, head_dim=8, world_size=4)
    with pytest.raises(ValueError, match="q_heads"):
        cp.comm_bytes("ulysses", batch=1, kv_heads=4, seq_len=64, head_dim=8, world_size=4)


def test_the_all_gather_model_counts_a_reduce_scatter_not_an_all_reduce():
    """N = 128k, D = 128, W = 8, MHA with 64 KV heads, fp16 with fp32 gradients: the all-gather's forward
    and backward receive (W − 1)·s·(2e + g_e), the ring's (W − 1)·s·2e + W·s·g_e (s = one rank's K and V)."""
    w, s = 8, 2 * 64 * (131072 // 8) * 128
    kw = dict(batch=1, kv_heads=64, seq_len=131072, head_dim=128, world_size=w, backward=True)
    assert cp.comm_bytes("all_gather_kv", **kw) == (w - 1) * s * (2 * 2 + 4)
    assert cp.comm_bytes("ring", **kw) == (w - 1) * s * 2 * 2 + w * s * 4
    assert cp.comm_bytes("all_gather_kv", **kw) < cp.comm_bytes("ring", **kw)


# ------------------------------------------------------------------------------- the GPU script
def test_the_gpu_script_runs_on_gloo_with_tiny_sizes(tmp_path):
    """scripts/gpu_context_parallel.py --cpu: every scheme checked against one process, every scheme
    timed, the CSV written with its provenance; the ping-pong's rows and fit on two tiny sizes."""
    import csv
    import importlib.util

    from attnkit.distributed import benchmark
    from attnkit.distributed.alpha_beta import fit_alpha_beta

    spec = importlib.util.spec_from_file_location("gpu_cp", cp.__file__.replace(
        "attnkit/distributed/context_parallel.py", "scripts/gpu_context_parallel.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(tmp_path), "--cpu", "--seq-lens", "32", "--repeats", "1", "--skip", "pingpong"]) == 0
    rows = list(csv.DictReader((tmp_path / "bench_context_parallel.csv").open()))
    checks = [r for r in rows if r["kind"] == "check"]
    assert len(checks) == 2 * len(benchmark.SCHEMES) and all(r["ok"] == "True" for r in checks)
    timed = [r for r in rows if r["kind"] == "time"]
    assert {(r["variant"], r["layout"], r["pass_"]) for r in timed} == {
        (v, lay, p) for v, lay in benchmark.SCHEMES for p in ("fwd", "fwd+bwd")}
    assert all(float(r["ms"]) > 0 and r["gpu"] == "cpu" and r["date"] for r in timed)
    assert all(float(r["compute_ms"]) > 0 and float(r["overlap_fraction"]) == pytest.approx(
        float(r["ms"]) / float(r["compute_ms"])) for r in timed)
    pp = run_group(lambda rank, world: benchmark.pingpong_rank(rank, world, sizes=(4096, 1 << 20), repeats=3), 2)[0]
    assert [r["kind"] for r in pp] == ["pingpong", "pingpong", "fit"]
    assert fit_alpha_beta([1e3, 2e3, 3e3], [2e-6, 3e-6, 4e-6]) == pytest.approx((1e-6, 1e9))


def _load_script(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, cp.__file__.replace(
        "attnkit/distributed/context_parallel.py", f"scripts/{name}.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _compute_alone(rank, world):
    """Per scheme: the block calls (shapes, causal) and torch.distributed calls of a forward+backward,
    with communication and inside no_communication()."""
    from attnkit.distributed.traffic import count_traffic

    calls = []
    real_fwd, real_bwd = cp.block_forward_torch, cp.block_backward_torch

    def fwd(q, k, v, causal, scale):
        calls.append(("fwd", tuple(q.shape), tuple(k.shape), causal))
        return real_fwd(q, k, v, causal, scale)

    def bwd(do, q, k, v, o, lse, causal, scale):
        calls.append(("bwd", tuple(q.shape), tuple(k.shape), causal))
        return real_bwd(do, q, k, v, o, lse, causal, scale)

    cp.block_forward_torch, cp.block_backward_torch = fwd, bwd
    out = {}
    for variant, layout in (("ring", "contiguous"), ("ring", "zigzag"), ("all_gather_kv", "zigzag"),
                            ("ulysses", "zigzag")):
        q, k, v, do = (cp.shard(t, rank, world, layout) for t in _inputs(world, 4, 2, seed=0))
        per_mode = []
        for quiet in (False, True):
            calls.clear()
            qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
            states = []                                   # cp.communicating() during the call, then after it
            with count_traffic() as log:
                if quiet:
                    with cp.no_communication():
                        states.append(cp.communicating())
                        o = ATTEND[variant](qs, ks, vs, causal=True, layout=layout, block="torch")
                        o.backward(do)
                else:
                    states.append(cp.communicating())
                    o = ATTEND[variant](qs, ks, vs, causal=True, layout=layout, block="torch")
                    o.backward(do)
            states.append(cp.communicating())
            per_mode.append((list(calls), len(log), qs.grad.shape == qs.shape and ks.grad.shape == ks.shape,
                             tuple(states)))
        out[(variant, layout)] = per_mode
    return out


def test_compute_alone_makes_the_same_block_calls_and_no_distributed_call():
    """The overlap fraction's denominator: inside no_communication() every scheme computes the same
    blocks (shapes and masks, forward and backward) and calls nothing in torch.distributed."""
    for rank, result in enumerate(run_group(_compute_alone, 2)):
        for scheme, ((calls, n_comm, ok, states), (quiet_calls, n_quiet, quiet_ok, quiet_states)) in result.items():
            assert calls and calls == quiet_calls, (rank, scheme)
            assert n_comm > 0 and n_quiet == 0, (rank, scheme, n_comm, n_quiet)
            assert ok and quiet_ok
            assert states == (True, True) and quiet_states == (False, True), (rank, scheme)   # ends with its block


def test_merge_writes_the_rows_of_every_run_under_one_header(tmp_path):
    from attnkit.distributed.benchmark import merge_csvs

    for name, rows in (("a", "kind,world,ms\ntime,2,1.5\n"), ("b", "kind,world,ms,compute_ms\ntime,4,0.9,0.8\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "bench_context_parallel.csv").write_text(rows)
    [path] = merge_csvs(tmp_path / "out", [tmp_path / "a", tmp_path / "b"], ["context_parallel"])
    assert path.read_text().splitlines() == ["kind,world,ms,compute_ms", "time,2,1.5,", "time,4,0.9,0.8"]
    with pytest.raises(ValueError, match="none holds bench_context_parallel_pingpong.csv"):
        merge_csvs(tmp_path / "out", [tmp_path / "a"], ["context_parallel_pingpong"])


def test_the_tensor_parallel_script_runs_on_gloo(tmp_path):
    """scripts/gpu_tensor_parallel.py --cpu: one row per tp (1, the baseline, and 2), tokens equal to the
    plain model's, the first difference empty, the CSV with its provenance."""
    import csv

    script = _load_script("gpu_tensor_parallel")
    assert script.main([str(tmp_path), "--cpu", "--tp", "2", "--new-tokens", "6", "--repeats", "1"]) == 0
    rows = list(csv.DictReader((tmp_path / "bench_tensor_parallel_decode.csv").open()))
    assert [r["tp"] for r in rows] == ["1", "2"]
    assert all(r["tokens_equal"] == "yes" and r["first_difference"] == "" and r["ranks_agree"] == "yes"
               for r in rows)
    assert [r["kv_heads_per_rank"] for r in rows] == ["0/1", "0 1"]
    assert all(float(r["ms_per_token"]) > 0 and r["gpu"] == "cpu" and r["link"] for r in rows)
    assert script.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert script.first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert script.first_difference([1, 2], [1, 2, 3]) == 2
    with pytest.raises(SystemExit):
        script.main([str(tmp_path), "--cpu", "--tp", "3"])                # 3 does not divide 4 query heads
    from attnkit.distributed import recorded as rc

    read = rc.load_tp_decode(tmp_path)
    assert [int(r["tp"]) for r in read] == [1, 2] and read[1]["ms_per_token"] > 0
    text = rc.describe_tp(read)
    assert "cpu, tp = 1, 2, link gloo (loopback); NCCL" in text and "recorded 20" in text


def test_the_overlap_fraction_is_time_over_compute_alone():
    from attnkit.distributed import recorded as rc

    rows = [dict(variant="ring", layout="zigzag", world=2.0, pass_="fwd", N=float(n), ms=ms, compute_ms=c)
            for n, ms, c in ((8192, 3.0, 1.5), (16384, 4.0, 4.0))]
    assert rc.has_overlap(rows)
    assert rc.overlap(rows) == {("ring", "zigzag", 2, "fwd"): {8192: 2.0, 16384: 1.0}}
    old = [{k: v for k, v in r.items() if k != "compute_ms"} for r in rows]      # recorded before compute_ms
    assert not rc.has_overlap(old) and not rc.has_overlap([{**rows[0], "compute_ms": ""}])
    with pytest.raises(ValueError, match="compute_ms"):
        rc.overlap(old)


def test_uneven_shards_are_refused_by_the_benchmark_helper():
    from attnkit.distributed.benchmark import uneven_rank

    for messages in run_group(functools.partial(uneven_rank, block="torch"), 2, timeout_s=20):
        assert set(messages) == set(cp.VARIANTS)
        assert all("rank 0: n=6, rank 1: n=4" in m for m in messages.values()), messages


def test_tp_generate_refuses_a_group_of_another_size():
    def call(rank, world):
        from attnkit.distributed.tensor_parallel import tp_generate
        from attnkit.serving.tinymodel import load_model

        try:
            tp_generate(rank, 4, load_model(), [1, 2], 2)
        except ValueError as exc:
            return str(exc)
        return "accepted"

    assert run_group(call, 2) == ["tp: the process group has 2 ranks, tp=4"] * 2


# ------------------------------------------------------------------------------ recorded runs (recorded.py)
def test_recorded_bytes_per_rank_equal_comm_bytes_and_the_runs_are_described():
    from attnkit.distributed import recorded as rc

    assert rc.bytes_agree(rc.load()[0]) == []                                  # every machine's rows
    times, checks, pingpong = rc.load(gpu="H100")
    assert times and checks and pingpong and all(r["ok"] == "True" for r in checks)
    wrong = [{**times[0], "bytes_per_rank": times[0]["bytes_per_rank"] + 1}]
    assert len(rc.bytes_agree(wrong)) == 1
    text = rc.describe_runs(times, pingpong)
    for part in ("H100", "2 and 4", "18 NVLinks", "NCCL 2.28.9", "torch 2.11.0", "Triton 3.6.0"):
        assert part in text
    assert rc.describe_link("PIX") == "PIX: one PCIe switch"
    lines = rc.describe_each_world(times, checks, pingpong)
    assert [line[:7] for line in lines] == ["W = 2: ", "W = 4: "] and all("H100" in line for line in lines)
    mixed = [{**r, "gpu": "NVIDIA H200"} if int(r["world"]) == 4 else r for r in times]
    assert "H200" not in rc.describe_each_world(mixed)[0] and "H200" in rc.describe_each_world(mixed)[1]
    alpha, beta = rc.fitted(pingpong, 2)
    assert 1e-6 < alpha < 1e-3 and 1e10 < beta < 1e12
    with pytest.raises(ValueError, match="world"):
        rc.fitted(pingpong, 3)


def test_crossover_is_the_smallest_n_from_which_every_longer_n_wins():
    from attnkit.distributed import recorded as rc

    assert rc.crossover({8: 0.5, 16: 1.2, 32: 1.5}) == 16
    assert rc.crossover({8: 1.1, 16: 0.9, 32: 1.5}) == 32          # a win before a loss does not count
    assert rc.crossover({8: 0.5, 16: 1.0}) is None                  # equal is not faster
    times = rc.load(gpu="H100")[0]
    measured = rc.speedups(times)
    assert rc.measured_crossover(times, "ring", "contiguous", 4, "fwd") == rc.crossover(
        measured[("ring", "contiguous", 4, "fwd")])


def test_a_series_over_n_takes_the_rows_of_one_gpu():
    """The recording merges machines (H100s at 8k-128k, H200s at 256k): load(gpu=...) keeps one GPU's rows,
    and the functions that set rows of different N side by side refuse rows of two GPUs."""
    from attnkit.distributed import recorded as rc

    every, _, _ = rc.load()
    assert rc.gpus(every) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    h100, h100_checks, h100_pingpong = rc.load(gpu="H100")
    h200, h200_checks, h200_pingpong = rc.load(gpu="H200")
    assert len(h100) + len(h200) == len(every)
    assert rc.gpus(h100, h100_checks, h100_pingpong) == ["NVIDIA H100 80GB HBM3"] and rc.gpus(h200) == ["NVIDIA H200"]
    assert max(int(r["N"]) for r in h100) == 131072 and {int(r["N"]) for r in h200} == {262144}
    assert h200_checks == [] and h200_pingpong == []          # the 256k runs timed only (--skip check pingpong)
    assert {(r["variant"], r["layout"], int(r["world"]), r["pass_"]) for r in h200} == {
        (v, lay, w, p) for (v, lay) in rc.SCHEMES for w in (2, 4) for p in rc.PASSES}
    for r in h200:                                            # each ratio is within the row's own machine
        assert r["speedup"] == pytest.approx(r["one_device_ms"] / r["ms"])
        assert r["overlap_fraction"] == pytest.approx(r["ms"] / r["compute_ms"])
    assert set(rc.overlap(h200)) == set(rc.speedups(h200)) and len(rc.speedups(h200)) == 16
    for mixed in (rc.speedups, rc.overlap, lambda rows: rc.predicted_speedups(rows, {2: (0, 1e30), 4: (0, 1e30)})):
        with pytest.raises(ValueError, match="more than one GPU"):
            mixed(every)
    for bad in ("A100", "", 100):
        with pytest.raises(ValueError, match="gpu:"):
            rc.load(gpu=bad)


def test_the_docs_table_of_the_256k_rows_is_the_csvs():
    """docs/context_parallel.md's table of the H200 rows, recomputed from the shipped CSV."""
    from pathlib import Path

    from attnkit.distributed import recorded as rc

    h200 = rc.load(gpu="H200")[0]
    model = rc.predicted_speedups(h200, {2: (0.0, 1e30), 4: (0.0, 1e30)})
    row = {(r["variant"], r["layout"], int(r["world"]), r["pass_"]): r for r in h200}
    expected = []
    for (variant, layout), name in rc.SCHEMES.items():
        for w in (2, 4):
            for p in rc.PASSES:
                r = row[(variant, layout, w, p)]
                m = model[(variant, layout, w, p)][int(r["N"])]
                expected.append(f"| {name} | {w} | {p} | {r['one_device_ms']:.0f} | {r['ms']:.0f} | {r['speedup']:.2f} "
                                f"| {m:.2f} | {r['speedup'] / m:.0%} | {r['overlap_fraction']:.2f} |")
    note = (Path(__file__).resolve().parents[2] / "docs" / "context_parallel.md").read_text(encoding="utf-8")
    rows = [line for line in note.splitlines() if line.startswith("| ") and line.split(" | ")[0][2:] in
            {name for name in rc.SCHEMES.values()}]
    assert rows == expected


def test_step_shares_count_the_slowest_ranks_causal_blocks():
    from attnkit.distributed import recorded as rc

    for w in (2, 3, 4, 8):
        contiguous, zigzag = rc.step_shares(w, "contiguous"), rc.step_shares(w, "zigzag")
        assert contiguous == pytest.approx([1 / w**2] + [2 / w**2] * (w - 1))   # the last rank: full blocks
        assert zigzag == pytest.approx([1 / w**2] * w)                          # balanced: 1/W of the work
        assert sum(rc.step_shares(w, "contiguous", causal=False)) == pytest.approx(1 / w)


def test_the_alpha_beta_model_of_a_run():
    from attnkit.distributed import recorded as rc

    shape = dict(batch=1, q_heads=32, kv_heads=8, seq_len=8192, head_dim=128, itemsize=2)
    # a free link: the ring's forward is bounded by the slowest rank's compute, W² / (2W − 1) for contiguous
    for w in (2, 4):
        free = rc.predicted_ms("ring", "contiguous", world=w, one_fwd_ms=1.0, one_bwd_ms=None, alpha=0, beta=1e30,
                               **shape)
        assert 1.0 / free == pytest.approx(w * w / (2 * w - 1))
        zig = rc.predicted_ms("ring", "zigzag", world=w, one_fwd_ms=1.0, one_bwd_ms=None, alpha=0, beta=1e30, **shape)
        assert 1.0 / zig == pytest.approx(w)
    # a slow link: the forward's W − 1 transfers (α + one K/V shard / β each) decide
    shard_bytes = 2 * 8 * 4096 * 128 * 2
    slow = rc.predicted_ms("ring", "zigzag", world=2, one_fwd_ms=1e-6, one_bwd_ms=None, alpha=1e-3, beta=1e9, **shape)
    assert slow == pytest.approx((1e-3 + shard_bytes / 1e9) * 1e3, rel=1e-6)
    # the backward adds its compute and its sends (K, V in bf16 and dK, dV in float32; the last step dK, dV)
    both = rc.predicted_ms("ring", "zigzag", world=2, one_fwd_ms=1e-6, one_bwd_ms=1e-6, alpha=0, beta=1e9, **shape)
    fwd = rc.predicted_ms("ring", "zigzag", world=2, one_fwd_ms=1e-6, one_bwd_ms=None, alpha=0, beta=1e9, **shape)
    assert both - fwd == pytest.approx((shard_bytes * 3 + shard_bytes * 2) / 1e9 * 1e3, rel=1e-3)
    # Ulysses: four all-to-alls of comm_bytes' volume, then the compute of 1/W of the heads
    uly = rc.predicted_ms("ulysses", "zigzag", world=2, one_fwd_ms=2.0, one_bwd_ms=None, alpha=1e-5, beta=1e11, **shape)
    volume = cp.comm_bytes("ulysses", world_size=2, **shape)
    assert uly == pytest.approx((4e-5 + volume / 1e11) * 1e3 + 1.0)
    with pytest.raises(ValueError, match="variant, layout"):
        rc.predicted_ms("ulysses", "contiguous", world=2, one_fwd_ms=1.0, one_bwd_ms=None, alpha=0, beta=1e9, **shape)
    with pytest.raises(ValueError, match="alpha, beta"):
        rc.predicted_ms("ring", "zigzag", world=2, one_fwd_ms=1.0, one_bwd_ms=None, alpha=0, beta=0, **shape)
    times, _, pingpong = rc.load(gpu="H100")
    model = rc.predicted_speedups(times, {w: rc.fitted(pingpong, w) for w in (2, 4)})
    assert set(model) == set(rc.speedups(times))


def _bad_scale(rank, world, variant, scale):
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    try:
        cp.ATTEND[variant](q, q, q, sm_scale=scale, block="torch")
    except ValueError as error:
        return str(error)
    return "accepted"


@pytest.mark.parametrize("variant", ["ring", "all_gather_kv", "ulysses"])
def test_a_scale_that_is_not_positive_and_finite_is_refused(variant):
    for scale in (float("nan"), 0.0, -1.0):
        assert all("sm_scale: expected a positive finite number" in m
                   for m in run_group(_bad_scale, 2, args=(variant, scale))), (variant, scale)


def test_merge_keeps_a_row_that_sees_no_key_empty():
    """Both blocks empty for a row (lse = -inf in each): the merged row is o = 0, lse = -inf, not NaN."""
    o = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    lse = torch.randn(1, 2, 3, dtype=torch.float64)
    lse[0, 1, 2] = -math.inf
    o[0, 1, 2] = 0.0
    o_m, lse_m = cp.merge((o.clone(), lse.clone()), o.clone(), lse.clone())
    assert torch.isfinite(o_m).all() and lse_m[0, 1, 2] == -math.inf and (o_m[0, 1, 2] == 0).all()
    assert torch.allclose(o_m[0, 0], o[0, 0]) and torch.allclose(lse_m[0, 0], lse[0, 0] + math.log(2))


def test_a_check_sees_the_tensor_a_point_to_point_call_sends(monkeypatch):
    """``on_call`` gets a send's tensor as well as a receive's buffer, so a check can judge the layout of
    what a direct dist.isend or dist.send hands over (lab 10: gloo refuses a strided tensor)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from attnkit.distributed import traffic

    real = []
    for name in ("isend", "send", "irecv"):
        monkeypatch.setattr(c10d, name, lambda t, peer, *a, _name=name, **k: real.append(_name))
    seen = []
    strided = torch.zeros(4, 6)[:, ::2]
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)      # the calls' sizes read the world
    try:
        with traffic.count_traffic(on_call=lambda call, buffers, sent: seen.append((call.op, buffers, sent))):
            dist.isend(strided, 1)
            dist.send(strided, 1)
            dist.irecv(strided, 1)
    finally:
        dist.destroy_process_group()
    assert [(op, len(b), len(s)) for op, b, s in seen] == [("isend", 0, 1), ("send", 0, 1), ("irecv", 1, 0)]
    assert seen[0][2][0] is strided and seen[2][1][0] is strided and real == ["isend", "send", "irecv"]
