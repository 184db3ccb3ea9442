"""The course's environment: environment.yml (conda) and pyproject.toml (pip) describe the same one;
every address of the course is made from its one home and release; a linked `.venv` still grades."""
import re
import tomllib
from pathlib import Path

import pytest
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


# ---------------------------------------------------------------- one home, one release (issue 41.2)
# Every address of the course that a notebook, the README, CITATION.cff or the package metadata shows
# is made from attnkit/classroom/course.py: REPO_URL, and REF (the tag of attnkit.__version__).
def _course_addresses():
    from attnkit.classroom import course

    slug = course.REPO_URL.removeprefix("https://github.com/")
    return course, slug


def _addresses_in(text: str) -> list[str]:
    """Every address that names a GitHub repository through Colab, pip's git+ form or github.com."""
    found = re.findall(r"(?:git\+)?https://(?:colab\.research\.google\.com/github|github\.com)/"
                       r"[^\s\"'()<>\]`]+", text)
    return [a.rstrip(".,;:") for a in found]


def _address_problem(address: str) -> str | None:
    """Why ``address`` is not one the course builds from REPO_URL and REF (None when it is)."""
    course, slug = _course_addresses()
    colab = course.colab_url("")
    if slug not in address and "attention-kernels-course" not in address:
        return None                                  # another project's page (a citation, a reference)
    if address in (course.REPO_URL, f"{course.REPO_URL}/issues", f"git+{course.REPO_URL}@{course.REF}"):
        return None
    for prefix in (course.repo_url(""), f"{course.REPO_URL}/blob/{course.REF}/", colab):
        if address.startswith(prefix) and prefix != course.REPO_URL:
            path = address[len(prefix):].split("#")[0]
            return None if (ROOT / path).exists() else f"{address}: {path} is not in the repository"
    return f"{address}: not made from REPO_URL={course.REPO_URL} and REF={course.REF}"


def _notebook_texts(path):
    """A notebook's sources and the text of its stored outputs (what it shows and prints)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for index, cell in enumerate(nb.cells):
        yield index, cell.source
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            yield index, "".join([out.get("text", ""), data.get("text/plain", ""),
                                  "".join(data.get("text/html", "")), "".join(data.get("text/markdown", ""))])


def test_the_release_is_the_packages_version():
    import attnkit

    course, _ = _course_addresses()
    assert course.RELEASE == course.REF == f"v{attnkit.__version__}"
    assert course.REF != "main" and not course.REF.startswith("v0.0")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "attnkit.__version__"}
    assert course.pip_spec() == f"attnkit @ git+{course.REPO_URL}@{course.REF}"


def test_every_address_the_notebooks_show_or_print_is_made_from_the_course_home():
    from attnkit.classroom import notebooks

    course, _ = _course_addresses()
    paths = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb")) + \
        sorted((ROOT / "labs").glob("*.ipynb"))
    assert len(paths) >= 30
    problems, seen = [], 0
    for path in paths:
        for index, text in _notebook_texts(path):
            for address in _addresses_in(text):
                seen += 1
                problem = _address_problem(address)
                if problem:
                    problems.append(f"{path.relative_to(ROOT)}, cell {index}: {problem}")
            for moving in ("@main", "/blob/main/", "/tree/main/"):
                if course.REPO_URL in text and moving in text:
                    problems.append(f"{path.relative_to(ROOT)}, cell {index}: an address into {moving}")
    assert not problems, "\n".join(problems)
    assert seen >= 3 * len(paths)                    # a badge, a glossary link and an install line each
    # What the notebooks print at run time: the note of a cell skipped without Triton, the glossary link.
    assert notebooks.recorded_copy("notebooks/01_attention_by_hand.ipynb") == \
        course.repo_url("notebooks/01_attention_by_hand.ipynb")
    assert notebooks.recorded_copy("lab01_attention_by_hand.ipynb") == \
        course.repo_url("solutions/lab01_attention_by_hand.ipynb")
    assert notebooks.GLOSSARY_URL == course.repo_url("docs/glossary.md")
    assert course.pip_spec() in notebooks.setup_source()


def test_the_address_rule_rejects_a_branch_another_home_and_a_missing_file():
    course, slug = _course_addresses()
    assert _address_problem(course.colab_url("notebooks/00_setup.ipynb")) is None
    assert _address_problem(f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/00_setup.ipynb")
    assert _address_problem(f"git+{course.REPO_URL}@main")
    assert _address_problem(course.repo_url("notebooks/99_missing.ipynb"))
    assert _address_problem("https://github.com/someone/attention-kernels-course/blob/v0.1.0/README.md")
    assert _address_problem("https://github.com/openai/triton/blob/main/README.md") is None


def test_readme_citation_and_package_metadata_name_the_same_home_and_release():
    import attnkit

    course, _ = _course_addresses()
    readme = (ROOT / "README.md").read_text()
    problems = [p for p in map(_address_problem, _addresses_in(readme)) if p]
    assert not problems, problems
    assert course.colab_url("notebooks/00_setup.ipynb") in readme

    cff = (ROOT / "CITATION.cff").read_text()
    fields = dict(re.findall(r"^([a-z-]+): \"?(.*?)\"?$", cff, re.M))
    assert fields["version"] == attnkit.__version__
    assert fields["repository-code"] == course.REPO_URL and fields["url"] == course.REPO_URL
    import datetime

    released = datetime.date.fromisoformat(fields["date-released"])
    assert released <= datetime.date.today()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    cff_authors = re.findall(r"^  - name: \"(.*)\"$", cff, re.M)
    assert cff_authors and cff_authors == [a["name"] for a in project["authors"]]
    assert project["urls"]["Source"] == course.REPO_URL
    assert all(not _address_problem(url) for url in project["urls"].values())
    assert project["classifiers"] and project["keywords"]


# ------------------------------------------------- a .venv that links to an environment elsewhere (41.7)
def test_the_sandbox_shows_a_linked_environment_under_its_linked_name(tmp_path, monkeypatch):
    import sys

    from attnkit.classroom.grading import sandbox

    real = tmp_path / "envs" / "course"
    (real / "bin").mkdir(parents=True)
    link = tmp_path / "course" / ".venv"
    link.parent.mkdir()
    link.symlink_to(real, target_is_directory=True)
    for name in ("prefix", "exec_prefix"):
        monkeypatch.setattr(sys, name, str(link))
    monkeypatch.setattr(sys, "executable", str(link / "bin" / "python"))
    assert sandbox.environment_aliases() == [(str(real), str(link))]  # once: bin/ is inside the prefix
    args = sandbox.bwrap_args(sandbox.Budgets(), drop=False)
    binds = [tuple(args[i + 1:i + 3]) for i, a in enumerate(args) if a == "--ro-bind"]
    assert (str(real), str(real)) in binds and (str(real), str(link)) in binds
    assert binds.index((str(real), str(link))) > binds.index((str(real), str(real)))

    monkeypatch.setattr(sys, "prefix", str(real))                 # no link: nothing more to show
    monkeypatch.setattr(sys, "exec_prefix", str(real))
    monkeypatch.setattr(sys, "executable", str(real / "bin" / "python"))
    assert sandbox.environment_aliases() == []


@pytest.mark.slow
def test_make_grade_through_a_linked_venv_gives_the_solution_its_marks(tmp_path):
    """`make grade` with `.venv` a link to a venv elsewhere: the sandbox must find the interpreter by
    the linked name (before, bwrap could not exec it and every exercise got 0). About 10 s."""
    import subprocess
    import sys

    from attnkit.classroom.grading import sandbox

    problem = sandbox.sandbox_problem()
    if problem:
        pytest.skip(f"no sandbox here: {problem}")
    link = tmp_path / "elsewhere" / ".venv"
    link.parent.mkdir()
    link.symlink_to(Path(sys.prefix).resolve(), target_is_directory=True)
    out = tmp_path / "grades"
    done = subprocess.run([str(link / "bin" / "python"), "-m", "attnkit.classroom.grading", "--lab", "01",
                           "--out", str(out), "--strict", "--require-sandbox",
                           str(ROOT / "solutions" / "lab01_attention_by_hand.ipynb")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = (out / "grades.csv").read_text().splitlines()
    header, row = rows[0].split(","), rows[1].split(",")
    assert row[header.index("score")] == row[header.index("total")] == "5"
    assert row[header.index("sandboxed")] == "yes"
