"""Simulated sequential gates: with the true effect at, beyond and within a floor, checked after
every batch and stopped at the first decision, a false pass stays within the tenant's error rate.

numpy only, seconds: per-window KL means from a known distribution (a floor ``max`` 0.05, the
declared range [0, 1]), and per-item answer losses (a ``flip_loss_rate`` floor), run many times.
"""

from __future__ import annotations

import numpy as np
import pytest

from quantgate.metrics import Metric, Sums, weighted_sums
from quantgate.stats import sequence

pytestmark = pytest.mark.unit

CONFIDENCE = 0.95
RUNS = 400
ITEMS = 128
BATCH = 8

KLD = Metric(False, False, "kl", None, sums=weighted_sums("kld_mean", "tokens", (0.0, 1.0)))
LOSS = Metric(
    False,
    False,
    "loss rate",
    None,
    sums=Sums(
        lambda a, s: ((s["correct"] > 0) & (a["correct"] == 0)).astype(float),
        lambda a, s: (s["correct"] > 0).astype(float),
        (0.0, 1.0),
    ),
)


def run_once(kind, limit, measure, a_all, s_all, alpha):
    """Check after every batch, stop at the first decision; the decision (or 'undecided') and items used."""
    items = len(next(iter(a_all.values())))
    for used in range(BATCH, items + 1, BATCH):
        a = {k: v[:used] for k, v in a_all.items()}
        s = {k: v[:used] for k, v in s_all.items()}
        lin = sequence.linearize(kind, limit, measure, a, s, s_all)
        assert not isinstance(lin, str), lin
        result = sequence.decide(lin, alpha, ends=False)
        if result.decision != "undecided":
            return result.decision, used
    return "undecided", items


def kld_rates(true_mean: float, seed: int = 0, items: int = ITEMS):
    rng = np.random.default_rng(seed)
    alpha = sequence.early_alpha(CONFIDENCE)
    outcomes = []
    for _ in range(RUNS):
        # skewed per-window KL means with the given true mean, inside the declared range
        k = np.clip(rng.gamma(2.0, true_mean / 2.0, items), 0.0, 1.0)
        a = {"kld_mean": k, "tokens": np.full(items, 511.0)}
        outcomes.append(run_once("max", 0.05, KLD, a, dict(a), alpha))
    return outcomes


def loss_rates(true_rate: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    alpha = sequence.early_alpha(CONFIDENCE)
    outcomes = []
    for _ in range(RUNS):
        solved = (rng.random(ITEMS) < 0.7).astype(float)
        lost = rng.random(ITEMS) < true_rate
        a = {"correct": np.where(lost, 0.0, solved)}
        s = {"correct": solved}
        outcomes.append(run_once("max", 0.2, LOSS, a, s, alpha))
    return outcomes


@pytest.mark.parametrize("true_mean", [0.05, 0.06, 0.1])
def test_kl_at_or_beyond_the_floor_passes_within_the_error_rate(true_mean):
    """An artifact whose true KL mean is at or above the floor passes early in at most 1 - c of runs
    (the early share of it, in fact: the rest is the fixed design's when items run out)."""
    outcomes = kld_rates(true_mean)
    false_pass = sum(d == "pass" for d, _ in outcomes) / RUNS
    assert false_pass <= sequence.early_alpha(CONFIDENCE) + 0.01
    assert false_pass <= 1 - CONFIDENCE


def test_kl_far_beyond_the_floor_fails_early():
    """A broken artifact (true KL 0.3 against a floor 0.05) is failed after a few windows."""
    outcomes = kld_rates(0.3)
    assert all(d == "fail" for d, _ in outcomes)
    assert np.median([used for _, used in outcomes]) <= 16


def test_kl_well_within_the_floor_passes_after_the_range_allows():
    """A sound artifact (true KL 0.005 against 0.05) never fails; it passes early only once about
    log(1/alpha) / 0.05 windows are in (the price of a declared range of 1 nat): after about 128
    windows, all of the full profile's wikitext (where the fixed design decides it at the end)."""
    outcomes = kld_rates(0.005, items=256)
    assert not any(d == "fail" for d, _ in outcomes)
    assert all(d == "pass" for d, _ in outcomes)
    assert 112 <= np.median([used for _, used in outcomes]) <= 144


@pytest.mark.parametrize("true_rate", [0.2, 0.25, 0.4])
def test_answer_losses_at_or_beyond_the_floor_rarely_pass(true_rate):
    """Lost answers at a rate at or above the floor's 0.2 pass early in at most 1 - c of runs."""
    outcomes = loss_rates(true_rate)
    assert sum(d == "pass" for d, _ in outcomes) / RUNS <= 1 - CONFIDENCE


def test_answer_losses_below_the_floor_never_fail():
    """No lost answer at all: never failed; a fail needs a loss rate beyond the floor."""
    outcomes = loss_rates(0.0)
    assert not any(d == "fail" for d, _ in outcomes)
