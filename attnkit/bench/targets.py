"""Issue 40's performance targets, each read from the recorded CSVs: target, measured, met.

    python -m attnkit.bench.targets            # the table, as Markdown
    python -m attnkit.bench.targets --write    # docs/performance_targets.md: what the rows read, then the table

One function per target (``head_dims``, ``broadcast_do``, ``eager_paged``, ``eager_flash``, ``fp8_forward``,
``fp8_cache``, ``packed``, ``paged_head_sizes``), each taking the results directory and returning ``Row``s:
the target, the CSV rows it read (file and filter), the measured value, met or not, and the GPU, date and
versions of those rows. The measured value is the worst case over the rows the target covers (the smallest
for an "at least" target, the largest for an "at most" one), computed from the rows' times, never from a
ratio column. A CSV that is missing, lacks a column the target needs, or has no row for it gives a row that
says "not recorded" (``Row.measured`` None, ``Row.met`` None).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from .recorder import PROVENANCE, RESULTS, SCRIPT_RESULTS, read_results

NOT_RECORDED = "not recorded"
DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "performance_targets.md"


class NotRecorded(Exception):
    """A target's rows are missing from the recorded CSVs; the message says what is missing."""


@dataclass(frozen=True)
class Target:
    """One target of issue 40: ``measured >= threshold`` (``at_least``) or ``measured <= threshold`` is met."""

    key: str
    text: str
    threshold: float
    at_least: bool = True

    def met(self, measured: float) -> bool:
        return measured >= self.threshold if self.at_least else measured <= self.threshold


@dataclass(frozen=True)
class Row:
    """A line of the table: ``measured`` None where the CSVs do not record what the target needs."""

    target: Target
    source: str                 # the CSV and the filter of the rows read
    measured: float | None
    detail: str                 # the value as the table prints it, with the cases behind the worst one
    recorded_on: str            # GPU, date and versions of the rows read ("" when none)

    @property
    def met(self) -> bool | None:
        return None if self.measured is None else self.target.met(self.measured)


# ------------------------------------------------------------------------------------------ reading rows
def _read(name: str, directory: Path, columns: tuple[str, ...]) -> list[dict]:
    """The rows of ``bench_<name>.csv``; NotRecorded when the file or one of ``columns`` is missing."""
    path = Path(directory) / f"bench_{name}.csv"
    if not path.exists():
        raise NotRecorded(f"bench_{name}.csv is missing")
    rows = read_results(name, directory)
    header = set(rows[0]) if rows else set()
    missing = [c for c in (*columns, *PROVENANCE) if c not in header]
    if missing:
        raise NotRecorded(f"bench_{name}.csv has no column {', '.join(missing)}")
    return rows


def _select(rows: list[dict], **match) -> list[dict]:
    """Rows whose columns equal ``match`` (compared as text: CSV booleans are "True"/"False", numbers floats)."""
    return [r for r in rows if all(_same(r[k], v) for k, v in match.items())]


def _same(value, wanted) -> bool:
    if isinstance(value, float) and isinstance(wanted, (int, float)) and not isinstance(wanted, bool):
        return value == wanted
    return str(value) == str(wanted)


def _number(row: dict, column: str) -> float:
    """A row's number; NotRecorded when the cell is empty or NaN."""
    value = row[column]
    if not isinstance(value, float) or math.isnan(value):
        raise NotRecorded(f"{column} is empty in a row it needs")
    return value


def _one(rows: list[dict], what: str, **match) -> dict:
    found = _select(rows, **match)
    if not found:
        raise NotRecorded(f"no row of {what}")
    return found[0]


def _median(rows: list[dict], column: str, what: str) -> float:
    if not rows:
        raise NotRecorded(f"no row of {what}")
    return statistics.median(_number(r, column) for r in rows)


def recorded_on(rows: list[dict]) -> str:
    """The distinct GPU / date / versions of ``rows``, in their order."""
    seen = dict.fromkeys(f"{r['gpu']}, {r['date']} (torch {r['torch']}, Triton {r['triton']}, CUDA {r['cuda']}, "
                         f"cuDNN {r['cudnn']})" for r in rows)
    return "; ".join(seen)


def _row(target: Target, source: str, compute) -> Row:
    """``compute()`` -> (measured, detail, rows read); a NotRecorded on the way gives a "not recorded" row."""
    try:
        measured, detail, used = compute()
    except NotRecorded as why:
        return Row(target, source, None, f"{NOT_RECORDED} ({why})", "")
    except KeyError as column:                 # a column read but not asked of ``_read``: still not recorded
        return Row(target, source, None, f"{NOT_RECORDED} (no column {column.args[0]})", "")
    return Row(target, source, measured, detail, recorded_on(used))


def _worst(cases: dict, target: Target) -> tuple[object, float]:
    """The case of ``cases`` (label -> value) furthest from meeting ``target``."""
    pick = min if target.at_least else max
    label = pick(cases, key=cases.get)
    return label, cases[label]


def _cases_text(cases: dict, digits: int = 2) -> str:
    return ", ".join(f"{label} {value:.{digits}f}" for label, value in cases.items())


def _dims(d: float, dv: float) -> str:
    return f"{int(d)}" if d == dv else f"{int(d)}/{int(dv)}"


# ------------------------------------------------------------------------------------ 1. head dims
HEAD_DIM_CASES = ((80, 80), (96, 96), (112, 112), (192, 128), (256, 256))
HEAD_DIM_TARGETS = {
    ("fwd", False): Target("1a", "head dims 80, 96, 112, 192/128, 256: forward, non-causal, N ≥ 2k, "
                                 "≥ 0.9 × cuDNN", 0.9),
    ("fwd", True): Target("1b", "the same, forward causal", 0.9),
    ("bwd", False): Target("1c", "the same, backward non-causal", 0.9),
    ("bwd", True): Target("1d", "the same, backward causal", 0.9),
}
FORWARD_ALONE = Target("1e", "the same, forward causal alone (no autograd) at 80, 96, 112", 0.9)


def _speed_ratios(rows, course: str, peer: str, **match) -> tuple[dict, list, set]:
    """{(D, Dv) label: peer's time ÷ the course's} over HEAD_DIM_CASES at N ≥ 2048, the rows read, the Ns."""
    cases, used, lengths = {}, [], set()
    for d, dv in HEAD_DIM_CASES:
        for mine in _select(rows, impl=course, head_dim=d, head_dim_v=dv, **match):
            if mine["n"] < 2048:
                continue
            theirs = _one(rows, f"{peer} at D = {d}, N = {int(mine['n'])}", impl=peer, head_dim=d, head_dim_v=dv,
                          n=mine["n"], **match)
            label = _dims(d, dv) + ("" if mine["n"] == 4096 else f" N={int(mine['n'])}")
            cases[label] = _number(theirs, "ms") / _number(mine, "ms")
            used += [mine, theirs]
            lengths.add(int(mine["n"]))
    if not cases:
        raise NotRecorded("no row at these head dims and N ≥ 2048")
    return cases, used, lengths


def head_dims(directory: Path = RESULTS) -> list[Row]:
    """Forward and backward, causal and not, at each head dim: cuDNN's time ÷ the course's, side by side
    (bench_flash_headdims.csv, suite "baseline"); the worst head dim. 1e: the causal forward without
    autograd at 80-112 runs unpadded (``dispatch.pad_width``'s ``causal_forward_alone``), which the shipped
    baseline recording timed padded; the sweep's "dispatch" rows timed it unpadded (docs/head_dims.md,
    "After the rules")."""
    out = []
    for (direction, causal), target in HEAD_DIM_TARGETS.items():
        source = (f"bench_flash_headdims.csv: suite baseline, direction {direction}, causal {causal}, "
                  "attnkit vs sdpa_cudnn, ms")

        def compute(direction=direction, causal=causal, target=target):
            rows = _read("flash_headdims", directory, ("suite", "impl", "direction", "head_dim", "head_dim_v",
                                                       "causal", "n", "ms"))
            rows = _select(rows, suite="baseline", direction=direction, causal=causal)
            cases, used, lengths = _speed_ratios(rows, "attnkit", "sdpa_cudnn")
            label, worst = _worst(cases, target)
            return worst, (f"{worst:.2f} at D = {label} ({_cases_text(cases)}; N = "
                           f"{', '.join(map(str, sorted(lengths)))} recorded)"), used
        out.append(_row(target, source, compute))

    def alone():
        rows = _read("flash_headdims_sweep", directory, ("suite", "impl", "head_dim", "head_dim_v", "causal", "n",
                                                         "ms"))
        rows = _select(rows, suite="sweep_fwd", causal=True)
        rows = [r for r in rows if r["head_dim"] in (80, 96, 112)]
        cases, used, lengths = _speed_ratios(rows, "dispatch", "sdpa_cudnn")
        label, worst = _worst(cases, FORWARD_ALONE)
        return worst, (f"{worst:.2f} at D = {label} ({_cases_text(cases)}; N = "
                       f"{', '.join(map(str, sorted(lengths)))})"), used
    out.append(_row(FORWARD_ALONE, "bench_flash_headdims_sweep.csv: suite sweep_fwd, causal True, dispatch vs "
                                   "sdpa_cudnn, ms", alone))
    return out


# ------------------------------------------------------------------------- 2. broadcast output gradients
BROADCAST_DO = Target("2", "a broadcast, expanded or strided dO costs at most 5% more than a contiguous one "
                           "(time ÷ the contiguous dO's)", 1.05, at_least=False)


def broadcast_do(directory: Path = RESULTS) -> list[Row]:
    """The course's forward + backward with each non-contiguous dO ("sum": ``o.sum().backward()``, expanded,
    stride 0) over the same with a random contiguous dO, medians over the repeats of
    bench_flash_broadcast_do.csv; cuDNN's own ratio beside it."""
    def compute():
        rows = _read("flash_broadcast_do", directory, ("impl", "do", "ms", "dtype", "causal", "batch", "heads", "n",
                                                       "head_dim"))
        course = _select(rows, impl="attnkit")
        contiguous = _median(_select(course, do="random"), "ms", "attnkit with a random dO")
        kinds = [k for k in dict.fromkeys(r["do"] for r in course) if k != "random"]
        if not kinds:
            raise NotRecorded("no row with a non-contiguous dO")
        cases = {k: _median(_select(course, do=k), "ms", f"attnkit, dO {k}") / contiguous for k in kinds}
        label, worst = _worst(cases, BROADCAST_DO)
        peer = _select(rows, impl="sdpa_cudnn")
        peer_text = ""
        if _select(peer, do="random") and _select(peer, do=label):
            peer_ratio = (_median(_select(peer, do=label), "ms", "cuDNN")
                          / _median(_select(peer, do="random"), "ms", "cuDNN"))
            peer_text = f"; cuDNN's: {peer_ratio:.3f}"
        shape = course[0]
        return worst, (f"{worst:.3f} (dO {label}: {_median(_select(course, do=label), 'ms', label):.3f} ms against "
                       f"{contiguous:.3f} ms, medians of {len(_select(course, do=label))} repeats{peer_text}; "
                       f"{shape['dtype']}, causal {shape['causal']}, B = {int(shape['batch'])}, "
                       f"H = {int(shape['heads'])}, N = {int(shape['n'])}, D = {int(shape['head_dim'])}; "
                       f"dO kinds recorded: {', '.join(kinds)}, random)"), rows
    return [_row(BROADCAST_DO, "bench_flash_broadcast_do.csv: impl attnkit, do sum ÷ do random, medians of ms",
                 compute)]


# ----------------------------------------------------------------------------------------- 3. eager calls
EAGER_PAGED = Target("3a", "eager `paged_decode` at B = 1 within 1.5 × cuDNN's eager SDPA (time ÷ cuDNN's)", 1.5,
                     at_least=False)
EAGER_FLASH = Target("3b", "eager `flash_attention` forward + backward at N = 1k within 1.2 × cuDNN's "
                           "(time ÷ cuDNN's)", 1.2, at_least=False)
PAGED_EAGER_DEFAULT = "paged_decode eager (default: check_values='device')"
PAGED_EAGER_PEER = "sdpa cudnn eager (contiguous cache)"


def eager_paged(directory: Path = RESULTS) -> list[Row]:
    """``paged_decode`` as a user calls it (its default options) over cuDNN's SDPA on the contiguous cache,
    both eager, each context at B = 1 of bench_paged_eager.csv: time per call of a loop of back-to-back
    calls ("loop_us", what a decode loop pays); do_bench's medians beside it."""
    def compute():
        rows = _read("paged_eager", directory, ("B", "context", "method", "loop_us", "do_bench_us"))
        rows = _select(rows, B=1)
        loop, bench, used = {}, {}, []
        for context in dict.fromkeys(r["context"] for r in rows):
            mine = _select(rows, context=context, method=PAGED_EAGER_DEFAULT)
            theirs = _select(rows, context=context, method=PAGED_EAGER_PEER)
            if not mine or not theirs:
                continue
            label = f"{int(context) // 1024}k"
            loop[label] = _number(mine[0], "loop_us") / _number(theirs[0], "loop_us")
            bench[label] = _number(mine[0], "do_bench_us") / _number(theirs[0], "do_bench_us")
            used += [mine[0], theirs[0]]
        if not loop:
            raise NotRecorded("no B = 1 pair of the default paged_decode and cuDNN")
        label, worst = _worst(loop, EAGER_PAGED)
        return worst, (f"{worst:.2f} at {label} (loop: {_cases_text(loop)}; do_bench: {_cases_text(bench)})"), used
    return [_row(EAGER_PAGED, f"bench_paged_eager.csv: B = 1, method \"{PAGED_EAGER_DEFAULT}\" ÷ "
                              f"\"{PAGED_EAGER_PEER}\", loop_us", compute)]


def eager_flash(directory: Path = RESULTS) -> list[Row]:
    """Forward + backward issued eagerly at N = 1024: the course's median time over the repeats ÷ cuDNN's,
    for each (B, D, causal) of bench_flash_eager.csv; the worst case."""
    def compute():
        rows = _read("flash_eager", directory, ("impl", "ms", "batch", "n", "head_dim", "causal"))
        rows = _select(rows, n=1024)
        cases, used = {}, []
        for key in dict.fromkeys((r["batch"], r["head_dim"], r["causal"]) for r in rows):
            b, d, causal = key
            mine = _select(rows, impl="attnkit", batch=b, head_dim=d, causal=causal)
            theirs = _select(rows, impl="sdpa_cudnn", batch=b, head_dim=d, causal=causal)
            if not mine or not theirs:
                continue
            label = f"B={int(b)} D={int(d)}{' causal' if causal == 'True' else ''}"
            cases[label] = _median(mine, "ms", label) / _median(theirs, "ms", label)
            used += mine + theirs
        if not cases:
            raise NotRecorded("no N = 1024 pair of attnkit and sdpa_cudnn")
        label, worst = _worst(cases, EAGER_FLASH)
        return worst, f"{worst:.2f} at {label} ({_cases_text(cases)})", used
    return [_row(EAGER_FLASH, "bench_flash_eager.csv: N = 1024, attnkit ÷ sdpa_cudnn, medians of ms over the "
                              "repeats", compute)]


# ---------------------------------------------------------------------------------------------- 4. FP8
FP8_RATIO = Target("4a", "FP8 forward ≥ 1.6 × the course's fp16 forward, N ≥ 4k (speed ratio)", 1.6)
FP8_TFLOPS = Target("4b", "FP8 forward ≥ 950 TFLOP/s at D = 128, non-causal, N = 16k", 950.0)
FP8_CACHE = Target("4c", "FP8 KV cache decode ≥ 1.6 × the fp16 cache at B = 64, 4k (fp16 time ÷ fp8 time)", 1.6)

# (CSV, its column of the implementation, the FP8 forward's name, the course's fp16 forward's name, filter)
FP8_RECORDINGS = (("flash_headdims", "impl", "fp8", "attnkit", {"suite": "fp8"}),
                  ("flash_fp8", "impl", "fp8", "fp16_attnkit", {}))


def _fp8_rows(directory, name, impl_column, match):
    rows = _read(name, directory, (impl_column, "ms", "n", "causal", "batch", "heads", "head_dim"))
    return _select(rows, **match)


def fp8_forward(directory: Path = RESULTS) -> list[Row]:
    """The FP8 forward (q, k, v already e4m3: the quantising is its own row, fp8_quantize, not counted) over
    the course's fp16 forward timed in the same run, at every N ≥ 4096 and causal flag, D = 128; and its
    TFLOP/s (4·B·H·N²·D, halved for causal) at N = 16384 non-causal. One pair of rows per recording:
    bench_flash_headdims.csv (suite fp8) and bench_flash_fp8.csv (an H100 run)."""
    out = []
    for name, column, fp8, fp16, match in FP8_RECORDINGS:
        filt = "".join(f"{k} {v}, " for k, v in match.items())

        def ratio(name=name, column=column, fp8=fp8, fp16=fp16, match=match):
            rows = _fp8_rows(directory, name, column, match)
            cases, used = {}, []
            for mine in _select(rows, **{column: fp8}, head_dim=128):
                if mine["n"] < 4096:
                    continue
                base = _one(rows, f"{fp16} at N = {int(mine['n'])}", **{column: fp16}, n=mine["n"],
                            causal=mine["causal"], head_dim=128)
                label = f"{int(mine['n']) // 1024}k{' causal' if mine['causal'] == 'True' else ''}"
                cases[label] = _number(base, "ms") / _number(mine, "ms")
                used += [mine, base]
            if not cases:
                raise NotRecorded(f"no {fp8} row at N ≥ 4096 with its fp16 row")
            label, worst = _worst(cases, FP8_RATIO)
            return worst, f"{worst:.2f} at {label} ({_cases_text(cases)})", used

        def tflops(name=name, column=column, fp8=fp8, fp16=fp16, match=match):
            rows = _fp8_rows(directory, name, column, match)
            mine = _one(rows, f"{fp8} at N = 16384, non-causal", **{column: fp8}, n=16384, causal=False, head_dim=128)
            work = 4 * mine["batch"] * mine["heads"] * mine["n"] ** 2 * mine["head_dim"]
            value = work / (_number(mine, "ms") * 1e-3) / 1e12
            return value, (f"{value:.0f} TFLOP/s ({_number(mine, 'ms'):.3f} ms, B = {int(mine['batch'])}, "
                           f"H = {int(mine['heads'])})"), [mine]
        out.append(_row(FP8_RATIO, f"bench_{name}.csv: {filt}{column} {fp16} ms ÷ {fp8} ms, D = 128", ratio))
        out.append(_row(FP8_TFLOPS, f"bench_{name}.csv: {filt}{column} {fp8}, N = 16384, causal False, ms", tflops))
    return out


def fp8_cache(directory: Path = RESULTS) -> list[Row]:
    """``paged_decode``'s time with an fp16 cache over its time with an fp8 cache at B = 64, 4k, each at its
    default configuration (CUDA-graph replays): bench_paged_fp8_ratio.csv (kind timing) and the H100 run of
    bench_paged_fp8.csv (kind timing, cache fp16 / fp8 e4m3)."""
    def ratio_csv():
        rows = _read("paged_fp8_ratio", directory, ("kind", "B", "context", "method", "ms"))
        rows = _select(rows, kind="timing", B=64, context=4096)
        fp16 = _one(rows, "the fp16 cache (default config)", method="fp16 cache (default config)")
        fp8 = _one(rows, "the fp8 cache (default config)", method="fp8 cache (default config)")
        value = _number(fp16, "ms") / _number(fp8, "ms")
        fastest = _select(rows, method="fp8 cache (fastest of the sweep)")
        extra = (f"; {_number(fp16, 'ms') / _number(fastest[0], 'ms'):.2f} at the fp8 sweep's fastest"
                 if fastest else "")
        return value, (f"{value:.2f} ({_number(fp16, 'ms') * 1e3:.1f} µs against {_number(fp8, 'ms') * 1e3:.1f} µs"
                       f"{extra})"), [fp16, fp8]

    def first_csv():
        rows = _read("paged_fp8", directory, ("kind", "cache", "B", "context", "ms"))
        rows = _select(rows, kind="timing", B=64, context=4096)
        fp16 = _one(rows, "the fp16 cache", cache="fp16")
        fp8 = _one(rows, "the fp8 cache", cache="fp8 e4m3")
        value = _number(fp16, "ms") / _number(fp8, "ms")
        return value, (f"{value:.2f} ({_number(fp16, 'ms') * 1e3:.1f} µs against "
                       f"{_number(fp8, 'ms') * 1e3:.1f} µs)"), [fp16, fp8]
    return [_row(FP8_CACHE, "bench_paged_fp8_ratio.csv: kind timing, B = 64, context 4096, fp16 cache (default "
                            "config) ms ÷ fp8 cache (default config) ms", ratio_csv),
            _row(FP8_CACHE, "bench_paged_fp8.csv: kind timing, B = 64, context 4096, cache fp16 ms ÷ cache fp8 e4m3 ms",
                 first_csv)]


# ------------------------------------------------------------------------------------ 5. packed sequences
PACKED = Target("5", "packed sequences ≥ 0.85 × the padded-to-useful ratio over cuDNN on the padded batch "
                     "(cuDNN padded's time ÷ varlen's, as a fraction of padded ÷ useful pairs)", 0.85)
# (CSV, filter of its packed-sequence rows)
PACKED_RECORDINGS = (("flash_headdims", {"suite": "varlen"}),
                     ("flash_features", {"suite": "varlen", "pass_": "forward"}))


def packed(directory: Path = RESULTS) -> list[Row]:
    """``flash_attention_varlen`` on the packed batch over cuDNN on the batch padded to the longest
    (cuDNN's time ÷ varlen's), divided by the bound padded pairs ÷ useful pairs (the padded batch's share of
    useless work): 1 would be all the padding saved. bench_flash_headdims.csv and the H100 run of
    bench_flash_features.csv."""
    out = []
    for name, match in PACKED_RECORDINGS:
        def compute(name=name, match=match):
            rows = _select(_read(name, directory, ("impl", "ms", "useful_pairs", "padded_pairs")), **match)
            mine = _one(rows, "attnkit_varlen", impl="attnkit_varlen")
            theirs = _one(rows, "sdpa_cudnn_padded", impl="sdpa_cudnn_padded")
            speed = _number(theirs, "ms") / _number(mine, "ms")
            bound = _number(mine, "padded_pairs") / _number(mine, "useful_pairs")
            value = speed / bound
            return value, (f"{value:.2f} ({speed:.2f} × cuDNN padded, bound {bound:.2f}: the target is "
                           f"{PACKED.threshold * bound:.2f} ×)"), [mine, theirs]
        filt = "".join(f"{k} {v}, " for k, v in match.items())
        out.append(_row(PACKED, f"bench_{name}.csv: {filt}sdpa_cudnn_padded ms ÷ attnkit_varlen ms, padded_pairs ÷ "
                                "useful_pairs", compute))
    return out


# --------------------------------------------------------------------------- 6. paged decode's head sizes
PAGED_BANDWIDTH = Target("6a", "`paged_decode` at every head size within 0.9 of D = 128's bandwidth "
                               "(GB/s ÷ D = 128's), B = 64, 4k", 0.9)
PAGED_CORRECT = Target("6b", "`paged_decode` at every recorded head size correct against float64 on the GPU "
                             "(fp16, pages of 16, one small problem each; largest relative error ÷ the "
                             "recording's bound)", 1.0, at_least=False)
PAGED_SMALL = Target("6c", "`paged_decode` at the head sizes 8-63 (bandwidth, as 6a)", 0.9)
PAGED_EXTEND = Target("6d", "`paged_extend` at every head size 8-256 within 0.9 of its D = 128 bandwidth", 0.9)


def dispatch_config(d: int, dv: int) -> tuple[int, int, int]:
    """The launch configuration ``paged_decode`` takes on a GPU today at (D, Dv), fp16 cache, grouped."""
    from ..kernels.paged_dispatch import GPU_CONFIGS, head_dim_class

    c = GPU_CONFIGS[("grouped", "16", head_dim_class(d, dv))]
    return c.block_n, c.num_warps, c.num_stages


def _config_row(rows, d, dv):
    block_n, warps, stages = dispatch_config(int(d), int(dv))
    return _one(rows, f"D = {_dims(d, dv)} at the dispatch's ({block_n}, {warps} warps, {stages} stages)", D=d, Dv=dv,
                block_n=block_n, num_warps=warps, num_stages=stages)


def paged_head_sizes(directory: Path = RESULTS) -> list[Row]:
    """bench_paged_headdims.csv: each (D, Dv) timed at its default then and at candidate configurations.
    6a reads, for each head size, the row of the configuration ``paged_dispatch.GPU_CONFIGS`` gives it now
    (the CSV's "default" column is the default at recording time) and divides its GB/s by D = 128's at
    D = 128's configuration now; 6b the float64 checks (made at the then default, on a small problem);
    6c, 6d: what the recordings do not hold."""
    columns = ("D", "Dv", "default", "block_n", "num_warps", "num_stages", "gbps")

    def bandwidth(lo=64):
        rows = _read("paged_headdims", directory, columns)
        reference = _config_row(rows, 128, 128)
        cases, used = {}, [reference]
        for d, dv in dict.fromkeys((r["D"], r["Dv"]) for r in rows):
            if d < lo:
                continue
            row = _config_row(rows, d, dv)
            cases[_dims(d, dv)] = _number(row, "gbps") / _number(reference, "gbps")
            used.append(row)
        label, worst = _worst(cases, PAGED_BANDWIDTH)
        return worst, (f"{worst:.2f} at D = {label} ({_cases_text(cases)}; D = 128: "
                       f"{_number(reference, 'gbps'):.0f} GB/s)"), used

    def correct():
        rows = _read("paged_headdims", directory, ("D", "Dv", "rel_error_small", "bound"))
        checked = [r for r in rows if isinstance(r["rel_error_small"], float) and not math.isnan(r["rel_error_small"])]
        if not checked:
            raise NotRecorded("no float64 check")
        cases = {_dims(r["D"], r["Dv"]): r["rel_error_small"] / _number(r, "bound") for r in checked}
        label, worst = _worst(cases, PAGED_CORRECT)
        return worst, (f"{worst:.3f} at D = {label} (relative error {worst * checked[0]['bound']:.1e}, bound "
                       f"{checked[0]['bound']:g}; D = {', '.join(cases)})"), checked

    def small():
        rows = _read("paged_headdims", directory, columns)
        if not any(r["D"] < 64 for r in rows):
            raise NotRecorded("the recording's head sizes are vLLM's grid, 64-256")
        return bandwidth(lo=8)

    def extend():
        raise NotRecorded("no recording of paged_extend's bandwidth by head size")
    return [_row(PAGED_BANDWIDTH, "bench_paged_headdims.csv: gbps at each (D, Dv)'s configuration in "
                                  "paged_dispatch.GPU_CONFIGS ÷ D = 128's", bandwidth),
            _row(PAGED_CORRECT, "bench_paged_headdims.csv: rel_error_small ÷ bound", correct),
            _row(PAGED_SMALL, "bench_paged_headdims.csv: D < 64", small),
            _row(PAGED_EXTEND, "—", extend)]


# ------------------------------------------------------------------------------------------- the table
TARGETS = (head_dims, broadcast_do, eager_paged, eager_flash, fp8_forward, fp8_cache, packed, paged_head_sizes)


def rows(directory: Path = RESULTS) -> list[Row]:
    return [row for target in TARGETS for row in target(directory)]


def _threshold(target: Target) -> str:
    value = f"{target.threshold:g}"
    return ("≥ " if target.at_least else "≤ ") + value


def table(directory: Path = RESULTS) -> str:
    """The Markdown table: target, threshold, measured, met, rows read, where they were recorded."""
    lines = ["| # | target (issue 40) | target value | measured | met | rows read | recorded on |",
             "|---|---|---|---|---|---|---|"]
    for r in rows(directory):
        met = "—" if r.met is None else ("yes" if r.met else "**no**")
        cells = (r.target.key, r.target.text, _threshold(r.target), r.detail, met, r.source, r.recorded_on or "—")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


# The CSVs the targets read, in the table's order; their recording commands are recorder.SCRIPT_RESULTS'.
SOURCES = ("flash_headdims", "flash_headdims_sweep", "flash_broadcast_do", "paged_eager", "flash_eager", "flash_fp8",
           "paged_fp8_ratio", "paged_fp8", "flash_features", "paged_headdims")

INTRO = """# Performance targets (issue 40): target, measured, met

Generated by `python -m attnkit.bench.targets --write` from the recorded CSVs in `attnkit/bench/results/`;
do not edit by hand. `tests/bench/test_targets.py` fails when this file differs from what the CSVs give, so
a re-recorded CSV means regenerating it.

How each row is computed (`attnkit/bench/targets.py`, one function per target):

- **Measured** is the worst case over the rows the target covers: the smallest value for an "at least"
  target (≥), the largest for an "at most" one (≤). Every ratio is computed from the rows' times, side by
  side in one process: a speed ratio is the other's time ÷ the course's (above 1: the course is faster);
  a time ratio ("within", "at most") is the course's time ÷ the other's. The cases behind the worst one
  are listed beside it.
- **1a-1e, head dims** (`docs/head_dims.md`): cuDNN's time ÷ the course's, fp16, B = 4, H = 16. In the
  recorded baseline the causal forward at D = 80-112 ran zero-padded to 128; without
  autograd the dispatch now runs it unpadded (`dispatch.pad_width`), which row 1e reads from the sweep's
  `dispatch` rows. Under autograd the forward is still padded, as in 1b.
- **2, broadcast dO** (`docs/flash_notes.md`): `o.sum().backward()` (dO expanded, stride 0) against a
  random contiguous dO, the course's medians over the repeats.
- **3a, 3b, eager calls** (`docs/paged_notes.md`, `docs/flash_notes.md` "Eager calls at N = 1k"): no CUDA
  graphs; 3a times a loop of back-to-back calls (what a decode loop pays per step).
- **4a-4c, FP8** (`docs/flash_notes.md`, `docs/paged_notes.md`): the FP8 forward's time excludes quantising
  q, k, v; the cache ratio compares each cache at its default launch configuration.
- **5, packed sequences**: 64 sequences of 128-4096 tokens, causal, D = 128; measured = (cuDNN padded's
  time ÷ varlen's) ÷ (padded pairs ÷ useful pairs).
- **6a-6d, paged decode's head sizes** (`docs/paged_notes.md`): each head size at the launch configuration
  `paged_dispatch.GPU_CONFIGS` gives it today, read from the recording's candidates.

A row "not recorded" names what its CSV lacks; no number stands in for it. The issue states its targets on an
H100; each row names the GPU its rows were recorded on, and where two recordings measure the same target
(an H100 run and a later one) both are rows. A ratio measured on one GPU says nothing certain about another.

The CSVs and the commands that record them (`attnkit.bench.recorder.SCRIPT_RESULTS`):

"""


def document(directory: Path = RESULTS) -> str:
    """docs/performance_targets.md: the introduction, each CSV's recording command, then the table."""
    sources = "".join(f"- `bench_{name}.csv`: `{SCRIPT_RESULTS.get(name, 'not in SCRIPT_RESULTS')}`\n"
                      for name in SOURCES)
    return INTRO + sources + "\n## The table\n\n" + table(directory)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {DOCUMENT.name} into the repository's docs/")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the directory of the bench_*.csv files")
    args = parser.parse_args(argv)
    if args.write:
        if not DOCUMENT.parent.is_dir():
            raise SystemExit(f"--write: {DOCUMENT.parent} does not exist (an installed course has no docs/)")
        DOCUMENT.write_text(document(args.results))
        print(f"wrote {DOCUMENT}")
    else:
        sys.stdout.write(table(args.results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
