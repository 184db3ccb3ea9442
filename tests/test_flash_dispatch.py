"""The dispatch module of attnkit.kernels.flash: the head-dim table is the one place a head dim's kernels and
configurations come from, and each rule reads it. No kernel runs here (a second or less on a CPU)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.kernels.flash import dispatch, plans
from attnkit.kernels.flash.dispatch import HEAD_DIMS, LAUNCHERS, BlockConfig, HeadDimRules


def _power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


@pytest.mark.parametrize("head_dim", sorted(HEAD_DIMS))
def test_every_row_is_complete_and_launchable(head_dim):
    """Each row names a configuration for every Triton launcher (tiles a power of two, as tl.arange needs);
    the kernels that run at this head dim only (Gluon, FP8, host descriptors) sit at powers of two up to
    128 (TMA boxes and the Gluon layouts), with a configuration for each causal flag."""
    rules = HEAD_DIMS[head_dim]
    for name in LAUNCHERS:
        config = getattr(rules, name)
        assert isinstance(config, BlockConfig) and LAUNCHERS[name][2][head_dim] is config
        assert _power_of_two(config.block_m) and _power_of_two(config.block_n) and config.num_warps in (1, 2, 4, 8)
    assert _power_of_two(rules.untuned.block_m) and _power_of_two(rules.untuned.block_n)
    special = (rules.host_descriptors_from, rules.gluon_forward, rules.gluon_backward, rules.fp8 or None)
    if any(field is not None for field in special):
        assert head_dim == dispatch.padded(head_dim) <= 128
    if rules.gluon_forward is not None:
        assert set(rules.gluon_forward) == set(rules.gluon_forward_from) == {False, True}
    assert (rules.gluon_backward is None) == (rules.gluon_backward_from is None)


def test_a_head_dim_takes_the_row_at_or_above_it():
    """The Triton launchers' row of D is the smallest listed head dim at or above D (a tile is padded to a
    power of two): 8-64 the row of 64, 65-128 of 128, 129-256 of 256; the per-head-dim kernels only at D."""
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
    the launchers' defaults for 65-96 (looked up by the head dim, not the tile's padded 128), the autotuner's
    pruning, the descriptor rule; with Gluon
    fields at a head dim its kernels cannot take, the scope check still refuses by the rule."""
    config = BlockConfig(64, 32, 4, 2)
    row = HeadDimRules(fwd=config, fwd_desc=config, bwd_dkdv=config, bwd_dq=config, bwd_atomic=config,
                       untuned=config, tune_default_alone=True, backward_descriptors=False,
                       host_descriptors_from=2048)
    monkeypatch.setattr(dispatch, "HEAD_DIMS", {**HEAD_DIMS, 96: row})
    assert dispatch.default_config("fwd", 80) is config and dispatch.default_config("fwd", 97) is HEAD_DIMS[128].fwd
    assert dispatch.untuned_forward_config(96) is config and dispatch.head_dim_rules(96).tune_default_alone
    launch = dict(HEAD_DIM=128, HEAD_DIM_V=128, DIM_QK=96, DIM_V=72)     # a launch's constexprs: tiles of 128
    assert dispatch.launch_head_dim(launch) == 96 and dispatch.untuned_configs("fwd", 96, 2)[0] is config
    triton = pytest.importorskip("triton")
    candidates = [triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8)] * 3
    (alone,) = plans.prune_by_head_dim("fwd", candidates, {}, **launch)
    assert (alone.kwargs["BLOCK_M"], alone.kwargs["BLOCK_N"], alone.num_warps) == (64, 32, 4)
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
