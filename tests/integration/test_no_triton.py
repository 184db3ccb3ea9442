"""Without Triton (macOS, Windows, a CPU runtime without it) every lesson and solution still runs.

The environment of tests/integration/test_colab_install.py without its Triton: the course is installed the way pip
installs it on macOS (no Triton dependency there), and the notebooks run top to bottom with no error.
NumPy lessons run fully and print exactly their stored outputs; a cell that needs Triton prints that
it was skipped, where its recorded output is and what to run it on instead; benchmark cells show the
recorded results.
"""
import zipfile

import nbformat
import pytest
import test_colab_install as colab

pytestmark = pytest.mark.slow

# Lessons and solutions that need no Triton at all: they must run exactly as stored.
NUMPY_ONLY = ("notebooks/01_attention_by_hand.ipynb", "solutions/lab01_attention_by_hand.ipynb",
              "notebooks/03_online_softmax.ipynb", "solutions/lab03_online_softmax.ipynb")
SKIPPED = "skipped: this cell needs Triton, which is not installed here"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every lesson and solution run without Triton: {relpath: executed notebook}."""
    tmp = tmp_path_factory.mktemp("no-triton")
    wheel = colab.build_wheel(tmp)
    env = colab.colab_env()
    # The installed course, as on macOS: the wheel's files on the path, no Triton anywhere.
    unpacked = tmp / "attnkit-installed"
    zipfile.ZipFile(wheel).extractall(unpacked)
    copies = colab.copy_notebooks(tmp / "course")
    log = colab.run_notebooks(env, copies, tmp, {"PYTHONPATH": str(unpacked)})
    print(log)
    return {c.relative_to(tmp / "course").as_posix(): nbformat.read(c, as_version=4) for c in copies}


def outputs(nb) -> str:
    return "\n".join(colab.texts(c) for c in nb.cells if c.cell_type == "code")


def test_every_notebook_runs_without_triton(ran):
    assert len(ran) >= 10
    for rel, nb in ran.items():
        assert colab.errors(nb) == [], f"{rel} failed without Triton: {colab.errors(nb)}"
        assert "no Triton (kernel cells skip)" in colab.texts(nb.cells[1]), rel
        assert "triton -" in colab.texts(nb.cells[-1]), f"{rel}: Triton was importable"


def test_numpy_lessons_run_fully_and_print_their_stored_outputs(ran):
    for rel in NUMPY_ONLY:
        if rel not in ran:
            continue
        assert "skipped:" not in outputs(ran[rel]), rel
        assert colab.compare_with_stored(rel, ran[rel]), rel


def test_kernel_cells_say_what_they_need_and_what_to_use_instead(ran):
    kernel_lessons = [rel for rel in ran if rel not in NUMPY_ONLY and rel != "notebooks/00_setup.ipynb"]
    skipping = [rel for rel in kernel_lessons if SKIPPED in outputs(ran[rel])]
    assert skipping, "no cell said it needs Triton"
    for rel in skipping:
        text = outputs(ran[rel])
        assert "Colab with a GPU runtime, or a Linux machine" in text, rel
        assert "recorded with Triton" in text, rel
    # A cell that ran to its end without a skip note prints what it printed with Triton.
    for rel in kernel_lessons:
        stored = colab.STORED[rel]
        for index, (want, got) in enumerate(zip(stored.cells, ran[rel].cells)):
            if want.cell_type != "code" or colab.ignores_output(want) or "skipped:" in colab.texts(got):
                continue
            assert colab.texts(got) == colab.texts(want), f"{rel}, cell {index} ran but printed something else"


def test_benchmark_cells_show_the_recorded_results(ran):
    shown = 0
    for rel, nb in ran.items():
        for cell in nb.cells:
            if cell.cell_type == "code" and "device-dependent-benchmark" in cell.metadata.get("tags", []):
                assert "Traceback" not in colab.texts(cell), rel
                shown += "record" in colab.texts(cell).lower()
    assert shown, "no benchmark cell showed recorded results"
