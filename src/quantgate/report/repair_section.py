"""The report's repair section: per target, every variant tried and why the search stopped.

Shared by the Markdown and the HTML report, so both say the same thing; the HTML adds the
bytes-against-quality frontier (``plots.frontier_figure``). The lines and cells are plain text
holding names from data: the Markdown escapes each (``escape.md``), the HTML template autoescapes.
"""

from __future__ import annotations

from quantgate.contracts.report_schema import Report, TargetRepair
from quantgate.runtime.escape import md
from quantgate.runtime.units import format_bytes


def outcome_lines(repair: TargetRepair) -> list[str]:
    """One line per repaired tenant, and what the search cost."""
    lines = []
    for t in repair.tenants:
        if t.k is None:
            lines.append(f"{repair.target} × {t.tenant}: no variant ({t.stopped}); nothing published for it")
        else:
            size = next(p.bytes for p in repair.probes if p.k == t.k)
            lines.append(
                f"{repair.target} × {t.tenant}: k={t.k} of {repair.units} layer groups kept at {repair.upgrade}, "
                f"{format_bytes(size)} against {format_bytes(repair.uniform_bytes)} uniform ({t.stopped})"
            )
    sensitivity = "cached" if repair.sensitivity_cached else f"{repair.sensitivity_seconds:.0f} s"
    lines.append(
        f"search: {repair.builds} builds and evaluations of a budget of {repair.budget}, sensitivity {sensitivity}, "
        f"{repair.seconds:.0f} s in all; most sensitive groups: {', '.join(repair.ranked[:3])}"
    )
    return lines


def probe_rows(repair: TargetRepair) -> tuple[list[str], list[list[str]]]:
    """The variants tried, smallest first: header and rows."""
    keys = sorted({q for p in repair.probes for q in p.quality})
    header = ["k kept", "bytes", "passes", *keys, "seconds"]
    rows = [
        [
            str(p.k),
            format_bytes(p.bytes),
            ", ".join(p.passed) or "none",
            *(f"{p.quality[k]:.4g}" if k in p.quality else "—" for k in keys),
            f"{p.seconds:.0f}",
        ]
        for p in sorted(repair.probes, key=lambda p: p.k)
    ]
    return header, rows


def markdown_lines(report: Report) -> list[str]:
    """The Markdown section (empty when nothing was repaired)."""
    if not report.repairs:
        return []
    out = ["", "## Repair (mixed-precision variants of failed targets)", ""]
    for repair in report.repairs:
        out += [f"- {md(line)}" for line in outcome_lines(repair)]
        header, rows = probe_rows(repair)
        out += ["", "| " + " | ".join(map(md, header)) + " |", "|" + " --- |" * len(header)]
        out += ["| " + " | ".join(map(md, row)) + " |" for row in rows]
        out.append("")
    return out
