"""Approvals as aliases: ``approved-<tenant>`` points at the version the gate passed.

Called only after a version exists, and a version exists only once its upload was verified
(see ``publish``), so an alias never points at a partial upload. Setting an alias that
points elsewhere moves it; a tenant that now fails this exact version loses its alias (an
approval withdrawn), while its alias on another version is left alone. Every move is
announced (``events``) so the fleet can pull the new version.

With the report's digest as ``evidence`` (publish holds the signing key), every approval and
every withdrawal is also a signed release record (``release``) with the next sequence number,
written before the alias moves: a pull installs only what the newest record releases, so an
alias put back after a withdrawal, with the old records, is a replay the fleet refuses.

A tenant whose rollout policy is a canary (``canary``: tenant -> traffic share) and that already
has an approved version gets the new one as ``canary-<tenant>`` instead, with a ``canary-started``
record on the canary channel: ``quantgate.rollout`` then promotes it or rolls it back on live
evidence. The first release of a tenant goes direct: there is nothing to compare it with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quantgate.publish import events, naming, release
from quantgate.publish.config import RegistryConfig


@dataclass
class AliasChanges:
    """The aliases one ``apply`` set (or found already set) and removed."""

    set: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def apply(
    mlflow_client,
    cfg: RegistryConfig,
    name: str,
    version,
    approved: list[str],
    failed: list[str],
    evidence: str | None = None,
    canary: dict[str, float] | None = None,
) -> AliasChanges:
    """Point ``approved-<tenant>`` at ``version`` for each approved tenant; take it off for each
    failed tenant whose alias points here. Every move is announced. With ``evidence`` (a digest:
    the gate report's), each approved tenant gets a release record releasing ``version`` and each
    failed tenant whose alias or own record points here one releasing nothing (``release``)."""
    changes = AliasChanges()
    model = mlflow_client.get_registered_model(name)
    current = {alias: str(v) for alias, v in (model.aliases or {}).items()}
    tags = dict(model.tags or {})
    target = str(version.version)
    content = version.tags.get(naming.CONTENT_HASH, "")
    manifest = version.tags.get(naming.MANIFEST_SHA256) or None
    for tenant in approved:
        alias = naming.alias_for(tenant)
        stable = current.get(alias)
        if canary and tenant in canary and stable is not None and stable != target and evidence is not None:
            changes.set.append(
                start_canary(
                    mlflow_client, cfg, name, tenant, target, manifest, content, evidence, canary[tenant]
                )
            )
            continue
        if evidence is not None:  # the record first: a node then sees no alias ahead of its record
            release.issue(
                mlflow_client,
                cfg,
                name,
                tenant,
                event="approved",
                version=target,
                manifest_sha256=manifest,
                evidence_sha256=evidence,
            )
        before = current.get(alias)
        if before != target:
            mlflow_client.set_registered_model_alias(name, alias, target)
            events.alias_moved(cfg, name, alias, target, before, content)
        changes.set.append(alias)
    for tenant in failed:
        alias = naming.alias_for(tenant)
        here = current.get(alias) == target
        if evidence is not None:
            recorded = release.own(tags, tenant, cfg)
            if here or (recorded is not None and recorded.version == target):
                release.issue(
                    mlflow_client,
                    cfg,
                    name,
                    tenant,
                    event="withdrawn",
                    version=None,
                    manifest_sha256=None,
                    evidence_sha256=evidence,
                )
        if here:
            mlflow_client.delete_registered_model_alias(name, alias)
            events.alias_moved(cfg, name, alias, None, target, content)
            changes.removed.append(alias)
    return changes


def start_canary(
    mlflow_client,
    cfg: RegistryConfig,
    name: str,
    tenant: str,
    version: str,
    manifest: str | None,
    content: str,
    evidence: str,
    share: float,
) -> str:
    """Release ``version`` to ``share`` of ``tenant``'s traffic: a ``canary-started`` record on the
    canary channel, then the ``canary-<tenant>`` alias (the record first, as for approvals)."""
    alias = naming.canary_alias_for(tenant)
    release.issue(
        mlflow_client,
        cfg,
        name,
        tenant,
        channel="canary",
        event="canary-started",
        version=version,
        manifest_sha256=manifest,
        evidence_sha256=evidence,
        share=share,
    )
    before = (mlflow_client.get_registered_model(name).aliases or {}).get(alias)
    if str(before) != version:
        mlflow_client.set_registered_model_alias(name, alias, version)
        events.alias_moved(cfg, name, alias, version, None if before is None else str(before), content)
    return alias
