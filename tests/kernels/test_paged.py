"""Paged decode (attnkit.kernels.paged) against the float64 reference, on fresh random inputs.

Every case uses a permuted page table (a sequence's pages are scattered over the pool), lengths that
end inside a page, and garbage in the table entries and page slots that a sequence does not use, so
a kernel that reads past a sequence's end or confuses pages and offsets fails. On a CPU the kernels
run in Triton's interpreter (16-token blocks), so the shapes are small.
"""
from __future__ import annotations

import math

import pytest
import torch
from host_syncs import HostSyncs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit.kernels import paged
from attnkit.kernels.paged import (
    VARIANTS,
    choose_num_splits,
    gather_dense,
    merge_partials,
    paged_decode,
    paged_decode_ref,
)
from attnkit.reference.attention import attention_ref
from attnkit.tolerances import rel_error, tolerance

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@pytest.fixture(autouse=True)
def poisoned_buffers(monkeypatch):
    """Every buffer the kernels write starts as NaN: an element left unwritten fails the comparison."""
    def nan_buffer(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(paged, "new_buffer", nan_buffer)


def make_case(gen, lens, *, hq=4, hkv=2, d=16, page_size=8, dtype=torch.float16, spare_pages=3,
              extra_columns=1, device=DEVICE):
    """q [B, hq, d], k/v pages [num_pages, page_size, hkv, d], a permuted block table, seq_lens.

    Unused table entries hold out-of-range ids; unused slots of the last pages and unused pages hold
    NaN (so reading any of them poisons the output).
    """
    batch = len(lens)
    pages_per_seq = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_per_seq) + spare_pages
    width = max(pages_per_seq) + extra_columns

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    q = randn(batch, hq, d)
    k_pages = torch.full((num_pages, page_size, hkv, d), float("nan"))
    v_pages = torch.full((num_pages, page_size, hkv, d), float("nan"))
    order = torch.randperm(num_pages, generator=gen)
    table = torch.full((batch, width), 10 ** 6, dtype=torch.int32)          # never read
    used = 0
    for b, n in enumerate(lens):
        pages = order[used: used + pages_per_seq[b]]
        used += pages_per_seq[b]
        table[b, : len(pages)] = pages.int()
        t = torch.arange(n)
        k_pages[pages[t // page_size], t % page_size] = randn(n, hkv, d)
        v_pages[pages[t // page_size], t % page_size] = randn(n, hkv, d)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    to = dict(device=device, dtype=dtype)
    return q.to(**to), k_pages.to(**to), v_pages.to(**to), table.to(device), seq_lens.to(device)


def check(case, **kwargs):
    o = paged_decode(*case, **kwargs)
    q = case[0]
    assert o.shape == q.shape and o.dtype == q.dtype and o.device == q.device
    err = rel_error(o, paged_decode_ref(*case, sm_scale=kwargs.get("sm_scale")))
    assert err <= tolerance(q.dtype, DEVICE), f"relative error {err:.2e} for {kwargs}"
    return o


# ------------------------------------------------------------------------------------ correctness
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_dtypes_and_variants(dtype, variant):
    gen = torch.Generator().manual_seed(1)
    check(make_case(gen, [37, 9], dtype=dtype, hq=4, hkv=2), variant=variant, num_splits=1)


@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 1), (8, 1), (8, 2), (16, 2)],
                         ids=["mha", "mqa-4", "mqa-8", "gqa-4", "gqa-8"])
def test_gqa_ratios(hq, hkv):
    """Group sizes 1, 4, 8 (GQA) and a single KV head (MQA); query head h reads KV head h // group."""
    gen = torch.Generator().manual_seed(hq * 10 + hkv)
    check(make_case(gen, [21, 5], hq=hq, hkv=hkv))


@pytest.mark.parametrize("num_splits", [2, 3, 5])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_split_kv(num_splits, variant):
    """Splits of whole 16-token blocks; with 5 splits over 3 blocks two splits see no token at all."""
    gen = torch.Generator().manual_seed(num_splits)
    check(make_case(gen, [45, 17, 1]), num_splits=num_splits, variant=variant)


def test_seq_len_one_and_page_size_one():
    gen = torch.Generator().manual_seed(3)
    check(make_case(gen, [1, 1, 2], page_size=1))
    check(make_case(gen, [1, 19], page_size=5), num_splits=2)      # page size not a power of two


def test_sm_scale_and_head_dims():
    gen = torch.Generator().manual_seed(4)
    check(make_case(gen, [23], d=64, hq=2, hkv=1), sm_scale=0.3)
    check(make_case(gen, [17], d=32, hq=2, hkv=2, dtype=torch.float32), num_splits=2)


def test_strided_pages():
    """k_pages / v_pages as views with gaps (one layer of a layer-stacked cache, a sliced head dim)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v, table, lens = make_case(gen, [30, 12], d=32)
    k_wide = torch.cat([k, torch.randn(k.shape, generator=gen).to(k)], dim=-1)[..., :32]   # stride 64 rows
    v_stack = torch.stack([torch.randn(v.shape, generator=gen).to(v), v])[1]
    assert not k_wide.is_contiguous()
    check((q, k_wide, v_stack, table, lens), num_splits=2)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(lens=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       group=st.sampled_from([1, 2, 4]), hkv=st.sampled_from([1, 2]),
       page_size=st.sampled_from([3, 8, 16]), num_splits=st.sampled_from([None, 1, 2, 4]),
       variant=st.sampled_from(list(VARIANTS)), seed=st.integers(0, 2 ** 31 - 1))
def test_property_random_layouts(lens, group, hkv, page_size, num_splits, variant, seed):
    """Any lengths, group sizes, page sizes, split counts and page permutations match the reference."""
    gen = torch.Generator().manual_seed(seed)
    check(make_case(gen, lens, hq=group * hkv, hkv=hkv, page_size=page_size), num_splits=num_splits,
          variant=variant)


def test_gather_to_dense_checkpoint():
    """Gathering each sequence's pages into dense K, V and running ordinary attention gives the same o."""
    gen = torch.Generator().manual_seed(6)
    q, k_pages, v_pages, table, lens = make_case(gen, [13, 29], dtype=torch.float32)
    k, v = gather_dense(k_pages, v_pages, table, lens)                 # [B, Hkv, L, D]
    assert k.shape == (2, 2, 29, 16)
    for b, n in enumerate(lens.tolist()):
        o = attention_ref(q[b, None, :, None, :], k[b, None, :, :n], v[b, None, :, :n])[0, :, 0]
        assert rel_error(o, paged_decode_ref(q, k_pages, v_pages, table, lens)[b]) < 1e-12


def test_merge_partials_matches_float64():
    """Partial (m, ℓ, z) states of disjoint chunks of the keys, one of them empty, merge to softmax·V."""
    gen = torch.Generator().manual_seed(7)
    scores = torch.randn(3, 50, generator=gen, dtype=torch.float64) * 4     # [rows, keys]
    values = torch.randn(50, 8, generator=gen, dtype=torch.float64)
    bounds = [(0, 7), (7, 7), (7, 31), (31, 50)]                            # (7, 7) is empty
    ms, ls, zs = [], [], []
    for lo, hi in bounds:
        s = scores[:, lo:hi]
        m = s.amax(dim=1) if hi > lo else torch.full((3,), -math.inf, dtype=torch.float64)
        p = torch.exp(s - m[:, None]) if hi > lo else s
        ms.append(m), ls.append(p.sum(dim=1)), zs.append(p @ values[lo:hi])
    o = merge_partials(torch.stack(ms, -1), torch.stack(ls, -1), torch.stack(zs, -2))
    assert rel_error(o, torch.softmax(scores, dim=1) @ values) < 1e-13
    # without the rescale by e^(m_s − M) the merge is wrong (the bug lab 08 rejects)
    wrong = torch.stack(zs, -2).sum(-2) / torch.stack(ls, -1).sum(-1)[:, None]
    assert rel_error(wrong, torch.softmax(scores, dim=1) @ values) > 0.1


def test_choose_num_splits(monkeypatch):
    monkeypatch.setattr(paged, "sm_count", lambda device: 132)      # an H100's SMs
    assert choose_num_splits(64, 8, 4096, "cuda") == 1            # 512 programs fill 132 SMs
    assert choose_num_splits(1, 8, 32768, "cuda") == 33           # 8 programs: about 2 per SM
    assert choose_num_splits(1, 8, 1000, "cuda") == 1             # too short to split usefully
    assert choose_num_splits(1, 8, 32768, "cpu") == 1


# ------------------------------------------------------------------------------------ bad inputs
def valid_case():
    gen = torch.Generator().manual_seed(8)
    return list(make_case(gen, [10, 3], page_size=4, spare_pages=0, extra_columns=0))


def replaced(i, value):
    """The valid case with argument i replaced; a tensor goes to the case's device (cuda on a GPU),
    so each case fails on the rule it names, not on a device mismatch."""
    args = valid_case()
    args[i] = value.to(DEVICE) if isinstance(value, torch.Tensor) else value
    return args


BAD = {
    "q rank": (replaced(0, torch.zeros(2, 4, 1, 16, dtype=torch.float16)), "q: expected 3 dimensions"),
    "pages rank": (replaced(1, torch.zeros(4, 4, 32, dtype=torch.float16)), "k_pages: expected 4"),
    "table rank": (replaced(3, torch.zeros(2, dtype=torch.int32)), "block_table: expected 2"),
    "lens rank": (replaced(4, torch.ones(2, 1, dtype=torch.int32)), "seq_lens: expected 1"),
    "not a tensor": (replaced(0, [[1.0]]), "q: expected a torch.Tensor"),
    "empty": (replaced(0, torch.zeros(0, 4, 16, dtype=torch.float16)), "q: every size"),
    "int q": (replaced(0, torch.zeros(2, 4, 16, dtype=torch.int32)), "q: dtype"),
    "dtypes differ": (replaced(1, torch.zeros(4, 4, 2, 16)), "must share one dtype"),
    "table dtype": (replaced(3, torch.zeros(2, 3, dtype=torch.int64)), "block_table: dtype must be torch.int32"),
    "lens dtype": (replaced(4, torch.ones(2, dtype=torch.int64)), "seq_lens: dtype must be torch.int32"),
    "k/v shapes": (replaced(2, torch.zeros(4, 4, 1, 16, dtype=torch.float16)),
                   "k_pages, v_pages: must have the same shape but for the head dim"),
    "head dims": (replaced(0, torch.zeros(2, 4, 32, dtype=torch.float16)), "head dims differ"),
    "head dim": (None, "q: head dim D=4 is not supported; D must be between 8 and 256"),
    "head dim high": (None, "q: head dim D=264 is not supported"),
    "value head dim": (None, "v_pages: head dim Dv=300 is not supported; Dv must be between 8 and 256"),
    "heads": (replaced(0, torch.zeros(2, 3, 16, dtype=torch.float16)), "Hq % Hkv == 0"),
    "table rows": (replaced(3, torch.zeros(3, 3, dtype=torch.int32)), "block_table: needs one row per sequence"),
    "lens rows": (replaced(4, torch.ones(3, dtype=torch.int32)), "seq_lens: needs one length per sequence"),
    "len zero": (replaced(4, torch.tensor([10, 0], dtype=torch.int32)), r"seq_lens: seq_lens\[1\] = 0"),
    "len too long": (replaced(4, torch.tensor([13, 3], dtype=torch.int32)), r"seq_lens\[0\] = 13 is out of range"),
    "page id high": (None, r"block_table\[1, 0\] = 5 is not a page"),
    "page id negative": (None, r"block_table\[0, 2\] = -1 is not a page"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_inputs_raise_value_error(name):
    args, message = BAD[name]
    if name in ("head dim", "head dim high", "value head dim"):
        d, dv = {"head dim": (4, 4), "head dim high": (264, 264), "value head dim": (16, 300)}[name]
        args = valid_case()
        args[0] = torch.zeros(2, 4, d, dtype=torch.float16, device=DEVICE)
        args[1] = torch.zeros(5, 4, 2, d, dtype=torch.float16, device=DEVICE)
        args[2] = torch.zeros(5, 4, 2, dv, dtype=torch.float16, device=DEVICE)
    elif name == "page id high":
        args = valid_case()
        args[3] = args[3].clone()
        args[3][1, 0] = 5
    elif name == "page id negative":
        args = valid_case()
        args[3] = args[3].clone()
        args[3][0, 2] = -1
    with pytest.raises(ValueError, match=message):
        paged_decode(*args, check_values="strict")    # the messages of the host check (CUDA's default is "device")


def test_unused_table_entries_may_hold_anything():
    """Entries past a sequence's last page are not checked and not read."""
    args = valid_case()
    args[3] = torch.cat([args[3], torch.full((2, 2), -7, dtype=torch.int32, device=DEVICE)], dim=1)
    check(tuple(args))


def test_devices_must_match():
    args = valid_case()
    args[4] = args[4].to("meta")
    with pytest.raises(ValueError, match="must be on one device"):
        paged_decode(*args)


@pytest.mark.parametrize("kwargs,message", [
    (dict(sm_scale=0.0), "sm_scale: expected a positive"), (dict(sm_scale=float("nan")), "sm_scale"),
    (dict(num_splits=0), r"num_splits: expected None or an integer in \[1, 256\]"),
    (dict(num_splits=2.0), "num_splits"), (dict(num_splits=True), "num_splits"),
    (dict(variant="fast"), "variant: expected one of"),
])
def test_bad_options_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        paged_decode(*valid_case(), **kwargs)


def test_public_name():
    import attnkit

    assert attnkit.paged_decode is paged_decode


# ------------------------------------------------------------------------- checks without a host sync


def test_device_checks_read_nothing_back_and_report_later(monkeypatch):
    gen = torch.Generator().manual_seed(11)
    good = make_case(gen, [9, 30])
    bad_lens = (*good[:4], torch.tensor([9, 10 ** 4], dtype=torch.int32, device=DEVICE))
    syncs = HostSyncs(monkeypatch)
    paged.check_paged_inputs(*good, check_values="device")
    paged.check_paged_inputs(*bad_lens, check_values="device")
    assert syncs.calls == [], f"the device check read {syncs.calls} back to the host"
    monkeypatch.undo()
    with pytest.raises(ValueError, match="1 of the last 2 calls checked on the device .* The first was "
                                         "paged_decode call 2 of 2: seq_lens"):
        paged.raise_pending_errors()
    paged.raise_pending_errors()                                  # read once: nothing left


def test_a_bad_table_checked_on_the_device_is_clamped_then_reported():
    """No device fault: lengths past the table and page ids past the pool are clamped in the kernel."""
    gen = torch.Generator().manual_seed(12)
    q, k, v, table, lens = make_case(gen, [9, 30], dtype=torch.float32)
    table = table.clone()
    table[1, 1] = 10 ** 6                                         # a used page that does not exist
    o = paged_decode(q, k, v, table, lens, check_values="device")
    assert o.shape == q.shape
    good = paged_decode(q, k, v, *make_case(torch.Generator().manual_seed(12), [9, 30], dtype=torch.float32)[3:],
                        check_values="strict")      # a later valid call reports only its own inputs
    assert good.shape == q.shape
    with pytest.raises(ValueError, match=r"block_table\[1, 1\]"):
        paged_decode(q, k, v, table, lens, check_values="strict")
    with pytest.raises(ValueError, match="The first was paged_decode call 1 of 1: block_table: a used page id"):
        paged.raise_pending_errors()                 # the device call's error, attributed to it


def test_check_values_is_named():
    gen = torch.Generator().manual_seed(13)
    with pytest.raises(ValueError, match="check_values"):
        paged_decode(*make_case(gen, [4]), check_values="sometimes")


def test_device_checks_keep_bounded_state_and_name_the_first_bad_call():
    """300 device-checked calls leave one four-number tensor per device, not 300 flags; the error names
    the first bad call by its index and kernel, and counts the others; reading it resets it in place."""
    from attnkit.kernels import value_checks

    gen = torch.Generator().manual_seed(13)
    good = make_case(gen, [9, 30])
    bad = (*good[:4], torch.tensor([9, 10 ** 4], dtype=torch.int32, device=DEVICE))
    paged.raise_pending_errors()
    for i in range(300):
        paged.check_paged_inputs(*(bad if i in (149, 200) else good), check_values="device")
    assert [tuple(t.shape) for t in value_checks.states().values()] == [(4,)]
    with pytest.raises(ValueError, match="2 of the last 300 calls .* The first was paged_decode call 150 of 300"):
        paged.raise_pending_errors()
    assert [t.tolist() for t in value_checks.states().values()] == [list(value_checks.EMPTY)]
