"""Reports for people: report.json (written by the gate) -> report.md and report.html.

- ``view.py``: the facts both formats show, derived from the typed report
  (``quantgate.contracts.report_schema.Report``) in one place, so the two cannot disagree on a fact.
- ``markdown.py``: ``render_markdown`` for CI summaries and PR comments.
- ``html.py`` + ``plots.py``: ``render_html``, one self-contained file (inline CSS, inline
  base64 PNGs from matplotlib/Agg, no JS), byte-for-byte deterministic.
- ``write.py``: ``write_reports`` writes both atomically.
- ``console.py``: the verdict table ``quantgate gate`` and ``quantgate run`` print.

Each takes a ``Report`` or report.json's object (validated on the way in). Optional fields are
shown when present: ``sizes``, ``serving``, ``previous`` and ``metrics`` (the long-chain
per-position bins, recovery per suite).
"""

from typing import TYPE_CHECKING

from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.report.console import print_table, text_table, verdict_table
    from quantgate.report.html import render_html
    from quantgate.report.markdown import render_markdown
    from quantgate.report.write import write_reports

__all__ = [
    "print_table",
    "render_html",
    "render_markdown",
    "text_table",
    "verdict_table",
    "write_reports",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "print_table": "console",
        "text_table": "console",
        "verdict_table": "console",
        # matplotlib (the HTML report's plots) only where a report is written: a build or an
        # evaluation prints a table, and a fresh worker built matplotlib's font cache for it (17 s)
        "render_html": "html",
        "render_markdown": "markdown",
        "write_reports": "write",
    },
)
