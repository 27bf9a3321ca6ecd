"""One test for every bounded mean the gate decides: a mixture of constant bets (testing by betting).

Why: a floor is a promise ("at confidence c, the artifact meets it") for a stated class of
populations, not for the shapes a method was tuned on. The bootstrap-t bound the gate used before
saw only what its sample held: when 5 % of windows carried 90 % of the damage it passed 44 % of
such artifacts at 16 windows, and its tail correction was a constant fitted to the grid that then
reported its level (BENCHMARKS.md, "Verdicts that hold for any damage shape"). A test by betting
needs no shape: for values in [0, 1] whose mean is m, a gambler who stakes a fraction of his
capital on "the next value is below m" (capital times 1 + lambda (m - z)) plays a fair or losing
game, so his capital is a nonnegative supermartingale, and by Ville's inequality it ever reaches
1 / alpha with probability at most alpha (Waudby-Smith & Ramdas 2023, "Estimating means of bounded
random variables by betting", JRSS-B). Valid for every distribution on [0, 1], at every sample
size, and at every look: the fixed design reads it once, the sequential design after every batch.

Choices, each for a property the gate needs:

- **Constant bets, mixed.** Each bet fraction in ``BETS`` is held for every item and the capitals
  are averaged with prior weights ``WEIGHTS`` (an average of supermartingales is one). A constant
  bet makes every capital a product of factors each non-increasing in its own item's value, so the
  decision is **monotone in damage by construction**: more damage on any item never turns a fail
  into a pass. (The predictable plug-in bets of the paper adapt to the spread seen so far, which
  can make a more damaged sample pass where a less damaged one failed.) The weights halve from the
  largest bet: most floors are decided by items far from their floor, where the largest bet is the
  best one; a spread-out sample is served by the smaller ones at the price of their weight.
- **A finite population, drawn without replacement** (``population``: windows cut from a corpus,
  drawn at random): under "the mean is m", the next item's expected value given the items seen is
  (N m - their sum) / (N - items seen) (the paper's section 6), so the test bets against that.
- **Running maximum** (Ville): a capital that reached 1 / alpha at any item rejects, so the fixed
  and the sequential designs are one test read at different times.

numpy only.
"""

from __future__ import annotations

import math

import numpy as np

# bet fractions held constant over items (at most 1: every factor 1 + lambda (m - z) stays >= 0 for z in [0, 1])
BETS = np.array([0.95, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625])
WEIGHTS = 0.5 ** np.arange(1, len(BETS) + 1)
WEIGHTS = WEIGHTS / WEIGHTS.sum()
_LOG_WEIGHTS = np.log(WEIGHTS)
TOL = 1e-7  # an interval end to within this, in [0, 1], rounded outwards


def _null_means(z: np.ndarray, m: np.ndarray, population: int | None) -> np.ndarray:
    """(items, len(m)): the mean each next item has under "the mean is m", given the items before it."""
    if population is None:
        return np.broadcast_to(m[None, :], (len(z), len(m)))
    n = len(z)
    if population < n:
        raise ValueError(f"a sample of {n} items from a population of {population}")
    seen = np.concatenate([[0.0], np.cumsum(z)[:-1]])
    left = population - np.arange(n, dtype=float)
    return np.clip((population * m[None, :] - seen[:, None]) / left[:, None], 0.0, 1.0)


def log_wealth(
    z: np.ndarray, m: np.ndarray | float, *, below: bool, population: int | None = None
) -> np.ndarray:
    """The mixture's log capital after each item, (items, len(m)), betting against "the mean is at
    least m" (``below``: the evidence is values below m) or "at most m" (values above)."""
    z = np.clip(np.asarray(z, dtype=float), 0.0, 1.0)
    m = np.atleast_1d(np.asarray(m, dtype=float))
    if len(z) == 0:
        return np.zeros((0, len(m)))
    means = _null_means(z, m, population)
    step = (means - z[:, None]) if below else (z[:, None] - means)
    logs = np.cumsum(np.log1p(BETS[None, None, :] * step[:, :, None]), axis=0) + _LOG_WEIGHTS
    top = logs.max(axis=2, keepdims=True)
    return (top + np.log(np.sum(np.exp(logs - top), axis=2, keepdims=True)))[:, :, 0]


def first_rejection(
    z: np.ndarray, m: float, alpha: float, *, below: bool, population: int | None = None
) -> int | None:
    """After how many items "the mean is at least m" (``below``) or "at most m" is rejected at
    level ``alpha``; None: not rejected by the last item."""
    hit = log_wealth(z, m, below=below, population=population)[:, 0] >= math.log(1.0 / alpha)
    return int(np.argmax(hit)) + 1 if hit.any() else None


def rejects(z: np.ndarray, m: float, alpha: float, *, below: bool, population: int | None = None) -> bool:
    """Whether the hypothesis is rejected at some item (``first_rejection`` is not None)."""
    return first_rejection(z, m, alpha, below=below, population=population) is not None


def end(z: np.ndarray, alpha: float, *, upper: bool, population: int | None = None) -> float:
    """One end of the confidence interval for the mean of ``z`` (values in [0, 1]): ``upper``, the
    smallest m whose "mean at least m" is rejected (1 when none is), else the largest m whose "mean
    at most m" is (0 when none is). Rejection is monotone in m, so bisection finds it exactly."""
    z = np.clip(np.asarray(z, dtype=float), 0.0, 1.0)
    edge, inside = (1.0, 0.0) if upper else (0.0, 1.0)
    if len(z) == 0 or not rejects(z, edge, alpha, below=upper, population=population):
        return edge
    if rejects(z, inside, alpha, below=upper, population=population):
        return inside
    out = edge
    while abs(out - inside) > TOL:
        mid = 0.5 * (out + inside)
        if rejects(z, mid, alpha, below=upper, population=population):
            out = mid
        else:
            inside = mid
    return out


def items_needed(z: float, m: float, alpha: float, *, below: bool) -> int | None:
    """The fewest items, every one of value ``z``, that reject "the mean is at least m" (``below``)
    or "at most m" at level ``alpha``: the resolution of the test for an artifact like that (an
    unchanged one: z at no change). None: no number of such items does."""
    step = (m - z) if below else (z - m)
    if not step > 0:
        return None
    per_item = np.log1p(BETS * step)  # the log capital each item adds, per bet
    threshold = math.log(1.0 / alpha)
    # one bet alone reaches the threshold by its own count; the mixture, at most that soon
    most = int(np.min(np.ceil((threshold - _LOG_WEIGHTS) / per_item)))
    n = np.arange(1, most + 1, dtype=float)[:, None]
    logs = n * per_item[None, :] + _LOG_WEIGHTS[None, :]
    top = logs.max(axis=1)
    total = top + np.log(np.sum(np.exp(logs - top[:, None]), axis=1))
    return int(np.flatnonzero(total >= threshold - 1e-12)[0]) + 1
