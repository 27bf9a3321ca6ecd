"""The gate's test by betting (``quantgate.stats.betting``), kept as state between looks.

A canary is looked at whenever the watcher runs, on evidence that only grows. The gate's mixture
of constant bets fits this exactly: each bet's log capital is a sum over items, so a look adds the
new items' terms to the capital the previous look left (stored between looks, ``Wealth``), and the
capital of a bet on 0/1 items depends only on how many were 1 (``add_counts``: a histogram's
exceedances, a version's errors, need no per-request data). The mixture's capital is a nonnegative
supermartingale under the null, whatever the look times (Ville), so a test that reached
``1/alpha`` at any look rejects for good (``rejected`` is sticky).

The null's mean ``m`` may change between looks when it is set from the stable version's data (its
own confidence sequence): the canary's items are independent of it, so each look's bet is still
fair given everything before, on the event that stable's sequence covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from quantgate.stats import betting

BETS = betting.BETS
LOG_WEIGHTS = np.log(betting.WEIGHTS)


@dataclass
class Wealth:
    """One one-sided test: per-bet log capitals, items seen, and whether it ever rejected."""

    below: bool  # evidence against "mean >= m" is items below m; else against "mean <= m"
    log_capital: list[float] = field(default_factory=lambda: [0.0] * len(BETS))
    items: int = 0
    rejected: bool = False

    def log_mixture(self) -> float:
        """The mixture's log capital (weights as the gate's)."""
        logs = np.asarray(self.log_capital) + LOG_WEIGHTS
        top = float(logs.max())
        return top + math.log(float(np.sum(np.exp(logs - top))))

    def _step(self, z: np.ndarray | float, m: float) -> np.ndarray:
        m = min(max(m, 0.0), 1.0)
        return (m - np.asarray(z, dtype=float)) if self.below else (np.asarray(z, dtype=float) - m)

    def add_values(self, z: np.ndarray, m: float) -> None:
        """New items with values in [0, 1] (clipped), null mean ``m``."""
        z = np.clip(np.asarray(z, dtype=float), 0.0, 1.0)
        if len(z) == 0:
            return
        terms = np.log1p(BETS[None, :] * self._step(z, m)[:, None]).sum(axis=0)
        self.log_capital = list(np.asarray(self.log_capital) + terms)
        self.items += len(z)

    def add_counts(self, ones: int, items: int, m: float) -> None:
        """``items`` new 0/1 items of which ``ones`` are 1, null mean ``m``."""
        if items <= 0:
            return
        if not 0 <= ones <= items:
            raise ValueError(f"{ones} events among {items} items")
        terms = ones * np.log1p(BETS * self._step(1.0, m)) + (items - ones) * np.log1p(
            BETS * self._step(0.0, m)
        )
        self.log_capital = list(np.asarray(self.log_capital) + terms)
        self.items += items

    def check(self, alpha: float) -> bool:
        """Whether the null is rejected at ``alpha`` now or was at an earlier look."""
        self.rejected = self.rejected or self.log_mixture() >= math.log(1.0 / alpha)
        return self.rejected

    def to_dict(self) -> dict:
        """JSON form (the watcher's state)."""
        return {
            "below": self.below,
            "log_capital": [float(x) for x in self.log_capital],
            "items": self.items,
            "rejected": self.rejected,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Wealth:
        """Back from ``to_dict``."""
        return cls(
            bool(d["below"]), [float(x) for x in d["log_capital"]], int(d["items"]), bool(d["rejected"])
        )


def count_log_mixture(ones: int, items: int, m: float, *, below: bool) -> float:
    """The mixture's log capital of ``items`` 0/1 items with ``ones`` ones against mean ``m``."""
    w = Wealth(below)
    w.add_counts(ones, items, m)
    return w.log_mixture()


def rate_bound(ones: int, items: int, alpha: float, *, upper: bool) -> float:
    """An anytime-valid bound on a rate from counts (the betting confidence sequence read at this
    time): ``upper``, the smallest m whose "rate >= m" is rejected; else the largest m whose
    "rate <= m" is. Rejection is monotone in m, so bisection finds it."""
    edge, inside = (1.0, 0.0) if upper else (0.0, 1.0)
    threshold = math.log(1.0 / alpha)
    if items == 0 or count_log_mixture(ones, items, edge, below=upper) < threshold:
        return edge
    if count_log_mixture(ones, items, inside, below=upper) >= threshold:
        return inside
    out = edge
    while abs(out - inside) > 1e-7:
        mid = 0.5 * (out + inside)
        if count_log_mixture(ones, items, mid, below=upper) >= threshold:
            out = mid
        else:
            inside = mid
    return out
