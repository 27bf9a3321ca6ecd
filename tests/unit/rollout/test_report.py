"""The rollout report from a watcher's state: the decision, the KPI delta, the tests' plot."""

from __future__ import annotations

import json

import pytest
from test_decide import POLICY, _run

from quantgate.rollout import write_report

pytestmark = pytest.mark.unit


def test_a_rolled_back_canarys_report_says_why_and_shows_the_regression(tmp_path):
    decision, state = _run(POLICY, slower=1.15, seed=8)
    saved = {"look_state": state.to_dict(), "last": decision.to_dict()}
    status = {"registered_model": "m.hopper-fp8", "tenant": "chat", "shares": {"1": 1.0}}
    paths = write_report(saved, status, tmp_path, 0.05 / 8)
    body = json.loads(paths["json"].read_text())
    assert body["decision"]["action"] == "rollback"
    ttft = body["kpi_delta"]["p99 ttft (s)"]
    assert 0.05 < ttft["delta"] < 0.3  # +15 % simulated, to the buckets' resolution
    assert "p99 ttft fails its floor" in paths["md"].read_text()
    svg = paths["svg"].read_text()
    assert svg.count("<polyline") == 1 + 2 * len(decision.floors)
    assert "<svg" in paths["html"].read_text()
