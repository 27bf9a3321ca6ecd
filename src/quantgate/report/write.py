"""``write_reports``: report.md and report.html next to report.json, each written atomically."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantgate.contracts.report_schema import Report, as_report
from quantgate.report.html import render_html
from quantgate.report.markdown import render_markdown
from quantgate.runtime.atomic import write_text


def write_reports(report: Report | Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Render both formats first, then write ``out_dir/report.md`` and ``out_dir/report.html``."""
    report = as_report(report)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {"md": render_markdown(report), "html": render_html(report)}
    paths = {kind: out_dir / f"report.{kind}" for kind in texts}
    for kind, text in texts.items():
        write_text(paths[kind], text)
    return paths
