"""The package's floors, read from its source: every import statement (at the top of a module or inside a
function) is an edge, and no edge runs up the floors or closes a cycle. Also the static tables that replaced
imports by name: each lab's check module (``nbgrader.check_module``, which the grading workers use too), the
diagrams of ``make figures``, the guard's course implementations and the package's lazy top-level names."""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "attnkit"
# Lowest first; a module may import its own floor and those below.
FLOORS = (("attnkit.device", "attnkit.validation", "attnkit.tolerances", "attnkit.results"), ("attnkit.reference",),
          ("attnkit.kernels",), ("attnkit.analysis",), ("attnkit.serving",), ("attnkit.distributed",),
          ("attnkit.bench",), ("attnkit.classroom",))


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


@functools.cache
def import_graph() -> dict[str, frozenset[str]]:
    """{module: the attnkit modules it imports}, from every import statement of its source."""
    known = modules()
    graph = {}
    for name, (path, is_package) in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("attnkit")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").startswith("attnkit"):
                    module = node.module
                else:
                    continue
                targets |= {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names}
        graph[name] = frozenset(t for t in targets if t in known and t != name)
    return graph


def floor(module: str) -> int:
    """The floor of ``module``; the package's own ``__init__`` (its version, its front door) counts as the lowest."""
    if module == "attnkit":
        return 0
    return max(i for i, names in enumerate(FLOORS) for n in names if module == n or module.startswith(n + "."))


def test_no_import_runs_up_the_floors():
    upward = {(m, t) for m, targets in import_graph().items() if m != "attnkit" for t in targets
              if floor(t) > floor(m)}
    assert not upward, sorted(upward)


def test_the_import_graph_has_no_cycle():
    graph = {m: set(targets) for m, targets in import_graph().items()}
    done, on_path, cycles = set(), [], []

    def visit(m):
        on_path.append(m)
        for t in sorted(graph[m]):
            if t in on_path:
                cycles.append(on_path[on_path.index(t):] + [t])
            elif t not in done:
                visit(t)
        on_path.pop()
        done.add(m)

    for m in sorted(graph):
        if m not in done:
            visit(m)
    assert not cycles, cycles[:3]


@pytest.mark.parametrize("path", ["__init__.py", "results.py", "serving", "analysis", "bench/suites.py",
                                  "bench/recorder.py", "classroom/figures.py", "classroom/notebooks.py",
                                  "classroom/nbgrader.py", "classroom/grading/lab.py",
                                  "classroom/grading/checker.py", "classroom/grading/runner.py",
                                  "classroom/grading/timing.py"])
def test_no_module_is_loaded_by_a_name_in_a_string(path):
    """importlib.import_module and __import__ hide an edge from anyone reading the imports."""
    for file in sorted((PACKAGE / path).rglob("*.py")) if (PACKAGE / path).is_dir() else [PACKAGE / path]:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call):
                name = ast.unparse(node.func)
                assert name not in ("importlib.import_module", "__import__", "import_module"), f"{file}: {name}"


def test_each_lab_has_its_check_module_and_other_numbers_are_refused():
    from attnkit.classroom import nbgrader
    from attnkit.classroom.labchecks import lab01, lab09

    assert nbgrader.check_module(1) is lab01 and nbgrader.check_module(9) is lab09
    assert [nbgrader.check_module(n).__name__[-5:] for n in nbgrader.LAB_NUMBERS] == \
        [f"lab{n:02d}" for n in range(1, 11)]
    for bad in (0, 11, True, "1", 1.0):
        with pytest.raises(ValueError, match="lab: expected a lab number"):
            nbgrader.check_module(bad)


def test_the_figures_table_names_a_drawing_function_for_each_file():
    from attnkit.classroom import figures

    table = figures.diagrams()
    assert len(table) == 10 and all(name.endswith(".png") for name in table)
    for name, draw in table.items():
        assert callable(draw) and draw.__module__.startswith(("attnkit.analysis.", "attnkit.bench.")), name


def test_one_labs_check_module_loads_no_other_lab_and_no_triton():
    """A grading process of lab 01 holds lab 01's checks alone: loading every lab's would bring Triton and
    torch into a process whose forked children each count them again against the notebook's memory cap."""
    code = ("import sys; from attnkit.classroom import nbgrader; nbgrader.check_module(1); "
            "print(sorted(m for m in sys.modules if m.startswith('attnkit.classroom.labchecks.lab')), "
            "'triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['attnkit.classroom.labchecks.lab01']", "False"], out


def test_a_grading_worker_loads_only_a_labs_check_module():
    """The workers' spec names the lab's check module; they take it from ``nbgrader.check_module``."""
    from attnkit.classroom.grading.checker import lab_module
    from attnkit.classroom.labchecks import lab03

    assert lab_module("attnkit.classroom.labchecks.lab03") is lab03
    for bad in ("attnkit.classroom.labchecks.lab11", "os", "attnkit.classroom.labchecks.lab3",
                "attnkit.classroom.labchecks.lab003", None, 3):
        with pytest.raises(ValueError, match="module: expected a lab's check module|lab: expected a lab number"):
            lab_module(bad)


def test_the_guard_loads_every_course_implementation_it_names():
    import sys

    from attnkit.classroom.grading import guard

    guard.load_course_implementations()
    assert all(name in sys.modules for name in guard.COURSE_IMPLEMENTATIONS)


def test_the_lazy_top_level_names_are_the_functions_of_their_modules():
    import attnkit
    from attnkit.kernels import flash, paged
    from attnkit.kernels.flash import fp8
    from attnkit.reference import attention
    from attnkit.serving import kv_cache

    assert attnkit.flash_attention is flash.flash_attention and attnkit.paged_decode is paged.paged_decode
    assert attnkit.quantize_for_attention is fp8.quantize_for_attention
    assert attnkit.kv_cache_bytes is kv_cache.kv_cache_bytes and attnkit.attention_ref is attention.attention_ref
    assert all(hasattr(attnkit, name) for name in attnkit.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        attnkit.nope  # noqa: B018 - the attribute access is what is tested
