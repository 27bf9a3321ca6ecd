"""The plan of one run: what to build and evaluate, where, and the content keys that cache it.

Every cache key is a hash of *content*: the source's content hash, the bytes of the target
and recipe files, the calibration set's sha256, the suites' validated specs, gates.yaml, the
tool versions. Never a path: the same checkpoint copied elsewhere is the same work, and one
changed byte in a recipe is new work. The one location-dependent part is the output
directory's *stamp* (a random id written when the directory is first used), because a cached
result is only useful while the files it describes exist: delete the output directory and
its stamp goes with it, so nothing stale is served.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from quantgate.artifact import tool_versions
from quantgate.config.targets import Catalog
from quantgate.progress import SILENT, Progress

STAMP = ".quantgate-run"


class RunPlan(BaseModel):
    """Everything a step needs; plain data, so that it crosses process and Dask boundaries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint: str
    source_hash: str
    model: str
    model_class: str
    architecture: str
    source_bytes: int
    targets: list[str]
    suites: list[str]
    tenants: list[str] | None
    profile: str
    root: str
    gates: str
    cache_dir: str
    data_dir: str | None
    calibration: str | None  # spec path, for calibrated targets
    out: str
    step_timeout_s: float
    max_heavy: int  # heavy steps at once across flow runs on one Prefect server; 0: no limit
    # content hashes the cache keys are made of
    target_hashes: dict[str, str]  # target -> sha256(target yaml + recipe yaml + calibration set)
    suites_hash: str
    gates_hash: str
    tools_hash: str
    stamp: str

    @property
    def artifacts_dir(self) -> Path:
        return Path(self.out) / "artifacts"

    @property
    def eval_dir(self) -> Path:
        return Path(self.out) / "eval"

    def eval_part(self, name: str) -> Path:
        return Path(self.out) / "eval-parts" / name

    @property
    def report_dir(self) -> Path:
        return Path(self.out) / "report"

    def log(self, step: str) -> Path:
        return Path(self.out) / "logs" / f"{step}.log"

    def common_args(self) -> list[str]:
        """Options every step's command shares: the same project, policy, cache and source."""
        return ["--root", self.root, "--gates", self.gates, "--cache-dir", self.cache_dir, "--checkpoint", self.checkpoint]


def digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def output_stamp(out: Path) -> str:
    """The output directory's id, created on first use (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / STAMP
    if not path.exists():
        path.write_text(uuid.uuid4().hex + "\n")
    return path.read_text().strip()


def make_plan(
    *,
    checkpoint: Path | None,
    targets: list[str] | None,
    tenants: list[str] | None,
    suites: list[str] | None,
    profile: str,
    root: Path,
    gates: Path | None,
    cache: Path,
    data_dir: Path | None,
    calibration: Path | None,
    out: Path,
    step_timeout_s: float,
    max_heavy: int = 1,
    progress: Progress = SILENT,
) -> RunPlan:
    """Validate every input and hash what the cache keys need; raises ``InputError`` early."""
    from quantgate.calibration import load_or_build
    from quantgate.config.gates import check_target_names, load_gates, resolve_targets
    from quantgate.embedded.smollm2 import default_checkpoint, model_name
    from quantgate.errors import UsageError
    from quantgate.evaluate.suites import PROFILES, load_suites
    from quantgate.intake import intake
    from quantgate.quantize.pipeline import plan as plan_builds

    if profile not in PROFILES:
        raise UsageError("--profile", f"unknown profile '{profile}'", f"use one of {', '.join(PROFILES)}")
    root = root.resolve()
    catalog = Catalog(root)
    gates = (gates or root / "gates.yaml").resolve()
    policy = load_gates(gates, catalog)  # model classes and tenant floors, validated before any build starts
    if targets:
        check_target_names(targets, catalog)
    loaded = load_suites(root / "eval_suites", suites)
    source_dir = Path(checkpoint).resolve() if checkpoint else default_checkpoint(cache, progress)
    record = intake(source_dir, policy, progress, cache=cache / "intake")
    names = resolve_targets(policy, record.model_class, targets, catalog)
    planned = plan_builds(catalog, names)
    calib_spec = (calibration or root / "calibration_sets" / "default.yaml").resolve()
    calib_sha = None
    if any(r.calibration.required for _, r in planned):
        calib_sha = load_or_build(calib_spec, cache / "calibration").sha256
    target_hashes = {
        t.name: digest(
            (catalog.targets_dir / f"{t.name}.yaml").read_bytes().hex(),
            catalog.recipe_hash(r.name),
            calib_sha if r.calibration.required else None,
        )
        for t, r in planned
    }
    out = out.resolve()
    return RunPlan(
        checkpoint=str(source_dir),
        source_hash=record.content_hash,
        model=model_name(record.path),
        model_class=record.model_class,
        architecture=record.architecture,
        source_bytes=record.bytes,
        targets=names,
        suites=[s.spec.name for s in loaded],
        tenants=tenants,
        profile=profile,
        root=str(root),
        gates=str(gates),
        cache_dir=str(cache.resolve()),
        data_dir=str(data_dir.resolve()) if data_dir else None,
        calibration=str(calib_spec),
        out=str(out),
        step_timeout_s=step_timeout_s,
        max_heavy=max_heavy,
        target_hashes=target_hashes,
        suites_hash=digest({s.spec.name: s.spec_hash for s in loaded}),
        gates_hash=hashlib.sha256(gates.read_bytes()).hexdigest(),
        tools_hash=digest(tool_versions()),
        stamp=output_stamp(out),
    )
