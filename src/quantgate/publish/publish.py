"""Publish a gated build: one MLflow run and model version per artifact, aliases per tenant.

The order is the guarantee. Before anything reaches the registry, every file name in every
manifest must be a safe relative path (``safe_path``) naming a regular file inside its artifact,
and the signing key must be there. For each artifact: verify the local files against the
manifest; find a version with the same content hash (publishing twice creates no second
version); else find the run an interrupted publish left behind, or create one; sign the
manifest; upload it, its signature and the files (skipping objects already there intact);
verify the store's copy; mark the run complete; only then register the version, with its
lineage tags in the same call. Two publishes of the same content racing past the first check
each register a version; the one with the higher number then sees the lower one and deletes its
own, so one version remains. Aliases and the gate's tags come last, aliases only for tenants the
gate approved, so no alias can ever point at a version whose bytes were not verified.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantgate.artifact import MANIFEST, Manifest, read_manifest, require_manifest, verify_files
from quantgate.errors import ArtifactAlteredError, ReportError, UnsafePathError, UploadIncompleteError
from quantgate.hashing import content_hash, sha256_file
from quantgate.progress import SILENT, Progress
from quantgate.publish import aliases, naming, signing, tracking
from quantgate.publish.config import RegistryConfig
from quantgate.publish.lineage import lineage_tags, run_metrics, run_params
from quantgate.publish.store import ArtifactStore, Digest, join, open_store
from quantgate.report_schema import Report, read_report
from quantgate.safe_path import safe_relpath

REPORT_FILES = ("report.json", "report.md", "report.html")


class PublishedArtifact(BaseModel):
    """What publishing one artifact did: its version, whether new, aliases set and removed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    artifact: str  # the target name, as in the report
    registered_model: str
    version: str
    created: bool  # False: a version with the same content hash was already registered
    aliases: list[str]  # aliases this publish pointed at the version
    removed_aliases: list[str]  # aliases of tenants that now fail, taken off this version
    approved_tenants: list[str]
    content_hash: str
    source: str  # where the version's bytes are (the artifact directory in the store)
    run_id: str


class PublishOutcome(BaseModel):
    """Every artifact one ``publish_report`` published, and where."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tracking_uri: str
    model: str
    artifacts: list[PublishedArtifact]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict (for flow results and ``quantgate publish --json``)."""
        return self.model_dump(mode="json")


def publish_report(
    report_json: Path,
    artifacts_dir: Path,
    cfg: RegistryConfig,
    progress: Progress = SILENT,
    *,
    record_failed: bool = True,
) -> PublishOutcome:
    """Publish every artifact the report gated; alias each for the tenants it passed.

    A report whose run failed (a non-zero exit code) is refused: nothing is published on failure. An
    artifact that passed no tenant is still recorded for audit (``record_failed``) but gets
    no alias.
    """
    report_json = Path(report_json)
    report = read_report(report_json)
    if report.exit_code != 0:
        raise ReportError(
            report_json,
            f"the gate failed this run (exit code {report.exit_code})",
            "publish only a report whose required artifacts passed; fix or re-gate first",
        )
    manifests = {}
    for artifact in report.approvals:
        manifest = read_manifest(Path(artifacts_dir) / artifact)
        if manifest is None and (Path(artifacts_dir) / artifact / MANIFEST).is_file():
            require_manifest(Path(artifacts_dir) / artifact)  # there but invalid: names its problem
        if manifest is None:
            raise ReportError(
                Path(artifacts_dir) / artifact / MANIFEST,
                f"artifact '{artifact}' has no valid manifest",
                "pass --artifacts the directory quantgate build wrote for this report",
            )
        _check_names(Path(artifacts_dir) / artifact, manifest)
        manifests[artifact] = manifest
    signing.signing_key(cfg)  # refused (or a SQLite registry's own pair made) before any registry call
    reports = {
        f"{naming.REPORTS_PATH}/{name}": report_json.parent / name
        for name in REPORT_FILES
        if (report_json.parent / name).is_file()
    }
    report_sha256 = sha256_file(report_json).sha256
    mlflow_client = tracking.client(cfg)
    published = []
    with tracking.registry_errors(cfg):
        for artifact, manifest in manifests.items():
            if not report.approvals[artifact] and not record_failed:
                continue
            job = _Job(artifact, Path(artifacts_dir) / artifact, manifest, report, reports, report_sha256)
            published.append(_publish_one(job, mlflow_client, cfg, progress))
    return PublishOutcome(tracking_uri=cfg.tracking_uri, model=report.model, artifacts=published)


def _check_names(directory: Path, manifest: Manifest) -> None:
    """Every name in the manifest: a safe relative path (exit 2 otherwise) to a regular file that
    is inside ``directory``, reached through no symbolic link, so publish reads nothing outside
    the artifact and writes nothing outside the store's artifact directory."""
    where = directory / MANIFEST
    root = directory.resolve()
    for rel in manifest.files:
        safe_relpath(rel, str(where))
        if rel in (MANIFEST, signing.SIGNATURE):
            raise UnsafePathError(
                where, f"file name {rel!r} is reserved for quantgate's own files", "rebuild the artifact"
            )
        path = directory / rel
        if path.is_symlink() or not path.resolve().is_relative_to(root):
            raise ArtifactAlteredError(
                path,
                "is a symbolic link or reached through one that leaves the artifact directory",
                "rebuild the artifact with quantgate build; publish reads only regular files inside it",
            )


class _Job:
    """One artifact to publish and what it is published with."""

    def __init__(
        self,
        artifact: str,
        directory: Path,
        manifest: Manifest,
        report: Report,
        reports: dict[str, Path],
        report_sha256: str,
    ) -> None:
        self.artifact, self.directory, self.manifest, self.report = artifact, directory, manifest, report
        self.reports, self.report_sha256 = reports, report_sha256
        self.name = naming.registered_model_name(report.model, artifact)
        self.content_hash = content_hash(manifest.files)
        self.approved = list(report.approvals[artifact])
        self.manifest_sha256 = sha256_file(directory / MANIFEST).sha256
        self.tags = lineage_tags(manifest, self.content_hash, self.manifest_sha256, report_sha256)


def _publish_one(job: _Job, mlflow_client, cfg: RegistryConfig, progress: Progress) -> PublishedArtifact:
    tracking.ensure_registered_model(
        mlflow_client, job.name, {"quantgate.model": job.report.model, naming.TARGET: job.artifact}
    )
    version = _complete_version(mlflow_client, job)
    created = version is None
    if version is None:
        version = _upload_and_register(job, mlflow_client, cfg, progress)
        first = _complete_version(mlflow_client, job)  # a concurrent publish of the same content
        if first is not None and str(first.version) != str(version.version):
            mlflow_client.delete_model_version(job.name, version.version)
            progress.log(
                f"{job.name}: version {first.version} holds this content; version {version.version} removed"
            )
            version, created = first, False
    else:  # the approval must still be about these bytes: the local copy must match its manifest
        problems = verify_files(job.directory, job.manifest)
        if problems:
            raise ArtifactAlteredError(
                job.directory,
                f"differs from its manifest: {problems[0]}",
                "rebuild the artifact with quantgate build; never edit an artifact by hand",
            )
        progress.log(
            f"{job.name}: content {job.content_hash[:12]} already registered as version {version.version}"
        )
        if naming.SIGNED_BY not in (version.tags or {}):  # published before manifests were signed
            _sign_existing(job, mlflow_client, cfg, version)
    moved = aliases.apply(
        mlflow_client, cfg, job.name, version, job.approved, job.report.failed_tenants(job.artifact)
    )
    gate_tags = {
        **_parent_version(mlflow_client, job),
        naming.APPROVED_TENANTS: ",".join(job.approved),
        naming.GATE: "approved" if job.approved else "failed",
        naming.REPORT_SHA256: job.report_sha256,
    }
    for key, value in gate_tags.items():
        mlflow_client.set_model_version_tag(job.name, version.version, key, value)
    return PublishedArtifact(
        artifact=job.artifact,
        registered_model=job.name,
        version=str(version.version),
        created=created,
        aliases=moved.set,
        removed_aliases=moved.removed,
        approved_tenants=job.approved,
        content_hash=job.content_hash,
        source=version.source,
        run_id=version.run_id or "",
    )


def _parent_version(mlflow_client, job: _Job) -> dict[str, str]:
    """A repaired variant's lineage: the registered version of the uniform build it repairs, if any."""
    repair = job.manifest.repair
    if repair is None:
        return {}
    found = mlflow_client.search_model_versions(
        f"name = '{tracking.quote(job.name)}' and tags.`{naming.BUILD_KEY}` = '{repair.parent_build_key}'",
        order_by=["version_number ASC"],
    )
    return {naming.REPAIR_PARENT_VERSION: str(found[0].version)} if found else {}


def _complete_version(mlflow_client, job: _Job):
    found = mlflow_client.search_model_versions(
        f"name = '{tracking.quote(job.name)}' and tags.`{naming.CONTENT_HASH}` = '{job.content_hash}'"
        f" and tags.`{naming.UPLOAD}` = '{naming.UPLOAD_COMPLETE}'",
        order_by=["version_number ASC"],
    )
    return found[0] if found else None


def _find_or_create_run(mlflow_client, cfg: RegistryConfig, job: _Job):
    """The run an interrupted publish of the same content left behind, or a new one."""
    from mlflow.entities import Metric, Param

    experiment = tracking.experiment_id(
        mlflow_client, cfg, naming.experiment_name(job.report.model), job.report.model
    )
    runs = mlflow_client.search_runs(
        [experiment],
        f"tags.`{naming.CONTENT_HASH}` = '{job.content_hash}'"
        f" and tags.`{naming.REGISTERED_MODEL}` = '{tracking.quote(job.name)}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if runs:
        return runs[0], True
    run = mlflow_client.create_run(
        experiment,
        run_name=f"{job.artifact}-{job.content_hash[:12]}",
        tags={**job.tags, naming.REGISTERED_MODEL: job.name, naming.UPLOAD: "started"},
    )
    stamp = run.info.start_time or 0
    mlflow_client.log_batch(  # one call: a run never has half its params
        run.info.run_id,
        metrics=[Metric(k, v, stamp, 0) for k, v in run_metrics(job.report, job.artifact).items()],
        params=[Param(k, v) for k, v in run_params(job.manifest).items()],
    )
    return run, False


def _local_digests(job: _Job, store: ArtifactStore) -> dict[str, tuple[Path, Digest]]:
    """Every file to upload, hashed once; the artifact's files must match its manifest."""
    present = {p.relative_to(job.directory).as_posix() for p in job.directory.rglob("*") if p.is_file()} - {
        MANIFEST
    }
    extra = sorted(present - set(job.manifest.files))
    if extra:
        raise ArtifactAlteredError(
            job.directory / extra[0],
            "file not listed in the manifest",
            "rebuild the artifact with quantgate build; never edit an artifact by hand",
        )
    files: dict[str, tuple[Path, Digest]] = {}
    for rel, entry in job.manifest.files.items():
        path = job.directory / rel
        digest = store.digest(path) if path.is_file() else None
        if digest is None or (digest.sha256, digest.bytes) != (entry.sha256, entry.bytes):
            raise ArtifactAlteredError(
                path,
                "missing or different from its manifest entry",
                "rebuild the artifact with quantgate build; never edit an artifact by hand",
            )
        files[f"{naming.ARTIFACT_PATH}/{rel}"] = (path, digest)
    for rel, path in job.reports.items():
        files[rel] = (path, store.digest(path))
    return files


def _end_run(mlflow_client, run_id: str, status: str) -> None:
    """End the run; MLflow prints the run's URL to stdout here, which belongs to our output
    (``quantgate publish --json``), so it goes to stderr."""
    with contextlib.redirect_stdout(sys.stderr):
        mlflow_client.set_terminated(run_id, status)


def _signed_manifest(job: _Job, cfg: RegistryConfig, tmp: Path) -> tuple[Path, Path, str]:
    """A copy of the manifest with exactly the bytes the version registers, its signature file
    beside it (both named as in the store), and the signing key's id."""
    manifest = tmp / MANIFEST
    shutil.copyfile(job.directory / MANIFEST, manifest)
    if sha256_file(manifest).sha256 != job.manifest_sha256:
        raise ArtifactAlteredError(
            job.directory / MANIFEST,
            "changed while it was being published",
            "publish again once nothing writes to the artifact",
        )
    signature = tmp / signing.SIGNATURE
    signature.write_bytes(signing.sign(manifest, cfg))
    return manifest, signature, signing.key_id(signing.signing_key(cfg))


def _sign_existing(job: _Job, mlflow_client, cfg: RegistryConfig, version) -> None:
    """Sign a version registered before manifests were signed: its signature goes beside its
    manifest in the store (verified there), then the tag that says who signed."""
    store = open_store(version.source, cfg)
    with tempfile.TemporaryDirectory(prefix="quantgate-sign-") as tmp:
        _, signature, key = _signed_manifest(job, cfg, Path(tmp))
        digest = store.digest(signature)
        store.upload({signing.SIGNATURE: (signature, digest)}, lambda n: None)
        problems = store.verify({signing.SIGNATURE: digest})
        if problems:
            raise UploadIncompleteError(f"{job.name}: {problems[0]}. Fix: run quantgate publish again")
    mlflow_client.set_model_version_tag(job.name, version.version, naming.SIGNED_BY, key)


def _upload_and_register(job: _Job, mlflow_client, cfg: RegistryConfig, progress: Progress):
    run, resumed = _find_or_create_run(mlflow_client, cfg, job)
    run_id = run.info.run_id
    store = open_store(run.info.artifact_uri, cfg)
    files = _local_digests(job, store)
    with tempfile.TemporaryDirectory(prefix="quantgate-sign-") as tmp:
        manifest, signature, key = _signed_manifest(job, cfg, Path(tmp))
        for path in (manifest, signature):
            files[f"{naming.ARTIFACT_PATH}/{path.name}"] = (path, store.digest(path))
        total = sum(d.bytes for _, d in files.values())
        progress.log(
            f"{job.name}: {'resuming' if resumed else 'uploading'} {len(files)} files to {store.uri}"
        )
        try:
            with progress.task(f"upload {job.name}", total) as bar:
                store.upload(files, bar.advance)
            problems = store.verify({rel: digest for rel, (_, digest) in files.items()})
            if problems:
                raise UploadIncompleteError(
                    f"{job.name}: the store's copy does not match the manifest after upload: "
                    f"{'; '.join(problems[:5])}. No version or alias was created. "
                    "Fix: run quantgate publish again; it re-uploads what differs"
                )
        except BaseException:
            _end_run(mlflow_client, run_id, "FAILED")
            raise
    mlflow_client.set_tag(run_id, naming.UPLOAD, naming.UPLOAD_COMPLETE)
    _end_run(mlflow_client, run_id, "FINISHED")
    version = mlflow_client.create_model_version(
        job.name,
        source=join(run.info.artifact_uri, naming.ARTIFACT_PATH),
        run_id=run_id,
        tags={**job.tags, naming.UPLOAD: naming.UPLOAD_COMPLETE, naming.SIGNED_BY: key},
        description=f"{job.artifact} of {job.report.model}, content {job.content_hash[:12]}",
    )
    progress.log(f"{job.name}: registered version {version.version}")
    return version


def withdraw_failed(report_json: Path, artifacts_dir: Path, cfg: RegistryConfig) -> dict[str, list[str]]:
    """A failed run publishes nothing, but it may still *withdraw* approvals.

    Re-gating against tightened floors is exactly when a version already in the registry stops
    passing a tenant; its ``approved-<tenant>`` alias must not keep pointing at it. For every
    artifact of the report whose content is already registered, the aliases of the tenants it
    now fails are removed (announced like any move); nothing is uploaded, registered or set.
    Returns ``{registered model: [aliases removed]}``.
    """
    report_json = Path(report_json)
    report = read_report(report_json)
    removed: dict[str, list[str]] = {}
    mlflow_client = tracking.client(cfg)
    with tracking.registry_errors(cfg):
        for artifact in report.approvals:
            manifest = read_manifest(Path(artifacts_dir) / artifact)
            if manifest is None:
                continue
            name = naming.registered_model_name(report.model, artifact)
            found = mlflow_client.search_model_versions(
                f"name = '{tracking.quote(name)}' and tags.`{naming.CONTENT_HASH}` = '{content_hash(manifest.files)}'"
            )
            for version in found:
                moved = aliases.apply(mlflow_client, cfg, name, version, [], report.failed_tenants(artifact))
                if moved.removed:
                    removed.setdefault(name, []).extend(moved.removed)
    return removed
