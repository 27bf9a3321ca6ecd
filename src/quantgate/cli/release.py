"""``quantgate release``: an operator's rollback to an approved version, or a renewal, as a new
signed release record (``quantgate.publish.operator``); needs the pipeline's signing key."""

from __future__ import annotations

from typing import Annotated

import typer

from quantgate.cli.options import RootOpt
from quantgate.config import project_root
from quantgate.runtime.errors import UsageError


def release(
    model: Annotated[str, typer.Argument(help="Model name as published (the report's 'model').")],
    target: Annotated[str, typer.Option("--target", help="Hardware target, e.g. hopper-fp8.")],
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant whose release to change.")],
    version: Annotated[
        str | None,
        typer.Option(
            "--version", help="Release this version (one the gate approved for the tenant): a rollback."
        ),
    ] = None,
    reason: Annotated[
        str | None,
        typer.Option("--reason", help="Why (with --version): its digest is the record's evidence."),
    ] = None,
    renew: Annotated[
        bool,
        typer.Option("--renew", help="Re-sign the current release with a fresh expiry (a scheduled job's)."),
    ] = False,
    root: RootOpt = None,
) -> None:
    """Roll a tenant back to an approved version, or renew its release, as a new signed record."""
    from quantgate import publish
    from quantgate.publish import RegistryConfig, alias_for, registered_model_name
    from quantgate.runtime.escape import visible

    if renew == (version is not None):
        raise UsageError("--version", "give either --version N (a rollback) or --renew", "pass exactly one")
    if version is not None and reason is None:
        raise UsageError("--reason", "a rollback needs a reason", "pass --reason TEXT")
    name = registered_model_name(model, target)
    alias_for(tenant)
    cfg = RegistryConfig.from_env((root or project_root()).resolve())
    if version is not None:
        record = publish.roll_back(cfg, name, tenant, version, reason or "")
    else:
        record = publish.renew(cfg, name, tenant)
    print(
        visible(
            f"{name} {tenant}: release record {record.sequence} ({record.event}) releases "
            f"{record.releases()} until {record.expires_at.isoformat()}"
        )
    )
