"""``quantgate build``: plan the builds as a run does (``orchestrate.resolve_plan``: intake, targets,
recipes, KV decisions, calibration set), or read a run's plan, and build its artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quantgate.cli.options import (
    BuildMaxMemoryOpt,
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
    max_memory: BuildMaxMemoryOpt = None,
) -> None:
    """Validate the source checkpoint, then build one artifact per target."""
    from quantgate.orchestrate import read_plan, resolve_plan
    from quantgate.quantize import build_planned
    from quantgate.report import print_table, text_table
    from quantgate.runtime import offload
    from quantgate.runtime.devices import resolve
    from quantgate.runtime.progress import RichProgress
    from quantgate.runtime.units import format_bytes

    # a run's step computes where its plan says (read below), unless --device names a device
    asked = None if plan_file is not None and device == "auto" else resolve(device)
    offload.budget(max_memory, asked or "cpu")  # a value that is no size: refused before any work
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
        else:  # planned as a run plans, its builds only: no suite, no evaluation data
            run_plan = resolve_plan(
                checkpoint=checkpoint,
                out=out,
                targets=split(targets),
                root=root,
                gates=gates,
                cache=cache,
                calibration=calibration,
                progress=progress,
                needs=["builds"],
            )
        planned = run_plan.select(split(targets))
        # a plan read from disk describes a checkpoint that may have changed since; one resolved now does not
        record = run_plan.confirmed_source(progress) if plan_file is not None else run_plan.source
        calib = run_plan.calibration_set() if any(p.needs_calibration for p in planned) else None
        if calib is not None:
            progress.log(
                f"calibration set {calib.name}: {len(calib.records)} samples, sha256 {calib.sha256[:12]}"
            )
        where = asked or run_plan.device
        progress.log(f"device: {where}")
        budget = offload.budget(max_memory or run_plan.max_memory, where)
        results = build_planned(
            record, planned, out, calib, progress, where, Path(run_plan.cache_dir), max_memory=budget
        )

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
