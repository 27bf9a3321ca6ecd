"""``quantgate rollout``: a tenant's canary, for a router (``status``) and for the watcher
(``watch``: one look, as the scheduled ``canary_watch`` flow takes it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from quantgate.cli.options import CacheOpt, RootOpt
from quantgate.config import cache_dir, project_root

app = typer.Typer(
    help="A tenant's canary rollout: status for a router, one look of the watcher.", no_args_is_help=True
)

ModelArg = Annotated[str, typer.Argument(help="Model name as published (the report's 'model').")]
TargetOpt = Annotated[str, typer.Option("--target", help="Hardware target, e.g. hopper-fp8.")]
TenantOpt = Annotated[str, typer.Option("--tenant", help="The tenant whose rollout it is.")]

# the watcher's own replay at each look (rollout.replay_looks)
ReplayStableOpt = Annotated[
    str | None,
    typer.Option(
        "--replay-stable", help="Stable's OpenAI-compatible endpoint: replay a new sample each look."
    ),
]
ReplayCanaryOpt = Annotated[
    str | None, typer.Option("--replay-canary", help="The canary's endpoint (with --replay-stable).")
]
ReplayPromptsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--replay-prompts",
        help="Request log (JSONL; a path or s3://...) to sample replayed prompts from; repeatable. "
        "Default: --logs.",
    ),
]
ReplaySizeOpt = Annotated[int, typer.Option("--replay-size", min=1, help="Prompts replayed per look.")]
ReplayMaxTokensOpt = Annotated[
    int, typer.Option("--replay-max-tokens", min=1, help="Tokens generated per replayed prompt.")
]
ReplayStoreOpt = Annotated[
    str | None,
    typer.Option(
        "--replay-store",
        help="Where each look's pairs are kept (a folder or s3://...). "
        "Default: the registry's artifact URI, else the prompts log's folder.",
    ),
]


@app.command("status")
def status(
    model: ModelArg,
    target: TargetOpt,
    tenant: TenantOpt,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (what a router reads).")] = False,
    cache: CacheOpt = None,
    root: RootOpt = None,
) -> None:
    """Versions, traffic shares and signed record numbers; a replayed older record is refused (exit 2)."""
    from quantgate.publish import RegistryConfig
    from quantgate.rollout import rollout_status

    cfg = RegistryConfig.from_env((root or project_root()).resolve())
    found = rollout_status(cfg, model, target, tenant, (cache or cache_dir()).resolve() / "pull")
    if as_json:
        print(json.dumps(found, indent=1))
        return
    for version, share in found["shares"].items():
        print(f"{found['registered_model']} {tenant}: version {version} {share:.2%}")
    for channel in ("stable", "canary"):
        if found[channel]:
            r = found[channel]
            print(f"  {channel}: record {r['sequence']} ({r['event']}) until {r['expires_at']}")


@app.command("watch")
def watch(
    model: ModelArg,
    target: TargetOpt,
    tenant: TenantOpt,
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus", help="Prometheus server over the engine's metrics, e.g. http://prom:9090."
        ),
    ] = None,
    telemetry: Annotated[
        Path | None,
        typer.Option("--telemetry", help="Telemetry settings (YAML: prometheus_url, engine, metric names)."),
    ] = None,
    engine: Annotated[
        str | None, typer.Option("--engine", help="Engine preset of metric names (vllm, vllm-v0).")
    ] = None,
    served_model: Annotated[
        str | None,
        typer.Option("--served-model", help="The model label's value in the metrics (default: MODEL)."),
    ] = None,
    logs: Annotated[
        list[str] | None,
        typer.Option(
            "--logs", help="Request log (JSONL; a path or s3://...) whose errors count; repeatable."
        ),
    ] = None,
    live: Annotated[
        Path | None, typer.Option("--live", help="Live evidence as a file (LiveEvidence JSON) instead.")
    ] = None,
    replay: Annotated[
        Path | None,
        typer.Option("--replay", help="Replay evidence (what 'quantgate replay --json' writes)."),
    ] = None,
    replay_stable: ReplayStableOpt = None,
    replay_canary: ReplayCanaryOpt = None,
    replay_prompts: ReplayPromptsOpt = None,
    replay_size: ReplaySizeOpt = 16,
    replay_max_tokens: ReplayMaxTokensOpt = 32,
    replay_store: ReplayStoreOpt = None,
    source: Annotated[
        str | None, typer.Option("--source", help="Your own evidence source: module:factory(root).")
    ] = None,
    gates: Annotated[
        Path | None, typer.Option("--gates", help="gates.yaml (default: the project's).")
    ] = None,
    root: RootOpt = None,
) -> None:
    """One look: finish a move a killed run left, or decide on the evidence and act."""
    from quantgate.config import load_rollout
    from quantgate.publish import RegistryConfig
    from quantgate.rollout import SourceOptions, evidence_source, watch_once
    from quantgate.runtime.errors import UsageError

    project = (root or project_root()).resolve()
    policies = load_rollout(gates or project / "gates.yaml")
    if tenant not in policies:
        raise UsageError("--tenant", f"gates.yaml has no tenant '{tenant}'", f"known: {', '.join(policies)}")
    policy, confidence = policies[tenant]
    cfg = RegistryConfig.from_env(project)
    options = SourceOptions(
        source=source,
        live=live,
        replay=replay,
        prometheus=prometheus,
        telemetry=telemetry,
        engine=engine,
        logs=tuple(logs or ()),
        served_model=served_model,
        replay_stable=replay_stable,
        replay_canary=replay_canary,
        replay_prompts=tuple(replay_prompts or ()),
        replay_store=replay_store,
        replay_size=replay_size,
        replay_max_tokens=replay_max_tokens,
    )
    found = evidence_source(project, cfg, options)
    outcome = watch_once(cfg, model, target, tenant, policy, confidence, found)
    print(json.dumps(outcome.to_dict()), flush=True)


@app.command("report")
def report(
    model: ModelArg,
    target: TargetOpt,
    tenant: TenantOpt,
    out: Annotated[Path, typer.Option("--out", help="Directory for report.json, .md, .html and tests.svg.")],
    cache: CacheOpt = None,
    root: RootOpt = None,
) -> None:
    """The rollout report: the tests over the looks, the decision and why, the KPI delta."""
    from quantgate.config import load_rollout
    from quantgate.publish import RegistryConfig, registered_model_name, registry_client, state_tag
    from quantgate.rollout import rollout_status, write_report

    project = (root or project_root()).resolve()
    cfg = RegistryConfig.from_env(project)
    found = rollout_status(cfg, model, target, tenant, (cache or cache_dir()).resolve() / "pull")
    tags = registry_client(cfg).get_registered_model(registered_model_name(model, target)).tags or {}
    state = json.loads(tags.get(state_tag(tenant)) or "{}")
    policies = load_rollout(project / "gates.yaml") if (project / "gates.yaml").is_file() else {}
    from quantgate.rollout import floor_count

    policy, confidence = policies.get(tenant, (None, 0.95))
    alpha = (1 - confidence) / (2 * max(1, floor_count(policy))) if policy else 0.05
    for kind, path in write_report(state, found, out, alpha).items():
        print(f"{kind}: {path}")
