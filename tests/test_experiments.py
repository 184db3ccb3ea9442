"""The experiments outside the package still build: the Gluon forward (experiments/flash_hopper_gluon)
compiles for sm_90a on a CPU, and its PTX keeps the overlap it was written for."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
