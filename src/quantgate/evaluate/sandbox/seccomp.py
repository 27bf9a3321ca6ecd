"""A seccomp filter, hand-assembled classic BPF, for every process of the sandbox: an allow-list.

Why an allow-list: namespaces and rlimits do not cover every kernel object, and each syscall a
filter lets through unexamined is a door (a deny-list let through ``fallocate`` past the file
size limit, System V semaphores past the memory limit, ``AF_VSOCK`` sockets past the network
namespace, the host's AIO pool, ``sync``). So the filter allows what CPython (3.11, glibc
2.36), the tests' harness and HumanEval solutions were measured to make, and refuses
everything else with ``EPERM``. The measurement (``tests/unit/evaluate/sandbox_syscalls.py``)
traces all 164 canonical solutions, failing ones and ordinary standard-library use (threads,
sleep, random, hashlib, a temporary file); ``_ALLOWED`` and ``_ARGUMENTS`` are the whole list,
each entry with why it is there. Beyond the measurement they hold only the ``*at`` forms of
the path calls (aarch64 has no others), the stat family's plain forms (glibc 2.39 calls
``fstat`` where 2.36 called ``newfstatat``), the clocks (the vDSO reads them where it can), the
kernel's ``rt_sigreturn`` and ``restart_syscall``, and the process's own ids.

Refused, among everything else: new processes, sockets of every family (the sandbox has no
network and nothing to talk to), System V IPC of every kind, AIO and io_uring, memfds,
eventfds, epoll, inotify, timerfds and signalfds, pipes, ``fallocate``, ``sync`` and
``fsync``, signals to any process (``kill``, ``tgkill``: the harness included), namespaces,
mounts, ptrace, keyrings, bpf. ``clone3`` answers ``ENOSYS`` (its flags sit in memory a
filter cannot read), so glibc falls back to ``clone``, which is allowed for a thread only.
``execve`` is allowed because the filter is installed just before the interpreter is
executed; what a program executes runs under the same filter, uid and limits, and
``no_new_privs`` keeps setuid bits from acting. The kernel passes x86_64's ``uretprobe`` and
``uprobe`` through every filter by design; outside a uprobe trampoline they kill the caller
(``SIGILL``) or answer ``ENXIO``.

Why hand-assembled: the supervisor runs under ``python -I -S`` with the standard library only
(no ``libseccomp`` binding), and the filter is short. Syscall numbers are per architecture
(``_SYSCALLS``); on any other architecture, or a foreign ABI on this one (x32, a 32-bit ``int
0x80``), the filter is not built or the process is killed, so no sandbox runs unfiltered. The
kernel keeps the filter across ``execve`` and in every thread. Standard library only: the
supervisor loads this file by path.
"""

from __future__ import annotations

import ctypes
import errno
import os

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian)
_NR, _ARCH, _ARGS = 0, 4, 16
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ, _JSET, _JGE = 0x15, 0x45, 0x35  # BPF_JMP | BPF_JEQ/JSET/JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_KILL_PROCESS, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_CLONE_THREAD = 0x00010000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Allowed whatever the arguments; what uses each. A name an architecture lacks is skipped
# (aarch64 has only the *at forms of the path calls, which glibc uses there).
_ALLOWED = (
    # the interpreter starting: exec (the filter is installed just before it), loading
    # libraries and extension modules, the heap, TLS, its own limits and machine
    "execve", "brk", "mmap", "munmap", "mprotect", "mremap", "madvise", "arch_prctl",
    "set_tid_address", "set_robust_list", "rseq", "sysinfo", "uname", "getrandom",
    "exit", "exit_group",
    # files: the interpreter's modules and the program's own tmpfs files (bounded by its sizes
    # and RLIMIT_FSIZE); every other mount is read-only
    "openat", "read", "pread64", "write", "close", "lseek", "newfstatat", "getdents64", "getcwd",
    # the stat family's plain forms: glibc 2.39 (Ubuntu 24.04, the NGC containers) calls fstat
    # itself where 2.36 called newfstatat; refused, its dynamic loader cannot stat a library and
    # the interpreter exits 127 before it starts. They read what newfstatat already reads.
    "fstat", "stat", "lstat",
    "access", "faccessat", "readlink", "readlinkat", "mkdir", "mkdirat", "rename", "renameat",
    "unlink", "rmdir", "unlinkat",
    # threads (clone is allowed for a thread only, below)
    "futex", "gettid", "getpid",
    # its own signal handlers and mask; the kernel's return from a handler and its restart of
    # an interrupted sleep (never seen in the measurement, needed when they happen)
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "restart_syscall",
    # time: sleeping, and the clocks where the vDSO cannot read them (a CPU-time clock, or a
    # machine whose clock source has no vDSO support)
    "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time",
    # its own ids (os.getuid and friends)
    "getuid", "geteuid", "getgid", "getegid", "getppid",
)  # fmt: skip

# Allowed with these values of one argument (its low 32 bits: each is an int to the kernel),
# refused otherwise: {name: (argument index, values)}.
_ARGUMENTS = {
    "prctl": (0, (4,)),  # PR_SET_DUMPABLE: the harness makes itself non-dumpable
    "prlimit64": (0, (0,)),  # pid 0, its own limits (getrlimit), never another process's
    # TCGETS (isatty, on every file the interpreter opens), FIONCLEX/FIOCLEX (inheritable flag)
    "ioctl": (1, (0x5401, 0x5450, 0x5451)),
    # F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC; not locks, leases, pipe
    # sizes, seals or owners
    "fcntl": (1, (0, 1, 2, 3, 4, 1030)),
}

# (AUDIT_ARCH, first syscall number of a foreign ABI or None, syscall numbers by name)
_SYSCALLS: dict[str, tuple[int, int | None, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        0x40000000,  # the x32 ABI's numbers start here
        {
            "execve": 59, "brk": 12, "mmap": 9, "munmap": 11, "mprotect": 10, "mremap": 25,
            "madvise": 28, "arch_prctl": 158, "set_tid_address": 218, "set_robust_list": 273,
            "rseq": 334, "sysinfo": 99, "uname": 63, "getrandom": 318, "exit": 60,
            "exit_group": 231, "openat": 257, "read": 0, "pread64": 17, "write": 1, "close": 3,
            "lseek": 8, "newfstatat": 262, "fstat": 5, "stat": 4, "lstat": 6, "getdents64": 217,
            "getcwd": 79, "access": 21,
            "faccessat": 269, "readlink": 89, "readlinkat": 267, "mkdir": 83, "mkdirat": 258,
            "rename": 82, "renameat": 264, "unlink": 87, "rmdir": 84, "unlinkat": 263,
            "futex": 202, "gettid": 186, "getpid": 39, "rt_sigaction": 13, "rt_sigprocmask": 14,
            "rt_sigreturn": 15, "restart_syscall": 219, "clock_nanosleep": 230,
            "clock_gettime": 228, "clock_getres": 229, "gettimeofday": 96, "time": 201,
            "getuid": 102, "geteuid": 107, "getgid": 104, "getegid": 108, "getppid": 110,
            "prctl": 157, "prlimit64": 302, "ioctl": 16, "fcntl": 72, "clone": 56, "clone3": 435,
        },
    ),
    "aarch64": (  # asm-generic numbers
        0xC00000B7,
        None,
        {
            "execve": 221, "brk": 214, "mmap": 222, "munmap": 215, "mprotect": 226, "mremap": 216,
            "madvise": 233, "set_tid_address": 96, "set_robust_list": 99, "rseq": 293,
            "sysinfo": 179, "uname": 160, "getrandom": 278, "exit": 93, "exit_group": 94,
            "openat": 56, "read": 63, "pread64": 67, "write": 64, "close": 57, "lseek": 62,
            "newfstatat": 79, "fstat": 80, "getdents64": 61, "getcwd": 17, "faccessat": 48, "readlinkat": 78,
            "mkdirat": 34, "renameat": 38, "unlinkat": 35, "futex": 98, "gettid": 178,
            "getpid": 172, "rt_sigaction": 134, "rt_sigprocmask": 135, "rt_sigreturn": 139,
            "restart_syscall": 128, "clock_nanosleep": 115, "clock_gettime": 113,
            "clock_getres": 114, "gettimeofday": 169, "getuid": 174, "geteuid": 175,
            "getgid": 176, "getegid": 177, "getppid": 173, "prctl": 167, "prlimit64": 261,
            "ioctl": 29, "fcntl": 25, "clone": 220, "clone3": 435,
        },
    ),
}  # fmt: skip


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _errno(code: int) -> int:
    return _ERRNO | code


_REFUSED = _errno(errno.EPERM)


def allowed(machine: str) -> dict[str, int]:
    """Every syscall the filter for ``machine`` can let through, by name: number (some only
    with the arguments of ``_ARGUMENTS``, ``clone`` for a thread only). ValueError for an
    unknown machine."""
    if machine not in _SYSCALLS:
        raise ValueError(f"no seccomp filter for {machine}: the sandbox knows x86_64 and aarch64")
    numbers = _SYSCALLS[machine][2]
    return {name: numbers[name] for name in (*_ALLOWED, *_ARGUMENTS, "clone") if name in numbers}


def _one_of(number: int, argument: int, values: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """Syscall ``number`` allowed when argument ``argument`` (low word) is one of ``values``."""
    count = len(values)
    code = [(_JEQ, 0, count + 3, number), (_LD_W_ABS, 0, 0, _ARGS + 8 * argument)]
    code += [(_JEQ, count - index, 0, value) for index, value in enumerate(values)]
    return code + [(_RET, 0, 0, _REFUSED), (_RET, 0, 0, _ALLOW)]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine`` (``os.uname().machine``) as (code, jt, jf, k) instructions.

    In order: a foreign architecture or ABI is killed; ``_ALLOWED`` is allowed; ``clone3``
    answers ``ENOSYS``; ``clone`` is allowed for a thread (``CLONE_THREAD``) without a
    namespace flag (``fork`` in glibc is a ``clone`` without ``CLONE_THREAD``); ``_ARGUMENTS``
    are checked; everything else is refused with ``EPERM``. ValueError for an unknown machine.
    """
    numbers = allowed(machine)
    arch, foreign, table = _SYSCALLS[machine]
    code = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if foreign is not None:
        code += [(_JGE, 0, 1, foreign), (_RET, 0, 0, _KILL_PROCESS)]
    for name in _ALLOWED:
        if name in numbers:
            code += [(_JEQ, 0, 1, numbers[name]), (_RET, 0, 0, _ALLOW)]
    code += [(_JEQ, 0, 1, table["clone3"]), (_RET, 0, 0, _errno(errno.ENOSYS))]
    # clone: flags (arg 0, low word): a namespace flag refused, a thread allowed, else refused
    code += [
        (_JEQ, 0, 5, numbers["clone"]),
        (_LD_W_ABS, 0, 0, _ARGS),
        (_JSET, 2, 0, _CLONE_NAMESPACES),
        (_JSET, 0, 1, _CLONE_THREAD),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _REFUSED),
    ]
    for name, (argument, values) in _ARGUMENTS.items():
        code += _one_of(numbers[name], argument, values)
    return code + [(_RET, 0, 0, _REFUSED)]


def install() -> None:
    """Install the filter on the calling thread (and, through ``execve``, what it runs).

    Sets ``no_new_privs`` first, as the kernel requires of a process without CAP_SYS_ADMIN.
    OSError if the kernel refuses; the caller must then run nothing.
    """
    code = program(os.uname().machine)
    filters = (_SockFilter * len(code))(*[_SockFilter(*instruction) for instruction in code])
    fprog = _SockFprog(len(code), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    for args in (
        (_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0),
    ):
        if libc.prctl(*[ctypes.c_ulong(arg) for arg in args]) != 0:
            code_ = ctypes.get_errno()
            raise OSError(code_, f"prctl{args[:2]}: {os.strerror(code_)}")
