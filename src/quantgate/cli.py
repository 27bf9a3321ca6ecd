"""The ``quantgate`` command line: a contract, since CI, the fleet and reviewers script it.

Exit codes (as the README states them): 0 success; 1 a required artifact failed (its build or
its gate); 2 bad input or usage, with a message naming the file and the fix; 75 a transient
failure (network, store I/O) that an orchestrator may retry. The commands are thin: they parse
options, call library functions and print; all behaviour lives in the library.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quantgate.errors import DiskFullError, QuantgateError, StepFailed, TransientError, UsageError
from quantgate.escape import visible
from quantgate.paths import cache_dir, project_root

if TYPE_CHECKING:
    from quantgate.calibration import CalibrationSet
    from quantgate.intake import SourceRecord
    from quantgate.progress import Progress
    from quantgate.quantize.pipeline import PlannedBuild

app = typer.Typer(
    name="quantgate",
    help="One source checkpoint in; per-hardware quantized artifacts out, each behind a quality gate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

CheckpointOpt = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint",
        help="Source checkpoint directory (safetensors, Hugging Face layout). "
        "Default: the embedded SmolLM2-135M-Instruct, converted once into the cache.",
    ),
]
TargetsOpt = Annotated[
    str | None,
    typer.Option(
        "--targets",
        help="Comma-separated targets to build (e.g. hopper-fp8,draft-int4), overriding the "
        "model class's targets from gates.yaml for this run.",
    ),
]
GatesOpt = Annotated[
    Path | None,
    typer.Option("--gates", help="Policy file with model classes. Default: <project>/gates.yaml."),
]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="Calibration set spec for calibrated targets. Default: <project>/calibration_sets/default.yaml.",
    ),
]
CacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        help="Where the converted default model and calibration sets are kept. "
        "Default: $QUANTGATE_CACHE or ~/.cache/quantgate.",
    ),
]
RootOpt = Annotated[
    Path | None,
    typer.Option(
        "--root",
        help="Project directory holding targets/, recipes/, gates.yaml. "
        "Default: $QUANTGATE_ROOT, else the checkout containing the working directory.",
    ),
]
PlanOpt = Annotated[
    Path | None,
    typer.Option(
        "--plan",
        help="A run's plan.json (quantgate run writes it in --out): the source, targets, recipes, suites and "
        "cache come from it instead of intake and the config files; --targets picks some of its targets. "
        "The checkpoint is confirmed unchanged (a stat per file) before any work.",
    ),
]


def _out_dir(path: Path, option: str) -> Path:
    """``path`` resolved, once it can be a directory to write in; ``UsageError`` (exit 2, before any
    work) when it, or its nearest existing parent, is a file, or is not writable."""
    path = path.resolve()
    existing = next(p for p in (path, *path.parents) if p.exists())
    where = "" if existing == path else f" (a parent of {path})"
    if not existing.is_dir():
        raise UsageError(
            existing,
            f"{option} needs a directory, but this{where} is an existing file",
            f"pass a directory for {option} (created when missing), or move the file away",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(
            existing,
            f"{option} is not writable here{where}",
            f"pass a directory you can write to for {option}, or fix its permissions",
        )
    return path


def _refuse_beside_plan(given: dict[str, object]) -> None:
    """A plan carries the source and the configs: an option that would override them is a usage error."""
    for option, value in given.items():
        if value is not None:
            raise UsageError(
                option, "is taken from --plan here", f"leave {option} out, or leave --plan out to plan anew"
            )


@app.command()
def build(
    out: Annotated[Path, typer.Option("--out", help="Directory for the artifacts: one <target>/ each.")],
    checkpoint: CheckpointOpt = None,
    targets: TargetsOpt = None,
    gates: GatesOpt = None,
    calibration: CalibrationOpt = None,
    cache: CacheOpt = None,
    root: RootOpt = None,
    plan_file: PlanOpt = None,
) -> None:
    """Validate the source checkpoint, then build one artifact per target."""
    from quantgate.orchestrate.plan import read_plan
    from quantgate.progress import RichProgress
    from quantgate.quantize.pipeline import build_planned
    from quantgate.report.console import print_table, text_table
    from quantgate.units import format_bytes

    out = _out_dir(out, "--out")
    with RichProgress() as progress:
        if plan_file is not None:
            _refuse_beside_plan(
                {
                    "--checkpoint": checkpoint,
                    "--gates": gates,
                    "--calibration": calibration,
                    "--cache-dir": cache,
                    "--root": root,
                }
            )
            run_plan = read_plan(plan_file)
            planned = run_plan.select(_split(targets))
            record = run_plan.confirmed_source(progress)
            calib = run_plan.calibration_set() if any(p.needs_calibration for p in planned) else None
        else:
            record, planned, calib = _plan_build(
                checkpoint, _split(targets), gates, calibration, cache, root, progress
            )
        if calib is not None:
            progress.log(
                f"calibration set {calib.name}: {len(calib.records)} samples, sha256 {calib.sha256[:12]}"
            )
        results = build_planned(record, planned, out, calib, progress)

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
    from quantgate.config.gates import check_target_names, load_gates, resolve_targets
    from quantgate.config.targets import Catalog
    from quantgate.embedded.smollm2 import default_checkpoint
    from quantgate.intake import intake
    from quantgate.quantize.kv_calibration import kv_decisions
    from quantgate.quantize.pipeline import plan

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


ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile", help="Suite sizes: 'smoke' (the default; minutes on 2 CPU cores) or 'full' (GPU scale)."
    ),
]


SequentialOpt = Annotated[
    bool | None,
    typer.Option(
        "--sequential/--fixed",
        help="Sequential (the default): score each suite in a seeded order, in batches, and stop once every "
        "floor on it is decided (always-valid bounds); fixed: every item.",
    ),
]


def _design(sequential: bool | None) -> bool:
    """--sequential/--fixed as given, else the default design (``evaluate.sequential.DEFAULT``)."""
    from quantgate.evaluate.sequential import DEFAULT

    return DEFAULT if sequential is None else sequential


@app.command("eval")
def eval_(
    artifacts: Annotated[
        Path, typer.Option("--artifacts", help="Directory of built artifacts (quantgate build --out).")
    ],
    out: Annotated[
        Path, typer.Option("--out", help="Directory for results: <model>/<suite>.json, summary.json.")
    ],
    checkpoint: CheckpointOpt = None,
    profile: ProfileOpt = None,
    suites: Annotated[
        str | None, typer.Option("--suites", help="Comma-separated suites from eval_suites/ (default: all).")
    ] = None,
    targets: Annotated[
        str | None,
        typer.Option(
            "--targets", help="Comma-separated artifacts to evaluate (default: all in --artifacts)."
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="Evaluation data (GSM8K, WikiText-2). Default: $QUANTGATE_DATA, else ../shared/datasets.",
        ),
    ] = None,
    reference_only: Annotated[
        bool,
        typer.Option(
            "--reference-only", help="Evaluate the source alone (fills the reference cache); no artifacts."
        ),
    ] = False,
    gates: GatesOpt = None,
    cache: CacheOpt = None,
    root: RootOpt = None,
    plan_file: PlanOpt = None,
    sequential: SequentialOpt = None,
    tenants: Annotated[
        str | None,
        typer.Option(
            "--tenants", help="With --sequential: stop on these tenants' floors only (default: all)."
        ),
    ] = None,
) -> None:
    """Evaluate the source once and every artifact against it, in each target's numerics."""
    from quantgate.config.gates import load_gates
    from quantgate.config.targets import Catalog
    from quantgate.embedded.smollm2 import default_checkpoint
    from quantgate.evaluate.data import DataDir
    from quantgate.evaluate.runner import evaluate
    from quantgate.evaluate.suites import PROFILES, EvalContext, load_suites
    from quantgate.intake import intake
    from quantgate.orchestrate.plan import read_plan
    from quantgate.progress import RichProgress
    from quantgate.report.console import print_table, text_table

    if plan_file is not None:
        _refuse_beside_plan(
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
        run_plan.select(_split(targets))  # a target the plan does not have is a typo
        if sequential is None:  # the plan's design: the one its run evaluated with
            sequential = run_plan.sequential
        watch = run_plan.tenants if tenants is None else _split(tenants)
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
        loaded = load_suites(project / "eval_suites", _split(suites))
        watch, floors = _split(tenants), policy
        sequential = _design(sequential)
    if not reference_only and not artifacts.is_dir():
        raise UsageError(
            artifacts,
            "--artifacts is an existing file, not a directory"
            if artifacts.exists()
            else "artifacts directory does not exist",
            "pass the directory quantgate build --out wrote",
        )
    out = _out_dir(out, "--out")
    with RichProgress() as progress:
        if plan_file is not None:
            record = run_plan.confirmed_source(progress)
        else:
            source_dir = checkpoint or default_checkpoint(cache_path, progress)
            record = intake(source_dir, policy, progress, cache=cache_path / "intake")
            model = model_name(record)
        ctx = EvalContext(profile, DataDir.resolve(data_dir, project), project, cache_path, progress)
        run = evaluate(
            Path(record.path),
            record.content_hash,
            artifacts,
            out,
            loaded,
            ctx,
            _split(targets),
            model=model,
            model_class=record.model_class,
            source_bytes=record.bytes,
            reference_only=reference_only,
            sequential=sequential,
            gates=floors,
            tenants=watch,
        )

    keys = sorted({k for metrics in run.summary.values() for k in metrics})
    columns = ["metric", *(f"{name} ({run.numerics[name].get('mode', '?')})" for name in run.summary)]
    rows = [
        [key, *("-" if v is None else f"{v:.4g}" for v in (run.summary[n].get(key) for n in run.summary))]
        for key in keys
    ]
    title = f"quantgate eval ({profile}); source ran {run.source_forward_passes} forward passes"
    print_table(text_table(title, columns, rows))
    print(f"results: {visible(out / 'summary.json')}")


@app.command()
def gate(
    results: Annotated[Path, typer.Option("--results", help="Evaluation directory (quantgate eval --out).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for report.json, report.md and report.html.")],
    gates: Annotated[
        Path | None,
        typer.Option("--gates", help="Tenant floors and model classes. Default: <project>/gates.yaml."),
    ] = None,
    tenants: Annotated[
        str | None, typer.Option("--tenants", help="Comma-separated tenants to gate (default: every tenant).")
    ] = None,
    model_class: Annotated[
        str | None,
        typer.Option(
            "--model-class",
            help="Model class deciding which targets are required (default: from the evaluation).",
        ),
    ] = None,
    previous: Annotated[
        Path | None,
        typer.Option(
            "--previous",
            help="Offline: the report directory of the previous approved version, for before/after deltas, "
            "instead of the versions the registry (MLFLOW_TRACKING_URI, else artifacts_registry/) approves.",
        ),
    ] = None,
    root: RootOpt = None,
) -> None:
    """Judge every artifact against every tenant's floors; exit 1 if a required artifact passes none.

    Each (artifact, tenant) is compared with the version the registry approves for that tenant
    today (before/after deltas, max_regression floors); a registry that cannot answer is exit 75.
    """
    from quantgate.gate.run import gate_results, write_report_json
    from quantgate.publish.config import RegistryConfig
    from quantgate.report.console import print_table, verdict_table

    project = (root or project_root()).resolve()
    if not (results / "summary.json").exists():
        raise UsageError(
            results, "no summary.json here", "run quantgate eval --out DIR first and pass that DIR"
        )
    out = _out_dir(out, "--out")
    decision = gate_results(
        results,
        gates or project / "gates.yaml",
        project,
        model_class=model_class,
        tenants=_split(tenants),
        previous=previous,
        registry=None if previous is not None else RegistryConfig.from_env(project),
    )
    report = write_report_json(decision, out, results)
    written = _render_reports(report)
    title = f"quantgate gate: {decision.model} ({decision.model_class or 'class unknown'})"
    print_table(verdict_table(decision, title))
    for path in (report, *written):
        print(f"report: {visible(path)}")
    raise typer.Exit(decision.exit_code)


def _render_reports(report_json: Path) -> list[Path]:
    """report.md and report.html beside report.json."""
    from quantgate.report import write_reports
    from quantgate.report_schema import read_report

    report = read_report(report_json, fix="run quantgate gate --out DIR first")
    return list(write_reports(report, report_json.parent).values())


@app.command()
def report(
    report_dir: Annotated[
        Path, typer.Option("--report", help="Directory holding report.json (quantgate gate --out).")
    ],
) -> None:
    """Render report.md and report.html again from report.json (e.g. after a template change)."""
    for path in _render_reports(report_dir / "report.json"):
        print(f"report: {visible(path)}")


@app.command()
def publish(
    report_dir: Annotated[
        Path, typer.Option("--report", help="Directory holding report.json (quantgate gate --out).")
    ],
    artifacts: Annotated[
        Path,
        typer.Option(
            "--artifacts", help="Directory of the built artifacts that report gated (quantgate build --out)."
        ),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the outcome as JSON instead of a table.")
    ] = False,
    root: RootOpt = None,
) -> None:
    """Publish every gated artifact to the registry; alias each for the tenants it passed.

    Registry: MLFLOW_TRACKING_URI, else the embedded one under artifacts_registry/ (see its README).
    """
    from quantgate.progress import RichProgress
    from quantgate.publish import RegistryConfig, publish_report
    from quantgate.report.console import print_table, text_table

    cfg = RegistryConfig.from_env((root or project_root()).resolve())
    with RichProgress() as progress:
        outcome = publish_report(report_dir / "report.json", artifacts, cfg, progress)
    if as_json:
        print(json.dumps(outcome.to_dict(), indent=1))
        return
    rows = [
        [
            a.registered_model,
            a.version,
            "yes" if a.created else "no (same content)",
            ", ".join(a.aliases) or "- (failed gate: recorded for audit)",
            a.source,
        ]
        for a in outcome.artifacts
    ]
    columns = ("registered model", "version", "new", "aliases", "source")
    print_table(text_table(f"quantgate publish: {outcome.model} -> {outcome.tracking_uri}", columns, rows))


@app.command()
def pull(
    model: Annotated[str, typer.Argument(help="Model name as published (the report's 'model').")],
    target: Annotated[str, typer.Option("--target", help="Hardware target, e.g. hopper-fp8.")],
    tenant: Annotated[
        str, typer.Option("--tenant", help="Tenant whose approval (alias approved-<tenant>) to pull.")
    ],
    dest: Annotated[
        Path | None,
        typer.Option("--dest", help="Also place the artifact here: a copy sharing no inode with the cache."),
    ] = None,
    link: Annotated[
        bool,
        typer.Option(
            "--link",
            help="--dest gets hard links into the cache (no second copy); an edit there is then an edit "
            "of the cache entry, refused by the next pull's verification.",
        ),
    ] = False,
    verify: Annotated[
        str | None,
        typer.Option(
            "--verify",
            help="Re-hash a cached copy on every pull ('always', the default) or on --offline pulls only "
            "('offline'). Default: QUANTGATE_PULL_VERIFY, else pull_verify in artifacts_registry/registry.yaml.",
        ),
    ] = None,
    version: Annotated[
        str | None,
        typer.Option("--version", help="A specific version (refused unless approved for the tenant)."),
    ] = None,
    allow_unapproved: Annotated[
        bool,
        typer.Option(
            "--allow-unapproved", help="Accept a version the gate did not approve (never for serving)."
        ),
    ] = False,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline", help="No registry call: the version this node last resolved, from its cache."
        ),
    ] = False,
    cache: CacheOpt = None,
    root: RootOpt = None,
) -> None:
    """Download the approved artifact, verify every sha256, and print the local path to load."""
    from quantgate.progress import RichProgress
    from quantgate.publish import RegistryConfig
    from quantgate.publish import pull as pull_artifact

    cfg = RegistryConfig.from_env((root or project_root()).resolve())
    if verify is not None:
        if verify not in ("always", "offline"):
            raise UsageError(
                "--verify", f"'{verify}' is not a schedule", "pass --verify always or --verify offline"
            )
        cfg = cfg.model_copy(update={"pull_verify": verify})
    with RichProgress() as progress:
        path = pull_artifact(
            model,
            target,
            tenant,
            cfg,
            cache_dir=(cache or cache_dir()).resolve(),
            dest=dest,
            allow_unapproved=allow_unapproved,
            progress=progress,
            version=version,
            offline=offline,
            link=link,
        )
    print(path)


@app.command()
def repair(
    results: Annotated[Path, typer.Option("--results", help="Evaluation directory (quantgate eval --out).")],
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
    targets: Annotated[
        str | None,
        typer.Option("--targets", help="Comma-separated targets to repair (default: every failed one)."),
    ] = None,
    tenants: Annotated[
        str | None,
        typer.Option(
            "--tenants",
            help="Repair these tenants' failures (default: tenants or classes marked repair: true).",
        ),
    ] = None,
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget", min=1, help="Variants built and evaluated per target (default: gates.yaml repair)."
        ),
    ] = None,
    checkpoint: CheckpointOpt = None,
    calibration: CalibrationOpt = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir", help="Evaluation data. Default: $QUANTGATE_DATA, else ../shared/datasets."
        ),
    ] = None,
    gates: GatesOpt = None,
    cache: CacheOpt = None,
    root: RootOpt = None,
    plan_file: Annotated[
        Path | None,
        typer.Option("--plan", help="The run's plan.json (default: plan.json beside --results when there)."),
    ] = None,
) -> None:
    """Search, for each failed (target, tenant), the smallest mixed-precision variant that passes.

    Each variant keeps the k most sensitive layer groups one precision up (the target's repair:
    section); bisection on k, every variant built, evaluated in its target's numerics and gated.
    Exit 0 when every searched tenant found a variant, 1 when some found none within the budget.
    """
    from quantgate.repair.command import repair_command

    code = repair_command(
        results=results,
        artifacts=artifacts,
        out=out,
        report_json=report_json,
        targets=_split(targets),
        tenants=_split(tenants),
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
    )
    raise typer.Exit(code)


@app.command()
def run(
    checkpoint: Annotated[
        str | None,
        typer.Option(
            "--checkpoint",
            help="Source checkpoint: a directory or s3://bucket/prefix. "
            "Default: the embedded SmolLM2-135M-Instruct.",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Run directory: artifacts/, eval/, report/, logs/, outcome.json.")
    ] = Path("runs"),
    targets: TargetsOpt = None,
    tenants: Annotated[
        str | None, typer.Option("--tenants", help="Comma-separated tenants to gate (default: all).")
    ] = None,
    profile: ProfileOpt = "smoke",
    suites: Annotated[
        str | None, typer.Option("--suites", help="Comma-separated suites (default: all).")
    ] = None,
    gates: GatesOpt = None,
    publish: Annotated[
        bool,
        typer.Option(
            "--publish/--no-publish",
            help="Publish to the registry (MLFLOW_TRACKING_URI, else the local one).",
        ),
    ] = True,
    max_heavy: Annotated[
        int, typer.Option("--max-heavy", help="Heavy steps (builds, evaluations) at once; 0: no limit.")
    ] = 1,
    dask_workers: Annotated[
        int,
        typer.Option("--dask-workers", help="Fan tasks out over a local Dask cluster of N worker processes."),
    ] = 0,
    dask_address: Annotated[
        str | None,
        typer.Option("--dask-address", help="Fan tasks out over a running Dask scheduler (tcp://host:8786)."),
    ] = None,
    step_timeout: Annotated[
        float, typer.Option("--step-timeout", help="Seconds before a build or evaluation step is killed.")
    ] = 6 * 3600,
    sequential: SequentialOpt = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair/--no-repair",
            help="After the gate, search each failed (target, tenant) marked repair: true in gates.yaml for "
            "the smallest mixed-precision variant that passes it; chosen variants are published too.",
        ),
    ] = False,
) -> None:
    """Build, evaluate, gate and publish in one Prefect flow run (ephemeral, or PREFECT_API_URL's server)."""
    from quantgate.orchestrate.run import run_flow
    from quantgate.report.console import print_table, verdict_table

    if not math.isfinite(step_timeout) or step_timeout <= 0:  # click reads "inf" and "nan" as floats
        raise UsageError(
            "--step-timeout", f"{step_timeout} is not a time limit", "pass a finite number of seconds above 0"
        )
    _out_dir(out, "--out")
    outcome, state = run_flow(
        checkpoint=checkpoint,
        targets=_split(targets),
        tenants=_split(tenants),
        profile=profile,
        publish=publish,
        out=str(out),
        suites=_split(suites),
        gates=str(gates) if gates else None,
        max_heavy=max_heavy,
        step_timeout_s=step_timeout,
        dask_workers=dask_workers,
        dask_address=dask_address,
        sequential=_design(sequential),
        repair=repair,
    )
    if outcome is None:
        typer.secho(
            f"error: the flow run ended {visible(state.name)}: {visible(state.message)}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)
    report = json.loads(Path(outcome["reports"]["json"]).read_text())
    aliases = None
    if outcome.get("published") is not None:
        aliases = {a["artifact"]: a.get("aliases", []) for a in outcome["published"].get("artifacts", [])}
    title = f"quantgate run: {outcome['model']} ({outcome['model_class']}), flow run {state.name}"
    print_table(verdict_table(report, title, aliases))
    for target in (outcome.get("repair") or {}).get("targets", []):
        for t in target["tenants"]:
            found = (
                f"k={t['k']} of {target['units']} groups kept at {target['upgrade']}"
                if t["k"] is not None
                else "none"
            )
            print(visible(f"repair {target['target']} x {t['tenant']}: {found} ({t['stopped']})"))
    for published in (outcome.get("published") or {}).get("repaired", []):
        for a in published["artifacts"]:
            print(
                visible(
                    f"repaired: {a['registered_model']} version {a['version']}, "
                    f"aliases {', '.join(a['aliases']) or 'none'}"
                )
            )
    for target, message in outcome["build_failures"].items():
        typer.secho(visible(f"build failed: {target}: {message}"), fg=typer.colors.RED, err=True)
    for kind in ("md", "html", "json"):
        if kind in outcome["reports"]:
            print(f"report: {visible(outcome['reports'][kind])}")
    raise typer.Exit(outcome["exit_code"])


def model_name(record) -> str:
    """The registered model's name for an intake record (see ``embedded.smollm2.model_name``)."""
    from quantgate.embedded.smollm2 import model_name as name_of

    return name_of(record.path)


def _split(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


@app.callback()
def _root() -> None:
    """One source checkpoint in; per-hardware quantized artifacts out, each behind a quality gate."""


def main() -> None:
    """Entry point: click handles usage errors (exit 2); quantgate's own errors exit with their code."""
    from quantgate.orchestrate.steps import end_with_parent

    end_with_parent()  # a pipeline step ends with the run that started it
    try:
        app()
    except QuantgateError as exc:
        # one error, one line: a name holding a newline or an escape cannot forge or hide a line
        # (a failed step's log tail keeps its own lines, each shown the same way)
        text = visible(exc, newlines=isinstance(exc, StepFailed))
        typer.secho(f"error: {text}", fg=typer.colors.RED, err=True)
        sys.exit(exc.exit_code)
    except (ConnectionError, TimeoutError) as exc:  # network or store hiccup: safe to retry
        typer.secho(f"error (transient, retry): {visible(exc)}", fg=typer.colors.RED, err=True)
        sys.exit(TransientError.exit_code)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # a write outside quantgate's atomic helpers (which raise DiskFullError themselves)
        where = visible(exc.filename or "a file being written")
        typer.secho(
            f"error: {where}: no space left on device ({errno.errorcode[exc.errno]}). Fix: free space and re-run",
            fg=typer.colors.RED,
            err=True,
        )
        sys.exit(DiskFullError.exit_code)


if __name__ == "__main__":
    main()
