"""``quantgate gate``: judge an evaluation against every tenant's floors and write the report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quantgate.cli.options import GatesOpt, ResultsOpt, RootOpt, TenantsOpt, out_dir, split
from quantgate.cli.report import render_reports
from quantgate.config import project_root
from quantgate.runtime.errors import UsageError
from quantgate.runtime.escape import visible


def gate(
    results: ResultsOpt,
    out: Annotated[Path, typer.Option("--out", help="Directory for report.json, report.md and report.html.")],
    gates: GatesOpt = None,
    tenants: TenantsOpt = None,
    model_class: Annotated[
        str | None,
        typer.Option(
            "--model-class",
            help="Model class deciding which targets are required (default: from the evaluation).",
        ),
    ] = None,
    previous: Annotated[
        Path | None,
        typer.Option(
            "--previous",
            help="Offline: the report directory of the previous approved version, for before/after deltas, "
            "instead of the versions the registry (MLFLOW_TRACKING_URI, else artifacts_registry/) approves.",
        ),
    ] = None,
    root: RootOpt = None,
) -> None:
    """Judge every artifact against every tenant's floors; exit 1 if a required artifact passes none.

    Each (artifact, tenant) is compared with the version the registry approves for that tenant
    today (before/after deltas, max_regression floors); a registry that cannot answer is exit 75.
    """
    from quantgate.gate import gate_results, write_report_json
    from quantgate.publish import RegistryConfig
    from quantgate.report import print_table, verdict_table

    project = (root or project_root()).resolve()
    if not (results / "summary.json").exists():
        raise UsageError(
            results, "no summary.json here", "run quantgate eval --out DIR first and pass that DIR"
        )
    out = out_dir(out, "--out")
    decision = gate_results(
        results,
        gates or project / "gates.yaml",
        project,
        model_class=model_class,
        tenants=split(tenants),
        previous=previous,
        registry=None if previous is not None else RegistryConfig.from_env(project),
    )
    report = write_report_json(decision, out, results)
    written = render_reports(report)
    title = f"quantgate gate: {decision.model} ({decision.model_class or 'class unknown'})"
    print_table(verdict_table(decision, title))
    for path in (report, *written):
        print(f"report: {visible(path)}")
    raise typer.Exit(decision.exit_code)
