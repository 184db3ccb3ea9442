"""The experiments outside the package still build: the Gluon forwards (experiments/flash_hopper_gluon)
compile for sm_90a on a CPU; the one-partition kernel's PTX keeps the overlap it was written for (its
SASS does not: README.md), and the scheduling variants compile with every switch. The tail model
(tail_model.py) fills the SMs as it says."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from load_file import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OVERLAP_IN_PTX = r'''
import sys
sys.path.insert(0, "experiments/flash_hopper_gluon")
import compiled

for overlap in (True, False):
    ptx = compiled.compile_ptx(128, 128, 128, True, 2, 8, overlap)
    report = compiled.ptxas_report(ptx)
    print(overlap, ptx.count("wgmma.wait_group.sync.aligned 1;"), ptx.count("wgmma.wait_group.sync.aligned 0;"),
          report.spill_bytes, report.wgmma_serialised)
'''


@pytest.mark.slow
def test_gluon_forward_waits_for_the_score_product_alone():
    """With OVERLAP the key loop waits for S = Q Kᵀ with the value product still in flight (one
    ``wgmma.wait_group 1``); without it, every wait is for all products. Neither spills nor has its
    matrix products serialised by ptxas."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", OVERLAP_IN_PTX], capture_output=True, text=True, timeout=600,
                            env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split()[0]: [int(x) if x.isdigit() else x for x in line.split()[1:]]
            for line in result.stdout.splitlines()}
    waits_for_one, waits_for_all, spilled, serialised = rows["True"]
    assert waits_for_one >= 1 and waits_for_all >= 1 and spilled == 0 and serialised == "False", rows
    waits_for_one, waits_for_all, spilled, serialised = rows["False"]
    assert waits_for_one == 0 and waits_for_all >= 1 and spilled == 0 and serialised == "False", rows


SCHEDULING_COMPILES = r'''
import sys
sys.path.insert(0, "experiments/flash_hopper_gluon")
import re
import scheduling
from attnkit.analysis.compiled import compile_gluon_ptx, ptxas_report

for d, causal, pingpong, p_smem in ((64, False, True, True), (64, False, True, False), (128, True, True, False)):
    ptx = compile_gluon_ptx(scheduling._attn_fwd_ws, dict(HALF_M=64, BLOCK_N=128, HEAD_DIM=d, CAUSAL=causal, STAGES=2,
                            COMPUTE_REGS=scheduling.COMPUTE_REGISTERS, PINGPONG=pingpong, P_SMEM=p_smem),
                            dict(q_desc=64, k_desc=128, v_desc=128), 4,
                            any_size=("n_heads", "group", "n_q", "n_k", "n_tiles", "head_group", "scheduled"))
    print(d, causal, ptx.count("mbarrier.try_wait"), ptx.count("stmatrix") + ptx.count("st.shared"),
          int(re.search(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+24;", ptx) is not None),
          ptxas_report(ptx).wgmma_serialised)
'''


@pytest.mark.slow
def test_scheduling_variants_compile_with_every_switch():
    """Ping-pong, the persistent loop and P in shared memory compile for sm_90a, warp-specialised
    (producer at 24 registers), products not serialised; P in shared memory stores to it, and ping-pong
    adds mbarrier waits (the causal kernel has more: its turns and its extra loop)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", SCHEDULING_COMPILES], capture_output=True, text=True,
                            timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines()]
    assert [row[:2] for row in rows] == [["64", "False"], ["64", "False"], ["128", "True"]], rows
    for _, _, waits, _, producer, serialised in rows:
        assert int(waits) >= 8 and producer == "1" and serialised == "False", rows
    assert int(rows[0][3]) > int(rows[1][3]), rows       # P written to shared memory: more shared stores


def _tail_model():
    return load_file("experiments/flash_hopper_gluon/tail_model.py")


def test_the_tail_model_fills_sms_in_order_and_every_order_holds_the_same_tiles():
    model = _tail_model()
    assert model.makespan([3, 3, 2, 2, 2], sms=2) == 7          # 3 | 3, then 2 → 5, 2 → 5, 2 → 7
    assert model.makespan([1, 1, 1, 1, 4], sms=2) == 6          # the long one last: 1+1+4 against 1+1
    assert model.makespan([4, 1, 1, 1, 1], sms=2) == 4          # first: 4 against 1+1+1+1
    assert model.makespan([3, 3, 2, 2, 2], sms=3) == 5
    for n_m, heads in ((8, 256), (16, 128), (128, 16)):
        tiles = {name: sorted(lengths) for name, lengths in model.orders(n_m, heads).items()}
        assert len(set(map(tuple, tiles.values()))) == 1        # one set of tiles, other orders
    for n in (1024, 2048, 16384):
        fill = model.fill(n)
        assert all(ratio >= 1 for ratio in fill.values())
        assert fill["longest first overall"] < 1.01 < fill["head by head, shortest first"]
    at_1k = model.fill(1024)
    assert at_1k["longest first in groups of 32 heads"] < 1.02 < at_1k["head by head, longest first"]


def test_static_schedules_run_every_tile_once_and_balance_the_work():
    """The host-built schedules of the persistent variants: every tile exactly once, each program's run
    contiguous in ``starts``; "list" deals the tiles in the head-by-head order, "lpt" longest first, and
    Graham's bound holds (makespan within 4/3 of the average load plus one tile)."""
    pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper")
    sys.path.insert(0, os.path.join(ROOT, "experiments", "flash_hopper_gluon"))
    import scheduling

    for n_q, causal, programs in ((1024, True, 132), (1000, True, 7), (2048, False, 132), (300, True, 1)):
        n_m = -(-n_q // 128)
        n_tiles = n_m * 3 * 5
        cost = [scheduling.tile_blocks(t, n_m, n_q, n_q, 128, 128, causal) + 1.0 for t in range(n_tiles)]
        for order in ("list", "lpt"):
            schedule, starts = scheduling.static_schedule(order, n_tiles, n_m, n_q, n_q, 128, 128, causal, programs)
            assert sorted(schedule) == list(range(n_tiles)) and len(starts) == programs + 1
            assert starts[0] == 0 and starts[-1] == n_tiles and starts == sorted(starts)
            runs = [schedule[starts[p]:starts[p + 1]] for p in range(programs)]
            loads = [sum(cost[t] for t in run) for run in runs]
            assert max(loads) <= sum(cost) / programs + max(cost) + 1e-9
            if order == "lpt":
                assert max(loads) <= 4 / 3 * max(sum(cost) / programs, max(cost)) + 1e-9
                assert all(cost[a] >= cost[b] for run in runs for a, b in zip(run, run[1:]))
            else:
                assert all(a < b for run in runs for a, b in zip(run, run[1:]))
    assert scheduling.tile_blocks(0, 8, 1024, 1024, 128, 128, True) == 8     # causal: longest first
    assert scheduling.tile_blocks(7, 8, 1024, 1024, 128, 128, True) == 1
    assert scheduling.tile_blocks(7, 8, 1024, 1024, 128, 128, False) == 8
    with pytest.raises(ValueError, match="order"):
        scheduling.static_schedule("random", 8, 8, 1024, 1024, 128, 128, True, 2)
