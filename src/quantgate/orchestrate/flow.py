"""The Prefect flow ``build_and_gate``: plan -> builds -> reference -> evaluations -> gate -> publish.

One code path for CI, GPU workers and a laptop: each heavy step is the ``quantgate`` command a
person would run, in its own process with a time limit, reading the plan made once
(``plan.py``); the light steps call the library functions the commands call. Prefect adds
caching under content keys, retries for transient failures only (exit 75: a failed build or
gate gives the same answer again), a global limit on heavy steps (the default task runner would
start them all at once), and a final state that is the gate's outcome, not the tasks'.

A run owns its ``--out`` (``out_lock``): the flow holds the directory's lock from before it plans
until its outcome is written, its plan names its flow run, each step is told that id and refuses
another run's plan, and the gate and publish check the plan on disk (and publish every artifact
against what this run built) before they read anything.

Typed end to end: the flow takes one ``RunRequest`` (a deployment's parameters are ``{"request":
{...}}``, validated by Prefect against it), each task returns its stage's typed result
(``outcome.py``), and the run ends with a ``RunOutcome`` written to ``<out>/outcome.json``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.exceptions import ExternalSignal
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State

from quantgate.contracts.results import SOURCE
from quantgate.orchestrate import console, heavy_slots, out_lock
from quantgate.orchestrate.outcome import (
    OUTCOME,
    BuiltArtifact,
    Evaluated,
    Gated,
    Published,
    ReportPaths,
    RunOutcome,
    VerdictRow,
)
from quantgate.orchestrate.plan import RUN_ID_ENV, RunPlan, digest, resolve_plan, stamped
from quantgate.orchestrate.request import RunRequest
from quantgate.orchestrate.steps import LogProgress, run_step, stop_all
from quantgate.publish import PublishOutcome
from quantgate.repair import RepairOutcome
from quantgate.runtime import errors
from quantgate.runtime.atomic import write_json
from quantgate.runtime.errors import InputError, TransientError
from quantgate.runtime.progress import SILENT, Progress
from quantgate.runtime.units import format_bytes

if TYPE_CHECKING:
    from quantgate.gate import Baselines

__all__ = ["OUTCOME", "PlanRefused", "build_and_gate", "plan_of", "regate"]
_RETRIES = 2
# the form of the cached tasks' results (2: typed, ``outcome.py``; 1: dicts): in every cache key, so
# that a result persisted in another form is never served to this code
_RESULT_FORM = 2


def _only_transient(_task, _task_run, state) -> bool:
    """Retry condition: the step failed with ``TransientError`` (exit 75), nothing else."""
    try:
        state.result()
    except TransientError:
        return True
    except Exception:  # noqa: BLE001  every other failure is final: retrying gives the same answer
        return False
    return False


def _keyed(kind: str, key_of: Callable[..., list[Any]]):
    """A ``cache_key_fn`` hashing ``kind`` with the content parts ``key_of`` names; ``key_of`` takes
    the task's own parameters by their names (a renamed parameter fails at once), ``plan`` first."""

    def cache_key(_context, parameters: dict[str, Any]) -> str:
        plan: RunPlan = parameters["plan"]
        parts = key_of(**parameters)
        return f"quantgate-{kind}-" + digest(kind, _RESULT_FORM, plan.stamp, plan.tools_hash, *parts)

    return cache_key


@contextlib.contextmanager
def _steps_stopped_on_signal() -> Iterator[None]:
    """A signal that stops the run (SIGTERM: Prefect raises ``TerminationSignal``; Ctrl-C) stops
    its running steps too, which run in their own process groups, and lets no waiting step
    start; the run then ends as Prefect ends a terminated one (exit 143 for SIGTERM)."""
    heavy_slots.stopping.clear()
    try:
        yield
    except (KeyboardInterrupt, ExternalSignal):
        heavy_slots.stopping.set()
        stopped = stop_all()
        get_run_logger().warning("stopping: %d running step(s) stopped, nothing published", stopped)
        raise


@contextlib.contextmanager
def _heavy_stage(plan: RunPlan, label: str, name: str) -> Iterator[console.Stage]:
    """A heavy step's stage on the console: its slot is held first, so the stage's lines (start,
    heartbeat, duration) count running, not waiting for a slot, which is said when it lasts."""
    say = console.run_logger()
    console.quiet_prefect(plan.verbose)  # in this process: a Dask worker's too
    with heavy_slots.held(plan.max_heavy, say.info), console.Stage(say, label, plan.log(name)) as stage:
        yield stage


def _step(plan: RunPlan, stage: console.Stage, name: str, args: list[str]) -> None:
    """Run ``quantgate <args>`` as step ``name`` (its log: ``plan.log(name)``): warnings and errors
    it prints reach the console through ``stage``; with ``--verbose`` every stdout line too, on the
    task's run logger as before."""
    env = {RUN_ID_ENV: plan.run_id} if plan.run_id else None  # the step refuses another run's plan
    output = console.step_output(stage, get_run_logger().info if plan.verbose else None)
    run_step(name, args, plan.log(name), plan.step_timeout_s, env=env, **output)


def _eval_args(plan: RunPlan, out: Path) -> list[str]:
    """``quantgate eval`` reading the plan: source, suites, profile and data come from it."""
    return [
        "eval",
        "--plan",
        str(plan.file),
        "--artifacts",
        str(plan.artifacts_dir),
        "--out",
        str(out),
        "--devices",
        plan.devices,
        *(["--max-memory", plan.max_memory] if plan.max_memory else []),
    ]


@dataclass(frozen=True)
class PlanRefused:
    """Bad input found while planning, as the plan task's result rather than its exception: a
    raised one was Prefect's traceback on the console, twice (the task's and the flow's), before
    the command line's one error line (issue 44). ``quantgate run`` raises ``error()``."""

    kind: str  # the InputError subclass's name (quantgate.runtime.errors)
    path: str | None
    problem: str
    fix: str

    @classmethod
    def of(cls, exc: InputError) -> PlanRefused:
        """The refusal of ``exc``."""
        return cls(type(exc).__name__, exc.path, exc.problem, exc.fix)

    def error(self) -> InputError:
        """The refusal as the error it was (exit 2)."""
        kind = getattr(errors, self.kind, InputError)
        made = kind(self.path, self.problem, self.fix) if issubclass(kind, InputError) else None
        return made if isinstance(made, InputError) else InputError(self.path, self.problem, self.fix)


def plan_of(request: RunRequest, run_id: str = "", progress: Progress = SILENT) -> RunPlan:
    """The run's plan, made from ``request`` field by field and written to ``<out>/plan.json``:
    the checkpoint fetched when it is a URI (``s3://``), the device resolved where the flow runs
    (a deployment's ``auto`` is its worker's GPU), the evaluation data from ``$QUANTGATE_DATA``
    when not given, so that every step reads the same directory."""
    from quantgate.config import cache_dir, path_setting
    from quantgate.orchestrate.checkpoint_uri import local_checkpoint
    from quantgate.runtime.devices import resolve

    cache = (request.cache_dir or cache_dir()).resolve()
    checkpoint = local_checkpoint(request.checkpoint, cache) if request.checkpoint else None
    plan = resolve_plan(
        checkpoint=checkpoint,
        out=request.out,
        targets=request.targets,
        tenants=request.tenants,
        suites=request.suites,
        profile=request.profile,
        root=request.root,
        gates=request.gates,
        cache=cache,
        data_dir=request.data_dir or path_setting("QUANTGATE_DATA"),
        calibration=request.calibration,
        step_timeout_s=request.step_timeout_s,
        max_heavy=request.max_heavy,
        verbose=request.verbose,
        progress=progress,
        sequential=request.sequential,
        run_id=run_id,
        device=resolve(request.device),
        devices=request.devices,
        max_memory=request.max_memory,
    )
    return stamped(plan, progress)


@task(name="plan", retries=_RETRIES, retry_condition_fn=_only_transient)
def plan_run(request: RunRequest, run_id: str) -> RunPlan | PlanRefused:
    """Fetch (s3://), intake (validate, hash, classify) and plan; bad input is refused here, before
    any build (``PlanRefused``).

    The run's one intake; ``logs/plan.log`` records it, as every heavy step's log records its step.
    """
    log = request.out.resolve() / "logs" / "plan.log"
    progress = LogProgress(log, on_line=get_run_logger().info if request.verbose else None)
    with console.Stage(console.run_logger(), "plan", log) as stage:
        try:
            plan = plan_of(request, run_id, progress)
        except InputError as exc:
            stage.done("refused")
            return PlanRefused.of(exc)
        stage.done("planned", _planned(plan))
    return plan


def _planned(plan: RunPlan) -> str:
    """The plan's key result: the targets, the build steps they take, the suites."""
    steps, suites = len(plan.build_groups), len(plan.suites)
    return (
        f"{len(plan.targets)} targets in {steps} build step{'s' * (steps != 1)}, "
        f"{suites} suite{'s' * (suites != 1)}"
    )


@task(
    name="build",
    task_run_name="build-{name}",
    cache_key_fn=_keyed(
        "build", lambda plan, targets, name: [plan.source_hash, *(plan.target_hashes[t] for t in targets)]
    ),
    persist_result=True,
    retries=_RETRIES,
    retry_condition_fn=_only_transient,
)
def build_artifacts(plan: RunPlan, targets: list[str], name: str) -> list[BuiltArtifact]:
    """Build one group of twin targets (``RunPlan.build_groups``) in one ``quantgate build --plan``,
    which builds the first and links the others; each manifest's build key, file digest and size."""
    args = [
        "build",
        "--plan",
        str(plan.file),
        "--targets",
        ",".join(targets),
        "--out",
        str(plan.artifacts_dir),
    ]
    with _heavy_stage(plan, f"build {name}", f"build-{name}") as stage:
        _step(plan, stage, f"build-{name}", args)
        built = [_built_artifact(plan, target) for target in targets]
        stage.done("built", _built(built))
    return built


def _built_artifact(plan: RunPlan, target: str) -> BuiltArtifact:
    """What the manifest of ``target``'s installed artifact says was built."""
    from quantgate.contracts.artifact import require_manifest

    manifest = require_manifest(plan.artifacts_dir / target)
    return BuiltArtifact(
        target=target,
        build_key=manifest.build_key,
        files=digest({rel: entry.sha256 for rel, entry in manifest.files.items()}),
        bytes=manifest.total_bytes,
        linked_from=manifest.build.linked_from,
        ran_in=_where(),
    )


def _built(built: list[BuiltArtifact]) -> str:
    """A build step's key result: each artifact's size, or that it is a twin's link."""
    return ", ".join(
        f"{b.target} linked" if b.linked_from else f"{b.target} {format_bytes(b.bytes)}" for b in built
    )


@task(
    name="reference",
    cache_key_fn=_keyed(
        "reference",
        lambda plan: [
            plan.source_hash,
            plan.suites_hash,
            plan.profile,
            plan.eval_env,
            plan.device,
            plan.devices,
        ],
    ),
    persist_result=True,
    retries=_RETRIES,
    retry_condition_fn=_only_transient,
)
def evaluate_reference(plan: RunPlan) -> Evaluated:
    """The source, once: fills the reference cache every artifact evaluation then reads."""
    out = plan.eval_part(SOURCE)
    with _heavy_stage(plan, "evaluate source", "eval-source") as stage:
        _step(plan, stage, "eval-source", [*_eval_args(plan, out), "--reference-only"])
        part = _evaluated(SOURCE, out)
        stage.done(_suites(part), "the reference every artifact is compared with")
    return part


def _evaluated(name: str, out: Path) -> Evaluated:
    from quantgate.contracts.results import EvaluationPart

    part = EvaluationPart.read(name, out)
    return Evaluated(name=part.name, dir=part.dir, summary=part.summary, ran_in=_where())


def _suites(part: Evaluated) -> str:
    """'3 suites': how many suites an evaluation step has results of for its model."""
    count = len(part.suites)
    return f"{count} suite{'s' * (count != 1)}"


@task(
    name="evaluate",
    task_run_name="evaluate-{built.target}",
    cache_key_fn=_keyed(
        "evaluate",
        lambda plan, built: [
            built.what(),  # what was built, not where
            plan.source_hash,
            plan.suites_hash,
            plan.profile,
            plan.eval_env,
            plan.device,
            plan.devices,
            # a sequential evaluation stops where the floors are decided: it depends on gates.yaml
            *([plan.gates_hash, plan.tenants] if plan.sequential else []),
        ],
    ),
    persist_result=True,
    retries=_RETRIES,
    retry_condition_fn=_only_transient,
)
def evaluate_artifact(plan: RunPlan, built: BuiltArtifact) -> Evaluated:
    """Evaluate one built artifact against the cached reference (``quantgate eval --plan``)."""
    out = plan.eval_part(built.target)
    with _heavy_stage(plan, f"evaluate {built.target}", f"eval-{built.target}") as stage:
        _step(plan, stage, f"eval-{built.target}", [*_eval_args(plan, out), "--targets", built.target])
        part = _evaluated(built.target, out)
        stage.done(_suites(part))
    return part


@task(name="baselines", retries=_RETRIES, retry_condition_fn=_only_transient)
def find_baselines(root: str, model: str, build_keys: dict[str, str | None]) -> Baselines:
    """The version the registry approves per (target, tenant) today, with its gate report: looked up
    on every run (never cached) and handed to the gate, whose cache key includes it. A version
    with the build key of this run's artifact is this artifact and no baseline, so a repeated run
    finds what the first found and its gate is served from the cache."""
    from quantgate.gate import from_registry
    from quantgate.publish import RegistryConfig

    return from_registry(RegistryConfig.from_env(Path(root)), model, build_keys)


@task(
    name="gate",
    cache_key_fn=_keyed(
        "gate",
        lambda plan, evaluations, baselines: [
            plan.gates_hash,
            plan.tenants,
            plan.model_class,
            [e.model_dump(mode="json") for e in evaluations],
            baselines.model_dump(mode="json"),
        ],
    ),
    persist_result=True,
)
def gate_run(plan: RunPlan, evaluations: list[Evaluated], baselines: Baselines) -> Gated:
    """Merge the evaluations, judge every (artifact, tenant) (against ``baselines``, the approved
    versions), write report.json/md/html."""
    from quantgate.evaluate import merge_evaluations

    plan.confirm_own()
    merged = merge_evaluations([e.dir for e in evaluations], plan.eval_dir)
    return _gate_and_report(
        merged,
        Path(plan.gates),
        Path(plan.root),
        plan.report_dir,
        model_class=plan.model_class,
        artifacts_dir=plan.artifacts_dir,
        model=plan.model,
        tenants=plan.tenants,
        baselines=baselines,
    )


def _gate_and_report(
    eval_dir: Path,
    gates: Path,
    root: Path,
    report_dir: Path,
    *,
    artifacts_dir: Path,
    tenants: list[str] | None,
    model_class: str | None = None,
    model: str | None = None,
    baselines: Baselines | None = None,
    registry: Any = None,
) -> Gated:
    """Gate ``eval_dir`` and write report.json/md/html; the decision and the paths."""
    from quantgate.gate import gate_results, write_report_json
    from quantgate.report import write_reports

    decision = gate_results(
        eval_dir,
        gates,
        root,
        model_class=model_class,
        artifacts_dir=artifacts_dir,
        model=model,
        tenants=tenants,
        baselines=baselines,
        registry=registry,
    )
    report_json = write_report_json(decision, report_dir, eval_dir)
    written = write_reports(decision, report_dir)
    return Gated(report=decision, paths=ReportPaths.model_validate({"json_path": report_json, **written}))


@task(name="publish", retries=_RETRIES, retry_condition_fn=_only_transient)
def publish_artifacts(root: str, gates: Path, report_json: Path, artifacts_dir: Path) -> PublishOutcome:
    """Register every artifact; aliases only for the tenants the gate approved (``publish``).

    A tenant whose rollout policy in ``gates`` is a canary gets ``canary-<tenant>``, not the approval.
    """
    from quantgate.config import canary_shares
    from quantgate.publish import RegistryConfig, publish_report

    config = RegistryConfig.from_env(Path(root))
    canary = canary_shares(gates)  # tenant -> traffic share, for tenants whose policy is a canary
    return publish_report(report_json, artifacts_dir, config, canary=canary)


@task(
    name="repair",
    cache_key_fn=_keyed(
        "repair",
        lambda plan, report_json, verdicts: [
            plan.source_hash,
            plan.target_hashes,
            plan.gates_hash,
            plan.suites_hash,
            [v.model_dump(mode="json") for v in verdicts],
        ],
    ),
    persist_result=True,
)
def repair_failed(plan: RunPlan, report_json: Path, verdicts: list[VerdictRow]) -> RepairOutcome:
    """Search variants for the failed (target, tenant) pairs marked ``repair`` (``quantgate repair
    --plan``, a heavy step: it builds and evaluates); repair.json, and the report re-rendered with it."""
    from quantgate.runtime.errors import StepFailed, StepTimeout

    out = Path(plan.out) / "repair"
    (out / "repair.json").unlink(missing_ok=True)
    args = [
        "repair",
        "--plan",
        str(plan.file),
        "--results",
        str(plan.eval_dir),
        "--artifacts",
        str(plan.artifacts_dir),
        "--report",
        str(report_json),
        "--out",
        str(out),
    ]
    with _heavy_stage(plan, "repair", "repair") as stage:
        try:
            _step(plan, stage, "repair", args)
        except StepTimeout:
            raise
        except StepFailed as exc:  # exit 1: no variant within the budget, which repair.json says
            if exc.exit_code != 1 or not (out / "repair.json").is_file():
                raise
        stage.done("searched", f"results: {out / 'repair.json'}")
    return RepairOutcome.model_validate_json((out / "repair.json").read_bytes())


@task(name="withdraw", retries=_RETRIES, retry_condition_fn=_only_transient)
def withdraw_approvals(root: str, report_json: Path, artifacts_dir: Path) -> dict[str, list[str]]:
    """A failed run: take ``approved-<tenant>`` off registered versions that now fail it."""
    from quantgate.publish import RegistryConfig, withdraw_failed

    return withdraw_failed(report_json, artifacts_dir, RegistryConfig.from_env(Path(root)))


@flow(name="build-and-gate", validate_parameters=True)
def build_and_gate(request: RunRequest) -> State[Any]:
    """Build, evaluate, gate and publish every target of one source checkpoint.

    ``request`` (``RunRequest``) is everything the run is asked: the checkpoint (a local directory
    or an ``s3://bucket/prefix`` URI; default: the embedded SmolLM2-135M-Instruct), the targets
    (default: the model class's), the tenants gated, the suites, the profile, whether to publish and
    to repair, where the steps compute, and the rest of ``quantgate run``'s options, each meaning
    what it means there (``quantgate run --help``). A deployment passes it as ``{"request": {...}}``,
    validated against ``RunRequest`` before the run starts (a typo or a wrong type names its field).
    Ends in the gate's outcome: ``Completed`` when every required artifact passed some tenant,
    ``Failed`` otherwise; either way with ``<out>/outcome.json`` (``RunOutcome``).
    """
    run_id = str(flow_run.id)
    console.quiet_prefect(request.verbose)
    with out_lock.held(request.out, run_id):  # the run owns --out from before it plans to its outcome
        (request.out / OUTCOME).unlink(missing_ok=True)  # only this run's outcome may be reported
        plan = plan_run(request, run_id)
        if isinstance(plan, PlanRefused):
            return Failed(message=f"refused: {plan.problem}", data=plan)
        heavy_slots.ensure_limit(request.max_heavy)
        heavy_slots.reclaim_expired(get_run_logger().info)
        with _steps_stopped_on_signal():
            return _pipeline(plan, request.publish, request.repair)


def _pipeline(plan: RunPlan, publish: bool, repair: bool = False) -> State[Any]:
    """The flow's body past the plan: builds, the reference, evaluations, gate, publish, outcome."""
    logger = get_run_logger()
    logger.info(
        "%s (%s): targets %s, suites %s, profile %s; plan: %s",
        plan.model,
        plan.model_class,
        ", ".join(plan.targets),
        ", ".join(plan.suite_names),
        plan.profile,
        plan.file,
    )

    groups = plan.build_groups
    builds = [build_artifacts.submit(plan, group, "+".join(group)) for group in groups]
    reference = evaluate_reference.submit(plan)
    evaluations, build_failures, built_results = [], {}, []
    for future in as_completed(builds):
        group = groups[next(i for i, f in enumerate(builds) if f is future)]
        future.wait()  # as_completed yields on completion; the future's state is read after wait
        _say_if_cached(future.state, f"build {'+'.join(group)}")
        if future.state.is_completed():
            for built in future.result():
                built_results.append(built)
                evaluations.append(
                    evaluate_artifact.submit(plan, built, wait_for=[reference], return_state=False)
                )
        else:
            for target in group:
                build_failures[target] = future.state.message or "build failed"
    reference.wait()
    _say_if_cached(reference.state, "evaluate source")
    source = reference.result()  # a failed reference fails the flow: nothing can be gated
    parts, eval_failures = [], {}
    for evaluation, built in zip(evaluations, built_results, strict=True):
        evaluation.wait()
        _say_if_cached(evaluation.state, f"evaluate {built.target}")
        if evaluation.state.is_completed():
            parts.append(evaluation.result())
        else:
            eval_failures[evaluation.task_run_id] = evaluation.state.message or "evaluation failed"
    parts = [source, *sorted(parts, key=lambda e: e.name)]
    baselines = find_baselines(plan.root, plan.model, {b.target: b.build_key for b in built_results})
    with console.Stage(console.run_logger(), "gate") as stage:
        gated = gate_run(plan, parts, baselines)
        stage.done("judged", gated.judged())
    verdicts = [
        VerdictRow(artifact=v.artifact, tenant=v.tenant, verdict=v.verdict) for v in gated.report.verdicts
    ]
    repaired = repair_failed(plan, gated.paths.json_path, verdicts) if repair else None
    _report_artifacts(plan, gated, verdicts)
    # a failed run publishes nothing: no version of it may be mistaken for a release
    failing = gated.failing()
    published = None
    if publish and not (failing or build_failures or eval_failures):
        _confirm_built(plan, built_results)
        with console.Stage(console.run_logger(), "publish") as stage:
            registered = publish_artifacts(
                plan.root, Path(plan.gates), gated.paths.json_path, plan.artifacts_dir
            )
            published = Published(
                registered=registered,
                repaired=[
                    publish_artifacts(
                        plan.root, Path(plan.gates), where / "publish" / "report.json", where / "artifacts"
                    )
                    for where in _chosen_variants(repaired)
                ],
            )
            stage.done("registered", f"{len(registered.artifacts)} artifacts")
    elif publish:
        logger.warning("not publishing: the run failed its gate")
        published = Published(
            withdrawn=withdraw_approvals(plan.root, gated.paths.json_path, plan.artifacts_dir)
        )
    outcome = RunOutcome(
        model=plan.model,
        model_class=plan.model_class,
        source_hash=plan.source_hash,
        targets=plan.targets,
        builds=built_results,
        build_failures=build_failures,
        evaluations=parts,
        evaluation_failures=list(eval_failures.values()),
        approvals=gated.report.approvals,
        required=gated.report.required,
        verdicts=verdicts,
        reports=gated.paths,
        repair=repaired,
        published=published,
        exit_code=gated.report.exit_code or (1 if build_failures or eval_failures else 0),
        out=Path(plan.out),
        flow_run_id=str(flow_run.id),
        flow_ran_in=_where(),
        task_runner=_task_runner_name(),
        tasks_ran_in=sorted({*(b.ran_in for b in built_results), *(e.ran_in for e in parts)}),
    )
    write_json(Path(plan.out) / OUTCOME, outcome.model_dump(mode="json"))
    if failing or build_failures or eval_failures:
        reasons = [f"required artifacts passing no tenant: {', '.join(failing)}"] if failing else []
        reasons += [f"build {t} failed" for t in build_failures] + [
            f"{len(eval_failures)} evaluation(s) failed"
        ] * bool(eval_failures)
        return Failed(message="; ".join(reasons) + f" (report: {gated.paths.md})", data=outcome)
    return Completed(message=f"every required artifact passed (report: {gated.paths.md})", data=outcome)


def _say_if_cached(state: State[Any], label: str) -> None:
    """A task served from Prefect's cache runs no body, so it prints no stage lines: one line says so."""
    if state.name == "Cached":
        console.run_logger().info(f"{label}: from the cache (the same inputs as an earlier run)")


def _confirm_built(plan: RunPlan, built: list[BuiltArtifact]) -> None:
    """Before publishing: the plan on disk is this run's, and each artifact is what this run built
    (its files' digest as the build step returned it); InputError (exit 2) otherwise."""
    plan.confirm_own()
    for result in built:
        now = _built_artifact(plan, result.target)
        if (now.build_key, now.files) != (result.build_key, result.files):
            raise InputError(
                plan.artifacts_dir / result.target,
                "is not the artifact this run built and evaluated (rebuilt or replaced since)",
                "give each quantgate run its own --out; this run published nothing",
            )


def _chosen_variants(repaired: RepairOutcome | None) -> list[Path]:
    """The variant directories a repair chose for some tenant (repair.json), each once."""
    if repaired is None:
        return []
    found = {t.variant for r in repaired.targets for t in r.tenants if t.variant}
    return [Path(v) for v in sorted(found)]


@flow(name="regate", validate_parameters=True)
def regate(
    out: str, tenants: list[str] | None = None, gates: str | None = None, publish: bool = True
) -> State[Any]:
    """Gate existing evaluations again (e.g. after gates.yaml floors changed) and publish.

    Reads ``<out>/eval`` and ``<out>/artifacts`` of an earlier ``build_and_gate`` run; no model
    is loaded. Aliases move only for tenants the new floors approve.
    """
    from quantgate.config import project_root

    root = project_root()
    out_dir = Path(out).resolve()
    with out_lock.held(out_dir, str(flow_run.id)):
        return _regate_locked(root, out_dir, tenants, gates, publish)


def _regate_locked(
    root: Path, out_dir: Path, tenants: list[str] | None, gates: str | None, publish: bool
) -> State[Any]:
    """``regate``'s body, holding ``out_dir``: a run writing there at the same time is refused."""
    from quantgate.publish import RegistryConfig

    gates_path = Path(gates) if gates else root / "gates.yaml"
    gated = _gate_and_report(
        out_dir / "eval",
        gates_path,
        root,
        out_dir / "report",
        artifacts_dir=out_dir / "artifacts",
        tenants=tenants,
        registry=RegistryConfig.from_env(root),
    )
    report_json, exit_code = gated.paths.json_path, gated.report.exit_code
    if publish and exit_code == 0:
        publish_artifacts(str(root), gates_path, report_json, out_dir / "artifacts")
    elif publish:  # a failed gate publishes nothing, but withdraws the approvals it no longer gives
        withdraw_approvals(str(root), report_json, out_dir / "artifacts")
    if exit_code:
        return Failed(
            message=f"required artifacts pass no tenant under the new floors (report: {report_json})"
        )
    return Completed(message=f"report: {report_json}")


def _where() -> str:
    """host:pid of the process a task ran in (the flow's own, or a Dask worker's)."""
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


def _task_runner_name() -> str:
    """The class name of the running flow's task runner (thread pool or Dask)."""
    context = FlowRunContext.get()
    if context is None:
        raise RuntimeError("build_and_gate's outcome is written inside its flow run only")
    return type(context.task_runner).__name__


def _report_artifacts(plan: RunPlan, gated: Gated, verdicts: list[VerdictRow]) -> None:
    """The report in Prefect's UI: the Markdown report, the verdict table, a link to the HTML."""
    key = "quantgate-" + re.sub(r"[^a-z0-9-]+", "-", plan.model.lower()).strip("-")
    md = gated.paths.md.read_text() if gated.paths.md else ""
    create_markdown_artifact(md, key=f"{key}-report", description=f"gate report for {plan.model}")
    rows = [v.model_dump() for v in verdicts]
    create_table_artifact(rows, key=f"{key}-verdicts", description="verdict per (artifact, tenant)")
    if gated.paths.html:
        create_link_artifact(gated.paths.html.as_uri(), link_text="report.html", key=f"{key}-html")
