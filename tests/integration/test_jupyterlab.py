"""`make lab` serves the course: start it, list the notebooks over HTTP, stop it."""
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
from conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_make_lab_serves_the_notebook_list(tmp_path):
    port, token = free_port(), "course-test-token"
    args = f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.token={token} --ServerApp.port_retries=0"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    server = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api/contents/notebooks?token={token}"
    try:
        listing, deadline = None, time.monotonic() + 90
        while listing is None and time.monotonic() < deadline:
            assert server.poll() is None, "the JupyterLab server exited early"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    listing = json.load(response)
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "JupyterLab did not answer within 90 s"
        names = {item["name"] for item in listing["content"]}
        expected = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
        assert expected and expected <= names
        # No news pop-up: the plugin that asks is disabled, and the server fetches no news.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as response:
            page = response.read().decode()
        config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                      page, re.S).group(1))
        assert "@jupyterlab/apputils-extension:announcements" in config["disabledExtensions"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab/api/news?token={token}", timeout=10) as response:
            assert json.load(response)["news"] == []
    finally:
        stop(server)


def stop(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
