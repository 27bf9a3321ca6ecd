"""One-sided confidence bounds, one method per kind of per-item statistic, each chosen by measurement.

Why one method per kind: a floor is a statistical claim ("at confidence c, the artifact meets
it"), and no single interval holds its level for every statistic the gate bounds at the sizes
it runs. The percentile bootstrap the gate used before passed 8-20 % of artifacts sitting
exactly at their floor where 5 % were promised (skewed KL windows at n = 16, lost answers among
40 solved items; bench/gate_calibration.py). So:

- **Rates of events among eligible items** (answers lost among those the source solved,
  wrong answers, flips): exact Clopper-Pearson bounds (``proportion``). Exact at every n; the
  bound at zero events, 1 - alpha^(1/m), is also the smallest rate m items can tell from none.
- **Ratios of per-item sums** (token-weighted KL or agreement over windows, NLL changes, the
  deepest bin's agreement over traces): a studentized ("bootstrap-t") bound on the ratio, its
  standard error from the linearized per-item residuals, resampling items (windows, traces)
  as clusters (``ratio``). Measured against the percentile, BCa and t intervals on skewed and
  heavy-tailed per-item values, it alone corrects for skew; on heavy tails (lognormal sigma 1)
  it still passed 8-13 % at the floor, because a small sample rarely holds the tail that
  carries the mean. Its level is therefore *calibrated*: the bootstrap-t quantile is read at
  ``alpha * exp(-TAIL / sqrt(n))`` (``calibrated``), the smallest correction that holds the
  stated level on that tail at every n measured (8 to 128). Heavier tails than a lognormal with
  sigma 1 are outside what was measured; below ``MIN_ITEMS`` items no bound here holds its
  level on such values, so a ratio floor on fewer items has no evidence.
- **Pooled quantiles** (KL p99 over the tokens of all windows) are decided through the
  fraction of tokens above the floor, a ratio of per-window sums bounded as above (windows are
  the clusters: tokens of one window are not independent), and never below the exact
  order-statistic bound on the pooled tokens (``exceedance``).

Every bound is a pure function of its inputs: the bootstrap's resamples are a fixed-seed count
matrix per item count (``resample_counts``), so a verdict is reproducible byte for byte.
numpy and scipy only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

N_RESAMPLES = 2000
SEED = 0
# bootstrap-t level calibration: alpha * exp(-TAIL / sqrt(n)); measured by bench/gate_calibration.py
TAIL = 7.0
# fewest items (windows, traces) a ratio bound is trusted on: below it no method measured here held its
# level on skewed per-item values (bench/gate_calibration.py, BENCHMARKS.md "Gate calibration")
MIN_ITEMS = 8


@dataclass(frozen=True)
class Interval:
    """Both one-sided ends at the same level: ``low`` (a lower bound) and ``high`` (an upper bound).

    ``items``: the items the bound rests on (for a ratio, those with a nonzero denominator: the
    effective count, e.g. the traces that reach the deepest bin); ``method``: how, in words.
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


@functools.lru_cache(maxsize=32)
def resample_counts(n: int, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> np.ndarray:
    """How often each of ``n`` items appears in each of ``n_resamples`` bootstrap resamples.

    A count matrix turns every resampled sum into one matrix product (``counts @ values``), and a
    fixed seed makes the resamples of a given n the same in every run (read-only, shared).
    """
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n, (n_resamples, n))
    flat = (np.arange(n_resamples)[:, None] * n + picks).ravel()
    counts = np.bincount(flat, minlength=n_resamples * n).reshape(n_resamples, n).astype(float)
    counts.flags.writeable = False
    return counts


def calibrated(alpha: float, n: int) -> float:
    """The level at which a bootstrap-t quantile is read so that the bound holds ``alpha`` (module docstring)."""
    return alpha * math.exp(-TAIL / math.sqrt(max(n, 1)))


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


def ratio(num: np.ndarray, den: np.ndarray, alpha: float, *, n_resamples: int = N_RESAMPLES) -> Interval:
    """Bootstrap-t ends for sum(num) / sum(den) over items resampled whole, at the calibrated level.

    The standard error is the linearized one, sqrt(sum (num_i - R den_i)^2 / (n (n-1))) / mean(den),
    computed for the sample and for every resample from the count matrix; the pivot
    (R* - R) / se* is read at ``calibrated(alpha, n)``. A resample whose denominator sums to 0, or
    whose spread is 0 while its ratio moved, counts as the most extreme pivot on its side.
    Items with a zero denominator stay in the resampling (they are part of the population: a
    trace that does not reach the deepest bin) and are not counted in ``items``.
    """
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    n = len(num)
    effective = int(np.sum(den > 0))
    total = float(np.sum(den))
    if n < 2 or total <= 0:
        estimate = float(np.sum(num)) / total if total > 0 else math.nan
        return Interval(estimate, -math.inf, math.inf, effective, f"{n} item(s): no spread to bound")
    r = float(np.sum(num)) / total
    se = _linear_se(np.sum((num - r * den) ** 2), total / n, n)
    counts = resample_counts(n, n_resamples)
    # every resampled sum at once: columns num, den, num^2, num*den, den^2 times the count matrix
    sums = counts @ np.stack([num, den, num * num, num * den, den * den], axis=1)
    s_num, s_den = sums[:, 0], sums[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        r_star = s_num / s_den
        # sum_i c_i (num_i - R* den_i)^2, expanded into the products above
        squares = sums[:, 2] - 2.0 * r_star * sums[:, 3] + r_star**2 * sums[:, 4]
        se_star = _linear_se(np.maximum(squares, 0.0), s_den / n, n)
        move = r_star - r
        pivot = np.where(se_star > 0, move / se_star, np.sign(move) * np.inf)
    pivot[move == 0] = 0.0
    # an undefined resample (no denominator) is the worst case for whichever end is computed
    undefined = ~(s_den > 0)
    level = calibrated(alpha, effective)
    low_pivot = _order_statistic(np.where(undefined, np.inf, pivot), 1.0 - level)
    high_pivot = _order_statistic(np.where(undefined, -np.inf, pivot), level)
    low = r - low_pivot * se if np.isfinite(low_pivot) else -math.inf
    high = r - high_pivot * se if np.isfinite(high_pivot) else math.inf
    if se == 0:  # every item agrees exactly: the ratio is what it is
        low, high = r, r
    method = f"bootstrap-t over {n} items (resampled whole), read at {level:.3g} for {alpha:.3g}"
    return Interval(r, float(low), float(high), effective, method)


def _order_statistic(values: np.ndarray, level: float) -> float:
    """The ``level`` quantile of ``values`` without interpolation (the ceil(level * B)-th smallest),
    as the bootstrap-t reads its pivot; infinite values allowed."""
    k = min(max(math.ceil(level * len(values)) - 1, 0), len(values) - 1)
    return float(np.partition(values, k)[k])


def _linear_se(squares, mean_den, n: int):
    """The linearized standard error of a ratio of sums from its summed squared residuals."""
    return np.sqrt(squares / (n * (n - 1.0))) / mean_den


def exceedance(
    tails: list[np.ndarray], counts: np.ndarray, limit: float, alpha: float, side: str = "both"
) -> Interval:
    """The fraction of tokens above ``limit``, from each window's largest values (``tails``) and token
    ``counts``, bounded per window (``ratio``: windows are the clusters) and its upper end never below
    the exact order-statistic bound on the pooled tokens (``proportion``).

    A window that kept only its largest values, all above ``limit``, has between that many and all
    of its tokens above: all of them for the upper end (a pass must hold even then), the kept ones
    for the lower end. ``side``: "high" or "low" computes that end alone (the other is left open).
    """
    counts = np.asarray(counts, dtype=float)
    above = np.array([float(np.sum(np.asarray(t, dtype=float) > limit)) for t in tails])
    kept = np.array([float(len(t)) for t in tails])
    total = float(np.sum(counts))
    high, low, method, items = math.inf, -math.inf, "", int(np.sum(counts > 0))
    if side in ("high", "both"):
        high_side = np.where((above >= kept) & (kept < counts), counts, above)
        upper = ratio(high_side, counts, alpha)
        high = max(upper.high, proportion(int(np.sum(high_side)), int(total), alpha).high)
        method = f"{upper.method}; at least the exact order-statistic bound over {int(total)} pooled tokens"
    if side in ("low", "both"):
        lower = ratio(above, counts, alpha)
        low, method = lower.low, method or lower.method
    estimate = float(np.sum(above)) / total if total > 0 else math.nan
    return Interval(estimate, max(low, 0.0), min(high, 1.0), items, method)


def quantile(
    tails: list[np.ndarray], counts: np.ndarray, q: float, alpha: float, estimate: float
) -> Interval:
    """Ends of a pooled ``q`` quantile over the tokens of all windows, by test inversion: the upper
    end is the smallest pooled value L at which the fraction of tokens above L is bounded at or
    below 1 - q (``exceedance``), the lower end the largest L at which it is bounded above 1 - q.

    Candidates are the values each window kept (its largest, enough for the quantile of any
    resample: ``metrics.tail_size``); the bound's decision at a floor L is the same test at L.
    """
    pooled = np.unique(np.concatenate([np.asarray(t, dtype=float) for t in tails])) if tails else np.array([])
    above_ok = pooled[pooled >= estimate]
    below_ok = pooled[pooled <= estimate][::-1]

    def first(candidates: np.ndarray, holds) -> float | None:
        lo, hi, found = 0, len(candidates) - 1, None
        while lo <= hi:  # the tests are monotone in L: the first candidate that holds, by bisection
            mid = (lo + hi) // 2
            if holds(float(candidates[mid])):
                found, hi = float(candidates[mid]), mid - 1
            else:
                lo = mid + 1
        return found

    high = first(above_ok, lambda v: exceedance(tails, counts, v, alpha, "high").high <= 1.0 - q)
    low = first(below_ok, lambda v: exceedance(tails, counts, v, alpha, "low").low > 1.0 - q)
    at = exceedance(tails, counts, estimate, alpha, "high")
    return Interval(
        estimate,
        low if low is not None else -math.inf,
        high if high is not None else math.inf,
        at.items,
        f"test inversion of the fraction of tokens above L ({at.method})",
    )
