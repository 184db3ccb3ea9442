"""Labs are made from solutions: marked regions cleared, outputs gone, student edits protected, and no
line of a solution ever reaches a lab."""
import nbformat
import nbformat.v4 as v4
import pytest

from attnkit.classroom import labgen
from attnkit.classroom.labgen import clear_solutions


def test_marked_region_becomes_one_raise_at_its_indentation():
    source = "def f(x):\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n    ### END SOLUTION\n\nprint(1)"
    assert clear_solutions(source) == "def f(x):\n    raise NotImplementedError\n\nprint(1)"


def test_code_outside_regions_is_kept_and_several_regions_work():
    source = "a = 1\n### BEGIN SOLUTION\nb = 2\n### END SOLUTION\nc = 3\n### BEGIN SOLUTION\nd = 4\n### END SOLUTION"
    assert clear_solutions(source) == "a = 1\nraise NotImplementedError\nc = 3\nraise NotImplementedError"


@pytest.mark.parametrize("bad", ["### BEGIN SOLUTION\nx", "x\n### END SOLUTION",
                                 "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION"])
def test_unbalanced_markers_are_errors(bad):
    with pytest.raises(ValueError, match="source"):
        clear_solutions(bad)


@pytest.mark.parametrize("marker", ["## BEGIN SOLUTION", "#### BEGIN SOLUTION", "### begin solution",
                                    "# BEGIN_SOLUTION", "### BEGIN SOLUTION: the max shift",
                                    "### END SOLUTIONS"])
def test_a_misspelled_marker_is_an_error_naming_its_line(marker):
    source = f"def f(x):\n    {marker}\n    return x + 1\n    ### END SOLUTION"
    if "END" in marker:
        source = f"def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    {marker}"
    with pytest.raises(ValueError, match=r"line [24]: .* looks like a solution marker"):
        clear_solutions(source)


def solved(number, slug, *code):
    nb = v4.new_notebook(cells=[
        v4.new_markdown_cell(labgen.badge_line(f"solutions/lab{number:02d}_{slug}.ipynb") + "\n\n# Demo"),
        *[v4.new_code_cell(c, execution_count=i) for i, c in enumerate(code, start=1)],
    ])
    nb.cells[1].outputs = [v4.new_output("stream", name="stdout", text="1\n")]
    return nb


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A throw-away course with one solved lab, wired into labgen."""
    from attnkit.classroom.course import Lesson

    (tmp_path / "solutions").mkdir()
    lesson = Lesson(1, "demo", "Demo", True)
    nbformat.write(solved(1, "demo", "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
                   tmp_path / lesson.solution)
    monkeypatch.setattr(labgen, "ROOT", tmp_path)
    monkeypatch.setattr(labgen, "LESSONS", (lesson,))
    return tmp_path, lesson


@pytest.fixture
def two_labs(tmp_path, monkeypatch):
    """Lab 01 with a misspelled marker, lab 02 correct."""
    from attnkit.classroom.course import Lesson

    (tmp_path / "solutions").mkdir()
    bad, good = Lesson(1, "bad", "Bad", True), Lesson(2, "good", "Good", True)
    nbformat.write(solved(1, "bad", "import numpy as np",
                          "def softmax(s):\n    ## BEGIN SOLUTION\n    e = np.exp(s - s.max())\n"
                          "    return e / e.sum()\n    ### END SOLUTION"), tmp_path / bad.solution)
    nbformat.write(solved(2, "good", "def g(x):\n    ### BEGIN SOLUTION\n    return x * 2\n    ### END SOLUTION"),
                   tmp_path / good.solution)
    monkeypatch.setattr(labgen, "ROOT", tmp_path)
    monkeypatch.setattr(labgen, "LESSONS", (bad, good))
    return tmp_path, bad, good


def test_generation_clears_outputs_and_points_the_badge_at_the_lab(course):
    root, lesson = course
    assert labgen.main([]) == 0
    lab = nbformat.read(root / lesson.lab, as_version=4)
    assert lab.cells[1].source == "def f():\n    raise NotImplementedError"
    assert lab.cells[1].outputs == [] and lab.cells[1].execution_count is None
    assert "labs/lab01_demo.ipynb" in lab.cells[0].source and "solutions/" not in lab.cells[0].source
    assert labgen.main(["--check"]) == 0


def test_check_fails_when_a_solution_changed(course, capsys):
    root, lesson = course
    labgen.main([])
    sol = nbformat.read(root / lesson.solution, as_version=4)
    sol.cells.append(v4.new_markdown_cell("new text"))
    nbformat.write(sol, root / lesson.solution)
    assert labgen.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().out


def test_a_students_edits_survive_regeneration_unless_forced(course, capsys):
    root, lesson = course
    labgen.main([])
    lab = nbformat.read(root / lesson.lab, as_version=4)
    lab.cells[1].source = "def f():\n    return 1  # my answer"
    nbformat.write(lab, root / lesson.lab)
    sol = nbformat.read(root / lesson.solution, as_version=4)
    sol.cells.append(v4.new_markdown_cell("an update"))
    nbformat.write(sol, root / lesson.solution)

    labgen.main([])
    assert "left alone" in capsys.readouterr().out
    assert "my answer" in (root / lesson.lab).read_text()
    labgen.main(["--force"])
    assert "my answer" not in (root / lesson.lab).read_text()


def test_a_misspelled_marker_fails_naming_file_cell_and_line_and_the_other_labs_are_still_made(two_labs, capsys):
    root, bad, good = two_labs
    assert labgen.main([]) == 1
    out = capsys.readouterr().out
    assert "error: solutions/lab01_bad.ipynb: code cell 2: line 2: '## BEGIN SOLUTION' looks like a " \
           "solution marker" in out
    assert "error: labs/lab01_bad.ipynb was not written" in out
    assert not (root / bad.lab).exists()                          # the solution never reached a lab
    assert "return x * 2" not in (root / good.lab).read_text()    # the good lab was made
    assert labgen.main(["--check"]) == 1


def test_an_unbalanced_marker_names_file_and_cell(course, capsys):
    root, lesson = course
    nbformat.write(solved(1, "demo", "x = 1", "def f():\n    ### BEGIN SOLUTION\n    return 1"),
                   root / lesson.solution)
    assert labgen.main([]) == 1
    assert "error: solutions/lab01_demo.ipynb: code cell 2: '### BEGIN SOLUTION' without '### END SOLUTION'" \
        in capsys.readouterr().out


def test_check_fails_when_a_lab_holds_a_line_of_its_solution(course, capsys):
    root, lesson = course
    nbformat.write(solved(1, "demo", "def f():\n    ### BEGIN SOLUTION\n    return sum(range(10))\n"
                                     "    ### END SOLUTION"), root / lesson.solution)
    assert labgen.main([]) == 0 and labgen.main(["--check"]) == 0
    lab = nbformat.read(root / lesson.lab, as_version=4)
    lab.cells[1].source = "def f():\n    return sum(range(10))"       # pasted from the solution
    nbformat.write(lab, root / lesson.lab)
    assert labgen.main(["--check"]) == 1
    assert "error: labs/lab01_demo.ipynb: code cell 1: holds the solution's line 'return sum(range(10))'" \
        in capsys.readouterr().out


def test_a_line_the_solution_also_has_outside_its_regions_is_not_a_leak():
    sol = v4.new_notebook(cells=[v4.new_code_cell("print(long_variable_name)"),
                                 v4.new_code_cell("### BEGIN SOLUTION\nprint(long_variable_name)\n"
                                                  "answer = compute_it()\n### END SOLUTION")])
    lab = v4.new_notebook(cells=[v4.new_code_cell("print(long_variable_name)"),
                                 v4.new_code_cell("answer = compute_it()")])
    assert labgen.leaked_lines(sol, lab) == [(2, "answer = compute_it()")]


def test_force_keeps_the_students_edited_lab_as_a_backup(course, capsys):
    root, lesson = course
    labgen.main([])
    lab = nbformat.read(root / lesson.lab, as_version=4)
    lab.cells[1].source = "def f():\n    return 1  # my answer"
    nbformat.write(lab, root / lesson.lab)
    sol = nbformat.read(root / lesson.solution, as_version=4)
    sol.cells.append(v4.new_markdown_cell("an update"))
    nbformat.write(sol, root / lesson.solution)
    assert labgen.main(["--force"]) == 0
    backups = list((root / "labs").glob("lab01_demo.ipynb.bak-*"))
    assert len(backups) == 1 and "my answer" in backups[0].read_text()
    assert "my answer" not in (root / lesson.lab).read_text()
    assert f"kept the edited labs/lab01_demo.ipynb as labs/{backups[0].name}" in capsys.readouterr().out
    assert labgen.main(["--force"]) == 0                                  # unedited now: no new backup
    assert len(list((root / "labs").glob("lab01_demo.ipynb.bak-*"))) == 1
