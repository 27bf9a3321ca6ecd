"""What ``quantgate run`` prints while it runs: a few lines per stage, not every step's tables.

Why: each heavy step (``quantgate build|eval --plan``) prints its own tables, and the flow used to
relay every line through Prefect's logger, with Prefect's own line per task state beside them:
the README's main job printed about 320 lines, most of them evaluation metric tables, before the
verdict table a newcomer was waiting for. Now each stage says when it starts (and where its log
is), that it is still running (a heartbeat, first after 30 s, then less and less often), and how
it ended: its duration and key result, or the last lines of its log when it failed. Warnings and
errors a step prints still reach the console as they come. The whole output of every step stays
in ``<out>/logs/<step>.log``, and the report carries the numbers; ``quantgate run --verbose``
relays every line as before.

The lines go through the logger ``quantgate.run``: Prefect's console handler prints them (they
propagate to the root logger it configures), and Prefect's API handler files them under their run
in the UI, as it does for the loggers named in ``PREFECT_LOGGING_EXTRA_LOGGERS``.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from quantgate.runtime.errors import StepFailed, StepTimeout, TransientError
from quantgate.runtime.escape import visible

LOGGER = "quantgate.run"
HEARTBEAT_S = 30.0  # the first "still running" line; each later one waits twice as long ...
HEARTBEAT_MAX_S = 300.0  # ... up to this: a six-hour step says so 80 times, not 720
TAIL_LINES = 15  # of a failed step's log, on the console
MAX_ALARMS = 10  # distinct warning or error lines of one step on the console; the rest in its log

# a warning or an error as libraries print them: a level name in capitals (logging, loguru), a
# Python warning or exception line (``UserWarning: ...``, ``ValueError: ...``), quantgate's ``error:``
_ALARM = re.compile(r"\b(?:WARNING|ERROR|CRITICAL)\b|[A-Za-z]*(?:Warning|Error): |^(?:warning|error)\b")
_NUMBERS = re.compile(r"\d+")
# the time a library stamps its line with: the console line has its own
_STAMP = re.compile(r"^\[?(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?\s*(?:\|\s*)?")

Say = logging.Logger | logging.LoggerAdapter


def run_logger() -> logging.LoggerAdapter:
    """``quantgate.run`` carrying the current Prefect run's ids (call it inside a flow or task run):
    a line logged from another thread (the heartbeat) is still filed under its run in the UI."""
    from prefect import get_run_logger

    extra: dict[str, Any] = dict(getattr(get_run_logger(), "extra", None) or {})
    return logging.LoggerAdapter(stage_logger(), extra)


def stage_logger() -> logging.Logger:
    """The logger of the stage lines, at INFO, with the handlers Prefect gives an extra logger (its
    API handler); its records reach Prefect's console handler through the root logger."""
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.INFO)
    for handler in logging.getLogger("prefect.extra").handlers:
        if handler not in logger.handlers:
            logger.addHandler(handler)
    return logger


def quiet_prefect(verbose: bool) -> None:
    """Keep Prefect's INFO line per task ("Finished in state Completed()") and the lines a task logs
    on its run logger (a step's relayed output, with ``--verbose``) off the console unless
    ``verbose``: the stage lines say when each task ran and how it ended. A task that fails still
    shows (Prefect logs it at ERROR). Set in every process that runs tasks (Dask workers too);
    ``verbose`` gives the logger back Prefect's level (``PREFECT_LOGGING_LEVEL``)."""
    logging.getLogger("prefect.task_runs").setLevel(logging.NOTSET if verbose else logging.WARNING)


def duration(seconds: float) -> str:
    """'20.4 s', '3 min 05 s', '2 h 07 min': as precise as a person reads a step's time."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def log_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of a step's log as a terminal would show them: of a progress bar
    redrawn with carriage returns, its last state; control characters visible."""
    try:
        text = Path(path).read_bytes().decode(errors="replace")  # read_text would split at each \r
    except OSError:
        return []
    shown = [line.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    return [visible(line) for line in shown if line.strip()][-lines:]


class Stage:
    """One stage of the run on the console, as a ``with`` block: a line when it starts, a heartbeat
    while it runs, one when it ends (``done``, or a default) and, when it fails, why, with the
    last lines of its log. ``scan`` is given each line its step prints: warnings and errors among
    them reach the console, each distinct one once."""

    def __init__(
        self,
        say: Say,
        label: str,
        log: Path | None = None,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        heartbeat_max_s: float = HEARTBEAT_MAX_S,
    ) -> None:
        self.say, self.label, self.log = say, label, log
        self.heartbeat_s, self.heartbeat_max_s = heartbeat_s, heartbeat_max_s
        self._started = time.monotonic()
        self._ended = False
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._alarms: set[str] = set()
        self._alarms_lock = threading.Lock()

    @property
    def elapsed(self) -> float:
        """Seconds since the stage started."""
        return time.monotonic() - self._started

    def __enter__(self) -> Self:
        self._started = time.monotonic()
        where = f" (log: {visible(self.log)})" if self.log else ""
        self.say.info(f"{self.label}: started{where}")
        self._beat = threading.Thread(target=self._heartbeat, name=f"heartbeat {self.label}", daemon=True)
        self._beat.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        if exc is not None:
            self._failed(exc)
        elif not self._ended:
            self.done("done")

    def done(self, what: str, detail: str = "") -> None:
        """The stage's last line: '<label>: <what> in <duration> (<detail>)'."""
        self._ended = True
        self._stop.set()  # no heartbeat after the last line
        more = f" ({detail})" if detail else ""
        self.say.info(f"{self.label}: {what} in {duration(self.elapsed)}{more}")

    def scan(self, line: str) -> None:
        """One line of the step's output: on the console if it is a warning or an error not shown
        yet (numbers aside: a timestamp or a count does not make it new), up to ``MAX_ALARMS``."""
        if not _ALARM.search(line):
            return
        key = _NUMBERS.sub("#", line.strip())
        with self._alarms_lock:
            if key in self._alarms or len(self._alarms) > MAX_ALARMS:
                return
            self._alarms.add(key)
            more = len(self._alarms) > MAX_ALARMS
        if more:
            self.say.warning(f"{self.label}: more warnings and errors in {visible(self.log)}")
        else:
            self.say.warning(f"{self.label}: {visible(_STAMP.sub('', line.strip()))}")

    def _heartbeat(self) -> None:
        """'<label>: still running (<duration>)' after ``heartbeat_s``, then at doubling intervals."""
        wait = self.heartbeat_s
        while not self._stop.wait(wait):
            self.say.info(f"{self.label}: still running ({duration(self.elapsed)})")
            wait = min(wait * 2, self.heartbeat_max_s)

    def _failed(self, exc: BaseException) -> None:
        """Why the stage ended early; a failed step's log tail, naming the log."""
        took = duration(self.elapsed)
        if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: the flow says what it stopped
            self.say.warning(f"{self.label}: stopped after {took}")
            return
        if isinstance(exc, StepTimeout):
            how, level = f"killed at its time limit after {took}", logging.ERROR
        elif isinstance(exc, StepFailed):
            how, level = f"failed after {took} (exit code {exc.exit_code})", logging.ERROR
        elif isinstance(exc, TransientError):
            how, level = (
                f"hit a transient failure after {took} (exit code 75, retried while retries are left)",
                logging.WARNING,
            )
        else:
            first = str(exc).split("\n", 1)[0]
            self.say.error(f"{self.label}: failed after {took}: {type(exc).__name__}: {visible(first)}")
            return
        tail = log_tail(self.log) if self.log else []
        if not tail:
            self.say.log(level, f"{self.label}: {how}")
            return
        lines = "\n".join(f"  | {line}" for line in tail)
        self.say.log(level, f"{self.label}: {how}; the last lines of {visible(self.log)}:\n{lines}")


def step_output(
    stage: Stage, verbose: Callable[[str], None] | None = None
) -> dict[str, Callable[[str], None]]:
    """``run_step``'s callbacks for the step of ``stage``: each line of both streams is scanned
    for warnings and errors; with ``verbose`` (a run logger's ``info``), each stdout line is also
    relayed to it, as every line was before the stage lines."""

    def stdout(line: str) -> None:
        stage.scan(line)
        if verbose is not None:
            verbose(line)

    return {"on_line": stdout, "on_stderr": stage.scan}
