"""The betting test every mean floor is decided by (``quantgate.stats.betting``): its level holds for
any distribution on [0, 1], including the ones that broke the bootstrap (a rare mode carrying the
mean, a sample holding no damage at all); it is monotone in every item; a copy never gets an
infinite end; a whole finite population gives the mean itself."""

from __future__ import annotations

import numpy as np
import pytest

from quantgate.stats import betting

pytestmark = pytest.mark.unit

ALPHA = 0.05


def _false_rejections(draw, m: float, n: int, runs: int, population: int | None = None) -> float:
    rng = np.random.default_rng(7)
    hits = sum(
        betting.rejects(draw(rng, n), m, ALPHA, below=True, population=population) for _ in range(runs)
    )
    return hits / runs


@pytest.mark.parametrize("n", [8, 16, 40, 128])
def test_a_rare_mode_carrying_the_whole_mean_is_rejected_no_more_often_than_alpha(n):
    """5 % of items at the top of the range, the rest 0: mean 0.05 exactly. A sample with no item
    at the top (0.95^n of them) is the bootstrap's blind spot; the test must not reject
    "mean >= 0.05" more often than 5 % of the time at any n."""

    def draw(rng, size):
        return (rng.random(size) < 0.05).astype(float)

    rate = _false_rejections(draw, 0.05, n, 4000)
    assert rate <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / 4000)


@pytest.mark.parametrize("shape", ["pareto", "two-point", "uniform"])
def test_the_level_holds_at_the_null_for_other_shapes(shape):
    n, runs = 64, 3000
    tail = np.minimum(np.random.default_rng(0).pareto(1.5, 100_000) + 1, 50.0) / 50.0  # in (0, 1]
    m = float(tail.mean()) if shape == "pareto" else 0.2  # the population's mean exactly

    def draw(rng, size):
        if shape == "pareto":
            return rng.choice(tail, size)
        if shape == "two-point":
            return np.where(rng.random(size) < m, 1.0, 0.0)
        return rng.uniform(0, 2 * m, size)

    assert _false_rejections(draw, m, n, runs) <= ALPHA + 3 * np.sqrt(ALPHA * (1 - ALPHA) / runs)


def test_sampling_without_replacement_holds_its_level_and_a_whole_population_is_exact():
    pop = np.r_[np.ones(5), np.zeros(95)]  # mean 0.05: 5 damaged windows among 100

    def draw(rng, size):
        return rng.permutation(pop)[:size]

    assert _false_rejections(draw, 0.05, 60, 3000, population=100) <= ALPHA + 0.012
    # the whole population seen: the upper end is the mean itself, up to the bets' cap
    whole = np.random.default_rng(1).permutation(np.linspace(0.0, 0.1, 100))
    assert betting.end(whole, ALPHA, upper=True, population=100) < betting.end(whole, ALPHA, upper=True)


def test_the_test_is_monotone_in_every_item():
    """More damage on any item never turns a rejection of "mean >= m" into more of one: over random
    damage paths, the log capital at every item never rises when an item's value rises."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(2, 60))
        z = rng.random(n) * rng.random()
        worse = z.copy()
        j = rng.integers(n)
        worse[j] = min(1.0, worse[j] + rng.random())
        for population in (None, n + int(rng.integers(0, 50))):
            base = betting.log_wealth(z, 0.3, below=True, population=population)[:, 0]
            more = betting.log_wealth(worse, 0.3, below=True, population=population)[:, 0]
            assert np.all(more <= base + 1e-12)
            up_base = betting.log_wealth(z, 0.3, below=False, population=population)[:, 0]
            up_more = betting.log_wealth(worse, 0.3, below=False, population=population)[:, 0]
            assert np.all(up_more >= up_base - 1e-12)


def test_an_exact_copy_has_finite_ends_and_passes_from_the_resolution_on():
    need = betting.items_needed(0.0, 0.1, ALPHA, below=True)
    assert need is not None
    assert not betting.rejects(np.zeros(need - 1), 0.1, ALPHA, below=True)
    assert betting.rejects(np.zeros(need), 0.1, ALPHA, below=True)
    upper = betting.end(np.zeros(need), ALPHA, upper=True)
    assert 0.0 < upper <= 0.1  # never an infinite (or NaN) end for a sample with no spread
    assert betting.end(np.zeros(need), ALPHA, upper=False) == 0.0


def test_the_ends_bracket_the_mean_and_agree_with_the_test():
    z = np.random.default_rng(5).uniform(0.0, 0.2, 200)
    high, low = betting.end(z, ALPHA, upper=True), betting.end(z, ALPHA, upper=False)
    assert low < z.mean() < high
    assert betting.rejects(z, high + 1e-6, ALPHA, below=True)
    assert not betting.rejects(z, high - 1e-6, ALPHA, below=True)
