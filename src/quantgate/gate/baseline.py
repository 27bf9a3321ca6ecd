"""What each tenant is served today: the approved version per (target, tenant), for before/after.

The registry's ``approved-<tenant>`` alias of ``<model>.<target>`` names the version a tenant
loads; publish stored that version's gate report beside it (``reports/report.json``) and its
per-item records (``reports/records/<target>.json``, the bytes the report's ``records`` names).
A ``max_regression`` floor is a paired comparison with that version on the same items
(``gate/floor.py``); a version published without records is compared with its reported
metric, taken as fixed: never with a floor's estimate, which for a regression floor is that
version's own change against its predecessor. An approved version with this artifact's build key
is this artifact (a run repeated) and is no baseline. Offline, ``--previous DIR`` gives the
previous approved version's report directory by hand (its ``records/`` beside it).

Registry failures are transient (exit 75), never "no approved version": only a registry that
answers that it has none is a first release. The lookup makes no registry where none exists:
an embedded SQLite registry whose file is absent has approved nothing.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from quantgate.config import Floor
from quantgate.contracts.report_schema import (
    BASELINES_DIR,
    RECORDS_DIR,
    REPORT_JSON,
    BaselineRef,
    Report,
    read_report,
)
from quantgate.gate.verdict import Before
from quantgate.runtime.errors import ReportError, UsageError
from quantgate.runtime.frozen import FrozenRecord
from quantgate.runtime.safe_path import path_problem


class Baseline(FrozenRecord):
    """The approved version of one (target, tenant): which it is, and its gate report."""

    artifact: str
    tenant: str
    ref: BaselineRef
    report: Report | None = None
    problem: str | None = None  # why its report cannot be read; floors comparing with it lack evidence
    # its per-item results, suite -> result (None: published without them; compared by value)
    records: dict[str, Any] | None = None


class Baselines(FrozenRecord):
    """Every approved version found, where they were looked up, and what was not found (JSON-able,
    so an orchestrator can look them up once and hand them to a cached gate step)."""

    origin: str | None = None  # "registry <uri>" or the --previous report; None: not looked up
    found: list[Baseline] = []
    notes: list[str] = []

    def for_gate(
        self, profile: str | None
    ) -> dict[tuple[str, str], tuple[BaselineRef, Callable[[Floor], Before]]]:
        """``{(artifact, tenant): (reference, floor -> its value in that version)}`` for ``judge``."""
        return {(b.artifact, b.tenant): (b.ref, _befores(b, profile)) for b in self.found}


def _label(b: Baseline) -> str:
    if b.ref.version is not None:
        return f"version {b.ref.version} of {b.ref.registered_model} (approved-{b.tenant})"
    return f"the previous report {b.ref.origin}"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _befores(b: Baseline, profile: str | None) -> Callable[[Floor], Before]:
    """A floor's metric in the approved version: its reported value, and its per-item records on the
    floor's suite where it was published with them."""
    label = _label(b)
    report = b.report
    problem = b.problem
    if report is not None and problem is None and report.profile != profile:
        problem = f"it was gated at profile {report.profile}, this run at {profile}: not comparable"
    metrics = report.metrics.get(b.artifact, {}) if report is not None else {}

    def before(floor: Floor) -> Before:
        value = _number(metrics.get(floor.suite, {}).get(floor.metric))
        records = (b.records or {}).get(floor.suite) if problem is None else None
        return Before(label, value, problem, records)

    return before


def _read(path: Path | None, what: str) -> tuple[Report | None, str | None]:
    if path is None:
        return None, f"{what} has no gate report in the store"
    try:
        return read_report(path), None
    except ReportError as exc:
        return None, f"{what}'s gate report is unreadable: {exc.problem}"


def from_report_dir(report_dir: Path) -> Baselines:
    """``--previous DIR``: what each (target, tenant) is served after the previous report, as the
    registry would answer: the previous report's own artifact for the tenants it approved; for the
    tenants it did not, the version it compared them with (a copy kept beside it, ``baselines/``),
    which is still the one served; none where it compared with none (a first release then too)."""
    path = Path(report_dir) / REPORT_JSON
    old = read_report(path, fix="pass --previous the output directory of an earlier quantgate gate")
    ref = BaselineRef(origin=str(path), profile=old.profile, source_hash=old.source_hash)
    found, notes = [], []
    for artifact, tenants in old.approvals.items():
        records = records_beside(Path(report_dir), old, artifact)
        if tenants and records is None:
            notes.append(f"{artifact}: {path} has no records of it: regressions compare with its values")
        found += [
            Baseline(artifact=artifact, tenant=tenant, ref=ref, report=old, records=records)
            for tenant in tenants
        ]
    for v in old.verdicts:
        if v.baseline is None or v.tenant in old.approvals.get(v.artifact, []):
            continue
        found.append(_carried(Path(report_dir), v.artifact, v.tenant, v.baseline))
    return Baselines(origin=f"--previous {path}", found=found, notes=notes)


def _carried(report_dir: Path, artifact: str, tenant: str, ref: BaselineRef) -> Baseline:
    """The baseline a previous report compared (artifact, tenant) with and did not replace, from its
    copy beside that report; without the copy, a baseline that cannot be compared (never a first
    release: the tenant is still served that version)."""
    where = report_dir / BASELINES_DIR / artifact / tenant
    label = f"version {ref.version} of {ref.registered_model}" if ref.version else ref.origin
    if path_problem(artifact) is None and path_problem(tenant) is None and "/" not in artifact + tenant:
        report, problem = _read(where / REPORT_JSON if (where / REPORT_JSON).exists() else None, label)
        if report is not None:
            records = records_beside(where, report, artifact)
            return Baseline(artifact=artifact, tenant=tenant, ref=ref, report=report, records=records)
    problem = (
        f"the previous report compared {tenant} with {label} but keeps no copy of it "
        f"({where} is missing): gate against the registry, or --previous that version's report"
    )
    return Baseline(artifact=artifact, tenant=tenant, ref=ref, problem=problem)


def records_beside(report_dir: Path, report: Report, artifact: str) -> dict[str, Any] | None:
    """An artifact's per-item records in a report directory (``records/<artifact>.json``), when they
    are the bytes the report names; else None."""
    if artifact not in report.records or path_problem(artifact) is not None or "/" in artifact:
        return None
    return read_records(report_dir / RECORDS_DIR / f"{artifact}.json", report.records[artifact])


def from_registry(cfg, model: str, artifacts: Mapping[str, str | None]) -> Baselines:
    """The approved version of every (target, tenant) for ``artifacts`` (target -> the evaluated
    artifact's build key, None when unknown), from the registry ``cfg`` (a ``RegistryConfig``).

    ``RegistryUnavailableError`` (exit 75) when the registry cannot answer.
    """
    from quantgate.publish import registered_model_name, registry_client, registry_errors

    origin = f"registry {cfg.model_registry_uri}"
    uri = cfg.model_registry_uri
    exists = not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).exists()
    found: list[Baseline] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="quantgate-baselines-") as tmp, registry_errors(cfg):
        client = registry_client(cfg) if exists else None
        # in name order: the gate's cache key hashes this answer, and the flow learns its artifacts
        # in the order their builds finish
        for artifact, build_key in sorted(artifacts.items()):
            try:
                name = registered_model_name(model, artifact)
            except UsageError as exc:
                notes.append(f"{artifact}: no registry name for model '{model}' ({exc.problem})")
                continue
            mine = _approved(client, cfg, name, artifact, build_key, origin, Path(tmp)) if client else []
            if not mine:  # the same words whether the registry is new or approved only this artifact,
                # so that a repeated run finds what the first found
                notes.append(f"{name}: no approved version other than this artifact (a first release)")
            found += mine
    return Baselines(origin=origin, found=found, notes=notes)


def _approved(
    client, cfg, name: str, artifact: str, build_key: str | None, origin: str, tmp: Path
) -> list[Baseline]:
    """The baselines of one registered model: each tenant's approved version that is not this artifact."""
    from quantgate.publish import approved_versions

    found = []
    for version in approved_versions(client, cfg, name, tmp, target=artifact):
        if build_key is not None and version.build_key == build_key:
            continue  # this artifact, approved by an earlier run of the same build: no baseline
        report, problem = _read(version.report, f"version {version.version} of {name}")
        records = None
        if report is not None and version.records is not None:
            records = read_records(version.records, report.records.get(artifact))
        for tenant in version.tenants:
            ref = BaselineRef(
                registered_model=name,
                version=version.version,
                origin=origin,
                profile=report.profile if report is not None else None,
                source_hash=report.source_hash if report is not None else None,
            )
            found.append(
                Baseline(
                    artifact=artifact, tenant=tenant, ref=ref, report=report, problem=problem, records=records
                )
            )
    return found


def read_records(path: Path, sha256: str | None) -> dict[str, Any] | None:
    """``records/<artifact>.json``'s suites, when present and the bytes report.json names; else None."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if sha256 is None or hashlib.sha256(data).hexdigest() != sha256:
        return None
    return json.loads(data).get("suites")
