"""The report says, per repaired target, what was tried, what was chosen and why the search stopped."""

from __future__ import annotations

import pytest

from quantgate.contracts.report_schema import ProbeRecord, Report, TargetRepair, TenantRepair
from quantgate.report import render_html, render_markdown

pytestmark = pytest.mark.unit


def _report() -> Report:
    repair = TargetRepair(
        target="blackwell-nvfp4",
        upgrade="FP8",
        units=120,
        uniform_bytes=120_000_000,
        parent_build_key="k" * 64,
        sensitivity_seconds=300.0,
        sensitivity_cached=False,
        kld_uniform=0.34,
        ranked=[
            "model.layers.0.mlp.down_proj",
            "model.layers.29.mlp.down_proj",
            "model.layers.1.mlp.down_proj",
        ],
        budget=6,
        probes=[
            ProbeRecord(
                k=120,
                bytes=167_000_000,
                passed=["batch"],
                quality={"wikitext.kld_mean": 0.01},
                seconds=90,
                path="a",
            ),
            ProbeRecord(
                k=60,
                bytes=143_000_000,
                passed=["batch"],
                quality={"wikitext.kld_mean": 0.06},
                seconds=95,
                path="b",
            ),
            ProbeRecord(
                k=30, bytes=131_000_000, passed=[], quality={"wikitext.kld_mean": 0.15}, seconds=91, path="c"
            ),
        ],
        tenants=[
            TenantRepair(
                tenant="batch", k=60, stopped="bracket closed: k=60 passes, k=30 fails", variant="b"
            ),
            TenantRepair(
                tenant="reasoning",
                k=None,
                stopped="no variant passes: even with all 120 layer groups kept it fails",
            ),
        ],
        seconds=600.0,
    )
    return Report(model="m", approvals={"blackwell-nvfp4": []}, exit_code=0, repairs=[repair])


def test_markdown_names_the_chosen_variant_the_failed_search_and_every_probe():
    text = render_markdown(_report())
    assert "## Repair (mixed-precision variants of failed targets)" in text
    assert (
        "blackwell-nvfp4 × batch: k=60 of 120 layer groups kept at FP8, 143.0 MB against 120.0 MB uniform"
        in text
    )
    assert (
        "blackwell-nvfp4 × reasoning: no variant (no variant passes: even with all 120 layer groups kept it fails); nothing published for it"
        in text
    )
    assert "search: 3 builds and evaluations of a budget of 6, sensitivity 300 s" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 30 |", "| 60 |"))]
    assert rows == ["| 30 | 131.0 MB | none | 0.15 | 91 |", "| 60 | 143.0 MB | batch | 0.06 | 95 |"]


def test_html_carries_the_frontier_plot():
    html = render_html(_report())
    assert (
        'alt="bytes against quality of every variant of blackwell-nvfp4" src="data:image/png;base64,' in html
    )
    assert render_html(_report()) == html  # same report, same bytes


def test_no_repair_no_section():
    report = _report().model_copy(update={"repairs": []})
    assert "Repair" not in render_markdown(report)
    assert 'id="repair"' not in render_html(report)
