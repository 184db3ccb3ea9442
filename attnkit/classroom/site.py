"""The course as a static website, built from the notebooks' stored outputs (nothing is executed).

    python -m attnkit.classroom.site                       # build site/_build/html (what `make site` runs)
    python -m attnkit.classroom.site --no-solutions        # leave solutions/ out, e.g. for a class's own site
    python -m attnkit.classroom.site --out DIR             # build elsewhere
    python -m attnkit.classroom.site --root CHECKOUT       # build another copy of the course

The lessons, labs and solutions that exist (``attnkit.classroom.notebooks.course_notebooks``), the
figures (with the notes on recorded results, ``figures/*.md``), the glossary and the instructor guide are
copied into ``<out>/src`` with the repository's layout, so relative links between them keep working, and
Sphinx with MyST-NB renders them (settings: ``site/conf.py``). The table of contents comes from
``attnkit/classroom/course.py``. The site needs no network to build or to read: MathJax is served from
the site itself, and the Colab badge (an image on Colab's servers) becomes a text link.
Open ``<out>/html/index.html`` in a browser.
"""
from __future__ import annotations

import argparse
import html.parser
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .course import colab_url, course_entries
from .notebooks import GLOSSARY_URL, ROOT

CONF_DIR = ROOT / "site"
DEFAULT_OUT = ROOT / "site" / "_build"
GUIDES = ("docs/glossary.md", "docs/references.md", "docs/instructor_guide.md")
REFERENCE = ("docs/glossary.md", "docs/references.md")
# The Colab badge is an image on Colab's servers: on the site it becomes a plain link, so a page read
# offline shows no broken image. The glossary link of every notebook points at the site's own page.
BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\(([^)]*)\)")
ASSET_DIRS = ("figures",)


def lesson_pages(root: Path = ROOT, *, solutions: bool = True) -> list[str]:
    """Every notebook the site shows, as paths relative to the repository root, in course order."""
    pages = []
    for lesson in course_entries():
        for rel in (lesson.notebook, lesson.lab, lesson.solution if solutions else None):
            if rel and (Path(root) / rel).exists():
                pages.append(rel)
    return pages


def html_path(relpath: str) -> str:
    """Where a source page lands in the built site: notebooks/01_x.ipynb -> notebooks/01_x.html."""
    return str(Path(relpath).with_suffix(".html").as_posix())


def index_source(pages: list[str], guides: list[str], notes: list[str] = ()) -> str:
    """The home page: what the course is, a table of every lesson, and the navigation tree."""
    present = set(pages)
    lines = [
        "# Attention kernels, from a 4×4 example to paged decoding",
        "",
        "An open course on how attention in large language models runs: a 4×4 attention worked by hand,",
        "softmax streamed online in NumPy, a FlashAttention kernel in Triton measured against PyTorch's",
        "attention backends, the KV cache of grouped-query attention, and a paged-attention decode kernel",
        "serving a tiny model. Each lesson is shown here with its stored outputs; open it in Colab or",
        "JupyterLab to run it.",
        "",
        "| lesson | time | lab | Colab |",
        "|---|---|---|---|",
    ]
    for lesson in course_entries():
        title = (f"[{lesson.heading}]({lesson.notebook})" if lesson.notebook in present
                 else f"{lesson.heading} (in preparation)")
        lab = []
        if lesson.lab in present:
            lab.append(f"[Lab {lesson.number:02d}]({lesson.lab})")
        if lesson.solution in present:
            lab.append(f"[solution]({lesson.solution})")
        colab = f"[open]({colab_url(lesson.notebook)})" if lesson.notebook in present else ""
        minutes = f"{lesson.minutes} min" if lesson.minutes else ""
        lines.append(f"| {title} | {minutes} | {' · '.join(lab)} | {colab} |")
    lines.append("")
    groups = [("Lessons", [p for p in pages if p.startswith("notebooks/")]),
              ("Labs", [p for p in pages if p.startswith("labs/")]),
              ("Solutions", [p for p in pages if p.startswith("solutions/")]),
              ("Recorded results", list(notes)),
              ("Reference", [g for g in guides if g in REFERENCE]),
              ("For instructors", [g for g in guides if g not in REFERENCE])]
    for caption, entries in groups:
        if not entries:
            continue
        lines += ["```{toctree}", ":maxdepth: 1", f":caption: {caption}", ""]
        lines += [str(Path(e).with_suffix("").as_posix()) for e in entries]
        lines += ["```", ""]
    return "\n".join(lines)


def stage(src: Path, *, root: Path = ROOT, solutions: bool = True) -> list[str]:
    """Copy the site's sources into ``src`` (emptied first); return the notebook pages staged."""
    root = Path(root)
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    pages = lesson_pages(root, solutions=solutions)
    if not pages:
        raise ValueError(f"root: no course notebook found under {root} (see attnkit/classroom/course.py)")
    for rel in pages:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(offline_notebook((root / rel).read_text(encoding="utf-8"), rel), encoding="utf-8")
    notes = []
    for folder in ASSET_DIRS:
        if (root / folder).is_dir():
            shutil.copytree(root / folder, src / folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
            notes += sorted(p.relative_to(src).as_posix() for p in (src / folder).rglob("*.md"))
    guides = []
    for rel in GUIDES:
        if (root / rel).exists():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, src / rel)
            guides.append(rel)
    (src / "index.md").write_text(index_source(pages, guides, notes))
    return pages


def offline_notebook(text: str, relpath: str) -> str:
    """A notebook's JSON as the site shows it: the Colab badge as a text link, the glossary local."""
    nb = json.loads(text)
    glossary = "../" * relpath.count("/") + "docs/glossary.md"
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        source = BADGE.sub(r"[Open in Colab](\1)", source).replace(GLOSSARY_URL, glossary)
        cell["source"] = source
    return json.dumps(nb, ensure_ascii=False, indent=1) + "\n"


def build(out: str | Path = DEFAULT_OUT, *, root: Path = ROOT, solutions: bool = True,
          quiet: bool = True) -> Path:
    """Build the website into ``out/html`` and return that folder.

    Sphinx runs in a child process (no notebook kernel is started). Its warnings go to
    ``out/warnings.txt``; a failed build raises ``RuntimeError`` with Sphinx's last lines.
    """
    out = Path(out).resolve()
    src, html_dir, doctrees = out / "src", out / "html", out / "doctrees"
    stage(src, root=root, solutions=solutions)
    warnings = out / "warnings.txt"
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-c", str(CONF_DIR), "-d", str(doctrees),
           "-w", str(warnings), "--fresh-env", str(src), str(html_dir)]
    if quiet:
        cmd.insert(3, "-q")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise RuntimeError(f"sphinx failed (exit {done.returncode}):\n{tail}")
    return html_dir


class _Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for key in ("href", "src"):
            if attrs.get(key) and not (tag == "link" and attrs.get("rel") in ("canonical",)):
                self.links.append(attrs[key])


def broken_links(html_dir: str | Path) -> list[str]:
    """Local links and images in the built site that point at nothing: 'page -> target' lines.

    Links to other sites are not followed (building and checking need no network).
    """
    html_dir = Path(html_dir)
    problems = []
    for page in sorted(html_dir.rglob("*.html")):
        if "_static" in page.parts or "_sources" in page.parts:
            continue
        parser = _Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("#", "mailto:", "javascript:", "data:")):
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if parts.path.endswith("/") or target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{page.relative_to(html_dir)} -> {link}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.site", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="build folder (default: site/_build)")
    parser.add_argument("--no-solutions", action="store_true", help="leave solutions/ out of the site")
    parser.add_argument("--root", default=str(ROOT), help="the course checkout to build (default: this one)")
    args = parser.parse_args(argv)
    try:
        html_dir = build(args.out, root=Path(args.root), solutions=not args.no_solutions)
    except ValueError as exc:
        parser.error(str(exc))
    broken = broken_links(html_dir)
    for line in broken:
        print(f"broken link: {line}")
    print(f"site: {html_dir / 'index.html'}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
