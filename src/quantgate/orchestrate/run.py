"""``quantgate run``: the whole pipeline as one Prefect flow run, with or without a server.

Without ``PREFECT_API_URL`` Prefect starts an ephemeral API for the run; with it, the run is
recorded on that server like any deployment's. Tasks run in threads by default (heavy steps are
processes anyway), or on Dask to fan builds and evaluations out over a cluster.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from quantgate.errors import QuantgateError
from quantgate.orchestrate.flow import OUTCOME, build_and_gate


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


def run_flow(*, dask_workers: int = 0, dask_address: str | None = None, **parameters: Any):
    """Run ``build_and_gate(**parameters)``; returns ``(outcome dict or None, final state)``.

    Raises the run's own ``QuantgateError`` (bad input, say) so the command line exits with
    its code and message rather than a Prefect traceback.
    """
    out = Path(parameters.get("out", "runs")).resolve()
    (out / OUTCOME).unlink(missing_ok=True)  # only this run's outcome may be reported
    runner = task_runner(dask_workers, dask_address)
    flow_fn = build_and_gate.with_options(task_runner=runner) if runner else build_and_gate
    # the ephemeral API server is a child process: it reads this from the environment
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    state = flow_fn(**parameters, return_state=True)
    outcome_path = out / OUTCOME
    if outcome_path.exists():
        return json.loads(outcome_path.read_text()), state
    error = state.result(raise_on_failure=False)
    if isinstance(error, QuantgateError):
        raise error
    return None, state
