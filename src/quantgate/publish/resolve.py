"""Which version a fleet node may load: the alias, checked, or a version it asked for.

The alias ``approved-<tenant>`` says which version; a version it does not point at is refused
unless the caller says ``allow_unapproved``. The alias alone is not trusted: ``Resolved`` carries
the version's signed approval (``approval``), which pull verifies before it reads a byte. A
version whose upload was never verified complete is refused always: no flag makes a partial
artifact loadable. ``approved_versions`` gives the gate what each tenant is served today, with
the gate report it was published with (refused past ``MAX_REPORT_BYTES`` before it is downloaded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantgate.contracts.report_schema import MAX_REPORT_BYTES, RECORDS_DIR
from quantgate.publish import naming, tracking
from quantgate.publish.config import RegistryConfig
from quantgate.publish.stores import open_store
from quantgate.runtime.errors import UnapprovedVersionError, UnknownModelError
from quantgate.runtime.suggest import did_you_mean


@dataclass(frozen=True)
class Resolved:
    """The version to load, where its bytes are, and what it must hash to."""

    registered_model: str
    version: str
    source: str
    content_hash: str
    manifest_sha256: str
    approved: bool  # the alias points at it (the signed approval is checked by pull)
    tags: dict[str, str] = field(default_factory=dict)  # the version's tags, approval included

    @property
    def where(self) -> str:
        """How messages name the version: registered model, version and the approval's tag."""
        return f"{self.registered_model} version {self.version} (tag {naming.APPROVAL})"


def _unknown_model(mlflow_client, name: str) -> UnknownModelError:
    names = [m.name for m in mlflow_client.search_registered_models(max_results=1000)]
    return UnknownModelError(
        None,
        f"no registered model '{name}' in the registry",
        did_you_mean(name, names, known="registered models")
        + "; check MODEL and --target (the name is <model>.<target>), and MLFLOW_TRACKING_URI",
    )


def _latest_complete(mlflow_client, name: str):
    found = mlflow_client.search_model_versions(
        f"name = '{tracking.quote(name)}' and tags.`{naming.UPLOAD}` = '{naming.UPLOAD_COMPLETE}'",
        order_by=["version_number DESC"],
        max_results=1,
    )
    return found[0] if found else None


def resolve(
    mlflow_client,
    name: str,
    tenant: str,
    version: str | None,
    allow_unapproved: bool,
    on_model: Callable[[Any], None] | None = None,
    channel: str = "stable",
) -> Resolved:
    """The version of ``name`` that ``tenant`` may load: the one its alias points at, or
    ``version`` if that is the one (or ``allow_unapproved``, which without a version takes the
    latest completely uploaded); UnknownModelError or UnapprovedVersionError otherwise.
    ``on_model``: called with the registered model as read, before its alias is looked at (pull
    checks the tenant's signed release record there). ``channel`` canary: follow ``canary-<tenant>``."""
    from mlflow.exceptions import MlflowException

    alias = naming.channel_alias(tenant, channel)
    try:
        model = mlflow_client.get_registered_model(name)
    except MlflowException as exc:
        if tracking.not_found(exc):
            raise _unknown_model(mlflow_client, name) from None
        raise
    if on_model is not None:
        on_model(model)
    approved_version = (model.aliases or {}).get(alias)
    wanted = version or approved_version
    if wanted is None:
        if not allow_unapproved:
            raise UnapprovedVersionError(
                None,
                f"no version of '{name}' is approved for tenant '{tenant}' (no alias '{alias}')",
                "wait for an approved publish, or pass --allow-unapproved (with --version) "
                "for a non-serving test",
            )
        latest = _latest_complete(mlflow_client, name)
        if latest is None:
            raise UnknownModelError(None, f"'{name}' has no completely uploaded version", "publish it first")
        wanted = latest.version
    try:
        mv = mlflow_client.get_model_version(name, str(wanted))
    except MlflowException as exc:
        if tracking.not_found(exc):
            raise UnknownModelError(
                None, f"'{name}' has no version {wanted}", "list versions in the MLflow UI"
            ) from None
        raise
    approved = approved_version is not None and str(approved_version) == str(mv.version)
    if not approved and not allow_unapproved:
        raise UnapprovedVersionError(
            None,
            f"version {mv.version} of '{name}' is not approved for tenant '{tenant}'"
            + (f" (alias '{alias}' points at version {approved_version})" if approved_version else ""),
            "pull the approved version (omit --version), or pass --allow-unapproved for a non-serving test",
        )
    tags = mv.tags or {}
    if tags.get(naming.UPLOAD) != naming.UPLOAD_COMPLETE or naming.CONTENT_HASH not in tags:
        raise UnapprovedVersionError(
            None,
            f"version {mv.version} of '{name}' has no verified upload "
            f"(tag {naming.UPLOAD} is not 'complete')",
            "run quantgate publish again for its report; it completes the upload",
        )
    return Resolved(
        name,
        str(mv.version),
        mv.source,
        tags[naming.CONTENT_HASH],
        tags.get(naming.MANIFEST_SHA256, ""),
        approved,
        dict(tags),
    )


@dataclass(frozen=True)
class Approved:
    """A version an ``approved-<tenant>`` alias points at, with what the gate compares against."""

    registered_model: str
    version: str
    tenants: tuple[str, ...]  # every tenant whose alias points at this version
    build_key: str | None
    report: Path | None  # its gate report (reports/report.json), downloaded; None: the store has none
    records: Path | None = None  # its per-item records (reports/records/<target>.json); None: none stored


def approved_versions(
    mlflow_client, cfg: RegistryConfig, name: str, dest: Path, target: str | None = None
) -> list[Approved]:
    """Every version of ``name`` an ``approved-<tenant>`` alias points at, each with the gate report
    published with it downloaded under ``dest`` (and, given its ``target``, that artifact's per-item
    records); [] when ``name`` is not registered. Registry failures are the caller's to type
    (``tracking.registry_errors``)."""
    from mlflow.exceptions import MlflowException

    try:
        model = mlflow_client.get_registered_model(name)
    except MlflowException as exc:
        if tracking.not_found(exc):
            return []
        raise
    by_version: dict[str, list[str]] = {}
    for alias, version in sorted((model.aliases or {}).items()):
        if alias.startswith(naming.ALIAS_PREFIX):
            by_version.setdefault(str(version), []).append(alias.removeprefix(naming.ALIAS_PREFIX))
    found = []
    for version, tenants in sorted(by_version.items(), key=lambda kv: int(kv[0])):
        mv = mlflow_client.get_model_version(name, version)
        run = mlflow_client.get_run(mv.run_id)
        where = Path(dest) / f"{name}-v{version}"
        rel = f"{naming.REPORTS_PATH}/report.json"
        store = open_store(run.info.artifact_uri, cfg)
        size = store.size(rel)
        report: Path | None = None
        if size is not None and size > MAX_REPORT_BYTES:  # read_report names the bound on a stand-in
            report = where / rel
            report.parent.mkdir(parents=True, exist_ok=True)
            with open(report, "wb") as fh:
                fh.truncate(size)  # sparse: the size without the bytes
        elif size is not None:
            try:
                store.download({rel: size}, where, lambda r, p: None, lambda n: None)
                report = where / rel
            except FileNotFoundError:
                report = None
        tags = mv.tags or {}
        records = _records(store, where, target)
        found.append(Approved(name, version, tuple(tenants), tags.get(naming.BUILD_KEY), report, records))
    return found


def _records(store, where: Path, target: str | None) -> Path | None:
    """The version's per-item records, downloaded when the store holds them (within the report's
    size bound: they are read whole); None for versions published before records were."""
    if target is None or "/" in target:
        return None
    rel = f"{naming.REPORTS_PATH}/{RECORDS_DIR}/{target}.json"
    size = store.size(rel)
    if size is None or size > naming.MAX_RECORDS_BYTES:
        return None
    try:
        store.download({rel: size}, where, lambda r, p: None, lambda n: None)
    except FileNotFoundError:
        return None
    return where / rel
