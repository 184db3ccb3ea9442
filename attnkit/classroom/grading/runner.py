"""The workers the grader starts, each in the sandbox with its budgets (``sandbox.run_budgeted``):

- ``notebook``: runs the notebook top to bottom in a Jupyter kernel, for the executed copy and the
  cells that raised; it grades nothing. The kernel is a process of its own; this worker makes itself
  undumpable so that the kernel cannot reach its pipes.
- ``student``: the student's process. It turns the notebook into code (IPython transforms included, so
  under the budget), guards the course's implementations, loads the code as the module ``submission``,
  and answers the checker's calls (``calls.Server``). When the checker is done it sends the seed, and
  this process runs the lab's check itself, where the student's code runs, for what the check watches
  (forbidden calls, memory, a kernel's loads and stores): its verdicts can only fail an exercise.
- ``checker`` (in ``checker.py``): never sees the notebook; its verdicts alone can pass one.

In a step that uses the GPU (``spec["gpu_memory_mib"]`` > 0) each of these processes that runs CUDA
caps PyTorch's allocator first (``sandbox.cap_gpu_memory``): the student's and the checker's here, the
notebook's kernel through an IPython startup file written before the kernel starts.

Everything a worker tells the grader goes over the pipes the grader passed it (``channel``).

Internal API for tests and scripts: ``write_kernel_startup(mib)`` (the notebook kernel's startup file).
"""
from __future__ import annotations

import base64
import json
import os
import signal
import sys

from . import channel, sandbox


def _start():
    spec = json.loads(sys.stdin.buffer.readline())
    sandbox.apply_limits(spec)
    progress_fd, channel_fd, calls_fd = channel.worker_fds()
    for fd in (progress_fd, channel_fd, calls_fd):     # a process this one starts (the kernel) gets none
        if fd is not None:
            os.set_inheritable(fd, False)
    return spec, channel.progress_writer(progress_fd), channel_fd, calls_fd


def _read_notebook(spec):
    import nbformat

    text = base64.b64decode(spec["notebook"]).decode("utf-8")
    return nbformat.reads(text, as_version=4)


def main(kind: str) -> None:
    """Entry point of the processes the grader starts."""
    spec, say, channel_fd, calls_fd = _start()
    gpu_mib = int(spec.get("gpu_memory_mib") or 0)
    if gpu_mib and kind != "notebook":
        problem = sandbox.cap_gpu_memory(gpu_mib)
        if problem:                   # never run uncapped on the GPU: the step ends, and its stderr says why
            sys.stderr.write(f"the GPU memory cap of {gpu_mib} MiB could not be set: {problem}\n")
            sys.stderr.flush()
            os._exit(3)
    if kind == "notebook":
        _notebook(spec, say, channel.Writer(channel_fd))
    elif kind == "student":
        _student(spec, say, channel.Writer(channel_fd, os.path.join(os.getcwd(), ".channel-lock")), calls_fd)
    else:
        from .checker import check

        check(spec, channel.Writer(channel_fd), calls_fd)
    sys.stdout.flush()
    os._exit(0)


# ------------------------------------------------------------------------------- step 1: the notebook
def _notebook(spec: dict, say, send: channel.Writer) -> None:
    import nbformat
    from nbclient import NotebookClient

    sandbox.set_undumpable()
    try:
        nb = _read_notebook(spec)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook: reported
        send.send({"kind": "status", "problem": f"the notebook could not be read: {type(exc).__name__}: {exc}"})
        return
    if spec.get("gpu_memory_mib"):
        write_kernel_startup(int(spec["gpu_memory_mib"]))
    client = NotebookClient(nb, timeout=spec["cell_timeout"], kernel_name=spec["kernel"], allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": os.getcwd()}})
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    keep = int(spec["keep_mib"]) * 2**20

    def executed(**_):
        text = nbformat.writes(client.nb)
        send.send({"kind": "executed", "notebook": text} if len(text) <= keep else
                  {"kind": "executed", "too_large": len(text)})

    client.on_cell_start = lambda cell, cell_index, **_: say(
        f"code cell {code.index(cell_index) + 1 if cell_index in code else cell_index}")
    client.on_cell_executed = executed
    status = {"kind": "status"}
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        status["problem"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    executed()
    send.send(status)


# IPython reports an exception of a startup file and goes on: a kernel that cannot cap its allocator
# ends itself instead (the step then says the kernel died), never runs uncapped.
KERNEL_STARTUP = '''def _attnkit_gpu_cap():
    import os
    import sys
    from attnkit.classroom.grading.sandbox import cap_gpu_memory
    problem = cap_gpu_memory({mib})
    if problem:
        sys.stderr.write("the GPU memory cap of {mib} MiB could not be set: " + problem + "\\n")
        sys.stderr.flush()
        os._exit(3)
_attnkit_gpu_cap()
del _attnkit_gpu_cap
'''


def write_kernel_startup(mib: int) -> None:
    """An IPython folder (``IPYTHONDIR``, in this step's working folder) whose startup file caps the
    notebook kernel's CUDA allocator at ``mib`` MiB before the notebook's first cell runs."""
    folder = os.path.join(os.getcwd(), ".ipython")
    startup = os.path.join(folder, "profile_default", "startup")
    os.makedirs(startup, mode=0o700, exist_ok=True)
    with open(os.path.join(startup, "00-gpu-memory.py"), "w", encoding="utf-8") as f:
        f.write(KERNEL_STARTUP.format(mib=int(mib)))
    os.environ["IPYTHONDIR"] = folder


# ----------------------------------------------------------------------------- step 2: the student's
CALL_LIMIT = 2**30          # the largest request from the checker


def _student(spec: dict, say, send: channel.Writer, calls_fd: int) -> None:
    from . import guard
    from .calls import Server
    from .checker import lab_module
    from .lab import lab_checks
    from .submission import load_cells, submission_cells

    module = lab_module(spec["module"])
    exercises = lab_checks(module, pairs=spec.get("pairs"))
    to_checker = channel.Writer(calls_fd)
    try:
        nb = _read_notebook(spec)
    except Exception as exc:  # noqa: BLE001 - not JSON, not a notebook: reported
        problem = f"the notebook could not be read: {type(exc).__name__}"
        send.send({"kind": "problem", "problem": problem})
        to_checker.send({"kind": "functions", "problem": problem})
        return
    cells = submission_cells(nb, spec["cell_timeout"])
    guard.install(module, [tuple(t) for t in spec.get("tools") or []])
    log = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)                      # the notebook's prints go to a file in the sandbox
    os.dup2(log, 2)
    ns, _ = load_cells(cells, spec["cell_timeout"], say)
    functions, states = _functions(exercises, ns)
    to_checker.send({"kind": "functions", "functions": states})
    say("loaded")
    timed = {name: _timed(fn, name, spec["cell_timeout"], say) for name, fn in functions.items() if callable(fn)}
    server = Server(timed, to_checker.send)
    seed = None
    while True:
        request = channel.read_frame(calls_fd, CALL_LIMIT)
        if request is None:
            return
        if request.get("kind") == "done":
            seed = request.get("seed")
            break
        to_checker.send(server.answer(request))
    if type(seed) is int:                   # the checker's verdicts are final: now the lab's own check
        _own_check(exercises, functions, timed, seed, say, send)


def _own_check(exercises, functions, timed, seed: int, say, send: channel.Writer) -> None:
    """The lab's check in this process, where the student's code runs, so that what it watches (calls
    it forbids, memory, a kernel's loads and stores) is seen; sent as verdicts that can only fail an
    exercise. It runs after the checker's verdicts are final."""
    from ..checking import check_exercises

    checked = {name: _contained(timed.get(name, fn)) for name, fn in functions.items()}
    say("checks")
    summary = check_exercises(_tracked(exercises, say), checked, seed=seed)
    for ex, r in zip(exercises, summary.results):
        send.send({"kind": "verdict", "name": ex.function, "status": r.status, "report": str(r.report)[:4000]})
    send.send({"kind": "done"})


def _contained(fn):
    """``fn`` whose SystemExit or KeyboardInterrupt is an error of its own exercise, not the end of the
    process (and of the other exercises' checks)."""
    if not callable(fn):
        return fn

    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (SystemExit, KeyboardInterrupt, GeneratorExit) as exc:
            raise RuntimeError(f"your function raised {type(exc).__name__}") from None
    call.__name__ = getattr(fn, "__name__", "function")
    call.__wrapped__ = fn                   # the student's function, for a check that reaches its kernels
    return call


def _tracked(exercises, say):
    from ..checking import Exercise

    def tracking(exercise):
        def check(fn, *, seed=None):
            say(f"check of {exercise.function}")
            return exercise.check(fn, seed=seed)
        check.__name__ = getattr(exercise.check, "__name__", "check")
        return check
    return tuple(Exercise(e.function, tracking(e), e.depends, e.points) for e in exercises)


def _functions(exercises, ns):
    """Each exercise's name as the notebook defines it (a function, or a value) or a stand-in that
    raises, and what the checker is told about it."""
    from . import codec
    from .calls import _packed
    from .codec import stand_in
    from .submission import origin_problem

    functions, states = {}, {}
    for ex in exercises:
        name = ex.function
        if name in states:
            continue
        fn = ns.get(name, _MISSING)
        if fn is _MISSING:
            states[name] = {"state": "missing"}
        elif not callable(fn):                       # a value the exercise asks for
            try:
                states[name] = {"state": "value", "value": _packed(fn, None)}
                functions[name] = fn
                continue
            except codec.CodecError as exc:
                states[name] = {"state": "refused", "report": f"❌ {name}: a value that cannot be graded ({exc})."}
        elif (problem := origin_problem(name, fn)) is not None:
            states[name] = {"state": "refused", "report": f"❌ {name}: {problem}."}
        else:
            states[name] = {"state": "callable"}
            functions[name] = fn
            continue
        functions[name] = stand_in(name, states[name])
    return functions, states


_MISSING = object()


def _timed(fn, name: str, timeout: float, say):
    """Each call on a budget: a SIGALRM stops a call that runs past ``timeout`` (the grader's watchdog
    kills the whole process when the call ignores it)."""
    calls = [0]

    def alarm(signum, frame):
        raise TimeoutError(f"{name} ran past {timeout:g} s and was stopped")

    def call(*args, **kwargs):
        calls[0] += 1
        say(f"call {calls[0]} of {name}")
        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    call.__name__ = name
    call.__wrapped__ = fn
    return call
