"""environment.yml (conda) and pyproject.toml (pip) describe the same environment."""
import re
import tomllib

from conftest import ROOT


def _name(requirement: str) -> str:
    return re.split(r"[<>=!;\[ ]", requirement.strip(), maxsplit=1)[0].lower()


def pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # The student's environment: the package and its "lab" extra (the authors' "dev" extra is added by pip).
    reqs = project["dependencies"] + project["optional-dependencies"]["lab"]
    return {r.replace(" ", "") for r in reqs}


def test_extras_split_the_students_install_from_the_authors():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {extra: {_name(r) for r in reqs} for extra, reqs in extras.items()}
    assert {"jupyterlab", "ipykernel"} <= names["lab"]
    assert not names["lab"] & {"pytest", "nbval", "playwright", "ruff", "myst-nb"}, "test tools are the authors'"
    assert "attnkit" in names["dev"] and {"pytest", "nbval"} <= names["dev"]


def conda_pip_requirements() -> list[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "- pip:")
    reqs = []
    for line in lines[start + 1:]:
        match = re.match(r"^\s+- (.+)$", line)
        if not match:
            break
        reqs.append(match.group(1).strip())
    return reqs


def test_conda_environment_lists_every_pip_requirement():
    # torch is pinned in the set-up step only (Makefile and environment.yml), loose in the package.
    conda = {r.replace(" ", "") for r in conda_pip_requirements() if not r.startswith(("-e", "torch=="))}
    package = {r for r in pyproject_requirements() if _name(r) != "torch"}
    assert conda == package


def test_conda_environment_pins_the_same_torch_as_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    pin = "torch==" + re.search(r"^TORCH_VERSION \?= ([\d.]+)$", makefile, re.M).group(1)
    assert pin in conda_pip_requirements()
    assert "-e ." in conda_pip_requirements()


def test_package_ranges_stay_loose():
    # Colab brings its own torch and triton: the package itself never pins exact versions.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    every = pyproject_requirements() | {r for reqs in extras.values() for r in reqs}
    assert not any("==" in r.split(";")[0] for r in every)
