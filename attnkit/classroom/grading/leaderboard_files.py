"""The leaderboard's files: ``bench_leaderboard.csv`` (one row per timed kernel, with the grader's provenance),
the ratio columns added to the grader's ``grades.csv``, and the page the course's site shows
(``page_markdown``). The rows themselves are built and ranked by ``leaderboard``.
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..course import LESSONS
from .reports import csv_cell, one_line

CSV_NAME = "bench_leaderboard.csv"
PAGE_NAME = "leaderboard.md"
NOT_GRADED = ("A timing is never part of a grade: grades come from the checks alone, and only a kernel that "
              "passes every check of its exercise is timed.")
FIELDS = ["rank", "student", "lab", "kernel", "shape", "student_ms", "course_ms", "library", "library_ms",
          "vs_course", "vs_library", "spread_pct", "repeats", "note", "sandboxed", "clock"]


def note_text(notes) -> str:
    if not isinstance(notes, dict):
        return ""
    return "; ".join(one_line(f"{k}: {v}", 300) for k, v in list(notes.items())[:4] if isinstance(v, str))


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return csv_cell(value)


def write_csv(rows: list[dict], path: Path, provenance: dict) -> Path:
    """``rows`` with the provenance columns (GPU, date, torch, Triton, CUDA, cuDNN) of the grader's process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(FIELDS + list(provenance))
        for row in rows:
            writer.writerow([_cell(row.get(k)) for k in FIELDS] + [_cell(v) for v in provenance.values()])
    return path


def read_rows(path: str | Path) -> list[dict]:
    with Path(path).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def add_grade_columns(csv_path: Path, entries: list, rows: list[dict], kernels, device: str) -> None:
    """Append to the grader's ``grades.csv`` one column per ratio of each timed kernel of the lab, named
    "(not graded)", and a column saying why a notebook's kernel has no time; its own columns are kept."""
    by_report = {e.grade.report_name: e for e in entries if e.grade is not None}
    found = {(r["student"], r["kernel"]): r for r in rows}
    names = []
    for k in kernels:
        if k.course is not None:
            names.append((k, "vs_course", f"{k.name}: student time / course kernel time (not graded)"))
        names.append((k, "vs_library", f"{k.name}: student time / {k.library_name(device)} time (not graded)"))
    with csv_path.open(newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    header, body = table[0], table[1:]
    report = header.index("report")
    out = [header + [n for _, _, n in names] + ["timing note (not graded)"]]
    for line in body:
        e = by_report.get(line[report])
        values, why = [], []
        for k, column, _ in names:
            row = found.get((e.student, k.name)) if e is not None else None
            values.append(_cell(row[column]) if row is not None else "")
        if e is not None:
            for k in kernels:
                row = found.get((e.student, k.name))
                if k not in e.gated:
                    why.append(f"{k.name}: not timed (its checks did not all pass)")
                elif row is None:
                    frame = e.timing.get(k.name) or {}
                    why.append(f"{k.name}: not timed ({note_text(frame.get('notes')) or e.problem or 'no result'})")
                elif row["note"]:
                    why.append(f"{k.name}: {row['note']}")
        out.append(line + values + [csv_cell("; ".join(why))])
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(out)


def _md(text) -> str:
    """Text safe in a Markdown table cell: no pipes, no markup, no HTML, no math."""
    text = one_line(text, 200)
    for ch in "\\`*_{}[]<>()#+!|~$":
        text = text.replace(ch, "\\" + ch)
    return text


def ratio_text(value) -> str:
    try:
        return f"{float(value):.2f}×" if value not in (None, "") else "–"
    except ValueError:
        return "–"


def _ms_text(value) -> str:
    try:
        return f"{float(value):.4g}" if value not in (None, "") else "–"
    except ValueError:
        return "–"


def page_markdown(rows: list[dict], source: str = CSV_NAME) -> str:
    """The leaderboard page (MyST Markdown) for rows read from a leaderboard CSV (``read_rows``)."""
    lines = ["# Kernel leaderboard", "",
             "Students' kernels of labs 04, 05, 06 and 08, each timed beside the course's kernel and PyTorch's "
             "(cuDNN's attention for labs 05, 06 and 08; PyTorch's own operation for the puzzles of lab 04) on "
             "one fixed shape, in one process, in turns; each time is the median of several medians. The ratios "
             "are the student's time over the course's and over the library's: below 1 is faster.", "",
             f"**{NOT_GRADED}**", ""]
    if not rows:
        lines += [f"No leaderboard has been recorded yet (`{source}`). On a machine with a CUDA GPU:", "",
                  "```text",
                  "make leaderboard NOTEBOOK=\"solutions/lab0[4568]_*.ipynb submissions/*/lab0[4568]_*.ipynb\"",
                  "```", ""]
        return "\n".join(lines)
    first = rows[0]
    lines += [f"Recorded on {_md(first.get('gpu', '?'))} on {_md(first.get('date', '?'))} with torch "
              f"{_md(first.get('torch', '?'))} and Triton {_md(first.get('triton', '?'))}; clock: "
              f"{_md(first.get('clock', '?'))}. Source: `{source}`.", ""]
    labs: dict = {}
    for row in rows:
        labs.setdefault(row.get("lab", ""), []).append(row)
    titles = {f"{lesson.number:02d}": lesson.title for lesson in LESSONS}
    for lab in sorted(labs):
        title = f" · {_md(titles[lab])}" if lab in titles else ""
        lines += [f"## Lab {_md(lab)}{title}", "",
                  "| rank | student | kernel | shape | time (ms) | ÷ course | ÷ library | library | GPU | date | "
                  "torch | Triton |",
                  "|---:|---|---|---|---:|---:|---:|---|---|---|---|---|"]
        notes = []
        for row in labs[lab]:
            rank_text = _md(row.get("rank")) if row.get("rank") else "–"
            if row.get("note"):
                notes.append(f"- {_md(row.get('student'))}, {_md(row.get('kernel'))}: {_md(row.get('note'))}")
            lines.append(" | ".join([f"| {rank_text}", _md(row.get("student")), _md(row.get("kernel")),
                                     _md(row.get("shape")), _ms_text(row.get("student_ms")),
                                     ratio_text(row.get("vs_course")), ratio_text(row.get("vs_library")),
                                     _md(row.get("library")), _md(row.get("gpu")), _md(row.get("date")),
                                     _md(row.get("torch")), f"{_md(row.get('triton'))} |"]))
        lines.append("")
        if notes:
            lines += ["Notes:", ""] + notes + [""]
    return "\n".join(lines)
