"""Evaluate a source and its artifacts on every suite, paired, with the source run at most once.

Why a reference cache: a second evaluation of new artifacts against the same source loads the
source's results from it (``reference_path``) and never loads the source model. Artifacts are
evaluated one at a time (one model in memory), each through ``load_for_eval`` so that its
target's weight, activation and KV-cache numerics are applied explicitly and recorded with every
result. Outputs under ``out``, written atomically: ``<model>/<suite>.json``, ``summary.json``
(``{"source" | <target>: {"<suite>.<metric>": value}}``) and ``run.json`` (what ran, on which
numerics, and how often the source model ran).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from quantgate.config import Gates
from quantgate.contracts.artifact import Manifest, artifact_dirs, require_manifest, verify_files
from quantgate.contracts.results import RunInfo, SuiteResultFile, write_run_info, write_suite_result
from quantgate.declarations.metrics import RERUN
from quantgate.evaluate import environment, skip
from quantgate.evaluate.sequential import BATCH_MIN, watched
from quantgate.evaluate.sequential import run as sequential_run
from quantgate.evaluate.suites import EvalContext, LoadedSuite, SuiteResult
from quantgate.runtime import sharding
from quantgate.runtime.atomic import staged_file, write_json
from quantgate.runtime.errors import InputError

# 2: references computed with tiled prefill attention and log-sum-exp scoring; a version-1
# reference (sdpa) paired with a version-2 artifact pass would carry attention rounding as KLD.
# 3: per-item records carry what the gate bounds (text windows' largest per-token KLDs, long-chain
# traces' deepest-bin agreement); a cached source result without them cannot be paired
# 4: generation is greedy whatever the checkpoint's generation config says (generation.pin_greedy);
# a version-3 reference followed its num_beams, penalties and sampling settings
# 5: a padded batch's decoding steps attend with the heads grouped (attention.grouped_decode): sdpa's
# arithmetic, but another kernel call, whose rounding may differ (on a GPU, another kernel)
# 6: generation decodes on a static cache (evaluate.decode): the CPU's bits are unchanged, but a GPU's
# attention kernel runs over the cache's whole (masked) length, so its rounding may differ
# 7: text windows drawn at random from the whole corpus, each with its unscored context; long-chain
# problems drawn at random
REFERENCE_VERSION = 7
# the arithmetic of a GPU pass beyond the device itself, in a GPU reference's key: 2, lm_head
# chunks of scoring.chunk_rows("cuda") rows and no torch.compile under QUANTGATE_COMPILE=auto
GPU_ARITHMETIC = 2


@dataclass
class SourceRuns:
    """Loads the source model only when a reference is missing, and counts its forward passes."""

    checkpoint: Path
    device: str = "cpu"
    max_memory: int | None = None  # bytes the source may keep on the device (``offload``)
    forward_passes: int = 0
    load_seconds: float = 0.0
    _model: Any = None

    def model(self):
        """The source, loaded for evaluation on first use, with a hook counting decoder passes."""
        if self._model is None:
            from quantgate.numerics import load_source_for_eval

            started = time.perf_counter()
            self._model = load_source_for_eval(
                self.checkpoint, device=self.device, max_memory=self.max_memory
            )
            self.load_seconds = round(time.perf_counter() - started, 3)

            def count(*_):
                self.forward_passes += 1

            # the decoder runs in every pass: teacher-forced scoring calls it directly, generation
            # through the model's forward
            self._model.model.get_decoder().register_forward_pre_hook(count)
        return self._model


@dataclass
class EvalRun:
    """What one evaluation wrote and learned: summary, numerics, reference cache use."""

    out: Path
    summary: dict[str, dict[str, float | None]] = field(default_factory=dict)
    numerics: dict[str, dict] = field(default_factory=dict)
    reference_hits: list[str] = field(default_factory=list)
    reference_misses: list[str] = field(default_factory=list)
    source_forward_passes: int = 0
    sequential: dict[str, dict[str, dict]] = field(default_factory=dict)  # artifact -> suite -> design
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)  # artifact -> suite -> why not run
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> phase -> seconds
    device: str = "cpu"

    @contextmanager
    def timed(self, model: str, phase: str) -> Iterator[None]:
        """Record the seconds ``phase`` of ``model`` takes (run.json ``seconds``); on a GPU the
        device is synchronized first, so the time is the work's, not the launch's."""

        def sync() -> None:
            if self.device != "cpu":
                torch.cuda.synchronize()

        sync()
        started = time.perf_counter()
        try:
            yield
        finally:
            sync()
            self.seconds.setdefault(model, {})[phase] = round(time.perf_counter() - started, 3)


def reference_path(ctx: EvalContext, suite: LoadedSuite, source_hash: str, device: str = "cpu") -> Path:
    """Where the source's reference for ``suite`` is cached: keyed by ``REFERENCE_VERSION``, the
    suite's validated spec, the source's content hash, the profile, the numerics switches
    (``environment.switches()``: QUANTGATE_COMPILE, threads, CPU kernels) and the device (a
    reference computed on the GPU is paired only with artifacts scored there; "cpu" adds nothing,
    so the CPU keys of older runs stay valid), and the number of processes the model is spread
    over (``sharding``: row-wise layers sum partial products across them)."""
    switches = sorted(environment.switches().items())
    parts: tuple[Any, ...] = (REFERENCE_VERSION, suite.spec_hash, source_hash, ctx.profile, switches)
    if device != "cpu":
        parts = (*parts, device, f"gpu-arithmetic-{GPU_ARITHMETIC}")
    if (shards := sharding.current()) is not None:
        parts = (*parts, f"tensor-parallel-{shards.world}")
    if _reruns(ctx, suite, device):
        parts = (*parts, "rerun")
    key = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()
    return ctx.cache_dir / "references" / suite.spec.name / f"{key[:32]}.pt"


def _reference(ctx: EvalContext, suite: LoadedSuite, source_hash: str, source: SourceRuns, run: EvalRun):
    path = reference_path(ctx, suite, source_hash, source.device)
    if sharding.agree(path.exists()):  # every rank computes it, or none does
        run.reference_hits.append(suite.spec.name)
        state = torch.load(path, weights_only=True)
        return state["reference"], SuiteResult(**state["source_result"])
    run.reference_misses.append(suite.spec.name)
    reference, result = suite.runner.reference(ctx, source.model())
    if _reruns(ctx, suite, source.device):
        result = with_rerun(result, suite.runner.score(ctx, source.model(), reference))
    if result.errors or not sharding.writer():  # items not evaluated (e.g. no sandbox here) are tried
        return reference, result  # again next time, not cached; in a group, rank 0 writes it
    with staged_file(path) as tmp:
        torch.save({"reference": reference, "source_result": asdict(result)}, tmp)
    return reference, result


def with_rerun(result: SuiteResult, again: SuiteResult) -> SuiteResult:
    """The source's result with each record's re-evaluation beside it (``metrics.RERUN``): what an
    identical model's answers do on this device, that the gate pairs an artifact's losses with."""
    by_item = {str(r.get("item")): r for r in again.samples}
    samples = [
        {**r, RERUN: {k: v for k, v in by_item[str(r.get("item"))].items() if k != RERUN}}
        if str(r.get("item")) in by_item
        else r
        for r in result.samples
    ]
    note = f"the source re-evaluated on this device ({len(by_item)} items): the gate pairs lost answers with its own"
    return replace(result, samples=samples, notes=[*result.notes, note])


def _reruns(ctx: EvalContext, suite: LoadedSuite, device: str) -> bool:
    """Whether the source is scored twice on ``suite`` (``EvalContext.rerun_source``): on a device
    that is not bit-reproducible, for suites that count lost answers."""
    wanted = ctx.rerun_source if ctx.rerun_source is not None else device != "cpu"
    return wanted and any(
        m.events is not None and m.events.noise is not None for m in suite.runner.metrics().values()
    )


def _record(
    run: EvalRun, model_name: str, result: SuiteResult, numerics: dict, extra: dict
) -> SuiteResultFile:
    """Write one model's result on one suite (the results contract) and add it to the summary."""
    recorded = SuiteResultFile.model_validate(
        {"model": model_name, **asdict(result), "numerics": numerics, **extra}
    )
    write_suite_result(run.out, recorded)
    run.summary.setdefault(model_name, {}).update(
        {f"{result.suite}.{k}": v for k, v in result.metrics.items()}
    )
    return recorded


def evaluate(
    source_checkpoint: Path,
    source_hash: str,
    artifacts: Path,
    out: Path,
    suites: list[LoadedSuite],
    ctx: EvalContext,
    targets: list[str] | None = None,
    *,
    model: str | None = None,
    model_class: str | None = None,
    source_bytes: int | None = None,
    reference_only: bool = False,
    sequential: bool = False,
    gates: Gates | None = None,
    tenants: list[str] | None = None,
    device: str = "cpu",
    max_memory: int | None = None,
) -> EvalRun:
    """Evaluate the source (from its reference cache when present) and every artifact.

    ``device`` ("cpu" or "cuda", resolved by ``quantgate.runtime.devices``): where the models run. On a GPU
    with FP8 tensor cores FP8 W8A8 linears run natively, every other format emulated on that GPU
    (``load_for_eval``; each result's numerics say which, per linear); run.json records it.
    ``max_memory`` (bytes, ``--max-memory``): each model keeps at most that on the device and its
    other decoder layers offloaded (``quantgate.runtime.offload``): the same numbers, so the same caches.

    ``reference_only`` evaluates the source alone: an orchestrator runs it once, then one
    evaluation per artifact in parallel, each finding every reference in the cache.
    ``gates`` (and ``tenants`` to watch only those): an artifact's suites run cheapest first,
    and a suite that cannot change any verdict is not run (``evaluate/skip.py``); with
    ``sequential``, suites that can score a subset stop once every floor on them is decided
    (``evaluate/sequential.py``).
    """
    sharding.join(device)  # in a group (quantgate eval --devices N), every rank runs what follows
    # visible directories with a valid manifest only: a killed build's .<target>.tmp-* is none
    dirs = [] if reference_only else artifact_dirs(artifacts, targets)
    manifests: dict[Path, Manifest] = {d: require_manifest(d) for d in dirs}
    run = EvalRun(out, device=device)
    for d in dirs:  # an artifact whose files differ from its manifest is not what was built
        with run.timed(d.name, "verify"):
            problems = verify_files(d, manifests[d], ctx.cache_dir)
        if problems:
            raise InputError(
                d / "manifest.json", f"artifact files differ from the manifest: {problems[0]}", "rebuild it"
            )
    for d in dirs:  # refuse before any work: an artifact of another source cannot be paired
        if manifests[d].source.content_hash != source_hash:
            raise InputError(
                d / "manifest.json",
                "this artifact was built from a different source checkpoint than the one given",
                "pass the --checkpoint it was built from, or rebuild it from this one",
            )
    # results are keyed by the artifact directory's name (normally its target's name)
    sizes = {"source": source_bytes, **{d.name: manifests[d].total_bytes for d in dirs}}
    source = SourceRuns(source_checkpoint, device, max_memory)
    extra = {"profile": ctx.profile, "source_hash": source_hash}
    references, source_results = {}, {}
    source_files: dict[str, SuiteResultFile] = {}
    source_numerics = {
        "target": "source",
        "mode": "native",
        "weights": "bf16",
        "activations": "bf16",
        "device": device,
        "tensor_parallel": sharding.processes(),
    }
    for suite in suites:
        loaded_before = source.load_seconds
        with run.timed("source", f"reference:{suite.spec.name}"):
            references[suite.spec.name], result = _reference(ctx, suite, source_hash, source, run)
        if source.load_seconds != loaded_before:  # loading the source is a phase of its own
            phases = run.seconds["source"]
            phases["load"] = source.load_seconds
            phases[f"reference:{suite.spec.name}"] = round(
                phases[f"reference:{suite.spec.name}"] - source.load_seconds, 3
            )
        source_results[suite.spec.name] = result
        source_files[suite.spec.name] = _record(run, "source", result, source_numerics, extra)
    if source._model is not None:  # loaded for a reference: say whether its layers were offloaded
        source_numerics["offloaded_layers"] = source._model.numerics.offloaded_layers
    run.numerics["source"] = source_numerics
    source._model = None  # free the source before loading artifacts

    from quantgate.numerics import load_for_eval

    by_name = {s.spec.name: s for s in suites}
    cheapest_first = sorted(suites, key=lambda s: (s.runner.cost(ctx.profile), s.spec.name))
    for d in dirs:
        manifest = manifests[d]
        with run.timed(d.name, "load"):
            loaded = load_for_eval(d, device=device, max_memory=max_memory)
        numerics = loaded.numerics.model_dump(mode="json")
        run.numerics[d.name] = numerics
        about = {**extra, "target": manifest.target, "build_key": manifest.build_key}
        watches = {s.spec.name: watched(gates, s.spec.name, d.name, tenants) if gates else [] for s in suites}
        gating = {w.tenant for ws in watches.values() for w in ws}
        done: dict[str, SuiteResultFile] = {}
        for suite in cheapest_first:
            name = suite.spec.name
            why = skip.unneeded(watches[name], suite, source_results[name]) or (
                skip.every_tenant_failed(watches, by_name, source_files, done, gating) if done else None
            )
            if why is not None:
                ctx.progress.log(f"{d.name}: {name} not run: {why}")
                run.skipped.setdefault(d.name, {})[name] = why
                empty = SuiteResult(name, suite.spec.kind, {}, [], [f"not run: {why}"])
                _record(run, d.name, empty, numerics, about | {"skipped": why})
                continue
            design: dict[str, Any] = {}
            with run.timed(d.name, name):
                if sequential and watches[name] and suite.runner.subset(references[name], []) is not None:
                    result, design = _sequential(
                        ctx, suite, loaded, references[name], source_results[name], watches[name]
                    )
                    run.sequential.setdefault(d.name, {})[name] = design
                else:
                    result = suite.runner.score(ctx, loaded, references[name])
            done[name] = _record(
                run, d.name, result, numerics, about | ({"sequential": design} if design else {})
            )
        del loaded
    run.source_forward_passes = source.forward_passes
    write_json(out / "summary.json", run.summary, default=str)
    write_run_info(
        out,
        RunInfo.model_validate(
            {
                "model": model,
                "model_class": model_class,
                "profile": ctx.profile,
                "device": device,
                "source_hash": source_hash,
                "bytes": sizes,
                "suites": {s.spec.name: {"kind": s.spec.kind, "spec_sha256": s.spec_hash} for s in suites},
                "numerics": run.numerics,
                "reference_cache": {"hits": run.reference_hits, "computed": run.reference_misses},
                "source_forward_passes": run.source_forward_passes,
                "environment": environment.recorded(),
                "design": "sequential" if sequential else "fixed",
                "sequential": run.sequential,
                "skipped": run.skipped,
                "seconds": run.seconds,
                "shards": shards.describe(device) if (shards := sharding.current()) is not None else None,
                "max_memory": max_memory,
            }
        ),
    )
    return run


def _sequential(ctx: EvalContext, suite: LoadedSuite, loaded, reference, source: SuiteResult, watches):
    """One suite of one artifact, sequentially: its result over the items used, and the design block."""
    from quantgate.declarations.metrics import record_columns
    from quantgate.stats.sequence import ordered_columns

    runner = suite.runner
    sizes = suite.spec.sizes(ctx.profile)
    batch = max(BATCH_MIN, int(getattr(sizes, "batch_size", 1)))

    def score(positions: list[int]) -> list[dict]:
        return runner.score(ctx, loaded, runner.subset(reference, positions)).samples

    samples, design = sequential_run(suite, source, watches, len(source.samples), score, batch=batch)
    # the suite's metrics over the items used, from the statistics the gate bounds
    by_item = {str(r["item"]): r for r in source.samples}
    metrics: dict[str, float | None] = {}
    try:
        a = ordered_columns(runner, samples)
        s = ordered_columns(runner, [by_item[str(r["item"])] for r in samples], record_columns)
    except KeyError:  # items not evaluated: the records say why, the gate reports them
        a = s = {}
    for metric, measure in runner.metrics().items():
        if measure.statistic is not None:
            try:
                metrics[metric] = float(measure.statistic(a, s, -1))
            except KeyError:
                metrics[metric] = None
    note = (
        f"sequential: {design['items_used']} of {design['items_total']} items in a seeded order, "
        f"stopped: {design['stopped']}"
    )
    return SuiteResult(
        suite.spec.name, suite.spec.kind, metrics, samples, [note], sampling=source.sampling
    ), design
