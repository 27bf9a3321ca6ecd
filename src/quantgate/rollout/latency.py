"""A p99 floor on a latency histogram as a test of one exceedance rate (after Lindon et al., KDD 2022).

The floor: the canary's p99 is not above ``limit = min((1 + delta) * stable's p99, SLO)``. A
histogram cannot say where the p99 lies inside a bucket, so the test is set on bucket bounds, each
direction on the side that keeps it valid:

- *fail* (roll back): choose the smallest bucket bound ``t`` at or above ``(1 + delta) * hi`` (and
  the SLO), where ``hi`` is a bound that stable's p99 is below at the stated confidence. If the
  floor holds, the canary's p99 is at most ``limit <= t``, so at most 1 % of its requests exceed
  ``t``: the test rejects "exceedance of t <= 1 %" on the canary's bucket counts.
- *pass* (promote): the largest bound ``t`` at or below ``(1 + delta) * lo`` (and the SLO), ``lo``
  a bound stable's p99 is above. If the floor fails, more than 1 % of the canary's requests exceed
  ``t``: the test rejects "exceedance of t >= 1 %".

Stable's bounds come from its own anytime-valid sequence on each bucket's exceedance rate (the
bucket chosen by the data: its level split over the buckets). The price is the buckets'
resolution: a regression smaller than a bucket's width plus delta cannot be told from none, and
coarse engine buckets (vLLM's default TTFT buckets double) judge only large changes; an operator
who wants 10 % resolution configures 2-5 % buckets (BENCHMARKS.md, canary calibration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantgate.rollout.evidence import LatencyHistogram
from quantgate.rollout.wealth import BETS, LOG_WEIGHTS

QUANTILE = 0.99
TAIL = 1.0 - QUANTILE  # the exceedance rate at the p99


@dataclass(frozen=True)
class Thresholds:
    """The bucket bounds this look's two tests count exceedances of (None: none usable yet)."""

    fail_at: float | None
    pass_at: float | None
    stable_p99_hi: float | None
    stable_p99_lo: float | None


def exceedances(hist: LatencyHistogram) -> list[int]:
    """Requests above each bucket bound (total minus the cumulative count)."""
    total = hist.cumulative_counts[-1]
    return [total - c for c in hist.cumulative_counts]


def stable_p99_bounds(hist: LatencyHistogram, alpha: float) -> tuple[float | None, float | None]:
    """(lo, hi): bucket bounds stable's p99 is above and at or below, at level ``alpha`` in all."""
    total = hist.cumulative_counts[-1]
    finite = [(b, k) for b, k in zip(hist.upper_bounds, exceedances(hist), strict=True) if b != float("inf")]
    if total == 0 or not finite:
        return None, None
    need = math.log(2 * len(finite) / alpha)  # the level split over the buckets and the two ends
    # p99 <= b once "exceedance of b >= 1 %" is rejected; p99 > b once "exceedance of b <= 1 %" is
    k = np.array([e for _, e in finite], dtype=float)[:, None]
    below = _log_mixtures(k, total, lambda z: TAIL - z)
    above = _log_mixtures(k, total, lambda z: z - TAIL)
    hi = next((b for (b, _), w in zip(finite, below, strict=True) if w >= need), None)
    lo = next((b for (b, _), w in zip(reversed(finite), above[::-1], strict=True) if w >= need), None)
    return lo, hi


def _log_mixtures(ones: np.ndarray, items: int, step) -> np.ndarray:
    """The betting mixture's log capital per row of ``ones`` (0/1 items, closed form; ``wealth``)."""
    logs = ones * np.log1p(BETS * step(1.0)) + (items - ones) * np.log1p(BETS * step(0.0)) + LOG_WEIGHTS
    top = logs.max(axis=1)
    return top + np.log(np.exp(logs - top[:, None]).sum(axis=1))


def thresholds(stable: LatencyHistogram, delta: float, slo: float | None, alpha: float) -> Thresholds:
    """This look's bounds for the fail and pass tests (see the module)."""
    lo, hi = stable_p99_bounds(stable, alpha)
    bounds = [b for b in stable.upper_bounds if b != float("inf")]
    fail_limit = None if hi is None else (1.0 + delta) * hi
    if slo is not None:
        fail_limit = slo if fail_limit is None else min(fail_limit, slo)
    pass_limit = None if lo is None else (1.0 + delta) * lo
    if slo is not None and pass_limit is not None:
        pass_limit = min(pass_limit, slo)
    fail_at = next((b for b in bounds if b >= fail_limit), None) if fail_limit is not None else None
    pass_at = next((b for b in reversed(bounds) if b <= pass_limit), None) if pass_limit is not None else None
    return Thresholds(fail_at, pass_at, hi, lo)


def exceeding(hist: LatencyHistogram, bound: float) -> int:
    """Requests of ``hist`` above ``bound`` (a bucket bound of it)."""
    i = hist.upper_bounds.index(bound)
    return hist.cumulative_counts[-1] - hist.cumulative_counts[i]


def p99_estimate(hist: LatencyHistogram) -> float | None:
    """The bucket bound at which the cumulative share first reaches 99 % (for reports only)."""
    total = hist.cumulative_counts[-1]
    if total == 0:
        return None
    return next(
        b for b, c in zip(hist.upper_bounds, hist.cumulative_counts, strict=True) if c >= QUANTILE * total
    )
