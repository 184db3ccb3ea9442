"""The house's size rule, read from the source (issue 39): every module of attnkit/ holds at most 600 lines
outside Triton and Gluon kernel bodies, and no function outside a kernel body is longer than 80 lines.

A kernel body is a function decorated with a name containing ``jit`` (``@triton.jit``, ``@gluon.jit``,
``@triton.jit(...)``) or passed to a call of such a name in its module (``kernel = triton.jit(f)``): Triton
compiles one Python function into one kernel, so a kernel cannot be split as host code can. A function's
length runs from its ``def`` line to its last line; a function nested in another counts for both. Parsing
only, nothing is imported (well under a second).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnkit"
MAX_MODULE_LINES = 600          # lines of a module outside its kernel bodies
MAX_FUNCTION_LINES = 80         # lines of a function that is not a kernel body


@dataclass(frozen=True)
class Sizes:
    lines: int                                  # the module's lines outside kernel bodies
    functions: tuple[tuple[str, int], ...]      # (qualified name, lines) of every function but kernel bodies
    kernels: tuple[str, ...]                    # the kernel bodies' qualified names


def _names_jit(expr: ast.expr) -> bool:
    """``expr`` (a decorator, or the function a call calls) names something containing ``jit``."""
    return "jit" in ast.unparse(expr.func if isinstance(expr, ast.Call) else expr)


def measure(source: str) -> Sizes:
    """The sizes of one module's source."""
    tree = ast.parse(source)
    jitted = {node.args[0].id for node in ast.walk(tree)            # kernel = triton.jit(f): f is a kernel body
              if isinstance(node, ast.Call) and _names_jit(node.func) and node.args
              and isinstance(node.args[0], ast.Name)}
    kernel_lines: set[int] = set()
    functions, kernels = [], []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                if child.name in jitted or any(_names_jit(d) for d in child.decorator_list):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    kernel_lines.update(range(first, child.end_lineno + 1))
                    kernels.append(name)
                    continue                                        # nothing inside a kernel body is host code
                functions.append((name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return Sizes(len(source.splitlines()) - len(kernel_lines), tuple(functions), tuple(kernels))


def violations(sources: dict[str, str]) -> list[str]:
    """One line per module above MAX_MODULE_LINES and per function above MAX_FUNCTION_LINES, with its count."""
    found = []
    for path, source in sorted(sources.items()):
        sizes = measure(source)
        if sizes.lines > MAX_MODULE_LINES:
            found.append(f"{path}: {sizes.lines} lines outside kernel bodies (at most {MAX_MODULE_LINES})")
        found += [f"{path}: function {name} has {length} lines (at most {MAX_FUNCTION_LINES})"
                  for name, length in sizes.functions if length > MAX_FUNCTION_LINES]
    return found


def test_every_module_of_the_package_keeps_the_size_rule():
    sources = {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
               for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts}
    assert len(sources) > 50                                         # the package was found
    found = violations(sources)
    assert not found, "the house's size rule (issue 39) is broken:\n" + "\n".join(found)


def _synthetic() -> str:
    body = lambda n: [f"    x = x + {i}" for i in range(n)] + ["    return x"]   # noqa: E731
    lines = ["import triton", "from triton.experimental import gluon", "",
             "@triton.jit", "def kernel(x):", *body(100), "",
             "@gluon.jit(do_not_specialize=['x'])", "def gluon_kernel(x):", *body(90), "",
             "def wrapped(x):", *body(90), "",
             "WRAPPED = triton.jit(wrapped)", "",
             "def host(x):", *body(84), "",
             "def short(x):", *body(78), "",
             "class Launcher:", "    def run(self, x):", *["    " + line for line in body(81)], "",
             "def outer(x):", "    def inner(x):", *["    " + line for line in body(82)], "    return inner(x)", ""]
    return "\n".join(lines)


def test_the_count_leaves_out_kernel_bodies_and_names_each_long_function():
    """A synthetic module: a kernel by each kind of decorator and one through triton.jit(f), each above 80
    lines, and host functions of 80 to 86 lines (80 is allowed) (a method and a nested function among them)."""
    source = _synthetic()
    sizes = measure(source)
    assert sizes.kernels == ("kernel", "gluon_kernel", "wrapped")
    assert sizes.lines == len(source.splitlines()) - (2 + 101) - (2 + 91) - (1 + 91)
    assert dict(sizes.functions) == {"host": 86, "short": 80, "Launcher.run": 83, "outer": 86, "outer.inner": 84}
    assert violations({"attnkit/fake.py": source}) == [
        "attnkit/fake.py: function host has 86 lines (at most 80)",
        "attnkit/fake.py: function Launcher.run has 83 lines (at most 80)",
        "attnkit/fake.py: function outer has 86 lines (at most 80)",
        "attnkit/fake.py: function outer.inner has 84 lines (at most 80)",
    ]
    padded = source + "\n" * (MAX_MODULE_LINES + 1 - sizes.lines)    # one line past the rule, outside kernels
    assert violations({"attnkit/fake.py": padded})[0] == (
        f"attnkit/fake.py: {MAX_MODULE_LINES + 1} lines outside kernel bodies (at most {MAX_MODULE_LINES})")
