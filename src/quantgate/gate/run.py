"""Gate an evaluation directory: read results, decide every (artifact, tenant), write report.json.

Which artifacts are *required* comes from the model class in gates.yaml (given, or read from
the artifact manifests' ``source.model_class``); when neither is known every evaluated artifact
counts as required. Exit code rule: **a required artifact that passes no tenant fails the run**
(exit 1), and so does a required target that was not evaluated at all. Optional targets (and
targets outside the class, built with ``--targets``) that fail are reported, never fail the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantgate.artifact import read_manifest
from quantgate.atomic import write_json
from quantgate.config.loader import nearest
from quantgate.errors import InputError, UsageError
from quantgate.gate.policy import load_gates, project_suites
from quantgate.gate.verdict import N_RESAMPLES, SEED, Results, Verdict, gate

REPORT_SCHEMA_VERSION = 1


class GateDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    model_class: str | None
    source_hash: str | None
    profile: str | None
    required: list[str]
    optional: list[str]
    verdicts: list[Verdict]
    approvals: dict[str, list[str]]  # artifact -> tenants it passed
    numerics: dict[str, dict[str, Any]]  # artifact -> how it was evaluated (native or emulated)
    exit_code: int
    notes: list[str]
    sizes: dict[str, int | None] = {}  # "source" | artifact -> bytes on disk (cold-start cost)
    metrics: dict[str, dict[str, dict[str, Any]]] = {}  # model -> suite -> metric -> value
    suite_notes: dict[str, list[str]] = {}  # suite -> notes (e.g. long-chain bin width)
    previous: dict[str, Any] | None = None  # the previous approved version's report: its metrics


def read_results(eval_dir: Path) -> Results:
    """``E/<model>/<suite>.json`` for every model directory of an evaluation output."""
    eval_dir = Path(eval_dir)
    if not (eval_dir / "source").is_dir():
        raise InputError(eval_dir, "no source/ results here", "point at the output directory of quantgate eval")
    return {
        d.name: {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}
        for d in sorted(eval_dir.iterdir())
        if d.is_dir()
    }


def _manifest_facts(artifacts_dir: Path | None) -> tuple[str | None, str | None]:
    """(model class, architecture) from the first artifact manifest that has them."""
    if artifacts_dir is None or not Path(artifacts_dir).is_dir():
        return None, None
    for d in sorted(Path(artifacts_dir).iterdir()):
        manifest = read_manifest(d) if d.is_dir() else None
        if manifest is not None:
            return manifest.source.model_class, manifest.source.architecture
    return None, None


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
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> GateDecision:
    gates = load_gates(Path(policy_path), Path(project_root))
    suites = project_suites(Path(project_root))
    for name in tenants or []:
        if name not in gates.tenants:
            hint = nearest(name, list(gates.tenants))
            raise UsageError("--tenants", f"unknown tenant '{name}'",
                             (f"did you mean '{hint}'? " if hint else "") + f"known: {', '.join(gates.tenants)}")
    results = read_results(Path(eval_dir))
    run_info = json.loads((Path(eval_dir) / "run.json").read_text()) if (Path(eval_dir) / "run.json").exists() else {}
    manifest_class, architecture = _manifest_facts(artifacts_dir)
    model_class = model_class or manifest_class or run_info.get("model_class")
    notes: list[str] = []
    evaluated = [m for m in results if m != "source"]
    if model_class is not None:
        if model_class not in gates.model_classes:
            hint = nearest(model_class, list(gates.model_classes))
            raise UsageError("--model-class", f"unknown model class '{model_class}'",
                             (f"did you mean '{hint}'? " if hint else "") + f"known: {', '.join(gates.model_classes)}")
        cls = gates.model_classes[model_class].targets
        required, optional = list(cls.required), list(cls.optional)
    else:
        required, optional = list(evaluated), []
        notes.append("model class unknown (no --model-class, no manifests): every evaluated artifact counts as required")
    artifacts = evaluated + [t for t in required if t not in evaluated]
    for t in required:
        if t not in evaluated:
            notes.append(f"required target {t} was not evaluated: it fails every tenant as missing")
    verdicts = gate(results, gates, suites, artifacts, set(required), tenants=tenants, n_resamples=n_resamples, seed=seed)
    approvals = {a: [v.tenant for v in verdicts if v.artifact == a and v.verdict == "pass"] for a in artifacts}
    failing = [a for a in required if not approvals.get(a)]
    if failing:
        notes.append(f"required artifacts passing no tenant: {', '.join(failing)}")
    source_hash = run_info.get("source_hash") or next(
        (r.get("source_hash") for r in results.get("source", {}).values() if r.get("source_hash")), None)
    numerics = run_info.get("numerics") or {
        m: next((r["numerics"] for r in res.values() if "numerics" in r), {}) for m, res in results.items()
    }
    return GateDecision(
        model=model or run_info.get("model") or architecture or f"source-{(source_hash or 'unknown')[:12]}",
        model_class=model_class,
        source_hash=source_hash,
        profile=run_info.get("profile"),
        required=required,
        optional=optional,
        verdicts=verdicts,
        approvals=approvals,
        numerics={a: numerics.get(a, {"mode": "unknown"}) for a in artifacts},
        exit_code=1 if failing else 0,
        notes=notes,
        sizes=run_info.get("bytes") or {},
        metrics={m: {suite: r.get("metrics", {}) for suite, r in res.items()} for m, res in results.items()},
        suite_notes={suite: r.get("notes", []) for suite, r in results.get("source", {}).items()},
        previous=_previous(previous),
    )


def _previous(report_dir: Path | None) -> dict[str, Any] | None:
    """What the report compares against: the previous approved version's report.json.

    Given explicitly today (``--previous DIR``); the registry will supply it once approved
    versions are published there.
    """
    if report_dir is None:
        return None
    path = Path(report_dir) / "report.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        raise UsageError(path, "not a readable report.json", "pass the output directory of an earlier quantgate gate") from None
    return {key: old.get(key) for key in ("model", "source_hash", "approvals", "metrics")} | {"report": str(path)}


def report_payload(decision: GateDecision) -> dict[str, Any]:
    """``report.json``, schema version 1: what the HTML/Markdown reports and the registry read."""
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "model": decision.model,
        "model_class": decision.model_class,
        "source_hash": decision.source_hash,
        "profile": decision.profile,
        "required": decision.required,
        "optional": decision.optional,
        "verdicts": [v.model_dump(mode="json") for v in decision.verdicts],
        "approvals": decision.approvals,
        "numerics": decision.numerics,
        "exit_code": decision.exit_code,
        "notes": decision.notes,
        "sizes": decision.sizes,
        "metrics": decision.metrics,
        "suite_notes": decision.suite_notes,
        "previous": decision.previous,
    }


def write_report_json(decision: GateDecision, out_dir: Path) -> Path:
    """Write ``out_dir/report.json`` atomically; returns its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "report.json"
    write_json(path, report_payload(decision), allow_nan=False)
    return path
