"""In a real browser: JupyterLab runs lesson 3's widget and lab 01's check cell; the course's website,
opened from disk with the network refused, shows math, figures, a widget and search results.

Headless Chromium is Debian's (`apt-get install chromium`; .ci/run installs it when run as root),
driven by Playwright; no browser is downloaded. JupyterLab serves a copy of the notebooks, with their
stored outputs cleared, so that what the test sees comes from running the cells now and nothing is
saved over the course's files. The website is tests/integration/test_site.py's build (one per test run).
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom.course import LESSONS

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 180_000            # a 2-core machine, shared, running a kernel and a browser
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LESSON3 = next(l for l in LESSONS if l.number == 3).notebook
LAB01 = next(l for l in LESSONS if l.number == 1).lab

pytestmark = pytest.mark.slow


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cleared_copy(rel: str, root) -> None:
    """Copy a course notebook into ``root`` without its stored outputs and widget state."""
    nb = nbformat.read(ROOT / rel, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("widgets", None)
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, root / rel)


@pytest.fixture(scope="module")
def playwright():
    """One Playwright per module, for JupyterLab's browser and the offline site's."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it as root)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def lab_server(playwright, tmp_path_factory):
    """JupyterLab on localhost serving cleared copies of lesson 3 and lab 01: (base url, token, root)."""
    tmp = tmp_path_factory.mktemp("jupyterlab")
    root = tmp / "course"
    root.mkdir()
    for rel in (LESSON3, LAB01):
        if (ROOT / rel).exists():
            cleared_copy(rel, root)
    if (ROOT / "figures").is_dir():
        shutil.copytree(ROOT / "figures", root / "figures")
    port, token = free_port(), "browser-test-token"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                pytest.fail("JupyterLab exited early:\n" + (tmp / "server.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not answer within 120 s")
                time.sleep(0.5)
        yield base, token, root
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def browser(playwright, lab_server, tmp_path_factory):
    profile = tmp_path_factory.mktemp("chromium-profile")
    context = playwright.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                            args=FLAGS, viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context
    finally:
        context.close()


def open_notebook(browser, lab_server, rel: str):
    """Open ``rel`` in JupyterLab and wait until its kernel is idle; return the page."""
    base, token, _ = lab_server
    page = browser.new_page()
    page.goto(f"{base}/lab/tree/{rel}?token={token}")
    page.wait_for_function(
        """() => {
            const app = window.jupyterapp;
            const panel = app && app.shell.currentWidget;
            const kernel = panel && panel.sessionContext && panel.sessionContext.session
                           && panel.sessionContext.session.kernel;
            return panel && panel.context && panel.context.isReady && kernel && kernel.status === 'idle';
        }""", timeout=TIMEOUT_MS)
    return page


def run_through(page, index: int) -> None:
    """Run every cell above cell ``index``, then that cell, as a student would, and wait for the kernel."""
    page.evaluate(
        """async (index) => {
            const app = window.jupyterapp;
            app.shell.currentWidget.content.activeCellIndex = index;
            if (index > 0) { await app.commands.execute('notebook:run-all-above'); }
            app.shell.currentWidget.content.activeCellIndex = index;
            await app.commands.execute('notebook:run-cell');
        }""", index)


def cell(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index)


def no_errors_above(page, index: int) -> None:
    errors = page.locator(".jp-Notebook .jp-Cell "
                          ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, "a cell raised:\n" + "\n".join(tracebacks)[:2000]


def test_lesson3_widget_renders_and_responds(browser, lab_server):
    if not (ROOT / LESSON3).exists():
        pytest.skip(f"{LESSON3} does not exist yet")
    nb = nbformat.read(ROOT / LESSON3, as_version=4)
    widget_cells = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"
                    and any(WIDGET_VIEW in o.get("data", {}) for o in c.outputs)]
    assert widget_cells, f"{LESSON3} stores no widget output (run `make execute NB={LESSON3}`)"
    index = widget_cells[0]
    page = open_notebook(browser, lab_server, LESSON3)
    run_through(page, index)
    widget = cell(page, index).locator(".jp-OutputArea .jupyter-widgets").first
    widget.wait_for(state="visible", timeout=TIMEOUT_MS)
    no_errors_above(page, index)
    area = cell(page, index).locator(".jp-OutputArea")
    assert "Error displaying widget" not in area.inner_text()
    handle = cell(page, index).locator(".widget-slider .noUi-handle, .widget-slider input[type=range]").first
    if handle.count():
        before = widget.inner_text()
        handle.focus()
        page.keyboard.press("ArrowLeft")
        page.wait_for_function("([el, before]) => el.innerText !== before", arg=[widget.element_handle(), before],
                               timeout=60_000)
        assert widget.inner_text() != before        # the kernel answered the slider through the widget


def test_lab01_check_cell_reports_not_implemented(browser, lab_server):
    if not (ROOT / LAB01).exists():
        pytest.skip(f"{LAB01} does not exist yet")
    nb = nbformat.read(ROOT / LAB01, as_version=4)
    checks = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and re.match(r"check_\w+\(", c.source)]
    assert checks, f"{LAB01} has no check cell (a line calling check_<exercise>(...))"
    index = checks[0]
    page = open_notebook(browser, lab_server, LAB01)
    run_through(page, index)
    output = cell(page, index).locator(".jp-OutputArea-output").first
    output.wait_for(state="visible", timeout=TIMEOUT_MS)
    page.wait_for_function("el => el.innerText.includes('not implemented yet')", arg=output.element_handle(),
                           timeout=TIMEOUT_MS)
    assert "not implemented yet" in output.inner_text()
    assert "Traceback" not in cell(page, index).inner_text()


LESSON5 = next(l for l in LESSONS if l.number == 5).notebook
SCREENSHOT = "site_lesson05_math.png"
# No network at all: every host name fails to resolve, and everything else (localhost included) is sent to
# a proxy on the discard port, where nothing listens. Only file:// loads.
OFFLINE_FLAGS = ["--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
                 "--proxy-bypass-list=<-loopback>"]
SITE_TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def offline_site(playwright, tmp_path_factory):
    """The built website's html folder and a Chromium that reaches no network."""
    from test_site import built_site

    html = built_site(tmp_path_factory) / "html"
    chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS + OFFLINE_FLAGS)
    try:
        yield html, chromium
    finally:
        chromium.close()


class SitePage:
    """A page of the website opened from disk, with what it asked of the network and the errors it raised."""

    def __init__(self, offline_site, rel: str, query: str = "", width: int = 1280):
        html, chromium = offline_site
        self.requested, self.errors = [], []
        self.page = chromium.new_page(viewport={"width": width, "height": 900})
        self.page.set_default_timeout(SITE_TIMEOUT_MS)
        self.page.route("**/*", self._only_files)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.goto((html / rel).as_uri() + query)

    def _only_files(self, route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            self.requested.append(route.request.url)
            route.abort()

    def images(self) -> list[tuple[str, int]]:
        """(src, natural width) of every image, once each has loaded or failed."""
        self.page.wait_for_function("Array.from(document.images).every(i => i.complete)")
        return self.page.evaluate("Array.from(document.images).map(i => [i.src, i.naturalWidth])")

    def visible_search_boxes(self) -> int:
        return self.page.evaluate("""Array.from(document.querySelectorAll(
            '.search-button-field, .search-button, form.bd-search, input[type=search]'))
            .filter(e => e.offsetWidth || e.offsetHeight || e.getClientRects().length).length""")

    def close(self):
        self.page.close()
        assert not self.requested, f"the page asked the network for {self.requested}"
        assert not self.errors, f"the page raised {self.errors}"


def test_site_lesson5_renders_its_math_offline(offline_site, tmp_path):
    """The website's lesson 5 page, opened from disk with every network request refused: MathJax (served
    by the site) typesets its formulas and its figures load. The screenshot goes to $ATTNKIT_SCREENSHOTS
    (or the test's temporary folder); figures/site_lesson05_math.png was taken this way."""
    if not (ROOT / LESSON5).exists():
        pytest.skip(f"{LESSON5} does not exist yet")
    site = SitePage(offline_site, LESSON5.replace(".ipynb", ".html"))
    page = site.page
    page.wait_for_function("document.querySelectorAll('mjx-container').length > 0")
    typeset = page.locator("mjx-container").count()
    errors = page.locator("mjx-merror").count()
    raw = page.locator("main").inner_text()
    images = site.images()
    page.evaluate("window.scrollTo(0, 0)")      # the numbered title, objectives (with math) and time
    out = os.environ.get("ATTNKIT_SCREENSHOTS") or str(tmp_path)
    page.screenshot(path=os.path.join(out, SCREENSHOT))
    site.close()
    assert typeset >= 3 and errors == 0, f"{typeset} formulas typeset, {errors} errors"
    assert "\\log_2" not in raw and "N_q" not in raw, "TeX source is showing instead of typeset math"
    assert any("/_images/" in src for src, _ in images), "lesson 5 shows no figure"
    assert [src for src, width in images if width == 0] == [], "figures that did not load"


def test_site_lesson3_widget_renders_offline(offline_site):
    """The tile stepper of lesson 3 is drawn from its stored state by the vendored html-manager."""
    lesson3 = next(l for l in LESSONS if l.number == 3).notebook
    if not (ROOT / lesson3).exists():
        pytest.skip(f"{lesson3} does not exist yet")
    site = SitePage(offline_site, lesson3.replace(".ipynb", ".html"))
    slider = site.page.locator(".tile-stepper .widget-slider").first
    slider.wait_for(state="visible")
    stepper = site.page.locator(".tile-stepper").first.inner_text()
    images = site.images()
    site.close()
    assert "tile step" in stepper and "step 4 of 4" in stepper, stepper[:300]
    assert images and [src for src, width in images if width == 0] == [], images


def test_site_search_finds_lessons_from_disk_and_each_page_has_one_search_box(offline_site):
    search = SitePage(offline_site, "search.html", "?q=softmax")
    # results from the index, then a snippet under each (from _static/search_text.js: fetch is refused here);
    # Sphinx appends the results one at a time, 5 ms apart, and says "Search finished" after the last
    search.page.wait_for_function("""() => {
        const summary = document.querySelector('#search-results p.search-summary');
        const items = document.querySelectorAll('#search-results li');
        return summary !== null && summary.innerText.startsWith('Search finished') && items.length > 0 &&
            document.querySelectorAll('#search-results li p.context').length === items.length;
    }""")
    found = search.page.eval_on_selector_all("#search-results li", """items => items.map(
        li => [li.querySelector('a').href, li.querySelector('p.context').innerText])""")
    search.close()
    lesson3 = next(l for l in LESSONS if l.number == 3).notebook.replace(".ipynb", ".html")
    snippets = [text for href, text in found if href.split("#")[0].endswith(lesson3)]
    assert snippets, f"lesson 3 is not among the results: {[href for href, _ in found]}"
    assert all("softmax" in text.lower() for text in snippets), snippets
    for width in (1280, 400):                  # the sidebar's search field; on a phone, the header's icon
        index = SitePage(offline_site, "index.html", width=width)
        count = index.visible_search_boxes()
        index.close()
        assert count == 1, f"{count} search boxes are shown at {width} px"
