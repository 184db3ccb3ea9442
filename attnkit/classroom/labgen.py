"""Make the student labs from the solved notebooks.

In a solution's code cells, everything between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` is
replaced by ``raise NotImplementedError`` at the same indentation (nbgrader's convention); outputs
and execution counts are cleared; the Colab badge is pointed at the lab.

    python -m attnkit.classroom.labgen            # write labs/ (never over a lab a student has edited)
    python -m attnkit.classroom.labgen --force    # overwrite edited labs too
    python -m attnkit.classroom.labgen --check    # exit 1 when labs/ differs from a fresh generation

Each generated lab records a fingerprint of its own cells in its metadata; a lab whose cells no
longer match its fingerprint has been edited by someone and is left alone unless forced.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
from pathlib import Path

from .course import LESSONS
from .notebooks import ROOT, badge_line, normalize

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
PLACEHOLDER = "raise NotImplementedError"
FINGERPRINT_KEY = "attnkit_lab_fingerprint"


def clear_solutions(source: str) -> str:
    """Replace each marked region (markers included) with one ``raise NotImplementedError``."""
    out, inside = [], False
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"source: nested '{BEGIN}'")
            inside = True
            out.append(line[: len(line) - len(line.lstrip())] + PLACEHOLDER)
        elif stripped == END:
            if not inside:
                raise ValueError(f"source: '{END}' without '{BEGIN}'")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"source: '{BEGIN}' without '{END}'")
    return "\n".join(out)


def fingerprint(nb) -> str:
    cells = [(c.cell_type, c.source) for c in nb.cells]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]


def make_lab(solution_path: Path, lab_relpath: str):
    """The lab notebook (nbformat object) generated from a solution notebook."""
    import nbformat

    nb = copy.deepcopy(nbformat.read(solution_path, as_version=4))
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = clear_solutions(cell.source)
            cell.outputs, cell.execution_count = [], None
    first = nb.cells[0]
    solution_badge = badge_line(solution_path.relative_to(ROOT).as_posix())
    first.source = first.source.replace(solution_badge, badge_line(lab_relpath))
    normalize(nb)
    nb.metadata[FINGERPRINT_KEY] = fingerprint(nb)
    return nb


def lab_pairs():
    for lesson in LESSONS:
        if lesson.has_lab and (ROOT / lesson.solution).exists():
            yield ROOT / lesson.solution, lesson.lab


def was_edited(lab_path: Path) -> bool:
    import nbformat

    nb = nbformat.read(lab_path, as_version=4)
    recorded = nb.metadata.get(FINGERPRINT_KEY)
    return recorded is None or recorded != fingerprint(nb)


def main(argv=None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.labgen")
    parser.add_argument("--force", action="store_true", help="overwrite labs that were edited")
    parser.add_argument("--check", action="store_true", help="fail when labs/ is out of date")
    args = parser.parse_args(argv)
    stale = 0
    for solution, lab_rel in lab_pairs():
        lab_path = ROOT / lab_rel
        fresh = nbformat.writes(make_lab(solution, lab_rel)) + "\n"
        current = lab_path.read_text() if lab_path.exists() else None
        if current == fresh:
            continue
        if args.check:
            print(f"{lab_rel} is out of date: run `make labs`")
            stale += 1
        elif current is not None and was_edited(lab_path) and not args.force:
            print(f"{lab_rel} was edited after it was generated: left alone (use --force to overwrite)")
        else:
            lab_path.parent.mkdir(parents=True, exist_ok=True)
            lab_path.write_text(fresh)
            print(f"wrote {lab_rel}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
