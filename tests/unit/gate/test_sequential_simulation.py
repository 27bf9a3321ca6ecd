"""Simulated sequential gates: with the true effect at, beyond and within a floor, checked after
every batch and stopped at the first decision, a false pass stays within the tenant's error rate.

numpy only, seconds: per-window KL means from a known distribution (a floor ``max`` 0.05, within the
stated class: no window above 10 tolerances, 0.5), and per-item answer losses (a ``flip_loss_rate``
floor), run many times through ``sequence.decide`` (what ``sequence.check`` runs after every batch).
"""

from __future__ import annotations

import numpy as np
import pytest

from quantgate.declarations.metrics import Metric, Sums, weighted_sums
from quantgate.stats import ItemRange, forms, sequence

pytestmark = pytest.mark.unit

CONFIDENCE = 0.95
RUNS = 400
ITEMS = 128
BATCH = 8

KLD = Metric(False, False, "kl", None, sums=weighted_sums("kld_mean", "tokens", (0.0, np.inf)))
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
    form = forms.floor_form(kind, limit, measure, s_all, ItemRange(), name="m")
    assert not isinstance(form, str), form
    for used in range(BATCH, items + 1, BATCH):
        a = {k: v[:used] for k, v in a_all.items()}
        s = {k: v[:used] for k, v in s_all.items()}
        result = sequence.decide(form, a, s, alpha, ends=False)
        if result.decision != "undecided":
            return result.decision, used
    return "undecided", items


def kld_rates(true_mean: float, seed: int = 0, items: int = ITEMS):
    rng = np.random.default_rng(seed)
    alpha = sequence.early_alpha(CONFIDENCE)
    outcomes = []
    for _ in range(RUNS):
        # skewed per-window KL means with the given true mean, inside the stated class
        k = np.clip(rng.gamma(2.0, true_mean / 2.0, items), 0.0, 0.5)
        a = {"kld_mean": k, "tokens": np.full(items, 511.0)}
        s = {"kld_mean": np.zeros(items), "tokens": np.full(items, 511.0)}
        outcomes.append(run_once("max", 0.05, KLD, a, s, alpha))
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
    """A broken artifact (true KL 0.3 against a floor 0.05) is failed after a few batches of windows
    (the skewed windows above the class's 0.5 fail it at once; the test does within 3 batches)."""
    outcomes = kld_rates(0.3)
    assert all(d == "fail" for d, _ in outcomes)
    assert np.median([used for _, used in outcomes]) <= 24


def test_kl_well_within_the_floor_passes_after_the_class_allows():
    """A sound artifact (true KL 0.005 against 0.05) never fails; it passes early only once about
    log(1/alpha) x 11 windows are in (the class spans 11 tolerances; early looks spend 0.005)."""
    outcomes = kld_rates(0.005, items=256)
    assert not any(d == "fail" for d, _ in outcomes)
    assert all(d == "pass" for d, _ in outcomes)
    assert 64 <= np.median([used for _, used in outcomes]) <= 96


@pytest.mark.parametrize("true_rate", [0.2, 0.25, 0.4])
def test_answer_losses_at_or_beyond_the_floor_rarely_pass(true_rate):
    """Lost answers at a rate at or above the floor's 0.2 pass early in at most 1 - c of runs."""
    outcomes = loss_rates(true_rate)
    assert sum(d == "pass" for d, _ in outcomes) / RUNS <= 1 - CONFIDENCE


def test_answer_losses_below_the_floor_never_fail():
    """No lost answer at all: never failed; a fail needs a loss rate beyond the floor."""
    outcomes = loss_rates(0.0)
    assert not any(d == "fail" for d, _ in outcomes)
