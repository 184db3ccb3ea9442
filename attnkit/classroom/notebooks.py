"""Notebook plumbing for the course: standard header cells, execution with stored outputs, checks.

    python -m attnkit.classroom.notebooks execute notebooks/01_attention_by_hand.ipynb ...   # run, store outputs
    python -m attnkit.classroom.notebooks headers [--check]                                   # badges + setup cells
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .course import LESSONS, colab_url, pip_spec, readme_toc

ROOT = Path(__file__).resolve().parents[2]      # the repository (a clone; not in an installed wheel)
IGNORE_MARKER = "# NBVAL_IGNORE_OUTPUT"
TOC_BEGIN = "<!-- toc: written by `make headers` from attnkit/course.py -->"
TOC_END = "<!-- /toc -->"
# The one reason line allowed under the marker: what makes the output machine-dependent.
DEVICE_REASONS = ("timing", "benchmark", "versions")


def badge_line(relpath: str) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(relpath)})")


def setup_source() -> str:
    """The first code cell of every notebook: install in Colab, then report what runs where."""
    return "\n".join([
        IGNORE_MARKER,
        "# device-dependent: versions",
        "import subprocess, sys",
        'if "google.colab" in sys.modules:  # in Colab, install the course first',
        f'    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "{pip_spec()}"], check=True)',
        "import attnkit",
        "RT = attnkit.setup()",
    ])


def header_cells(relpath: str, title: str, intro: str = ""):
    """A badge-and-title markdown cell and the setup code cell."""
    import nbformat.v4 as v4

    text = f"{badge_line(relpath)}\n\n# {title}"
    if intro:
        text += f"\n\n{intro.strip()}"
    return [v4.new_markdown_cell(text), v4.new_code_cell(setup_source())]


def new_notebook(relpath: str, title: str, cells, intro: str = ""):
    """Write a notebook made of the standard header and ``cells``: ("md" | "code", source) pairs."""
    import nbformat
    import nbformat.v4 as v4

    made = header_cells(relpath, title, intro)
    for kind, source in cells:
        source = source.strip("\n")
        made.append(v4.new_markdown_cell(source) if kind == "md" else v4.new_code_cell(source))
    nb = v4.new_notebook(cells=made)
    normalize(nb)
    path = ROOT / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def normalize(nb) -> None:
    """Keep only metadata that means something, so diffs show content and outputs alone."""
    for cell in nb.cells:
        for key in ("execution", "collapsed", "scrolled", "jupyter", "ExecuteTime"):
            cell.metadata.pop(key, None)
        cell.pop("id", None)
    widgets = nb.metadata.get("widgets")
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    if widgets:
        nb.metadata["widgets"] = widgets
    nb.nbformat, nb.nbformat_minor = 4, 4


def execute(path: str | Path, timeout: int = 1800) -> None:
    """Run a notebook top to bottom in a fresh kernel and store its outputs in place."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    normalize(nb)
    nbformat.write(nb, path)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def state_problems(path: str | Path, *, lab: bool = False) -> list[str]:
    """What is wrong with a committed notebook: unexecuted cells or errors; for a lab, stored outputs."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(code_cells(nb)):
        if lab:
            if cell.outputs or cell.execution_count is not None:
                problems.append(f"{path}: code cell {i} of a lab has stored outputs")
            continue
        if cell.execution_count is None:
            problems.append(f"{path}: code cell {i} was never executed")
        if any(o.output_type == "error" for o in cell.outputs):
            problems.append(f"{path}: code cell {i} stores an error")
    return problems


def marker_problems(path: str | Path) -> list[str]:
    """nbval markers: only ``# NBVAL_IGNORE_OUTPUT`` on a cell's first line, followed by a
    ``# device-dependent: <timing|benchmark|versions>`` line; no tags, no other markers."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(code_cells(nb)):
        tags = [t for t in cell.metadata.get("tags", []) if t.startswith("nbval") or t == "raises-exception"]
        if tags:
            problems.append(f"{path}: code cell {i} uses nbval tags {tags}; use the comment marker")
        lines = cell.source.splitlines()
        others = [l for l in lines if "NBVAL_" in l and l.strip() != IGNORE_MARKER]
        if others:
            problems.append(f"{path}: code cell {i} uses another nbval marker: {others[0].strip()}")
        marked = [j for j, l in enumerate(lines) if l.strip() == IGNORE_MARKER]
        if not marked:
            continue
        reason = lines[1].strip() if len(lines) > 1 else ""
        if marked != [0] or not any(reason == f"# device-dependent: {r}" for r in DEVICE_REASONS):
            problems.append(f"{path}: code cell {i}: the marker must be the first line, followed by "
                            f"'# device-dependent: <{'|'.join(DEVICE_REASONS)}>'")
    return problems


def header_problems(path: str | Path) -> list[str]:
    """The first cells must be the standard badge/title cell and setup cell for this file."""
    import nbformat

    path = Path(path).resolve()
    relpath = path.relative_to(ROOT).as_posix()
    nb = nbformat.read(path, as_version=4)
    problems = []
    if not nb.cells or nb.cells[0].cell_type != "markdown" or not nb.cells[0].source.startswith(badge_line(relpath)):
        problems.append(f"{relpath}: the first cell must start with its Open-in-Colab badge")
    if len(nb.cells) < 2 or nb.cells[1].source != setup_source():
        problems.append(f"{relpath}: the second cell must be the standard setup cell")
    return problems


def restamp_headers(path: str | Path) -> bool:
    """Rewrite the badge and setup cell of an existing notebook; True when something changed."""
    import nbformat

    path = Path(path).resolve()
    relpath = path.relative_to(ROOT).as_posix()
    nb = nbformat.read(path, as_version=4)
    changed = False
    first = nb.cells[0]
    lines = first.source.split("\n")
    if lines and lines[0].startswith("[![Open In Colab]"):
        lines = lines[1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
    new_first = badge_line(relpath) + "\n\n" + "\n".join(lines)
    if first.source != new_first:
        first.source, changed = new_first, True
    if nb.cells[1].source != setup_source():
        nb.cells[1].source, changed = setup_source(), True
    if changed:
        nbformat.write(nb, path)
    return changed


def course_notebooks() -> list[Path]:
    """Every committed notebook of the course that exists: lessons, solutions and labs."""
    paths = []
    for lesson in LESSONS:
        for rel in (lesson.notebook, lesson.solution, lesson.lab):
            if rel and (ROOT / rel).exists():
                paths.append(ROOT / rel)
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.notebooks")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("execute", help="run notebooks and store their outputs")
    ex.add_argument("paths", nargs="+")
    ex.add_argument("--timeout", type=int, default=1800)
    hd = sub.add_parser("headers", help="rewrite Colab badges, setup cells and the README's contents "
                                        "from attnkit/course.py")
    hd.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "execute":
        for p in args.paths:
            print(f"executing {p}", flush=True)
            execute(p, timeout=args.timeout)
        return 0
    problems = []
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = text.index(TOC_BEGIN) + len(TOC_BEGIN), text.index(TOC_END)
    fresh = text[:start] + "\n" + readme_toc(ROOT) + "\n" + text[end:]
    if fresh != text:
        if args.check:
            problems.append("README.md: the table of contents is out of date")
        else:
            readme.write_text(fresh)
            print("updated README.md")
    for path in course_notebooks():
        if args.check:
            problems += header_problems(path)
        elif restamp_headers(path):
            print(f"updated {path.relative_to(ROOT)}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
