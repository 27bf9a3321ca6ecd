"""A report.json dict gated from the trimmed real evaluation in tests/unit/gate/fixtures/e1."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from quantgate.gate.run import gate_results

E1 = Path(__file__).resolve().parents[1] / "gate" / "fixtures" / "e1"


@pytest.fixture(scope="session")
def _e1_report(repo_root) -> dict:
    decision = gate_results(
        E1, repo_root / "gates.yaml", repo_root, model_class="dense-reasoner", model="SmolLM2-135M-Instruct"
    )
    return json.loads(json.dumps(decision.payload()))  # exactly what report.json holds


@pytest.fixture
def e1_report(_e1_report) -> dict:
    """A fresh copy per test, so a test may change it freely."""
    return copy.deepcopy(_e1_report)
