"""Measure the system calls that sandboxed programs make: the evidence for the seccomp allow-list.

Why a script: the allow-list in ``quantgate/evaluate/sandbox/seccomp.py`` must hold what
CPython, the tests' harness and a HumanEval solution need, and nothing else; this finds that
set by tracing real runs, not by guessing. Run by root, as CI runs the sandbox::

    python -I -S tests/unit/evaluate/sandbox_syscalls.py SANDBOX_INIT HUMANEVAL_JSONL_GZ [--limit N]

``SANDBOX_INIT`` is the package's ``__init__.py`` (loaded by path, standard library only, so any
interpreter can run this: the sandbox uses the one that runs the script). It runs, under
``strace -f``: every problem's canonical solution through ``run_check`` (the tests' harness and
the program), a few failing ones (an assertion, an exception, a wrong type) and ``WORKLOAD``
(ordinary standard-library use a completion may make) through ``run_untrusted`` and
``run_check``. It prints one JSON object: how many passed, and for every process that ran
under the seccomp filter (from ``prctl(PR_SET_SECCOMP)`` on, and the threads it started) each
system call's name with its count and results, and the arguments of those the filter checks.
A call that is refused in the trace (``EPERM``/``ENOSYS``) was tried and done without.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict

# Ordinary standard-library use by a completion: modules, threads, time, randomness, hashes,
# a temporary file, deep recursion, a refused allocation, printing.
WORKLOAD = r"""
import bisect, collections, copy, datetime, decimal, fractions, functools, hashlib, heapq
import itertools, json, math, operator, os, random, re, statistics, string, sys, tempfile
import threading, time, typing, uuid
from concurrent.futures import ThreadPoolExecutor

def workload(n):
    sys.setrecursionlimit(10**5)
    def depth(k):
        return 0 if k == 0 else 1 + depth(k - 1)
    total = depth(5000)
    try:
        depth(10**6)
    except RecursionError:
        total += 1
    try:
        bytearray(2**40)
    except MemoryError:
        total += 1
    time.sleep(0.01)
    total += int(time.time() > 0) + int(time.monotonic() > 0) + int(time.perf_counter() > 0)
    total += len(str(datetime.datetime.now())) > 0
    random.seed(n)
    total += random.randint(0, 1) + len(str(uuid.uuid4())) + len(os.urandom(4))
    total += len(hashlib.md5(b"x").hexdigest()) + len(hashlib.sha256(b"x").hexdigest())
    with ThreadPoolExecutor(max_workers=2) as pool:
        total += sum(pool.map(abs, range(-3, 3)))
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "f.txt")
        with open(path, "w") as handle:
            handle.write("data")
        total += len(open(path).read()) + len(os.listdir(directory))
        os.rename(path, path + ".old")
        os.remove(path + ".old")
    total += os.cpu_count() or 1
    total += len(os.getcwd()) > 0
    try:
        import numpy  # noqa: F401 - absent in the sandbox, as for a completion that tries
    except ImportError:
        total += 1
    print("workload", total, file=sys.stderr, flush=True)
    print(statistics.mean([1, 2, 3]), fractions.Fraction(1, 3), decimal.Decimal("1.1"))
    return n
"""
WORKLOAD_CHECK = "def check(candidate):\n    assert candidate(7) == 7\n"

# system calls whose arguments the filter checks: (name, index of the argument) to record
ARGUMENTS = {"ioctl": 1, "fcntl": 1, "prctl": 0, "prlimit64": 0, "clone": 0, "socket": 0, "socketpair": 0}
_LINE = re.compile(r"^(\d+)\s+(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
_RESULT = re.compile(r" = (-?\d+|0x[0-9a-f]+|\?)(?: (E[A-Z0-9]+))?")


def _load(init: str):
    spec = importlib.util.spec_from_file_location(
        "quantgate_sandbox", init, submodule_search_locations=[os.path.dirname(init)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["quantgate_sandbox"] = module
    spec.loader.exec_module(module)
    return module


def run(init: str, problems_path: str, limit: int | None) -> dict:
    """The runs to trace; what each ended as."""
    sandbox = _load(init)
    with gzip.open(problems_path, "rt") as handle:
        problems = [json.loads(line) for line in handle if line.strip()][:limit]
    statuses: dict = {"canonical": Counter(), "failing": {}, "workload": {}}
    not_passed = []
    for problem in problems:
        check = sandbox.Check(f"{problem['prompt']}\n\n{problem['test']}\n", problem["entry_point"])
        result = sandbox.run_check(problem["prompt"] + problem["canonical_solution"], check)
        statuses["canonical"][result.status] += 1
        if not result.passed:
            not_passed.append([problem["task_id"], result.status, result.stderr_tail[-300:]])
    statuses["canonical_not_passed"] = not_passed
    first = problems[0]
    check = sandbox.Check(f"{first['prompt']}\n\n{first['test']}\n", first["entry_point"])
    for name, body in (
        ("assert", "    return None\n"),
        ("raise", "    raise ValueError('no')\n"),
        ("object", "    return object()\n"),
    ):
        statuses["failing"][name] = sandbox.run_check(first["prompt"] + body, check).status
    result = sandbox.run_untrusted(WORKLOAD + "\nworkload(7)\n")
    statuses["workload"]["untrusted"] = [result.status, result.stderr_tail[-300:]]
    result = sandbox.run_check(WORKLOAD, sandbox.Check(WORKLOAD_CHECK, "workload"))
    statuses["workload"]["checked"] = [result.status, result.stderr_tail[-300:]]
    return statuses


def parse(trace: str) -> dict:
    """System calls of the filtered processes in an ``strace -f`` log: counts, results, arguments.

    A process is filtered from its ``prctl(PR_SET_SECCOMP)`` on, and a thread it starts from its
    first line. Host pids are reused across runs, so each is keyed by (pid, how many times that
    pid has ended before); a new thread's first lines may come before its parent's ``clone``
    returns, so they are attributed once it does (its id as the host sees it, which strace
    adds to the return value with ``--decode-pids=pidns``).
    """
    ended: Counter = Counter()  # pid -> times it ended: the key's second part
    calls: dict[tuple[int, int], list[Counter]] = defaultdict(lambda: [Counter(), Counter()])
    installed: set[tuple[int, int]] = set()  # keys past their filter's install
    inherited: set[tuple[int, int]] = set()  # keys started by a filtered key: filtered throughout
    unclaimed: dict[int, tuple[int, int]] = {}  # pid -> its last key, ended before a clone returned it
    expected: set[int] = set()  # pids a filtered clone returned whose first line is still to come
    pending: dict[int, str] = {}
    with open(trace, errors="replace") as handle:
        for line in handle:
            if " +++ exited with " in line or " +++ killed by " in line:
                pid = int(line.split()[0])
                unclaimed[pid] = (pid, ended[pid])
                ended[pid] += 1
                continue
            match = _LINE.match(line)
            if not match:
                continue
            pid, resumed, started, rest = int(match[1]), match[2], match[3], match[4]
            name = resumed or started
            key = (pid, ended[pid])
            if pid in expected:
                expected.discard(pid)
                inherited.add(key)
            if started and rest.endswith("<unfinished ...>"):
                pending[pid] = rest
                continue
            head = pending.pop(pid, "") + rest if resumed else rest
            if "PR_SET_SECCOMP" in head and key not in installed:
                installed.add(key)  # the filter's own install: what follows is filtered
                continue
            outcomes = list(_RESULT.finditer(head))
            outcome = outcomes[-1] if outcomes else None
            error = outcome[2] if outcome and outcome[2] else "ok"
            calls[key][key in installed][(name, _argument(name, head), error)] += 1
            started_one = name in ("clone", "clone3", "fork", "vfork") and outcome and outcome[1].isdigit()
            if started_one and (key in installed or key in inherited):
                host = re.search(r"/\* (\d+) in strace's PID NS \*/", head)
                child = int(host[1]) if host else int(outcome[1])
                if (child, ended[child]) in calls:
                    inherited.add((child, ended[child]))
                elif child in unclaimed:
                    inherited.add(unclaimed.pop(child))
                else:
                    expected.add(child)
    total: Counter = Counter()
    for key, (before, after) in calls.items():
        if key in inherited:
            total += before + after
        elif key in installed:
            total += after
    syscalls: dict[str, dict] = {}
    arguments: dict[str, Counter] = defaultdict(Counter)
    for (name, argument, error), count in sorted(total.items()):
        entry = syscalls.setdefault(name, {"count": 0, "results": Counter()})
        entry["count"] += count
        entry["results"][error] += count
        if argument is not None:
            arguments[name][f"{argument} -> {error}"] += count
    return {"syscalls": syscalls, "arguments": {name: dict(c) for name, c in sorted(arguments.items())}}


def _argument(name: str, head: str) -> str | None:
    """The argument the filter checks of a call it checks, as strace prints it."""
    if name not in ARGUMENTS:
        return None
    if name == "clone":
        flags = re.search(r"flags=([A-Z0-9_|]+)", head)
        return flags[1] if flags else head[:80]
    return head.split(", ")[ARGUMENTS[name]].split(")")[0].split(" ")[0]


def main() -> None:
    init, problems_path, *rest = sys.argv[1:]
    limit = int(rest[rest.index("--limit") + 1]) if "--limit" in rest else None
    if "--traced" in rest:
        print(json.dumps(run(init, problems_path, limit)))
        return
    with tempfile.TemporaryDirectory() as directory:
        trace = os.path.join(directory, "trace")
        command = ["strace", "-f", "-q", "-s", "0", "--decode-pids=pidns", "-e", "signal=none", "-o", trace]
        command += [sys.executable, "-I", "-S", os.path.abspath(__file__), *sys.argv[1:], "--traced"]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        answer = {"interpreter": sys.executable, "runs": json.loads(done.stdout), **parse(trace)}
    print(json.dumps(answer, indent=1))


if __name__ == "__main__":
    main()
