"""Progress reporting for long steps, passed in as context (never a global).

Library functions take a ``Progress`` and call ``progress.task(description, total)`` to get a
handle with ``advance(n)``; the CLI passes a rich-backed one that draws bars on stderr, tests
and flows pass ``SILENT``. Keeping the interface this small means no library module imports
rich or knows whether a terminal exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol, Self

from quantgate.runtime.escape import terminal, visible


class TaskHandle(Protocol):
    """One running task's handle: what a library function reports progress through."""

    def advance(self, amount: float = 1) -> None:
        """Count ``amount`` more units of the task as done."""
        ...


class Progress(Protocol):
    """What a library function is given to report long steps on (``SILENT`` or ``RichProgress``)."""

    def task(self, description: str, total: float | None) -> contextlib.AbstractContextManager[TaskHandle]:
        """A task of ``total`` units (None: unknown) for the duration of the block."""
        ...

    def log(self, message: str) -> None:
        """One line of news beside the bars."""
        ...


class _NullHandle:
    def advance(self, amount: float = 1) -> None:
        pass


class _Silent:
    @contextlib.contextmanager
    def task(self, description: str, total: float | None) -> Iterator[TaskHandle]:
        yield _NullHandle()

    def log(self, message: str) -> None:
        pass


SILENT: Progress = _Silent()


class RichProgress:
    """Bars on stderr through rich; one bar per task, removed when the task ends."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as _RichProgress

        self.console = Console(stderr=True)
        self._progress = _RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False, style="progress.description"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    @contextlib.contextmanager
    def task(self, description: str, total: float | None) -> Iterator[TaskHandle]:
        """A bar for the block; it shows complete when the block ends, whatever was advanced."""
        task_id = self._progress.add_task(visible(description), total=total)
        progress = self._progress

        class _Handle:
            def advance(self, amount: float = 1) -> None:
                progress.advance(task_id, amount)

        try:
            yield _Handle()
        finally:
            if total is not None:
                progress.update(task_id, completed=total)
            progress.stop_task(task_id)

    def log(self, message: str) -> None:
        """Print ``message`` above the bars, as text: a checkpoint named ``ck[/]`` is not markup."""
        self._progress.console.log(terminal(message))
