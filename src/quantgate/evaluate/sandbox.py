"""Run untrusted Python (model-written HumanEval completions) inside an OS-enforced sandbox.

Why the kernel and not Python: a completion is arbitrary code, so every limit (namespaces,
read-only mounts, an unprivileged uid, resource limits, a wall-clock kill) is set by the kernel,
and a sandbox that cannot be set up runs nothing: there is no unsandboxed fallback. What stays
possible inside: reading world-readable host files (the repository, datasets, ``/etc``) and
using CPU and memory up to the limits.
Each layer is described where it is built: ``run_untrusted``, ``_supervise``,
``_isolate_filesystem``, ``_spawn``.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

SandboxStatus = Literal["passed", "failed", "timeout", "resource_limit", "sandbox_error"]

SANDBOX_UID = 65534  # nobody
SANDBOX_GID = 65534  # nogroup
# sizes in SI bytes, as everywhere in quantgate (quantgate.units), written out: the supervisor
# runs this file as a script under `python -I -S`, where only the standard library imports
MB = 10**6
FILE_SIZE_LIMIT = 16 * MB
OPEN_FILES_LIMIT = 64
TAIL_BYTES = 2048
# Extra wall time the parent allows for setup and teardown before it stops trusting the
# supervisor to end the run and kills it itself.
_BACKSTOP_GRACE_S = 20.0
_RUNTIME_DIR = "/run/python"
_WORK_DIR = "/tmp/work"
_SETUP_FAILED = "sandbox setup failed"
_LIMIT_ERRORS = ("MemoryError", "OSError: [Errno 27]", "BlockingIOError: [Errno 11]")


@dataclass(frozen=True)
class SandboxResult:
    """How one sandboxed run ended. The tails are the last ``TAIL_BYTES`` of each stream."""

    status: SandboxStatus
    returncode: int | None
    seconds: float
    stdout_tail: str
    stderr_tail: str

    @property
    def passed(self) -> bool:
        """Exit code 0 within the time limit."""
        return self.status == "passed"


def run_untrusted(
    program: str,
    *,
    timeout_s: float = 10.0,
    memory_bytes: int = 512 * MB,
    max_processes: int = 16,
    cpu_seconds: int | None = None,
) -> SandboxResult:
    """Run the Python source ``program`` in the sandbox; passed means exit code 0 in time.

    ``memory_bytes`` caps the address space of each process, ``max_processes`` the processes
    of the sandbox uid, ``cpu_seconds`` the CPU time of each process (default: the timeout
    rounded up, plus one). ``RLIMIT_NPROC`` counts every process of ``SANDBOX_UID`` on the
    host, so concurrent sandboxes share that budget. Returns ``sandbox_error`` without running
    anything when the sandbox cannot be built (not root, no ``unshare``, a namespace or mount
    refused); the program is never run outside it.

    ``unshare`` (util-linux) gives the run private network, mount, PID, IPC and UTS namespaces;
    the network namespace has only a loopback that is down, so no socket reaches the host or the
    internet, loopback and abstract Unix sockets included.
    """
    started = time.monotonic()
    problem = _precheck()
    if problem:
        return _result("sandbox_error", None, started, "", f"{_SETUP_FAILED}: {problem}")
    unshare = shutil.which("unshare", path="/usr/bin:/bin")
    if unshare is None:
        return _result(
            "sandbox_error", None, started, "", f"{_SETUP_FAILED}: `unshare` (util-linux) is not installed"
        )
    runtime = _runtime()
    if isinstance(runtime, str):
        return _result("sandbox_error", None, started, "", f"{_SETUP_FAILED}: {runtime}")
    config = {
        "timeout_s": float(timeout_s),
        "memory_bytes": int(memory_bytes),
        "max_processes": int(max_processes),
        "cpu_seconds": int(cpu_seconds if cpu_seconds is not None else math.ceil(timeout_s) + 1),
        "uid": SANDBOX_UID,
        "gid": SANDBOX_GID,
        **runtime,
    }
    status_r, status_w = os.pipe()
    config["status_fd"] = status_w
    command = [
        unshare,
        "--net", "--mount", "--propagation", "private", "--ipc", "--uts",
        "--pid", "--fork", "--kill-child", "--mount-proc",
        "--", sys.executable, "-I", "-S", "-B", os.path.abspath(__file__), json.dumps(config),
    ]  # fmt: skip
    with (
        tempfile.TemporaryFile() as source,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        source.write(program.encode("utf-8", errors="replace"))
        source.seek(0)
        try:
            proc = subprocess.Popen(
                command, stdin=source, stdout=out, stderr=err, pass_fds=(status_w,),
                start_new_session=True, cwd="/", env={"PATH": "/usr/bin:/bin"},
            )  # fmt: skip
        except OSError as exc:
            os.close(status_r)
            return _result("sandbox_error", None, started, "", f"{_SETUP_FAILED}: {exc}")
        finally:
            os.close(status_w)
        hung = not _wait_or_kill(proc, timeout_s + _BACKSTOP_GRACE_S)
        report = _read_report(status_r)
        stdout_tail, stderr_tail = _tail(out), _tail(err)
    if hung:
        return _result("timeout", None, started, stdout_tail, stderr_tail)
    if "error" in report or "exit" not in report and "signal" not in report:
        detail = report.get("error") or f"{_SETUP_FAILED}: unshare exited with {proc.returncode}"
        return _result("sandbox_error", None, started, stdout_tail, f"{stderr_tail}\n{detail}")
    return _classify(report, started, stdout_tail, stderr_tail)


def _precheck() -> str | None:
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux namespaces"
    if os.geteuid() != 0:
        return "the sandbox needs root (namespaces, mounts, dropping to an unprivileged uid)"
    return None


def _runtime() -> dict[str, str] | str:
    """The interpreter prefix to bind into the sandbox and the interpreter's path inside it.

    A string is the reason there is none.
    """
    prefix = os.path.realpath(sys.base_prefix)
    relative = os.path.relpath(os.path.realpath(sys.executable), prefix)
    if relative.startswith(".."):
        return f"{sys.executable} is not under its base prefix {prefix}"
    return {"prefix": prefix, "interpreter": relative}


def _wait_or_kill(proc: subprocess.Popen, deadline_s: float) -> bool:
    """Wait for ``unshare``; past the deadline kill it, its group and the namespace.

    Returns False when it had to kill. The leader is reaped only after ``killpg``, so the
    group id cannot have been reused by then.
    """
    pidfd = os.pidfd_open(proc.pid)
    interrupted = None
    try:
        finished = bool(select.select([pidfd], [], [], deadline_s)[0])
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
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    try:
        return json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {"error": f"{_SETUP_FAILED}: unreadable report from the supervisor"}


def _tail(handle) -> str:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - TAIL_BYTES))
    return handle.read().decode("utf-8", errors="replace")


def _classify(report: dict, started: float, stdout: str, stderr: str) -> SandboxResult:
    if report.get("timed_out"):
        return _result("timeout", None, started, stdout, stderr)
    if "signal" in report:
        limits = {signal.SIGXCPU, signal.SIGXFSZ}
        status = "resource_limit" if report["signal"] in limits else "failed"
        return _result(status, -report["signal"], started, stdout, stderr)
    code = report["exit"]
    if code == 0:
        return _result("passed", 0, started, stdout, stderr)
    # What Python makes of a refused allocation, file size or fork; a label only (the text is
    # the program's own), it can never turn a failure into a pass.
    last_line = stderr.strip().rsplit("\n", 1)[-1]
    status = "resource_limit" if last_line.startswith(_LIMIT_ERRORS) else "failed"
    return _result(status, code, started, stdout, stderr)


def _result(status, returncode, started, stdout, stderr) -> SandboxResult:
    return SandboxResult(status, returncode, time.monotonic() - started, stdout, stderr)


# ---------------------------------------------------------------------------------------
# The supervisor: runs as root, as PID 1 of the private namespaces, under `python -I -S`.
# Standard library only; it is executed as a script, not imported.

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC = 32, 4096, 16384
_MS_ATIME = {"noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21, "strictatime": 1 << 24}
_MS_KEEP = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, **_MS_ATIME}
_PR_SET_NO_NEW_PRIVS = 38
_TMPFS = (
    ("/tmp", "mode=1777,size=64m,nr_inodes=16384"),
    ("/var/tmp", "mode=1777,size=16m,nr_inodes=4096"),
    ("/dev/shm", "mode=1777,size=16m,nr_inodes=4096"),
    ("/run", "mode=755,size=1m,nr_inodes=1024"),
)


def _supervise(config: dict) -> int:
    """PID 1 of the new PID namespace: build the sandbox, run the program, report how it ended.

    This file, run as a script by root under ``unshare``. It kills the program at the wall-clock timeout and, when the program ends, everything left
    in the namespace; if the supervisor itself dies, the kernel kills every process in the
    namespace. Nothing survives the call, daemons that ``setsid`` away included.
    """
    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)

    def report(**fields) -> None:
        os.write(status_fd, json.dumps(fields).encode())

    try:
        # kill(-1) below must only ever reach this namespace.
        if os.getpid() != 1:
            raise RuntimeError("not PID 1 of a private PID namespace")
        program = sys.stdin.buffer.read()
        _isolate_filesystem(config["prefix"])
        os.mkdir(_WORK_DIR, 0o700)
        path = os.path.join(_WORK_DIR, "main.py")
        with open(path, "wb") as handle:
            handle.write(program)
        for target in (_WORK_DIR, path):
            os.chown(target, config["uid"], config["gid"])
        child = _spawn(config)
    except Exception as exc:  # noqa: BLE001 - every setup failure is reported, none is run
        report(error=f"{_SETUP_FAILED}: {type(exc).__name__}: {exc}")
        return 1

    timed_out = False

    def on_alarm(signum, frame) -> None:
        nonlocal timed_out
        timed_out = True
        _kill_namespace()

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, config["timeout_s"])
    while True:
        pid, status = os.wait()
        if pid == child:
            break
    signal.setitimer(signal.ITIMER_REAL, 0)
    _kill_namespace()
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    if os.WIFSIGNALED(status):
        report(signal=os.WTERMSIG(status), timed_out=timed_out and os.WTERMSIG(status) == 9)
    else:
        report(exit=os.waitstatus_to_exitcode(status))
    return 0


def _kill_namespace() -> None:
    try:
        os.kill(-1, signal.SIGKILL)  # from PID 1: every other process of this namespace
    except ProcessLookupError:
        pass


def _libc_call(name: str, *args) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def encode(value: str | None) -> bytes | None:
        return value.encode() if value is not None else None

    args = (encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    _libc_call("mount", *args)


def _isolate_filesystem(prefix: str) -> None:
    """Make every inherited mount read-only here, then hide the shared writable places.

    In this mount namespace only: fresh size-limited tmpfs over ``/tmp``, ``/var/tmp``,
    ``/dev/shm`` and ``/run``, and the interpreter's prefix bind-mounted read-only at
    ``/run/python`` (the pyenv interpreter lives under ``/root``, which other users cannot
    traverse).
    """
    with open("/proc/self/mountinfo") as handle:
        mounts = [line.split() for line in handle]
    for fields in mounts:
        target = fields[4].encode().decode("unicode_escape")
        flags = sum(_MS_KEEP.get(option, 0) for option in fields[5].split(","))
        try:
            _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
        except OSError:
            if target == "/":
                raise
    for target, options in _TMPFS:
        if os.path.isdir(target) and not os.path.islink(target):
            _mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
        elif target in ("/tmp", "/run"):
            raise RuntimeError(f"{target} is not a directory")
    os.mkdir(_RUNTIME_DIR, 0o755)
    _mount(prefix, _RUNTIME_DIR, None, _MS_BIND | _MS_REC)
    _mount(None, _RUNTIME_DIR, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def _spawn(config: dict) -> int:
    """Fork the program as the unprivileged uid; an exec failure is raised here, not run.

    The child: ``SANDBOX_UID``/``SANDBOX_GID`` with no supplementary groups and ``no_new_privs``
    (set-uid binaries cannot raise it back), a throwaway working directory on the private
    ``/tmp``, ``python -I -S -B``, a minimal environment, and limits on CPU time, address
    space, processes, file size and open files, with no core dumps.
    """
    interpreter = os.path.join(_RUNTIME_DIR, config["interpreter"])
    env = {"PATH": "/usr/bin:/bin", "HOME": _WORK_DIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    if any(name.startswith("libpython") for name in os.listdir(os.path.join(_RUNTIME_DIR, "lib"))):
        env["LD_LIBRARY_PATH"] = os.path.join(_RUNTIME_DIR, "lib")  # an absolute RUNPATH
    limits = [
        (resource.RLIMIT_CPU, (config["cpu_seconds"], config["cpu_seconds"] + 1)),
        (resource.RLIMIT_AS, (config["memory_bytes"],) * 2),
        (resource.RLIMIT_NPROC, (config["max_processes"],) * 2),
        (resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT,) * 2),
        (resource.RLIMIT_NOFILE, (OPEN_FILES_LIMIT,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_MEMLOCK, (0, 0)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
    ]
    error_r, error_w = os.pipe()  # close-on-exec: EOF means the exec happened
    devnull = os.open("/dev/null", os.O_RDONLY)
    child = os.fork()
    if child == 0:
        try:
            os.close(error_r)
            os.setsid()
            os.dup2(devnull, 0)
            for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGALRM):
                signal.signal(signum, signal.SIG_DFL)
            for limit, values in limits:
                resource.setrlimit(limit, values)
            os.chdir(_WORK_DIR)
            os.setgroups([])
            os.setresgid(config["gid"], config["gid"], config["gid"])
            os.setresuid(config["uid"], config["uid"], config["uid"])
            _libc_call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            os.execve(interpreter, [interpreter, "-I", "-S", "-B", "main.py"], env)
        except BaseException as exc:  # noqa: BLE001
            os.write(error_w, f"{type(exc).__name__}: {exc}".encode())
        finally:
            os._exit(127)
    os.close(error_w)
    os.close(devnull)
    with os.fdopen(error_r, "rb") as pipe:
        failure = pipe.read()
    if failure:
        os.waitpid(child, 0)
        raise RuntimeError(f"could not start the program: {failure.decode(errors='replace')}")
    return child


if __name__ == "__main__":
    sys.exit(_supervise(json.loads(sys.argv[1])))
