"""``quantgate run``: build, evaluate, gate and publish in one Prefect flow run.

Takes what its steps take (``--root``, ``--cache-dir``, ``--data-dir``, ``--calibration``, ...),
each meaning what it means for ``build`` and ``eval``. The options become one ``RunRequest``, the
object a deployment passes too; the flow's ``RunOutcome`` is what is printed and the exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quantgate.cli.options import (
    CacheOpt,
    CalibrationOpt,
    DataDirOpt,
    DeviceOpt,
    DevicesOpt,
    GatesOpt,
    MaxMemoryOpt,
    ProfileOpt,
    RootOpt,
    SequentialOpt,
    SuitesOpt,
    TargetsOpt,
    TenantsOpt,
    design,
    memory_budget,
    out_dir,
    split,
)
from quantgate.runtime.errors import UsageError
from quantgate.runtime.escape import visible

if TYPE_CHECKING:
    from quantgate.orchestrate import RunOutcome

# the options only ``run`` takes (the shared ones are in ``options``)
SourceUriOpt = Annotated[
    str | None,
    typer.Option(
        "--checkpoint",
        help="Source checkpoint: a directory or s3://bucket/prefix. Default: the embedded SmolLM2-135M-Instruct.",
    ),
]
RunDirOpt = Annotated[
    Path, typer.Option("--out", help="Run directory: artifacts/, eval/, report/, logs/, outcome.json.")
]
PublishOpt = Annotated[
    bool,
    typer.Option(
        "--publish/--no-publish", help="Publish to the registry (MLFLOW_TRACKING_URI, else the local one)."
    ),
]
MaxHeavyOpt = Annotated[
    int, typer.Option("--max-heavy", help="Heavy steps (builds, evaluations) at once; 0: no limit.")
]
DaskWorkersOpt = Annotated[
    int, typer.Option("--dask-workers", help="Fan tasks out over a local Dask cluster of N worker processes.")
]
DaskAddressOpt = Annotated[
    str | None,
    typer.Option("--dask-address", help="Fan tasks out over a running Dask scheduler (tcp://host:8786)."),
]
StepTimeoutOpt = Annotated[
    float, typer.Option("--step-timeout", help="Seconds before a build or evaluation step is killed.")
]
RepairOpt = Annotated[
    bool,
    typer.Option(
        "--repair/--no-repair",
        help="After the gate, search each failed (target, tenant) marked repair: true in gates.yaml for "
        "the smallest mixed-precision variant that passes it; chosen variants are published too.",
    ),
]
VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Relay every line each step prints (its tables) and Prefect's line per task to the console. "
        "Default: a few lines per stage; every step's whole output is in <out>/logs/<step>.log either way.",
    ),
]


def run(
    checkpoint: SourceUriOpt = None,
    out: RunDirOpt = Path("runs"),
    targets: TargetsOpt = None,
    tenants: TenantsOpt = None,
    profile: ProfileOpt = "smoke",
    suites: SuitesOpt = None,
    gates: GatesOpt = None,
    calibration: CalibrationOpt = None,
    data_dir: DataDirOpt = None,
    cache: CacheOpt = None,
    root: RootOpt = None,
    publish: PublishOpt = True,
    max_heavy: MaxHeavyOpt = 1,
    dask_workers: DaskWorkersOpt = 0,
    dask_address: DaskAddressOpt = None,
    step_timeout: StepTimeoutOpt = 6 * 3600,
    sequential: SequentialOpt = None,
    repair: RepairOpt = False,
    device: DeviceOpt = "auto",
    devices: DevicesOpt = "all",
    max_memory: MaxMemoryOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Build, evaluate, gate and publish in one Prefect flow run (ephemeral, or PREFECT_API_URL's server)."""
    from pydantic import ValidationError

    from quantgate.orchestrate import RunRequest, run_flow, usage_error
    from quantgate.runtime.devices import resolve
    from quantgate.runtime.sharding import count

    where = resolve(device)
    count(devices, where)  # a count that is not one, or more GPUs than there are: refused before the flow
    memory_budget(max_memory, devices, where)  # likewise a budget no evaluation step could take
    try:
        request = RunRequest(
            checkpoint=checkpoint,
            targets=split(targets),
            tenants=split(tenants),
            suites=split(suites),
            profile=profile or "smoke",
            publish=publish,
            out=out,
            gates=gates,
            calibration=calibration,
            data_dir=data_dir,
            cache_dir=cache,
            root=root,
            max_heavy=max_heavy,
            step_timeout_s=step_timeout,
            sequential=design(sequential),
            repair=repair,
            device=where,
            devices=devices,
            max_memory=max_memory,
            verbose=verbose,
        )
    except ValidationError as exc:
        raise usage_error(exc) from None
    if checkpoint is not None and "://" not in checkpoint and not Path(checkpoint).expanduser().is_dir():
        raise UsageError(  # the cheapest refusal, before Prefect starts (the plan refuses the rest)
            checkpoint,
            "checkpoint directory does not exist",
            "pass a directory or an s3://bucket/prefix URI with --checkpoint",
        )
    out_dir(out, "--out")
    outcome, state = run_flow(request, dask_workers=dask_workers, dask_address=dask_address)
    if outcome is None:
        typer.secho(
            f"error: the flow run ended {visible(state.name)}: {visible(state.message)}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    _print_outcome(outcome, state.name or state.type.value)
    raise typer.Exit(outcome.exit_code)


def _print_outcome(outcome: RunOutcome, flow_run: str) -> None:
    """The verdict table, what repair found and published, failed builds, and the report files."""
    from quantgate.contracts.report_schema import read_report
    from quantgate.report import print_table, verdict_table

    report = read_report(outcome.reports.json_path)
    aliases = outcome.published.aliases() if outcome.published else None
    title = f"quantgate run: {outcome.model} ({outcome.model_class}), flow run {flow_run}"
    print_table(verdict_table(report, title, aliases))
    for searched in outcome.repair.targets if outcome.repair else []:
        for t in searched.tenants:
            kept = f"k={t.k} of {searched.units} groups kept at {searched.upgrade}"
            print(
                visible(
                    f"repair {searched.target} x {t.tenant}: {kept if t.k is not None else 'none'} ({t.stopped})"
                )
            )
    for published in outcome.published.repaired if outcome.published else []:
        for a in published.artifacts:
            print(
                visible(
                    f"repaired: {a.registered_model} version {a.version}, aliases {', '.join(a.aliases) or 'none'}"
                )
            )
    for target, message in outcome.build_failures.items():
        # the first line names the step and its log; the log's tail was on the console when it failed
        first = message.split("\n", 1)[0].rstrip(":")
        typer.secho(visible(f"build failed: {target}: {first}"), fg=typer.colors.RED, err=True)
    for path in outcome.reports.shown():
        print(f"report: {visible(str(path))}")
