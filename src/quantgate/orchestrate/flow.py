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
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.context import FlowRunContext
from prefect.exceptions import ExternalSignal
from prefect.futures import as_completed
from prefect.runtime import flow_run
from prefect.states import Completed, Failed, State

from quantgate import errors
from quantgate.atomic import write_json
from quantgate.errors import InputError, TransientError
from quantgate.evaluate import DEFAULT as SEQUENTIAL_DEFAULT
from quantgate.orchestrate import console, heavy_slots, out_lock
from quantgate.orchestrate.plan import RUN_ID_ENV, RunPlan, digest, make_plan
from quantgate.orchestrate.steps import LogProgress, run_step, stop_all
from quantgate.results import read_summary
from quantgate.units import format_bytes

OUTCOME = "outcome.json"
_RETRIES = 2


def _only_transient(_task, _task_run, state) -> bool:
    """Retry condition: the step failed with ``TransientError`` (exit 75), nothing else."""
    try:
        state.result()
    except TransientError:
        return True
    except Exception:  # noqa: BLE001  every other failure is final: retrying gives the same answer
        return False
    return False


def _keyed(kind: str, key_of):
    """A ``cache_key_fn`` hashing ``kind`` with the content parts ``key_of(parameters)`` names."""

    def cache_key(_context, parameters: dict[str, Any]) -> str:
        plan: RunPlan = parameters["plan"]
        return f"quantgate-{kind}-" + digest(kind, plan.stamp, plan.tools_hash, *key_of(parameters))

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

    kind: str  # the InputError subclass's name (quantgate.errors)
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


@task(name="plan", retries=_RETRIES, retry_condition_fn=_only_transient)
def plan_run(options: dict[str, Any]) -> RunPlan | PlanRefused:
    """Fetch (s3://), intake (validate, hash, classify) and plan; bad input is refused here, before
    any build (``PlanRefused``).

    The run's one intake; ``logs/plan.log`` records it, as every heavy step's log records its step.
    """
    from quantgate.orchestrate.checkpoint_uri import local_checkpoint

    uri = options["checkpoint"]
    log = Path(options["out"]).resolve() / "logs" / "plan.log"
    progress = LogProgress(log, on_line=get_run_logger().info if options["verbose"] else None)
    with console.Stage(console.run_logger(), "plan", log) as stage:
        try:
            local = local_checkpoint(uri, options["cache"]) if uri else None
            plan = make_plan(**{**options, "checkpoint": local, "progress": progress})
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
        "build", lambda p: [p["plan"].source_hash, *(p["plan"].target_hashes[t] for t in p["targets"])]
    ),
    persist_result=True,
    retries=_RETRIES,
    retry_condition_fn=_only_transient,
)
def build_artifacts(plan: RunPlan, targets: list[str], name: str) -> list[dict[str, Any]]:
    """Build one group of twin targets (``RunPlan.build_groups``) in one ``quantgate build --plan``,
    which builds the first and links the others; each manifest's build key, file digest and size."""
    from quantgate.artifact import require_manifest

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
        built = []
        for target in targets:
            manifest = require_manifest(plan.artifacts_dir / target)
            files = {rel: entry.sha256 for rel, entry in manifest.files.items()}
            built.append(
                {
                    "target": target,
                    "build_key": manifest.build_key,
                    "files": digest(files),
                    "bytes": manifest.total_bytes,
                    "linked_from": manifest.build.linked_from,
                    "ran_in": _where(),
                }
            )
        stage.done("built", _built(built))
    return built


def _built(built: list[dict[str, Any]]) -> str:
    """A build step's key result: each artifact's size, or that it is a twin's link."""
    return ", ".join(
        f"{b['target']} linked" if b["linked_from"] else f"{b['target']} {format_bytes(b['bytes'])}"
        for b in built
    )


@task(
    name="reference",
    cache_key_fn=_keyed(
        "reference",
        lambda p: [
            p["plan"].source_hash,
            p["plan"].suites_hash,
            p["plan"].profile,
            p["plan"].eval_env,
            p["plan"].device,
            p["plan"].devices,
        ],
    ),
    persist_result=True,
    retries=_RETRIES,
    retry_condition_fn=_only_transient,
)
def evaluate_reference(plan: RunPlan) -> dict[str, Any]:
    """The source, once: fills the reference cache every artifact evaluation then reads."""
    out = plan.eval_part("source")
    with _heavy_stage(plan, "evaluate source", "eval-source") as stage:
        _step(plan, stage, "eval-source", [*_eval_args(plan, out), "--reference-only"])
        summary = read_summary(out)
        stage.done(_suites(summary, "source"), "the reference every artifact is compared with")
    return {
        "name": "source",
        "dir": str(out),
        "summary": summary,
        "ran_in": _where(),
    }


def _suites(summary: dict[str, dict[str, Any]], model: str) -> str:
    """'3 suites': how many suites an evaluation step has results of for ``model``."""
    count = len({key.split(".", 1)[0] for key in summary.get(model, {})})
    return f"{count} suite{'s' * (count != 1)}"


@task(
    name="evaluate",
    task_run_name="evaluate-{built[target]}",
    cache_key_fn=_keyed(
        "evaluate",
        lambda p: [
            {k: v for k, v in p["built"].items() if k != "ran_in"},  # what was built, not where
            p["plan"].source_hash,
            p["plan"].suites_hash,
            p["plan"].profile,
            p["plan"].eval_env,
            p["plan"].device,
            p["plan"].devices,
            # a sequential evaluation stops where the floors are decided: it depends on gates.yaml
            *([p["plan"].gates_hash, p["plan"].tenants] if p["plan"].sequential else []),
        ],
    ),
    persist_result=True,
    retries=_RETRIES,
    retry_condition_fn=_only_transient,
)
def evaluate_artifact(plan: RunPlan, built: dict[str, Any]) -> dict[str, Any]:
    """Evaluate one built artifact against the cached reference (``quantgate eval --plan``)."""
    target = built["target"]
    out = plan.eval_part(target)
    with _heavy_stage(plan, f"evaluate {target}", f"eval-{target}") as stage:
        _step(plan, stage, f"eval-{target}", [*_eval_args(plan, out), "--targets", target])
        summary = read_summary(out)
        stage.done(_suites(summary, target))
    return {
        "name": target,
        "dir": str(out),
        "summary": summary,
        "ran_in": _where(),
    }


@task(name="baselines", retries=_RETRIES, retry_condition_fn=_only_transient)
def find_baselines(root: str, model: str, build_keys: dict[str, str | None]) -> dict[str, Any]:
    """The version the registry approves per (target, tenant) today, with its gate report: looked up
    on every run (never cached) and handed to the gate, whose cache key includes it. A version
    with the build key of this run's artifact is this artifact and no baseline, so a repeated run
    finds what the first found and its gate is served from the cache."""
    from quantgate.gate import from_registry
    from quantgate.publish import RegistryConfig

    return from_registry(RegistryConfig.from_env(Path(root)), model, build_keys).model_dump(mode="json")


@task(
    name="gate",
    cache_key_fn=_keyed(
        "gate",
        lambda p: [
            p["plan"].gates_hash,
            p["plan"].tenants,
            p["plan"].model_class,
            p["evaluations"],
            p["baselines"],
        ],
    ),
    persist_result=True,
)
def gate_run(plan: RunPlan, evaluations: list[dict[str, Any]], baselines: dict[str, Any]) -> dict[str, Any]:
    """Merge the evaluations, judge every (artifact, tenant) (against ``baselines``, the approved
    versions), write report.json/md/html."""
    from quantgate.evaluate import merge_evaluations
    from quantgate.gate import Baselines

    plan.confirm_own()
    merged = merge_evaluations([Path(e["dir"]) for e in evaluations], plan.eval_dir)
    return _gate_and_report(
        merged,
        Path(plan.gates),
        Path(plan.root),
        plan.report_dir,
        model_class=plan.model_class,
        artifacts_dir=plan.artifacts_dir,
        model=plan.model,
        tenants=plan.tenants,
        baselines=Baselines.model_validate(baselines),
    )


def _gate_and_report(eval_dir: Path, gates: Path, root: Path, report_dir: Path, **options) -> dict[str, Any]:
    """Gate ``eval_dir`` and write report.json/md/html; the report payload and the paths."""
    from quantgate.gate import gate_results, write_report_json
    from quantgate.report import write_reports

    decision = gate_results(eval_dir, gates, root, **options)
    report_json = write_report_json(decision, report_dir, eval_dir)
    written = write_reports(decision.payload(), report_dir)
    return {
        "report": decision.payload(),
        "paths": {"json": str(report_json), **{kind: str(path) for kind, path in written.items()}},
    }


@task(name="publish", retries=_RETRIES, retry_condition_fn=_only_transient)
def publish_artifacts(root: str, report_json: str, artifacts_dir: str) -> dict[str, Any]:
    """Register every artifact; aliases only for the tenants the gate approved (``publish``)."""
    from quantgate.config import canary_shares
    from quantgate.publish import RegistryConfig, publish_report

    config = RegistryConfig.from_env(Path(root))
    canary = canary_shares(Path(root) / "gates.yaml")  # tenants whose rollout policy is a canary
    return publish_report(Path(report_json), Path(artifacts_dir), config, canary=canary).to_dict()


@task(
    name="repair",
    cache_key_fn=_keyed(
        "repair",
        lambda p: [
            p["plan"].source_hash,
            p["plan"].target_hashes,
            p["plan"].gates_hash,
            p["plan"].suites_hash,
            p["verdicts"],
        ],
    ),
    persist_result=True,
)
def repair_failed(plan: RunPlan, report_json: str, verdicts: list[dict[str, str]]) -> dict[str, Any]:
    """Search variants for the failed (target, tenant) pairs marked ``repair`` (``quantgate repair
    --plan``, a heavy step: it builds and evaluates); repair.json, and the report re-rendered with it."""
    from quantgate.errors import StepFailed, StepTimeout

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
        report_json,
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
    return json.loads((out / "repair.json").read_text())


@task(name="withdraw", retries=_RETRIES, retry_condition_fn=_only_transient)
def withdraw_approvals(root: str, report_json: str, artifacts_dir: str) -> dict[str, list[str]]:
    """A failed run: take ``approved-<tenant>`` off registered versions that now fail it."""
    from quantgate.publish import RegistryConfig, withdraw_failed

    return withdraw_failed(Path(report_json), Path(artifacts_dir), RegistryConfig.from_env(Path(root)))


@flow(name="build-and-gate", validate_parameters=True)
def build_and_gate(
    checkpoint: str | None = None,
    targets: list[str] | None = None,
    tenants: list[str] | None = None,
    profile: str = "smoke",
    publish: bool = True,
    out: str = "runs",
    suites: list[str] | None = None,
    gates: str | None = None,
    max_heavy: int = 1,
    step_timeout_s: float = 6 * 3600,
    sequential: bool = SEQUENTIAL_DEFAULT,
    repair: bool = False,
    calibration: str | None = None,
    data_dir: str | None = None,
    cache_dir: str | None = None,
    root: str | None = None,
    device: str = "cpu",
    devices: str = "all",
    max_memory: str | None = None,
    verbose: bool = False,
) -> State[Any]:
    """Build, evaluate, gate and publish every target of one source checkpoint.

    ``checkpoint``: a local directory or an ``s3://bucket/prefix`` URI (default: the embedded
    SmolLM2-135M-Instruct). ``targets``: override the model class's targets. ``tenants``: gate
    only these. ``max_heavy``: heavy steps (builds, evaluations) running at once, across every
    flow run on the same Prefect server (0: no limit). ``sequential`` (the default, as on the
    command line): each artifact's suites stop once every floor on them is decided
    (``evaluate/sequential.py``); False: the fixed design.
    ``repair``: each failed (target, tenant) marked ``repair`` in gates.yaml searches for the
    smallest variant that passes (``quantgate.repair``); chosen variants are published with the run.
    ``calibration``, ``data_dir``, ``cache_dir``, ``root``: as ``quantgate build`` and ``eval`` take
    them (default: the calibration set in the project, ``$QUANTGATE_DATA``, ``$QUANTGATE_CACHE``,
    ``$QUANTGATE_ROOT`` or the checkout). ``device``: "cpu" or "cuda" (``quantgate.devices``), where
    every build and evaluation step computes; ``devices``: how many of them one evaluation spreads
    the model over ("all" or a count, as ``quantgate eval --devices``). Both are in the plan and
    the evaluation keys. ``max_memory``: what each evaluation may keep on its device, the other
    layers offloaded (``quantgate eval --max-memory``); in the plan, not in the keys.
    ``verbose``: relay every line each step prints (and Prefect's line per task state) to the
    console, as ``quantgate run --verbose``; without it, a few lines per stage (``console``).
    """
    from quantgate import paths

    project = Path(root).resolve() if root else paths.project_root()
    cache = Path(cache_dir).resolve() if cache_dir else paths.cache_dir()
    run_id = str(flow_run.id)
    options = {
        "checkpoint": checkpoint,
        "targets": targets,
        "tenants": tenants,
        "suites": suites,
        "profile": profile,
        "root": project,
        "gates": Path(gates) if gates else None,
        "cache": cache,
        "data_dir": Path(data_dir) if data_dir else _data_dir(),
        "calibration": Path(calibration) if calibration else None,
        "out": Path(out),
        "step_timeout_s": step_timeout_s,
        "max_heavy": max_heavy,
        "sequential": sequential,
        "run_id": run_id,
        "device": "cuda" if device == "cuda" else "cpu",
        "devices": devices,
        "max_memory": max_memory,
        "verbose": verbose,
    }
    console.quiet_prefect(verbose)
    with out_lock.held(Path(out), run_id):  # the run owns --out from before it plans to its outcome
        (Path(out) / OUTCOME).unlink(missing_ok=True)  # only this run's outcome may be reported
        plan = plan_run(options)
        if isinstance(plan, PlanRefused):
            return Failed(message=f"refused: {plan.problem}", data=plan)
        heavy_slots.ensure_limit(max_heavy)
        heavy_slots.reclaim_expired(get_run_logger().info)
        with _steps_stopped_on_signal():
            return _pipeline(plan, publish, repair)


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
    parts = [reference.result()]  # a failed reference fails the flow: nothing can be gated
    eval_failures = {}
    for evaluation, built in zip(evaluations, built_results, strict=True):
        evaluation.wait()
        _say_if_cached(evaluation.state, f"evaluate {built['target']}")
        if evaluation.state.is_completed():
            parts.append(evaluation.result())
        else:
            eval_failures[evaluation.task_run_id] = evaluation.state.message or "evaluation failed"
    parts = [parts[0], *sorted(parts[1:], key=lambda e: e["name"])]
    baselines = find_baselines(plan.root, plan.model, {b["target"]: b["build_key"] for b in built_results})
    with console.Stage(console.run_logger(), "gate") as stage:
        gated = gate_run(plan, parts, baselines)
        stage.done("judged", _judged(gated["report"]))
    report = gated["report"]
    repaired = None
    if repair:
        verdicts = [{k: v[k] for k in ("artifact", "tenant", "verdict")} for v in report["verdicts"]]
        repaired = repair_failed(plan, gated["paths"]["json"], verdicts)
    _report_artifacts(plan, report, gated["paths"])
    # a failed run publishes nothing: no version of it may be mistaken for a release
    failing = [a for a in report["required"] if not report["approvals"].get(a)]
    published = None
    if publish and not (failing or build_failures or eval_failures):
        _confirm_built(plan, built_results)
        with console.Stage(console.run_logger(), "publish") as stage:
            published = publish_artifacts(plan.root, gated["paths"]["json"], str(plan.artifacts_dir))
            published["repaired"] = [
                publish_artifacts(plan.root, f"{where}/publish/report.json", f"{where}/artifacts")
                for where in _chosen_variants(repaired)
            ]
            stage.done("registered", f"{len(published.get('artifacts', []))} artifacts")
    elif publish:
        logger.warning("not publishing: the run failed its gate")
        published = {
            "withdrawn": withdraw_approvals(plan.root, gated["paths"]["json"], str(plan.artifacts_dir))
        }
    outcome = {
        "model": plan.model,
        "model_class": plan.model_class,
        "source_hash": plan.source_hash,
        "targets": plan.targets,
        "approvals": report["approvals"],
        "required": report["required"],
        "exit_code": report["exit_code"] or (1 if build_failures or eval_failures else 0),
        "build_failures": build_failures,
        "evaluation_failures": list(eval_failures.values()),
        "verdicts": [{k: v[k] for k in ("artifact", "tenant", "verdict")} for v in report["verdicts"]],
        "reports": gated["paths"],
        "published": published,
        "repair": repaired,
        "out": plan.out,
        "flow_run_id": str(flow_run.id),
        "flow_ran_in": _where(),
        "task_runner": _task_runner_name(),
        "tasks_ran_in": sorted({r["ran_in"] for r in [*built_results, *parts]}),
    }
    write_json(Path(plan.out) / OUTCOME, outcome)
    if failing or build_failures or eval_failures:
        reasons = [f"required artifacts passing no tenant: {', '.join(failing)}"] if failing else []
        reasons += [f"build {t} failed" for t in build_failures] + [
            f"{len(eval_failures)} evaluation(s) failed"
        ] * bool(eval_failures)
        return Failed(message="; ".join(reasons) + f" (report: {gated['paths'].get('md')})", data=outcome)
    return Completed(
        message=f"every required artifact passed (report: {gated['paths'].get('md')})", data=outcome
    )


def _say_if_cached(state: State[Any], label: str) -> None:
    """A task served from Prefect's cache runs no body, so it prints no stage lines: one line says so."""
    if state.name == "Cached":
        console.run_logger().info(f"{label}: from the cache (the same inputs as an earlier run)")


def _judged(report: dict[str, Any]) -> str:
    """The gate's key result: how many verdicts, of which kind ('9 verdicts: 6 pass, 3 fail')."""
    kinds = Counter(v["verdict"] for v in report["verdicts"])
    counts = ", ".join(f"{n} {verdict}" for verdict, n in kinds.most_common())
    return f"{len(report['verdicts'])} verdicts: {counts}" if counts else "no verdicts"


def _confirm_built(plan: RunPlan, built: list[dict[str, Any]]) -> None:
    """Before publishing: the plan on disk is this run's, and each artifact is what this run built
    (its files' digest as the build step returned it); InputError (exit 2) otherwise."""
    from quantgate.artifact import require_manifest
    from quantgate.errors import InputError

    plan.confirm_own()
    for result in built:
        where = plan.artifacts_dir / result["target"]
        manifest = require_manifest(where)
        files = digest({rel: entry.sha256 for rel, entry in manifest.files.items()})
        if (manifest.build_key, files) != (result["build_key"], result["files"]):
            raise InputError(
                where,
                "is not the artifact this run built and evaluated (rebuilt or replaced since)",
                "give each quantgate run its own --out; this run published nothing",
            )


def _chosen_variants(repaired: dict[str, Any] | None) -> list[str]:
    """The variant directories a repair chose for some tenant (repair.json), each once."""
    if not repaired:
        return []
    found = {t["variant"] for r in repaired["targets"] for t in r["tenants"] if t.get("variant")}
    return sorted(found)


@flow(name="regate", validate_parameters=True)
def regate(
    out: str, tenants: list[str] | None = None, gates: str | None = None, publish: bool = True
) -> State[Any]:
    """Gate existing evaluations again (e.g. after gates.yaml floors changed) and publish.

    Reads ``<out>/eval`` and ``<out>/artifacts`` of an earlier ``build_and_gate`` run; no model
    is loaded. Aliases move only for tenants the new floors approve.
    """
    from quantgate.paths import project_root

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
    report_json, exit_code = gated["paths"]["json"], gated["report"]["exit_code"]
    if publish and exit_code == 0:
        publish_artifacts(str(root), report_json, str(out_dir / "artifacts"))
    elif publish:  # a failed gate publishes nothing, but withdraws the approvals it no longer gives
        withdraw_approvals(str(root), report_json, str(out_dir / "artifacts"))
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


def _data_dir() -> Path | None:
    import os

    return Path(os.environ["QUANTGATE_DATA"]) if os.environ.get("QUANTGATE_DATA") else None


def _report_artifacts(plan: RunPlan, report: dict[str, Any], paths: dict[str, str]) -> None:
    """The report in Prefect's UI: the Markdown report, the verdict table, a link to the HTML."""
    key = "quantgate-" + re.sub(r"[^a-z0-9-]+", "-", plan.model.lower()).strip("-")
    md = Path(paths["md"]).read_text() if "md" in paths else ""
    create_markdown_artifact(md, key=f"{key}-report", description=f"gate report for {plan.model}")
    rows = [
        {"artifact": v["artifact"], "tenant": v["tenant"], "verdict": v["verdict"]}
        for v in report["verdicts"]
    ]
    create_table_artifact(rows, key=f"{key}-verdicts", description="verdict per (artifact, tenant)")
    if "html" in paths:
        create_link_artifact(Path(paths["html"]).as_uri(), link_text="report.html", key=f"{key}-html")
