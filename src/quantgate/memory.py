"""Peak resident memory, measured the way the kernel counts it for this process alone.

``getrusage().ru_maxrss`` survives ``fork`` and ``execve`` on Linux: a build started by a
large parent (a test runner, a Prefect worker) would report the parent's peak as its own.
``VmHWM`` in ``/proc/<pid>/status`` is the high-water mark of the current address space only,
so it is what manifests and memory tests use. Without ``/proc`` (off Linux) there is no answer
(None); ``ru_maxrss`` serves only this process when its status has no ``VmHWM`` line.
"""

from __future__ import annotations

import resource
from pathlib import Path


def peak_rss_bytes(pid: int | str = "self") -> int | None:
    """VmHWM of a process in bytes (None when the process is gone or ``/proc`` has no status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    if pid == "self":
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return None
