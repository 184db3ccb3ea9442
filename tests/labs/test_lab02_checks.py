"""Lab 02's checks: every plausible wrong count is rejected on every one of 50 seeds, several correct
ways of writing each answer are accepted on every seed, the solution passes and the blank lab reports
"not implemented yet"."""
import math

import nbformat
import numpy as np
import pytest
from mutation import SEEDS, assert_accepted, assert_rejected_on_every_seed

from attnkit.bench import iomodel
from attnkit.classroom.checking import NOT_IMPLEMENTED, PASSED
from attnkit.classroom.labchecks import lab02
from attnkit.classroom.notebooks import ROOT

SOLUTION, LAB = "solutions/lab02_io_bound.ipynb", "labs/lab02_io_bound.ipynb"


def _namespace(relpath: str) -> dict:
    """The notebook's code cells, except the setup cell and the check cells, run in a fresh namespace."""
    nb = nbformat.read(ROOT / relpath, as_version=4)
    namespace: dict = {}
    for source in [c.source for c in nb.cells if c.cell_type == "code"][1:]:
        if "lab02.check" not in source:
            exec(compile(source, relpath, "exec"), namespace)
    return namespace


# ---------------------------------------------------------------------------------- matmul_cost
MATMUL_WRONG = {
    "one FLOP per multiply-add": lambda b, m, n, k, e: (b * m * n * k, e * b * (m * k + k * n + m * n)),
    "C not written": lambda b, m, n, k, e: (2 * b * m * n * k, e * b * (m * k + k * n)),
    "C read and written": lambda b, m, n, k, e: (2 * b * m * n * k, e * b * (m * k + k * n + 2 * m * n)),
    "elements, not bytes": lambda b, m, n, k, e: (2 * b * m * n * k, b * (m * k + k * n + m * n)),
    "batch left out of the bytes": lambda b, m, n, k, e: (2 * b * m * n * k, e * (m * k + k * n + m * n)),
    "batch left out of the FLOPs": lambda b, m, n, k, e: (2 * m * n * k, e * b * (m * k + k * n + m * n)),
    "B taken as m×k": lambda b, m, n, k, e: (2 * b * m * n * k, e * b * (2 * m * k + m * n)),
    "C taken as m×k": lambda b, m, n, k, e: (2 * b * m * n * k, e * b * (m * k + k * n + m * k)),
    "exact count 2k−1 per output": lambda b, m, n, k, e: (b * m * n * (2 * k - 1), e * b * (m * k + k * n + m * n)),
    "bits instead of bytes": lambda b, m, n, k, e: (2 * b * m * n * k, 8 * e * b * (m * k + k * n + m * n)),
    "bytes and FLOPs swapped": lambda b, m, n, k, e: (e * b * (m * k + k * n + m * n), 2 * b * m * n * k),
    # Types: the lab asks for a tuple of two numbers.
    "counts formatted as strings": lambda b, m, n, k, e: (f"{2 * b * m * n * k}", f"{e * b * (m * k + k * n + m * n)}"),
    "one NumPy array [flops, bytes]": lambda b, m, n, k, e: np.array([2 * b * m * n * k,
                                                                      e * b * (m * k + k * n + m * n)]),
}


def _matmul_loops(b, m, n, k, e):
    flops = nbytes = 0
    for _ in range(b):                                   # one product after the other
        flops += m * n * 2 * k                           # m·n outputs, k multiply-adds each
        for rows, cols in ((m, k), (k, n), (m, n)):      # read A, read B, write C
            nbytes += e * rows * cols
    return flops, nbytes


def _matmul_numpy(b, m, n, k, e):
    import numpy as np

    shapes = np.array([[m, k], [k, n], [m, n]], dtype=np.int64)
    return float(2 * b * m * n * k), float(e * b * shapes.prod(axis=1).sum())


MATMUL_RIGHT = {"loops": _matmul_loops, "numpy shapes": _matmul_numpy,
                "per product, then batch": lambda b, m, n, k, e: tuple(
                    b * x for x in (2 * m * n * k, e * (m * k + k * n + m * n)))}


# --------------------------------------------------------------------------- flash_forward_cost
def _flash(tiles_fn=None, *, flops_factor=4, q_o=2, kv=2, heads_in_bytes=True, use_itemsize=True):
    def cost(b, h, nq, nk, d, bq, e):
        tiles = -(-nq // bq) if tiles_fn is None else tiles_fn(nq, bq)
        nbytes = (e if use_itemsize else 1) * b * (h if heads_in_bytes else 1) * (q_o * nq * d + tiles * kv * nk * d)
        return flops_factor * b * h * nq * nk * d, nbytes
    return cost


FLASH_WRONG = {
    "floor instead of ceiling": _flash(lambda nq, bq: nq // bq),
    "floor, at least one tile": _flash(lambda nq, bq: max(1, nq // bq)),
    "K and V read once": _flash(lambda nq, bq: 1),
    "K and V read once per query row": _flash(lambda nq, bq: nq),
    "only one product counted": _flash(flops_factor=2),
    "O not written": _flash(q_o=1),
    "V forgotten": _flash(kv=1),
    "heads left out of the bytes": _flash(heads_in_bytes=False),
    "elements, not bytes": _flash(use_itemsize=False),
    "round(n_q / block_q)": _flash(lambda nq, bq: round(nq / bq)),
    "tiles over n_k": lambda b, h, nq, nk, d, bq, e: (4 * b * h * nq * nk * d,
                                                      e * b * h * (2 * nq * d + -(-nk // bq) * 2 * nk * d)),
}


def _flash_loop(b, h, nq, nk, d, bq, e):
    nbytes = 0
    for start in range(0, nq, bq):                      # one program per query tile
        rows = min(bq, nq - start)
        nbytes += e * (2 * rows * d + 2 * nk * d)       # its Q and O rows, all of K and V
    return 4 * b * h * nq * nk * d, b * h * nbytes


FLASH_RIGHT = {"loop over tiles": _flash_loop,
               "math.ceil": lambda b, h, nq, nk, d, bq, e: (
                   4 * b * h * nq * nk * d, e * b * h * (2 * nq * d + math.ceil(nq / bq) * 2 * nk * d))}


# ---------------------------------------------------------------------------------- decode_cost
def _decode(*, cache_heads="kv", kv=2, q_o=2, flops_heads="q", ctx_extra=0, use_batch=True):
    def cost(b, hq, hkv, ctx, d, e):
        ch = {"kv": hkv, "q": hq}[cache_heads]
        fh = {"kv": hkv, "q": hq}[flops_heads]
        bb = b if use_batch else 1
        return 4 * b * fh * ctx * d, e * bb * (q_o * hq * d + kv * ch * (ctx + ctx_extra) * d)
    return cost


DECODE_WRONG = {
    "cache read once per query head": _decode(cache_heads="q"),
    "V forgotten": _decode(kv=1),
    "q and o forgotten": _decode(q_o=0),
    "FLOPs per KV head": _decode(flops_heads="kv"),
    "context + 1 (the new token counted twice)": _decode(ctx_extra=1),
    "batch left out of the bytes": _decode(use_batch=False),
    "elements, not bytes": lambda b, hq, hkv, ctx, d, e: (4 * b * hq * ctx * d,
                                                         b * (2 * hq * d + 2 * hkv * ctx * d)),
    "one product counted": lambda b, hq, hkv, ctx, d, e: (2 * b * hq * ctx * d,
                                                         e * b * (2 * hq * d + 2 * hkv * ctx * d)),
    "q only, o forgotten": _decode(q_o=1),
}

DECODE_RIGHT = {
    "by tensor": lambda b, hq, hkv, ctx, d, e: (
        b * hq * (2 * ctx * d + 2 * ctx * d),
        sum(e * b * x for x in (hq * d, hkv * ctx * d, hkv * ctx * d, hq * d))),
    "per group": lambda b, hq, hkv, ctx, d, e: (
        4 * b * hkv * (hq // hkv) * ctx * d,
        e * b * hkv * (2 * ctx * d + 2 * (hq // hkv) * d)),
}


# ------------------------------------------------------------------------------------- roofline
def _roof(time_fn, bound_fn=None):
    def roofline(flops, nbytes, gpu):
        intensity = flops / nbytes
        ridge = gpu.tensor_tflops * 1e12 / (gpu.hbm_gbs * 1e9)
        bound = intensity < ridge if bound_fn is None else bound_fn(intensity, ridge)
        return intensity, time_fn(flops, nbytes, gpu), bound
    return roofline


def _compute_s(f, g):
    return f / (g.tensor_tflops * 1e12)


def _memory_s(b, g):
    return b / (g.hbm_gbs * 1e9)


ROOFLINE_WRONG = {
    "sum of the two times": _roof(lambda f, b, g: _compute_s(f, g) + _memory_s(b, g)),
    "smaller of the two times": _roof(lambda f, b, g: min(_compute_s(f, g), _memory_s(b, g))),
    "compute time only": _roof(lambda f, b, g: _compute_s(f, g)),
    "memory time only": _roof(lambda f, b, g: _memory_s(b, g)),
    "fp32 peak": _roof(lambda f, b, g: max(f / (g.fp32_tflops * 1e12), _memory_s(b, g))),
    "GB/s taken as GiB/s": _roof(lambda f, b, g: max(_compute_s(f, g), b / (g.hbm_gbs * 2**30))),
    "TFLOP/s taken as 10⁹": _roof(lambda f, b, g: max(f / (g.tensor_tflops * 1e9), _memory_s(b, g))),
    "milliseconds": _roof(lambda f, b, g: 1e3 * max(_compute_s(f, g), _memory_s(b, g))),
    "memory-bound above the ridge": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g)),
                                          lambda i, r: i > r),
    "bytes per FLOP as intensity": lambda f, b, g: (b / f, max(_compute_s(f, g), _memory_s(b, g)),
                                                    f / b < g.ridge),
    "ridge in the wrong units": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g)),
                                      lambda i, r: i < g_ridge_wrong(r)),
    # Boundaries: exactly on the ridge the two times are equal, and the lab's rule (below it) says False.
    "memory-bound on the ridge too (<=)": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g)),
                                                lambda i, r: i <= r),
    "memory time >= compute time": lambda f, b, g: (
        f / b, max(_compute_s(f, g), _memory_s(b, g)), _memory_s(b, g) >= _compute_s(f, g)),
    "ridge rounded to 2 decimals": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g)),
                                         lambda i, r: i < round(r, 2)),
    # Types: the lab asks for True or False.
    "memory_bound as 1 or 0": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g)),
                                    lambda i, r: int(i < r)),
    "memory_bound as 1.0 or 0.0": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g)),
                                        lambda i, r: float(i < r)),
    "memory_bound as a word": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g)),
                                    lambda i, r: "memory" if i < r else "compute"),
}


def g_ridge_wrong(ridge):
    return ridge / 1000          # TFLOP/s over GB/s without the 10¹²/10⁹


ROOFLINE_RIGHT = {
    "max of the two": _roof(lambda f, b, g: max(_compute_s(f, g), _memory_s(b, g))),
    "attainable rate": lambda f, b, g: (
        f / b, f / (g.attainable_tflops(f / b) * 1e12), f / b < g.ridge),
    "compare the times": lambda f, b, g: (
        f / b, max(_compute_s(f, g), _memory_s(b, g)), _memory_s(b, g) > _compute_s(f, g)),
    "NumPy floats and np.bool_": lambda f, b, g: (
        np.float64(f) / np.float64(b), np.maximum(_compute_s(f, g), _memory_s(b, g)),
        np.float64(f) / np.float64(b) < np.float64(g.tensor_tflops) / np.float64(g.hbm_gbs) * 1e3),
    "the ridge from the GPU's own property": lambda f, b, g: (
        f / b, max(_compute_s(f, g), _memory_s(b, g)), bool(f / b < g.ridge)),
}


# ----------------------------------------------------------------------------- the prediction
H100 = iomodel.GPUS["H100 SXM"]


def _predict(flops_fn, bytes_fn, combine=max, gpu=H100):
    def predicted_qk_ms(n):
        f, b = flops_fn(n), bytes_fn(n)
        return 1e3 * combine(f / (gpu.tensor_tflops * 1e12), b / (gpu.hbm_gbs * 1e9))
    return predicted_qk_ms


def _flops(n):
    return 32 * 2 * n * n * 128


def _bytes(n):
    return 32 * 2 * (2 * n * 128 + n * n)


PREDICTION_WRONG = {
    "compute time only": _predict(_flops, _bytes, combine=lambda c, m: c),
    "sum of compute and memory": _predict(_flops, _bytes, combine=lambda c, m: c + m),
    "one head": _predict(lambda n: _flops(n) / 32, lambda n: _bytes(n) / 32),
    "elements, not bytes": _predict(_flops, lambda n: _bytes(n) / 2),
    "fp32 bytes": _predict(_flops, lambda n: 2 * _bytes(n)),
    "Q and K forgotten": _predict(_flops, lambda n: 32 * 2 * n * n),
    "S written and read back": _predict(_flops, lambda n: 32 * 2 * (2 * n * 128 + 2 * n * n)),
    "A100's roofline": _predict(_flops, _bytes, gpu=iomodel.GPUS["A100 SXM 80GB"]),
    "seconds, not milliseconds": lambda n: _predict(_flops, _bytes)(n) / 1e3,
    "a guess, the same at every n": lambda n: 0.4,
    # unit slips and counts off by less than the old band (0.5 to 1 × measured) could see
    "GB/s read as GiB/s": lambda n: _bytes(n) / (H100.hbm_gbs * 2**30) * 1e3,
    "TB/s read as TiB/s": lambda n: _bytes(n) / (3.35 * 2**40) * 1e3,
    "Kᵀ written and read back": _predict(_flops, lambda n: _bytes(n) + 32 * 2 * 2 * n * 128),
    "3 TB/s (a rounded-down bandwidth)": lambda n: _bytes(n) / 3.0e12 * 1e3,
    "the H100 PCIe's 2 TB/s": lambda n: _bytes(n) / 2.0e12 * 1e3,
    "Q only, K forgotten": _predict(_flops, lambda n: 32 * 2 * (n * 128 + n * n)),
    "a fraction of the measurement (0.8 × a recalled time)": lambda n: 0.8 * 1.31 * _bytes(n) / 3.35e12 * 1e3,
}

PREDICTION_RIGHT = {
    "by hand": _predict(_flops, _bytes),
    "datasheet figures rounded (3.35e12 B/s, 989e12 FLOP/s)": lambda n: 1e3 * max(
        _flops(n) / 989e12, _bytes(n) / 3.35e12),
    "attainable rate": lambda n: _flops(n) / (H100.attainable_tflops(_flops(n) / _bytes(n)) * 1e12) * 1e3,
    "bytes over bandwidth": lambda n: _bytes(n) / 3.35e12 * 1e3,
}

CATALOGUE = {
    "matmul_cost": (lab02.check_matmul_cost, MATMUL_WRONG, MATMUL_RIGHT),
    "flash_forward_cost": (lab02.check_flash_forward_cost, FLASH_WRONG, FLASH_RIGHT),
    "decode_cost": (lab02.check_decode_cost, DECODE_WRONG, DECODE_RIGHT),
    "roofline": (lab02.check_roofline, ROOFLINE_WRONG, ROOFLINE_RIGHT),
    "predicted_qk_ms": (lab02.check_prediction, PREDICTION_WRONG, PREDICTION_RIGHT),
}


def _params(kind: int):
    return [pytest.param(check, fn, id=f"{exercise}: {name}")
            for exercise, (check, *catalogues) in CATALOGUE.items()
            for name, fn in catalogues[kind].items()]


@pytest.mark.parametrize(("check", "mutant"), _params(0))
def test_wrong_answer_rejected_on_every_seed(check, mutant):
    assert_rejected_on_every_seed(check, mutant, SEEDS)


@pytest.mark.parametrize(("check", "correct"), _params(1))
def test_correct_variant_accepted_on_every_seed(check, correct):
    assert_accepted(check, correct, SEEDS)


def test_catalogue_size():
    for exercise, (_, wrong, right) in CATALOGUE.items():
        assert len(wrong) >= 8 and len(right) >= 2, exercise
    assert [e.function for e in lab02.EXERCISES] == list(CATALOGUE)


def test_solution_passes_and_blank_is_not_implemented():
    solved, blank = _namespace(SOLUTION), _namespace(LAB)
    names = [e.function for e in lab02.EXERCISES]
    summary = lab02.check_lab(seed=7, **{n: solved[n] for n in names})
    assert summary.passed, summary
    summary = lab02.check_lab(seed=7, **{n: blank[n] for n in names})
    assert [r.status for r in summary.results] == [NOT_IMPLEMENTED] * len(names), summary


def test_prediction_report_names_the_measurement():
    result = lab02.check_prediction(PREDICTION_RIGHT["by hand"])
    assert result.status == PASSED
    assert "n =  4096" in result.report and "recorded on" in result.report


def test_dependency_named_when_roofline_fails():
    def broken(*args):
        raise ValueError("broken")

    summary = lab02.check_lab(matmul_cost=MATMUL_RIGHT["loops"], flash_forward_cost=_flash_loop,
                              decode_cost=DECODE_RIGHT["by tensor"], roofline=broken,
                              predicted_qk_ms=PREDICTION_WRONG["one head"], seed=0)
    assert "exercise 4 (roofline)" in summary.results[-1].report


def test_ready_made_answers_are_refused():
    from attnkit.bench.recorder import read_results

    def peeks(n):
        row = next(r for r in read_results("naive_attention") if int(r["N"]) == n)
        return 0.8 * row["QK^T_ms"]

    result = lab02.check_prediction(peeks)
    assert not result.passed and "ForbiddenCall" in result.report, result.report
    result = lab02.check_matmul_cost(lambda b, m, n, k, e: tuple(lab02.matmul_cost_reference(b, m, n, k, e)), seed=0)
    assert not result.passed and "ForbiddenCall" in result.report, result.report
    assert lab02.check_prediction(PREDICTION_RIGHT["by hand"]).passed          # restored afterwards
    assert read_results("naive_attention")


def test_reports_give_each_quantity_in_its_own_unit():
    result = lab02.check_roofline(ROOFLINE_WRONG["GB/s taken as GiB/s"], seed=0)
    assert "seconds: expected 1.06418e-05 s, got 9.91094e-06 s (0.9313 × the expected value)" in result.report
    assert "relative error" not in result.report and " 0. " not in result.report
    result = lab02.check_matmul_cost(MATMUL_WRONG["C not written"], seed=0)
    assert "bytes: expected 142 bytes, got 112 bytes (0.7887 × the expected value)" in result.report
    assert "FLOPs:" not in result.report                  # the FLOPs are right: not listed


def test_a_prediction_off_by_a_unit_slip_is_reported_in_milliseconds():
    report = lab02.check_prediction(PREDICTION_WRONG["GB/s read as GiB/s"]).report
    assert "n = 512: your prediction, 0.0070 ms, is 0.0005159 ms below the roofline bound (0.9313 × the bound" \
        in report, report


def test_the_ridge_itself_and_a_bool_are_reported_in_the_labs_words():
    on_ridge = lab02.check_roofline(ROOFLINE_WRONG["memory-bound on the ridge too (<=)"], seed=0).report
    assert "exactly on the T4's ridge" in on_ridge and "memory_bound: expected False, got True" in on_ridge, on_ridge
    as_int = lab02.check_roofline(ROOFLINE_WRONG["memory_bound as 1 or 0"], seed=0).report
    assert "memory_bound must be True or False (a bool), got int 1" in as_int, as_int
    assert "raised" not in as_int, as_int
