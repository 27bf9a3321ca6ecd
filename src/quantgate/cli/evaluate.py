"""``quantgate eval``: the source once and every built artifact on the same items, in its numerics."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quantgate.cli.options import (
    CacheOpt,
    CheckpointOpt,
    DataDirOpt,
    DeviceOpt,
    GatesOpt,
    PlanOpt,
    ProfileOpt,
    RootOpt,
    SequentialOpt,
    SuitesOpt,
    TargetsOpt,
    TenantsOpt,
    design,
    out_dir,
    refuse_beside_plan,
    split,
)
from quantgate.errors import UsageError
from quantgate.escape import visible
from quantgate.paths import cache_dir, project_root

if TYPE_CHECKING:
    from quantgate.evaluate import EvalRun


# the options only ``eval`` takes (the shared ones are in ``options``)
ArtifactsOpt = Annotated[
    Path, typer.Option("--artifacts", help="Directory of built artifacts (quantgate build --out).")
]
ResultsOutOpt = Annotated[
    Path, typer.Option("--out", help="Directory for results: <model>/<suite>.json, summary.json.")
]
ReferenceOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--reference-only", help="Evaluate the source alone (fills the reference cache); no artifacts."
    ),
]


def eval_(
    artifacts: ArtifactsOpt,
    out: ResultsOutOpt,
    checkpoint: CheckpointOpt = None,
    profile: ProfileOpt = None,
    suites: SuitesOpt = None,
    targets: TargetsOpt = None,
    data_dir: DataDirOpt = None,
    reference_only: ReferenceOnlyOpt = False,
    gates: GatesOpt = None,
    cache: CacheOpt = None,
    root: RootOpt = None,
    plan_file: PlanOpt = None,
    sequential: SequentialOpt = None,
    tenants: TenantsOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Evaluate the source once and every artifact against it, in each target's numerics."""
    from quantgate.config import Catalog, load_gates
    from quantgate.devices import resolve
    from quantgate.embedded import default_checkpoint
    from quantgate.evaluate import PROFILES, DataDir, EvalContext, evaluate, load_suites
    from quantgate.intake import intake
    from quantgate.orchestrate import read_plan
    from quantgate.progress import RichProgress

    if plan_file is not None:
        refuse_beside_plan(
            {
                "--checkpoint": checkpoint,
                "--profile": profile,
                "--suites": suites,
                "--data-dir": data_dir,
                "--gates": gates,
                "--cache-dir": cache,
                "--root": root,
            }
        )
        run_plan = read_plan(plan_file)
        run_plan.select(split(targets))  # a target the plan does not have is a typo
        if sequential is None:  # the plan's design: the one its run evaluated with
            sequential = run_plan.sequential
        watch = run_plan.tenants if tenants is None else split(tenants)
        floors = load_gates(Path(run_plan.gates), Catalog(Path(run_plan.root)))
        profile, project, cache_path = run_plan.profile, Path(run_plan.root), Path(run_plan.cache_dir)
        data_dir = Path(run_plan.data_dir) if run_plan.data_dir else None
        loaded, model = run_plan.loaded_suites(), run_plan.model
    else:
        profile = profile or "smoke"
        if profile not in PROFILES:
            raise UsageError("--profile", f"unknown profile '{profile}'", f"use one of {', '.join(PROFILES)}")
        project = (root or project_root()).resolve()
        policy = load_gates(gates or project / "gates.yaml", Catalog(project))
        cache_path = (cache or cache_dir()).resolve()
        loaded = load_suites(project / "eval_suites", split(suites))
        watch, floors = split(tenants), policy
        sequential = design(sequential)
    if not reference_only:
        _require_dir(artifacts)
    # a run's step computes where its plan says, unless --device names a device
    where = run_plan.device if plan_file is not None and device == "auto" else resolve(device)
    out = out_dir(out, "--out")
    with RichProgress() as progress:
        if plan_file is not None:
            record = run_plan.confirmed_source(progress)
        else:
            source_dir = checkpoint or default_checkpoint(cache_path, progress)
            record = intake(source_dir, policy, progress, cache=cache_path / "intake")
            model = record.model_name
        ctx = EvalContext(profile, DataDir.resolve(data_dir, project), project, cache_path, progress)
        run = evaluate(
            Path(record.path),
            record.content_hash,
            artifacts,
            out,
            loaded,
            ctx,
            split(targets),
            model=model,
            model_class=record.model_class,
            source_bytes=record.bytes,
            reference_only=reference_only,
            sequential=sequential,
            gates=floors,
            tenants=watch,
            device=where,
        )

    _print_summary(run, profile, out)


def _require_dir(artifacts: Path) -> None:
    """``--artifacts`` must be the directory a build wrote (exit 2 before any work)."""
    if not artifacts.is_dir():
        raise UsageError(
            artifacts,
            "--artifacts is an existing file, not a directory"
            if artifacts.exists()
            else "artifacts directory does not exist",
            "pass the directory quantgate build --out wrote",
        )


def _print_summary(run: EvalRun, profile: str, out: Path) -> None:
    """Each summary metric per model (with its numerics mode), and where the results are."""
    from quantgate.report import print_table, text_table

    keys = sorted({k for metrics in run.summary.values() for k in metrics})
    columns = ["metric", *(f"{name} ({run.numerics[name].get('mode', '?')})" for name in run.summary)]
    rows = [
        [key, *("-" if v is None else f"{v:.4g}" for v in (run.summary[n].get(key) for n in run.summary))]
        for key in keys
    ]
    title = f"quantgate eval ({profile}); source ran {run.source_forward_passes} forward passes"
    print_table(text_table(title, columns, rows))
    print(f"results: {visible(out / 'summary.json')}")
