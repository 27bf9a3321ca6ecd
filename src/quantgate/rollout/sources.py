"""Which evidence source a look reads, from named options: one place for ``quantgate rollout
watch`` and the ``canary_watch`` flow, so the two take the same options with the same meaning.

Exactly one live source:

- ``prometheus`` (a URL) or ``telemetry`` (the telemetry settings file; without either, the
  environment's ``QUANTGATE_PROMETHEUS_URL`` / ``QUANTGATE_TELEMETRY_FILE`` when ``live`` and
  ``source`` are absent too): the built-in ``TelemetryEvidence``, with ``logs`` (request logs'
  URIs) adding their errors;
- ``live``: a LiveEvidence JSON file (``FileEvidence``), evidence gathered elsewhere;
- ``source``: ``"module:factory"``, a callable taking the project root and returning an
  ``EvidenceSource`` of one's own.

Replay, with any live source, one of:

- ``replay``: a ReplayEvidence JSON file, as ``quantgate replay --json`` writes it (not with
  ``source``, whose factory reads its own replays);
- ``replay_stable`` and ``replay_canary`` (the two endpoints' URLs): the watcher replays a new
  sample at every look itself (``replay_looks.ReplayingEvidence``): ``replay_size`` prompts from
  ``replay_prompts`` (request logs' URIs; default: ``logs``), the pairs kept under
  ``replay_store`` (default: the registry's artifact URI, else the first log's folder).

A combination that makes no sense is a UsageError naming the option to drop.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from pydantic import ValidationError

from quantgate.runtime.errors import UsageError, first_problem


@dataclass(frozen=True)
class SourceOptions:
    """The named options, as the CLI and the flow take them."""

    source: str | None = None
    live: Path | None = None
    replay: Path | None = None
    prometheus: str | None = None
    telemetry: Path | None = None
    engine: str | None = None
    logs: tuple[str, ...] = ()
    served_model: str | None = None
    replay_stable: str | None = None
    replay_canary: str | None = None
    replay_prompts: tuple[str, ...] = ()
    replay_store: str | None = None
    replay_size: int = 16
    replay_max_tokens: int = 32


def _wants_telemetry(opts: SourceOptions) -> bool:
    named = opts.prometheus or opts.telemetry or opts.logs or opts.engine or opts.served_model
    from_env = not (opts.source or opts.live) and (
        os.environ.get("QUANTGATE_PROMETHEUS_URL") or os.environ.get("QUANTGATE_TELEMETRY_FILE")
    )
    return bool(named or from_env)


def _telemetry_settings(opts: SourceOptions):
    from quantgate.rollout.evidence import TelemetrySettings, load_telemetry

    if opts.prometheus and opts.telemetry:
        raise UsageError(
            "--prometheus", "given with --telemetry", "put prometheus_url in the telemetry file, or drop it"
        )
    if opts.prometheus:
        try:
            settings = TelemetrySettings.model_validate(
                {"prometheus_url": opts.prometheus, "engine": opts.engine or "vllm"}
            )
        except ValidationError as exc:
            raise UsageError(
                "--prometheus", f"'{opts.prometheus}': {first_problem(exc)}", "pass http://host:9090"
            ) from None
    else:
        settings = load_telemetry(opts.telemetry)
        if opts.engine and opts.engine != settings.engine:
            settings = settings.model_copy(update={"engine": opts.engine})
    settings.engine_metrics("--engine" if opts.engine else opts.telemetry or "--prometheus")
    return settings


def evidence_source(root: Path, cfg, opts: SourceOptions):
    """The look's ``EvidenceSource`` (see the module); ``cfg`` is the registry's ``RegistryConfig``."""
    live = _live_source(root, cfg, opts)
    endpoints = _replay_endpoints(cfg, opts)
    if endpoints is None:
        return live
    from quantgate.rollout.replay_looks import ReplayingEvidence

    return ReplayingEvidence(live, cfg, endpoints)


def _replay_endpoints(cfg, opts: SourceOptions):
    """The endpoints the watcher replays through at every look, or None when none are named."""
    if not (opts.replay_stable or opts.replay_canary):
        for flag, given in (("--replay-prompts", opts.replay_prompts), ("--replay-store", opts.replay_store)):
            if given:
                raise UsageError(
                    flag, "given without --replay-stable and --replay-canary", "name both endpoints"
                )
        return None
    if not (opts.replay_stable and opts.replay_canary):
        missing = "--replay-canary" if opts.replay_stable else "--replay-stable"
        raise UsageError(missing, "is missing", "name both endpoints the watcher replays through")
    if opts.replay:
        raise UsageError(
            "--replay", "given with --replay-stable/--replay-canary", "replay from a file or from endpoints"
        )
    prompts = tuple(opts.replay_prompts or opts.logs)
    if not prompts:
        raise UsageError(
            "--replay-prompts",
            "no prompts to replay",
            "pass --replay-prompts LOG (or --logs LOG) with logged prompts",
        )
    from quantgate.rollout.replay import ReplaySettings
    from quantgate.rollout.replay_looks import ReplayEndpoints
    from quantgate.rollout.telemetry_source import split_log_uri

    store = opts.replay_store or cfg.artifact_uri or split_log_uri(prompts[0])[0]
    if urlparse(store).scheme not in ("", "file", "s3"):
        raise UsageError(
            "--replay-store",
            f"'{store}' is neither a local folder nor s3://",
            "pass --replay-store s3://bucket/prefix",
        )
    settings = ReplaySettings(max_tokens=opts.replay_max_tokens, model=opts.served_model)
    return ReplayEndpoints(opts.replay_stable, opts.replay_canary, prompts, store, opts.replay_size, settings)


def _live_source(root: Path, cfg, opts: SourceOptions):
    chosen = [
        name
        for name, given in (
            ("--source", opts.source),
            ("--live", opts.live),
            ("--prometheus/--telemetry", _wants_telemetry(opts)),
        )
        if given
    ]
    if len(chosen) > 1:
        raise UsageError(chosen[1], f"given with {chosen[0]}", "name one live evidence source")
    if opts.source:
        if opts.replay:
            raise UsageError("--replay", "given with --source", "let the factory's source read replays")
        module, _, attr = opts.source.partition(":")
        if not attr:
            raise UsageError(
                "--source", f"'{opts.source}' is not 'module:factory'", "name a callable as module:attr"
            )
        return getattr(importlib.import_module(module), attr)(root)
    if opts.live:
        from quantgate.rollout.evidence_files import FileEvidence

        return FileEvidence(Path(opts.live), Path(opts.replay) if opts.replay else None)
    if not chosen:
        raise UsageError(
            "--prometheus",
            "no evidence source",
            "pass --prometheus URL (or --telemetry FILE, or set QUANTGATE_PROMETHEUS_URL), "
            "--live FILE or --source module:factory",
        )
    from quantgate.rollout.telemetry_source import TelemetryEvidence

    return TelemetryEvidence(
        cfg,
        _telemetry_settings(opts),
        logs=tuple(opts.logs),
        replay=Path(opts.replay) if opts.replay else None,
        served_model=opts.served_model,
    )
