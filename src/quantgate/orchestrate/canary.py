"""The Prefect flow ``canary_watch``: one look at one tenant's canary per run, deployed on a schedule.

A thin wrapper around ``quantgate.rollout.watch_once`` (the library runs and is tested without
Prefect): the flow resolves the tenant's policy from gates.yaml and the evidence source, takes
the look, and publishes the decision as a Markdown artifact. It keeps nothing on the worker:
the state between looks, and a move a killed run left half done, are in the registry, so any
worker may take the next run, and a run killed anywhere is completed by the next one.

The evidence source is named, not built in: ``source`` is ``"module:factory"``, a callable taking
``(root)`` and returning an ``EvidenceSource`` (the Prometheus and request-log readers, the replay
runner), or, without it, ``live``/``replay`` JSON files (``quantgate.rollout.FileEvidence``).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from quantgate.errors import UsageError


def evidence_source(root: Path, source: str | None, live: str | None, replay: str | None):
    """The look's ``EvidenceSource``: ``source`` ("module:factory") called with ``root``, or the files."""
    from quantgate.rollout import FileEvidence

    if source:
        module, _, attr = source.partition(":")
        if not attr:
            raise UsageError(
                "source", f"'{source}' is not 'module:factory'", "name a callable as module:attr"
            )
        return getattr(importlib.import_module(module), attr)(root)
    if not live:
        raise UsageError("source", "no evidence source", "pass source (module:factory) or live (a JSON file)")
    return FileEvidence(Path(live), Path(replay) if replay else None)


@flow(name="canary-watch", validate_parameters=True)
def canary_watch(
    model: str,
    target: str,
    tenant: str,
    root: str = ".",
    source: str | None = None,
    live: str | None = None,
    replay: str | None = None,
) -> dict[str, Any]:
    """One look at ``tenant``'s canary of ``model`` on ``target``: finish a pending move, or decide and act."""
    from quantgate.config import load_rollout
    from quantgate.publish import RegistryConfig
    from quantgate.rollout import watch_once

    project = Path(root).resolve()
    policies = load_rollout(project / "gates.yaml")
    if tenant not in policies:
        raise UsageError("tenant", f"gates.yaml has no tenant '{tenant}'", f"known: {', '.join(policies)}")
    policy, confidence = policies[tenant]
    outcome = watch_once(
        RegistryConfig.from_env(project),
        model,
        target,
        tenant,
        policy,
        confidence,
        evidence_source(project, source, live, replay),
    )
    get_run_logger().info("canary %s %s %s: %s (%s)", model, target, tenant, outcome.action, outcome.reason)
    create_markdown_artifact(
        key=f"canary-{tenant}".lower(),
        markdown=f"**{outcome.action}** at look {outcome.look}: {outcome.reason}\n\n```json\n"
        + json.dumps(outcome.to_dict(), indent=1)[:20_000]
        + "\n```",
        description=f"canary watch of {model} {target} for {tenant}",
    )
    return outcome.to_dict()
