"""Context and tensor parallelism over NCCL, one GPU per process: runs only where two or more CUDA GPUs are
present (skipped otherwise, with the reason).

- every scheme (ring, zig-zag ring, all-gather K/V, Ulysses), causal and not, GQA, with the course's
  Triton kernels as the block attention: output and dQ, dK, dV against one GPU's ``flash_attention`` on
  the whole sequence within twice the dtype's bound (``attnkit.distributed.benchmark.check_rank``), for
  world sizes 2 and, where the host has them, 4;
- ``no_communication()`` makes no NCCL call and computes the same blocks (what the overlap fraction's
  denominator times);
- uneven shards are refused on every rank with one ValueError naming each rank's length;
- tensor-parallel decode of the capstone's tiny model on 2 and 4 GPUs gives the tokens of one GPU.

NVLink multicast stays off (the machines' rule): NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are set here unless the environment sets them, before any process starts.
"""
import functools
import os

import pytest
import torch

from attnkit.distributed import benchmark, tensor_parallel
from attnkit.distributed import context_parallel as cp
from attnkit.distributed.launch import run_group

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    GPUS < 2, reason=f"NCCL tests need at least 2 CUDA GPUs on this host, found {GPUS}")]
WORLDS = [w for w in (2, 4) if w <= GPUS]
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)


def _nccl(fn, world, timeout_s=600):
    return run_group(fn, world, backend="nccl", timeout_s=timeout_s)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("dtype, heads", [(torch.bfloat16, (8, 4)), (torch.float16, (8, 2))])
def test_every_scheme_equals_one_gpu_forward_and_gradients(world, dtype, heads):
    hq, hkv = heads
    rows = _nccl(functools.partial(benchmark.check_rank, n_total=512 * world, batch=2, hq=hq, hkv=hkv, d=64,
                                   dtype=dtype, block="kernel"), world)[0]
    schemes = {(r["variant"], r["layout"], r["causal"]) for r in rows}
    expected = {(v, lay, c) for v, lay in benchmark.SCHEMES for c in (False, True)
                if v != "ulysses" or (hq % world == 0 and hkv % world == 0)}
    assert schemes == expected
    for r in rows:
        errors = {k: r[k] for k in ("err_o", "err_dq", "err_dk", "err_dv")}
        assert r["ok"] and all(e <= r["bound"] for e in errors.values()), (r["variant"], r["layout"], r["causal"],
                                                                            errors, r["bound"])


def _compute_alone(rank, world):
    """Block calls (shapes) of each scheme with and without communication, and the torch.distributed
    calls made inside no_communication()."""
    from attnkit.distributed.traffic import count_traffic
    from attnkit.kernels import flash

    calls = []
    real_fwd, real_bwd = flash.flash_attention_forward, flash.flash_attention_backward

    def fwd(q, k, v, **kw):
        calls.append(("fwd", tuple(q.shape), tuple(k.shape), kw["causal"]))
        return real_fwd(q, k, v, **kw)

    def bwd(do, q, k, v, o, lse, **kw):
        calls.append(("bwd", tuple(q.shape), tuple(k.shape), kw["causal"]))
        return real_bwd(do, q, k, v, o, lse, **kw)

    flash.flash_attention_forward, flash.flash_attention_backward = fwd, bwd
    device = torch.device("cuda", rank)
    out = {}
    for variant, layout in benchmark.SCHEMES:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (torch.randn(1, h, 256, 64, generator=gen, device=device, dtype=torch.bfloat16)
                   for h in (8, 4, 4))
        per_mode = []
        for quiet in (False, True):
            calls.clear()
            qs, ks, vs = (t.clone().requires_grad_() for t in (q, k, v))
            with count_traffic() as log:
                if quiet:
                    with cp.no_communication():
                        cp.ATTEND[variant](qs, ks, vs, causal=True, layout=layout).sum().backward()
                else:
                    cp.ATTEND[variant](qs, ks, vs, causal=True, layout=layout).sum().backward()
            per_mode.append((list(calls), len(log)))
        out[(variant, layout)] = per_mode
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_compute_alone_makes_the_same_block_calls_and_no_nccl_call(world):
    for rank, result in enumerate(_nccl(_compute_alone, world)):
        for scheme, ((calls, n_comm), (quiet_calls, n_quiet)) in result.items():
            assert calls and calls == quiet_calls, (rank, scheme)
            assert n_comm > 0 and n_quiet == 0, (rank, scheme, n_comm, n_quiet)


@pytest.mark.parametrize("world", WORLDS)
def test_uneven_shards_are_refused_on_every_rank(world):
    per_rank = _nccl(functools.partial(benchmark.uneven_rank, block="kernel"), world, 120)
    lengths = ", ".join(f"rank {r}: n={6 if r == 0 else 4}" for r in range(world))
    for messages in per_rank:
        assert set(messages) == set(cp.VARIANTS)
        for variant, message in messages.items():
            assert message.startswith("q, k, v: every rank's shard must have the same shape"), (variant, message)
            assert lengths in message, (variant, message)


@pytest.mark.parametrize("tp", WORLDS)
def test_tensor_parallel_decode_is_token_exact_against_one_gpu(tp):
    from attnkit.serving.tinymodel import greedy_no_cache, load_model

    model = load_model().to("cuda:0")
    prompt = "the kernel reads"
    expected, _ = greedy_no_cache(model, model.encode(prompt), 48)
    results = _nccl(functools.partial(tensor_parallel.decode_rank, prompt=prompt, max_new_tokens=48, repeats=1), tp)
    assert [r["device"] for r in results] == [f"cuda:{r}" for r in range(tp)]
    for rank, r in enumerate(results):
        assert r["tokens"] == expected, f"rank {rank} of {tp}: tokens differ from one GPU's"
        assert r["kv_heads"] == tensor_parallel.heads_of_rank(rank, tp, 4, 2)[1]
        assert r["ms_per_token"] > 0
