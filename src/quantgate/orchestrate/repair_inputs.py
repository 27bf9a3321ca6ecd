"""``quantgate repair``: the inputs a repair needs, from a run's plan or from the options, and the
table a release engineer reads. Here, beside the plan they may come from: repair itself is a stage
the flow calls, and reads no plan.

With a plan (``quantgate run`` writes ``plan.json`` beside ``eval/``) everything comes from it:
the confirmed source, the uniform builds' recipes and KV decisions, the calibration set, the suites
and profile. Without one, the options are resolved into a plan as a run resolves them
(``plan.resolve_plan``: the source taken in again, ``--checkpoint`` or the embedded model, and the
project's current recipes, calibration set and suites), and that plan is read the same way.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantgate.contracts.report_schema import Report, read_report
from quantgate.contracts.results import RUN_JSON, read_evaluation, read_run_info
from quantgate.repair import RepairInputs, RepairOutcome, repair
from quantgate.runtime.errors import UsageError
from quantgate.runtime.progress import Progress

if TYPE_CHECKING:
    from quantgate.gate import Baselines
    from quantgate.intake import SourceRecord
    from quantgate.orchestrate.plan import RunPlan


def repair_command(
    *,
    results: Path,
    artifacts: Path,
    out: Path | None,
    report_json: Path | None,
    targets: list[str] | None,
    tenants: list[str] | None,
    budget: int | None,
    options: dict[str, Any],
    plan_file: Path | None,
    device: str = "auto",
) -> int:
    """Run a repair as the command does; its exit code. ``device`` (``quantgate.runtime.devices``): where
    variants are built and evaluated; with a run's plan and "auto", the plan's device."""
    from quantgate.runtime.devices import resolve
    from quantgate.runtime.progress import RichProgress

    results, artifacts = Path(results).resolve(), Path(artifacts).resolve()
    for path, option in ((results, "--results"), (artifacts, "--artifacts")):
        if not path.is_dir():
            raise UsageError(
                path, f"{option} is not a directory", f"pass the directory quantgate wrote for {option}"
            )
    if plan_file is not None and str(plan_file) == "none":  # plan anew even beside a run's plan.json
        plan_file = None
    elif plan_file is None and (results.parent / "plan.json").is_file():
        plan_file = results.parent / "plan.json"
    asked = None if plan_file is not None and device == "auto" else resolve(device)
    out = Path(out).resolve() if out is not None else results.parent / "repair"
    with RichProgress() as progress:
        inputs, project, gates_path = (
            _from_plan(plan_file, options, progress)
            if plan_file is not None
            else _from_options(results, options, progress)
        )
        report, report_json = _report(results, artifacts, report_json, project, gates_path, out)
        inputs = dataclasses.replace(
            inputs,
            baselines=run_baselines(report, results, project),
            device=_device(asked, plan_file),
        )
        progress.log(f"device: {inputs.device}")
        outcome = repair(
            report,
            artifacts,
            out,
            inputs,
            targets=targets,
            tenants=tenants,
            budget=budget,
            progress=progress,
        )
        attach(report_json, report, outcome)
    _print(outcome, report_json)
    searched = [t for r in outcome.targets for t in r.tenants]
    return 1 if searched and not any(t.k is not None for t in searched) else 0


def run_baselines(report: Report, results: Path, project: Path) -> Baselines | None:
    """What the gate of the run being repaired compared each tenant with (``report.baselines_from``),
    looked up as it looked them up: the same ``--previous`` report, or the same registry for the same
    model and build keys; None when it compared nothing. Every variant is gated against these."""
    from quantgate.gate import from_registry, from_report_dir
    from quantgate.publish import RegistryConfig

    origin = report.baselines_from
    if origin is None:
        return None
    if origin.startswith("--previous "):
        return from_report_dir(Path(origin.removeprefix("--previous ")))
    evaluation = read_evaluation(results)
    artifacts = [*evaluation.artifacts, *(t for t in report.required if t not in evaluation.artifacts)]
    keys = {a: evaluation.build_key(a) for a in artifacts}
    return from_registry(RegistryConfig.from_env(project), report.model, keys)


def attach(report_json: Path, report: Report, outcome: RepairOutcome) -> list[Path]:
    """Add the repairs to ``report_json`` and render its Markdown and HTML again."""
    from quantgate.gate import write_report_json
    from quantgate.report import write_reports

    updated = report.model_copy(update={"repairs": outcome.targets})
    path = write_report_json(updated, Path(report_json).parent)
    return [path, *write_reports(updated.payload(), path.parent).values()]


def _report(
    results: Path, artifacts: Path, given: Path | None, project: Path, gates_path: Path, out: Path
) -> tuple[Report, Path]:
    """The report to repair: given, beside the results, or the results gated now (offline)."""
    from quantgate.gate import gate_results, write_report_json

    found = given if given is not None else results.parent / "report" / "report.json"
    if found.is_file():
        return read_report(found, fix="pass --report the report.json quantgate gate wrote"), found
    if given is not None:
        raise UsageError(given, "no report.json there", "pass the report.json quantgate gate wrote")
    decision = gate_results(results, gates_path, project, artifacts_dir=artifacts)
    return decision, write_report_json(decision, out / "report", results)


def _device(asked: str | None, plan_file: Path | None) -> str:
    """``--device`` as resolved, else (a run's repair step, ``auto``) the device its plan records."""
    from quantgate.orchestrate.plan import read_plan

    if asked is not None or plan_file is None:
        return asked or "cpu"
    return read_plan(plan_file).device


def _from_plan(
    plan_file: Path, options: dict[str, Any], progress: Progress
) -> tuple[RepairInputs, Path, Path]:
    from quantgate.orchestrate.plan import read_plan

    for option, value in options.items():
        if value is not None:
            raise UsageError(
                option, "is taken from the plan here", f"leave {option} out, or pass --plan none"
            )
    plan = read_plan(plan_file)
    return _inputs(plan, plan.confirmed_source(progress), progress), Path(plan.root), Path(plan.gates)


def _from_options(
    results: Path, options: dict[str, Any], progress: Progress
) -> tuple[RepairInputs, Path, Path]:
    """The plan a run would make of the options (``resolve_plan``), for the targets the results hold
    (each with its own KV decision, as under ``--targets``) and the results' profile and design."""
    from quantgate.config import Catalog, project_root
    from quantgate.orchestrate.plan import resolve_plan

    project = (options["--root"] or project_root()).resolve()
    known = Catalog(project).target_names()
    names = [d.name for d in sorted(results.iterdir()) if d.is_dir() and d.name in known]
    run_json = results / RUN_JSON
    run_info = read_run_info(run_json) if run_json.is_file() else None
    plan = resolve_plan(
        checkpoint=options["--checkpoint"],
        out=results.parent,
        targets=names,
        profile=run_info.profile if run_info else "smoke",
        root=project,
        gates=options["--gates"],
        cache=options["--cache-dir"],
        data_dir=options["--data-dir"],
        calibration=options["--calibration"],
        sequential=run_info is not None and run_info.design == "sequential",  # as the results were
        progress=progress,
        needs=["builds", "suites"] if names else ["suites"],
    )
    if run_info is not None and run_info.model:  # the results' model, as they name it
        plan = plan.model_copy(update={"model": run_info.model})
    return _inputs(plan, plan.source, progress), Path(plan.root), Path(plan.gates)


def _inputs(plan: RunPlan, source: SourceRecord, progress: Progress) -> RepairInputs:
    """What a repair reads of a plan, read from disk or resolved now: the same either way."""
    from quantgate.evaluate import DataDir, EvalContext

    project = Path(plan.root)
    ctx = EvalContext(
        plan.profile,
        DataDir.resolve(Path(plan.data_dir) if plan.data_dir else None, project),
        project,
        Path(plan.cache_dir),
        progress,
    )
    return RepairInputs(
        source=source,
        planned={b.target.name: b for b in plan.builds},
        calibration=plan.calibration_set(),
        suites=plan.loaded_suites(),
        ctx=ctx,
        gates_path=Path(plan.gates),
        project_root=project,
        model=plan.model,
        sequential=plan.sequential,
    )


def _print(outcome: RepairOutcome, report_json: Path) -> None:
    """A table per target; outcome and publish lines printed whole (scripts read them)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 240)
    for target in outcome.targets:
        table = Table(
            title=f"quantgate repair: {target.target} ({target.units} layer groups, kept at {target.upgrade}; "
            f"uniform {target.uniform_bytes / 1e6:.1f} MB)"
        )
        for column in (
            "k kept",
            "MB",
            "passes",
            *sorted({q for p in target.probes for q in p.quality}),
            "seconds",
        ):
            table.add_column(column)
        keys = sorted({q for p in target.probes for q in p.quality})
        for p in sorted(target.probes, key=lambda p: p.k):
            table.add_row(
                str(p.k),
                f"{p.bytes / 1e6:.1f}",
                ", ".join(p.passed) or "none",
                *(f"{p.quality[q]:.4g}" if q in p.quality else "-" for q in keys),
                f"{p.seconds:.0f}",
            )
        console.print(table)
        for t in target.tenants:
            verdict = f"k={t.k} -> {t.variant}" if t.k is not None else "no variant"
            print(f"  {target.target} x {t.tenant}: {verdict} ({t.stopped})")
        print(
            f"  {target.builds} builds and evaluations, sensitivity "
            f"{'cached' if target.sensitivity_cached else f'{target.sensitivity_seconds:.0f} s'}, {target.seconds:.0f} s in all"
        )
    for name, why in outcome.skipped.items():
        print(f"  {name}: not repaired ({why})")
    for where in sorted({t.variant for r in outcome.targets for t in r.tenants if t.variant is not None}):
        print(f"publish: quantgate publish --report {where}/publish --artifacts {where}/artifacts")
    print(f"report: {report_json}")
