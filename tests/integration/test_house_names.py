"""Tests and scripts reach the course's modules through public names only: an underscore name (not a dunder)
of an ``attnkit`` module may change without notice, so a test or script that needs one asks for a public
name, or a documented internal one ("Internal API for tests and scripts: ..." in the module's docstring).

Read from the source (AST, nothing imported): in every ``.py`` file under ``tests/`` and ``scripts/``, a use is
- ``from attnkit.a import _x`` (and ``import attnkit._a``, ``from attnkit._a import x``);
- ``mod._x`` where ``mod`` is bound to an attnkit module by ``import attnkit.a.b as mod``, ``import attnkit.a.b``
  (then ``attnkit.a.b._x``), ``from attnkit.a import b`` or ``mod = importlib.import_module("attnkit...")``;
- the same name as a string: ``getattr/setattr/delattr/hasattr(mod, "_x")``, ``monkeypatch.setattr(mod, "_x", ...)``
  and ``monkeypatch.setattr("attnkit.a.b._x", ...)``.
A file's own underscore names and those of other libraries (``torch._scaled_mm``, ``os._exit``) are not uses."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "scripts")
BUILTIN_ATTR_CALLS = {"getattr", "setattr", "delattr", "hasattr"}
PATCH_METHODS = {"setattr", "delattr"}          # pytest's monkeypatch (and unittest.mock-style patchers)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@functools.cache
def is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of the course (a file under ROOT)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def course(dotted: str) -> bool:
    return dotted == "attnkit" or dotted.startswith("attnkit.")


def _module_string(node: ast.expr) -> str | None:
    """The module an ``import_module`` call names: a literal, or an f-string's literal head plus ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return node.values[0].value + "{}"
    return None


def bindings(tree: ast.AST) -> dict[str, str]:
    """{local name: attnkit module it is bound to}, from every import in the file (top level or in a function)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if course(alias.name):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["attnkit"] = "attnkit"
        elif isinstance(node, ast.ImportFrom) and not node.level and course(node.module or ""):
            for alias in node.names:
                if is_module(f"{node.module}.{alias.name}"):
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args
              and (getattr(node.value.func, "id", None) == "import_module"
                   or getattr(node.value.func, "attr", None) == "import_module")):
            name = _module_string(node.value.args[0])
            if name and course(name):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        bound[target.id] = name
    return bound


def violations(source: str, filename: str) -> list[str]:
    """``file:line: attnkit.module._name`` for each use of an attnkit module's underscore name in ``source``."""
    tree = ast.parse(source, filename)
    bound = bindings(tree)

    def module_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            parent = module_of(node.value)
            if parent is not None and is_module(f"{parent}.{node.attr}"):
                return f"{parent}.{node.attr}"
        return None

    found = []

    def report(node: ast.AST, name: str) -> None:
        found.append((node.lineno, node.col_offset, name))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and course(node.module or ""):
            if any(private(part) for part in node.module.split(".")):
                report(node, node.module)
            for alias in node.names:
                if private(alias.name):
                    report(node, f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if course(alias.name) and any(private(part) for part in alias.name.split(".")):
                    report(node, alias.name)
        elif isinstance(node, ast.Attribute) and private(node.attr):
            module = module_of(node.value)
            if module is not None:
                report(node, f"{module}.{node.attr}")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if ((isinstance(func, ast.Name) and func.id in BUILTIN_ATTR_CALLS)
                    or (isinstance(func, ast.Attribute) and func.attr in PATCH_METHODS)):
                first = node.args[0]
                module = module_of(first)
                if module is not None and len(node.args) > 1:
                    second = node.args[1]
                    if isinstance(second, ast.Constant) and isinstance(second.value, str) and private(second.value):
                        report(node, f"{module}.{second.value}")
                elif (isinstance(first, ast.Constant) and isinstance(first.value, str) and course(first.value)
                      and any(private(part) for part in first.value.split("."))):
                    report(node, first.value)
    return [f"{filename}:{line}: {name}" for line, _, name in sorted(found)]


def scanned_files() -> list[Path]:
    return sorted(p for folder in SCANNED for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def test_no_test_or_script_uses_a_private_name_of_a_course_module():
    found = []
    for path in scanned_files():
        text = path.read_text()
        if "attnkit" in text:                        # no course module named: nothing to bind
            found += violations(text, str(path.relative_to(ROOT)))
    assert not found, "underscore names of attnkit modules used outside them:\n" + "\n".join(found)


def test_the_scan_reads_tests_and_scripts():
    names = {str(p.relative_to(ROOT)) for p in scanned_files()}
    assert "tests/integration/test_house_names.py" in names
    assert any(n.startswith("scripts/") for n in names)


FORBIDDEN = '''\
from attnkit.kernels.flash.fp8 import _round_e4m3
import attnkit.device as device
import attnkit.classroom.grading.sandbox
from attnkit.classroom.grading import runner
from attnkit.kernels.flash import hopper as h
import importlib
lab = importlib.import_module(f"attnkit.classroom.labchecks.lab{3}")

device._cuda_sm_count()
attnkit.classroom.grading.sandbox._bwrap_args([])
runner._kernel_startup
h._attn_fwd_ws[(1,)]()
lab._big_case()

def test(monkeypatch):
    from attnkit.kernels import value_checks as vc
    monkeypatch.setattr(vc, "_STATE", {})
    getattr(device, "_version")
    monkeypatch.setattr("attnkit.device._version", None)
from attnkit.kernels._private import name
'''


def test_each_form_of_use_is_reported_with_its_file_line_and_name():
    assert violations(FORBIDDEN, "synthetic.py") == [
        "synthetic.py:1: attnkit.kernels.flash.fp8._round_e4m3",
        "synthetic.py:9: attnkit.device._cuda_sm_count",
        "synthetic.py:10: attnkit.classroom.grading.sandbox._bwrap_args",
        "synthetic.py:11: attnkit.classroom.grading.runner._kernel_startup",
        "synthetic.py:12: attnkit.kernels.flash.hopper._attn_fwd_ws",
        "synthetic.py:13: attnkit.classroom.labchecks.lab{}._big_case",
        "synthetic.py:17: attnkit.kernels.value_checks._STATE",
        "synthetic.py:18: attnkit.device._version",
        "synthetic.py:19: attnkit.device._version",
        "synthetic.py:20: attnkit.kernels._private",
    ]


ALLOWED = '''\
import os
import sys
import torch
import attnkit.device as device
from attnkit.kernels.flash import hopper
from attnkit.kernels.flash.runners import Runners

def _helper():
    return _CONSTANT

_CONSTANT = 1
torch._scaled_mm
os._exit(0)
sys._getframe()
device.__file__
device.cuda_sm_count()
hopper.attn_fwd_ws
Runners()._kept
getattr(device, "cuda_sm_count")
getattr(os, "_exit")
_helper()
'''


def test_own_names_dunders_and_other_libraries_are_not_uses():
    assert violations(ALLOWED, "synthetic.py") == []
