"""``quantgate build``: intake the source checkpoint (or read a run's plan) and build its artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quantgate.cli.options import (
    CacheOpt,
    CalibrationOpt,
    CheckpointOpt,
    DeviceOpt,
    GatesOpt,
    PlanOpt,
    RootOpt,
    TargetsOpt,
    out_dir,
    refuse_beside_plan,
    split,
)
from quantgate.paths import cache_dir, project_root

if TYPE_CHECKING:
    from quantgate.calibration import CalibrationSet
    from quantgate.intake import SourceRecord
    from quantgate.progress import Progress
    from quantgate.quantize import PlannedBuild


def build(
    out: Annotated[Path, typer.Option("--out", help="Directory for the artifacts: one <target>/ each.")],
    checkpoint: CheckpointOpt = None,
    targets: TargetsOpt = None,
    gates: GatesOpt = None,
    calibration: CalibrationOpt = None,
    cache: CacheOpt = None,
    root: RootOpt = None,
    plan_file: PlanOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Validate the source checkpoint, then build one artifact per target."""
    from quantgate.devices import resolve
    from quantgate.orchestrate import read_plan
    from quantgate.progress import RichProgress
    from quantgate.quantize import build_planned
    from quantgate.report import print_table, text_table
    from quantgate.units import format_bytes

    # a run's step computes where its plan says (read below), unless --device names a device
    asked = None if plan_file is not None and device == "auto" else resolve(device)
    out = out_dir(out, "--out")
    with RichProgress() as progress:
        if plan_file is not None:
            refuse_beside_plan(
                {
                    "--checkpoint": checkpoint,
                    "--gates": gates,
                    "--calibration": calibration,
                    "--cache-dir": cache,
                    "--root": root,
                }
            )
            run_plan = read_plan(plan_file)
            planned = run_plan.select(split(targets))
            record = run_plan.confirmed_source(progress)
            calib = run_plan.calibration_set() if any(p.needs_calibration for p in planned) else None
        else:
            record, planned, calib = _plan_build(
                checkpoint, split(targets), gates, calibration, cache, root, progress
            )
        if calib is not None:
            progress.log(
                f"calibration set {calib.name}: {len(calib.records)} samples, sha256 {calib.sha256[:12]}"
            )
        where = asked or run_plan.device
        progress.log(f"device: {where}")
        results = build_planned(record, planned, out, calib, progress, where)

    rows = [
        [
            r.target,
            r.status,
            r.manifest.format,
            format_bytes(r.manifest.total_bytes),
            f"{r.manifest.total_bytes / record.bytes:.2f}x",
            f"{r.manifest.build.seconds:.1f}",
            r.path,
        ]
        for r in results
    ]
    columns = ("target", "status", "format", "size", "vs source", "seconds", "path")
    print_table(text_table(f"quantgate build: {record.model_class} {record.architecture}", columns, rows))


def _plan_build(
    checkpoint: Path | None,
    targets: list[str] | None,
    gates: Path | None,
    calibration: Path | None,
    cache: Path | None,
    root: Path | None,
    progress: Progress,
) -> tuple[SourceRecord, list[PlannedBuild], CalibrationSet | None]:
    """Intake, the model class's targets (or ``--targets``) and their recipes, the calibration set."""
    from quantgate.calibration import load_or_build
    from quantgate.config import Catalog, check_target_names, load_gates, resolve_targets
    from quantgate.embedded import default_checkpoint
    from quantgate.intake import intake
    from quantgate.quantize import kv_decisions, plan

    project = (root or project_root()).resolve()
    catalog = Catalog(project)
    policy = load_gates(gates or project / "gates.yaml", catalog)
    cache_path = (cache or cache_dir()).resolve()
    if targets:  # a typo in --targets fails before minutes of conversion and hashing
        check_target_names(targets, catalog)
    source_dir = checkpoint or default_checkpoint(cache_path, progress)
    record = intake(source_dir, policy, progress, cache=cache_path / "intake")
    names = resolve_targets(policy, record.model_class, targets, catalog)
    # the class's KV policy, or each target's own under --targets (kv_calibration.kv_decisions)
    planned = plan(
        catalog, names, kv_decisions(policy, record.model_class, targets, [catalog.target(n) for n in names])
    )
    calib = None
    if any(p.needs_calibration for p in planned):
        calib = load_or_build(
            calibration or project / "calibration_sets" / "default.yaml", cache_path / "calibration"
        )
    return record, planned, calib
