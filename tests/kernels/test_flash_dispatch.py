"""The dispatch module of attnkit.kernels.flash: the head-dim table is the one place a head dim's kernels and
configurations come from, and each rule reads it. No kernel runs here (a second or less on a CPU)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.kernels.flash import dispatch
from attnkit.kernels.flash.dispatch import HEAD_DIMS, LAUNCHERS, BlockConfig, HeadDimRules


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@pytest.mark.parametrize("head_dim", sorted(HEAD_DIMS))
def test_every_row_is_complete_and_launchable(head_dim):
    """Each row names a configuration for every Triton launcher (tiles a power of two, as tl.arange needs);
    the kernels that run at this head dim only sit at powers of two: host-built descriptors up to 256 (the
    D = 256 forward's were checked on the GPU: bench_flash_headdims_sweep.csv), Gluon and FP8 up to 128 (their
    layouts), with a configuration for each causal flag."""
    rules = HEAD_DIMS[head_dim]
    for name in LAUNCHERS:
        config = getattr(rules, name)
        assert isinstance(config, BlockConfig) and LAUNCHERS[name][2][head_dim] is config
        assert _power_of_two(config.block_m) and _power_of_two(config.block_n) and config.num_warps in (1, 2, 4, 8)
    assert _power_of_two(rules.untuned.block_m) and _power_of_two(rules.untuned.block_n)
    if rules.host_descriptors_from is not None:
        assert head_dim == dispatch.padded(head_dim)
    if any(field is not None for field in (rules.gluon_forward, rules.gluon_backward, rules.fp8 or None)):
        assert head_dim == dispatch.padded(head_dim) <= 128
    if rules.gluon_forward is not None:
        assert set(rules.gluon_forward) == set(rules.gluon_forward_from) == {False, True}
    assert (rules.gluon_backward is None) == (rules.gluon_backward_from is None)


def test_a_head_dim_takes_the_row_at_or_above_it():
    """The Triton launchers' row of D is the smallest listed head dim at or above D (a tile is padded to a
    power of two): 8-64 the row of 64, 65-128 of 128, 129-192 of 192, 193-256 of 256; the per-head-dim
    kernels only at D."""
    for d in dispatch.SUPPORTED_HEAD_DIMS:
        want = min(key for key in HEAD_DIMS if key >= d)
        assert dispatch.head_dim_rules(d) is HEAD_DIMS[want]
        assert dispatch.default_config("bwd_dq", d) is HEAD_DIMS[want].bwd_dq
        assert dispatch.exact_rules(d) is HEAD_DIMS.get(d)
    assert dispatch.head_dims_with("gluon_forward") == dispatch.head_dims_with("fp8") == (64, 128)
    assert dispatch.MAX_HEAD_DIM == max(HEAD_DIMS) == 256


def test_the_former_hopper_table_reads_the_rows():
    """``attnkit.kernels.flash_hopper.CONFIG`` (a former path, kept for its importers) is the rows' view."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    from attnkit.kernels import flash_hopper

    assert flash_hopper.CONFIG == {(d, causal): HEAD_DIMS[d].gluon_forward[causal]
                                   for d in (64, 128) for causal in (False, True)}


def test_a_new_row_is_all_the_rules_need(monkeypatch):
    """A row added for D = 96 (as docs/adding_a_head_dim.md says) reaches every rule that reads the table:
    the launchers' defaults for 65-96 (looked up by the head dim, not the tile's padded 128), whether they
    autotune, the descriptor rule; with Gluon
    fields at a head dim its kernels cannot take, the scope check still refuses by the rule."""
    config = BlockConfig(64, 32, 4, 2)
    row = HeadDimRules(fwd=config, fwd_desc=config, bwd_dkdv=config, bwd_dq=config, bwd_atomic=config,
                       untuned=config, autotune=False, backward_descriptors=False,
                       host_descriptors_from=2048)
    monkeypatch.setattr(dispatch, "HEAD_DIMS", {**HEAD_DIMS, 96: row})
    assert dispatch.default_config("fwd", 80) is config and dispatch.default_config("fwd", 97) is HEAD_DIMS[128].fwd
    assert dispatch.untuned_forward_config(96) is config and not dispatch.autotuned(96)
    launch = dict(HEAD_DIM=128, HEAD_DIM_V=128, DIM_QK=96, DIM_V=72)     # a launch's constexprs: tiles of 128
    assert dispatch.launch_head_dim(launch) == 96 and dispatch.untuned_configs("fwd", 96, 2)[0] is config
    monkeypatch.setenv("ATTNKIT_AUTOTUNE", "1")
    assert dispatch.autotuned(97) and not dispatch.autotuned(dispatch.launch_head_dim(launch))
    assert dispatch.host_descriptor_choice(False, 96, 4096) == dict(desc=True)
    assert dispatch.host_descriptor_choice(False, 96, 1024) == dict(desc=False)
    assert not dispatch.warp_specialized_choice(True, 96, 8192, 8192)
    assert not dispatch.warp_specialized_backward_choice(96, 8192, 8192)
    q = torch.empty(1, 2, 64, 96, dtype=torch.float16, device="meta")
    assert "use 64 or 128" in dispatch.hopper_unsupported(q, q, q, True)
    with_gluon = dataclasses.replace(row, gluon_forward={False: (64, 128, 2, 2), True: (64, 128, 2, 2)},
                                     gluon_forward_from={False: 1024, True: 1024})
    monkeypatch.setattr(dispatch, "HEAD_DIMS", {**HEAD_DIMS, 96: with_gluon})
    assert dispatch.warp_specialized_choice(True, 96, 8192, 8192)
    assert "sm_90 GPU" in dispatch.hopper_unsupported(q, q, q, True)          # the head dim is in scope now
    q80 = torch.empty(1, 2, 64, 80, dtype=torch.float16, device="meta")
    assert "head dim 80 is not supported by the warp-specialised forward; use 64 or 96 or 128" in \
        dispatch.hopper_unsupported(q80, q80, q80, True)


def test_only_the_gluon_modules_are_loaded_by_name():
    with pytest.raises(ValueError, match=r"name: expected one of \('hopper', 'hopper_backward'\)"):
        dispatch.gluon_module("flash_hopper")


def test_pad_width_covers_65_to_127_on_sm90_only(monkeypatch):
    """The rule (docs/head_dims.md, "Rule: pad 65-127 to 128"): Dv = D from 65 to 127, not packed, where the
    D = 128 row's fast paths can run (sm_90+); every other head dim runs as it is."""
    def qv(d, dv=None):
        return torch.empty(1, 1, 4, d), torch.empty(1, 1, 4, dv or d)

    assert not any(dispatch.pad_width(*qv(d)) for d in range(8, 257))        # the CPU: no descriptors
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    assert [d for d in range(8, 257) if dispatch.pad_width(*qv(d))] == list(range(65, 128))
    assert {dispatch.pad_width(*qv(d)) for d in range(65, 128)} == {128}
    assert dispatch.pad_width(*qv(80, 64)) is None and dispatch.pad_width(*qv(80), packed=True) is None
    assert dispatch.pad_width(*qv(80), causal_forward_alone=True) is None


@pytest.mark.parametrize("d, causal, dtype", [(80, False, torch.float32), (72, True, torch.float32),
                                              (112, True, torch.float16)])
def test_padded_head_dims_match_float64_forward_gradients_and_refuse_second_derivatives(monkeypatch, d, causal,
                                                                                         dtype):
    """Through the padded path (forced here on the CPU): o and dq, dk, dv against float64 attention, GQA,
    Nq < Nk (the causal mask aligned bottom-right), a non-contiguous q, an expanded dO, sizes off the tiles;
    the outputs have the caller's head dim; without a graph o too; gradients of gradients still raise."""
    from attnkit.kernels.flash import flash_attention
    from attnkit.tolerances import assert_close

    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    gen = torch.Generator().manual_seed(d)
    q = torch.randn(1, 2, d, 19, generator=gen).to(dtype).transpose(-1, -2).requires_grad_()   # [1, 2, 19, d]
    k, v = (torch.randn(1, 1, 23, d, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    do = torch.randn(1, 2, 1, d, generator=gen).to(dtype).expand(1, 2, 19, d)     # expanded, stride 0
    o = flash_attention(q, k, v, causal=causal)
    grads = torch.autograd.grad(o, (q, k, v), do)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    mask = torch.ones(19, 23, dtype=torch.bool).tril(23 - 19) if causal else None
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64.repeat_interleave(2, 1),
                                                           v64.repeat_interleave(2, 1), attn_mask=mask)
    refs = torch.autograd.grad(ref, (q64, k64, v64), do.double())
    assert o.shape == (1, 2, 19, d) and all(g.shape == t.shape for g, t in zip(grads, (q, k, v)))
    for name, got, want in zip(("o", "dq", "dk", "dv"), (o, *grads), (ref, *refs)):
        assert_close(got, want, dtype, got.device.type, what=name)
    with torch.no_grad():     # padded where not causal: a causal forward alone runs unpadded
        assert_close(flash_attention(q, k, v, causal=causal), ref, dtype, o.device.type, what="o without a graph")
    dq, = torch.autograd.grad(flash_attention(q, k, v, causal=causal), q, do, create_graph=True)
    with pytest.raises(RuntimeError, match="second derivatives"):
        dq.sum().backward()


def test_descriptors_at_d256_only_for_two_byte_elements(monkeypatch):
    """D = 256's forward moves tiles by host-built descriptors (its row's rule), checked in fp16: float32
    inputs keep pointer tiles there; D = 128 keeps its own rule for every dtype."""
    monkeypatch.setattr(dispatch, "descriptors_supported", lambda device: True)
    rung = dispatch.VARIANTS["host_descriptors"]

    def desc(d, dtype):
        t = torch.empty(1, 2, 64, d, dtype=dtype)
        return dispatch.effective_rung(rung, True, t, t, t, t).desc

    assert desc(256, torch.float16) == desc(256, torch.bfloat16) == desc(128, torch.float32) != 0
    assert desc(256, torch.float32) == 0


@pytest.mark.parametrize("name", sorted(dispatch.LAUNCHERS))
def test_fp32_tiles_stay_within_the_compile_bound_at_every_head_dim(name):
    """fp32 ("ieee") tiles unroll BLOCK_M x BLOCK_N x head-dim FMA code: every choice without autotuning keeps
    the tile within FP32_TILE and, with the padded head dim, within FP32_TILE_PRODUCT; 2-byte tiles keep
    their row's default first."""
    for head_dim in range(8, 257, 8):
        fp32 = dispatch.untuned_configs(name, head_dim, 4)
        width = dispatch.padded(head_dim)
        assert fp32 and all(c.block_m * c.block_n <= dispatch.FP32_TILE
                            and c.block_m * c.block_n * width <= dispatch.FP32_TILE_PRODUCT for c in fp32), head_dim
        assert dispatch.untuned_configs(name, head_dim, 2)[0] == dispatch.default_config(name, head_dim)


def test_fp32_tiles_wider_than_64_do_not_autotune(monkeypatch):
    """The autotuner's candidates are 2-byte tile sizes: past 64 every one is beyond the fp32 compile bound."""
    monkeypatch.setenv("ATTNKIT_AUTOTUNE", "1")
    assert all(not dispatch.autotuned(d, 4) for d in (72, 128, 160, 192, 256))
    assert all(dispatch.autotuned(d, 4) == dispatch.autotuned(d, 2) for d in (16, 40, 64))
    assert dispatch.autotuned(256, 2) == HEAD_DIMS[256].autotune
