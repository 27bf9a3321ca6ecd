"""Run one heavy pipeline step (a ``quantgate`` command) in its own process, with a time limit.

Why a process and not a function call: a Prefect task timeout cannot stop native code (CUDA
kernels, a stuck C extension), and a crashed or leaking step must not take the flow down with
it. The step is the same command a release engineer runs by hand, so a flow and a person
always run the same code path. Its whole process group is killed on timeout, its output (both
streams, every line) goes to a log file beside the run's outputs, each line also to the
caller's callbacks (the console's stage lines pick warnings out of them), and its exit code
keeps the command-line contract: 75 means transient (retry), anything else is final.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from quantgate.runtime.errors import StepFailed, StepTimeout, TransientError
from quantgate.runtime.step_parent import PARENT_ENV

_TAIL_LINES = 25
_READ_BYTES = 1 << 16
_LONGEST_LINE = 1 << 16  # bytes held waiting for a newline, at most
_STOP_GRACE_S = 10.0  # a stopped step's group gets SIGTERM, then SIGKILL after this long
_RUNNING: set[subprocess.Popen] = set()  # every step process of this process, to stop them all
_RUNNING_LOCK = threading.Lock()


def run_step(
    name: str,
    args: list[str],
    log_path: Path,
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
) -> None:
    """Run ``quantgate <args>`` as a child process; see ``run_process``."""
    run_process(
        name,
        [sys.executable, "-m", "quantgate.cli", *args],
        log_path,
        timeout_s,
        env=env,
        on_line=on_line,
        on_stderr=on_stderr,
    )


def run_process(
    name: str,
    command: list[str],
    log_path: Path,
    timeout_s: float,
    *,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
) -> None:
    """Run ``command`` in its own process group; raise unless it exits 0.

    Raises ``TransientError`` for exit code 75, ``StepTimeout`` past ``timeout_s`` (the whole
    group killed) and ``StepFailed`` (carrying the exit code and the log's tail) for every
    other failure. ``on_line`` sees each line the step prints on stdout (its tables, paths),
    ``on_stderr`` each line on stderr (its progress, warnings and errors); the log keeps both.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # no colour codes in logs; the step's progress bars go to stderr, which the log keeps
    child_env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", PARENT_ENV: str(os.getpid()), **(env or {})}
    deadline = time.monotonic() + timeout_s
    with open(log_path, "wb") as log:
        log.write(f"$ {shlex.join(command)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env, start_new_session=True
        )
        assert proc.stdout is not None and proc.stderr is not None
        with _RUNNING_LOCK:
            _RUNNING.add(proc)
        try:
            streams = [_Lines(proc.stdout, log, on_line), _Lines(proc.stderr, log, on_stderr)]
            _pump(proc, streams, deadline)
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            with _RUNNING_LOCK:
                _RUNNING.discard(proc)
    code = proc.returncode
    if code == 0:
        return
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-_TAIL_LINES:])
    if code == -signal.SIGKILL and time.monotonic() >= deadline:
        raise StepTimeout(name, 124, str(log_path), f"killed after {timeout_s:.0f} s\n{tail}")
    if code == TransientError.exit_code:
        raise TransientError(f"step '{name}' hit a transient failure (log: {log_path}):\n{tail}")
    raise StepFailed(name, code, str(log_path), tail)


class _Lines:
    """One output stream of a step: its bytes to the log a whole line at a time (so two streams'
    lines never mix within a line) and each line, decoded, to ``on_line``."""

    def __init__(self, stream: IO[bytes], log: IO[bytes], on_line: Callable[[str], None] | None) -> None:
        self.stream, self.log, self.on_line = stream, log, on_line
        self._pending = b""

    def fileno(self) -> int:
        return self.stream.fileno()

    def read(self) -> bool:
        """Take what the stream has (without blocking: the selector said it is readable); False at its end."""
        chunk = os.read(self.fileno(), _READ_BYTES)
        if not chunk:
            self.flush()
            return False
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            self._emit(line + b"\n")
        if len(self._pending) > _LONGEST_LINE:  # a bar redrawn with \r for hours is never one line
            self.flush()
        return True

    def flush(self) -> None:
        """What is left without a newline (the stream ended, or the step was killed)."""
        if self._pending:
            pending, self._pending = self._pending, b""
            self._emit(pending)

    def _emit(self, line: bytes) -> None:
        self.log.write(line)
        self.log.flush()
        if self.on_line is not None:
            self.on_line(line.decode(errors="replace").rstrip("\r\n"))


def _pump(proc: subprocess.Popen, streams: list[_Lines], deadline: float) -> None:
    """Copy the child's stdout and stderr to the log (and their callbacks) until both end, the
    child has exited and gone quiet, or time runs out. Reads never block: a step that hangs
    after half a progress bar is still killed at its deadline."""
    import selectors

    selector = selectors.DefaultSelector()
    for stream in streams:
        selector.register(stream, selectors.EVENT_READ)
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _kill_group(proc)
                return
            ready = selector.select(timeout=min(remaining, 1.0))
            if not ready and proc.poll() is not None:
                break
            for key, _ in ready:
                lines = key.fileobj
                assert isinstance(lines, _Lines)
                if not lines.read():
                    selector.unregister(lines)
    finally:
        selector.close()
        for stream in streams:
            stream.flush()
    proc.wait()


class LogProgress:
    """``Progress`` for a step that runs in the flow's own process (the plan): its lines go to the
    step's log file, like a heavy step's, and to ``on_line``. The file is created at the first
    line, so input refused before any work (a missing checkpoint, a config typo) writes nothing."""

    def __init__(self, log_path: Path, on_line: Callable[[str], None] | None = None) -> None:
        self.log_path, self.on_line = Path(log_path), on_line
        self._opened = False

    def log(self, message: str) -> None:
        """Append one timestamped line to the log."""
        if not self._opened:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text("")
            self._opened = True
        with open(self.log_path, "a") as log:
            log.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
        if self.on_line is not None:
            self.on_line(message)

    @contextlib.contextmanager
    def task(self, description: str, total: float | None) -> Iterator[_Count]:
        """Log the task's description, and its duration when it ends."""
        started = time.monotonic()
        self.log(f"{description} ...")
        yield _Count()
        self.log(f"{description}: {time.monotonic() - started:.1f} s")


class _Count:
    """A task handle that counts nothing: a log file keeps no progress bars."""

    def advance(self, amount: float = 1) -> None:
        pass


def stop_all(grace_s: float = _STOP_GRACE_S) -> int:
    """Stop every step this process runs, each with its whole process group: SIGTERM, then
    SIGKILL for what is left after ``grace_s``. Returns how many were running.

    Why: steps run in their own sessions (a timeout must kill their whole group), so a signal
    that stops ``quantgate run`` does not reach them; without this, a stopped run waited for
    its running builds and evaluations to finish, or left them running after it was killed.
    """
    with _RUNNING_LOCK:
        running = [p for p in _RUNNING if p.poll() is None]
    for proc in running:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
    return len(running)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
