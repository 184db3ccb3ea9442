"""The committed notebooks are in the state nbval and students need."""
import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom import notebooks
from attnkit.classroom.course import LESSONS
from attnkit.classroom.labgen import main as labgen_main

COMMITTED = [p for p in notebooks.course_notebooks()]
EXECUTED = [p for p in COMMITTED if p.parent.name in ("notebooks", "solutions")]
LABS = [p for p in COMMITTED if p.parent.name == "labs"]


def _ids(paths):
    return [p.relative_to(ROOT).as_posix() for p in paths]


def test_every_file_in_the_notebook_folders_belongs_to_the_course():
    known = {ROOT / rel for lesson in LESSONS for rel in (lesson.notebook, lesson.lab, lesson.solution) if rel}
    for folder in ("notebooks", "labs", "solutions"):
        for path in (ROOT / folder).glob("*.ipynb"):
            assert path in known, f"{path.name} is not in attnkit/course.py's LESSONS"


@pytest.mark.parametrize("path", EXECUTED, ids=_ids(EXECUTED))
def test_lessons_and_solutions_are_executed_without_errors(path):
    assert notebooks.state_problems(path) == []


@pytest.mark.parametrize("path", LABS, ids=_ids(LABS))
def test_labs_have_no_stored_outputs(path):
    assert notebooks.state_problems(path, lab=True) == []


@pytest.mark.parametrize("path", COMMITTED, ids=_ids(COMMITTED))
def test_one_marker_convention_for_device_dependent_cells(path):
    assert notebooks.marker_problems(path) == []


@pytest.mark.parametrize("path", COMMITTED, ids=_ids(COMMITTED))
def test_each_notebook_opens_with_its_colab_badge_and_setup_cell(path):
    assert notebooks.header_problems(path) == []


def test_labs_are_up_to_date_with_their_solutions():
    assert labgen_main(["--check"]) == 0, "run `make labs`"


def test_marker_check_rejects_bad_markers(tmp_path):
    import nbformat.v4 as v4

    cells = [v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(1)"),                 # no reason line
             v4.new_code_cell("# NBVAL_SKIP\nprint(1)"),                            # another marker
             v4.new_code_cell("print(1)", metadata={"tags": ["nbval-ignore-output"]}),
             v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\n# device-dependent: timing\nprint(1)")]  # fine
    path = tmp_path / "x.ipynb"
    nbformat.write(v4.new_notebook(cells=cells), path)
    problems = notebooks.marker_problems(path)
    assert len(problems) == 3 and not any("code cell 3" in p for p in problems)


def test_state_check_rejects_unexecuted_cells_errors_and_lab_outputs(tmp_path):
    import nbformat.v4 as v4

    cell = v4.new_code_cell("1/0", execution_count=1)
    cell.outputs = [v4.new_output("error", ename="ZeroDivisionError", evalue="", traceback=[])]
    path = tmp_path / "x.ipynb"
    nbformat.write(v4.new_notebook(cells=[v4.new_code_cell("x = 1"), cell]), path)
    problems = notebooks.state_problems(path)
    assert any("never executed" in p for p in problems) and any("stores an error" in p for p in problems)
    assert any("stored outputs" in p for p in notebooks.state_problems(path, lab=True))


def test_readme_contents_and_headers_are_current(capsys):
    assert notebooks.main(["headers", "--check"]) == 0, capsys.readouterr().out + " (run `make headers`)"
