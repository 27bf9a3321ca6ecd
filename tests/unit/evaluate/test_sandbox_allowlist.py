"""The sandbox's seccomp allow-list and output pipes, tried from inside the sandbox.

Every syscall number outside the allow-list is called by a program in the sandbox and must be
refused; the allowed ones that are checked by argument must be refused with any other
argument; a foreign ABI must still kill the process; output past the cap must cost nothing on
the host; and what the list allows must be enough for every canonical HumanEval solution.
The escape battery (``test_sandbox_escapes.py``) holds one case per defect the deny-list let
through (issue 25).
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest

from quantgate.evaluate import sandbox
from quantgate.evaluate.sandbox import output, run_check, run_untrusted, seccomp
from quantgate.evaluate.suites.humaneval import check_for, problems

MODE = sandbox.mode()
pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(MODE not in ("root", "userns"), reason=f"no sandbox can be built here: {MODE}"),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)"),
]

MACHINE = os.uname().machine
# above every syscall number of both architectures, and the x86_64 numbers that exist only for x32
LAST_NUMBER = 600
EPERM, ENXIO, ENOSYS = 1, 6, 38


def _answers(program: str) -> dict:
    """Run ``program`` (which prints one JSON object as its last line) in the sandbox; that object."""
    result = run_untrusted(program, timeout_s=30)
    assert result.passed, result
    return json.loads(result.stdout_tail.strip().splitlines()[-1])


def test_every_syscall_outside_the_allow_list_is_refused():
    """Each number called with zero arguments: none runs (a refused call never reaches the kernel)."""
    # x86_64's uretprobe (335) and uprobe (336) pass every seccomp filter, by the kernel's design
    # (Linux 6.14+ and 6.18+); called from outside a uprobe trampoline, uretprobe kills the
    # caller with SIGILL (so it is left out here) and uprobe answers ENXIO
    allowed = sorted({*seccomp.allowed(MACHINE).values(), *([335] if MACHINE == "x86_64" else [])})
    program = (
        "import ctypes, json\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        f"called, answers = 0, {{}}\nfor nr in sorted(set(range({LAST_NUMBER})) - set({allowed})):\n"
        "    ctypes.set_errno(0)\n"
        "    result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(0)] * 6)\n"
        "    called += 1\n"
        f"    if result != -1 or ctypes.get_errno() != {EPERM}:  # the output tail holds the exceptions only\n"
        "        answers[nr] = ctypes.get_errno() if result == -1 else f'returned {result}'\n"
        "print(json.dumps({'called': called, 'not EPERM': answers}))\n"
    )
    answers = _answers(program)
    assert answers["called"] == LAST_NUMBER - len(allowed)
    refused_otherwise = answers["not EPERM"]
    # clone3 answers ENOSYS, so that glibc falls back to clone (allowed for threads)
    assert refused_otherwise.pop("435") == ENOSYS
    if MACHINE == "x86_64":
        assert refused_otherwise.pop("336", ENXIO) == ENXIO
    assert refused_otherwise == {}


@pytest.mark.skipif(MACHINE != "x86_64", reason="x86_64's syscall numbers")
def test_the_stat_familys_plain_forms_answer_as_glibc_2_39_calls_them():
    """glibc 2.39 (Ubuntu 24.04, the NGC containers of the GPU workers) calls ``fstat`` (5)
    itself where 2.36 called ``newfstatat``: refused, its dynamic loader could not stat a
    library, and on the H200 every HumanEval item failed with "the tests' harness did not start
    (its interpreter exited with 127)". The three plain forms read what ``newfstatat`` reads."""
    program = (
        "import ctypes, json\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
        "buf = ctypes.create_string_buffer(256)\nanswers = {}\n"
        "for name, nr, arg in (('fstat', 5, ctypes.c_long(0)), ('stat', 4, ctypes.c_char_p(b'/tmp')),\n"
        "                      ('lstat', 6, ctypes.c_char_p(b'/tmp'))):\n"
        "    ctypes.set_errno(0)\n"
        "    answers[name] = [libc.syscall(ctypes.c_long(nr), arg, buf), ctypes.get_errno()]\n"
        "print(json.dumps(answers))\n"
    )
    assert _answers(program) == {"fstat": [0, 0], "stat": [0, 0], "lstat": [0, 0]}


def test_allowed_syscalls_with_other_arguments_are_refused():
    """prctl, prlimit64, ioctl, fcntl and clone are allowed for the arguments CPython uses, only."""
    program = (
        "import ctypes, json, os, resource\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def errno_of(call):\n    ctypes.set_errno(0)\n"
        "    return 'ok' if call() != -1 else ctypes.get_errno()\n"
        "old = (ctypes.c_long * 2)()\n"
        "answers = {\n"
        "    'prctl PR_SET_DUMPABLE': errno_of(lambda: libc.prctl(4, 0, 0, 0, 0)),\n"
        "    'prctl PR_SET_NAME': errno_of(lambda: libc.prctl(15, b'x', 0, 0, 0)),\n"
        "    'prctl PR_SET_PDEATHSIG': errno_of(lambda: libc.prctl(1, 9, 0, 0, 0)),\n"
        "    'prlimit64 self': errno_of(lambda: libc.prlimit(0, 0, None, old)),\n"
        "    'prlimit64 pid 1': errno_of(lambda: libc.prlimit(1, 0, None, old)),\n"
        "    'ioctl TCGETS': errno_of(lambda: libc.ioctl(1, 0x5401, old)),\n"
        "    'ioctl FIOCLEX': errno_of(lambda: libc.ioctl(1, 0x5451)),\n"
        "    'ioctl TIOCSTI': errno_of(lambda: libc.ioctl(1, 0x5412, b'x')),\n"
        "    'ioctl FIONREAD': errno_of(lambda: libc.ioctl(1, 0x541B, old)),\n"
        "    'fcntl F_GETFD': errno_of(lambda: libc.fcntl(1, 1)),\n"
        "    'fcntl F_SETPIPE_SZ': errno_of(lambda: libc.fcntl(1, 1031, 1 << 20)),\n"
        "    'fcntl F_SETLK': errno_of(lambda: libc.fcntl(1, 6, old)),\n"
        "    'kill self': errno_of(lambda: libc.kill(os.getpid(), 0)),\n"
        "    'getrlimit': resource.getrlimit(resource.RLIMIT_NOFILE)[0],\n"
        "}\nprint(json.dumps(answers))\n"
    )
    assert _answers(program) == {
        "prctl PR_SET_DUMPABLE": "ok",
        "prctl PR_SET_NAME": EPERM,
        "prctl PR_SET_PDEATHSIG": EPERM,
        "prlimit64 self": "ok",
        "prlimit64 pid 1": EPERM,
        "ioctl TCGETS": 25,  # allowed: ENOTTY, fd 1 is a pipe
        "ioctl FIOCLEX": "ok",
        "ioctl TIOCSTI": EPERM,
        "ioctl FIONREAD": EPERM,
        "fcntl F_GETFD": "ok",
        "fcntl F_SETPIPE_SZ": EPERM,
        "fcntl F_SETLK": EPERM,
        "kill self": EPERM,
        "getrlimit": sandbox.supervisor.OPEN_FILES_LIMIT,
    }


def test_a_foreign_abi_still_kills_the_process():
    """x32 numbers, and ``int 0x80`` (the 32-bit ABI), are killed, not refused: nothing to fall back on."""
    if MACHINE != "x86_64":
        pytest.skip("x32 and int 0x80 are x86_64's")
    x32 = run_untrusted("import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint('ESCAPED')\n")
    int80 = run_untrusted(
        "import ctypes, mmap\n"
        "page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        "page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (getpid); int 0x80; ret\n"
        "address = ctypes.addressof(ctypes.c_char.from_buffer(page))\n"
        "print('ESCAPED', ctypes.CFUNCTYPE(ctypes.c_int)(address)())\n"
    )
    for result in (x32, int80):
        assert (result.status, result.returncode) == ("failed", -signal.SIGSYS), result
        assert "ESCAPED" not in result.stdout_tail


def test_output_past_the_cap_is_cut_off_and_costs_no_disk():
    """stdout is a pipe the caller reads: past the cap it stops reading, and the run is a resource limit."""
    chunks = output.OUTPUT_LIMIT // 10**6 + 8
    program = f"import sys\nfor _ in range({chunks}):\n    sys.stdout.write('x' * 10**6)\nprint('END')\n"
    result = run_untrusted(program, timeout_s=30)
    assert result.status == "resource_limit", result
    assert len(result.stdout_tail) <= sandbox.TAIL_BYTES and "END" not in result.stdout_tail
    assert result.stderr_tail.endswith(
        f"{output.LIMIT_NOTE} stdout passed {output.OUTPUT_LIMIT} bytes; the rest was not read\n"
    )
    assert "BrokenPipeError" in result.stderr_tail  # the program's next write after the cap
    assert result.seconds < 20


@pytest.mark.slow
def test_every_canonical_humaneval_solution_passes():
    """The allow-list holds what the harness and every problem's canonical solution need."""
    statuses: dict[str, list[str]] = {}
    for problem in problems():
        result = run_check(problem["prompt"] + problem["canonical_solution"], check_for(problem))
        statuses.setdefault(result.status, []).append(problem["task_id"])
    assert set(statuses) == {"passed"} and len(statuses["passed"]) == 164, {
        status: ids for status, ids in statuses.items() if status != "passed"
    }
