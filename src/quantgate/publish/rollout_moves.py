"""The registry side of a rollout: what a canary watcher reads, and the moves it makes.

Every move is idempotent, so that a watcher killed anywhere and run again finishes the move
instead of doubling it: ``issue_once`` signs a record only when the newest record on its channel
is not already that move (same event, version and evidence digest), and ``point_alias`` moves an
alias only when it points elsewhere. The watcher's state between looks is one registered-model
tag (``quantgate.rollout.<tenant>``, JSON), written in one call, so it is never half written; it
lives in the registry, never on the worker's disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from quantgate.publish import events, naming, release
from quantgate.publish.config import RegistryConfig
from quantgate.publish.release import ReleaseRecord

MAX_STATE_CHARS = 100_000  # MLflow's limit for a registry tag's value


@dataclass
class RolloutView:
    """One tenant's rollout as the registry holds it now."""

    name: str
    tenant: str
    aliases: dict[str, str]
    stable: ReleaseRecord | None  # the newest stable record this pipeline signed
    canary: ReleaseRecord | None  # the newest canary record this pipeline signed
    state: dict = field(default_factory=dict)  # the watcher's state tag (empty: none)


def state_tag(tenant: str) -> str:
    """The registered-model tag holding the watcher's state for ``tenant``."""
    return f"{naming.ROLLOUT_STATE}.{tenant}"


def read_view(mlflow_client, cfg: RegistryConfig, name: str, tenant: str) -> RolloutView:
    """The tenant's aliases, own records (stable, canary) and watcher state on ``name``."""
    model = mlflow_client.get_registered_model(name)
    tags = dict(model.tags or {})
    try:
        state = json.loads(tags.get(state_tag(tenant)) or "{}")
    except ValueError:
        state = {}
    return RolloutView(
        name=name,
        tenant=tenant,
        aliases={a: str(v) for a, v in (model.aliases or {}).items()},
        stable=release.own(tags, tenant, cfg, "stable"),
        canary=release.own(tags, tenant, cfg, "canary"),
        state=state if isinstance(state, dict) else {},
    )


def write_state(mlflow_client, name: str, tenant: str, state: dict) -> None:
    """Store the watcher's state in one tag write."""
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    if len(text) > MAX_STATE_CHARS:
        raise ValueError(f"rollout state of {len(text):,} characters is over the registry's limit")
    mlflow_client.set_registered_model_tag(name, state_tag(tenant), text)


def issue_once(
    mlflow_client, cfg: RegistryConfig, name: str, tenant: str, channel: release.Channel, **fields
) -> ReleaseRecord:
    """The record ``fields`` describe on ``channel``: the newest one if it already is that move,
    else a new signed record (``release.issue``)."""
    tags = dict(mlflow_client.get_registered_model(name).tags or {})
    current = release.own(tags, tenant, cfg, channel)
    same = ("event", "version", "evidence_sha256")
    if current is not None and all(getattr(current, k) == fields.get(k) for k in same):
        return current
    return release.issue(mlflow_client, cfg, name, tenant, channel=channel, **fields)


def point_alias(
    mlflow_client, cfg: RegistryConfig, name: str, alias: str, version: str | None, content: str = ""
) -> bool:
    """Point ``alias`` at ``version`` (None: remove it), announcing a move; False when already so."""
    before = (mlflow_client.get_registered_model(name).aliases or {}).get(alias)
    before = None if before is None else str(before)
    if before == version:
        return False
    if version is None:
        mlflow_client.delete_registered_model_alias(name, alias)
    else:
        mlflow_client.set_registered_model_alias(name, alias, version)
    events.alias_moved(cfg, name, alias, version, before, content)
    return True
