"""``quantgate report``: report.md and report.html rendered again from a gate's report.json."""

from __future__ import annotations

from pathlib import Path

from quantgate.cli.options import ReportDirOpt
from quantgate.runtime.escape import visible


def report(report_dir: ReportDirOpt) -> None:
    """Render report.md and report.html again from report.json (e.g. after a template change)."""
    for path in render_reports(report_dir / "report.json"):
        print(f"report: {visible(path)}")


def render_reports(report_json: Path) -> list[Path]:
    """report.md and report.html beside report.json (``gate`` writes them this way too)."""
    from quantgate.contracts.report_schema import read_report
    from quantgate.report import write_reports

    report = read_report(report_json, fix="run quantgate gate --out DIR first")
    return list(write_reports(report, report_json.parent).values())
