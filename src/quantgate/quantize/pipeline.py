"""Build every requested target from one validated source.

Order of work, and why:
1. Every target, recipe and engine preflight is checked first, so a recipe that cannot apply
   (a group size that does not divide a layer, no CUDA for modelopt) fails in seconds, before
   hours of calibration and before anything is written.
2. An existing artifact with the same build key, intact files and the same serving check is reused.
3. Targets with identical recipes (hopper-fp8, rocm-cdna3-fp8) are built once; the second gets
   hard links to the first's files and a manifest of its own.
4. After its engine ran, an artifact gets the source's tokenizer, templates and dropped config
   keys back, expert tensors under the source's names, plain YAML and modes 0644/0755
   (``finalize``): what was gated is what is served.
5. The KV cache is the policy's decision (``PlannedBuild.kv_cache``): FP8 builds get calibrated
   ``k_scale``/``v_scale`` and a ``kv_cache_scheme`` (``kv_calibration``: in llm-compressor's
   pass for calibrated recipes, a KV pass over the built artifact for data-free ones, which then
   read the calibration set), bf16 builds declare nothing; checked after every build.
6. Each build is written into a temporary directory beside the destination and installed only
   when whole, so a crash never leaves a half-written artifact under its name.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from quantgate.config import Catalog, Frozen, KVCache, Recipe, Target
from quantgate.contracts.artifact import (
    MANIFEST,
    BuildInfo,
    CalibrationRef,
    KVCalibrationInfo,
    Manifest,
    RecipeRef,
    RepairRef,
    SourceRef,
    build_key,
    hash_files,
    read_manifest,
    record_verified,
    tool_versions,
    verify_files,
    write_manifest,
)
from quantgate.intake import SourceRecord
from quantgate.quantize import expert_names, finalize, kv_calibration
from quantgate.quantize.engines import BuildJob, Engine, engine_class
from quantgate.runtime.atomic import install_dir, remove_stale, staged_dir
from quantgate.runtime.errors import BuildError, CalibrationError, InputError, QuantgateError
from quantgate.runtime.memory import map_large_allocations, peak_rss_bytes
from quantgate.runtime.progress import SILENT, Progress
from quantgate.serving import require_loadable

if TYPE_CHECKING:
    from quantgate.calibration import CalibrationSet


@dataclass(frozen=True)
class BuildResult:
    """One target's outcome: where its artifact is, its manifest, and how it got there."""

    target: str
    path: Path
    manifest: Manifest
    status: str  # "built", "reused", "linked"


def _reusable(final: Path, key: str, cache: Path | None) -> Manifest | None:
    manifest = read_manifest(final)
    # without source_files: built before the source's support files were restored, so rebuilt
    if manifest is None or manifest.build_key != key or manifest.source_files is None:
        return None
    return manifest if not verify_files(final, manifest, cache) else None


_LIBRARY_KV_NOTE = (
    "the engine's own observers, in the model's dtype on the build device: the scales can differ "
    "across machines; identity rests on the artifact's bytes"
)


def _manifest(
    target: Target,
    kv_cache: KVCache,
    recipe: Recipe,
    recipe_sha: str,
    source: SourceRecord,
    calibration: CalibrationSet | None,
    key: str,
    tools: dict[str, str],
    out_dir: Path,
    seconds: float,
    linked_from: str | None,
) -> Manifest:
    return Manifest(
        target=target.name,
        hardware=target.hardware,
        format=target.format,
        kv_cache=kv_cache,
        numerics=target.numerics,
        recipe=RecipeRef(name=recipe.name, sha256=recipe_sha, engine=recipe.engine),
        calibration=(
            CalibrationRef(
                name=calibration.name,
                sha256=calibration.sha256,
                samples=min(len(calibration.records), recipe.calibration.num_samples),
                max_seq_length=recipe.calibration.max_seq_length,
            )
            if calibration is not None
            else None
        ),
        source=SourceRef(
            content_hash=source.content_hash,
            architecture=source.architecture,
            params=source.params,
            model_class=source.model_class,
            bytes=source.bytes,
        ),
        tools=tools,
        build_key=key,
        build=BuildInfo(
            seconds=round(seconds, 3),
            peak_rss_bytes=peak_rss_bytes(),
            finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
            linked_from=linked_from,
        ),
        files=hash_files(out_dir),
    )


class PlannedBuild(Frozen):
    """One target to build, as validated data: what a run's plan carries to its build steps."""

    target: Target
    recipe: Recipe
    recipe_sha256: str  # the validated recipe's content when planned: the build key's recipe part
    kv_cache: KVCache  # the policy's decision (kv_calibration.kv_decisions), not re-derived by a step
    repair: RepairRef | None = None  # a repaired variant (quantgate.repair): recorded in its manifest

    @property
    def needs_calibration(self) -> bool:
        """A calibrated recipe, or a data-free one whose FP8 KV scales are calibrated."""
        return self.recipe.calibration.required or self.kv_cache == KVCache.FP8_E4M3

    def build_inputs(self, calibration_sha256: str | None) -> list:
        """What this build's key holds besides the source and the tools (``artifact.build_key``):
        targets equal here are twins, built once and the other linked (``_build_all``)."""
        return [
            self.recipe_sha256,
            calibration_sha256 if self.needs_calibration else None,
            kv_calibration.key_part(self.kv_cache),
        ]


def plan(
    catalog: Catalog, target_names: list[str], kv_cache: dict[str, KVCache] | None = None
) -> list[PlannedBuild]:
    """Load and check every target and the recipe it names; a dangling name fails here.

    ``kv_cache``: the policy's decision per target (``kv_calibration.kv_decisions``); None takes
    each target's own ``kv_cache``, as ``--targets`` does.
    """
    planned = []
    for target in (catalog.target(n) for n in target_names):
        planned.append(
            PlannedBuild(
                target=target,
                recipe=catalog.recipe(target.recipe),
                recipe_sha256=catalog.recipe_hash(target.recipe),
                kv_cache=kv_cache[target.name] if kv_cache is not None else target.kv_cache,
            )
        )
    return planned


def preflight(source: SourceRecord, planned: list[PlannedBuild]) -> dict[str, Engine]:
    """One engine instance per engine name, each recipe checked before any work starts."""
    engines: dict[str, Engine] = {}
    for recipe in (p.recipe for p in planned):
        if recipe.engine not in engines:
            engines[recipe.engine] = engine_class(recipe.engine)()
        engines[recipe.engine].preflight(source, recipe)
    return engines


def build_planned(
    source: SourceRecord,
    planned: list[PlannedBuild],
    out: Path,
    calibration: CalibrationSet | None,
    progress: Progress = SILENT,
    device: str = "cpu",
    cache: Path | None = None,
    max_memory: int | None = None,
) -> list[BuildResult]:
    """Build every planned target into ``out/<target>``, reusing intact artifacts of equal build key.

    ``device`` ("cpu" or "cuda", resolved by ``quantgate.runtime.devices``): where calibration runs
    (llm-compressor's oneshot, quantgate's KV pass); the bytes of a data-free build do not depend on it.
    ``cache`` (the run's cache directory): each installed artifact's files are recorded in its stat
    cache as hashed, so an evaluation with the same cache does not hash them again
    (``artifact.verify_files``). ``max_memory`` (bytes, ``--max-memory``): the most a model
    calibrated whole may take on the GPU (``BuildJob.max_memory``); it changes where the work runs,
    not the bytes, so it is not in the build key.

    On any failure, directories this call created and left empty are removed again; artifacts
    installed before it stay (each is whole).
    """
    _require_dir_possible(out)
    map_large_allocations()
    engines = preflight(source, planned)
    if calibration is None:
        for p in planned:
            if p.needs_calibration:
                raise CalibrationError(
                    f"recipes/{p.recipe.name}.yaml",
                    f"{p.target.name} needs the calibration set"
                    + ("" if p.recipe.calibration.required else " for its FP8 KV cache scales")
                    + " but none was given",
                    "pass --calibration SPEC.yaml (default: calibration_sets/default.yaml)",
                )
    tools = tool_versions()
    # what this run creates is removed again when it fails with nothing installed: a refused
    # source or a failed first build leaves no empty --out behind
    created = _missing_dirs(out)
    try:
        for p in planned:  # temporary copies of these targets left by killed builds
            remove_stale(out, p.target.name)
        return _build_all(
            source, planned, out, calibration, progress, engines, tools, device, cache, max_memory
        )
    except BaseException:
        _remove_if_empty(created)
        raise


def _require_dir_possible(out: Path) -> None:
    """InputError (nothing written) when ``out`` or its nearest existing parent is not a directory."""
    existing = next((d for d in (out, *out.parents) if d.exists()), None)
    if existing is not None and not existing.is_dir():
        raise InputError(
            existing,
            "exists and is not a directory, so the artifacts cannot be written "
            + ("there" if existing == out else f"under {out}"),
            "pass a directory for --out (it is created when missing), or move that file away",
        )


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    return missing


def _remove_if_empty(dirs: list[Path]) -> None:
    """``rmdir`` each of ``dirs`` (deepest first) that is empty; one in use by anyone else stays."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


def _build_all(
    source: SourceRecord,
    planned: list[PlannedBuild],
    out: Path,
    calibration: CalibrationSet | None,
    progress: Progress,
    engines: dict[str, Engine],
    tools: dict[str, str],
    device: str = "cpu",
    cache: Path | None = None,
    max_memory: int | None = None,
) -> list[BuildResult]:
    """``build_planned``'s loop, once the checks are done: one artifact per target, installed whole."""
    # data-free recipes first: they are fast and stream, so a later calibrated failure
    # still leaves the cheap artifacts in place
    results: list[BuildResult] = []
    built_by_key: dict[str, Path] = {}
    for target, recipe, recipe_sha, kv, repair in (
        (p.target, p.recipe, p.recipe_sha256, p.kv_cache, p.repair)
        for p in sorted(planned, key=lambda p: p.recipe.calibration.required)
    ):
        # a data-free recipe reads the calibration set only for FP8 KV scales
        calib = calibration if recipe.calibration.required or kv == KVCache.FP8_E4M3 else None
        key = build_key(
            source_hash=source.content_hash,
            recipe_sha256=recipe_sha,
            calibration_sha256=calib.sha256 if calib else None,
            tools=tools,
            kv_cache=kv_calibration.key_part(kv),
        )
        final = out / target.name
        existing = _reusable(final, key, cache)
        if existing is not None and expert_names.mismatches(Path(source.path), final):
            existing = None  # built before expert tensors got the source's names back: rebuilt
        if existing is not None and existing.serving != require_loadable(final, target):
            existing = None  # same inputs, another serving contract (or none recorded): rebuilt to record it
        if existing is not None:
            finalize.set_modes(final)
            progress.log(f"{target.name}: inputs unchanged, reusing {final}")
            results.append(BuildResult(target.name, final, existing, "reused"))
            built_by_key.setdefault(key, final)
            continue

        # a temporary directory beside final, locked for this process (atomic.staged_dir): a killed
        # build's is removed by the next one; a full disk is DiskFullError (exit 75), nothing kept
        with staged_dir(final, f"building {target.name}") as tmp:
            started = time.perf_counter()
            linked_from = None
            kv_info: KVCalibrationInfo | None = None
            if key in built_by_key:
                twin = built_by_key[key]
                for path in twin.rglob("*"):
                    if path.is_file() and path.name != MANIFEST:
                        dest = tmp / path.relative_to(twin)
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        os.link(path, dest)
                linked_from = twin.name
                status = "linked"
                # the same bytes: the same KV scales, computed as the twin's manifest says
                twin_manifest = read_manifest(twin)
                kv_info = twin_manifest.build.kv_calibration if twin_manifest is not None else None
                source_files = finalize.verify_support_files(Path(source.path), tmp)
            else:
                engine = engines[recipe.engine]
                try:
                    engine.build(
                        BuildJob(source, recipe, calib, tmp, progress, kv, device, cache, max_memory)
                    )
                except QuantgateError:
                    raise
                except Exception as exc:  # an engine's own failure: name the target, keep the cause
                    raise BuildError(
                        f"{target.name}: the {recipe.engine} engine failed with {type(exc).__name__}: {exc}"
                    ) from exc
                # the source's tokenizer, templates and config keys over the engine's; safe YAML
                source_files = finalize.finish(Path(source.path), tmp)
                if (
                    kv == KVCache.FP8_E4M3
                    and calib is not None
                    and not getattr(engine, "calibrates_kv_cache", False)
                ):
                    kv_pass = kv_calibration.calibrate(
                        tmp,
                        target,
                        calib,
                        recipe.calibration.num_samples,
                        recipe.calibration.max_seq_length,
                        progress,
                        device=device,
                    )
                    kv_calibration.write_kv_scales(tmp, kv_pass.absmax)
                    kv_info = KVCalibrationInfo(
                        by="quantgate",
                        canonical=kv_pass.arithmetic.canonical,
                        notes=kv_pass.arithmetic.notes,
                    )
                elif kv == KVCache.FP8_E4M3:
                    kv_info = KVCalibrationInfo(
                        by=recipe.engine,
                        canonical=False,
                        notes=(_LIBRARY_KV_NOTE,),
                    )
                status = "built"
            kv_calibration.check_declared(tmp, target.name, kv)
            seconds = time.perf_counter() - started
            # ServingError (exit 1) when no configuration loads it: nothing is installed
            serving = require_loadable(tmp, target)
            manifest = _manifest(
                target, kv, recipe, recipe_sha, source, calib, key, tools, tmp, seconds, linked_from
            )
            manifest = manifest.model_copy(
                update={
                    "serving": serving,
                    "source_files": source_files,
                    "repair": repair,
                    "build": manifest.build.model_copy(update={"device": device, "kv_calibration": kv_info}),
                }
            )
            write_manifest(tmp, manifest)
            finalize.set_modes(tmp)  # 0644/0755, whatever the umask and the engine's temporary files
            install_dir(tmp, final)  # replaces an older artifact only once this one is whole
        record_verified(final, manifest, cache)
        progress.log(f"{target.name}: {status} in {seconds:.1f} s -> {final}")
        built_by_key.setdefault(key, final)
        results.append(BuildResult(target.name, final, manifest, status))
    order = {p.target.name: i for i, p in enumerate(planned)}
    return sorted(results, key=lambda r: order[r.target])
