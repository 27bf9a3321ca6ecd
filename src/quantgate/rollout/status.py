"""What a router sets its weights from: ``quantgate rollout status --json``.

Both of the tenant's signed records (stable, canary) are verified under the fleet's trusted keys
and admitted by the router's ledger (``publish.ReleaseLedger``, the one pull keeps), so a record
older than one the router has already seen, or expired, is refused (exit 2) exactly as pull
refuses it: a registry put back to an older state cannot move traffic. The shares come from the
records, never from the aliases alone.
"""

from __future__ import annotations

from pathlib import Path

from quantgate.publish import (
    RegistryConfig,
    ReleaseLedger,
    alias_for,
    canary_alias_for,
    read_release,
    registered_model_name,
    registry_client,
    registry_errors,
    state_tag,
)


def rollout_status(cfg: RegistryConfig, model: str, target: str, tenant: str, ledger_root: Path) -> dict:
    """Versions, traffic shares, record sequences and the watcher's last decision for ``tenant``."""
    import json

    name = registered_model_name(model, target)
    alias_for(tenant)
    with registry_errors(cfg):
        found = registry_client(cfg).get_registered_model(name)
    tags, aliases = dict(found.tags or {}), {a: str(v) for a, v in (found.aliases or {}).items()}
    ledger = ReleaseLedger(ledger_root, cfg.model_registry_uri)
    records = {}
    for channel in ("stable", "canary"):
        record = read_release(tags, tenant, f"{name} ({channel} release record)", cfg, channel)
        if record is not None:
            ledger.admit(record, f"{name} ({channel} release record of tenant '{tenant}')")
        records[channel] = record
    stable, canary = records["stable"], records["canary"]
    running = canary is not None and canary.version is not None and canary.share is not None
    share = canary.share if canary is not None and canary.share is not None and running else 0.0
    shares: dict[str, float] = {}
    if stable is not None and stable.version is not None:
        shares[stable.version] = 1.0 - share
    if running and canary is not None and canary.version is not None:
        shares[canary.version] = shares.get(canary.version, 0.0) + share
    try:
        watcher = json.loads(tags.get(state_tag(tenant)) or "{}")
    except ValueError:
        watcher = {}

    def said(record):
        if record is None:
            return None
        return {
            "version": record.version,
            "sequence": record.sequence,
            "event": record.event,
            "share": record.share,
            "evidence_sha256": record.evidence_sha256,
            "expires_at": record.expires_at.isoformat(),
        }

    return {
        "registered_model": name,
        "tenant": tenant,
        "stable": said(stable),
        "canary": said(canary) if running else None,
        "shares": shares,
        "aliases": {
            alias_for(tenant): aliases.get(alias_for(tenant)),
            canary_alias_for(tenant): aliases.get(canary_alias_for(tenant)),
        },
        "last_decision": (watcher.get("outcome") or watcher.get("last"))
        if isinstance(watcher, dict)
        else None,
        "pending": isinstance(watcher, dict) and bool(watcher.get("pending")),
    }
