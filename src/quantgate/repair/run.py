"""Repair a gated run: for each target that failed a tenant marked ``repair``, search for the
smallest variant that passes it, and write what was tried (``repair.json``).

Every variant is a real build (``build_planned``, serving check included), a real evaluation in
its target's numerics (only the suites its repaired tenants' floors read; the source's references
come from the cache the run filled) and a real gate, against what the registry served each tenant
when the run was gated (``RepairInputs.baselines``). Each variant lives under
``<out>/variants/<target>/k<k>/`` with its ``artifacts/``, ``eval/`` and ``report/``; a variant the
search chose for some tenants also gets ``publish/report.json``: the gate's decision when asked to
approve it for exactly those tenants (``gate_results(chosen_for=...)``: a larger variant that also
passes one of them earns no alias for it), which ``quantgate publish`` takes as it takes any
report. Approvals come from the gate alone: no report is edited here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from quantgate.calibration import CalibrationSet
from quantgate.config import Catalog, Gates, load_gates
from quantgate.contracts.artifact import require_manifest
from quantgate.contracts.report_schema import ProbeRecord, Report, TargetRepair, TenantRepair
from quantgate.evaluate import EvalContext, LoadedSuite
from quantgate.gate import Baselines, gate_results, write_report_json
from quantgate.intake import SourceRecord
from quantgate.quantize import PlannedBuild, build_planned
from quantgate.repair import sensitivity
from quantgate.repair.search import Probe, bisect
from quantgate.repair.units import Unit, quantized_units
from quantgate.repair.variants import planned_variant
from quantgate.runtime.atomic import write_json
from quantgate.runtime.errors import UsageError
from quantgate.runtime.frozen import FrozenRecord
from quantgate.runtime.progress import SILENT, Progress
from quantgate.runtime.suggest import did_you_mean

REPAIR_JSON = "repair.json"


class RepairOutcome(FrozenRecord):
    """``repair.json``: every target's search; what publish takes is under each chosen variant."""

    model: str
    targets: list[TargetRepair]
    skipped: dict[str, str]  # target -> why it was not repaired
    seconds: float

    def chosen(self) -> dict[str, dict[int, list[str]]]:
        """target -> k -> the tenants that variant was chosen for."""
        found: dict[str, dict[int, list[str]]] = {}
        for t in self.targets:
            for tenant in t.tenants:
                if tenant.k is not None:
                    found.setdefault(t.target, {}).setdefault(tenant.k, []).append(tenant.tenant)
        return found


@dataclass(frozen=True)
class RepairInputs:
    """What variants are built and evaluated with: the run's own source, recipes, calibration and suites."""

    source: SourceRecord
    planned: dict[str, PlannedBuild]  # target -> the uniform artifact's build
    calibration: CalibrationSet | None
    suites: list[LoadedSuite]
    ctx: EvalContext
    gates_path: Path
    project_root: Path
    model: str
    sequential: bool = False
    # what each tenant is served today, as the run's gate saw it: every variant is gated against it
    baselines: Baselines | None = None
    # where variants are built and evaluated, and sensitivity measured: "cpu" or "cuda" (--device)
    device: str = "cpu"


def variant_dir(out: Path, target: str, k: int) -> Path:
    """Where the variant keeping ``k`` groups of ``target`` lives."""
    return Path(out) / "variants" / target / f"k{k:03d}"


def to_repair(
    report: Report, gates: Gates, catalog: Catalog, targets: list[str] | None, tenants: list[str] | None
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """target -> its failed tenants marked ``repair`` (or named in ``tenants``); and why others are skipped."""
    failed: dict[str, list[str]] = {}
    for v in report.verdicts:
        if v.verdict == "fail" and (
            v.tenant in tenants if tenants else gates.repairs(report.model_class, v.tenant)
        ):
            failed.setdefault(v.artifact, []).append(v.tenant)
    gated = sorted({v.artifact for v in report.verdicts})
    for name in targets or []:
        if name not in gated:
            raise UsageError("--targets", f"'{name}' was not gated in this report", did_you_mean(name, gated))
    for name in tenants or []:
        if name not in gates.tenants:
            raise UsageError("--tenants", f"unknown tenant '{name}'", did_you_mean(name, gates.tenants))
    chosen, skipped = {}, {}
    for target in targets or gated:
        if target not in failed:
            skipped[target] = "passes every tenant it could be repaired for"
        elif catalog.target(target).repair is None:
            skipped[target] = f"targets/{target}.yaml declares no repair: section"
        else:
            chosen[target] = failed[target]
    return chosen, skipped


def _suites_for(
    gates: Gates, target: str, tenants: list[str], suites: list[LoadedSuite]
) -> list[LoadedSuite]:
    """The suites the tenants' floors that gate ``target`` read: nothing else is evaluated."""
    names = {
        f.suite
        for t in tenants
        for f in gates.tenants[t].floors
        if f.applies_to is None or target in f.applies_to
    }
    return [s for s in suites if s.spec.name in names]


def repair(
    report: Report,
    artifacts_dir: Path,
    out: Path,
    inputs: RepairInputs,
    *,
    targets: list[str] | None = None,
    tenants: list[str] | None = None,
    budget: int | None = None,
    progress: Progress = SILENT,
) -> RepairOutcome:
    """Search every failed (target, tenant) marked ``repair``; write ``<out>/repair.json``."""
    started = time.perf_counter()
    catalog = Catalog(inputs.project_root)
    gates = load_gates(inputs.gates_path, catalog)
    todo, skipped = to_repair(report, gates, catalog, targets, tenants)
    done = []
    for target, failed in todo.items():
        if target not in inputs.planned:
            skipped[target] = "not in this run's plan: its recipe is unknown here"
            continue
        progress.log(f"repair {target}: failed {', '.join(failed)}; searching for a variant")
        done.append(
            _repair_target(
                target,
                failed,
                Path(artifacts_dir) / target,
                Path(out),
                inputs,
                gates,
                budget or gates.repair.max_evaluations,
                progress,
            )
        )
    outcome = RepairOutcome(
        model=report.model, targets=done, skipped=skipped, seconds=round(time.perf_counter() - started, 1)
    )
    Path(out).mkdir(parents=True, exist_ok=True)
    write_json(Path(out) / REPAIR_JSON, outcome.model_dump(mode="json"))
    return outcome


def _repair_target(
    target: str,
    failed: list[str],
    uniform: Path,
    out: Path,
    inputs: RepairInputs,
    gates: Gates,
    budget: int,
    progress: Progress,
) -> TargetRepair:
    started = time.perf_counter()
    parent = require_manifest(uniform)
    units = quantized_units(uniform)
    texts = inputs.calibration.texts() if inputs.calibration is not None else []
    t0 = time.perf_counter()
    sens = sensitivity.measure(
        uniform,
        Path(inputs.source.path),
        inputs.source.content_hash,
        units,
        texts,
        inputs.ctx.cache_dir,
        progress,
        device=inputs.device,
    )
    cached = time.perf_counter() - t0 < sens.seconds / 2
    ranked = sens.ranked(units)
    suites = _suites_for(gates, target, failed, inputs.suites)
    probes: dict[int, ProbeRecord] = {}

    def evaluate(k: int) -> Probe:
        record = _probe(
            target, k, ranked, len(units), parent.build_key, failed, suites, out, inputs, gates, progress
        )
        probes[k] = record
        progress.log(
            f"repair {target}: k={k} ({record.bytes / 1e6:.1f} MB) passes {', '.join(record.passed) or 'none'} "
            f"of {', '.join(failed)}"
        )
        return Probe(k, frozenset(record.passed), record.bytes, record.quality, record.seconds)

    result = bisect(len(units), failed, evaluate, budget)
    outcomes = []
    for o in result.tenants:
        where = str(variant_dir(out, target, o.k)) if o.k is not None else None
        outcomes.append(TenantRepair(tenant=o.tenant, k=o.k, stopped=o.stopped, variant=where))
    for k, chosen in _by_k(outcomes).items():
        _publishable_report(variant_dir(out, target, k), failed, chosen, inputs)
    upgrade = inputs.planned[target].target.repair
    return TargetRepair(
        target=target,
        upgrade=upgrade.label if upgrade is not None else "?",
        units=len(units),
        uniform_bytes=parent.total_bytes,
        parent_build_key=parent.build_key,
        sensitivity_seconds=sens.seconds,
        sensitivity_cached=cached,
        kld_uniform=sens.kld_uniform,
        ranked=[u.name for u in ranked],
        budget=budget,
        probes=[probes[p.k] for p in result.probes],
        tenants=outcomes,
        seconds=round(time.perf_counter() - started, 1),
    )


def _by_k(outcomes: list[TenantRepair]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for o in outcomes:
        if o.k is not None:
            found.setdefault(o.k, []).append(o.tenant)
    return found


def _probe(
    target: str,
    k: int,
    ranked: list[Unit],
    n: int,
    parent_build_key: str,
    failed: list[str],
    suites: list[LoadedSuite],
    out: Path,
    inputs: RepairInputs,
    gates: Gates,
    progress: Progress,
) -> ProbeRecord:
    """Build, evaluate and gate the variant keeping the ``k`` most sensitive groups."""
    from quantgate.evaluate import evaluate

    started = time.perf_counter()
    where = variant_dir(out, target, k)
    planned = planned_variant(inputs.planned[target], ranked[:k], n, parent_build_key)
    built = build_planned(
        inputs.source,
        [planned],
        where / "artifacts",
        inputs.calibration,
        progress,
        inputs.device,
        inputs.ctx.cache_dir,
    )[0]
    evaluate(
        Path(inputs.source.path),
        inputs.source.content_hash,
        where / "artifacts",
        where / "eval",
        suites,
        inputs.ctx,
        [target],
        model=inputs.model,
        model_class=inputs.source.model_class,
        source_bytes=inputs.source.bytes,
        sequential=inputs.sequential,
        gates=gates,
        tenants=failed,
        device=inputs.device,
    )
    decision = _gate(where, failed, inputs)
    write_report_json(decision, where / "report", where / "eval")
    estimates = {
        f"{f.suite}.{f.metric}": f.estimate
        for v in decision.verdicts
        if v.artifact == target
        for f in v.floors
        if f.estimate is not None and f.kind_of_floor in ("max", "min")
    }
    return ProbeRecord(
        k=k,
        bytes=built.manifest.total_bytes,
        passed=sorted(decision.approvals.get(target, [])),
        quality=estimates,
        seconds=round(time.perf_counter() - started, 1),
        path=str(where),
    )


def _gate(
    where: Path, failed: list[str], inputs: RepairInputs, chosen_for: list[str] | None = None
) -> Report:
    """The gate's decision on a variant's evaluation, for the failed tenants, against the run's baselines."""
    return gate_results(
        where / "eval",
        inputs.gates_path,
        inputs.project_root,
        artifacts_dir=where / "artifacts",
        model=inputs.model,
        tenants=failed,
        baselines=inputs.baselines,
        chosen_for=chosen_for,
    )


def _publishable_report(where: Path, failed: list[str], chosen: list[str], inputs: RepairInputs) -> Path:
    """The variant's gate report for publishing: the gate, asked to approve the variant for exactly
    the tenants the search chose it for (``chosen_for``), decides; nothing here edits a report."""
    return write_report_json(
        _gate(where, failed, inputs, chosen_for=chosen), where / "publish", where / "eval"
    )
