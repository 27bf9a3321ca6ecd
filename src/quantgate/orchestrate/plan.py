"""The plan of one run, made once and written to ``<out>/plan.json`` for every heavy step to read.

``resolve_plan`` is the one place a run's inputs are resolved (options, configs, intake) into a
``RunPlan``: the flow's ``make_plan`` writes what it returns, and ``quantgate build``, ``eval`` and
``repair`` without a plan use the plan it returns as they would read one, so a command resolves
its targets, recipes, KV decisions and suites the way a run does.

Heavy steps stay processes (``steps.py``) but read the plan instead of re-deriving it, so
intake runs once per run; a step checks only what it reads from disk (the checkpoint by stat,
the calibration set by sha256, its tool versions), and a mismatch is an ``InputError``, never a
mislabelled artifact. Cache keys hash content, never paths (a copied checkpoint is the same
work, one changed recipe byte is new work), plus the output directory's *stamp*: a random id
that goes when the directory is deleted, so results whose files are gone are never served.

A plan names the run that made it (``run_id``: its Prefect flow run). The flow tells each step
its run's id (``RUN_ID_ENV``), and a step refuses a plan.json that another run wrote (exit 2,
naming the file): two runs on one ``--out`` are refused by its lock (``out_lock``), and a step
that still meets another run's plan (a lock taken away by hand, a directory copied over) stops
instead of building or evaluating that run's checkpoint under this run's name. The gate and
publish inside the flow check the plan on disk the same way (``confirm_own``).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationError

from quantgate.config import Catalog, Frozen, content_digest
from quantgate.contracts.artifact import tool_versions
from quantgate.evaluate import DEFAULT as SEQUENTIAL_DEFAULT
from quantgate.evaluate import numerics_switches
from quantgate.intake import SourceRecord
from quantgate.quantize import PlannedBuild
from quantgate.runtime.atomic import write_text
from quantgate.runtime.errors import InputError, UsageError
from quantgate.runtime.progress import SILENT, Progress
from quantgate.runtime.suggest import did_you_mean

if TYPE_CHECKING:
    from quantgate.calibration import CalibrationSet
    from quantgate.evaluate import LoadedSuite

STAMP = ".quantgate-run"
PLAN_FILE = "plan.json"
RUN_ID_ENV = "QUANTGATE_RUN_ID"  # set by the flow for its steps: the run whose plan they must read


class PlannedSuite(Frozen):
    """A suite's validated spec and the YAML it came from (its data files are found beside it)."""

    path: str
    kind: str
    spec: dict[str, Any]
    spec_hash: str  # the reference cache key's suite part

    def load(self) -> LoadedSuite:
        """The suite ready to run, from the planned spec (the YAML is not read again)."""
        from quantgate.evaluate import KINDS, LoadedSuite

        cls = KINDS.get(self.kind, self.path)
        spec = cls.spec_model.model_validate(self.spec)
        return LoadedSuite(spec, Path(self.path), cls(spec, Path(self.path)), self.spec_hash)


class PlannedCalibration(Frozen):
    """The calibration set calibrated targets use: its spec, and the sha256 it had when planned."""

    spec: str
    sha256: str


class RunPlan(Frozen):
    """Everything a step needs; plain data, so that it crosses process and Dask boundaries."""

    version: Literal[1] = 1
    source: SourceRecord = Field(description="the intake record: the one intake of this run")
    model: str
    builds: list[PlannedBuild] = Field(description="the resolved targets with their recipes, in order")
    suites: list[PlannedSuite]
    calibration: PlannedCalibration | None = Field(
        description="None when no target calibrates (a calibrated recipe, or FP8 KV scales)"
    )
    tenants: list[str] | None
    profile: str
    # evaluation stops each suite once its floors are decided (evaluate/sequential.py); False: every
    # item. Written by every run; absent only from plans older than the option, which were fixed.
    sequential: bool = False
    root: str
    gates: str
    cache_dir: str
    data_dir: str | None
    out: str
    step_timeout_s: float
    max_heavy: int  # heavy steps at once across flow runs on one Prefect server; 0: no limit
    # the console relays every line of every step (``quantgate run --verbose``); not in any key
    verbose: bool = False
    # content hashes the cache keys are made of
    target_hashes: dict[str, str]  # target -> sha256(target, recipe, calibration set, KV decision)
    suites_hash: str
    gates_hash: str
    tools_hash: str
    # the evaluation-numerics switches steps run under (evaluate/environment.py): in the evaluation keys
    eval_env: dict[str, str] = Field(default_factory=dict)
    # where the steps compute (--device, resolved when planning): in the evaluation keys; "cpu" for
    # plans written before it was recorded
    device: Literal["cpu", "cuda"] = "cpu"
    # how many devices each evaluation spreads one model over (``--devices``: "all" or a count);
    # in the evaluation keys, as tensor parallelism changes the summation order
    devices: str = "all"
    # ``--max-memory`` as given (a size or "auto", which each evaluation and build step resolves on
    # its own worker); not in the keys: offloaded layers change the time, not the numbers
    # (``offload``), and a build past it calibrates layer by layer to the same bytes
    max_memory: str | None = None
    stamp: str  # the output directory's id (``output_stamp``); "" in a plan resolved but not written
    # the run that planned (its flow run id); "" for plans made outside a flow, which no step refuses
    run_id: str = ""

    @property
    def file(self) -> Path:
        """This plan's own file, ``<out>/plan.json``."""
        return Path(self.out) / PLAN_FILE

    @property
    def source_hash(self) -> str:
        """The source checkpoint's content hash."""
        return self.source.content_hash

    @property
    def model_class(self) -> str:
        """The model class intake put the source in."""
        return self.source.model_class

    @property
    def targets(self) -> list[str]:
        """The planned targets' names, in build order."""
        return [b.target.name for b in self.builds]

    @property
    def build_groups(self) -> list[list[str]]:
        """The targets by build key, in build order: each group is one build step, its first target
        built and the others (twins: hopper-fp8 and rocm-cdna3-fp8 share a recipe) hard-linked to
        it, as one ``quantgate build`` does for every twin it is given."""
        calibration = self.calibration.sha256 if self.calibration else None
        groups: dict[str, list[str]] = {}
        for b in self.builds:
            groups.setdefault(digest(b.build_inputs(calibration)), []).append(b.target.name)
        return list(groups.values())

    @property
    def suite_names(self) -> list[str]:
        """The planned suites' names."""
        return [s.spec["name"] for s in self.suites]

    @property
    def artifacts_dir(self) -> Path:
        """Where the builds install their artifacts."""
        return Path(self.out) / "artifacts"

    @property
    def eval_dir(self) -> Path:
        """Where the merged evaluations go."""
        return Path(self.out) / "eval"

    def eval_part(self, name: str) -> Path:
        """One evaluation step's output directory (``source`` or a target's name)."""
        return Path(self.out) / "eval-parts" / name

    @property
    def report_dir(self) -> Path:
        """Where the gate writes report.json, .md and .html."""
        return Path(self.out) / "report"

    def log(self, step: str) -> Path:
        """The log file of one step of this run."""
        return Path(self.out) / "logs" / f"{step}.log"

    def select(self, targets: list[str] | None) -> list[PlannedBuild]:
        """The planned builds named by ``--targets`` (all when None); a name not planned is a UsageError."""
        for name in targets or []:
            if name not in self.targets:
                raise UsageError(
                    "--targets", f"target '{name}' is not in the plan", did_you_mean(name, self.targets)
                )
        return [b for b in self.builds if not targets or b.target.name in targets]

    def confirmed_source(self, progress: Progress = SILENT) -> SourceRecord:
        """The planned intake record, once the checkpoint is confirmed to hold the same files."""
        from quantgate.intake import confirm

        record = confirm(self.source, progress, cache=Path(self.cache_dir) / "intake")
        progress.log(f"source as planned: {record.path} (content hash {record.content_hash[:12]})")
        return record

    def confirm_own(self) -> None:
        """InputError (exit 2) unless ``<out>/plan.json`` on disk is still this run's plan."""
        _refuse_foreign(self.file, _run_id_on_disk(self.file), self.run_id)

    def calibration_set(self) -> CalibrationSet | None:
        """The planned calibration set, refused when its spec or traffic log changed since planning."""
        if self.calibration is None:
            return None
        from quantgate.calibration import load_or_build

        found = load_or_build(Path(self.calibration.spec), Path(self.cache_dir) / "calibration")
        if found.sha256 != self.calibration.sha256:
            raise InputError(
                self.calibration.spec,
                f"the calibration set is now {found.sha256[:12]}, the plan has {self.calibration.sha256[:12]} "
                "(the spec or its traffic log changed since planning)",
                "plan again: run the flow again, or the command without --plan",
            )
        return found

    def loaded_suites(self) -> list[LoadedSuite]:
        """The planned suites, ready to run."""
        return [s.load() for s in self.suites]


def digest(*parts: object) -> str:
    """sha256 of ``parts`` as canonical JSON: the cache keys' one hash."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def output_stamp(out: Path) -> str:
    """The output directory's id, created on first use (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / STAMP
    if not path.exists():
        path.write_text(uuid.uuid4().hex + "\n")
    return path.read_text().strip()


def _run_id_on_disk(path: Path) -> str | None:
    try:
        found = json.loads(Path(path).read_bytes()).get("run_id", "")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return found if isinstance(found, str) else None


def _refuse_foreign(path: Path, found: str | None, expected: str) -> None:
    """InputError when the plan at ``path`` (run id ``found``) is not run ``expected``'s."""
    if found == expected:
        return
    raise InputError(
        path,
        f"this plan belongs to run {found or '(none)'}, not to run {expected}, which started this step: "
        "another quantgate run wrote the same --out",
        "give each quantgate run its own --out; this run stopped here and publishes nothing",
    )


def read_plan(path: Path) -> RunPlan:
    """The plan at ``path``, refused (InputError) unless this quantgate wrote it with these tool
    versions, and (in a step the flow started, ``RUN_ID_ENV``) for this step's run.

    The tool versions are part of every build key: a step in another environment than the
    planning one would build an artifact the plan's cache keys do not describe.
    """
    fix = "pass the plan.json that quantgate run wrote in its --out directory, or leave --plan out"
    try:
        plan = RunPlan.model_validate_json(Path(path).read_bytes())
    except OSError as exc:
        raise InputError(path, f"cannot read the plan ({exc.strerror})", fix) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise InputError(
            path, f"not a plan this quantgate wrote ({where + ': ' if where else ''}{first['msg']})", fix
        ) from None
    expected = os.environ.get(RUN_ID_ENV)
    if expected:
        _refuse_foreign(Path(path), plan.run_id, expected)
    if digest(tool_versions()) != plan.tools_hash:
        raise InputError(
            path,
            "the plan was made with other tool versions than this process has (quantgate, torch, ...)",
            "run the step in the environment that planned it, or plan again in this one",
        )
    return plan


def write_plan(plan: RunPlan) -> Path:
    """Write ``<out>/plan.json`` atomically; its path."""
    write_text(plan.file, plan.model_dump_json(indent=1) + "\n")
    return plan.file


Part = Literal["builds", "suites"]
EVERY_PART: tuple[Part, ...] = ("builds", "suites")


def resolve_plan(
    *,
    checkpoint: Path | None,
    out: Path,
    targets: list[str] | None = None,
    tenants: list[str] | None = None,
    suites: list[str] | None = None,
    profile: str = "smoke",
    root: Path | None = None,
    gates: Path | None = None,
    cache: Path | None = None,
    data_dir: Path | None = None,
    calibration: Path | None = None,
    step_timeout_s: float = 0.0,
    max_heavy: int = 1,
    verbose: bool = False,
    progress: Progress = SILENT,
    sequential: bool = SEQUENTIAL_DEFAULT,
    run_id: str = "",
    device: Literal["cpu", "cuda"] = "cpu",
    devices: str = "all",
    max_memory: str | None = None,
    needs: Collection[Part] = EVERY_PART,
) -> RunPlan:
    """A run's inputs resolved into its typed plan: the one place they are, for ``quantgate run``'s
    flow (``make_plan``), ``quantgate build`` and ``eval`` without ``--plan`` and ``repair`` without
    a run's plan. Every input is validated (configs first, then intake, so a typo costs no hashing)
    and the source taken in; nothing is written in ``out`` (the plan has no ``stamp`` until
    ``make_plan`` gives the directory one).

    ``needs``: the parts the caller reads. ``builds``: the targets (the model class's, or
    ``targets``), their recipes, KV decisions and the calibration set calibrated ones use;
    ``suites``: the suite specs and every data set they read. A part left out stays empty in the
    plan (no builds, no calibration, no suites) and its inputs are neither read nor required: a
    build needs no evaluation data, an evaluation no calibration set. Default root, cache: the
    project's and ``$QUANTGATE_CACHE``'s (``quantgate.config.paths``).
    """
    from quantgate.calibration import load_or_build
    from quantgate.config import cache_dir, check_target_names, load_gates, project_root, resolve_targets
    from quantgate.embedded import default_checkpoint
    from quantgate.evaluate import PROFILES, DataDir, load_suites, require_available, sources
    from quantgate.intake import intake
    from quantgate.quantize import kv_decisions
    from quantgate.quantize import plan as plan_builds

    if profile not in PROFILES:
        raise UsageError("--profile", f"unknown profile '{profile}'", f"use one of {', '.join(PROFILES)}")
    root = (root or project_root()).resolve()
    cache = (cache or cache_dir()).resolve()
    catalog = Catalog(root)
    gates = gates or root / "gates.yaml"
    policy = load_gates(gates, catalog)  # model classes and tenant floors, validated before any build starts
    if targets and "builds" in needs:  # a typo in --targets fails before minutes of conversion and hashing
        check_target_names(targets, catalog)
    loaded, data_path = [], None
    if "suites" in needs:
        loaded = load_suites(root / "eval_suites", suites)
        data = DataDir.resolve(data_dir, root)
        for suite in loaded:  # every data set the evaluations will read, before any build
            for source in sources(suite.spec):
                require_available(data, source)
        data_path = str(data.candidates[0]) if data_dir else None  # --data-dir, ~ expanded
    source_dir = checkpoint or default_checkpoint(cache, progress)
    record = intake(source_dir, policy, progress, cache=cache / "intake")
    builds, calib = [], None
    if "builds" in needs:
        names = resolve_targets(policy, record.model_class, targets, catalog)
        # the KV cache of each build, decided once here: the class's policy, or each target's own under --targets
        builds = plan_builds(
            catalog,
            names,
            kv_decisions(policy, record.model_class, targets, [catalog.target(n) for n in names]),
        )
        if any(b.needs_calibration for b in builds):
            spec = calibration or root / "calibration_sets" / "default.yaml"
            found = load_or_build(spec, cache / "calibration")
            calib = PlannedCalibration(spec=str(Path(spec).resolve()), sha256=found.sha256)
    return RunPlan(
        source=record,
        model=record.model_name,
        builds=builds,
        suites=[
            PlannedSuite(
                path=str(s.path), kind=s.spec.kind, spec=s.spec.model_dump(mode="json"), spec_hash=s.spec_hash
            )
            for s in loaded
        ],
        calibration=calib,
        tenants=tenants,
        profile=profile,
        sequential=sequential,
        root=str(root),
        gates=str(Path(gates).resolve()),
        cache_dir=str(cache),
        data_dir=data_path,
        out=str(out.resolve()),
        step_timeout_s=step_timeout_s,
        max_heavy=max_heavy,
        verbose=verbose,
        target_hashes={
            b.target.name: digest(
                content_digest(b.target),
                b.recipe_sha256,
                calib.sha256 if calib and b.needs_calibration else None,
                b.kv_cache.value,
            )
            for b in builds
        },
        suites_hash=digest({s.spec.name: s.spec_hash for s in loaded}),
        gates_hash=content_digest(policy),
        tools_hash=digest(tool_versions()),
        eval_env=numerics_switches(),
        device=device,
        devices=devices,
        max_memory=max_memory,
        stamp="",
        run_id=run_id,
    )


def make_plan(*, progress: Progress = SILENT, **options: Any) -> RunPlan:
    """A run's plan: ``resolve_plan`` with every part (``options`` are its own), the output directory
    stamped and ``<out>/plan.json`` written. Bad input raises before anything is written in ``out``.
    (The flow makes its plan from its ``RunRequest`` field by field: ``flow.plan_of``.)"""
    return stamped(resolve_plan(progress=progress, **options), progress)


def stamped(plan: RunPlan, progress: Progress = SILENT) -> RunPlan:
    """A resolved plan with its output directory stamped, written to ``<out>/plan.json``."""
    plan = plan.model_copy(update={"stamp": output_stamp(Path(plan.out))})
    write_plan(plan)
    progress.log(f"plan: {len(plan.builds)} targets, {len(plan.suites)} suites -> {plan.file}")
    return plan
