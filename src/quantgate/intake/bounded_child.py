"""Untrusted work (a chat template, a tokenizer's regular expressions) run in a child under real limits.

A deadline checked by the code it bounds is no deadline: the chat-template check used a trace
function, which runs between Python lines, so one big-integer power in a template (a single C
call) hung intake until it was killed, and a template could allocate gigabytes before the next
line. Here the work runs in a forked child with kernel limits set before it starts:
``RLIMIT_CPU`` (the kernel stops the child when its CPU time runs out, whatever it is doing),
``RLIMIT_AS`` (an allocation past the budget fails; Python raises ``MemoryError``) and no core
files; the parent waits at most ``wall_seconds`` (a child starved of CPU by a busy machine is
killed then) and reads back one small pickled answer. Whatever the child allocated or broke dies
with it.

Why fork and not a fresh interpreter: the child inherits what intake already imported
(transformers' Jinja environment, tokenizers), so a check costs a fork, milliseconds, where a new
interpreter would spend seconds importing transformers before it began. The child touches
nothing the parent's other threads may hold (no torch, no logging), writes only to its pipe and
leaves with ``os._exit``.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import resource
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Failure = Literal["cpu", "wall", "memory", "raised", "signal"]
_ANSWER_BYTES = 1024 * 1024  # what a child may send back: a verdict, never data


@dataclass(frozen=True)
class Limits:
    """What the child may use: CPU seconds (the kernel's whole seconds), bytes of address space
    beyond what it inherits, and wall-clock seconds before the parent kills it."""

    cpu_seconds: int
    memory_bytes: int
    wall_seconds: float


@dataclass(frozen=True)
class Outcome:
    """What became of the work: its return value, or why there is none (``failure``; ``detail`` is
    the exception as ``Type: message`` or the signal's name)."""

    value: Any = None
    failure: Failure | None = None
    detail: str = ""


def run(work: Callable[[], Any], limits: Limits) -> Outcome:
    """``work()`` in a forked child under ``limits``; its (picklable, small) return value or why not."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover  (runs in the child; its outcomes are what the tests check)
        os.close(read_end)
        _child(work, limits, write_end)
    os.close(write_end)
    answer, killed_at_deadline = _read(read_end, pid, time.monotonic() + limits.wall_seconds)
    _, status = os.waitpid(pid, 0)
    if killed_at_deadline:
        return Outcome(failure="wall", detail=f"still running after {limits.wall_seconds:g} s")
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum in (signal.SIGXCPU, signal.SIGKILL):  # the soft CPU limit, then the hard one
            return Outcome(failure="cpu", detail=signal.Signals(signum).name)
        return Outcome(failure="signal", detail=signal.Signals(signum).name)
    try:
        kind, payload = pickle.loads(answer)
    except Exception:  # noqa: BLE001  no answer, or a cut one: the child died without saying why
        return Outcome(failure="signal", detail=f"exited with status {os.waitstatus_to_exitcode(status)}")
    if kind == "ok":
        return Outcome(value=payload)
    return Outcome(failure=kind, detail=payload)


def _read(fd: int, pid: int, deadline: float) -> tuple[bytes, bool]:
    """Everything the child writes before it closes the pipe, and whether the deadline killed it."""
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                return b"", True
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks), False
            size += len(chunk)
            if size > _ANSWER_BYTES:  # not a verdict: stop reading, the child is killed
                os.kill(pid, signal.SIGKILL)
                return b"", False
            chunks.append(chunk)
    finally:
        os.close(fd)


def _child(work: Callable[[], Any], limits: Limits, write_end: int) -> None:  # pragma: no cover
    """Set the limits, run ``work``, send ``(kind, payload)`` and leave without running any cleanup
    of the parent's (atexit handlers, buffered files)."""
    code = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # a Rust panic's backtrace, a warning: never onto the user's terminal
            os.dup2(devnull, fd)
        faulthandler.disable()  # it writes to a descriptor of its own, not fd 2
        for signum in (signal.SIGXCPU, signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        used = resource.getrusage(resource.RUSAGE_SELF)
        cpu = int(used.ru_utime + used.ru_stime) + max(1, limits.cpu_seconds)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        memory = _address_space() + limits.memory_bytes
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]  # a limit the whole process runs under stays
        if hard != resource.RLIM_INFINITY:
            memory = min(memory, hard)
        resource.setrlimit(resource.RLIMIT_AS, (memory, hard if hard != resource.RLIM_INFINITY else memory))
        try:
            answer: tuple[str, Any] = ("ok", work())
        except MemoryError:
            answer = ("memory", "MemoryError")
        except BaseException as exc:  # noqa: BLE001  a panic from Rust is a BaseException too
            answer = ("raised", f"{type(exc).__name__}: {exc}"[:500])
        try:
            data = pickle.dumps(answer)
        except Exception as exc:  # noqa: BLE001
            data = pickle.dumps(("raised", f"unpicklable answer ({type(exc).__name__})"))
        view = memoryview(data)
        while view:
            view = view[os.write(write_end, view) :]
    except MemoryError:
        code = 3  # no answer: the parent reports a child that died without one
    except BaseException:  # noqa: BLE001
        code = 4
    finally:
        os._exit(code)


def _address_space() -> int:
    """The child's virtual address space now (what it inherited), in bytes."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
