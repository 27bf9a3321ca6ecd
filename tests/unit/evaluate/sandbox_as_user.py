"""Run programs through ``quantgate.evaluate.sandbox`` as a non-root user; started by root.

Why a script: the test suite runs as root (CI), where the sandbox takes its root path; this
shows the user-namespace path, the one a developer's workstation takes, for real. Run by root
as ``python sandbox_as_user.py REQUEST.json``; prints one JSON object on stdout. Standard library
only, and it loads the ``sandbox`` package by path: the non-root user cannot read the
project's virtual environment, so the interpreter is one that user can execute (the test picks
it).

The request: ``uid`` (the user to become), ``sandbox`` (path of the package's
``__init__.py``), ``programs`` (``{name: {"program": ..., "kwargs": {...}}}``, run by
``run_untrusted``, or with ``"check": {"tests": ..., "entry_point": ...}`` by ``run_check``), ``host_reads`` (paths this user must be able
to read outside the sandbox, so that the sandbox, not file permissions, is what hides them),
and optionally ``max_user_namespaces``: first enter a user namespace of root's own (every id
mapped to itself) with that limit on further user namespaces, so that 0 forbids them (as a
distribution may) and 1 lets the sandbox make its first and refuses the nested one.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import sys

CLONE_NEWUSER = 0x10000000


def _enter_limited_namespace(limit: int) -> None:
    """As root: a user namespace mapping every id to itself, allowing ``limit`` more below it."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child:
        os.close(ready_w)
        os.close(go_r)
        os.read(ready_r, 1)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child}/{name}", "w") as handle:
                handle.write("0 0 4294967295")
        os.write(go_w, b"x")
        _, status = os.waitpid(child, 0)
        sys.stdout.flush()
        os._exit(os.waitstatus_to_exitcode(status))
    os.close(ready_r)
    os.close(go_w)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER)")
    os.write(ready_w, b"x")
    os.read(go_r, 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as handle:
        handle.write(str(limit))


def _pids_of(uid: int) -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.add(int(entry))
            except OSError:
                pass
    return found


def main(request: dict) -> dict:
    """Become the user, then run every program; results, survivors and what was checked."""
    if request.get("max_user_namespaces") is not None:
        _enter_limited_namespace(int(request["max_user_namespaces"]))
    uid = int(request["uid"])
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    for path, mode in ((sys.executable, os.X_OK), (request["sandbox"], os.R_OK)):
        if not os.access(path, mode):
            return {"skip": f"uid {uid} cannot {'execute' if mode == os.X_OK else 'read'} {path}"}
    unreadable = [p for p in request.get("host_reads", []) if not os.access(p, os.R_OK)]
    spec = importlib.util.spec_from_file_location(
        "quantgate_sandbox",
        request["sandbox"],
        submodule_search_locations=[os.path.dirname(request["sandbox"])],
    )
    assert spec is not None and spec.loader is not None
    sandbox = importlib.util.module_from_spec(spec)
    sys.modules["quantgate_sandbox"] = sandbox
    spec.loader.exec_module(sandbox)
    out: dict = {"euid": os.geteuid(), "mode": sandbox.mode(), "unreadable_on_host": unreadable, "runs": {}}
    before = _pids_of(uid)
    for name, run in request["programs"].items():
        if "check" in run:
            check = sandbox.Check(**run["check"])
            result = sandbox.run_check(run["program"], check, **run.get("kwargs", {}))
        else:
            result = sandbox.run_untrusted(run["program"], **run.get("kwargs", {}))
        out["runs"][name] = {
            "status": result.status,
            "returncode": result.returncode,
            "seconds": result.seconds,
            "stdout": result.stdout_tail,
            "stderr": result.stderr_tail,
            "error": result.error,
            "survivors": sorted(_pids_of(uid) - before),
        }
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        answer = main(json.load(handle))
    print(json.dumps(answer))
