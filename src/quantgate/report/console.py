"""The verdict table printed at the end of ``quantgate gate`` and ``quantgate run``.

Built from ``report.json``'s payload (not from in-memory objects), so both commands print
exactly what the written report says.
"""

from __future__ import annotations

import sys
from typing import Any


def role(report: dict[str, Any], artifact: str) -> str:
    if artifact in report.get("required", []):
        return "required"
    return "optional" if artifact in report.get("optional", []) else "outside class"


def verdict_table(report: dict[str, Any], title: str, published: dict[str, list[str]] | None = None):
    """artifact (role) x tenant verdicts; with ``published``, a column of the aliases set."""
    from rich.table import Table

    verdicts = report["verdicts"]
    tenants = list(dict.fromkeys(v["tenant"] for v in verdicts))
    table = Table(title=title)
    table.add_column("artifact")
    for name in tenants:
        table.add_column(name)
    if published is not None:
        table.add_column("registry aliases")
    for artifact in dict.fromkeys(v["artifact"] for v in verdicts):
        cells = {v["tenant"]: v["verdict"] for v in verdicts if v["artifact"] == artifact}
        row = [f"{artifact} ({role(report, artifact)})", *(cells.get(t, "-") for t in tenants)]
        if published is not None:
            row.append(", ".join(published.get(artifact, [])) or "none")
        table.add_row(*row)
    return table


def print_table(table) -> None:
    from rich.console import Console

    # not a terminal (CI logs, pipes): wide enough that paths are never cut
    Console(width=None if sys.stdout.isatty() else 240).print(table)
