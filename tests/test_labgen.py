"""Labs are made from solutions: marked regions cleared, outputs gone, student edits protected."""
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


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A throw-away course with one solved lab, wired into labgen."""
    from attnkit.classroom.course import Lesson

    (tmp_path / "solutions").mkdir()
    lesson = Lesson(1, "demo", "Demo", True)
    nb = v4.new_notebook(cells=[
        v4.new_markdown_cell(labgen.badge_line("solutions/lab01_demo.ipynb") + "\n\n# Demo"),
        v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                         execution_count=1),
    ])
    nb.cells[1].outputs = [v4.new_output("stream", name="stdout", text="1\n")]
    nbformat.write(nb, tmp_path / lesson.solution)
    monkeypatch.setattr(labgen, "ROOT", tmp_path)
    monkeypatch.setattr(labgen, "LESSONS", (lesson,))
    return tmp_path, lesson


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
