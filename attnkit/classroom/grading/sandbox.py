"""The sandbox and the budgets: every process the grader starts runs here, in bubblewrap where it works,
in a process group of its own, with caps for its whole process tree, and talks to the grader only over
pipes the grader made (never through a file the grader reads back).

Caps per process tree (one notebook's step):
- time: the notebook's budget, and a step's budget from the progress pipe (a step that sends nothing new
  for longer than the cell budget plus a grace period is killed);
- memory: a cgroup v2 ``memory.max`` where the grader may create cgroups; otherwise the grader sums the
  resident memory of the tree four times a second and kills it past the cap, and every process of a
  step that uses no GPU also has an address-space cap (RLIMIT_AS) of the same size;
- GPU memory, in a step that uses the GPU (``Budgets.gpu_memory_mib`` > 0): no RLIMIT_AS, because CUDA's
  driver reserves far more address space than it uses (a range that grows with the device's memory and
  unified memory), so under an address-space cap of a few GiB ``torch.cuda.is_available()`` is False.
  Such a step's memory is held by the two caps above, which count resident pages only, and each of
  its CUDA processes (the student's, the checker's, the timing worker and the notebook's kernel) caps
  PyTorch's allocator at ``gpu_memory_mib`` (``torch.cuda.set_per_process_memory_fraction``) before any
  notebook code runs; in bubblewrap the NVIDIA device files are bound in;
- processes: a cgroup v2 ``pids.max``; otherwise RLIMIT_NPROC for an unprivileged user (as root, the
  sandbox drops to user ``nobody`` so that the limit applies) and the same count of the tree;
- disk: in the sandbox the working folder and /tmp are tmpfs of a fixed size; without it the working
  folder is measured every second, and every file has RLIMIT_FSIZE;
- output: what comes back over the pipes is read up to a cap, the rest kills the tree.

Internal API for tests and scripts: ``bwrap_args(budgets, drop)`` (bubblewrap's arguments, before the
command), ``readable_roots`` (what it binds read-only; ``bwrap_args`` reads this name, so a test may
replace it) and ``environment_aliases`` (a linked environment's real folder and linked name).
"""
from __future__ import annotations

import glob
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import channel

PACKAGE_DIR = Path(__file__).resolve().parents[2]          # attnkit/
SANDBOX_HOME = "/grading"                                   # the working folder inside the sandbox
NOBODY = 65534
_BWRAP: dict = {}


@dataclass(frozen=True)
class Budgets:
    cell_timeout: float = 600.0        # seconds per cell (and per call of a student's function)
    notebook_timeout: float = 1800.0   # seconds per notebook, for each step
    memory_mib: int = 4096             # the whole process tree
    processes: int = 64                # the whole process tree
    tmp_mib: int = 256                 # the sandbox's /tmp (RAM-backed)
    staging_mib: int = 256             # the working folder
    output_mib: int = 256              # what comes back over the pipes, per step
    keep_mib: int = 16                 # the largest executed copy kept in the reports
    gpu_memory_mib: int = 0            # 0: the step uses no GPU (RLIMIT_AS applies); else each CUDA process's cap

    def __post_init__(self):
        for name in ("cell_timeout", "notebook_timeout", "memory_mib", "processes", "tmp_mib", "staging_mib",
                     "output_mib", "keep_mib"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{name}: must be a positive number, got {value!r}")
        value = self.gpu_memory_mib
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"gpu_memory_mib: must be a whole number of MiB, 0 (no GPU) or more, got {value!r}")

    @property
    def uses_gpu(self) -> bool:
        return self.gpu_memory_mib > 0


# ------------------------------------------------------------------------------------------ bubblewrap
def sandbox_problem() -> str | None:
    """None when bubblewrap runs here; otherwise why not, in a few words."""
    if "problem" not in _BWRAP:
        exe = shutil.which("bwrap")
        if exe is None:
            _BWRAP["problem"] = "bubblewrap (bwrap) is not installed (`make setup` installs it as root)"
        else:
            try:
                done = subprocess.run([exe, "--ro-bind", "/", "/", *_unshare(), "--die-with-parent",
                                       "--proc", "/proc", "--dev", "/dev", "true"],
                                      capture_output=True, text=True, timeout=30)
                _BWRAP["problem"] = None if done.returncode == 0 else \
                    f"bwrap cannot create a sandbox here ({done.stderr.strip() or done.returncode})"
            except (OSError, subprocess.TimeoutExpired) as exc:
                _BWRAP["problem"] = f"bwrap cannot create a sandbox here ({exc})"
    return _BWRAP["problem"]


def _unshare(drop: bool = False) -> list[str]:
    # Dropping to `nobody` (so that RLIMIT_NPROC counts): no user namespace, which would keep root's uid
    # outside, and root's processes are never counted.
    if drop:
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    return ["--unshare-all"]


def drops_to_nobody() -> bool:
    """As root, whether the sandbox can run as ``nobody``: the package and the environment must be
    readable by that user (a FUSE mount without allow_other, or a private home, is not)."""
    if "nobody" not in _BWRAP:
        _BWRAP["nobody"] = False
        if os.geteuid() == 0 and sandbox_problem() is None:
            probe = ("import os; os.setgroups([]); os.setresgid(65534, 65534, 65534); "
                     "os.setresuid(65534, 65534, 65534); import attnkit.classroom.grading.codec, nbformat")
            argv = bwrap_args(Budgets(), drop=True) + [sys.executable, "-I", "-c", probe]
            try:
                done = subprocess.run(argv, capture_output=True, timeout=60)
                _BWRAP["nobody"] = done.returncode == 0
            except (OSError, subprocess.TimeoutExpired):
                pass
    return _BWRAP["nobody"]


def readable_roots() -> list[str]:
    """What the sandbox shows read-only: the system, the Python installation and environment, and the
    package itself (not the repository around it)."""
    roots = ["/usr", "/etc", "/opt", "/sys"]
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        roots.append(os.path.realpath(prefix))
    roots.append(os.path.dirname(os.path.realpath(sys.executable)))
    roots.append(str(PACKAGE_DIR))
    for path in sys.path:          # site-packages and .pth-added folders outside the prefixes
        if path and os.path.isdir(path) and "site-packages" in path:
            roots.append(os.path.realpath(path))
    out = []
    for r in sorted(set(roots), key=len):
        if os.path.exists(r) and not any(r == o or r.startswith(o.rstrip("/") + "/") for o in out):
            out.append(r)
    return out


def environment_aliases() -> list[tuple[str, str]]:
    """(real folder, the name this interpreter uses for it) where the Python environment is reached
    through a symbolic link, e.g. a `.venv` that links to a venv elsewhere: the readable roots hold the
    real folder, and the sandbox shows it under the linked name too, where ``sys.executable`` and the
    paths Python derives from it point."""
    out: list[tuple[str, str]] = []
    for path in sorted({sys.prefix, sys.exec_prefix, os.path.dirname(sys.executable)}, key=len):
        alias, real = os.path.abspath(path), os.path.realpath(path)
        if alias != real and os.path.isdir(real) and \
                not any(alias == a or alias.startswith(a.rstrip("/") + "/") for _, a in out):
            out.append((real, alias))
    return out


def sandbox_argv(argv: list[str], budgets: Budgets) -> list[str]:
    """``argv`` wrapped in bwrap: the readable roots read-only, a tmpfs /tmp and a tmpfs working folder
    of fixed sizes, nothing else writable, no network."""
    return bwrap_args(budgets, drops_to_nobody()) + argv


def bwrap_args(budgets: Budgets, drop: bool) -> list[str]:
    """bubblewrap's command line up to ``--`` for a step with ``budgets``; ``drop``: the sandbox becomes
    ``nobody`` (``drops_to_nobody``)."""
    args = [shutil.which("bwrap")]
    for link in ("/bin", "/lib", "/lib32", "/lib64", "/sbin"):
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    args += ["--size", str(int(budgets.tmp_mib) * 2**20), "--perms", "1777", "--tmpfs", "/tmp"]
    for root in readable_roots():  # after /tmp: a course installed under /tmp is bound on top
        args += ["--ro-bind", root, root]
    for real, alias in environment_aliases():  # a linked environment, under the name the interpreter uses
        args += ["--ro-bind", real, alias]
    args += ["--size", str(int(budgets.staging_mib) * 2**20), "--perms", "1777", "--tmpfs", SANDBOX_HOME,
             "--dev", "/dev"]
    if budgets.uses_gpu:                  # a minimal /dev has no GPU: its device files are bound in
        for device in gpu_device_files():
            args += ["--dev-bind", device, device]
    args += ["--proc", "/proc", "--chdir", SANDBOX_HOME, *_unshare(drop),
             "--die-with-parent", "--new-session", "--cap-drop", "ALL"]     # no capability, even in its namespace
    if drop:
        args += ["--cap-add", "CAP_SETUID,CAP_SETGID"]       # used once, to become nobody, then gone
    return args + ["--"]


def gpu_device_files() -> list[str]:
    """The NVIDIA device files of this machine (/dev/nvidia0, nvidiactl, nvidia-uvm, ...), which a step
    that uses the GPU needs inside the sandbox."""
    found = []
    for pattern in ("/dev/nvidia*", "/dev/nvidia-caps/*"):
        found += [p for p in sorted(glob.glob(pattern)) if not os.path.isdir(p)]
    return found


# ------------------------------------------------------------------------------------- in the worker
def worker_spec(spec: dict, budgets: Budgets, sandbox: bool) -> dict:
    """``spec`` with the caps a worker applies to itself (``apply_limits``): the memory budget (an
    address-space cap only where the step uses no GPU), the GPU memory cap, the file size, the
    process count, and whether to become ``nobody``."""
    return dict(spec, memory_mib=budgets.memory_mib, staging_mib=budgets.staging_mib,
                gpu_memory_mib=budgets.gpu_memory_mib, nproc=nproc_limit(budgets, sandbox),
                drop_to_nobody=bool(sandbox and drops_to_nobody()))


def rlimits(spec: dict) -> list[tuple[str, int]]:
    """The resource limits ``apply_limits`` sets for ``spec``: RLIMIT_AS (the memory budget) only where
    the step uses no GPU (CUDA cannot start under an address-space cap of a few GiB; see the module's
    doc), no core files, RLIMIT_FSIZE, and RLIMIT_NPROC where the grader gave one."""
    mib = 2**20
    limits = [] if spec.get("gpu_memory_mib") else [("RLIMIT_AS", int(spec["memory_mib"]) * mib)]
    limits += [("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", int(spec["staging_mib"]) * mib)]
    if spec.get("nproc"):
        limits.append(("RLIMIT_NPROC", int(spec["nproc"])))
    return limits


def cap_gpu_memory(mib: int) -> str | None:
    """In a worker of a step that uses the GPU: cap PyTorch's CUDA allocator in this process at ``mib``
    MiB (a larger allocation raises ``torch.OutOfMemoryError``). None when capped (or there is no GPU to
    cap); otherwise why it could not be."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, int(mib) * 2**20 / total))
    except Exception as exc:  # noqa: BLE001 - reported by the caller
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def apply_limits(spec: dict) -> list[str]:
    """The worker's first act: the caps of ``rlimits`` (address space where no GPU is used, process
    count, file size, core files); in the sandbox as root, become ``nobody``; die with the grader.
    Returns the caps that could not be set."""
    import resource

    missing = []
    for name, value in rlimits(spec):
        try:
            resource.setrlimit(getattr(resource, name), (value, value))
        except (AttributeError, ValueError, OSError):   # not on this system (macOS has no RLIMIT_AS cap)
            missing.append(name)
    if spec.get("drop_to_nobody") and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)       # every capability goes with root
    try:                              # PR_SET_PDEATHSIG = 1
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - not Linux: the process group kill remains
        pass
    return missing


def set_undumpable() -> None:
    """No other process of the same user may read this one's memory or open its pipes (/proc/PID/fd)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0)        # PR_SET_DUMPABLE, 0
    except Exception:  # noqa: BLE001 - not Linux
        pass


# ------------------------------------------------------------------------------------------ processes
def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (parent pid, resident KiB, uid) of every process visible here."""
    table = {}
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[21]) * page_kib, os.stat(f"/proc/{entry}").st_uid)
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(pid: int, table: dict | None = None) -> list[int]:
    table = _proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen, cgroup: Path | None = None) -> None:
    """SIGKILL the process, its process group, its cgroup, and every process descended from it."""
    targets = descendants(proc.pid)
    if cgroup is not None:
        _cgroup_kill(cgroup)
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: proc.kill()):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    for pid in targets:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


# ------------------------------------------------------------------------------------------ cgroups v2
_CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_problem() -> str | None:
    """None when the grader can make cgroup v2 groups with memory and pids controllers here."""
    if not (_CGROUP_ROOT / "cgroup.controllers").exists():
        return "no cgroup v2 hierarchy at /sys/fs/cgroup"
    parent = _own_cgroup()
    if parent is None or not os.access(parent, os.W_OK):
        return "the grader's cgroup is not writable"
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError as exc:
        return f"cgroup.subtree_control unreadable ({exc})"
    if not {"memory", "pids"} <= set(enabled):
        return "the memory and pids controllers are not enabled for the grader's cgroup"
    return None


def _own_cgroup() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return _CGROUP_ROOT / line[3:].lstrip("/")
    except OSError:
        pass
    return None


def make_cgroup(name: str, budgets: Budgets) -> Path | None:
    if cgroup_problem() is not None:
        return None
    group = _own_cgroup() / name
    try:
        group.mkdir()
        (group / "memory.max").write_text(str(int(budgets.memory_mib) * 2**20))
        (group / "pids.max").write_text(str(int(budgets.processes)))
        if (group / "memory.swap.max").exists():
            (group / "memory.swap.max").write_text("0")
    except OSError:
        remove_cgroup(group)
        return None
    return group


def _cgroup_kill(group: Path) -> None:
    try:
        if (group / "cgroup.kill").exists():
            (group / "cgroup.kill").write_text("1")
        else:
            for pid in (group / "cgroup.procs").read_text().split():
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError):
        pass


def remove_cgroup(group: Path | None) -> None:
    if group is None:
        return
    for _ in range(50):
        _cgroup_kill(group)
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


# ------------------------------------------------------------------------------------- reading files
class UnsafeFile(ValueError):
    """A path the grader will not read: a link, a folder, a FIFO or device, or too large."""


def safe_read(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit``: opened without following a link
    and without blocking (a FIFO cannot hold the grader), checked to be a regular file, read up to
    ``limit`` bytes (a larger file raises ``UnsafeFile``)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeFile(f"{str(path)!r} is a symbolic link: not read") from None
        raise UnsafeFile(f"{str(path)!r} cannot be opened ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeFile(f"{str(path)!r} is not a regular file: not read")
        if info.st_size > limit:
            raise UnsafeFile(f"{str(path)!r} has {info.st_size} bytes, more than the {limit} allowed")
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(2**20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise UnsafeFile(f"{str(path)!r} grew past the {limit} bytes allowed")
        return b"".join(chunks)
    finally:
        os.close(fd)


def folder_bytes(path: Path, entries: int = 20000) -> int:
    """Bytes allocated under ``path`` (links not followed), counting at most ``entries`` entries."""
    total, todo, seen = 0, [str(path)], 0
    while todo and seen < entries:
        try:
            with os.scandir(todo.pop()) as it:
                for entry in it:
                    seen += 1
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        todo.append(entry.path)
        except OSError:
            continue
    return total


# --------------------------------------------------------------------------------------- one run
@dataclass
class Run:
    returncode: int | None
    stopped: str | None           # why the grader killed it, or None
    frames: list = field(default_factory=list)     # what came over the channel, decoded
    stderr: str = ""
    seconds: float = 0.0
    peak_mib: float = 0.0         # the largest resident memory of the tree the grader saw
    peak_processes: int = 0


def nproc_limit(budgets: Budgets, sandbox: bool) -> int | None:
    """RLIMIT_NPROC for the worker: it counts every process of the real user, so as ``nobody`` in the
    sandbox it is the budget; for an unprivileged grader, its processes now plus the budget; root's
    processes are never limited by it (the grader's count of the tree remains)."""
    if os.geteuid() == 0:
        return int(budgets.processes) if sandbox and drops_to_nobody() else None
    uid = os.getuid()
    mine = sum(1 for _, _, owner in _proc_table().values() if owner == uid)
    return mine + int(budgets.processes)


def run_budgeted(argv: list[str], budgets: Budgets, *, sandbox: bool, spec: dict, workdir: Path,
                 calls_fd: int | None = None, env: dict | None = None) -> Run:
    """Run ``argv`` (a worker) with ``spec`` on its stdin, in bwrap when ``sandbox`` (else in ``workdir``),
    and watch it: the budgets above, the progress pipe, the channel. ``calls_fd``: its end of the
    connection between the student's process and the checker's (closed here once passed on).
    ``env``: variables to add."""
    spec = worker_spec(spec, budgets, sandbox)
    progress_r, progress_w = os.pipe()
    channel_r, channel_w = os.pipe()
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "MPLBACKEND": "Agg",
           "PYTHONDONTWRITEBYTECODE": "1", "JUPYTER_PLATFORM_DIRS": "1", "ATTNKIT_GRADING": "1",
           "ATTNKIT_GRADING_FDS": ",".join(str(f) for f in (progress_w, channel_w, calls_fd) if f is not None),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    home = SANDBOX_HOME if sandbox else str(workdir)
    base.update(HOME=f"{home}/.home", TRITON_CACHE_DIR=f"{home}/.triton", TMPDIR="/tmp" if sandbox else str(workdir))
    extra = env or {}
    env = base
    for key in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra)
    group = make_cgroup(f"attnkit-grade-{os.getpid()}-{time.monotonic_ns()}", budgets)
    full = sandbox_argv(argv, budgets) if sandbox else argv

    def enter_cgroup():
        if group is not None:
            (group / "cgroup.procs").write_text("0")

    started = time.monotonic()
    passed = tuple(f for f in (progress_w, channel_w, calls_fd) if f is not None)
    proc = subprocess.Popen(full, cwd=str(workdir), env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True, pass_fds=passed,
                            preexec_fn=enter_cgroup if group is not None else None)
    for fd in passed:
        os.close(fd)
    limit = int(budgets.output_mib) * 2**20
    reader = channel.Reader(channel_r, limit)
    stderr = channel.Tail(proc.stderr.fileno(), 2**16)
    threads = [threading.Thread(target=reader.run, daemon=True), threading.Thread(target=stderr.run, daemon=True)]
    for t in threads:
        t.start()
    feeder = threading.Thread(target=_feed, args=(proc, channel.spec_line(spec)), daemon=True)
    feeder.start()
    watch = _Watch(proc, budgets, sandbox, workdir, group, progress_r, started)
    try:
        stopped = watch.loop(reader)
    finally:
        if proc.poll() is None or stopped:
            kill_tree(proc, group)
        else:
            for pid in descendants(proc.pid):          # what it left running
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for t in threads:
            t.join(timeout=5)
        os.close(progress_r)
        remove_cgroup(group)
    return Run(proc.returncode, stopped, reader.frames, stderr.text(), time.monotonic() - started,
               watch.peak_kib / 1024, watch.peak_processes)


def _feed(proc, data: bytes) -> None:
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:
        pass


class _Watch:
    """The grader's watchdog for one run."""

    def __init__(self, proc, budgets: Budgets, sandbox, workdir, group, progress_fd, started):
        self.proc, self.budgets, self.sandbox, self.workdir = proc, budgets, sandbox, workdir
        self.group, self.started = group, started
        self.progress = channel.Lines(progress_fd)
        self.step, self.step_started = "", started
        self.peak_kib, self.peak_processes = 0, 0
        self.last_measured, self.last_disk = 0.0, 0.0

    def loop(self, reader) -> str | None:
        grace = max(5.0, 0.25 * self.budgets.cell_timeout)
        while self.proc.poll() is None:
            time.sleep(0.05)
            now = time.monotonic()
            for line in self.progress.read():
                if line != self.step:
                    self.step, self.step_started = line, now
            if reader.overflow:
                return f"sent more than {self.budgets.output_mib:g} MiB back to the grader"
            if now - self.started > self.budgets.notebook_timeout:
                return f"ran past the notebook's budget of {self.budgets.notebook_timeout:g} s"
            if self.step and now - self.step_started > self.budgets.cell_timeout + grace:
                return f"{self.step} ran past its budget of {self.budgets.cell_timeout:g} s and ignored the interrupt"
            stopped = self.measure(now)
            if stopped:
                return stopped
        return None

    def measure(self, now: float) -> str | None:
        if now - self.last_measured >= 0.25:
            self.last_measured = now
            table = _proc_table()
            tree = [self.proc.pid] + descendants(self.proc.pid, table)
            kib = sum(table[p][1] for p in tree if p in table)
            self.peak_kib, self.peak_processes = max(self.peak_kib, kib), max(self.peak_processes, len(tree))
            # processes first: resident sizes count shared pages in every process, so a tree of many
            # forks also looks large; the count is the cause to name
            if len(tree) > self.budgets.processes + 2:          # bwrap's own two processes
                return f"started more than {self.budgets.processes:g} processes"
            if kib > self.budgets.memory_mib * 1024:
                return f"used more than its {self.budgets.memory_mib:g} MiB of memory (all its processes together)"
        if not self.sandbox and now - self.last_disk >= 1.0:
            self.last_disk = now
            if folder_bytes(self.workdir) > self.budgets.staging_mib * 2**20:
                return f"wrote more than {self.budgets.staging_mib:g} MiB to its folder"
        return None
