"""``quantgate run``: the whole pipeline as one Prefect flow run, with or without a server.

Without ``PREFECT_API_URL`` Prefect starts an ephemeral API for the run; with it, the run is
recorded on that server like any deployment's. Tasks run in threads by default (heavy steps are
processes anyway), or on Dask to fan builds and evaluations out over a cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect.states import State

from quantgate.orchestrate import heavy_slots, out_lock, reaper
from quantgate.orchestrate.flow import PlanRefused, build_and_gate
from quantgate.orchestrate.outcome import OUTCOME, RunOutcome
from quantgate.orchestrate.request import RunRequest
from quantgate.runtime.errors import QuantgateError


def task_runner(dask_workers: int = 0, dask_address: str | None = None):
    """None (Prefect's default thread pool) or a ``DaskTaskRunner``."""
    if not dask_workers and not dask_address:
        return None
    from prefect_dask import DaskTaskRunner

    if dask_address:
        return DaskTaskRunner(address=dask_address)
    # one thread per worker process: each task holds a heavy step's slot or a light gate
    return DaskTaskRunner(
        cluster_kwargs={"n_workers": dask_workers, "threads_per_worker": 1, "processes": True}
    )


def run_flow(
    request: RunRequest, *, dask_workers: int = 0, dask_address: str | None = None
) -> tuple[RunOutcome | None, State[Any]]:
    """Run ``build_and_gate(request)``; its outcome (None when the run ended without one) and its
    final state. ``dask_workers``/``dask_address``: where its tasks run (``task_runner``), which is
    how the run is carried out, not part of what it is asked.

    Raises the run's own ``QuantgateError`` (bad input, say) so the command line exits with
    its code and message rather than a Prefect traceback.
    """
    _stop_cleanly()
    out = request.out.resolve()
    logs_before = (out / "logs").exists()
    # held before anything is removed or started: another run on this --out is refused here (exit 2),
    # and the outcome read at the end is this run's (the flow takes the same lock again)
    with out_lock.held(out):
        (out / OUTCOME).unlink(missing_ok=True)  # only this run's outcome may be reported
        runner = task_runner(dask_workers, dask_address)
        flow_fn = build_and_gate.with_options(task_runner=runner) if runner else build_and_gate
        # the ephemeral API server is a child process: it reads this from the environment
        os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        heavy_slots.use_file_leases()
        with patient_ephemeral_server():
            state = flow_fn(request, return_state=True)
        if (out / OUTCOME).exists():
            return RunOutcome.read(out), state
        error = state.result(raise_on_failure=False)
        if isinstance(error, PlanRefused):  # bad input: nothing of this run stays in --out
            _forget_plan_log(out, logs_before)
    if isinstance(error, PlanRefused):
        raise error.error()
    if isinstance(error, QuantgateError):
        raise error
    return None, state


def _forget_plan_log(out: Path, logs_before: bool) -> None:
    """Remove the plan's log of a refused run (and ``logs/`` when this run made it): the lock's
    release then removes an ``--out`` the run created, left empty."""
    with contextlib.suppress(OSError):
        (out / "logs" / "plan.log").unlink(missing_ok=True)
        if not logs_before:
            (out / "logs").rmdir()


EPHEMERAL_STARTUP_S = 120
_STARTUP_VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


@contextlib.contextmanager
def patient_ephemeral_server() -> Iterator[None]:
    """Give Prefect's ephemeral API server 120 s to answer, not its default 20: under a fresh HOME it
    first creates and migrates its database, and on a loaded 2-core machine that took longer than
    20 s, so the README's first command failed ("Timed out while attempting to connect to
    ephemeral Prefect API server") before any work. A value set in the environment is kept."""
    if os.environ.get(_STARTUP_VARIABLE):
        yield
        return
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, temporary_settings

    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: EPHEMERAL_STARTUP_S}):
        yield


def _stop_cleanly() -> None:
    """However ``quantgate run`` is stopped, it leaves nothing running.

    SIGTERM exits through Python (``SystemExit``, status 143), so exit handlers run: Prefect's
    stops its ephemeral API server, which the default action (die at once) left running. During
    the flow Prefect's own handler comes first (``flow._steps_stopped_on_signal`` stops the
    steps) and then hands the signal on to this one. ``kill -9`` runs no handler at all: a
    watcher process (``reaper``) stops the run's children once it is gone.
    """
    reaper.watch(os.getpid())
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_signal)


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)
