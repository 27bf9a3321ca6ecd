"""What each tenant is served today: the approved version per (target, tenant), for before/after.

The registry's ``approved-<tenant>`` alias of ``<model>.<target>`` names the version a tenant
loads; publish stored that version's gate report beside it (``reports/report.json``), and the
gate compares with it. Summary-level, by decision: the comparison reads the approved version's
report (each floor's estimate, each suite metric), not its per-item records, which publish does
not store. A ``max_regression`` floor therefore bounds this evaluation (paired bootstrap over
items) against the approved version's estimate taken as fixed; with the same suites and profile
the items are the same, so that version's own sampling noise is shared with this one rather than
added, and the comparison is refused across profiles. An approved version with this artifact's
build key is this artifact (a run repeated) and is no baseline. Offline, ``--previous DIR``
gives the report of the previous approved version by hand, for every tenant it approved.

Registry failures are transient (exit 75), never "no approved version": only a registry that
answers that it has none is a first release. The lookup makes no registry where none exists:
an embedded SQLite registry whose file is absent has approved nothing.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from quantgate.config.gates import Floor
from quantgate.errors import ReportError, UsageError
from quantgate.gate.verdict import Before
from quantgate.report_schema import REPORT_JSON, BaselineRef, Report, read_report


class Baseline(BaseModel):
    """The approved version of one (target, tenant): which it is, and its gate report."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    artifact: str
    tenant: str
    ref: BaselineRef
    report: Report | None = None
    problem: str | None = None  # why its report cannot be read; floors comparing with it lack evidence


class Baselines(BaseModel):
    """Every approved version found, where they were looked up, and what was not found (JSON-able,
    so an orchestrator can look them up once and hand them to a cached gate step)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
    """A floor's quantity in the approved version: the same floor's estimate in its report, else
    (for a bound on the metric itself) the suite's reported metric."""
    label = _label(b)
    report = b.report
    problem = b.problem
    if report is not None and problem is None and report.profile != profile:
        problem = f"it was gated at profile {report.profile}, this run at {profile}: not comparable"
    floors: dict[tuple[str, str, str], float] = {}
    if report is not None:
        verdict = next(
            (v for v in report.verdicts if v.artifact == b.artifact and v.tenant == b.tenant), None
        )
        for f in verdict.floors if verdict is not None else []:
            if f.estimate is not None and f.status in ("pass", "fail", "insufficient_evidence"):
                floors.setdefault((f.suite, f.metric, f.kind_of_floor), f.estimate)

    def before(floor: Floor) -> Before:
        value = floors.get((floor.suite, floor.metric, floor.kind))
        if floor.kind in ("max", "min", "max_regression") and value is None:
            direct = [floors.get((floor.suite, floor.metric, k)) for k in ("max", "min")]
            metrics = report.metrics.get(b.artifact, {}).get(floor.suite, {}) if report is not None else {}
            value = next((v for v in direct if v is not None), _number(metrics.get(floor.metric)))
        return Before(label, value, problem)

    return before


def _read(path: Path | None, what: str) -> tuple[Report | None, str | None]:
    if path is None:
        return None, f"{what} has no gate report in the store"
    try:
        return read_report(path), None
    except ReportError as exc:
        return None, f"{what}'s gate report is unreadable: {exc.problem}"


def from_report_dir(report_dir: Path) -> Baselines:
    """``--previous DIR``: the previous approved version's report, for every (target, tenant) it approved."""
    path = Path(report_dir) / REPORT_JSON
    old = read_report(path, fix="pass --previous the output directory of an earlier quantgate gate")
    ref = BaselineRef(origin=str(path), profile=old.profile, source_hash=old.source_hash)
    found = [
        Baseline(artifact=artifact, tenant=tenant, ref=ref, report=old)
        for artifact, tenants in old.approvals.items()
        for tenant in tenants
    ]
    return Baselines(origin=f"--previous {path}", found=found)


def from_registry(cfg, model: str, artifacts: Mapping[str, str | None]) -> Baselines:
    """The approved version of every (target, tenant) for ``artifacts`` (target -> the evaluated
    artifact's build key, None when unknown), from the registry ``cfg`` (a ``RegistryConfig``).

    ``RegistryUnavailableError`` (exit 75) when the registry cannot answer.
    """
    from quantgate.publish import naming, tracking

    origin = f"registry {cfg.model_registry_uri}"
    uri = cfg.model_registry_uri
    exists = not uri.startswith("sqlite:///") or Path(uri.removeprefix("sqlite:///")).exists()
    found: list[Baseline] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="quantgate-baselines-") as tmp, tracking.registry_errors(cfg):
        client = tracking.client(cfg) if exists else None
        # in name order: the gate's cache key hashes this answer, and the flow learns its artifacts
        # in the order their builds finish
        for artifact, build_key in sorted(artifacts.items()):
            try:
                name = naming.registered_model_name(model, artifact)
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
    from quantgate.publish.resolve import approved_versions

    found = []
    for version in approved_versions(client, cfg, name, tmp):
        if build_key is not None and version.build_key == build_key:
            continue  # this artifact, approved by an earlier run of the same build: no baseline
        report, problem = _read(version.report, f"version {version.version} of {name}")
        for tenant in version.tenants:
            ref = BaselineRef(
                registered_model=name,
                version=version.version,
                origin=origin,
                profile=report.profile if report is not None else None,
                source_hash=report.source_hash if report is not None else None,
            )
            found.append(Baseline(artifact=artifact, tenant=tenant, ref=ref, report=report, problem=problem))
    return found
