"""A seccomp filter, hand-assembled classic BPF, for every process of the sandbox.

Why seccomp on top of namespaces and limits: some kernel objects escape those. Memory in a
memfd or a System V segment is not counted by ``RLIMIT_AS`` once unmapped (a program held
640 MB under a 512 MB limit), each new process gets its own ``RLIMIT_AS`` (16 processes, 16
times the limit), a Unix socket file is reachable through any mount that shows it (network
namespaces do not cover the filesystem), and a new user namespace hands the program every
capability inside it, opening the kernel's namespaced attack surface. A HumanEval program needs
none of these, so the filter refuses them (``EPERM``), and the kernel keeps the filter across
``execve`` and in every thread.

Why hand-assembled: the supervisor runs under ``python -I -S`` with the standard library only
(no ``libseccomp`` binding), and the filter is short. It is a deny list: what it refuses is
listed in ``_DENIED`` and ``_rules``; everything else is allowed, limited by the rest of the
sandbox. Syscall numbers are per architecture (``_SYSCALLS``); on any other architecture, or
a foreign ABI on this one (x32, a 32-bit ``int 0x80``), the filter is not built or the process
is killed, so no sandbox runs unfiltered. Standard library only: the supervisor loads this file
by path.
"""

from __future__ import annotations

import ctypes
import errno
import os

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian)
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ, _JSET, _JGE = 0x15, 0x45, 0x35  # BPF_JMP | BPF_JEQ/JSET/JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_KILL_PROCESS, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_AF_UNIX = 1
_CLONE_THREAD = 0x00010000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# (AUDIT_ARCH, first syscall number of a foreign ABI or None, syscall numbers by name)
_SYSCALLS: dict[str, tuple[int, int | None, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        0x40000000,  # the x32 ABI's numbers start here
        {
            "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
            "memfd_create": 319, "memfd_secret": 447, "shmget": 29, "msgget": 68,
            "socket": 41, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
            "pidfd_getfd": 438, "io_uring_setup": 425, "userfaultfd": 323, "bpf": 321,
            "perf_event_open": 298, "add_key": 248, "request_key": 249, "keyctl": 250,
            "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428,
            "move_mount": 429, "fsopen": 430, "fsmount": 432, "init_module": 175,
            "finit_module": 313,
        },
    ),
    "aarch64": (  # asm-generic numbers: no fork or vfork syscall
        0xC00000B7,
        None,
        {
            "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "memfd_create": 279,
            "memfd_secret": 447, "shmget": 194, "msgget": 186, "socket": 198, "ptrace": 117,
            "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
            "io_uring_setup": 425, "userfaultfd": 282, "bpf": 280, "perf_event_open": 241,
            "add_key": 217, "request_key": 218, "keyctl": 219, "mount": 40, "umount2": 39,
            "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430,
            "fsmount": 432, "init_module": 105, "finit_module": 273,
        },
    ),
}  # fmt: skip

# Refused outright, whatever the arguments (names absent on an architecture are skipped):
_DENIED = (
    "fork", "vfork",  # a second process: each would get its own RLIMIT_AS
    "unshare", "setns",  # a nested user namespace, or joining another namespace
    "memfd_create", "memfd_secret", "shmget", "msgget",  # memory outside RLIMIT_AS
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",  # another process's memory or files
    "io_uring_setup",  # its operations are not seen by seccomp
    "userfaultfd", "bpf", "perf_event_open", "add_key", "request_key", "keyctl",  # kernel attack surface
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsmount",
    "init_module", "finit_module",
)  # fmt: skip


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


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for ``machine`` (``os.uname().machine``) as (code, jt, jf, k) instructions.

    Rules beyond ``_DENIED``: ``clone`` only for a thread (``CLONE_THREAD``) and never with a
    namespace flag (``fork`` in glibc is a ``clone`` without ``CLONE_THREAD``); ``clone3``
    answers ``ENOSYS`` (its flags sit in memory a filter cannot read), so glibc falls back to
    ``clone`` for threads; ``socket`` refuses ``AF_UNIX``. ValueError for an unknown machine.
    """
    if machine not in _SYSCALLS:
        raise ValueError(f"no seccomp filter for {machine}: the sandbox knows x86_64 and aarch64")
    arch, foreign, numbers = _SYSCALLS[machine]
    code = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if foreign is not None:
        code += [(_JGE, 0, 1, foreign), (_RET, 0, 0, _KILL_PROCESS)]
    for name in _DENIED:
        if name in numbers:
            code += [(_JEQ, 0, 1, numbers[name]), (_RET, 0, 0, _errno(errno.EPERM))]
    code += [(_JEQ, 0, 1, numbers["clone3"]), (_RET, 0, 0, _errno(errno.ENOSYS))]
    # clone: load flags (arg 0, low word); namespaces refused, a thread allowed, else refused
    code += [
        (_JEQ, 0, 5, numbers["clone"]),
        (_LD_W_ABS, 0, 0, _ARG0),
        (_JSET, 2, 0, _CLONE_NAMESPACES),
        (_JSET, 0, 1, _CLONE_THREAD),
        (_RET, 0, 0, _ALLOW),
        (_RET, 0, 0, _errno(errno.EPERM)),
    ]
    # socket: domain (arg 0) AF_UNIX refused
    code += [
        (_JEQ, 0, 3, numbers["socket"]),
        (_LD_W_ABS, 0, 0, _ARG0),
        (_JEQ, 0, 1, _AF_UNIX),
        (_RET, 0, 0, _errno(errno.EPERM)),
        (_RET, 0, 0, _ALLOW),
    ]
    return code


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
