"""The gate's error rates, measured (issue 24): a reduced grid of bench/gate_calibration.py in CI.

For every floor kind, an artifact whose true value sits exactly at its floor (n = 16 items, skewed and
heavy-tailed per-item values, or 0/1 answers at a floor rate) is simulated and decided by the gate's
own code under both designs, end to end: the sequential design's early looks and its final bound
together. The false-pass rate must stay within 1 - c plus its Monte-Carlo error; the full grid and
its figures are in BENCHMARKS.md ("Gate calibration"). Fixed seeds: the same figures every run.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.unit, pytest.mark.slow]

RUNS = 300
BENCH = Path(__file__).resolve().parents[3] / "bench" / "gate_calibration.py"
_spec = importlib.util.spec_from_file_location("gate_calibration", BENCH)
assert _spec is not None and _spec.loader is not None
calibration = importlib.util.module_from_spec(_spec)
sys.modules["gate_calibration"] = calibration
_spec.loader.exec_module(calibration)

CELLS = [
    (kind, shape)
    for kind, (_, _, shapes) in calibration.KINDS.items()
    for shape in shapes
    if shape in ("skewed", "heavy", "0/1@0.05", "0/1@0.25")
]


@pytest.mark.parametrize("design", ["fixed", "sequential"])
@pytest.mark.parametrize(("kind", "shape"), CELLS)
def test_an_artifact_at_its_floor_passes_within_the_stated_error_rate(kind, shape, design):
    row = calibration.run_cell((calibration.Cell(kind, shape, 16, "floor", design), "new", RUNS, None))
    allowed = (1 - calibration.CONFIDENCE) + math.sqrt(0.05 * 0.95 / RUNS)
    assert row["pass"] <= allowed, row
