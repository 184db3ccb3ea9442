"""The course as a static website, built from the notebooks' stored outputs (nothing is executed).

    python -m attnkit.classroom.site                       # build site/_build/html (what `make site` runs)
    python -m attnkit.classroom.site --no-solutions        # leave solutions/ out, e.g. for a class's own site
    python -m attnkit.classroom.site --out DIR             # build elsewhere
    python -m attnkit.classroom.site --root CHECKOUT       # build another copy of the course
    python -m attnkit.classroom.site --fetch               # only fetch and check the widget JavaScript
    python -m attnkit.classroom.site --serve               # serve the built site on http://127.0.0.1:8000/

The lessons, labs and solutions that exist (``attnkit.classroom.notebooks.course_notebooks``), the
figures (with the notes on recorded results, ``figures/*.md``), the glossary and the instructor guide are
copied into ``<out>/src`` with the repository's layout, so relative links between them keep working, and
Sphinx with MyST-NB renders them (settings: ``site/conf.py``). The table of contents comes from
``attnkit/classroom/course.py``. The kernel leaderboard's page (``leaderboard.md``, under "Recorded
results") is written from ``attnkit/bench/results/bench_leaderboard.csv`` (``leaderboard_page``).

Reading the built site needs no network, from a web server or straight from disk (``file://``): MathJax
(the ``sphinx-mathjax-offline`` package), the widget renderer (``@jupyter-widgets/html-manager``) and
RequireJS are served from the site's own ``_static`` folder, search loads its index as a script, and the
Colab badge (an image on Colab's servers) becomes a text link. Sphinx's search requests each result's
page for the text snippet under it, which browsers refuse on ``file://`` pages: there
``site/_static/offline.js`` answers from ``_static/search_text.js`` (every page's text, written after
the build by ``search_text``). ``--serve`` serves the site over http, as a web host would.

Building needs no network once the two npm packages in ``VENDORED`` are in ``site/_vendor`` (gitignored):
the first build, or ``--fetch``, downloads them from the npm registry (``$NPM_CONFIG_REGISTRY`` if set),
pinned by version and checked against the registry's sha512; without them and without a network the
build stops and says so. Open ``<out>/html/index.html`` in a browser.
"""
from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
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
LEADERBOARD_CSV = "attnkit/bench/results/bench_leaderboard.csv"     # written by `make leaderboard` on a GPU


@dataclass(frozen=True)
class Vendored:
    """An npm package whose files the site serves from its own ``_static/vendor/<name>-<version>/``."""

    package: str            # the npm name
    version: str            # pinned: the tarball is fetched by this exact version
    integrity: str          # the registry's "dist.integrity" of that tarball (sha512, base64)
    licence: str
    files: tuple[str, ...]  # patterns inside the tarball's package/ folder; copied flat into the folder

    @property
    def folder(self) -> str:
        return f"{self.package.rsplit('/', 1)[-1]}-{self.version}"

    @property
    def tarball(self) -> str:
        return f"{self.folder}.tgz"

    def url(self, registry: str) -> str:
        return f"{registry.rstrip('/')}/{self.package}/-/{self.tarball}"


# The widget renderer for pages with stored widget state. MyST-NB's default loads both files from CDNs
# (myst_nb.core.config.ipywidgets_js_factory), so offline a widget is missing. html-manager 1.0.x is the
# embedder of ipywidgets 8 (widget state 2.0, @jupyter-widgets/controls 2.0.0, which it bundles);
# its embed-amd.js needs RequireJS on the page. The font files are FontAwesome, for widget icons.
VENDORED = (
    Vendored("requirejs", "2.3.8",
             "sha512-7/cTSLOdYkNBNJcDMWf+luFvMriVm7eYxp4BcFCsAX0wF421Vyce5SXP17c+Jd5otXKGNehIonFlyQXSowL6Mw==",
             "MIT", ("require.js",)),
    Vendored("@jupyter-widgets/html-manager", "1.0.15",
             "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
             "BSD-3-Clause", ("dist/embed-amd.js", "dist/embed.js.LICENSE.txt", "dist/*.woff2", "dist/*.woff",
                              "dist/*.ttf", "dist/*.eot", "dist/*.svg")),
)
VENDOR_DIR = ROOT / "site" / "_vendor"
NPM_REGISTRY = "https://registry.npmjs.org"
# The value of MyST-NB's ``nb_ipywidgets_js`` (site/conf.py): scripts under _static, in loading order,
# with their attributes. site/_static/widgets.js points RequireJS at the bundle's folder.
WIDGET_JS = {f"vendor/{VENDORED[0].folder}/require.js": {},
             "widgets.js": {"data-html-manager": f"vendor/{VENDORED[1].folder}"},
             f"vendor/{VENDORED[1].folder}/embed-amd.js": {}}


def sri(data: bytes) -> str:
    """The Subresource Integrity string of ``data`` (``sha512-`` and its base64 digest), as npm records it."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def vendor(cache: str | Path = VENDOR_DIR, *, registry: str | None = None, fetch: bool = True) -> Path:
    """The folder of vendored files that the site serves as ``_static/vendor``; fetched when missing.

    Each tarball in ``VENDORED`` is kept in ``cache`` and checked against its pinned sha512 on every call;
    one that is missing is downloaded from the npm registry (``registry``, else ``$NPM_CONFIG_REGISTRY``,
    else registry.npmjs.org) unless ``fetch`` is false. A missing tarball that cannot be fetched, or one
    whose checksum differs, raises ``RuntimeError`` saying what to do.
    """
    cache = Path(cache)
    registry = registry or os.environ.get("NPM_CONFIG_REGISTRY") or NPM_REGISTRY
    static = cache / "static"
    for item in VENDORED:
        tarball = cache / item.tarball
        if not tarball.is_file():
            url = item.url(registry)
            if not fetch:
                raise RuntimeError(f"{tarball} is missing: run `python -m attnkit.classroom.site --fetch` "
                                   f"once with a network (it downloads {url})")
            try:
                with urllib.request.urlopen(url, timeout=60) as answer:
                    data = answer.read()
            except OSError as exc:
                raise RuntimeError(
                    f"the site serves {item.package} {item.version} itself, and {tarball} is missing: fetching "
                    f"{url} failed ({exc}). Build once with a network (or `python -m attnkit.classroom.site "
                    f"--fetch`), or copy that file there from a machine that has it.") from exc
            if sri(data) != item.integrity:
                raise RuntimeError(f"{url} does not match its pinned checksum {item.integrity}: not used")
            cache.mkdir(parents=True, exist_ok=True)
            part = tarball.with_name(f"{tarball.name}.{os.getpid()}.part")
            part.write_bytes(data)
            os.replace(part, tarball)
        elif sri(tarball.read_bytes()) != item.integrity:
            raise RuntimeError(f"{tarball} does not match its pinned checksum {item.integrity}: delete it and "
                               "build again to fetch it anew")
        folder = static / "vendor" / item.folder
        if not (folder / "PROVENANCE.txt").is_file():
            _unpack(item, tarball, folder, registry)
    return static


def _unpack(item: Vendored, tarball: Path, folder: Path, registry: str) -> None:
    """Copy ``item.files`` out of its tarball into ``folder``; written whole (a temporary folder renamed)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{item.folder}.", dir=folder.parent))
    found = []
    with tarfile.open(tarball) as tar:
        for member in tar.getmembers():
            inside = member.name.removeprefix("package/")
            if member.isfile() and any(fnmatch.fnmatch(inside, pattern) for pattern in item.files):
                (tmp / Path(inside).name).write_bytes(tar.extractfile(member).read())
                found.append(inside)
    missing = [p for p in item.files if not any(fnmatch.fnmatch(f, p) for f in found)]
    if missing:
        shutil.rmtree(tmp)
        raise RuntimeError(f"{tarball} has no file matching {missing}")
    (tmp / "PROVENANCE.txt").write_text(
        f"{item.package} {item.version} ({item.licence} licence), from {item.url(registry)}\n"
        f"checked against {item.integrity}\nfiles: {', '.join(sorted(found))}\n")
    if folder.exists() and not (folder / "PROVENANCE.txt").is_file():
        shutil.rmtree(folder, ignore_errors=True)       # left half-made by hand: replaced
    try:
        os.replace(tmp, folder)
    except OSError:                     # another build unpacked it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        if not (folder / "PROVENANCE.txt").is_file():
            raise


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
    notes.append(leaderboard_page(src, root))
    (src / "index.md").write_text(index_source(pages, guides, notes))
    return pages


def leaderboard_page(src: Path, root: Path = ROOT) -> str:
    """Write ``src/leaderboard.md``, the kernel leaderboard rendered from ``LEADERBOARD_CSV`` (a page that
    says none is recorded yet when the CSV is absent); return its path relative to ``src``."""
    from .grading.leaderboard import page_markdown, read_rows

    path = Path(root) / LEADERBOARD_CSV
    rows = read_rows(path) if path.is_file() else []
    (src / "leaderboard.md").write_text(page_markdown(rows, source=LEADERBOARD_CSV), encoding="utf-8")
    return "leaderboard.md"


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
    vendor()                            # site/conf.py serves it; fetched here, where an error reads plainly
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


SEARCH_TEXT = "_static/search_text.js"
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class _MainText(html.parser.HTMLParser):
    """The text of a page's ``role="main"`` element, keeping its ``<section id>`` elements (the anchors
    of search results) and leaving out scripts, styles and heading permalinks, as Sphinx's search does."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.stack: list[tuple[str, bool]] = []      # open tags inside main: (tag, emitted as a section)
        self.inside = self.skip = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if not self.inside:
            if attrs.get("role") == "main":
                self.inside, self.stack = 1, [(tag, False)]
            return
        if tag in _VOID:
            return
        section = tag == "section" and bool(attrs.get("id"))
        if section and not self.skip:
            self.out.append(f'<section id="{html.escape(attrs["id"])}">')
        self.stack.append((tag, section))
        if self.skip or tag in ("script", "style") or "headerlink" in (attrs.get("class") or "").split():
            self.skip += 1

    def handle_endtag(self, tag):
        if not self.inside or tag in _VOID:
            return
        while self.stack:                            # close up to the matching tag (tolerates unclosed ones)
            open_tag, section = self.stack.pop()
            if self.skip:
                self.skip -= 1
            elif section:
                self.out.append("</section>")
            if open_tag == tag:
                break
        if not self.stack:
            self.inside = 0

    def handle_data(self, data):
        if self.inside and not self.skip:
            self.out.append(html.escape(data, quote=False))


def search_text(html_dir: str | Path) -> Path:
    """Write ``_static/search_text.js``: each page's main text, for search snippets read from disk.

    Sphinx's search fetch()es a result's page to show the text around the match; browsers refuse fetch()
    on file:// pages, so site/_static/offline.js answers those requests from this file there (one script,
    loaded by the search page when a search runs from disk). Keys are page names (``notebooks/03_x``).
    """
    html_dir = Path(html_dir)
    pages = {}
    for page in sorted(html_dir.rglob("*.html")):
        rel = page.relative_to(html_dir)
        if rel.parts[0] in ("_static", "_sources", "_images") or rel.as_posix() in ("search.html", "genindex.html"):
            continue
        parser = _MainText()
        parser.feed(page.read_text(encoding="utf-8"))
        text = re.sub(r"\s+", " ", "".join(parser.out)).strip()
        if text:
            pages[rel.with_suffix("").as_posix()] = f'<div role="main">{text}</div>'
    target = html_dir / SEARCH_TEXT
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("window.ATTNKIT_SEARCH_TEXT = " + json.dumps(pages, ensure_ascii=False) + ";\n",
                      encoding="utf-8")
    return target


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


def serve(html_dir: str | Path, port: int = 8000, host: str = "127.0.0.1") -> None:
    """Serve a built site over http on this machine only, until interrupted (search snippets need it)."""
    import functools
    import http.server

    html_dir = Path(html_dir)
    if not (html_dir / "index.html").is_file():
        raise ValueError(f"out: no built site in {html_dir} (build it first: python -m attnkit.classroom.site)")
    if not 0 <= port < 65536:
        raise ValueError(f"port: must be in 0..65535, got {port}")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html_dir))
    with http.server.ThreadingHTTPServer((host, port), handler) as server:
        print(f"serving {html_dir} on http://{host}:{server.server_address[1]}/ (Ctrl+C to stop)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.site", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="build folder (default: site/_build)")
    parser.add_argument("--no-solutions", action="store_true", help="leave solutions/ out of the site")
    parser.add_argument("--root", default=str(ROOT), help="the course checkout to build (default: this one)")
    parser.add_argument("--fetch", action="store_true",
                        help="only fetch and check the vendored widget JavaScript (into site/_vendor)")
    parser.add_argument("--serve", action="store_true", help="serve the built site (OUT/html) instead of building")
    parser.add_argument("--port", type=int, default=8000, help="the port for --serve (default: 8000)")
    args = parser.parse_args(argv)
    try:
        if args.serve:
            serve(Path(args.out) / "html", args.port)
            return 0
        if args.fetch:
            print(f"vendored: {vendor()}")
            return 0
        html_dir = build(args.out, root=Path(args.root), solutions=not args.no_solutions)
    except ValueError as exc:
        parser.error(str(exc))
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    broken = broken_links(html_dir)
    for line in broken:
        print(f"broken link: {line}")
    print(f"site: {html_dir / 'index.html'}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
