"""``quantgate pull``: an approved artifact onto a serving node, verified (the fleet's command).

Imports the registry client and nothing of the build side: a node that only pulls needs neither
the orchestrator nor the quantizers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quantgate.cli.options import CacheOpt, RootOpt
from quantgate.config import cache_dir, project_root
from quantgate.runtime.errors import UsageError


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
    seed: Annotated[
        bool,
        typer.Option(
            "--seed",
            help="Then keep serving this node's cached versions to its fleet peers (quantgate seed), "
            "until stopped.",
        ),
    ] = False,
    channel: Annotated[
        str,
        typer.Option(
            "--channel",
            help="stable (alias approved-<tenant>, the default) or canary (canary-<tenant>: a rollout's "
            "canary, for the nodes that serve its share).",
        ),
    ] = "stable",
    cache: CacheOpt = None,
    root: RootOpt = None,
) -> None:
    """Download the approved artifact, verify every sha256, and print the local path to load."""
    from quantgate.publish import RegistryConfig, pull_artifact
    from quantgate.runtime.progress import RichProgress

    cfg = RegistryConfig.from_env((root or project_root()).resolve())
    if verify is not None:
        if verify not in ("always", "offline"):
            raise UsageError(
                "--verify", f"'{verify}' is not a schedule", "pass --verify always or --verify offline"
            )
        cfg = cfg.model_copy(update={"pull_verify": verify})
    if seed:  # it will listen there once pulled: refused now, before the pull, when it cannot
        from quantgate.fleet import check_listen

        check_listen(cfg.fleet)
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
            channel=channel,
        )
    print(path, flush=True)
    if seed:
        from quantgate.cli.seed import serve

        serve((cache or cache_dir()).resolve(), root)
