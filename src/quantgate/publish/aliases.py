"""Approvals as aliases: ``approved-<tenant>`` points at the version the gate passed.

Called only after a version exists, and a version exists only once its upload was verified
(see ``publish``), so an alias never points at a partial upload. Setting an alias that
points elsewhere moves it; a tenant that now fails this exact version loses its alias (an
approval withdrawn), while its alias on another version is left alone. Every move is
announced (``events``) so the fleet can pull the new version.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantgate.publish import events, naming
from quantgate.publish.config import RegistryConfig


@dataclass
class AliasChanges:
    """The aliases one ``apply`` set (or found already set) and removed."""

    set: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def apply(
    mlflow_client, cfg: RegistryConfig, name: str, version, approved: list[str], failed: list[str]
) -> AliasChanges:
    """Point ``approved-<tenant>`` at ``version`` for each approved tenant; take it off for each
    failed tenant whose alias points here. Every move is announced."""
    changes = AliasChanges()
    current = {alias: str(v) for alias, v in (mlflow_client.get_registered_model(name).aliases or {}).items()}
    target = str(version.version)
    content = version.tags.get(naming.CONTENT_HASH, "")
    for tenant in approved:
        alias = naming.alias_for(tenant)
        before = current.get(alias)
        if before != target:
            mlflow_client.set_registered_model_alias(name, alias, target)
            events.alias_moved(cfg, name, alias, target, before, content)
        changes.set.append(alias)
    for tenant in failed:
        alias = naming.alias_for(tenant)
        if current.get(alias) == target:
            mlflow_client.delete_registered_model_alias(name, alias)
            events.alias_moved(cfg, name, alias, None, target, content)
            changes.removed.append(alias)
    return changes
