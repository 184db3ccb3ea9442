"""The course installs the way Colab's setup cell installs it, and lessons 0 and 1 run from that install.

Colab already has torch, numpy and friends; its setup cell runs `pip install -q attnkit @ git+...`.
Here: build the wheel offline, make a fresh virtual environment that sees this environment's packages
(but not its editable attnkit), `pip install -q` the wheel there without an index (so every dependency
must already be satisfied, as in Colab), and run copies of lessons 0 and 1 outside the repository with
a kernel of that environment.
"""
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom.course import LESSONS
from attnkit.classroom.notebooks import IGNORE_MARKER, setup_source

pytestmark = pytest.mark.slow
LESSONS_RUN = [l.notebook for l in LESSONS if l.number in (0, 1)]
SANITIZE = [(re.compile(r"0x[0-9a-fA-F]{6,}"), "0xADDRESS"), (re.compile(r"/tmp/[^\s'\"]+"), "TMPPATH")]

DRIVER = textwrap.dedent('''
    """Run notebooks with a kernel of this interpreter; end each with a cell naming attnkit's file."""
    import sys
    import nbformat
    from nbclient import NotebookClient

    for path in sys.argv[1:]:
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(
            "import attnkit, importlib.metadata\\n"
            "print('attnkit from', attnkit.__file__, importlib.metadata.version('attnkit'))"))
        NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                       resources={"metadata": {"path": str(__import__("pathlib").Path(path).parent)}}).execute()
        nbformat.write(nb, path)
''')


def run(cmd, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def texts(cell) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream" and out.name == "stdout":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.get("data", {}).get("text/plain", ""))
    text = "".join(parts)
    for pattern, replacement in SANITIZE:
        text = pattern.sub(replacement, text)
    return text


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built offline from a copy of the package sources (no stale build/ folder can leak in)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "attnkit", src / "attnkit",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
         "--disable-pip-version-check", "-w", str(tmp / "dist")], cwd=src)
    wheels = list((tmp / "dist").glob("attnkit-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_carries_the_whole_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "attnkit").rglob("*.py")
                if "__pycache__" not in p.parts}
    expected |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "attnkit" / "data").glob("*") if p.is_file()}
    assert expected - names == set()


def test_lessons_0_and_1_run_from_a_colab_style_install(wheel, tmp_path):
    for rel in LESSONS_RUN:
        if not (ROOT / rel).exists():
            pytest.skip(f"{rel} does not exist yet")
    # A fresh environment that sees this one's packages (torch, numpy, nbclient...) the way Colab's
    # interpreter sees its preinstalled ones: a path line, so the editable install's hook never runs.
    env_dir = tmp_path / "colab-env"
    run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    site_packages = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                         .stdout.strip())
    (site_packages / "course-preinstalled.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # The setup cell's command, `python -m pip install -q <spec>`, with the wheel as the spec; no index,
    # so every dependency must already be there, as it is in Colab.
    done = run([str(python), "-m", "pip", "install", "-q", "--no-index", "--disable-pip-version-check",
                str(wheel)])
    assert "ERROR" not in done.stderr
    installed = run([str(python), "-c", "import attnkit; print(attnkit.__file__)"], cwd=tmp_path).stdout.strip()
    assert installed.startswith(str(site_packages)), f"attnkit imported from {installed}, not from the wheel"
    assert 'subprocess.run([sys.executable, "-m", "pip", "install", "-q",' in setup_source()

    # Copies of the lessons outside the repository, run by a kernel of the new environment.
    course = tmp_path / "course"
    copies = []
    for rel in LESSONS_RUN:
        (course / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, course / rel)
        copies.append(course / rel)
    (tmp_path / "driver.py").write_text(DRIVER)
    run([str(python), str(tmp_path / "driver.py"), *map(str, copies)], cwd=tmp_path)

    for rel, copy in zip(LESSONS_RUN, copies):
        stored = nbformat.read(ROOT / rel, as_version=4)
        ran = nbformat.read(copy, as_version=4)
        last = texts(ran.cells[-1])
        assert f"attnkit from {site_packages}" in ran.cells[-1].outputs[0].text, last
        assert str(ROOT) not in ran.cells[-1].outputs[0].text
        # Every output that nbval compares is the same as the stored one.
        compared = 0
        for index, (want, got) in enumerate(zip(stored.cells, ran.cells)):
            if want.cell_type != "code" or want.source.startswith(IGNORE_MARKER):
                continue
            assert texts(got) == texts(want), f"{rel}, cell {index}: output differs from the stored one"
            compared += bool(texts(want))
        assert compared, f"{rel}: no stored text output to compare"
