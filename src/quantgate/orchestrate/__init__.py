"""Orchestration: the Prefect flows that run intake, builds, evaluations, the gate and publishing.

``flow.build_and_gate`` is the pipeline, asked by one ``request.RunRequest`` and ending in one
``outcome.RunOutcome``; ``run.run_flow`` runs it for ``quantgate run``
(ephemeral Prefect, or the server named by ``PREFECT_API_URL``); ``flows/`` at the project root
holds the entrypoints that ``prefect.yaml`` deploys.
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.orchestrate.canary import canary_watch
    from quantgate.orchestrate.outcome import RunOutcome
    from quantgate.orchestrate.plan import read_plan, resolve_plan
    from quantgate.orchestrate.repair_inputs import repair_command
    from quantgate.orchestrate.request import RunRequest, usage_error
    from quantgate.orchestrate.run import run_flow

__all__ = [
    "RunOutcome",
    "RunRequest",
    "canary_watch",
    "read_plan",
    "repair_command",
    "resolve_plan",
    "run_flow",
    "usage_error",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "RunOutcome": "outcome",
        "RunRequest": "request",
        "canary_watch": "canary",
        "read_plan": "plan",
        "repair_command": "repair_inputs",
        "resolve_plan": "plan",
        "run_flow": "run",
        "usage_error": "request",
    },
)
