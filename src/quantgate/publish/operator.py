"""What an operator does to a tenant's release by hand: roll back to an approved version, or renew.

Both are new signed release records (``release``) with the next sequence number, so the fleet
tells them apart from a replay of an older record: a rollback releases another version the gate
approved for the tenant (its signed approval, by the publisher's key, must say pass) and moves
the alias there; a renewal re-signs the current state with a fresh expiry (TUF's timestamp role:
run it from a scheduled job more often than ``release_ttl_hours``). Both need the signing key,
which is what makes them the pipeline's acts and not a registry writer's.
"""

from __future__ import annotations

from quantgate.publish import approval, events, naming, release, tracking
from quantgate.publish.approval import Approval
from quantgate.publish.config import RegistryConfig
from quantgate.publish.release import ReleaseRecord
from quantgate.runtime.errors import UnapprovedVersionError, UnknownModelError, UsageError


def _approved(
    mlflow_client, cfg: RegistryConfig, name: str, version: str, tenant: str
) -> tuple[Approval, str]:
    """(version's signed approval, its content hash), once the publisher's key signed it and it
    passes ``tenant``; UnapprovedVersionError (exit 2) otherwise."""
    from mlflow.exceptions import MlflowException

    try:
        mv = mlflow_client.get_model_version(name, version)
    except MlflowException as exc:
        if tracking.not_found(exc):
            raise UnknownModelError(
                None, f"'{name}' has no version {version}", "list its versions in the MLflow UI"
            ) from None
        raise
    tags = mv.tags or {}
    signed = approval.previous(tags, cfg)
    where = f"{name} version {version} (tag {naming.APPROVAL})"
    if tags.get(naming.UPLOAD) != naming.UPLOAD_COMPLETE or signed is None:
        raise UnapprovedVersionError(
            where,
            "has no verified upload and signed approval of this pipeline's key",
            "publish its gate report (quantgate publish) first",
        )
    if (signed.registered_model, signed.version) != (name, str(version)) or not signed.approves(tenant):
        raise UnapprovedVersionError(
            where,
            f"the gate did not approve version {version} for tenant '{tenant}' (signed approval: "
            f"{', '.join(signed.tenants) or 'no tenant'}); only an approved version can be released",
            "release a version the gate passed for this tenant, or gate this one again",
        )
    return signed, tags.get(naming.CONTENT_HASH, "")


def roll_back(cfg: RegistryConfig, name: str, tenant: str, version: str, reason: str) -> ReleaseRecord:
    """Release ``version`` (approved for ``tenant``) as the newest record, and point the alias at it."""
    if not reason.strip():
        raise UsageError("--reason", "is empty", "say why (it is kept as the record's evidence digest)")
    mlflow_client = tracking.client(cfg)
    with tracking.registry_errors(cfg):
        signed, content = _approved(mlflow_client, cfg, name, version, tenant)
        record = release.issue(
            mlflow_client,
            cfg,
            name,
            tenant,
            event="rollback",
            version=str(version),
            manifest_sha256=signed.manifest_sha256,
            evidence_sha256=release.evidence(reason),
        )
        alias = naming.alias_for(tenant)
        before = (mlflow_client.get_registered_model(name).aliases or {}).get(alias)
        if str(before) != str(version):
            mlflow_client.set_registered_model_alias(name, alias, str(version))
            events.alias_moved(
                cfg, name, alias, str(version), None if before is None else str(before), content
            )
    return record


def renew(cfg: RegistryConfig, name: str, tenant: str) -> ReleaseRecord:
    """The current release re-signed with a fresh expiry; for a tenant released before records
    existed, the first record, from its alias (whose version the gate must have approved)."""
    from mlflow.exceptions import MlflowException

    mlflow_client = tracking.client(cfg)
    with tracking.registry_errors(cfg):
        try:
            model = mlflow_client.get_registered_model(name)
        except MlflowException as exc:
            if tracking.not_found(exc):
                raise UnknownModelError(
                    None, f"no registered model '{name}'", "check MODEL and --target"
                ) from None
            raise
        current = release.own(dict(model.tags or {}), tenant, cfg)
        if current is not None:
            fields = {
                "version": current.version,
                "manifest_sha256": current.manifest_sha256,
                "evidence_sha256": current.evidence_sha256,
            }
        else:
            alias = (model.aliases or {}).get(naming.alias_for(tenant))
            if alias is None:
                raise UnapprovedVersionError(
                    name,
                    f"nothing is released to tenant '{tenant}' (no release record, no alias "
                    f"'{naming.alias_for(tenant)}')",
                    "publish a gate report that approves a version for it",
                )
            signed, _ = _approved(mlflow_client, cfg, name, str(alias), tenant)
            fields = {
                "version": str(alias),
                "manifest_sha256": signed.manifest_sha256,
                "evidence_sha256": signed.report_sha256,
            }
        return release.issue(mlflow_client, cfg, name, tenant, event="renewed", **fields)
