"""Gate an evaluation directory: read results, decide every (artifact, tenant), write report.json.

Which artifacts are *required* comes from the model class in gates.yaml (given, or read from
the artifact manifests' ``source.model_class`` or the evaluation's run.json); when none says,
every evaluated artifact counts as required. Exit code rule: **a required artifact that passes
no tenant fails the run** (exit 1), and so does a required target that was not evaluated at all.
Optional targets (and targets outside the class, built with ``--targets``) that fail are
reported, never fail the run. What each tenant is served today (``baseline.py``) comes from the
registry, from ``--previous DIR``, or from an orchestrator that looked it up already.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, cast

from quantgate.config import Catalog, Gates, load_gates, project_suites
from quantgate.contracts.artifact import Manifest, artifact_dirs, read_manifest
from quantgate.contracts.report_schema import (
    BASELINES_DIR,
    RECORDS_DIR,
    REPORT_JSON,
    EvaluatedNumerics,
    Report,
    SequentialDesign,
)
from quantgate.contracts.results import SOURCE, read_evaluation
from quantgate.contracts.serving_table import ServingTable
from quantgate.gate.baseline import Baselines, from_registry, from_report_dir
from quantgate.gate.verdict import Results, gate, no_evidence
from quantgate.runtime.atomic import staged_file, write_json
from quantgate.runtime.errors import InputError, UsageError
from quantgate.runtime.suggest import did_you_mean


def _manifests(artifacts_dir: Path | None) -> dict[str, Manifest]:
    """The artifacts' manifests by directory name: ``artifact_dirs``' choice, so a killed build's
    hidden temporary copy is never read as an artifact."""
    if artifacts_dir is None or not Path(artifacts_dir).is_dir():
        return {}
    try:
        dirs = artifact_dirs(Path(artifacts_dir))
    except InputError:  # no artifact there: the gate reports what evaluation found
        return {}
    return {d.name: m for d in dirs if (m := read_manifest(d)) is not None}


def _manifest_facts(artifacts_dir: Path | None) -> tuple[str | None, str | None]:
    """(model class, architecture) from the first artifact manifest that has them."""
    for manifest in _manifests(artifacts_dir).values():
        return manifest.source.model_class, manifest.source.architecture
    return None, None


def _serving(artifacts_dir: Path | None) -> dict[str, ServingTable]:
    """Each artifact's serving check, from its manifest (artifacts built before the check have none)."""
    return {name: m.serving for name, m in _manifests(artifacts_dir).items() if m.serving is not None}


def gate_results(
    eval_dir: Path,
    policy_path: Path,
    project_root: Path,
    *,
    model_class: str | None = None,
    artifacts_dir: Path | None = None,
    model: str | None = None,
    tenants: list[str] | None = None,
    previous: Path | None = None,
    registry: Any = None,
    baselines: Baselines | None = None,
    chosen_for: list[str] | None = None,
) -> Report:
    """Gate an evaluation output against gates.yaml; the decision, as report.json will hold it.

    What each tenant is served today, in order: ``previous`` (a report directory, offline),
    ``baselines`` (already looked up), ``registry`` (a ``RegistryConfig``: its approved versions;
    ``RegistryUnavailableError``, exit 75, when it cannot answer); none of them: not compared.
    ``chosen_for``: the evaluation is a repair variant the search chose for these tenants: it is no
    required target, and it is approved only for those of them it passes (a larger variant that
    also passes another tenant earns no alias for it).
    """
    catalog = Catalog(Path(project_root))
    gates = load_gates(Path(policy_path), catalog)
    suites = project_suites(catalog)
    for name in tenants or []:
        if name not in gates.tenants:
            raise UsageError("--tenants", f"unknown tenant '{name}'", did_you_mean(name, gates.tenants))
    evaluation = read_evaluation(Path(eval_dir))
    results, run_info = evaluation.results, evaluation.run
    manifest_class, architecture = _manifest_facts(artifacts_dir)
    model_class = model_class or manifest_class or (run_info.model_class if run_info else None)
    notes: list[str] = []
    evaluated = evaluation.artifacts
    required, optional = _roles(gates, model_class, evaluated, chosen_for, notes)
    artifacts = evaluated + [t for t in required if t not in evaluated]
    for t in required:
        if t not in evaluated:
            notes.append(f"required target {t} was not evaluated: it fails every tenant as missing")
    source_hash = (run_info.source_hash if run_info else None) or next(
        (r.source_hash for r in results.get(SOURCE, {}).values() if r.source_hash), None
    )
    profile = run_info.profile if run_info else None
    # the name publish registers under (<model>.<target>), so the lookup finds what it published
    named = run_info.model if run_info else None
    model = model or named or architecture or f"source-{(source_hash or 'unknown')[:12]}"
    if previous is not None:
        baselines = from_report_dir(previous)
    elif baselines is None and registry is not None:
        baselines = from_registry(registry, model, {a: evaluation.build_key(a) for a in artifacts})
    verdicts = gate(
        results,
        gates,
        suites,
        artifacts,
        set(required),
        tenants=tenants,
        baselines=baselines.for_gate(profile) if baselines is not None else None,
        profile=profile,
    )
    approvals = {
        a: [
            v.tenant
            for v in verdicts
            if v.artifact == a and v.verdict == "pass" and (chosen_for is None or v.tenant in chosen_for)
        ]
        for a in artifacts
    }
    failing = [a for a in required if not approvals.get(a)]
    if failing:
        notes.append(f"required artifacts passing no tenant: {', '.join(failing)}")
    numerics = (run_info.numerics if run_info else {}) or {
        m: next((r.numerics for r in res.values() if r.numerics), {}) for m, res in results.items()
    }
    report = Report(
        model=model,
        model_class=model_class,
        source_hash=source_hash,
        profile=profile,
        sequential=cast(
            dict[str, dict[str, SequentialDesign]],
            {
                a: {suite: d.model_dump() for suite, d in designs.items()}
                for a, designs in (run_info.sequential if run_info else {}).items()
            },
        ),
        required=required,
        optional=optional,
        verdicts=verdicts,
        approvals=approvals,
        numerics={a: cast(EvaluatedNumerics, numerics.get(a, {"mode": "unknown"})) for a in artifacts},
        exit_code=1 if failing else 0,
        notes=notes,
        sizes=run_info.bytes if run_info else {},
        serving={a: table for a, table in _serving(artifacts_dir).items() if a in artifacts},
        metrics={m: {suite: r.metrics for suite, r in res.items()} for m, res in results.items()},
        suite_notes={suite: r.notes for suite, r in results.get(SOURCE, {}).items()},
        no_evidence=no_evidence(verdicts),
        skipped=run_info.skipped if run_info else {},
        records={a: hashlib.sha256(records_payload(results, a)).hexdigest() for a in evaluated},
        baselines_from=baselines.origin if baselines is not None else None,
        baseline_notes=list(baselines.notes) if baselines is not None else [],
    )
    report._compared = baselines
    return report


def _roles(
    gates: Gates,
    model_class: str | None,
    evaluated: list[str],
    chosen_for: list[str] | None,
    notes: list[str],
) -> tuple[list[str], list[str]]:
    """(required, optional) artifacts: the model class's targets; every evaluated one when the class
    is unknown; none required for a repair variant (``chosen_for``). Notes say which applied."""
    if chosen_for is not None:
        notes.append(
            "repaired variant: the smallest the search found passing "
            f"{', '.join(sorted(chosen_for))}; approved for those tenants only"
        )
        return [], list(evaluated)
    if model_class is None:
        notes.append(
            "model class unknown (no --model-class, no manifests): every evaluated artifact counts as required"
        )
        return list(evaluated), []
    if model_class not in gates.model_classes:
        raise UsageError(
            "--model-class",
            f"unknown model class '{model_class}'",
            did_you_mean(model_class, gates.model_classes),
        )
    cls = gates.model_classes[model_class].targets
    return list(cls.required), list(cls.optional)


def records_payload(results: Results, artifact: str) -> bytes:
    """An artifact's per-item results on every suite, as the bytes written beside its report and
    published with its version: what a later release's regression floors are paired with. Canonical
    (sorted keys, no spaces), so their sha256 in report.json identifies them."""
    suites = {
        name: r.model_dump(mode="json", exclude_none=True) for name, r in results.get(artifact, {}).items()
    }
    return json.dumps(
        {"artifact": artifact, "suites": suites}, sort_keys=True, separators=(",", ":")
    ).encode()


def write_report_json(report: Report, out_dir: Path, eval_dir: Path | None = None) -> Path:
    """Write ``out_dir/report.json`` atomically, and, given the evaluation it gated (``eval_dir``),
    each artifact's records beside it (``records/<artifact>.json``, the bytes report.json names);
    returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if eval_dir is not None and report.records:
        results = read_evaluation(Path(eval_dir)).results
        for artifact, sha256 in report.records.items():
            payload = records_payload(results, artifact)
            if hashlib.sha256(payload).hexdigest() != sha256:
                raise InputError(
                    Path(eval_dir) / artifact,
                    "the evaluation changed after it was gated",
                    "gate it again (quantgate gate --results ...)",
                )
            staged = out_dir / RECORDS_DIR / f"{artifact}.json"
            staged.parent.mkdir(parents=True, exist_ok=True)
            with staged_file(staged) as tmp:
                Path(tmp).write_bytes(payload)
    keep_baselines(report, out_dir)
    path = out_dir / REPORT_JSON
    write_json(path, report.payload(), allow_nan=False)
    return path


def keep_baselines(report: Report, out_dir: Path) -> None:
    """Beside the report, a copy of every baseline a tenant was compared with and not approved against
    (``baselines/<artifact>/<tenant>/``: that version's report and records): the version that tenant is
    still served, which a later ``--previous`` of this report compares with, as the registry does."""
    compared: Baselines | None = report._compared
    if compared is None:
        return
    for v in report.verdicts:
        if v.baseline is None or v.tenant in report.approvals.get(v.artifact, []):
            continue
        found = next((b for b in compared.found if (b.artifact, b.tenant) == (v.artifact, v.tenant)), None)
        if found is None or found.report is None:
            continue
        where = out_dir / BASELINES_DIR / v.artifact / v.tenant
        records = {}
        if found.records is not None:
            payload = json.dumps(
                {"artifact": v.artifact, "suites": found.records}, sort_keys=True, separators=(",", ":")
            ).encode()
            staged = where / RECORDS_DIR / f"{v.artifact}.json"
            staged.parent.mkdir(parents=True, exist_ok=True)
            with staged_file(staged) as tmp:
                Path(tmp).write_bytes(payload)
            records = {v.artifact: hashlib.sha256(payload).hexdigest()}
        kept = found.report.model_copy(update={"records": records})
        write_json(where / REPORT_JSON, kept.payload(), allow_nan=False)
