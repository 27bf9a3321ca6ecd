"""The sandbox's stdout and stderr: pipes the caller reads while the run lasts, up to a byte cap.

Why pipes and not files: a file on the host is disk the program can grow however the
sandbox limits writes (``fallocate(FALLOC_FL_KEEP_SIZE)`` on a file at fd 1 skipped
``RLIMIT_FSIZE``: 2 GB of host disk in 3 s). A pipe holds at most its buffer, and nothing of it
reaches a disk: the caller keeps the last ``TAIL_BYTES`` of each stream in memory and, past
``OUTPUT_LIMIT`` bytes, closes its end, so the program's next write fails (``EPIPE``) and
nothing more is read. The run is then labelled a resource limit, as a file past the size limit
was.
"""

from __future__ import annotations

import os
import select
import time

# relative: tests load this package by path as a user who cannot read the virtual environment
from .supervisor import FILE_SIZE_LIMIT

TAIL_BYTES = 2048
OUTPUT_LIMIT = FILE_SIZE_LIMIT  # per stream, as for a file the program writes in the sandbox
LIMIT_NOTE = "sandbox output limit:"
_CHUNK = 65536
_DRAIN_S = 2.0  # after the run: the namespace is gone, so its write ends are closed


class Stream:
    """One pipe's read end: the last ``TAIL_BYTES`` read, and whether the cap cut it off."""

    def __init__(self, name: str, fd: int) -> None:
        self.name, self.fd = name, fd
        self.total = 0
        self.tail = b""
        self.cut = False

    def read(self) -> None:
        """Read what is there (the pipe is ready); close at end of file or at the cap."""
        chunk = os.read(self.fd, _CHUNK)
        self.total += len(chunk)
        self.tail = (self.tail + chunk)[-TAIL_BYTES:]
        if not chunk or self.total >= OUTPUT_LIMIT:
            self.cut = bool(chunk)
            self.close()

    def close(self) -> None:
        """Stop reading: a write to the pipe then fails, once nothing else holds its read end."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def text(self) -> str:
        """The last ``TAIL_BYTES`` read, as text."""
        return self.tail.decode("utf-8", errors="replace")


def with_notes(stderr: str, streams: list[Stream]) -> str:
    """``stderr`` with a last line for each stream the cap cut off (a resource limit, as labelled)."""
    for stream in streams:
        if stream.cut:
            note = f"{LIMIT_NOTE} {stream.name} passed {OUTPUT_LIMIT} bytes; the rest was not read\n"
            stderr = (stderr + ("\n" if stderr and not stderr.endswith("\n") else "") + note)[-TAIL_BYTES:]
    return stderr


def pump(streams: list[Stream], until: int | None, timeout_s: float) -> bool:
    """Read ``streams`` until the descriptor ``until`` is readable (True) or ``timeout_s`` passes.

    With ``until`` None, until every stream has ended (True) or the time is up.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        open_streams = [stream for stream in streams if stream.fd >= 0]
        if until is None and not open_streams:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        watched = [stream.fd for stream in open_streams] + ([until] if until is not None else [])
        ready = select.select(watched, [], [], left)[0]
        for stream in open_streams:
            if stream.fd in ready:
                stream.read()
        if until is not None and until in ready:
            return True


def drain(streams: list[Stream]) -> None:
    """After the run: read what is left, then close every stream."""
    pump(streams, None, _DRAIN_S)
    for stream in streams:
        stream.close()
