"""The verdict table printed at the end of ``quantgate gate`` and ``quantgate run``.

Built from the report (``quantgate.contracts.report_schema.Report``, or report.json's object), not from
in-memory gate objects, so both commands print exactly what the written report says. Every cell
and the title are ``escape.terminal`` text: a name is shown, never read as markup.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from quantgate.contracts.report_schema import Report, as_report
from quantgate.runtime.escape import terminal

if TYPE_CHECKING:  # rich is imported only when a table is built
    from rich.table import Table


def verdict_table(
    report: Report | Mapping[str, Any], title: str, published: dict[str, list[str]] | None = None
) -> Table:
    """artifact (role) x tenant verdicts; with ``published``, a column of the aliases set."""
    report = as_report(report)
    verdicts = report.verdicts
    tenants = list(dict.fromkeys(v.tenant for v in verdicts))
    rows = []
    for artifact in dict.fromkeys(v.artifact for v in verdicts):
        cells = {v.tenant: v.verdict for v in verdicts if v.artifact == artifact}
        row = [f"{artifact} ({report.role(artifact)})", *(cells.get(t, "-") for t in tenants)]
        if published is not None:
            row.append(", ".join(published.get(artifact, [])) or "none")
        rows.append(row)
    aliases = ["registry aliases"] if published is not None else []
    return text_table(title, ["artifact", *tenants, *aliases], rows)


def text_table(title: str, columns: Iterable[object], rows: Iterable[Iterable[object]]) -> Table:
    """A rich table whose title, headers and cells are text (``escape.terminal``): a name in any of
    them is shown as it is, with control characters visible, never read as markup."""
    from rich.table import Table

    table = Table(title=terminal(title))
    for column in columns:
        table.add_column(terminal(column))
    for row in rows:
        table.add_row(*map(terminal, row))
    return table


def print_table(table: Table) -> None:
    """Print a rich table; wide enough that paths are never cut when stdout is not a terminal."""
    from rich.console import Console

    Console(width=None if sys.stdout.isatty() else 240).print(table)
