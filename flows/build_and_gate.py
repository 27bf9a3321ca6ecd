"""Deployment entrypoints (``prefect.yaml``): the flows live in ``quantgate.orchestrate.flow``.

``QUANTGATE_DASK_ADDRESS`` (a scheduler's address) makes the deployed flow fan its tasks out
over that Dask cluster; without it, tasks run in the worker's thread pool (heavy steps are
processes either way).
"""

import os

from quantgate.orchestrate.flow import build_and_gate as _build_and_gate
from quantgate.orchestrate.flow import regate
from quantgate.orchestrate.run import task_runner

_runner = task_runner(dask_address=os.environ.get("QUANTGATE_DASK_ADDRESS"))
build_and_gate = _build_and_gate.with_options(task_runner=_runner) if _runner else _build_and_gate

__all__ = ["build_and_gate", "regate"]
