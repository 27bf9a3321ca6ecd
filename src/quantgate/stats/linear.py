"""A floor as a test of a bounded mean: the per-item values it averages, the stated class they lie
in, and the betting test (``betting``) that decides it, for the fixed and the sequential design alike.

Every floor on a ratio of per-item sums ("the token-weighted mean KL of the windows is at most L",
"perplexity rises at most 5 %", "agreement in the deepest bin is at least 0.97", "at most 1 % of
tokens have a KL above L") reads: the population's sum of (u_i - u_L) w_i is at most 0, where u_i is
an item's value (a window's mean KL; its mean NLL change; its fraction of tokens above L), oriented
so that larger is worse, w_i its weight (tokens), and u_L the floor. That is a mean of per-item
y_i = (u_i - u_L) w_i, which ``betting`` bounds for every distribution whose items lie in a known
range. The range is the floor's **stated class** (``ItemRange``):

- *worse side, an assumption, checked*: no item is worse than the no-change value by more than
  ``worse`` tolerances (the tolerance: how far the floor is from no change). An item beyond it fails
  the floor, since it is damage no mean should hide (a window whose mean KL is ten times what the
  whole corpus may average). Where the quantity has a natural bound nearer (agreement >= 0), that is used.
- *better side, no assumption*: an item better than no change by more than ``better`` tolerances
  counts as that much better. This only makes the sample look worse, so it costs power, never
  validity; it buys the test a narrower range where the quantity has no natural bound (NLL change).
- *weights*: at most the heaviest weight an item can have (``w_max``: the suite's scored tokens per
  window, declared by the evaluation, else the heaviest item evaluated).

Why the class is tied to the tolerance: a test on [0, 1] values needs about log(1/alpha) / gap items
even for a perfect copy, where gap is the floor's distance from no change as a fraction of the range
(``betting``). A range of ``worse + better`` tolerances fixes the gap at 1 / (worse + better) for every
floor, so every floor needs the same number of items, known before anything is evaluated.

numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from quantgate.stats import betting

TOL = 1e-7  # an end in the floor's units: bisection stops within this fraction of the bracket


@dataclass(frozen=True)
class ItemRange:
    """The stated class, in tolerances of the floor: how much worse than no change an item may be
    (assumed and checked), and how much better counts (values beyond count as this: conservative)."""

    worse: float = 10.0
    better: float = 1.0

    def describe(self) -> str:
        """The class in words."""
        return f"no item worse than no change by more than {self.worse:g} tolerances"


@dataclass(frozen=True)
class Caps:
    """The class in the linear form's units (larger is worse): ``good`` <= u <= ``bad``."""

    good: float
    bad: float


@dataclass(frozen=True)
class Linear:
    """One floor's items as a bounded mean (module docstring). ``at(limit)``: the same items tested
    against another limit in the floor's units (the reported ends are found that way); ``bracket``:
    the floor's quantity over the class, in its units, for that search."""

    u: np.ndarray  # per item, larger is worse (evaluation order)
    w: np.ndarray  # per item weight, >= 0
    w_max: float
    limit: float  # u at the floor
    caps: Caps
    population: int | None
    at: Callable[[float], Linear]  # the items against another limit, in the floor's units
    bracket: tuple[float, float]  # the floor's quantity at caps.good and caps.bad (either order)
    what: str  # an item's value, in words ("a window's mean KL divergence")
    to_quantity: Callable[[float], float]  # u -> the floor's quantity (its units)
    limit_free: bool = False  # the items' values do not move with the limit tried (only the hypothesis does)
    to_u: Callable[[float], float] | None = None  # a limit in the floor's units -> u

    @property
    def beyond(self) -> np.ndarray:
        """The items worse than the class allows (each fails the floor)."""
        return np.flatnonzero((self.u > self.caps.bad + 1e-12 * max(1.0, abs(self.caps.bad))) & (self.w > 0))

    def scaled(self) -> tuple[np.ndarray, float]:
        """The items as values in [0, 1] and the floor's place there: the mean of z is at most t0
        exactly when the floor holds (values beyond the class clipped to it)."""
        span = (self.caps.bad - self.caps.good) * self.w_max
        u = np.clip(self.u, self.caps.good, self.caps.bad)
        y = (u - self.limit) * self.w
        lo = (self.caps.good - self.limit) * self.w_max
        z = np.clip((y - lo) / span, 0.0, 1.0)
        return z, float(-lo / span)

    def passes_test(self, alpha: float) -> int | None:
        """After how many items the test rejects "the floor does not hold" (None: it does not)."""
        z, t0 = self.scaled()
        return betting.first_rejection(z, t0, alpha, below=True, population=self.population)

    def fails_test(self, alpha: float) -> int | None:
        """After how many items the test rejects "the floor holds" (None: it does not)."""
        z, t0 = self.scaled()
        return betting.first_rejection(z, t0, alpha, below=False, population=self.population)

    def first_pass(self, alpha: float) -> int | None:
        """When the floor passed: the test, unless an item lies beyond the class (never)."""
        return None if self.beyond.size else self.passes_test(alpha)

    def first_fail(self, alpha: float) -> int | None:
        """When the floor failed: the test, or the first item beyond the class, whichever came first."""
        found = [int(self.beyond[0]) + 1] if self.beyond.size else []
        tested = self.fails_test(alpha)
        return min(found + ([tested] if tested is not None else [])) if found or tested is not None else None

    def ends(self, alpha: float) -> tuple[float, float]:
        """(conservative end, other end) of the floor's quantity, in its units: the limit nearest no
        change at which the test still passes, and the farthest at which it still fails, at level
        ``alpha`` (items beyond the class counted at its edge); infinite where no limit within the
        class does. Bisection over limits (the test is monotone in the limit), to within ``TOL`` of
        the bracket, rounded outwards."""
        return self._end(alpha, passing=True), self._end(alpha, passing=False)

    def _end(self, alpha: float, *, passing: bool) -> float:
        q_good, q_bad = self.bracket
        if self.limit_free and self.to_u is not None and np.all(self.w == self.w_max):
            return self._end_fixed(alpha, passing=passing)

        def decided(q: float) -> bool:
            lin = self.at(q)
            return (lin.passes_test(alpha) if passing else lin.fails_test(alpha)) is not None

        # a pass is easiest at the most lenient limit (the bad cap), a fail at the strictest (no change)
        inside, out = (q_bad, q_good) if passing else (q_good, q_bad)
        if not decided(inside):
            worse = math.copysign(math.inf, q_bad - q_good)
            return worse if passing else -worse
        if decided(out):
            return out
        width = abs(q_bad - q_good)
        while abs(inside - out) > TOL * max(width, 1e-300):
            mid = 0.5 * (inside + out)
            if decided(mid):
                inside = mid
            else:
                out = mid
        return inside

    def _end_fixed(self, alpha: float, *, passing: bool) -> float:
        """``_end`` where the items do not move with the limit and weigh the same: their values in
        [0, 1] are fixed and the limit moves only the hypothesis, so the end is the betting test's own
        end, found once (``betting.end``)."""
        q_good, q_bad = self.bracket
        worse = math.copysign(math.inf, q_bad - q_good)
        z, _ = self.scaled()
        span = self.caps.bad - self.caps.good
        test = (
            (lambda m: betting.rejects(z, m, alpha, below=True, population=self.population))
            if passing
            else (lambda m: betting.rejects(z, m, alpha, below=False, population=self.population))
        )
        if not test(1.0 if passing else 0.0):
            return worse if passing else -worse
        m = betting.end(z, alpha, upper=passing, population=self.population)
        return self.to_quantity(self.caps.good + m * span)


def caps_for(no_change: float, limit: float, natural: tuple[float, float], cls: ItemRange) -> Caps | str:
    """The class's caps for a floor at ``limit`` (u units, larger worse) whose no-change value is
    ``no_change``, within the quantity's ``natural`` range; a string: why there is no class."""
    tol = limit - no_change
    if not tol > 0 or not math.isfinite(tol):
        return "the floor is at or inside the no-change value: no artifact can show it is within"
    good = max(no_change - cls.better * tol, natural[0])
    bad = min(no_change + cls.worse * tol, natural[1])
    if not bad > limit:
        bad = limit + tol * 1e-9  # a natural bound at the floor: nothing can be worse
    return Caps(good, bad)


def with_limit(lin: Linear, u_limit: float) -> Linear:
    """``lin`` against another limit in its own units, the class and items unchanged."""
    return replace(lin, limit=u_limit)
