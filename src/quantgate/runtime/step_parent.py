"""A pipeline step's link to the run that started it (``quantgate run`` → ``quantgate build|eval``).

The run names itself in the step's environment (``PARENT_ENV``); the step, whatever command it
is, watches that process. Kept below every stage so that the command line can honour it without
importing the orchestrator.
"""

from __future__ import annotations

import os
import signal
import threading
import time

PARENT_ENV = "QUANTGATE_STEP_PARENT"  # the pid of the run a step belongs to
_PARENT_POLL_S = 2.0


def end_with_parent() -> None:
    """In a step: end this step's process group when the run that started it is gone.

    A step runs in its own session, so ``kill -9`` of ``quantgate run`` (which no handler sees)
    would leave it building or evaluating for hours, holding memory and writing into a run
    nobody reads. A daemon thread polls for the parent and kills the group once it changes.
    """
    parent = os.environ.get(PARENT_ENV)
    if not parent or not parent.isdigit():
        return

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(_PARENT_POLL_S)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="end-with-parent", daemon=True).start()
