"""Exact bounds for rates of events: Clopper-Pearson, one-sided ends at the tenant's confidence.

Why exact: a rate of events among eligible items (answers lost among those the source solved,
wrong answers, flips) is a binomial count when the items are independent draws, and the
Clopper-Pearson bound holds its level at every n with no other assumption; the bound at zero
events, 1 - alpha^(1/m), is also the smallest rate m items can tell from none. Means of bounded
per-item values (KL, agreement, perplexity changes, a quantile's exceedance) are decided by the
betting test instead (``betting``, ``linear``, ``forms``), which needs no shape either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """Both one-sided ends at the same level: ``low`` (a lower bound) and ``high`` (an upper bound).

    ``items``: the items the bound rests on (for a mean, those with a weight: the traces that reach
    the deepest bin, say); ``method``: how, in words.
    """

    estimate: float
    low: float
    high: float
    items: int
    method: str

    def end(self, upper: bool) -> float:
        """The conservative end for a lower-is-better quantity (``upper``), else the lower end."""
        return self.high if upper else self.low

    def other(self, upper: bool) -> float:
        """The end opposite ``end(upper)``: beyond the floor, it establishes a violation."""
        return self.low if upper else self.high


def proportion(events: int, trials: int, alpha: float) -> Interval:
    """Clopper-Pearson one-sided ends for a rate of ``events`` among ``trials`` (exact at every n).

    No trial: the rate is unknown (0 to 1).
    """
    from scipy.stats import beta  # scipy.stats costs half a second: only where a bound is computed

    if trials <= 0:
        return Interval(math.nan, 0.0, 1.0, 0, "no eligible item")
    k, m = int(events), int(trials)
    low = 0.0 if k == 0 else float(beta.ppf(alpha, k, m - k + 1))
    high = 1.0 if k == m else float(beta.ppf(1.0 - alpha, k + 1, m - k))
    return Interval(k / m, low, high, m, f"exact (Clopper-Pearson) over {m} items")


def zero_event_bound(trials: int, alpha: float) -> float:
    """The Clopper-Pearson upper bound with no event among ``trials``: 1 - alpha^(1/trials) (1 with none).

    Also the smallest true rate that shows at least one event with probability 1 - alpha: what
    ``trials`` items can tell from no change at all.
    """
    return 1.0 if trials <= 0 else 1.0 - alpha ** (1.0 / trials)
