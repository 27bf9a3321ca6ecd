"""Run untrusted Python (model-written HumanEval completions) inside an OS-enforced sandbox.

Why the kernel and not Python: a completion is arbitrary code, so every limit (namespaces, a
minimal read-only root, an unprivileged uid, resource limits, a wall-clock kill) is set by the
kernel, and a sandbox that cannot be set up runs nothing: there is no unsandboxed fallback, and
the caller records the item as not evaluated (``SandboxResult.error``), never as failed.

Two ways in, the same sandbox inside (``QUANTGATE_SANDBOX``, see ``mode``):

- ``root``: run by root (CI). ``unshare`` makes the namespaces; the program runs as uid
  ``SANDBOX_UID`` (nobody).
- ``userns``: run by anyone else, where the kernel allows unprivileged user namespaces (a
  developer's workstation). ``unshare --user --map-root-user`` gives the supervisor root inside
  a user namespace that maps only the caller's uid; the program runs as ``SANDBOX_UID`` in a
  second, nested user namespace, without capabilities. On the host it is still the caller's
  uid, which is why the root it sees is minimal in both modes: system directories and the
  interpreter, read-only, and nothing of the caller's (home, repository, datasets).

What stays possible inside: reading world-readable files of ``/usr``, ``/etc`` and the
interpreter, and using CPU and memory up to the limits. In userns mode the program also keeps
the caller's supplementary groups (the kernel lets no unprivileged process drop them), so files
there that one of those groups may read are readable to it too. Each layer is described where
it is built: ``run_untrusted``, ``_supervise``, ``_build_root``, ``_spawn``.
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
SandboxMode = Literal["root", "userns"]

ENV = "QUANTGATE_SANDBOX"  # auto (default): root mode as root, else user namespaces; none: never build one
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
        """Exit code 0 within the time limit."""
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
    """Why no sandbox can be built here (after trying one), or None when programs can run.

    Callers check once before generating code, so that a machine without a sandbox records its
    code items as not evaluated without spending the generation on them.
    """
    result = run_untrusted("import sys\nsys.exit(0)\n", timeout_s=10.0)
    if result.status == "sandbox_error":
        return (result.error or "the sandbox broke down").removeprefix(f"{_SETUP_FAILED}: ")
    if not result.passed:
        tail = result.stderr_tail.strip().splitlines()[-1:] or [result.status]
        return f"a program that only exits 0 did not pass in the sandbox ({result.status}: {tail[0]})"
    return None


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
    rounded up, plus one). In root mode ``RLIMIT_NPROC`` counts every process of
    ``SANDBOX_UID`` on the host, so concurrent sandboxes share that budget; in userns mode it
    counts the processes of this run's own user namespace. Returns ``sandbox_error`` (with
    ``error``) without running anything when the sandbox cannot be built (``mode`` gives no
    way, no ``unshare``, a namespace or mount refused); the program is never run outside it.

    ``unshare`` (util-linux) gives the run private network, mount, PID, IPC and UTS namespaces
    (and a user namespace in userns mode); the network namespace has only a loopback that is
    down, so no socket reaches the host or the internet, loopback and abstract Unix sockets
    included.
    """
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
        **runtime,
    }
    status_r, status_w = os.pipe()
    config["status_fd"] = status_w
    user = ["--user", "--map-root-user"] if how == "userns" else []
    command = [
        unshare, *user,
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
            return _setup_error(started, str(exc))
        finally:
            os.close(status_w)
        hung = not _wait_or_kill(proc, timeout_s + _BACKSTOP_GRACE_S)
        report = _read_report(status_r)
        stdout_tail, stderr_tail = _tail(out), _tail(err)
    if hung:
        return _result("timeout", None, started, stdout_tail, stderr_tail)
    if "error" in report or "exit" not in report and "signal" not in report:
        detail = report.get("error") or _unshare_failed(how, proc.returncode, stderr_tail)
        return _result("sandbox_error", None, started, stdout_tail, f"{stderr_tail}\n{detail}", detail)
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
    detail = f"{_SETUP_FAILED}: unshare: {said}"
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


def _result(status, returncode, started, stdout, stderr, error=None) -> SandboxResult:
    return SandboxResult(status, returncode, time.monotonic() - started, stdout, stderr, error)


def _setup_error(started: float, problem: str) -> SandboxResult:
    detail = f"{_SETUP_FAILED}: {problem}"
    return _result("sandbox_error", None, started, "", detail, detail)


# ---------------------------------------------------------------------------------------
# The supervisor: PID 1 of the private namespaces, under `python -I -S`, as root (root mode)
# or as root of a user namespace that maps only the caller (userns mode). Standard library
# only; it is executed as a script, not imported.

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC = 32, 4096, 16384
_MS_ATIME = {"noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21, "strictatime": 1 << 24}
# flags a user namespace may not clear on a mount it inherited: a remount must restate them
_MS_KEEP = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "nosymfollow": 256, **_MS_ATIME}
_MNT_DETACH = 2
_CLONE_NEWUSER = 0x10000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
# The new root is assembled on a tmpfs mounted over /tmp (private to this mount namespace).
_STAGE = "/tmp"
# Host directories the program may see, read-only: the system's programs, libraries and config.
_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_TMPFS = (
    ("/tmp", "mode=1777,size=64m,nr_inodes=16384"),
    ("/var/tmp", "mode=1777,size=16m,nr_inodes=4096"),
    ("/dev/shm", "mode=1777,size=16m,nr_inodes=4096"),
    ("/run", "mode=755,size=1m,nr_inodes=1024"),
)
_WRITABLE = frozenset(target for target, _ in _TMPFS)


def _supervise(config: dict) -> int:
    """PID 1 of the new PID namespace: build the sandbox, run the program, report how it ended.

    It kills the program at the wall-clock timeout and, when the program ends, everything left
    in the namespace; if the supervisor itself dies, the kernel kills every process in the
    namespace. Nothing survives the call, daemons that ``setsid`` away included. In userns
    mode the program may signal it (one host uid): as PID 1 it receives only signals it
    handles, and it handles none (``SIGCHLD`` is waited for, blocked), so nothing the program
    sends changes how the run is judged.
    """
    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})

    def report(**fields) -> None:
        os.write(status_fd, json.dumps(fields).encode())

    try:
        # kill(-1) below must only ever reach this namespace.
        if os.getpid() != 1:
            raise RuntimeError("not PID 1 of a private PID namespace")
        program = sys.stdin.buffer.read()
        # userns mode: the child writes its user namespace's id maps through this /proc, which
        # stays writable after the sandbox's own /proc is made read-only (close-on-exec)
        proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY) if config["mode"] == "userns" else None
        _build_root(config["prefix"])
        os.mkdir(_WORK_DIR, 0o700)
        path = os.path.join(_WORK_DIR, "main.py")
        with open(path, "wb") as handle:
            handle.write(program)
        if config["mode"] == "root":  # userns: the supervisor's uid is the program's already
            for target in (_WORK_DIR, path):
                os.chown(target, config["uid"], config["gid"])
        child = _spawn(config, proc_fd)
    except Exception as exc:  # noqa: BLE001 - every setup failure is reported, none is run
        report(error=f"{_SETUP_FAILED}: {type(exc).__name__}: {exc}")
        return 1

    deadline = time.monotonic() + config["timeout_s"]
    timed_out, status = False, None
    while status is None:
        while True:  # reap whatever has ended: the program, or orphans reparented to PID 1
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == child:
                status = wait_status
        if status is not None:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            _kill_namespace()
            _, status = os.waitpid(child, 0)
            break
        signal.sigtimedwait({signal.SIGCHLD}, min(left, 1.0))
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


def _libc_call(name: str, *args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = getattr(libc, name)(*args)
    if result == -1 or (name != "syscall" and result != 0):
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args}: {os.strerror(errno)}")
    return result


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def encode(value: str | None) -> bytes | None:
        return value.encode() if value is not None else None

    args = (encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    _libc_call("mount", *args)


def _mounts() -> list[tuple[int, str, list[str]]]:
    """This namespace's mounts: (mount id, mount point, per-mount options)."""
    with open("/proc/self/mountinfo") as handle:
        rows = [line.split() for line in handle]
    return [(int(f[0]), f[4].encode().decode("unicode_escape"), f[5].split(",")) for f in rows]


def _read_only(target: str, options: list[str]) -> None:
    flags = sum(_MS_KEEP.get(option, 0) for option in options)
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)


def _build_root(prefix: str) -> None:
    """Pivot into a new root that holds only what a Python program needs, all read-only but tmpfs.

    The root is a tmpfs with, bind-mounted read-only: ``_SYSTEM_DIRS`` (symlinks such as
    ``/lib -> usr/lib`` are recreated), the interpreter's prefix at ``/run/python`` (the pyenv
    interpreter lives under ``/root``, which other users cannot traverse), this PID namespace's
    ``/proc`` and the harmless devices of ``/dev``; writable: fresh size-limited tmpfs at
    ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run``. Everything else of the host (homes, the
    repository, datasets, sockets under ``/run`` or ``/var``, ``/sys``) is absent. A check after
    the pivot refuses the sandbox if any other mount is writable.
    """
    before = {mount_id for mount_id, _, _ in _mounts()}
    root = _STAGE
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=755,size=1m,nr_inodes=1024")
    for name in _SYSTEM_DIRS:
        host = f"/{name}"
        if os.path.islink(host):
            os.symlink(os.readlink(host), root + host)
        elif os.path.isdir(host):
            os.mkdir(root + host, 0o755)
            _mount(host, root + host, None, _MS_BIND | _MS_REC)
    os.mkdir(f"{root}/dev", 0o755)
    _mount("tmpfs", f"{root}/dev", "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=755,size=64k,nr_inodes=64")
    for device in _DEVICES:
        open(f"{root}/dev/{device}", "w").close()
        _mount(f"/dev/{device}", f"{root}/dev/{device}", None, _MS_BIND)
    for link, target in (("fd", ""), ("stdin", "/0"), ("stdout", "/1"), ("stderr", "/2")):
        os.symlink(f"/proc/self/fd{target}", f"{root}/dev/{link}")
    os.mkdir(f"{root}/proc", 0o555)
    _mount("/proc", f"{root}/proc", None, _MS_BIND | _MS_REC)
    for target, size in _TMPFS:
        os.makedirs(root + target, 0o755, exist_ok=True)
        _mount("tmpfs", root + target, "tmpfs", _MS_NOSUID | _MS_NODEV, size)
    os.mkdir(f"{root}{_RUNTIME_DIR}", 0o755)
    _mount(prefix, f"{root}{_RUNTIME_DIR}", None, _MS_BIND | _MS_REC)
    for mount_id, target, options in _mounts():
        if mount_id not in before and target[len(root) :] not in _WRITABLE:
            _read_only(target, options)
    os.chdir(root)
    if hasattr(ctypes.CDLL(None), "pivot_root"):
        _libc_call("pivot_root", b".", b".")
    elif os.uname().machine in _PIVOT_ROOT:
        _libc_call("syscall", _PIVOT_ROOT[os.uname().machine], b".", b".")
    else:
        raise RuntimeError(f"no pivot_root for {os.uname().machine}")
    _libc_call("umount2", b".", _MNT_DETACH)  # the old root, stacked on the new one by the pivot
    os.chdir("/")
    writable = [target for _, target, options in _mounts() if "rw" in options and target not in _WRITABLE]
    if writable:
        raise RuntimeError(f"mounts left writable in the sandbox: {writable}")


def _lower_limit(limit: int, soft: int, hard: int) -> None:
    """Set a limit no higher than the one in force (a user namespace may not raise it)."""
    _, current = resource.getrlimit(limit)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(limit, (soft, hard))


def _enter_user_namespace(config: dict, proc_fd: int) -> None:
    """userns mode: become ``SANDBOX_UID`` in a nested user namespace with no capabilities.

    Its only id is the supervisor's (root of the outer namespace, the caller's uid on the host),
    mapped to ``SANDBOX_UID``. The capabilities a new namespace grants its creator are dropped
    from the bounding set here and lost at ``execve`` (a non-zero uid, no file capabilities,
    ``no_new_privs``). The outer namespace, which owns every other namespace of the sandbox,
    grants the program nothing.
    """
    _libc_call("unshare", _CLONE_NEWUSER)
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{config['uid']} 0 1"),
        ("gid_map", f"{config['gid']} 0 1"),
    ):
        fd = os.open(f"self/{name}", os.O_WRONLY, dir_fd=proc_fd)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    fd = os.open("sys/kernel/cap_last_cap", os.O_RDONLY, dir_fd=proc_fd)
    try:
        last_cap = int(os.read(fd, 16))
    finally:
        os.close(fd)
    for cap in range(last_cap + 1):
        _libc_call("prctl", _PR_CAPBSET_DROP, cap, 0, 0, 0)


def _spawn(config: dict, proc_fd: int | None) -> int:
    """Fork the program as the unprivileged uid; an exec failure is raised here, not run.

    The child: ``SANDBOX_UID``/``SANDBOX_GID`` (root mode: with no supplementary groups; userns
    mode: in its own user namespace, ``_enter_user_namespace``) and ``no_new_privs`` (set-uid
    binaries cannot raise it back), a throwaway working directory on the private ``/tmp``,
    ``python -I -S -B``, a minimal environment, and limits on CPU time, address space,
    processes, file size and open files, with no core dumps.
    """
    interpreter = os.path.join(_RUNTIME_DIR, config["interpreter"])
    env = {"PATH": "/usr/bin:/bin", "HOME": _WORK_DIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    if any(name.startswith("libpython") for name in os.listdir(os.path.join(_RUNTIME_DIR, "lib"))):
        env["LD_LIBRARY_PATH"] = os.path.join(_RUNTIME_DIR, "lib")  # an absolute RUNPATH
    limits = [
        (resource.RLIMIT_CPU, config["cpu_seconds"], config["cpu_seconds"] + 1),
        (resource.RLIMIT_AS, config["memory_bytes"], config["memory_bytes"]),
        (resource.RLIMIT_NPROC, config["max_processes"], config["max_processes"]),
        (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT, FILE_SIZE_LIMIT),
        (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_MEMLOCK, 0, 0),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
    ]
    error_r, error_w = os.pipe()  # close-on-exec: EOF means the exec happened
    devnull = os.open("/dev/null", os.O_RDONLY)
    child = os.fork()
    if child == 0:
        try:
            os.close(error_r)
            os.setsid()
            os.dup2(devnull, 0)
            for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            os.chdir(_WORK_DIR)
            if proc_fd is not None:
                _enter_user_namespace(config, proc_fd)
            else:
                os.setgroups([])
            for limit, soft, hard in limits:
                _lower_limit(limit, soft, hard)
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
