"""A run owns its ``--out``: one lock per output directory, held for the whole run.

Why: two ``quantgate run`` on one ``--out`` mixed. Each wrote ``<out>/plan.json`` in turn, so run
A's build and eval steps read run B's plan, and A's report (model "alpha") was computed from B's
checkpoint; neither run noticed. Now a run holds ``<out>/.quantgate-run.lock`` from before it
plans until its outcome is written, and every step checks that the plan it reads is its own
(``plan.RUN_ID_ENV``), so a second run on the same directory is refused before it writes
anything, and a step that meets another run's plan stops.

Refuse, not wait: the second run exits 2 at once, naming the run that holds the directory (its
run id, pid, host and start) and the fix (another ``--out``, or wait for that run). Waiting would
hide the mistake (two jobs configured with one output directory, a re-run started while the first
still runs) and then overwrite the first run's report and artifacts, which it has already
printed paths to; a retry loop (exit 75) would do the same. A second ``--out`` costs nothing:
builds and evaluations are cached by content, not by directory.

How: an ``flock`` on the lock file, which the kernel releases when the holding process ends,
however it ends (``kill -9`` included), so a killed run never leaves a lock that blocks the next
one (its lock file stays, unlocked, and the next run locks it); a run that ends removes the lock
file, and the directory too if the run made it and wrote nothing there. Its holder record (``.quantgate-run.holder.json``: run id, pid, the pid's start time, host,
start) only names it in the refusal. Where the file system has no ``flock`` (some network and FUSE
file systems), the record alone decides: a holder on this host whose pid no longer runs (or runs
another process, told apart by its start time) is stale and replaced; a holder on another host
cannot be checked from here, so the refusal names the record to remove once that run is gone.
The lock is re-entrant within one process: ``quantgate run`` takes it before the flow starts (the
outcome file it reads must be its own run's), and the flow takes it again (a deployment's flow runs
without ``quantgate run``), naming its flow run id.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quantgate.orchestrate.reaper import start_time
from quantgate.runtime.atomic import write_json
from quantgate.runtime.errors import UsageError

LOCK = ".quantgate-run.lock"
HOLDER = ".quantgate-run.holder.json"
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


@dataclass
class _Held:
    fd: int | None  # None where the file system has no flock (the record is the lock)
    holder: dict[str, object]
    created: list[Path]  # directories this hold made, deepest first: removed again while empty
    depth: int = 1


_HELD: dict[Path, _Held] = {}
_GUARD = threading.Lock()


def _holder(run_id: str) -> dict[str, object]:
    return {
        "run_id": run_id,
        "pid": os.getpid(),
        "pid_started": start_time(os.getpid()),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def read_holder(out: Path) -> dict[str, object] | None:
    """The record of the run holding ``out`` (or that last held it); None when there is none."""
    try:
        with open(Path(out) / HOLDER, "rb") as fh:
            found = json.loads(fh.read(64 * 1024))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _describe(holder: dict[str, object] | None) -> str:
    if holder is None:
        return "another quantgate run (its record is not written yet)"
    return (
        f"run {holder.get('run_id') or '(planning)'} (pid {holder.get('pid')} on {holder.get('host')}, "
        f"since {holder.get('started')})"
    )


def _in_use(out: Path, holder: dict[str, object] | None, remote: bool = False) -> UsageError:
    fix = "wait for that run to end, or give this run its own --out (builds and evaluations are cached by content)"
    if remote:
        fix += f"; if that run is gone, remove {out / HOLDER}"
    return UsageError(
        out,
        f"this --out is in use by {_describe(holder)}; two runs on one --out read each other's plan and results",
        fix,
    )


def _alive(holder: dict[str, object]) -> bool:
    """Whether the record's process still runs (on this host: by pid and start time)."""
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    return start_time(pid) is not None and start_time(pid) == holder.get("pid_started")


def _claim_by_record(out: Path) -> None:
    """Where there is no flock: refuse a live (or unverifiable) holder, replace a stale one."""
    holder = read_holder(out)
    if holder is None:
        return
    if holder.get("host") != socket.gethostname():
        raise _in_use(out, holder, remote=True)
    if _alive(holder) and holder.get("pid") != os.getpid():
        raise _in_use(out, holder)


@contextlib.contextmanager
def held(out: Path, run_id: str = "") -> Iterator[dict[str, object]]:
    """Hold ``out`` for the block (re-entrant in one process; ``run_id`` names the holder, and
    a nested hold with a run id fills it in); UsageError (exit 2) while another run holds it."""
    out = Path(out).resolve()
    with _GUARD:
        mine = _HELD.get(out)
        if mine is not None:
            mine.depth += 1
            if run_id and mine.holder.get("run_id") != run_id:
                mine.holder = {**mine.holder, "run_id": run_id}
                write_json(out / HOLDER, mine.holder)
        else:
            mine = _HELD[out] = _acquire(out, run_id)
    try:
        yield mine.holder
    finally:
        with _GUARD:
            mine.depth -= 1
            if mine.depth == 0:
                del _HELD[out]
                _release(out, mine)


def _acquire(out: Path, run_id: str) -> _Held:
    created = [d for d in (out, *out.parents) if not d.exists()]
    out.mkdir(parents=True, exist_ok=True)
    fd = _locked(out)
    holder = _holder(run_id)
    try:
        write_json(out / HOLDER, holder)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return _Held(fd, holder, created)


def _locked(out: Path) -> int | None:
    """The lock file's descriptor, flock-ed; None where there is no flock (the record decided).

    The lock file is removed when a run ends, so the file locked must still be the one at the
    path (another run may have removed it between our open and our lock): else try again."""
    while True:
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _in_use(out, read_holder(out)) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _NO_FLOCK:
                raise
            _claim_by_record(out)
            return None
        try:
            current = os.stat(out / LOCK).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            return fd
        os.close(fd)


def _release(out: Path, mine: _Held) -> None:
    """Remove the record and the lock file (still locked: a run waiting on the old file sees it
    gone and locks a new one), let the lock go, and remove the directory if this hold made it
    and nothing else was written there (a run refused for bad input leaves no --out)."""
    try:
        if read_holder(out) == mine.holder:
            (out / HOLDER).unlink(missing_ok=True)
        if mine.fd is not None:
            (out / LOCK).unlink(missing_ok=True)
    finally:
        if mine.fd is not None:
            os.close(mine.fd)
    for directory in mine.created:
        try:
            directory.rmdir()  # only when empty
        except OSError:
            break
