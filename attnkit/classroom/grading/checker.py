"""The checker's process: the lab's checks with the secret seed, on its own references, each call of the
student's code made in the student's process (``calls.Caller``). It never sees the notebook and runs
none of its code; its verdicts alone can give a mark. When they are final it sends the seed to the
student's process, for the lab's own check there (which can only fail an exercise).
"""
from __future__ import annotations

from ..checking import FAILED, NOT_IMPLEMENTED, PASSED, CheckResult, Exercise, check_exercises
from ..nbgrader import check_module
from . import calls, channel, codec
from .codec import stand_in
from .lab import lab_checks

ANSWER_LIMIT = 2**30       # the largest answer from the student's process
CHECKS_PACKAGE = "attnkit.classroom.labchecks."


def lab_module(name):
    """The lab's check module that a worker's spec names (``spec["module"]``, the module's ``__name__``
    as the grader wrote it), from the static table ``nbgrader.check_module``: no other module can be named."""
    if type(name) is not str or not name.startswith(CHECKS_PACKAGE + "lab") or not name[-2:].isdigit() \
            or len(name) != len(CHECKS_PACKAGE) + 5:
        raise ValueError(f"module: expected a lab's check module ({CHECKS_PACKAGE}labNN), got {name!r}")
    return check_module(int(name[-2:]))


def check(spec: dict, send, calls_fd: int) -> None:
    import os

    module = lab_module(spec["module"])
    exercises = lab_checks(module, pairs=spec.get("pairs"))
    to_student = channel.Writer(calls_fd)
    first = channel.read_frame(calls_fd, ANSWER_LIMIT) or {}
    states = first.get("functions") if first.get("kind") == "functions" else None
    caller = calls.Caller(to_student.send, lambda: channel.read_frame(calls_fd, ANSWER_LIMIT),
                          os.path.join(os.getcwd(), ".calls-lock"))
    calls.use(caller)
    functions, refused = {}, {}
    for ex in exercises:
        name = ex.function
        state = states.get(name) if type(states) is dict else None
        state = state if type(state) is dict else {"state": "missing"}
        if state.get("state") == "callable":
            functions[name] = caller.wrap(name)
        elif state.get("state") == "value":
            try:
                tree, blobs = codec.unpack(state.get("value"))
                functions[name] = codec.decode(tree, blobs)
            except codec.CodecError as exc:
                refused[name] = f"❌ {name}: a value that cannot be graded ({exc})."
                functions[name] = stand_in(name, {"state": "refused"})
        else:
            if state.get("state") == "refused":
                refused[name] = _text(state.get("report"), f"❌ {name}: not graded.")
            else:
                refused[name] = (f"❌ {name}: the notebook defines no `{name}` (was its cell run without an error, "
                                 f"and is it still called `{name}`?)")
            functions[name] = stand_in(name, state)
    try:
        summary = check_exercises(tuple(Exercise(e.function, _judged(e), e.depends, e.points) for e in exercises),
                                  functions, seed=spec["seed"])
        results = []
        for ex, r in zip(exercises, summary.results):
            status, report = r.status, r.report
            if ex.function in refused:
                status, report = FAILED, refused[ex.function]
            results.append({"name": ex.function, "status": status, "report": str(report)})
    except Exception as exc:  # noqa: BLE001 - the checks themselves failed: nothing is graded
        results = [{"name": e.function, "status": FAILED,
                    "report": f"❌ {e.function}: not graded: the checks stopped ({type(exc).__name__}: {exc})"}
                   for e in exercises]
    send.send({"kind": "results", "results": results, "statuses": [PASSED, FAILED, NOT_IMPLEMENTED]})
    try:
        to_student.send({"kind": "done", "seed": spec["seed"]})
    except OSError:                          # the student's process has ended
        pass


def _judged(exercise):
    """The exercise's check, failing (not stopping the others) when what the student's function gave
    back breaks the check itself."""
    def check(fn, *, seed=None):
        try:
            return exercise.check(fn, seed=seed)
        except Exception as exc:  # noqa: BLE001 - the student's answer broke the check: it fails
            return CheckResult(exercise.function, FAILED, f"❌ {exercise.function}: the check could not judge what "
                                                          f"your function gave back ({type(exc).__name__}: {exc})")
    check.__name__ = getattr(exercise.check, "__name__", "check")
    return check


def _text(value, default: str) -> str:
    return value[:4000] if type(value) is str else default
