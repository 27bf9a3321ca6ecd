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
    assert (
        "FAIL (exit 1): a required artifact passed no tenant" in text and "2 of 4 artifacts approved" in text
    )
    row = next(line for line in text.splitlines() if line.startswith("| rocm-cdna3-fp8 |"))
    assert row.count("✅ pass") == 0 and row.count("❌ fail") == 4
    # every end shown says which end it is, and what an unchanged artifact would show
    assert (
        "- `long-chain kld_mean` (max, fail): estimate 0.0234667, upper end 0.0666144, floor 0.05, "
        "margin -0.0166144, an unchanged artifact's end 0.0431151 from no change (tolerance 0.05)"
    ) in text
    assert "- `long-chain agreement_at_depth` (min, fail): estimate 0.961874, lower end 0.929535" in text
    # what each confidence covers: the draw and the class
    assert "## What each confidence covers" in text
    assert (
        "- `wikitext kld_mean max 0.05`: windows drawn at random from 4717; class: an item's kld_mean &lt;= 0.5"
        in text
    )
    assert (
        "- `gsm8k`: 1 item the source solved (known from the source: not run) (flip_loss_rate, accuracy)"
        in text
    )
    assert "| hopper-fp8 | emulated on cpu |" in text
    assert "| hopper-fp8 | 166798261 (166.8 MB) | 61.2% |" in text  # bytes against the source's, SI units


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


@pytest.mark.heavy
def test_write_reports(e1_report, tmp_path):
    paths = write_reports(e1_report, tmp_path / "R")
    assert set(paths) == {"md", "html"}
    assert paths["md"].read_text(encoding="utf-8") == render_markdown(e1_report)
    assert paths["html"].read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    # no temp files left
    assert sorted(p.name for p in (tmp_path / "R").iterdir()) == ["report.html", "report.md"]


@pytest.mark.heavy
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
