"""In a real browser: JupyterLab runs lesson 3's widget and lab 01's check cell.

Headless Chromium is Debian's (`apt-get install chromium`; .ci/run installs it when run as root),
driven by Playwright; no browser is downloaded. JupyterLab serves a copy of the notebooks, with their
stored outputs cleared, so that what the test sees comes from running the cells now and nothing is
saved over the course's files.
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
def lab_server(tmp_path_factory):
    """JupyterLab on localhost serving cleared copies of lesson 3 and lab 01: (base url, token, root)."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it as root)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
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
def browser(lab_server, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
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


def test_site_lesson5_renders_its_math_offline(browser, tmp_path):
    """The website's lesson 5 page, opened from disk with every network request refused: MathJax (served
    by the site) typesets its formulas. The screenshot goes to $ATTNKIT_SCREENSHOTS (or the test's
    temporary folder); figures/site_lesson05_math.png was taken this way."""
    from attnkit.classroom import site
    from attnkit.classroom.notebooks import apply_headers

    root = tmp_path / "course"
    (root / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "glossary.md", root / "docs" / "glossary.md")
    nb = nbformat.read(ROOT / LESSON5, as_version=4)
    apply_headers(nb, LESSON5)              # a no-op once `make headers` has run
    (root / LESSON5).parent.mkdir(parents=True)
    nbformat.write(nb, root / LESSON5)
    shutil.copytree(ROOT / "figures", root / "figures")
    html = site.build(tmp_path / "site", root=root)
    page_file = html / site.html_path(LESSON5)
    refused = []

    def only_files(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page = browser.new_page()
    try:
        page.set_viewport_size({"width": 1280, "height": 900})
        page.route("**/*", only_files)
        page.goto(page_file.as_uri())
        page.wait_for_function("document.querySelectorAll('mjx-container').length > 0", timeout=60_000)
        typeset = page.locator("mjx-container").count()
        errors = page.locator("mjx-merror").count()
        raw = page.locator("main").inner_text()
        page.evaluate("window.scrollTo(0, 0)")      # the numbered title, objectives (with math) and time
        out = os.environ.get("ATTNKIT_SCREENSHOTS") or str(tmp_path)
        page.screenshot(path=os.path.join(out, SCREENSHOT))
    finally:
        page.close()
    assert typeset >= 3 and errors == 0, f"{typeset} formulas typeset, {errors} errors"
    assert "\\log_2" not in raw and "N_q" not in raw, "TeX source is showing instead of typeset math"
    assert not [u for u in refused if "mathjax" in u.lower()], f"MathJax was fetched from the network: {refused}"
