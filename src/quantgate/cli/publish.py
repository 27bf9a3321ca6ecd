"""``quantgate publish``: a gate's report into the registry, aliased for the tenants each passed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from quantgate.cli.options import ReportDirOpt, RootOpt
from quantgate.config import project_root


def publish(
    report_dir: ReportDirOpt,
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
    from quantgate.config import canary_shares
    from quantgate.publish import RegistryConfig, publish_report
    from quantgate.report import print_table, text_table
    from quantgate.runtime.progress import RichProgress

    project = (root or project_root()).resolve()
    cfg = RegistryConfig.from_env(project)
    canary = canary_shares(project / "gates.yaml")  # tenants whose rollout policy is a canary
    with RichProgress() as progress:
        outcome = publish_report(report_dir / "report.json", artifacts, cfg, progress, canary=canary)
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
