"""Every lesson and solution runs the way a student on Colab runs it: from the installed wheel.

A fresh virtual environment that cannot see the repository or this environment's packages gets what
Colab's GPU runtime brings, where this machine can install it: torch 2.13.0 (the CPU build on disk),
NumPy, matplotlib, ipywidgets 7.7.1, and Triton 3.6 (it runs in its interpreter here). A fake
``google.colab`` module is imported when each kernel starts, as Colab does, so the setup cell takes its
Colab branch and installs the course itself, pointed at the wheel built here by ``ATTNKIT_PIP_SPEC``
(with no package index: every dependency must already be there, as in Colab). Copies of the lessons
and solutions, outside the repository, then run top to bottom, and every output nbval compares must be
the stored one.

The environment is built once per machine in the temporary folder (2 to 6 minutes on a 2-core machine,
most of it installing torch; later runs reuse it); ``tests/integration/test_no_triton.py`` runs the same notebooks in
it without Triton. Python is this interpreter's (3.11): the newest Python for which this machine has
torch 2.13's CPU build on disk.
"""
import copy
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom.course import LESSONS
from attnkit.classroom.notebooks import PIP_SPEC_VARIABLE, apply_headers, ignores_output, setup_source

pytestmark = pytest.mark.slow

# What Colab's GPU runtime has, as far as this machine can install it (torch 2.13.0 is the CPU build
# on disk, for Python 3.11 only; Colab's torch is a CUDA build, its Python 3.12).
PACKAGES = ["torch==2.13.0", "numpy", "matplotlib", "ipywidgets==7.7.1", "ipykernel", "nbclient", "nbformat"]
TRITON = "triton==3.6.0"
NOTEBOOKS = [rel for lesson in LESSONS for rel in (lesson.notebook, lesson.solution) if rel]
SANITIZE = [(re.compile(r"0x[0-9a-fA-F]{6,}"), "0xADDRESS"), (re.compile(r"/tmp/[^\s'\"]+"), "TMPPATH")]

DRIVER = textwrap.dedent('''
    """Run notebooks one by one with a kernel of this interpreter; print each one's time."""
    import sys, time
    from pathlib import Path
    import nbformat
    from nbclient import NotebookClient

    for path in sys.argv[1:]:
        start = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        nb.cells.append(nbformat.v4.new_code_cell(
            "import attnkit, importlib.metadata, importlib.util\\n"
            "print('attnkit from', attnkit.__file__, importlib.metadata.version('attnkit'))\\n"
            "print('triton', importlib.metadata.version('triton') if importlib.util.find_spec('triton') else '-')"))
        client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": str(Path(path).parent)}})
        client.execute()
        for cell in nb.cells:
            cell.pop("id", None)            # the stored notebooks are nbformat 4.4, without cell ids
        nbformat.write(nb, path)
        print(f"{time.perf_counter() - start:7.1f} s  {path}", flush=True)
''')


def run(cmd, timeout=1500, **kw):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def texts(cell) -> str:
    """The text nbval compares in a cell's outputs, sanitized as tests/nbval_sanitize.cfg does."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream" and out.name == "stdout":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                continue            # a widget's repr names its library version's classes
            parts.append(data.get("text/plain", ""))
    text = "".join(parts)
    for pattern, replacement in SANITIZE:
        text = pattern.sub(replacement, text)
    return text


def errors(nb) -> list[str]:
    found = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                found.append(f"cell {index}: {out.ename}: {out.evalue}")
    return found


def build_wheel(tmp: Path) -> Path:
    """A wheel built offline from a copy of the package sources (no stale build/ folder can leak in)."""
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


class ColabEnv:
    """The fresh environment: ``python`` (no Triton importable) and ``triton_path`` (Triton 3.6, added
    to PYTHONPATH for a run with Triton)."""

    def __init__(self, root: Path):
        self.root = root
        self.python = root / "venv" / "bin" / "python"
        self.triton_path = root / "triton"

    def purelib(self) -> Path:
        return Path(run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
                    .stdout.strip())

    def pip(self, *args, env=None):
        return run([str(self.python), "-m", "pip", "-q", "--disable-pip-version-check", *args], env=env)

    def uninstall_attnkit(self):
        run([str(self.python), "-m", "pip", "uninstall", "-y", "-q", "attnkit"])


def colab_env() -> ColabEnv:
    """Build the environment once per machine (a lock lets parallel test workers share it)."""
    key = hashlib.sha256(repr((PACKAGES, TRITON, sys.version)).encode()).hexdigest()[:12]
    env = ColabEnv(Path(tempfile.gettempdir()) / f"attnkit-colab-env-{key}")
    env.root.mkdir(exist_ok=True)
    with open(env.root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env.root / "ready").exists():
            for sub in ("venv", "triton"):
                shutil.rmtree(env.root / sub, ignore_errors=True)
            # The base interpreter, not this venv's: `venv` without --system-site-packages sees nothing else.
            run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(env.root / "venv")])
            env.pip("install", *PACKAGES)
            env.pip("install", "--no-deps", "--target", str(env.triton_path), TRITON)
            (env.root / "ready").write_text("\n".join(PACKAGES + [TRITON]) + "\n")
    return env


STORED = {}        # relpath -> the notebook as it was copied (its stored outputs are what a run must match)


def copy_notebooks(dest: Path) -> list[Path]:
    """Copies of the lessons and solutions, with the headers `make headers` writes (a no-op when they
    are current; tests/classroom/test_notebooks.py checks that they are)."""
    copies = []
    for rel in NOTEBOOKS:
        if (ROOT / rel).exists():
            nb = nbformat.read(ROOT / rel, as_version=4)
            STORED[rel] = copy.deepcopy(nb)
            apply_headers(nb, rel)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, dest / rel)
            copies.append(dest / rel)
    return copies


def run_notebooks(env: ColabEnv, copies, workdir: Path, extra_env: dict) -> str:
    (workdir / "driver.py").write_text(DRIVER)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TRITON"))}
    child_env.update(extra_env)
    child_env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    done = run([str(env.python), str(workdir / "driver.py"), *map(str, copies)], timeout=1500,
               cwd=workdir, env=child_env)
    return done.stdout


def compare_with_stored(rel: str, ran) -> int:
    """Assert every output nbval compares equals the stored one; return how many had text."""
    stored = STORED.get(rel) or nbformat.read(ROOT / rel, as_version=4)
    compared = 0
    for index, (want, got) in enumerate(zip(stored.cells, ran.cells)):
        if want.cell_type != "code" or ignores_output(want):
            continue
        assert texts(got) == texts(want), (f"{rel}, cell {index}: output differs from the stored one:\n"
                                           f"--- stored\n{texts(want)}\n--- ran\n{texts(got)}")
        compared += bool(texts(want))
    return compared


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_carries_the_whole_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(ROOT).as_posix() for p in (ROOT / "attnkit").rglob("*.py")
                if "__pycache__" not in p.parts}
    expected |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "attnkit" / "bench" / "results").glob("*.csv")}
    assert any(n.startswith("attnkit/bench/results/") for n in expected), "no recorded results to ship"
    assert expected - names == set()


def test_every_lesson_and_solution_runs_from_a_colab_style_install(wheel, tmp_path):
    start = time.perf_counter()
    env = colab_env()
    built = time.perf_counter() - start
    env.uninstall_attnkit()                       # the setup cell must install it
    site_packages = env.purelib()
    assert not (site_packages / "attnkit").exists()
    assert f'os.environ.get("{PIP_SPEC_VARIABLE}"' in setup_source()

    # Colab imports google.colab in every kernel before the first cell runs.
    fake = tmp_path / "fake-colab"
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "__init__.py").write_text("")
    (fake / "google" / "colab" / "__init__.py").write_text('"""Stands in for Colab\'s module."""\n')
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-colab.py").write_text("import google.colab  # noqa: F401\n")

    course = tmp_path / "course"
    copies = copy_notebooks(course)
    assert len(copies) == len([r for r in NOTEBOOKS if (ROOT / r).exists()]) >= 10
    log = run_notebooks(env, copies, tmp_path, {
        "PYTHONPATH": os.pathsep.join([str(fake), str(env.triton_path)]),
        "IPYTHONDIR": str(tmp_path / "ipython"),
        PIP_SPEC_VARIABLE: str(wheel),
        "PIP_NO_INDEX": "1",                      # no index: the dependencies must already be there
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    })
    print(f"environment ready in {built:.0f} s; notebooks:\n{log}")

    assert (site_packages / "attnkit").is_dir(), "the setup cell did not install the course"
    problems = []
    for rel, path in zip([c.relative_to(course).as_posix() for c in copies], copies):
        ran = nbformat.read(path, as_version=4)
        if errors(ran):
            problems.append(f"{rel} failed from the wheel: {errors(ran)}")
            continue
        banner = texts(ran.cells[1])
        last = "".join(o.get("text", "") for o in ran.cells[-1].outputs)     # the probe's lines: one output or two
        if not ("in Colab" in banner and "Triton interpreter" in banner):
            problems.append(f"{rel}: the setup cell says {banner!r}")
        if f"attnkit from {site_packages}" not in last or str(ROOT) in last or "triton 3.6" not in last:
            problems.append(f"{rel}: {last!r}")
        try:
            assert compare_with_stored(rel, ran), f"{rel}: no stored text output to compare"
        except AssertionError as err:
            problems.append(str(err))
    assert not problems, "\n\n".join(problems)
