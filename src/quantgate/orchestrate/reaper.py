"""End what a killed ``quantgate run`` leaves running: its Prefect server and its steps.

``quantgate run`` without ``PREFECT_API_URL`` starts Prefect's ephemeral API server as a child
process and stops it at exit. ``kill -9`` runs no exit handler, so the server lived on as an
orphan (about 200 MB each, one per killed run). A process cannot clean up after its own
``kill -9``, so a small watcher in its own session does: it remembers the run's children while
the run lives, and when the run is gone, stops them with their process groups (SIGTERM, then
SIGKILL). Steps also end themselves when their parent goes (``steps.end_with_parent``); this
covers what quantgate does not start itself.

Run as ``python -m quantgate.orchestrate.reaper PID``; it imports only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_POLL_S = 1.0
_GRACE_S = 5.0


def watch(pid: int) -> None:
    """Start a watcher for process ``pid`` (normally this process), detached from it."""
    subprocess.Popen(
        [sys.executable, "-m", "quantgate.orchestrate.reaper", str(pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the run's process group must not reach it
    )


def children(pid: int) -> set[int]:
    """The direct children of ``pid`` (every thread's), from /proc."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found.update(int(c) for c in (task / "children").read_text().split())
    return found


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat: tells a process from a later one that reuses its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _stop(known: dict[int, str]) -> None:
    alive = {pid for pid, started in known.items() if start_time(pid) == started}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + _GRACE_S
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = {pid for pid in alive if start_time(pid) == known[pid]}


def main(pid: int) -> None:
    """Watch ``pid``: remember its children while it lives, stop them once it is gone."""
    started = start_time(pid)
    known: dict[int, str] = {}
    while started is not None and start_time(pid) == started:
        for child in children(pid) - known.keys() - {os.getpid()}:  # the run started this watcher too
            child_started = start_time(child)
            if child_started is not None:
                known[child] = child_started
        time.sleep(_POLL_S)
    _stop(known)


if __name__ == "__main__":
    main(int(sys.argv[1]))
