"""Publish a gated build: one MLflow run and model version per artifact, aliases per tenant.

The order is the guarantee, and a report is published whole or not at all. First, before any
registry call, every artifact of the report is checked: its name and every tenant's are valid
registry names, its manifest is valid and about the target it is gated as, every file name in it
is a safe relative path (``safe_path``) to a regular file inside the artifact, every file matches
the manifest and no other file is there, and the signing key is there. One bad artifact refuses
the whole report (exit 2) with nothing registered: a report with one invalid artifact name used to
publish and alias the valid one first. Then, for each artifact: find a version with the same
content hash (publishing twice creates no second version); else find the run an interrupted
publish left behind, or create one; sign the manifest; upload it, its signature and the files
(skipping objects already there intact); verify the store's copy; mark the run complete; only
then register the version, with its lineage tags in the same call. Two publishes of the same
content racing past the first check each register a version; the one with the higher number then
sees the lower one and deletes its own, so one version remains. Last, once every version of the
report exists: per version the gate's signed approval (``approval``: verdicts per tenant, bound to
model, target, version, source, build key and manifest), then per tenant a signed release record
(``release``: the next sequence number, an expiry, the version released or none) and its alias,
only for tenants the gate approved, so no alias can ever point at a version whose bytes were not
verified or whose approval was not signed, and a transient failure part-way leaves no alias moved.

SIGTERM during ``quantgate publish`` (a cancelled CI job) ends it as an exception, so the
temporary copies it was writing are removed (``local_store``); SIGKILL's are removed by the re-run.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantgate.contracts.artifact import MANIFEST, Manifest, read_manifest, require_manifest, verify_files
from quantgate.contracts.report_schema import RECORDS_DIR, Report, read_report
from quantgate.fleet import TORRENT, make_torrent, torrent_info_hash
from quantgate.publish import aliases, approval, naming, signing, tracking
from quantgate.publish.config import RegistryConfig
from quantgate.publish.lineage import lineage_tags, run_metrics, run_params
from quantgate.publish.store import ArtifactStore, Digest, join
from quantgate.publish.stores import open_store
from quantgate.runtime.errors import (
    ArtifactAlteredError,
    InputError,
    ReportError,
    UnsafePathError,
    UploadIncompleteError,
)
from quantgate.runtime.frozen import FrozenRecord
from quantgate.runtime.hashing import content_hash, sha256_file
from quantgate.runtime.progress import SILENT, Progress
from quantgate.runtime.safe_path import safe_relpath

REPORT_FILES = ("report.json", "report.md", "report.html")


class PublishedArtifact(FrozenRecord):
    """What publishing one artifact did: its version, whether new, aliases set and removed."""

    artifact: str  # the target name, as in the report
    registered_model: str
    version: str
    created: bool  # False: a version with the same content hash was already registered
    aliases: list[str]  # aliases this publish pointed at the version
    removed_aliases: list[str]  # aliases of tenants that now fail, taken off this version
    approved_tenants: list[str]
    content_hash: str
    manifest_sha256: str  # the manifest the version registered (the fleet's cache entry is named by it)
    source: str  # where the version's bytes are (the artifact directory in the store)
    run_id: str


class PublishOutcome(FrozenRecord):
    """Every artifact one ``publish_report`` published, and where."""

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
    canary: dict[str, float] | None = None,
) -> PublishOutcome:
    """Publish every artifact the report gated; alias each for the tenants it passed.

    A report whose run failed (a non-zero exit code) is refused: nothing is published on failure. An
    artifact that passed no tenant is still recorded for audit (``record_failed``) but gets
    no alias. ``canary`` (tenant -> traffic share, from gates.yaml's rollout policies): a tenant
    there that already has an approved version gets a canary instead (``aliases.start_canary``).
    """
    report_json = Path(report_json)
    report = read_report(report_json)
    if report.exit_code != 0:
        raise ReportError(
            report_json,
            f"the gate failed this run (exit code {report.exit_code})",
            "publish only a report whose required artifacts passed; fix or re-gate first",
        )
    jobs = _checked_jobs(report_json, report, Path(artifacts_dir), record_failed)
    signing.signing_key(cfg)  # refused (or a SQLite registry's own pair made) before any registry call
    mlflow_client = tracking.client(cfg)
    with tracking.registry_errors(cfg), _sigterm_as_exit():
        registered = [(job, *_register(job, mlflow_client, cfg, progress)) for job in jobs]
        published = [_approve(job, v, created, mlflow_client, cfg, canary) for job, v, created in registered]
    return PublishOutcome(tracking_uri=cfg.tracking_uri, model=report.model, artifacts=published)


def _checked_jobs(report_json: Path, report: Report, artifacts_dir: Path, record_failed: bool) -> list[_Job]:
    """Every artifact of the report, checked whole before anything is published (see the module
    docstring); the first problem is an ``InputError`` (exit 2) and nothing is written."""
    reports = {
        f"{naming.REPORTS_PATH}/{name}": report_json.parent / name
        for name in REPORT_FILES
        if (report_json.parent / name).is_file()
    }
    # each artifact's per-item records beside the report (the bytes report.json names by sha256):
    # what a later release's regression floors are paired with (gate/baseline.py)
    reports |= {
        f"{naming.REPORTS_PATH}/{RECORDS_DIR}/{artifact}.json": path
        for artifact in report.records
        if (path := report_json.parent / RECORDS_DIR / f"{artifact}.json").is_file()
    }
    report_sha256 = sha256_file(report_json).sha256
    fix = "fix the report (quantgate gate writes artifact and tenant names the registry accepts)"
    jobs = []
    for artifact, tenants in report.approvals.items():
        try:
            naming.registered_model_name(report.model, artifact)
            for tenant in {*tenants, *report.failed_tenants(artifact)}:
                naming.alias_for(tenant)
        except InputError as exc:
            raise ReportError(report_json, f"artifact '{artifact}': {exc.problem}", fix) from None
        directory = artifacts_dir / artifact
        manifest = read_manifest(directory)
        if manifest is None and (directory / MANIFEST).is_file():
            require_manifest(directory)  # there but invalid: names its problem
        if manifest is None:
            raise ReportError(
                directory / MANIFEST,
                f"artifact '{artifact}' has no valid manifest",
                "pass --artifacts the directory quantgate build wrote for this report",
            )
        if manifest.target != artifact:
            raise ReportError(
                directory / MANIFEST,
                f"the report gates '{artifact}', but this manifest is for target '{manifest.target}'",
                "pass --artifacts the directory quantgate build wrote for this report",
            )
        _check_names(directory, manifest)
        _check_files(directory, manifest)
        if report.approvals[artifact] or record_failed:
            jobs.append(_Job(artifact, directory, manifest, report, reports, report_sha256))
    return jobs


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While publishing from the main thread of a process where nothing else handles SIGTERM,
    SIGTERM raises ``SystemExit(143)``: the temporary copies being written are removed on the way
    out and the run is marked failed, instead of the process vanishing mid-copy."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def stop(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _check_names(directory: Path, manifest: Manifest) -> None:
    """Every name in the manifest: a safe relative path (exit 2 otherwise) to a regular file that
    is inside ``directory``, reached through no symbolic link, so publish reads nothing outside
    the artifact and writes nothing outside the store's artifact directory."""
    where = directory / MANIFEST
    root = directory.resolve()
    for rel in manifest.files:
        safe_relpath(rel, str(where))
        if rel in (MANIFEST, signing.SIGNATURE, TORRENT):
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


def _check_files(directory: Path, manifest: Manifest) -> None:
    """Every file of the manifest present with its sha256, and no file the manifest does not list."""
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {MANIFEST}
    extra = sorted(present - set(manifest.files))
    problems = verify_files(directory, manifest)
    if extra or problems:
        raise ArtifactAlteredError(
            directory / extra[0] if extra else directory,
            "file not listed in the manifest" if extra else f"differs from its manifest: {problems[0]}",
            "rebuild the artifact with quantgate build; never edit an artifact by hand",
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


def _register(job: _Job, mlflow_client, cfg: RegistryConfig, progress: Progress):
    """The version holding the job's content, uploaded and registered if new; (version, created)."""
    tracking.ensure_registered_model(
        mlflow_client, job.name, {"quantgate.model": job.report.model, naming.TARGET: job.artifact}
    )
    version = _complete_version(mlflow_client, job)
    if version is None:
        version = _upload_and_register(job, mlflow_client, cfg, progress)
        first = _complete_version(mlflow_client, job)  # a concurrent publish of the same content
        if first is not None and str(first.version) != str(version.version):
            mlflow_client.delete_model_version(job.name, version.version)
            progress.log(
                f"{job.name}: version {first.version} holds this content; version {version.version} removed"
            )
            return first, False
        return version, True
    progress.log(
        f"{job.name}: content {job.content_hash[:12]} already registered as version {version.version}"
    )
    if naming.SIGNED_BY not in (version.tags or {}):  # published before manifests were signed
        _sign_existing(job, mlflow_client, cfg, version)
    return version, False


def _approve(
    job: _Job,
    version,
    created: bool,
    mlflow_client,
    cfg: RegistryConfig,
    canary: dict[str, float] | None = None,
) -> PublishedArtifact:
    """The gate's signed approval on ``version`` (merged with the one there), then its aliases."""
    tags = version.tags or {}
    # the manifest the version registered: the build's own, or (the same files rebuilt to the same
    # build key) an earlier build's, which the store holds and the fleet installs
    manifest_sha256 = tags.get(naming.MANIFEST_SHA256) or job.manifest_sha256
    judged: dict[str, approval.Verdict] = {
        **dict.fromkeys(job.report.failed_tenants(job.artifact), "fail"),
        **dict.fromkeys(job.approved, "pass"),
    }
    signed = approval.statement(
        registered_model=job.name,
        model=job.report.model,
        version=str(version.version),
        manifest=job.manifest,
        content_hash=job.content_hash,
        manifest_sha256=manifest_sha256,
        report_sha256=job.report_sha256,
        verdicts=approval.merged(approval.previous(tags, cfg), judged),
        torrent=tags.get(naming.TORRENT),
    )
    for key, value in approval.sign(signed, cfg).items():  # before any alias points here
        mlflow_client.set_model_version_tag(job.name, version.version, key, value)
    moved = aliases.apply(
        mlflow_client,
        cfg,
        job.name,
        version,
        job.approved,
        job.report.failed_tenants(job.artifact),
        evidence=job.report_sha256,
        canary=canary,
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
        manifest_sha256=manifest_sha256,
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
    """The first complete version of the same files built from the same source to the same build
    key (the signed approval names them: the same files under another build key are a new version)."""
    found = mlflow_client.search_model_versions(
        f"name = '{tracking.quote(job.name)}' and tags.`{naming.CONTENT_HASH}` = '{job.content_hash}'"
        f" and tags.`{naming.BUILD_KEY}` = '{tracking.quote(job.manifest.build_key)}'"
        f" and tags.`{naming.SOURCE_HASH}` = '{tracking.quote(job.manifest.source.content_hash)}'"
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
    """Every file to upload with the store's digest of it; each must still match the manifest
    (checked before the publish began: a change since then is refused here)."""
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


def _torrent(job: _Job, manifest: Path, signature: Path, tmp: Path) -> Path:
    """The version's BitTorrent v2 torrent (``manifest.torrent``): its files, the manifest and its
    signature, under the manifest's sha256 (the fleet's cache entry), written beside them."""
    files = {rel: job.directory / rel for rel in job.manifest.files}
    files |= {MANIFEST: manifest, signing.SIGNATURE: signature}
    path = tmp / TORRENT
    path.write_bytes(make_torrent(job.manifest_sha256, files))
    return path


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
        swarm = _torrent(job, manifest, signature, Path(tmp))
        for path in (manifest, signature, swarm):
            files[f"{naming.ARTIFACT_PATH}/{path.name}"] = (path, store.digest(path))
        info_hash = torrent_info_hash(swarm.read_bytes())
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
        tags={
            **job.tags,
            naming.UPLOAD: naming.UPLOAD_COMPLETE,
            naming.SIGNED_BY: key,
            naming.TORRENT: info_hash,
        },
        description=f"{job.artifact} of {job.report.model}, content {job.content_hash[:12]}",
    )
    progress.log(f"{job.name}: registered version {version.version}")
    return version


def withdraw_failed(report_json: Path, artifacts_dir: Path, cfg: RegistryConfig) -> dict[str, list[str]]:
    """A failed run publishes nothing, but it may still *withdraw* approvals.

    Re-gating against tightened floors is exactly when a version already in the registry stops
    passing a tenant; its ``approved-<tenant>`` alias must not keep pointing at it, and its signed
    approval must no longer say pass (else moving the alias back would serve it again). For every
    artifact of the report whose content is already registered, the tenants it now fails are
    signed as failed (when the signing key is at hand) and their aliases on it removed (announced
    like any move); nothing is uploaded, registered or set. Returns ``{registered model: [aliases
    removed]}``.
    """
    report_json = Path(report_json)
    report = read_report(report_json)
    removed: dict[str, list[str]] = {}
    mlflow_client = tracking.client(cfg)
    try:
        signing.signing_key(cfg)
        can_sign = True
    except InputError:  # no key here: the aliases still go
        can_sign = False
    with tracking.registry_errors(cfg):
        for artifact in report.approvals:
            try:
                name = naming.registered_model_name(report.model, artifact)
            except InputError:
                continue  # no registry name: nothing of it can be registered
            manifest = read_manifest(Path(artifacts_dir) / artifact)
            failed = report.failed_tenants(artifact)
            if manifest is None or not failed:
                continue
            found = mlflow_client.search_model_versions(
                f"name = '{tracking.quote(name)}' and tags.`{naming.CONTENT_HASH}` = '{content_hash(manifest.files)}'"
            )
            for version in found:
                if can_sign:
                    _withdraw_approval(
                        mlflow_client, cfg, name, version, failed, sha256_file(report_json).sha256
                    )
                evidence = sha256_file(report_json).sha256 if can_sign else None
                moved = aliases.apply(mlflow_client, cfg, name, version, [], failed, evidence=evidence)
                if moved.removed:
                    removed.setdefault(name, []).extend(moved.removed)
    return removed


def _withdraw_approval(
    mlflow_client, cfg: RegistryConfig, name: str, version, failed: list[str], report_sha256: str
):
    """Re-sign ``version``'s approval with ``failed`` tenants failed (a version without a statement
    of the publisher's gets none: pull refuses it anyway)."""
    before = approval.previous(version.tags or {}, cfg)
    if before is None or not any(before.approves(t) for t in failed):
        return
    after = before.model_copy(
        update={
            "verdicts": approval.merged(before, dict.fromkeys(failed, "fail")),
            "report_sha256": report_sha256,
            "signed_at": approval.statement_time(),
        }
    )
    for key, value in approval.sign(after, cfg).items():
        mlflow_client.set_model_version_tag(name, version.version, key, value)
