"""Notebook plumbing for the course: standard header cells, execution with stored outputs, checks.

    python -m attnkit.classroom.notebooks execute notebooks/01_attention_by_hand.ipynb ...   # run, store outputs
    python -m attnkit.classroom.notebooks headers [--check]        # titles, badges, setup cells, questions, tags

``headers`` writes everything a notebook shares with the course table (``attnkit/classroom/course.py``):
the badge and numbered title ("Lesson N ·", "Lab NN ·"), the objectives, prerequisites and time, the
setup cell, the closing questions, and nbval's ``nbval-ignore-output`` cell tags in place of the
``# NBVAL_IGNORE_OUTPUT`` comment. It never touches a code cell's outputs, and running it twice
changes nothing the second time.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
from pathlib import Path

from .course import REPO_URL, DeepDive, colab_url, course_entries, pip_spec, readme_toc, repo_url
from .nbgrader import NBGRADER_SCHEMA, add_nbgrader_metadata, nbgrader_metadata  # noqa: F401  (kept here too)

ROOT = Path(__file__).resolve().parents[2]      # the repository (a clone; not in an installed wheel)
FINGERPRINT_KEY = "attnkit_lab_fingerprint"   # a generated lab's cells, hashed: an edited lab is left alone


def fingerprint(nb) -> str:
    cells = [(c.cell_type, c.source) for c in nb.cells]
    return hashlib.sha256(json.dumps(cells).encode()).hexdigest()[:16]
IGNORE_MARKER = "# NBVAL_IGNORE_OUTPUT"         # the comment form, converted to tags by `make headers`
IGNORE_TAG = "nbval-ignore-output"              # what nbval reads from a cell's tags
REASON_TAG = "device-dependent-"                # + one of DEVICE_REASONS, beside IGNORE_TAG
TOC_BEGIN = "<!-- toc: written by `make headers` from attnkit/classroom/course.py -->"
TOC_END = "<!-- /toc -->"
ABOUT_BEGIN = "<!-- about: written by `make headers` from attnkit/classroom/course.py -->"
ABOUT_END = "<!-- /about -->"
QUESTIONS_MARK = "<!-- questions: written by `make headers` from attnkit/classroom/course.py -->"
GLOSSARY_URL = repo_url("docs/glossary.md")
# The one reason allowed with the marker: what makes the output machine-dependent.
DEVICE_REASONS = ("timing", "benchmark", "versions")
# Where a setup cell's Colab branch installs the course from, when set (a fork, a release, a wheel).
PIP_SPEC_VARIABLE = "ATTNKIT_PIP_SPEC"


def badge_line(relpath: str) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(relpath)})")


def setup_source() -> str:
    """The first code cell of every notebook: install in Colab, report what runs where, and without
    Triton let the cells that need it say so instead of failing."""
    return "\n".join([
        "import importlib.util, os, subprocess, sys",
        'if "google.colab" in sys.modules and importlib.util.find_spec("attnkit") is None:  # Colab: install once',
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q",',
        f'                    os.environ.get("{PIP_SPEC_VARIABLE}", "{pip_spec()}")], check=True)',
        "import attnkit",
        "RT = attnkit.setup()",
        "if not RT.has_triton:  # macOS, Windows: cells that need Triton say what to use instead",
        "    from attnkit.classroom.notebooks import skip_cells_needing_triton",
        "    skip_cells_needing_triton()",
    ])


SETUP_TAGS = [IGNORE_TAG, REASON_TAG + "versions"]


def header_cells(relpath: str, title: str, intro: str = ""):
    """A badge-and-title markdown cell and the setup code cell."""
    import nbformat.v4 as v4

    text = f"{badge_line(relpath)}\n\n# {title}"
    if intro:
        text += f"\n\n{intro.strip()}"
    return [v4.new_markdown_cell(text), v4.new_code_cell(setup_source(), metadata={"tags": list(SETUP_TAGS)})]


def new_notebook(relpath: str, title: str, cells, intro: str = ""):
    """Write a notebook made of the standard header and ``cells``: ("md" | "code", source) pairs."""
    import nbformat
    import nbformat.v4 as v4

    made = header_cells(relpath, title, intro)
    for kind, source in cells:
        source = source.strip("\n")
        made.append(v4.new_markdown_cell(source) if kind == "md" else v4.new_code_cell(source))
    nb = v4.new_notebook(cells=made)
    normalize(nb)
    path = ROOT / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def normalize(nb) -> None:
    """Keep only metadata that means something, so diffs show content and outputs alone."""
    for cell in nb.cells:
        for key in ("execution", "collapsed", "scrolled", "jupyter", "ExecuteTime"):
            cell.metadata.pop(key, None)
        cell.pop("id", None)
    widgets = nb.metadata.get("widgets")
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    if widgets:
        nb.metadata["widgets"] = widgets
    nb.nbformat, nb.nbformat_minor = 4, 4


def execute(path: str | Path, timeout: int = 1800) -> None:
    """Run a notebook top to bottom in a fresh kernel and store its outputs in place."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    normalize(nb)
    nbformat.write(nb, path)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]


def state_problems(path: str | Path, *, lab: bool = False) -> list[str]:
    """What is wrong with a committed notebook: unexecuted cells or errors; for a lab, stored outputs."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(code_cells(nb)):
        if lab:
            if cell.outputs or cell.execution_count is not None:
                problems.append(f"{path}: code cell {i} of a lab has stored outputs")
            continue
        if cell.execution_count is None:
            problems.append(f"{path}: code cell {i} was never executed")
        if any(o.output_type == "error" for o in cell.outputs):
            problems.append(f"{path}: code cell {i} stores an error")
    return problems


def _tags(cell) -> list[str]:
    return list(cell.metadata.get("tags", []))


def marker_problems(path: str | Path) -> list[str]:
    """nbval markers: a device-dependent cell carries the tags ``nbval-ignore-output`` and
    ``device-dependent-<timing|benchmark|versions>`` (or, until `make headers` converts it, the comment
    ``# NBVAL_IGNORE_OUTPUT`` on its first line followed by ``# device-dependent: <reason>``); no other
    nbval marker, in tags or comments."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    problems = []
    for i, cell in enumerate(code_cells(nb)):
        tags = _tags(cell)
        others = [t for t in tags if (t.startswith("nbval") and t != IGNORE_TAG) or t == "raises-exception"]
        if others:
            problems.append(f"{path}: code cell {i} uses nbval tags {others}; only {IGNORE_TAG} is allowed")
        reasons = [t for t in tags if t.startswith(REASON_TAG)]
        if IGNORE_TAG in tags and (len(reasons) != 1 or reasons[0][len(REASON_TAG):] not in DEVICE_REASONS):
            problems.append(f"{path}: code cell {i}: the {IGNORE_TAG} tag needs one reason tag, "
                            f"{REASON_TAG}<{'|'.join(DEVICE_REASONS)}>")
        if reasons and IGNORE_TAG not in tags:
            problems.append(f"{path}: code cell {i}: a reason tag without the {IGNORE_TAG} tag")
        lines = cell.source.splitlines()
        others = [l for l in lines if "NBVAL_" in l and l.strip() != IGNORE_MARKER]
        if others:
            problems.append(f"{path}: code cell {i} uses another nbval marker: {others[0].strip()}")
        marked = [j for j, l in enumerate(lines) if l.strip() == IGNORE_MARKER]
        if not marked:
            continue
        if IGNORE_TAG in tags:
            problems.append(f"{path}: code cell {i} has both the comment marker and the tag")
        reason = lines[1].strip() if len(lines) > 1 else ""
        if marked != [0] or not any(reason == f"# device-dependent: {r}" for r in DEVICE_REASONS):
            problems.append(f"{path}: code cell {i}: the marker must be the first line, followed by "
                            f"'# device-dependent: <{'|'.join(DEVICE_REASONS)}>'")
    return problems


def ignores_output(cell) -> bool:
    """Does nbval leave this cell's output uncompared (the tag, or the comment marker)?"""
    return IGNORE_TAG in _tags(cell) or cell.source.startswith(IGNORE_MARKER)


def convert_markers(nb) -> bool:
    """Turn each ``# NBVAL_IGNORE_OUTPUT`` + ``# device-dependent: <reason>`` comment pair into the two
    cell tags nbval and the course read; outputs are left alone. True when a cell changed."""
    changed = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines = cell.source.split("\n")
        if not lines or lines[0].strip() != IGNORE_MARKER:
            continue
        match = re.fullmatch(r"# device-dependent: (\w+)", lines[1].strip()) if len(lines) > 1 else None
        if not match or match.group(1) not in DEVICE_REASONS:
            continue                                  # malformed: marker_problems reports it
        tags = [t for t in _tags(cell) if t != IGNORE_TAG and not t.startswith(REASON_TAG)]
        cell.metadata["tags"] = tags + [IGNORE_TAG, REASON_TAG + match.group(1)]
        cell.source = "\n".join(lines[2:])
        changed = True
    return changed


def _lesson_of(relpath: str):
    for lesson in course_entries():
        if relpath in (lesson.notebook, lesson.lab, lesson.solution):
            return lesson
    return None


def _plain(text: str) -> str:
    """Course-table prose as it goes into a markdown cell (Markdown and $math$ as written), trimmed."""
    return text.strip()


def about_block(relpath: str) -> str:
    """What a lesson or lab opens with, between ABOUT_BEGIN and ABOUT_END: from the course table."""
    lesson = _lesson_of(relpath)
    lines = [ABOUT_BEGIN, ""]
    if relpath == lesson.notebook:
        if lesson.objectives:
            kind = "deep dive" if isinstance(lesson, DeepDive) else "lesson"
            lines.append(f"**After this {kind} you can**")
            lines.append("")
            lines += [f"- {_plain(o)}" for o in lesson.objectives]
            lines.append("")
        facts = []
        if lesson.prerequisites:
            facts.append(f"**Before you start:** {_plain(lesson.prerequisites)}")
        if lesson.minutes:
            facts.append(f"**Time:** about {lesson.minutes} minutes")
        facts.append(f"**Words:** [the glossary]({GLOSSARY_URL})")
        lines.append(" · ".join(facts))
    else:
        lines.append(f"**Before you start:** lesson {lesson.number} · **Words:** [the glossary]({GLOSSARY_URL})")
    lines += ["", ABOUT_END]
    return "\n".join(lines)


def numbered_title(relpath: str, current: str) -> str:
    """A lesson's title from the course table; a lab's own title with the number in front."""
    lesson = _lesson_of(relpath)
    if relpath == lesson.notebook:
        return lesson.heading
    rest = re.sub(r"^(Lab\s+\d+\s*[·:.-]\s*)+", "", current.strip())
    rest = rest[:1].upper() + rest[1:] if rest else lesson.title
    return f"Lab {lesson.number:02d} · {rest}"


def first_cell_source(relpath: str, source: str) -> str:
    """Cell 0 as `make headers` writes it: badge, numbered title, the author's intro, the about block."""
    lines = source.split("\n")
    while lines and (lines[0].startswith("[![Open In Colab]") or not lines[0].strip()):
        lines = lines[1:]
    title = ""
    if lines and lines[0].startswith("# "):
        title, lines = lines[0][2:], lines[1:]
    body = "\n".join(lines)
    if ABOUT_BEGIN in body and ABOUT_END in body:
        start, end = body.index(ABOUT_BEGIN), body.index(ABOUT_END) + len(ABOUT_END)
        body = body[:start] + body[end:]
    body = body.strip()
    parts = [badge_line(relpath), f"# {numbered_title(relpath, title)}"]
    if body:
        parts.append(body)
    parts.append(about_block(relpath))
    return "\n\n".join(parts)


def questions_source(relpath: str) -> str | None:
    """A lesson's closing cell: its questions from the course table (answers: the instructor guide)."""
    lesson = _lesson_of(relpath)
    if relpath != lesson.notebook or not lesson.questions:
        return None
    lines = [QUESTIONS_MARK, "", "## Check your understanding", ""]
    lines += [f"{i}. {_plain(q)}" for i, q in enumerate(lesson.questions, 1)]
    lines += ["", f"Words you met here are explained in [the glossary]({GLOSSARY_URL})."]
    return "\n".join(lines)


def apply_headers(nb, relpath: str) -> bool:
    """Everything `make headers` writes into one notebook (nbformat object); True when it changed."""
    import nbformat.v4 as v4

    changed = convert_markers(nb)
    first = nb.cells[0]
    fresh = first_cell_source(relpath, first.source)
    if first.source != fresh:
        first.source, changed = fresh, True
    setup = nb.cells[1]
    if setup.source != setup_source():
        setup.source, changed = setup_source(), True
    tags = [t for t in _tags(setup) if t != IGNORE_TAG and not t.startswith(REASON_TAG)] + SETUP_TAGS
    if _tags(setup) != tags:
        setup.metadata["tags"], changed = tags, True
    lesson = _lesson_of(relpath)
    if relpath in (lesson.lab, lesson.solution):     # nbgrader's metadata; labgen copies it to the lab
        import copy

        before = copy.deepcopy([c.metadata for c in nb.cells])
        add_nbgrader_metadata(nb, lab=lesson.number)
        changed |= before != [c.metadata for c in nb.cells]
    closing = questions_source(relpath)
    last = nb.cells[-1]
    has_footer = last.cell_type == "markdown" and last.source.startswith(QUESTIONS_MARK)
    if closing is None and has_footer:
        nb.cells.pop()
        changed = True
    elif closing is not None and not has_footer:
        nb.cells.append(v4.new_markdown_cell(closing))
        nb.cells[-1].pop("id", None)
        changed = True
    elif closing is not None and last.source != closing:
        last.source, changed = closing, True
    return changed


def header_problems(path: str | Path) -> list[str]:
    """The notebook must be as `make headers` writes it: badge, numbered title, about block, setup cell
    with its tags, closing questions for a lesson, tags instead of comment markers."""
    import copy

    import nbformat

    path = Path(path).resolve()
    relpath = path.relative_to(ROOT).as_posix()
    nb = nbformat.read(path, as_version=4)
    problems = []
    if not nb.cells or nb.cells[0].cell_type != "markdown" or not nb.cells[0].source.startswith(badge_line(relpath)):
        problems.append(f"{relpath}: the first cell must start with its Open-in-Colab badge")
    if len(nb.cells) < 2 or nb.cells[1].source != setup_source():
        problems.append(f"{relpath}: the second cell must be the standard setup cell")
    if not problems and apply_headers(copy.deepcopy(nb), relpath):
        problems.append(f"{relpath}: title, about block, questions or nbval tags differ from `make headers`")
    return problems


def restamp_headers(path: str | Path) -> bool:
    """Rewrite what `make headers` owns in an existing notebook; True when something changed.

    A generated lab that had not been edited keeps its fingerprint current, so `make labs` still
    regenerates it (the same change is made to its solution)."""
    import nbformat

    path = Path(path).resolve()
    relpath = path.relative_to(ROOT).as_posix()
    nb = nbformat.read(path, as_version=4)
    generated = nb.metadata.get(FINGERPRINT_KEY) == fingerprint(nb)
    changed = apply_headers(nb, relpath)
    if changed:
        if generated:
            nb.metadata[FINGERPRINT_KEY] = fingerprint(nb)
        nbformat.write(nb, path)
    return changed


def course_notebooks() -> list[Path]:
    """Every committed notebook of the course that exists: lessons, solutions and labs."""
    paths = []
    for lesson in course_entries():
        for rel in (lesson.notebook, lesson.solution, lesson.lab):
            if rel and (ROOT / rel).exists():
                paths.append(ROOT / rel)
    return paths


# ---------------------------------------------------------------------------------------------------
# Without Triton (macOS, Windows): cells that need it say so instead of failing.

SKIP_VALUE = "__attnkit_cell_value__"
SKIP_NAME = "__attnkit_triton_skipper__"


def _needs_triton(error: BaseException) -> bool:
    return isinstance(error, ImportError) and (getattr(error, "name", None) or "").split(".")[0] == "triton"


def _top_level_names(body) -> set[str]:
    """The names a cell binds at its top level: assignments, imports, functions and classes."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names


class TritonSkipper(ast.NodeTransformer):
    """An IPython AST transformer: runs each cell inside ``try``; a cell that fails because Triton is
    missing, or later because a name such a cell would have defined is missing, prints what it needed
    and where to run it instead of raising. Any other error is raised as usual."""

    def __init__(self, recorded: str = REPO_URL):
        super().__init__()
        self.skipped = 0
        self.recorded = recorded          # where this notebook's outputs recorded with Triton can be read
        self.missing: set[str] = set()    # names that skipped cells would have defined
        self._defines: set[str] = set()   # names the cell now running defines at its top level

    def visit_Module(self, node):
        if not node.body or any(isinstance(n, (ast.Await, ast.AsyncFor, ast.AsyncWith)) for n in ast.walk(node)):
            return node
        self._defines = _top_level_names(node.body)
        body = list(node.body)
        last = body.pop() if isinstance(body[-1], ast.Expr) else None
        if last is not None:                          # keep the cell's value for display
            body.append(ast.Assign(targets=[ast.Name(SKIP_VALUE, ast.Store())], value=last.value))
        handle = ast.Call(ast.Attribute(ast.Name(SKIP_NAME, ast.Load()), "handle", ast.Load()),
                          [ast.Name("__attnkit_error__", ast.Load())], [])
        handler = ast.ExceptHandler(type=ast.Name("Exception", ast.Load()), name="__attnkit_error__",
                                    body=[ast.If(test=ast.UnaryOp(ast.Not(), handle), body=[ast.Raise()], orelse=[])])
        new = [ast.Assign(targets=[ast.Name(SKIP_VALUE, ast.Store())], value=ast.Constant(None)),
               ast.Try(body=body or [ast.Pass()], handlers=[handler], orelse=[], finalbody=[])]
        if last is not None:
            new.append(ast.Expr(ast.Name(SKIP_VALUE, ast.Load())))
        node.body = new
        return ast.fix_missing_locations(node)

    def handle(self, error: BaseException) -> bool:
        """Print why the rest of this cell is skipped and return True, or return False to raise."""
        if _needs_triton(error):
            why = "this cell needs Triton, which is not installed here"
        elif isinstance(error, NameError) and getattr(error, "name", None) in self.missing:
            why = f"this cell uses {error.name}, made by a cell above that needed Triton"
        else:
            return False
        self.skipped += 1
        self.missing |= self._defines
        print(f"skipped: {why}.\n"
              f"  Its output, recorded with Triton, is in the course's copy of this notebook: {self.recorded}\n"
              "  To run it: Colab with a GPU runtime, or a Linux machine (`pip install triton`; "
              "without a GPU it runs in Triton's interpreter).")
        return True


def recorded_copy(session: str) -> str:
    """The address of the course's copy of a notebook, with its outputs recorded with Triton, from the
    kernel's session name (the notebook's path, where Jupyter gives it): a lab's is its solution."""
    name = Path(session).name
    if re.fullmatch(r"\d\d_\w+\.ipynb", name):
        return repo_url(f"notebooks/{name}")
    if re.fullmatch(r"lab\d\d_\w+\.ipynb", name):
        return repo_url(f"solutions/{name}")
    return REPO_URL


def skip_cells_needing_triton() -> TritonSkipper | None:
    """In a notebook without Triton, let every following cell that needs it print a note instead of
    failing (see ``TritonSkipper``). Outside IPython this does nothing and returns None."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None:
        return None
    shell.ast_transformers[:] = [t for t in shell.ast_transformers if not isinstance(t, TritonSkipper)]
    skipper = TritonSkipper(recorded_copy(str(shell.user_ns.get("__session__", ""))))
    shell.ast_transformers.append(skipper)
    shell.user_ns[SKIP_NAME] = skipper
    return skipper


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit.classroom.notebooks")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("execute", help="run notebooks and store their outputs")
    ex.add_argument("paths", nargs="+")
    ex.add_argument("--timeout", type=int, default=1800)
    hd = sub.add_parser("headers", help="rewrite Colab badges, setup cells and the README's contents "
                                        "from attnkit/classroom/course.py")
    hd.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "execute":
        for p in args.paths:
            print(f"executing {p}", flush=True)
            execute(p, timeout=args.timeout)
        return 0
    problems = []
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = text.index(TOC_BEGIN) + len(TOC_BEGIN), text.index(TOC_END)
    fresh = text[:start] + "\n" + readme_toc(ROOT) + "\n" + text[end:]
    if fresh != text:
        if args.check:
            problems.append("README.md: the table of contents is out of date")
        else:
            readme.write_text(fresh)
            print("updated README.md")
    for path in course_notebooks():
        if args.check:
            problems += header_problems(path)
        elif restamp_headers(path):
            print(f"updated {path.relative_to(ROOT)}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
