"""The Markdown report of the e1 evaluation, against a golden file.

Regenerate the golden after an intended change, then review its diff:
    UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/report/test_report_markdown.py -k golden
(Creating the golden from scratch trips the session guard against new files in the repo; updating it does not.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantgate.report import render_markdown, write_reports

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden" / "report.md"


def test_markdown_golden(e1_report):
    text = render_markdown(e1_report)
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8"), (
        "report.md changed: UPDATE_GOLDEN=1 and review the diff"
    )


def test_markdown_content(e1_report):
    text = render_markdown(e1_report)
    assert "PASS (exit 0)" in text and "3 of 4 artifacts approved" in text
    row = next(line for line in text.splitlines() if line.startswith("| rocm-cdna3-fp8 |"))
    assert row.count("✅ pass") == 1 and row.count("❌ fail") == 3
    assert (
        "- `long-chain agreement_at_depth` (min, fail): estimate 0.978873, bound 0.95742, floor 0.97, "
        "margin -0.0125798, MDE 0 (tolerance 0.03)"
    ) in text
    assert "- `gsm8k`: 1 item the source solved (flip_loss_rate, accuracy)" in text
    assert "| hopper-fp8 | emulated on cpu |" in text
    assert "| hopper-fp8 | 166798310 (166.8 MB) | 61.2% |" in text  # bytes against the source's, SI units


def test_markdown_sizes_and_hostile_text(e1_report):
    e1_report["sizes"] = {"source": 269060552, "hopper-fp8": 162000000}
    e1_report["verdicts"][0]["tenant"] = "a|b<script>alert(1)</script>"
    text = render_markdown(e1_report)
    assert "| hopper-fp8 | 162000000 (162.0 MB) | 60.2% |" in text  # SI units, as everywhere in quantgate
    assert "<script>" not in text and "a\\|b&lt;script&gt;" in text


def test_markdown_failing_run(e1_report):
    e1_report["exit_code"] = 1
    e1_report["notes"] = ["required artifacts passing no tenant: rocm-cdna3-fp8"]
    text = render_markdown(e1_report)
    assert "FAIL (exit 1)" in text and "> required artifacts passing no tenant: rocm-cdna3-fp8" in text


def test_write_reports(e1_report, tmp_path):
    paths = write_reports(e1_report, tmp_path / "R")
    assert set(paths) == {"md", "html"}
    assert paths["md"].read_text(encoding="utf-8") == render_markdown(e1_report)
    assert paths["html"].read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    # no temp files left
    assert sorted(p.name for p in (tmp_path / "R").iterdir()) == ["report.html", "report.md"]


def test_deltas_against_the_previous_approved_version(e1_report):
    report = e1_report
    import copy

    from quantgate.report import render_html

    previous = copy.deepcopy(report)
    previous["metrics"]["hopper-fp8"]["wikitext"]["kld_mean"] = 0.01
    current = {
        **report,
        "previous": {
            "source_hash": "f" * 64,
            "approvals": previous["approvals"],
            "metrics": previous["metrics"],
        },
    }
    text = render_markdown(current)
    assert "## Against the previous approved version (ffffffffffff)" in text
    now = report["metrics"]["hopper-fp8"]["wikitext"]["kld_mean"]
    line = next(l for l in text.splitlines() if l.startswith("| hopper-fp8 | wikitext.kld_mean |"))
    assert "0.01" in line and f"{now - 0.01:+.6g}" in line
    # artifacts the previous version did not approve have nothing to compare against
    assert not any(
        l.startswith("| blackwell-nvfp4 |") for l in text.split("previous approved version")[1].splitlines()
    )
    assert 'id="previous"' in render_html(current)
    assert "previous approved version" not in render_markdown(report)
