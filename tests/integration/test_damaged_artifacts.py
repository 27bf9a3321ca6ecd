"""Deliberately damaged copies of the default model's FP8 artifact fail every tenant, on evidence.

Each copy is internally consistent (its manifest rewritten over the damaged bytes), so only the
evaluation can catch it: noisy weights, perturbed weight scales, one destroyed layer, and KV-cache
scales that clip keys and values. Evaluated on the text suites (wikitext and traffic: every tenant
of an FP8 target has a floor on one of them; the other suites are left out for time, so their
floors are "missing"), each must fail every tenant with a measured floor among the reasons,
never only for lack of data.
"""

from __future__ import annotations

import json

import pytest

from support.damage import DAMAGES, damaged_copy

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def damaged_report(default_model, default_artifacts, tmp_path_factory, run_cli) -> dict:
    built, _ = default_artifacts
    artifacts = tmp_path_factory.mktemp("damaged")
    for kind, damage in DAMAGES.items():
        damaged_copy(built / "hopper-fp8", artifacts / f"hopper-fp8-{kind}", damage)
    out = tmp_path_factory.mktemp("damaged-eval")
    args = ["--checkpoint", str(default_model), "--artifacts", str(artifacts), "--out", str(out)]
    evaluated = run_cli("eval", *args, "--suites", "wikitext,traffic")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = tmp_path_factory.mktemp("damaged-report")
    gated = run_cli("gate", "--results", str(out), "--out", str(report), "--model-class", "dense-reasoner")
    assert gated.returncode in (0, 1), gated.stderr[-3000:]
    return json.loads((report / "report.json").read_text())


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_a_damaged_artifact_fails_every_tenant_on_a_measured_floor(damaged_report, kind):
    verdicts = [v for v in damaged_report["verdicts"] if v["artifact"] == f"hopper-fp8-{kind}"]
    assert {v["tenant"] for v in verdicts} == {"chat", "reasoning", "batch", "support"}
    for v in verdicts:
        assert v["verdict"] == "fail", v
        measured = [f for f in v["floors"] if f["status"] == "fail"]
        assert measured, f"{kind} fails {v['tenant']} only for lack of data: {v['reasons']}"
    assert not damaged_report["approvals"].get(f"hopper-fp8-{kind}")
