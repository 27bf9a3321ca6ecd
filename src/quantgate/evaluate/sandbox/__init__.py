"""Run untrusted Python (model-written HumanEval completions) inside an OS-enforced sandbox.

Why the kernel and not Python: a completion is arbitrary code, so every limit (namespaces, a
minimal read-only root, an unprivileged uid, a seccomp filter, resource limits, a wall-clock
kill) is set by the kernel, and a sandbox that cannot be set up runs nothing: there is no
unsandboxed fallback, and the caller records the item as not evaluated
(``SandboxResult.error``), never as failed.

Two ways to run: ``run_check`` scores a solution against tests, and is what HumanEval uses:
the tests run in a process of their own (``calls.py``), and only they can say "passed", on a
pipe the program never holds, so a program that exits 0 early, from an ``atexit`` hook or an
excepthook, raises ``SystemExit`` or kills the harness fails. ``run_untrusted`` runs a program
alone and reports its exit status: the program's own word, for probing the sandbox, never a
test verdict.

Two ways in, the same sandbox inside (``QUANTGATE_SANDBOX``, see ``mode``):

- ``root``: run by root (CI). ``unshare`` makes the namespaces; the program runs as uid
  ``SANDBOX_UID`` (nobody), the tests' harness as ``HARNESS_UID``.
- ``userns``: run by anyone else, where the kernel allows unprivileged user namespaces (a
  developer's workstation). ``unshare --user --map-root-user`` gives the supervisor root inside
  a user namespace that maps only the caller's uid; the program runs as ``SANDBOX_UID`` in a
  second, nested user namespace, without capabilities (the harness in a sibling of it). On the
  host it is still the caller's uid, which is why the root it sees is minimal in both modes:
  system directories and the interpreter, read-only, and nothing of the caller's (home,
  repository, datasets).

What stays possible inside: what the seccomp allow-list lets through (``seccomp``: the
syscalls CPython, the harness and HumanEval solutions were measured to make), that is reading
world-readable files of ``/usr``, ``/etc`` and the interpreter, files on the private tmpfs,
threads, sleeping, and CPU and memory up to the limits; no socket, pipe, signal to another
process, System V IPC, AIO or other kernel object. Memory in all: one program process
(``RLIMIT_AS``) and the harness (the same limit), plus the private tmpfs (at most 97 MiB) and
the buffers of the pipes the supervisor made. Disk: none of the host's; stdout and stderr are
pipes, read by the caller up to ``output.OUTPUT_LIMIT`` bytes each (``output``). In userns
mode the program also keeps the caller's supplementary groups (the kernel lets no
unprivileged process drop them), so files there that one of those groups may read are
readable to it too. Each layer is described where it is built: ``run_check``,
``supervisor._supervise``, ``supervisor._build_root``, ``supervisor._Spawner``, ``seccomp``,
``calls``, ``output``.
"""

from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

# relative: tests load this package by path as a user who cannot read the virtual environment
from . import output, supervisor
from .output import TAIL_BYTES
from .supervisor import MB, SETUP_FAILED

SandboxStatus = Literal["passed", "failed", "timeout", "resource_limit", "sandbox_error"]
SandboxMode = Literal["root", "userns"]

ENV = "QUANTGATE_SANDBOX"  # auto (default): root mode as root, else user namespaces; none: never build one
SANDBOX_UID = 65534  # nobody
SANDBOX_GID = 65534  # nogroup
HARNESS_UID = HARNESS_GID = (
    65533  # the tests' harness in root mode: no account, no file, no process of the program's
)
# Extra wall time the parent allows for setup and teardown before it stops trusting the
# supervisor to end the run and kills it itself.
_BACKSTOP_GRACE_S = 20.0
_LIMIT_ERRORS = ("MemoryError", "OSError: [Errno 27]", "BlockingIOError: [Errno 11]", output.LIMIT_NOTE)


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed run ended. The tails are the last ``TAIL_BYTES`` of each stream.

    ``error`` is set exactly when ``status`` is ``sandbox_error``: why no sandbox could be built
    (or why it broke down), so the program's outcome is unknown, not a failure.
    """

    status: SandboxStatus
    returncode: int | None
    seconds: float
    stdout_tail: str
    stderr_tail: str
    error: str | None = None

    @property
    def passed(self) -> bool:
        """``run_check``: the tests' harness said so; ``run_untrusted``: exit code 0 in time."""
        return self.status == "passed"


def mode() -> SandboxMode | str:
    """How a sandbox would be built here, or (a string) why none can be.

    ``$QUANTGATE_SANDBOX``: ``auto`` (default) picks ``root`` when running as root with
    ``SANDBOX_UID`` mapped in this user namespace, else ``userns``; ``none`` forbids both, for a
    machine that must not run model-written code (its code items are recorded as not evaluated).
    """
    setting = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if setting == "none":
        return f"{ENV}=none forbids building a sandbox on this machine"
    if setting != "auto":
        return f"{ENV}={setting!r} is not a setting: use auto or none"
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux namespaces"
    if os.geteuid() == 0 and _mapped(SANDBOX_UID):
        return "root"
    problem = _userns_problem()
    return problem or "userns"


def unavailable() -> str | None:
    """Why no sandbox can be built here (after trying one), or None when solutions can be checked.

    Callers check once before generating code, so that a machine without a sandbox records its
    code items as not evaluated without spending the generation on them. The probe is a checked
    run (harness and program), the path HumanEval takes.
    """
    probe = Check(tests="def check(candidate):\n    assert candidate(2) == 4\n", entry_point="double")
    result = run_check("def double(x):\n    return 2 * x\n", probe, timeout_s=10.0)
    if result.status == "sandbox_error":
        return (result.error or "the sandbox broke down").removeprefix(f"{SETUP_FAILED}: ")
    if not result.passed:
        tail = result.stderr_tail.strip().splitlines()[-1:] or [result.status]
        return f"a solution that passes its test did not pass in the sandbox ({result.status}: {tail[0]})"
    return None


@dataclass(frozen=True)
class Check:
    """Trusted test code for ``run_check``: it defines ``check(candidate)``, which raises on a wrong answer.

    ``tests`` is run by the harness, never by the program: for HumanEval the problem's prompt
    (helpers such as ``poly`` that some tests call) and its test code. ``entry_point`` names
    the program's function that ``candidate`` calls.
    """

    tests: str
    entry_point: str


def run_check(
    solution: str,
    check: Check,
    *,
    timeout_s: float = 10.0,
    memory_bytes: int = 512 * MB,
    max_processes: int = 16,
    cpu_seconds: int | None = None,
) -> SandboxResult:
    """Run ``solution`` in the sandbox and ``check.tests`` against it; passed only if ``check()`` returned.

    The tests run in a harness process of their own that calls the solution's entry point in
    the program's process by value (``calls.py`` says what passes between them and why), and
    "passed" comes only from the harness, on a pipe the program never holds: the program's exit
    status, output and any signal it sends count for nothing. ``returncode`` is the harness's (0
    when ``check()`` returned, 1 when it raised); ``stderr_tail`` is the program's, followed by
    the harness's traceback. Limits and errors as in ``run_untrusted``, for each of the two.
    """
    return _run(
        {"program": solution, "tests": check.tests},
        {"entry_point": check.entry_point, "harness_uid": HARNESS_UID, "harness_gid": HARNESS_GID},
        timeout_s, memory_bytes, max_processes, cpu_seconds,
    )  # fmt: skip


def run_untrusted(
    program: str,
    *,
    timeout_s: float = 10.0,
    memory_bytes: int = 512 * MB,
    max_processes: int = 16,
    cpu_seconds: int | None = None,
) -> SandboxResult:
    """Run the Python source ``program`` alone in the sandbox; passed means exit code 0 in time.

    That is the program's own word (``sys.exit(0)`` says it): use it to see what a program can
    do in the sandbox, and ``run_check`` to score one. ``memory_bytes`` caps the address space
    of each process, ``max_processes`` the processes and threads of the sandbox uid (seccomp
    allows threads, not processes), ``cpu_seconds`` the CPU time of each process (default: the
    timeout rounded up, plus one). In root mode ``RLIMIT_NPROC`` counts every process of
    ``SANDBOX_UID`` on the host, so concurrent sandboxes share that budget; in userns mode it
    counts the processes of this run's own user namespace. Returns ``sandbox_error`` (with
    ``error``) without running anything when the sandbox cannot be built (``mode`` gives no
    way, no ``unshare``, no seccomp filter for this machine, a namespace or mount refused); the
    program is never run outside it.

    ``unshare`` (util-linux) gives the run private network, mount, PID, IPC and UTS namespaces
    (and a user namespace in userns mode); the network namespace has only a loopback that is
    down, and seccomp allows no socket of any family besides (a vsock or netlink socket, or a
    Unix socket reaching a host's socket file through the filesystem, ignore the network
    namespace). stdout and stderr are pipes: output past ``output.OUTPUT_LIMIT`` bytes on
    either is not read, the program's next write to it fails, and the run is a
    ``resource_limit`` unless it passed.
    """
    return _run({"program": program, "tests": None}, {}, timeout_s, memory_bytes, max_processes, cpu_seconds)


def _run(
    request: dict,
    extra: dict,
    timeout_s: float,
    memory_bytes: int,
    max_processes: int,
    cpu_seconds: int | None,
) -> SandboxResult:
    started = time.monotonic()
    how = mode()
    if how not in ("root", "userns"):
        return _setup_error(started, how)
    unshare = shutil.which("unshare", path="/usr/bin:/bin")
    if unshare is None:
        return _setup_error(started, "`unshare` (util-linux) is not installed")
    runtime = _runtime()
    if isinstance(runtime, str):
        return _setup_error(started, runtime)
    config = {
        "mode": how,
        "timeout_s": float(timeout_s),
        "memory_bytes": int(memory_bytes),
        "max_processes": int(max_processes),
        "cpu_seconds": int(cpu_seconds if cpu_seconds is not None else math.ceil(timeout_s) + 1),
        "uid": SANDBOX_UID,
        "gid": SANDBOX_GID,
        **extra,
        **runtime,
    }
    status_r, status_w = os.pipe()
    config["status_fd"] = status_w
    user = ["--user", "--map-root-user"] if how == "userns" else []
    command = [
        unshare, *user,
        "--net", "--mount", "--propagation", "private", "--ipc", "--uts",
        "--pid", "--fork", "--kill-child", "--mount-proc",
        "--", sys.executable, "-I", "-S", "-B", os.path.abspath(supervisor.__file__), json.dumps(config),
    ]  # fmt: skip
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    streams = [output.Stream("stdout", out_r), output.Stream("stderr", err_r)]
    with tempfile.TemporaryFile() as source:  # the request: the supervisor reads it, no one else
        source.write(json.dumps(request).encode())
        source.seek(0)
        try:
            proc = subprocess.Popen(
                command, stdin=source, stdout=out_w, stderr=err_w, pass_fds=(status_w,),
                start_new_session=True, cwd="/", env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
        except OSError as exc:
            for stream in streams:
                stream.close()
            os.close(status_r)
            return _setup_error(started, str(exc))
        finally:
            for fd in (status_w, out_w, err_w):
                os.close(fd)
    hung = not _wait_or_kill(proc, timeout_s + _BACKSTOP_GRACE_S, streams)
    report = _read_report(status_r)
    stdout_tail, stderr_tail = streams[0].text(), output.with_notes(streams[1].text(), streams)
    if hung:
        return _result("timeout", None, started, stdout_tail, stderr_tail)
    if "error" in report or "exit" not in report and "signal" not in report:
        detail = report.get("error") or _unshare_failed(how, proc.returncode, stderr_tail)
        return _result("sandbox_error", None, started, stdout_tail, f"{stderr_tail}\n{detail}", detail)
    if request["tests"] is not None:
        return _classify_check(report, started, stdout_tail, stderr_tail)
    return _classify(report, started, stdout_tail, stderr_tail)


def _mapped(uid: int) -> bool:
    """Whether ``uid`` exists in this process's user namespace (always, outside containers)."""
    try:
        with open("/proc/self/uid_map") as handle:
            ranges = [tuple(map(int, line.split())) for line in handle if line.strip()]
    except (OSError, ValueError):
        return False
    return any(inner <= uid < inner + count for inner, _outer, count in ranges)


_USERNS_SWITCHES = (
    (
        "/proc/sys/user/max_user_namespaces",
        "0",
        "user namespaces are disabled (user.max_user_namespaces = 0)",
    ),
    (
        "/proc/sys/kernel/unprivileged_userns_clone",
        "0",
        "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0)",
    ),
)


def _userns_problem() -> str | None:
    """Why this kernel will refuse an unprivileged user namespace, where a sysctl says so."""
    for path, off, why in _USERNS_SWITCHES:
        try:
            with open(path) as handle:
                if handle.read().strip() == off:
                    return f"not root, and {why}: run as root, or enable them"
        except OSError:
            pass
    return None


def _unshare_failed(how: str, code: int | None, stderr: str) -> str:
    said = stderr.strip().splitlines()[-1] if stderr.strip() else f"exited with {code}"
    detail = f"{SETUP_FAILED}: unshare: {said}"
    if how == "userns":
        detail += " (not root, so this needs unprivileged user namespaces"
        try:
            with open("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") as handle:
                if handle.read().strip() == "1":
                    detail += (
                        "; AppArmor restricts them here: kernel.apparmor_restrict_unprivileged_userns = 1"
                    )
        except OSError:
            pass
        detail += ")"
    return detail


def _runtime() -> dict[str, str] | str:
    """The interpreter prefix to bind into the sandbox and the interpreter's path inside it.

    A string is the reason there is none.
    """
    prefix = os.path.realpath(sys.base_prefix)
    relative = os.path.relpath(os.path.realpath(sys.executable), prefix)
    if relative.startswith(".."):
        return f"{sys.executable} is not under its base prefix {prefix}"
    return {"prefix": prefix, "interpreter": relative}


def _wait_or_kill(proc: subprocess.Popen, deadline_s: float, streams: list[output.Stream]) -> bool:
    """Wait for ``unshare``, reading its output; past the deadline kill it, its group and the namespace.

    Returns False when it had to kill. The leader is reaped only after ``killpg``, so the
    group id cannot have been reused by then. The output is read to its end once everything
    in the namespace has ended (``output.drain``).
    """
    pidfd = os.pidfd_open(proc.pid)
    interrupted = None
    try:
        finished = output.pump(streams, pidfd, deadline_s)
    except BaseException as exc:  # noqa: BLE001 - an interrupted caller still kills the sandbox
        finished, interrupted = False, exc
    finally:
        os.close(pidfd)
    inits = [] if finished else _children(proc.pid)
    init_fds = []
    for pid in inits:
        try:
            init_fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    # PID 1 of the namespace exits only after the kernel has killed everything in it.
    for fd in init_fds:
        select.select([fd], [], [], 10.0)
        os.close(fd)
    output.drain(streams)
    if interrupted is not None:
        raise interrupted
    return finished


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except OSError:
        return []


def _read_report(fd: int) -> dict:
    try:
        return json.loads(supervisor.drain(fd) or b"{}")
    except ValueError:
        return {"error": f"{SETUP_FAILED}: unreadable report from the supervisor"}


_LIMIT_SIGNALS = (signal.SIGXCPU, signal.SIGXFSZ)


def _classify(report: dict, started: float, stdout: str, stderr: str) -> SandboxResult:
    if report.get("timed_out"):
        return _result("timeout", None, started, stdout, stderr)
    if "signal" in report:
        status = "resource_limit" if report["signal"] in _LIMIT_SIGNALS else "failed"
        return _result(status, -report["signal"], started, stdout, stderr)
    code = report["exit"]
    if code == 0:
        return _result("passed", 0, started, stdout, stderr)
    return _result("resource_limit" if _hit_limit(stderr) else "failed", code, started, stdout, stderr)


def _classify_check(report: dict, started: float, stdout: str, stderr: str) -> SandboxResult:
    """A checked run: passed only on the harness's word; otherwise why not, as far as can be told."""
    check = report.get("check") or {}
    code = -report["signal"] if "signal" in report else report["exit"]
    program = report.get("program", {})
    harness_error = str(check.get("error") or "")
    limited = report.get("signal") in _LIMIT_SIGNALS or program.get("signal") in _LIMIT_SIGNALS
    limited = limited or _hit_limit(stderr) or _hit_limit(harness_error)
    if harness_error:
        stderr = (stderr + ("\n" if stderr and not stderr.endswith("\n") else "") + harness_error)[
            -TAIL_BYTES:
        ]
    if report.get("timed_out"):
        return _result("timeout", None, started, stdout, stderr)
    if check.get("passed") is True and code == 0:
        return _result("passed", 0, started, stdout, stderr)
    return _result("resource_limit" if limited else "failed", code, started, stdout, stderr)


def _hit_limit(stderr: str) -> bool:
    """Whether the last line is what Python makes of a refused allocation, file size or fork.

    A label only (the text may be the program's own): it never turns a failure into a pass.
    """
    return stderr.strip().rsplit("\n", 1)[-1].startswith(_LIMIT_ERRORS)


def _result(status, returncode, started, stdout, stderr, error=None) -> SandboxResult:
    return SandboxResult(status, returncode, time.monotonic() - started, stdout, stderr, error)


def _setup_error(started: float, problem: str) -> SandboxResult:
    detail = f"{SETUP_FAILED}: {problem}"
    return _result("sandbox_error", None, started, "", detail, detail)
