"""``quantgate repair``: for each failed (target, tenant), the smallest variant that passes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quantgate.cli.options import (
    CacheOpt,
    CalibrationOpt,
    CheckpointOpt,
    DataDirOpt,
    DeviceOpt,
    GatesOpt,
    ResultsOpt,
    RootOpt,
    TargetsOpt,
    TenantsOpt,
    split,
)


def repair(
    results: ResultsOpt,
    artifacts: Annotated[
        Path, typer.Option("--artifacts", help="Artifacts directory (quantgate build --out).")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Where variants and repair.json go. Default: repair/ beside --results."),
    ] = None,
    report_json: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="The gate's report.json to repair (its repairs are added to it and re-rendered). "
            "Default: report/report.json beside --results, else the results are gated now.",
        ),
    ] = None,
    targets: TargetsOpt = None,
    tenants: TenantsOpt = None,
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget", min=1, help="Variants built and evaluated per target (default: gates.yaml repair)."
        ),
    ] = None,
    checkpoint: CheckpointOpt = None,
    calibration: CalibrationOpt = None,
    data_dir: DataDirOpt = None,
    gates: GatesOpt = None,
    cache: CacheOpt = None,
    root: RootOpt = None,
    plan_file: Annotated[
        Path | None,
        typer.Option(
            "--plan",
            help="The run's plan.json (default: plan.json beside --results when there; 'none': plan anew).",
        ),
    ] = None,
    device: DeviceOpt = "auto",
) -> None:
    """Search, for each failed (target, tenant), the smallest mixed-precision variant that passes.

    Each variant keeps the k most sensitive layer groups one precision up (the target's repair:
    section); bisection on k, every variant built, evaluated in its target's numerics and gated.
    Exit 0 when every searched tenant found a variant, 1 when some found none within the budget.
    """
    from quantgate.orchestrate import repair_command

    code = repair_command(
        results=results,
        artifacts=artifacts,
        out=out,
        report_json=report_json,
        targets=split(targets),
        tenants=split(tenants),
        budget=budget,
        options={
            "--checkpoint": checkpoint,
            "--calibration": calibration,
            "--data-dir": data_dir,
            "--gates": gates,
            "--cache-dir": cache,
            "--root": root,
        },
        plan_file=plan_file,
        device=device,
    )
    raise typer.Exit(code)
