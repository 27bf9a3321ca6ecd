"""The gate's error rates, measured (issues 24 and 43): a reduced grid of bench/gate/gate_calibration.py in CI.

For every floor kind and a family of damage shapes each (rare modes, correlated windows drawn at
random, heavy tails, uneven windows, weights going with disagreement; all within the stated class),
an artifact whose true value sits exactly at its floor is simulated and decided by the gate's own
code under both designs, end to end: the sequential design's early looks and its final test together.
The false-pass rate must stay within 1 - c plus its Monte-Carlo error; an identical copy must pass
where the items can show it. The full grid and its figures are in BENCHMARKS.md ("Gate calibration
on families"). Fixed seeds: the same figures every run.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.unit, pytest.mark.slow]

RUNS = 300
BENCH = Path(__file__).resolve().parents[3] / "bench" / "gate" / "gate_calibration.py"
_spec = importlib.util.spec_from_file_location("gate_calibration", BENCH)
assert _spec is not None and _spec.loader is not None
calibration = importlib.util.module_from_spec(_spec)
sys.modules["gate_calibration"] = calibration
_spec.loader.exec_module(calibration)

CELLS = [
    ("kld_mean", "rare20/50", 64),
    ("kld_mean", "ar0.9-new@class", 128),
    ("kld_mean", "pareto1.5@class", 128),
    ("top1_agreement", "rare5/90", 64),
    ("perplexity", "lognormal1.5@class", 128),
    ("kld_p99", "uneven@class", 128),
    ("kld_regression", "gamma2", 64),
    ("agreement_at_depth", "depthcorr@class", 128),
    ("acceptance", "lognormal1", 64),
    ("loss_rate", "0/1@0.25", 64),
    ("recovery", "0/1@0.05", 64),
]


@pytest.mark.parametrize("design", ["fixed", "sequential"])
@pytest.mark.parametrize(("kind", "family", "n"), CELLS)
def test_an_artifact_at_its_floor_passes_within_the_stated_error_rate(kind, family, n, design):
    row = calibration.run_cell((calibration.Cell(kind, family, n, "floor", design), "new", RUNS, None))
    assert row["in_class"], row
    allowed = (1 - calibration.CONFIDENCE) + 2.5 * math.sqrt(0.05 * 0.95 / RUNS)
    assert row["pass"] <= allowed, row


@pytest.mark.parametrize("kind", ["kld_mean", "top1_agreement", "perplexity", "kld_p99"])
def test_an_identical_copy_passes_where_the_items_can_show_it(kind):
    row = calibration.run_cell((calibration.Cell(kind, "copy", 64, "copy", "fixed"), "new", 50, None))
    assert row["fail"] == 0.0 and row["pass"] == 1.0, row


def test_looking_after_every_batch_is_the_first_rejection_rounded_up_to_a_look():
    """The bench decides the sequential design from one pass over a draw (``looked``); it is what
    ``sequence.decide`` gives when called after every batch."""
    from quantgate.config.gates import Floor
    from quantgate.stats import ItemRange, forms, sequence

    rng = np.random.default_rng(4)
    suite = calibration._suites()["wikitext"]
    measure = suite.metrics()["kld_mean"]
    floor = Floor(suite="wikitext", metric="kld_mean", max=0.05)
    for mean in (0.01, 0.04, 0.05, 0.2):
        for _ in range(10):
            n = 96
            a = {"kld_mean": rng.gamma(2.0, mean / 2, n), "tokens": np.full(n, 63.0)}
            s = {"kld_mean": np.zeros(n), "tokens": np.full(n, 63.0)}
            form = forms.floor_form("max", 0.05, measure, s, ItemRange(), name=floor.metric)
            alpha = sequence.early_alpha(0.95)
            by_look = None
            for used in range(8, n + 1, 8):
                got = sequence.decide(
                    form,
                    {k: v[:used] for k, v in a.items()},
                    {k: v[:used] for k, v in s.items()},
                    alpha,
                    ends=False,
                )
                if got.decision != "undecided":
                    by_look = got.decision
                    break
            assert calibration.looked(form.linear(a, s), alpha, 8) == by_look
