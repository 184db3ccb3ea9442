"""The committed notebooks are in the state nbval and students need."""
import nbformat
import pytest
from conftest import ROOT

from attnkit.classroom import course, notebooks
from attnkit.classroom.course import LESSONS, course_entries
from attnkit.classroom.labgen import main as labgen_main

COMMITTED = [p for p in notebooks.course_notebooks()]
EXECUTED = [p for p in COMMITTED if p.parent.name in ("notebooks", "solutions")]
LABS = [p for p in COMMITTED if p.parent.name == "labs"]


def _ids(paths):
    return [p.relative_to(ROOT).as_posix() for p in paths]


def test_every_file_in_the_notebook_folders_belongs_to_the_course():
    known = {ROOT / rel for lesson in course_entries() for rel in (lesson.notebook, lesson.lab, lesson.solution) if rel}
    for folder in ("notebooks", "labs", "solutions"):
        for path in (ROOT / folder).glob("*.ipynb"):
            assert path in known, f"{path.name} is not in attnkit/classroom/course.py (LESSONS or DEEP_DIVES)"


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

    tags = {"tags": ["nbval-ignore-output", "device-dependent-timing"]}
    cells = [v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(1)"),                 # no reason line
             v4.new_code_cell("# NBVAL_SKIP\nprint(1)"),                            # another marker
             v4.new_code_cell("print(1)", metadata={"tags": ["nbval-ignore-output"]}),   # tag without reason
             v4.new_code_cell("print(1)", metadata={"tags": ["nbval-skip"]}),             # another tag
             v4.new_code_cell("print(1)", metadata={"tags": ["device-dependent-mood"]}),  # reason alone
             v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\n# device-dependent: timing\nprint(1)"),  # fine (old form)
             v4.new_code_cell("print(1)", metadata=tags)]                                # fine
    path = tmp_path / "x.ipynb"
    nbformat.write(v4.new_notebook(cells=cells), path)
    problems = notebooks.marker_problems(path)
    assert len(problems) == 5, problems
    assert not any("code cell 5" in p or "code cell 6" in p for p in problems)


def test_headers_convert_markers_to_tags_keep_outputs_and_are_idempotent():
    """`make headers` on copies of every committed notebook: outputs untouched, the second run a no-op."""
    import copy

    for path in COMMITTED:
        rel = path.relative_to(ROOT).as_posix()
        original = nbformat.read(path, as_version=4)
        nb = copy.deepcopy(original)
        notebooks.apply_headers(nb, rel)
        assert not notebooks.apply_headers(nb, rel), f"{rel}: a second run changed it"
        before = [(c.outputs, c.get("execution_count")) for c in original.cells if c.cell_type == "code"]
        after = [(c.outputs, c.get("execution_count")) for c in nb.cells if c.cell_type == "code"]
        assert before == after, f"{rel}: headers changed a code cell's outputs"
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert notebooks.IGNORE_MARKER not in cell.source, rel
        assert nb.cells[0].source.split("\n")[2].startswith(("# Lesson ", "# Lab ", "# Deep dive ")), rel


def test_every_lesson_opens_with_objectives_and_time_and_ends_with_questions():
    from attnkit.classroom.course import LESSONS

    for lesson in LESSONS:
        assert lesson.minutes > 0 and 2 <= len(lesson.objectives) <= 6 and lesson.prerequisites, lesson.number
        assert 3 <= len(lesson.questions) <= 5, f"lesson {lesson.number}: 3 to 5 questions"
        about = notebooks.about_block(lesson.notebook)
        assert f"about {lesson.minutes} minutes" in about and notebooks.GLOSSARY_URL in about
        closing = notebooks.questions_source(lesson.notebook)
        assert all(q in closing for q in lesson.questions)
        assert lesson.lab is None or notebooks.questions_source(lesson.lab) is None


def test_numbered_titles():
    assert notebooks.numbered_title("notebooks/08_paged_attention.ipynb", "Lesson 8: paged attention") == \
        "Lesson 8 · Paged attention"
    assert notebooks.numbered_title("labs/lab08_paged_attention.ipynb", "Lab 08: paged attention") == \
        "Lab 08 · Paged attention"
    assert notebooks.numbered_title("solutions/lab05_flash_attention.ipynb", "Lab 05 · FlashAttention forward") == \
        "Lab 05 · FlashAttention forward"


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


def test_without_triton_a_cell_needing_it_prints_a_note_and_others_still_fail():
    """The setup cell's skipper, in a real IPython shell: a missing Triton and names such a cell would
    have made become notes; any other error is raised as before; values still display."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    try:
        skipper = None
        shell.user_ns["get_ipython"] = lambda: shell
        with capture_output() as out:
            result = shell.run_cell("from attnkit.classroom.notebooks import skip_cells_needing_triton\n"
                                    "skipper = skip_cells_needing_triton()")
        assert result.success, out.stdout
        skipper = shell.user_ns["skipper"]
        with capture_output() as out:
            r1 = shell.run_cell("a = 1\nraise ModuleNotFoundError(\"No module named 'triton'\", name='triton')\n"
                                "made_by_the_kernel_cell = 2")
            r2 = shell.run_cell("print(made_by_the_kernel_cell)")
            r3 = shell.run_cell("1 / 0")
            r4 = shell.run_cell("a + 41")
            r5 = shell.run_cell("print(a_typo)")           # not a name a skipped cell would have made
        assert r1.success and r2.success and shell.user_ns["a"] == 1
        assert "made_by_the_kernel_cell" not in shell.user_ns
        assert not r3.success and isinstance(r3.error_in_exec, ZeroDivisionError)
        assert not r5.success and isinstance(r5.error_in_exec, NameError)
        assert r4.success and r4.result == 42
        assert out.stdout.count("skipped:") == 2 and "Colab with a GPU runtime" in out.stdout
        assert skipper.skipped == 2
        assert notebooks.recorded_copy("/home/me/course/labs/lab05_flash_attention.ipynb") == \
            f"{notebooks.REPO_URL}/blob/{course.REF}/solutions/lab05_flash_attention.ipynb"
        assert notebooks.recorded_copy("05_flash_attention.ipynb") == \
            f"{notebooks.REPO_URL}/blob/{course.REF}/notebooks/05_flash_attention.ipynb"
        assert notebooks.recorded_copy("") == notebooks.REPO_URL
    finally:
        shell.ast_transformers[:] = [t for t in shell.ast_transformers
                                     if not isinstance(t, notebooks.TritonSkipper)]
        InteractiveShell.clear_instance()


# nbgrader's cell metadata schema, version 3 (nbgrader/nbgraderformat/v3.json), and the rules its
# MetadataValidatorV3 adds: a grade_id on every graded, solution or locked cell, unique in the
# notebook; points on graded cells; task cells only in markdown.
NBGRADER_V3 = {
    "type": "object",
    "properties": {
        "schema_version": {"type": "integer", "minimum": 3, "maximum": 3},
        "grade": {"type": "boolean"}, "locked": {"type": "boolean"}, "solution": {"type": "boolean"},
        "task": {"type": "boolean"},
        "grade_id": {"type": "string", "pattern": "^[a-zA-Z0-9_\\-]*$"},
        "points": {"type": "number", "minimum": 0},
        "checksum": {"type": "string", "minLength": 32, "maxLength": 32},
        "cell_type": {"type": "string", "enum": ["raw", "code", "markdown"]},
    },
    "required": ["schema_version", "grade", "locked", "solution"],
    "additionalProperties": False,
}


def nbgrader_problems(nb) -> list[str]:
    import jsonschema

    problems, ids = [], set()
    for index, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader")
        if meta is None:
            continue
        try:
            jsonschema.validate(meta, NBGRADER_V3)
        except jsonschema.ValidationError as err:
            problems.append(f"cell {index}: {err.message}")
            continue
        if (meta["grade"] or meta["solution"] or meta["locked"]):
            if not meta.get("grade_id"):
                problems.append(f"cell {index}: no grade_id")
            elif meta["grade_id"] in ids:
                problems.append(f"cell {index}: duplicate grade_id {meta['grade_id']}")
            ids.add(meta.get("grade_id"))
        if meta["grade"] and "points" not in meta:
            problems.append(f"cell {index}: graded without points")
        if meta.get("task") and cell.cell_type != "markdown":
            problems.append(f"cell {index}: a task cell must be markdown")
        if cell.cell_type == "markdown" and meta["grade"] != meta["solution"] and not meta.get("task"):
            problems.append(f"cell {index}: a markdown cell must be both graded and a solution, or neither")
    return problems


@pytest.mark.parametrize("path", LABS, ids=_ids(LABS))
def test_nbgrader_metadata_of_every_lab_follows_nbgraders_schema(path):
    import copy

    import nbformat.v4 as v4

    nb = copy.deepcopy(nbformat.read(path, as_version=4))
    marked = notebooks.add_nbgrader_metadata(nb, lab=int(path.name[3:5]))
    kinds = [(c.metadata["nbgrader"]["solution"], c.metadata["nbgrader"]["grade"])
             for c in nb.cells if "nbgrader" in c.metadata]
    assert marked == len(kinds) and (True, False) in kinds and (False, True) in kinds, kinds
    assert nbgrader_problems(nb) == []
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert all(c.metadata["nbgrader"]["locked"] and c.metadata["nbgrader"]["points"] > 0 for c in graded)
    if len(graded) > 1:                 # exercises checked one by one: the closing check_lab is not graded again
        assert not any("check_lab(" in c.source for c in graded)
    # The validator itself rejects what nbgrader rejects.
    bad = v4.new_notebook(cells=[v4.new_code_cell("x", metadata={"nbgrader": {"schema_version": 3, "grade": True,
                                                                             "locked": True, "solution": False,
                                                                             "grade_id": "a b"}})])
    assert len(nbgrader_problems(bad)) == 1


def test_nbgrader_metadata_rejects_bad_arguments():
    import nbformat.v4 as v4

    cell = v4.new_code_cell("### BEGIN SOLUTION\nx = 1\n### END SOLUTION")
    assert notebooks.nbgrader_metadata(cell, grade_id="ex-1")["solution"] is True
    assert notebooks.nbgrader_metadata(v4.new_markdown_cell("text"), grade_id="md") is None
    for kwargs, word in (({"grade_id": "has space"}, "grade_id"), ({"grade_id": ""}, "grade_id"),
                         ({"grade_id": "ok", "points": -1}, "points"), ({"grade_id": "ok", "points": True}, "points"),
                         ({"grade_id": "ok", "points": 2}, "points")):
        with pytest.raises(ValueError, match=word):
            notebooks.nbgrader_metadata(cell, **kwargs)


def test_make_labs_carries_the_solutions_nbgrader_metadata_into_the_labs(monkeypatch):
    """`make headers` marks a solution's cells; `make labs` copies the marks into the generated lab."""
    import copy

    from attnkit.classroom import labgen

    lesson = next(l for l in LESSONS if l.has_lab and (ROOT / l.solution).exists())
    solution = nbformat.read(ROOT / lesson.solution, as_version=4)
    notebooks.apply_headers(solution, lesson.solution)
    read = nbformat.read
    monkeypatch.setattr(nbformat, "read", lambda path, **kw: copy.deepcopy(solution) if str(path).endswith(
        lesson.solution) else read(path, **kw))
    lab = labgen.make_lab(ROOT / lesson.solution, lesson.lab)
    marks = [c.metadata.get("nbgrader") for c in lab.cells]
    assert marks == [c.metadata.get("nbgrader") for c in solution.cells] and any(marks)
    assert nbgrader_problems(lab) == []
