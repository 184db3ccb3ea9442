"""The GPU table's per-SM limits and the occupancy rule of lesson 4, against Nsight Compute's recordings."""
import math

import pytest

from attnkit.analysis import iomodel
from attnkit.analysis.iomodel import GPUS, occupancy
from attnkit.bench.recorder import read_results


def test_table_holds_lesson_4s_gpus_with_their_datasheet_bandwidths():
    assert GPUS["A100 SXM 40GB"].hbm_gbs == 1555 and GPUS["A100 SXM 80GB"].hbm_gbs == 2039
    assert GPUS["H100 SXM"].hbm_gbs == 3350 and GPUS["L4"].hbm_gbs == 300 and GPUS["T4"].hbm_gbs == 320
    for g in GPUS.values():
        assert g.boost_ghz > 0 and g.registers_per_sm == 65536
        assert g.smem_kb_per_block <= g.smem_kb_per_sm and 32 * g.max_warps_per_sm <= 2048
    # the roofline plots keep one GPU per generation
    assert set(iomodel.ROOFLINE_GPUS) <= set(GPUS) and "L4" not in iomodel.ROOFLINE_GPUS
    assert round(iomodel.smem_bandwidth(GPUS["A100 SXM 40GB"]) / 1e12, 1) == 19.5


def test_occupancy_matches_the_warps_nsight_compute_saw_active():
    """Each recorded Triton kernel's registers, threads and shared memory give the resident warps; the
    warps Nsight Compute measured active (percent of the SM's 64) never exceed them and come within
    half a percentage point (the tail of the grid runs with fewer)."""
    rows = [r for r in read_results("flash_profile") if r["kernel"].startswith("_attn_fwd")
            or r["kernel"].startswith("_bwd_dkdv") or r["kernel"].startswith("_bwd_dq")]
    assert len(rows) >= 5
    for r in rows:
        occ = occupancy(GPUS["H100 SXM"], int(r["registers"]), int(r["threads_per_block"]),
                        math.ceil(r["shared_kib"] * 1024))
        measured = r["warps_active_pct"] / 100
        assert measured <= occ.fraction + 1e-6 and occ.fraction - measured < 0.005, (r["case"], r["kernel"], occ)


def test_occupancy_names_the_limiting_resource():
    h100 = GPUS["H100 SXM"]
    small = occupancy(h100, 24, 256, 0)                      # 8 warps, no shared memory: warp slots decide
    assert small.blocks_per_sm == 8 and small.limited_by == "warp slots" and small.fraction == 1.0
    regs = occupancy(h100, 128, 256, 16 * 1024)              # 128 × 256 = 32,768 registers: two blocks
    assert regs.blocks_per_sm == 2 and regs.limited_by == "registers"
    smem = occupancy(h100, 64, 128, 100 * 1024)              # 101 KiB with the reserve: two in 228 KiB
    assert smem.blocks_per_sm == 2 and smem.limited_by == "shared memory"
    # registers are given per warp in units of 256: 141 a thread takes 4,608 a warp, not 4,512
    assert occupancy(h100, 141, 128, 0).limits["registers"] == 65536 // (4608 * 4)
    # the T4 (compute capability 7.5) has 32 warp slots and no per-block reserve
    assert occupancy(GPUS["T4"], 32, 1024, 32 * 1024).blocks_per_sm == 1
    assert occupancy(GPUS["T4"], 32, 128, 32 * 1024).limits["shared memory"] == 2


@pytest.mark.parametrize("args, message", [
    ((256, 128, 0), "registers_per_thread"), ((0, 128, 0), "registers_per_thread"),
    ((32, 2048, 0), "threads_per_block"), ((32, 128, 228 * 1024), "smem_bytes_per_block"),
    ((32, 128, -1), "smem_bytes_per_block"), ((32.5, 128, 0), "registers_per_thread")])
def test_occupancy_rejects_impossible_kernels(args, message):
    with pytest.raises(ValueError, match=message):
        occupancy(GPUS["H100 SXM"], *args)


def test_gpu_from_device_reads_the_properties_and_keeps_the_tables_peaks(monkeypatch):
    import types

    import torch

    props = types.SimpleNamespace(name="NVIDIA L4", major=8, minor=9, multi_processor_count=58,
                                  max_threads_per_multi_processor=1536, warp_size=32,
                                  shared_memory_per_multiprocessor=102400, L2_cache_size=48 * 2**20,
                                  total_memory=23_000_000_000)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    g = iomodel.gpu_from_device()
    assert (g.name, g.capability, g.sms, g.max_warps_per_sm, g.smem_kb_per_sm) == ("NVIDIA L4", (8, 9), 58, 48, 100)
    assert g.tensor_tflops == GPUS["L4"].tensor_tflops and g.max_blocks_per_sm == 24
    assert occupancy(g, 32, 128, 0).limits["warp slots"] == 12
    with pytest.raises(ValueError, match="index"):
        iomodel.gpu_from_device(1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        iomodel.gpu_from_device()
