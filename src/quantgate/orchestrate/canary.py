"""The Prefect flow ``canary_watch``: one look at one tenant's canary per run, deployed on a schedule.

A thin wrapper around ``quantgate.rollout.watch_once`` (the library runs and is tested without
Prefect): the flow resolves the tenant's policy from gates.yaml and the evidence source, takes
the look, and publishes the decision as a Markdown artifact. It keeps nothing on the worker:
the state between looks, and a move a killed run left half done, are in the registry, so any
worker may take the next run, and a run killed anywhere is completed by the next one.

The evidence source is named by the same options as ``quantgate rollout watch``
(``quantgate.rollout.SourceOptions``): ``prometheus`` or ``telemetry`` (the built-in reader of
Prometheus, with ``logs`` adding request-log errors), or ``live`` (a JSON file), or ``source``
(``"module:factory"``, a callable taking ``(root)``); ``replay`` adds a replay JSON file, or
``replay_stable`` and ``replay_canary`` name the two endpoints, and each run replays a new seeded
sample of logged prompts (``replay_prompts``, default ``logs``) through both, keeping the pairs in
the store (``replay_store``) so a re-run after a kill reuses them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from quantgate.runtime.errors import UsageError


@flow(name="canary-watch", validate_parameters=True)
def canary_watch(
    model: str,
    target: str,
    tenant: str,
    root: str = ".",
    source: str | None = None,
    live: str | None = None,
    replay: str | None = None,
    prometheus: str | None = None,
    telemetry: str | None = None,
    engine: str | None = None,
    logs: list[str] | None = None,
    served_model: str | None = None,
    replay_stable: str | None = None,
    replay_canary: str | None = None,
    replay_prompts: list[str] | None = None,
    replay_store: str | None = None,
    replay_size: int = 16,
    replay_max_tokens: int = 32,
) -> dict[str, Any]:
    """One look at ``tenant``'s canary of ``model`` on ``target``: finish a pending move, or decide and act."""
    from quantgate.config import load_rollout
    from quantgate.publish import RegistryConfig
    from quantgate.rollout import SourceOptions, evidence_source, watch_once

    project = Path(root).resolve()
    policies = load_rollout(project / "gates.yaml")
    if tenant not in policies:
        raise UsageError("tenant", f"gates.yaml has no tenant '{tenant}'", f"known: {', '.join(policies)}")
    policy, confidence = policies[tenant]
    cfg = RegistryConfig.from_env(project)
    options = SourceOptions(
        source=source,
        live=Path(live) if live else None,
        replay=Path(replay) if replay else None,
        prometheus=prometheus,
        telemetry=Path(telemetry) if telemetry else None,
        engine=engine,
        logs=tuple(logs or ()),
        served_model=served_model,
        replay_stable=replay_stable or None,
        replay_canary=replay_canary or None,
        replay_prompts=tuple(replay_prompts or ()),
        replay_store=replay_store or None,
        replay_size=replay_size,
        replay_max_tokens=replay_max_tokens,
    )
    outcome = watch_once(
        cfg, model, target, tenant, policy, confidence, evidence_source(project, cfg, options)
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
