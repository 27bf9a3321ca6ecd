"""The sandbox's supervisor: PID 1 of its private namespaces; it builds the sandbox and runs in it.

Run by ``quantgate.evaluate.sandbox`` under ``unshare`` as ``python -I -S -B supervisor.py
CONFIG`` (JSON), as root (root mode) or as root of a user namespace that maps only the caller
(userns mode), with ``{"program": ..., "tests": ...}`` on stdin (never in argv, which every
process can read in ``/proc``). Its report, one JSON object, goes to ``status_fd``. Standard
library only, executed as a script; ``seccomp.py`` and ``calls.py`` are read from beside it
before the pivot, ``calls.py`` to be passed to the interpreter as ``-c`` source.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import json
import os
import resource
import select
import signal
import sys
import time

# sizes in SI bytes, as everywhere in quantgate (quantgate.runtime.units), written out: only the
# standard library imports here
MB = 10**6
FILE_SIZE_LIMIT = 16 * MB
OPEN_FILES_LIMIT = 64
SETUP_FAILED = "sandbox setup failed"
RUNTIME_DIR = "/run/python"
WORK_DIR = "/tmp/work"
_HERE = os.path.dirname(os.path.abspath(__file__))

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC = 32, 4096, 16384
_MS_ATIME = {"noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21, "strictatime": 1 << 24}
# flags a user namespace may not clear on a mount it inherited: a remount must restate them
_MS_KEEP = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "nosymfollow": 256, **_MS_ATIME}
_MNT_DETACH = 2
_CLONE_NEWUSER = 0x10000000
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


def _load(name: str):
    """A module of this directory, by path (``-I`` keeps this directory off ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(
        f"_quantgate_sandbox_{name}", os.path.join(_HERE, f"{name}.py")
    )
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {name}.py from {_HERE}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _supervise(config: dict) -> int:
    """PID 1 of the new PID namespace: build the sandbox, run the program, report how it ended.

    Plain runs (no tests): the program is ``main.py``, and the run ends when it ends. Checked
    runs: the harness (``calls.harness``, the tests) is started first and the program
    (``calls.program``) once the harness is non-dumpable; the run ends when the harness ends,
    and the report carries the harness's own account (``check``), read from a pipe only the
    harness holds.

    It kills everything at the wall-clock timeout and, when the run ends, everything left in
    the namespace; if the supervisor itself dies, the kernel kills every process in the
    namespace. Nothing survives the call, daemons that ``setsid`` away included. The program
    can send it no signal (seccomp), and were one sent anyway (userns mode: one host uid), as
    PID 1 it receives only signals it handles, and it handles none (``SIGCHLD`` is waited for,
    blocked), so nothing changes how the run is judged.
    """
    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    deadline = time.monotonic() + config["timeout_s"]

    def report(**fields) -> None:
        os.write(status_fd, json.dumps(fields).encode())

    try:
        # kill(-1) below must only ever reach this namespace.
        if os.getpid() != 1:
            raise RuntimeError("not PID 1 of a private PID namespace")
        request = json.loads(sys.stdin.buffer.read())
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)  # let go of the request, a host file, before anything runs
        os.close(devnull)
        seccomp = _load("seccomp")
        seccomp.program(os.uname().machine)  # no filter for this machine: no sandbox
        with open(os.path.join(_HERE, "calls.py")) as calls_file:
            calls_source = calls_file.read()
        # userns mode: the child writes its user namespace's id maps through this /proc, which
        # stays writable after the sandbox's own /proc is made read-only (close-on-exec)
        proc_fd = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY) if config["mode"] == "userns" else None
        _build_root(config["prefix"])
        os.mkdir(WORK_DIR, 0o700)
        path = os.path.join(WORK_DIR, "main.py")
        with open(path, "wb") as handle:
            handle.write(request["program"].encode("utf-8", errors="replace"))
        if config["mode"] == "root":  # userns: the supervisor's uid is the program's already
            for target in (WORK_DIR, path):
                os.chown(target, config["uid"], config["gid"])
        spawn = _Spawner(config, proc_fd, seccomp.install)
        if request.get("tests") is None:
            main = spawn(["main.py"], config["uid"], config["gid"], WORK_DIR, {})
            check_r = None
        else:
            main, check_r = _start_check(spawn, config, calls_source, request["tests"], deadline)
    except Exception as exc:  # noqa: BLE001 - every setup failure is reported, none is run
        report(error=f"{SETUP_FAILED}: {type(exc).__name__}: {exc}")
        return 1

    timed_out, statuses = False, {}
    while main not in statuses:
        while True:  # reap whatever has ended: the program, the harness, orphans
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            statuses[pid] = wait_status
        if main in statuses:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            _kill_namespace()
            _, statuses[main] = os.waitpid(main, 0)
            break
        signal.sigtimedwait({signal.SIGCHLD}, min(left, 1.0))
    _kill_namespace()
    while True:
        try:
            pid, wait_status = os.wait()
            statuses.setdefault(pid, wait_status)
        except ChildProcessError:
            break
    status = statuses[main]
    fields: dict = {}
    if check_r is not None:
        fields["check"] = _read_check(check_r)
        if spawn.program in statuses:
            fields["program"] = _ending(statuses[spawn.program])
    if os.WIFSIGNALED(status):
        report(signal=os.WTERMSIG(status), timed_out=timed_out and os.WTERMSIG(status) == 9, **fields)
    else:
        report(exit=os.waitstatus_to_exitcode(status), **fields)
    return 0


def _why_not_started(pid: int, wait_s: float = 1.0) -> str:
    """How a process that never reported ready ended, for the setup error: on a machine where no
    sandbox can be built (a container's Python, another seccomp architecture), the bare "did not
    start" said nothing an operator could act on."""
    deadline = time.monotonic() + wait_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if not os.WIFSIGNALED(status):
                return f"its interpreter exited with {os.waitstatus_to_exitcode(status)}"
            number = os.WTERMSIG(status)
            why = ": a system call the seccomp filter refuses" if number == signal.SIGSYS else ""
            return f"its interpreter was killed by {signal.Signals(number).name}{why}"
        if time.monotonic() >= deadline:
            return "it was still running, silent, at the deadline"
        time.sleep(0.02)


def _ending(status: int) -> dict:
    return (
        {"signal": os.WTERMSIG(status)}
        if os.WIFSIGNALED(status)
        else {"exit": os.waitstatus_to_exitcode(status)}
    )


def _start_check(spawn, config: dict, calls_source: str, tests: str, deadline: float) -> tuple[int, int]:
    """Start the harness, wait until it is non-dumpable, then the program; (harness pid, its status pipe).

    The pipes: calls (harness to program), answers (program to harness), the harness's stdin
    (the tests, written here and closed) and its status pipe (read by the supervisor only).
    """
    calls_r, calls_w = os.pipe()
    answers_r, answers_w = os.pipe()
    tests_r, tests_w = os.pipe()
    check_r, check_w = os.pipe()
    # the harness's stderr, read only if it never starts: the dynamic loader's or the
    # interpreter's own last words ("error while loading shared libraries: ...") name the cause
    errors_r, errors_w = os.pipe()
    harness_argv = ["-c", calls_source, "harness", "3", "4", "5"]
    harness = spawn(
        harness_argv, config["harness_uid"], config["harness_gid"], "/",
        {0: tests_r, 2: errors_w, 3: check_w, 4: calls_w, 5: answers_r},
    )  # fmt: skip
    for fd in (tests_r, check_w, errors_w):
        os.close(fd)
    try:
        with os.fdopen(tests_w, "wb") as pipe:
            pipe.write(json.dumps({"tests": tests, "entry_point": config["entry_point"]}).encode())
    except BrokenPipeError:  # it ended before reading its tests
        ready = False
    else:
        ready = bool(
            select.select([check_r], [], [], max(0.0, deadline - time.monotonic()))[0]
            and os.read(check_r, 1) == b"R"
        )
    if not ready:
        how = _why_not_started(harness)
        said = drain(errors_r).decode(errors="replace").strip().splitlines()
        if said:
            how += f": {said[-1][-300:]}"
        raise RuntimeError(f"the tests' harness did not start ({how})")
    os.close(errors_r)  # a started harness writing to stderr gets EPIPE, which Python ignores
    program_argv = ["-c", calls_source, "program", config["entry_point"], "3", "4"]
    spawn.program = spawn(program_argv, config["uid"], config["gid"], WORK_DIR, {3: calls_r, 4: answers_w})
    for fd in (calls_r, calls_w, answers_r, answers_w):
        os.close(fd)
    return harness, check_r


def drain(fd: int) -> bytes:
    """What a pipe holds now, without waiting for more; closes ``fd`` (its writer has ended)."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_check(fd: int) -> dict | None:
    """The harness's account (after it ended): ``{"passed": bool, "error"?: str}``, or None."""
    try:
        answer = json.loads(drain(fd))
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


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
    os.mkdir(f"{root}{RUNTIME_DIR}", 0o755)
    _mount(prefix, f"{root}{RUNTIME_DIR}", None, _MS_BIND | _MS_REC)
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


def _enter_user_namespace(uid: int, gid: int, proc_fd: int) -> None:
    """userns mode: become ``uid`` in a nested user namespace of its own, with no capabilities.

    Its only id is the supervisor's (root of the outer namespace, the caller's uid on the host),
    mapped to ``uid``. The harness and the program each get one: siblings, neither has any
    capability over the other. The capabilities a new namespace grants its creator are dropped
    from the bounding set here and lost at ``execve`` (a non-zero uid, no file capabilities,
    ``no_new_privs``). The outer namespace, which owns every other namespace of the sandbox,
    grants the program nothing.
    """
    _libc_call("unshare", _CLONE_NEWUSER)
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} 0 1"),
        ("gid_map", f"{gid} 0 1"),
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


class _Spawner:
    """Forks processes of the sandbox; an exec failure is raised here, not run.

    Each child: its uid and gid (root mode: with no supplementary groups; userns mode: in a
    user namespace of its own, ``_enter_user_namespace``), a new session, stdin ``/dev/null``
    unless given, the descriptors given at the numbers given and no others, ``python -I -S
    -B``, a minimal environment, limits on CPU time, address space, processes (and threads),
    file size and open files, no core dumps, and, last before ``execve``, ``no_new_privs`` and
    the seccomp filter (``seccomp.py``).
    """

    def __init__(self, config: dict, proc_fd: int | None, install_filter) -> None:
        self.config, self.proc_fd, self.install_filter = config, proc_fd, install_filter
        self.program: int | None = None
        self.interpreter = os.path.join(RUNTIME_DIR, config["interpreter"])
        self.env = {"PATH": "/usr/bin:/bin", "HOME": WORK_DIR, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        if any(name.startswith("libpython") for name in os.listdir(os.path.join(RUNTIME_DIR, "lib"))):
            self.env["LD_LIBRARY_PATH"] = os.path.join(RUNTIME_DIR, "lib")  # an absolute RUNPATH
        self.limits = [
            (resource.RLIMIT_CPU, config["cpu_seconds"], config["cpu_seconds"] + 1),
            (resource.RLIMIT_AS, config["memory_bytes"], config["memory_bytes"]),
            (resource.RLIMIT_NPROC, config["max_processes"], config["max_processes"]),
            (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT, FILE_SIZE_LIMIT),
            (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
            (resource.RLIMIT_CORE, 0, 0),
            (resource.RLIMIT_MEMLOCK, 0, 0),
            (resource.RLIMIT_MSGQUEUE, 0, 0),
        ]

    def __call__(self, args: list[str], uid: int, gid: int, cwd: str, fds: dict[int, int]) -> int:
        """Start ``python -I -S -B *args`` as ``uid``/``gid`` in ``cwd`` with ``fds`` ({number: fd})."""
        error_r, error_w = os.pipe()  # close-on-exec: EOF means the exec happened
        devnull = os.open("/dev/null", os.O_RDONLY)
        fds = {0: devnull, **fds}
        child = os.fork()
        if child == 0:
            try:
                os.close(error_r)
                os.setsid()
                # every descriptor still needed above the target numbers first, so that no dup2
                # overwrites one (the /proc descriptor, the error pipe, a source)
                error_w = fcntl.fcntl(error_w, fcntl.F_DUPFD_CLOEXEC, 100)
                proc_fd = (
                    None if self.proc_fd is None else fcntl.fcntl(self.proc_fd, fcntl.F_DUPFD_CLOEXEC, 100)
                )
                moved = {target: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for target, fd in fds.items()}
                for target, fd in moved.items():
                    os.dup2(fd, target)  # inheritable; everything else is close-on-exec
                for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                    signal.signal(signum, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, set())
                os.chdir(cwd)
                if proc_fd is not None:
                    _enter_user_namespace(uid, gid, proc_fd)
                else:
                    os.setgroups([])
                for limit, soft, hard in self.limits:
                    _lower_limit(limit, soft, hard)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                self.install_filter()
                os.execve(self.interpreter, [self.interpreter, "-I", "-S", "-B", *args], self.env)
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
            raise RuntimeError(f"could not start {args[0]}: {failure.decode(errors='replace')}")
        return child


if __name__ == "__main__":
    sys.exit(_supervise(json.loads(sys.argv[1])))
