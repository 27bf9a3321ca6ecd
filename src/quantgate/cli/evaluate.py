"""``quantgate eval``: the source once and every built artifact on the same items, in its numerics."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quantgate.cli.options import (
    CacheOpt,
    CheckpointOpt,
    DataDirOpt,
    DeviceOpt,
    DevicesOpt,
    GatesOpt,
    MaxMemoryOpt,
    PlanOpt,
    ProfileOpt,
    RootOpt,
    SequentialOpt,
    SuitesOpt,
    TargetsOpt,
    TenantsOpt,
    design,
    memory_budget,
    out_dir,
    refuse_beside_plan,
    split,
    spread,
)
from quantgate.runtime.errors import UsageError
from quantgate.runtime.escape import visible

if TYPE_CHECKING:
    from quantgate.evaluate import EvalRun
    from quantgate.runtime.progress import Progress


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
    devices: DevicesOpt = "all",
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Evaluate the source once and every artifact against it, in each target's numerics."""
    from quantgate.config import Catalog, load_gates
    from quantgate.evaluate import DataDir, EvalContext, evaluate
    from quantgate.orchestrate import read_plan, resolve_plan
    from quantgate.runtime.devices import resolve
    from quantgate.runtime.progress import SILENT, RichProgress

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
    if not reference_only:
        _require_dir(artifacts)
    # a run's step computes where its plan says, unless --device names a device
    asked = None if plan_file is not None and device == "auto" else resolve(device)
    out = out_dir(out, "--out")
    source_dir = Path(run_plan.source.path) if plan_file is not None else checkpoint
    where, config = asked or run_plan.device, _model_config(source_dir, artifacts)
    budget = memory_budget(max_memory, devices, where, config)
    shards = spread(devices, where, config)
    with contextlib.ExitStack() as stack:
        if shards is not None and not shards.writer:
            # a rank beside rank 0 computes the same evaluation, quietly, and writes it nowhere kept
            out = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix=f"quantgate-rank{shards.rank}-"))
            )
            progress: Progress = SILENT
            _quiet_libraries()
        else:
            progress = stack.enter_context(RichProgress())
        if plan_file is not None:
            record = run_plan.confirmed_source(progress)
        else:  # planned as a run plans, its suites only: the artifacts are what --artifacts holds
            run_plan = resolve_plan(
                checkpoint=checkpoint,
                out=out,
                tenants=split(tenants),
                suites=split(suites),
                profile=profile or "smoke",
                root=root,
                gates=gates,
                cache=cache,
                data_dir=data_dir,
                sequential=design(sequential),
                progress=progress,
                needs=["suites"],
            )
            record = run_plan.source
        project = Path(run_plan.root)
        data = DataDir.resolve(Path(run_plan.data_dir) if run_plan.data_dir else None, project)
        ctx = EvalContext(run_plan.profile, data, project, Path(run_plan.cache_dir), progress)
        run = evaluate(
            Path(record.path),
            record.content_hash,
            artifacts,
            out,
            run_plan.loaded_suites(),
            ctx,
            split(targets),
            model=run_plan.model,
            model_class=record.model_class,
            source_bytes=record.bytes,
            reference_only=reference_only,
            # the plan's design and tenants (the ones its run evaluated with) unless given here
            sequential=run_plan.sequential if sequential is None else sequential,
            gates=load_gates(Path(run_plan.gates), Catalog(project)),
            tenants=run_plan.tenants if tenants is None else split(tenants),
            device=asked or run_plan.device,
            max_memory=budget,
        )
    if shards is None or shards.writer:
        _print_summary(run, run_plan.profile, out)


def _model_config(checkpoint: Path | None, artifacts: Path) -> Path | None:
    """The config.json whose heads say how many GPUs ``--devices all`` can spread the model over."""
    if checkpoint is not None:
        return checkpoint / "config.json"
    found = sorted(artifacts.glob("*/config.json")) if artifacts.is_dir() else []
    return found[0] if found else None


def _quiet_libraries() -> None:
    """transformers' load reports and bars, which rank 0 shows once, not again by every other rank."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


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
