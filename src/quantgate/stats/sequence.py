"""Always-valid bounds for sequential evaluation: a betting confidence sequence, floor by floor.

Why: a suite evaluated in batches and stopped as soon as its floors are decided looks at its
data many times. A fixed-n bound checked after every batch would pass a bad artifact far more
often than 1 - confidence; a *confidence sequence* holds at every sample size at once, so
stopping whenever it decides does not inflate the error (Waudby-Smith & Ramdas 2023,
"Estimating means of bounded random variables by betting", JRSS-B; the predictable plug-in
bets of their section 5, one-sided).

Method. A floor is rewritten as "the mean of a per-item quantity y is at most 0" (``Linear``:
from the metric's declared ratio of sums, ``metrics.Sums``; e.g. a token-weighted KL mean
``sum kld*T / sum T <= L`` becomes ``y = (kld - L) * T``). y is rescaled to z in [0, 1] with its
*known* range, and for each candidate mean m a gambler bets against "the mean is at least m"
(capital multiplied by 1 + lambda (m - z) per item) and against "at most m" (1 + lambda (z - m)),
with bets lambda_i computed from items before i only, at most 0.9 of what keeps the capital
nonnegative. Under its hypothesis each
capital is a nonnegative supermartingale, so by Ville's inequality it ever reaches 1/alpha with
probability at most alpha: the m whose capital did are excluded, for good (running
intersection). A floor passes when every m above 0 is excluded (upper end <= 0), fails when
every m at or below 0 is (lower end > 0), and is undecided otherwise.

Assumptions (say them where the gate is documented): per-item values lie in the range the
metric declares (``Sums.unit``; a value outside it is clipped, and the side it would make
optimistic is disabled for that floor: no early pass after a value above the range), and items
are exchangeable: the suite's items are evaluated in a fixed seeded random order, so each next
item is a uniform draw from those left. Quantities with no such form (``max_regression``,
whose approved value the evaluation does not know; metrics declaring no ``Sums``) are never
decided early: their suite runs all its items, and the fixed design's rules decide them.

Budget: the sequential design spends ``SHARE`` of the tenant's error rate 1 - c on early
decisions and the rest on the fixed design's bound when a suite runs out of items, so a false
pass has probability at most (1 - c) by the union bound (tests/unit/gate/test_sequential_simulation.py).
numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

SHARE = 0.1  # of 1 - confidence, spent on early (sequential) decisions; the rest on the final fixed bound
CAP = 0.9  # largest bet: keeps every capital factor >= 0.1 whatever the next item
TOL = 1e-6  # the reported bound, to within this in [0, 1] (the decision itself is exact)
Decision = Literal["pass", "fail", "undecided"]


def early_alpha(confidence: float) -> float:
    """The error rate early decisions may spend: ``SHARE`` of 1 - confidence."""
    return SHARE * (1.0 - confidence)


def final_confidence(confidence: float) -> float:
    """The fixed design's confidence when a sequential suite ran out of items: 1 - (1 - SHARE)(1 - c)."""
    return 1.0 - (1.0 - SHARE) * (1.0 - confidence)


def bets(z: np.ndarray, alpha: float) -> np.ndarray:
    """Predictable plug-in bets (Waudby-Smith & Ramdas 2023, eq. 26, one-sided): item i's bet uses
    items before it only, large when the past spread is small (capped per m by ``_excluded``)."""
    n = len(z)
    t = np.arange(1, n + 1, dtype=float)
    mu_after = (0.5 + np.cumsum(z)) / (t + 1)  # mu-hat_i, after item i
    sq_before = np.concatenate([[0.0], np.cumsum((z - mu_after) ** 2)])[:-1]
    var_before = (0.25 + sq_before) / t  # sigma-hat^2_{i-1}
    lam = np.sqrt(2.0 * math.log(1.0 / alpha) / (var_before * t * np.log1p(t)))
    return lam


def _excluded(z: np.ndarray, m: np.ndarray, alpha: float, *, upper: bool) -> np.ndarray:
    """Per (item count, m): whether m has been excluded by then (upper: "mean >= m" rejected;
    lower: "mean <= m" rejected), running over every earlier count (Ville: valid at all of them).

    Each m's bets are capped at ``CAP`` times the largest its capital allows (1 / (1 - m) against
    "mean >= m", 1 / m against "mean <= m"), so every factor stays >= 1 - CAP: near the bottom of
    the range a test that the mean is above m can bet big (a broken artifact far above a KL floor
    near 0 is excluded from "at most the floor" after a few windows)."""
    lam = bets(z, alpha)[:, None]
    room = (1.0 - m) if upper else m
    lam = np.minimum(lam, CAP / np.maximum(room, 1e-12)[None, :])
    step = (m[None, :] - z[:, None]) if upper else (z[:, None] - m[None, :])
    log_capital = np.cumsum(np.log1p(lam * step), axis=0)
    return np.maximum.accumulate(log_capital, axis=0) >= math.log(1.0 / alpha)


def bounds(z: np.ndarray, alpha: float) -> tuple[float, float]:
    """The confidence sequence's ends for the mean of ``z`` (values in [0, 1]) after all its items:
    (upper, lower), each one-sided at level 1 - alpha, found by bisection to within ``TOL`` and
    rounded outwards. Bisection takes the excluded m to be those beyond one point, as they are when
    every item lies on one side of the m in question; where not, the end is approximate (a
    decision is the exact test at the floor, ``first_rejection``, never read off these ends)."""
    z = np.clip(np.asarray(z, dtype=float), 0.0, 1.0)

    def end(upper: bool) -> float:
        out, inside = (1.0, 0.0) if upper else (0.0, 1.0)  # out: excluded (or the edge); inside: not
        if not _excluded(z, np.array([out]), alpha, upper=upper)[-1, 0]:
            return out
        while abs(out - inside) > TOL:
            mid = 0.5 * (out + inside)
            if _excluded(z, np.array([mid]), alpha, upper=upper)[-1, 0]:
                out = mid
            else:
                inside = mid
        return out

    return end(True), end(False)


def first_rejection(z: np.ndarray, m: float, alpha: float, *, upper: bool) -> int | None:
    """After how many items "the mean is >= m" (upper) or "<= m" (lower) is rejected; None: not yet."""
    hit = _excluded(np.clip(np.asarray(z, dtype=float), 0.0, 1.0), np.array([m]), alpha, upper=upper)[:, 0]
    return int(np.argmax(hit)) + 1 if hit.any() else None


@dataclass(frozen=True)
class Linear:
    """A floor as "mean of y <= 0": per-item y (in evaluation order), its known range, and how an
    end of y's confidence sequence reads in the floor's units (for the report)."""

    y: np.ndarray
    lo: float
    hi: float
    to_floor: Callable[[float], float]
    above: bool = False  # some y was above hi (clipped): no early pass
    below: bool = False  # some y was below lo (clipped): no early fail
    quantity: str = ""  # what to_floor's values are, when not the floor's own quantity
    limit: float | None = None  # the limit to_floor's values compare with, when not the floor's
    y_low: np.ndarray | None = None  # where y is known only within a range: its low ends (the fail side's)


@dataclass(frozen=True)
class Sequential:
    """One floor's sequential state after the items seen: decision, when, estimate, bound."""

    decision: Decision
    items: int  # items seen
    at: int | None  # after how many items it was decided
    upper: float  # the confidence sequence's conservative end (the side a pass needs), in the floor's units
    lower: float  # its other end
    note: str = ""
    quantity: str = ""  # what the ends bound, when not the floor's own quantity (Linear.quantity)
    limit: float | None = None


def decide(lin: Linear, alpha: float, *, ends: bool = True) -> Sequential:
    """Decide ``lin`` (pass: "mean y >= 0" rejected; fail: "mean y <= 0" rejected), with the
    interval's ends (``ends=False``: the decision alone, ends infinite; for simulations)."""
    span = lin.hi - lin.lo
    z = np.clip((lin.y - lin.lo) / span, 0.0, 1.0)
    z_low = z if lin.y_low is None else np.clip((lin.y_low - lin.lo) / span, 0.0, 1.0)
    t0 = (0.0 - lin.lo) / span  # the floor, rescaled
    n = len(z)
    if n == 0:
        return Sequential("undecided", 0, None, math.inf, -math.inf, "no items yet")
    passed = None if lin.above else first_rejection(z, t0, alpha, upper=True)
    failed = None if lin.below else first_rejection(z_low, t0, alpha, upper=False)
    upper, lower = (bounds(z, alpha)[0], bounds(z_low, alpha)[1]) if ends else (math.inf, -math.inf)
    up_y, lo_y = lin.lo + span * upper, lin.lo + span * lower
    note = "a value above the declared range: no early pass" if lin.above else ""
    note = note or ("a value below the declared range: no early fail" if lin.below else "")
    found = (lin.to_floor(up_y), lin.to_floor(lo_y), note, lin.quantity, lin.limit)
    if passed is not None and (failed is None or passed <= failed):
        return Sequential("pass", n, passed, *found)
    if failed is not None:
        return Sequential("fail", n, failed, *found)
    return Sequential("undecided", n, None, *found)


def linearize(kind: str, limit: float, measure, a: dict, s: dict, s_all: dict) -> Linear | str:
    """The floor ``kind limit`` on ``measure`` as a ``Linear`` over the items seen (``a``, ``s``:
    artifact and source columns in evaluation order); ``s_all``: the source's columns over every
    item of the suite, known before any artifact item is scored, which fixes y's range. A string
    says why the floor has no sequential form (it is then decided by the fixed design)."""
    sums, exceed = getattr(measure, "sums", None), getattr(measure, "exceeds", None)
    if kind == "max_regression":
        return "a regression floor needs the approved version, which evaluation does not know"
    if exceed is not None and kind == "max":
        return _exceedance(exceed, limit, a, s_all)
    if sums is None:
        return "the metric declares no per-item sums"
    with np.errstate(divide="ignore", invalid="ignore"):
        den = np.asarray(sums.den(a, s), dtype=float)
        den_all = np.asarray(sums.den(s_all, s_all), dtype=float)
        num_a = np.asarray(sums.num(a, s), dtype=float)
        num_s = np.asarray(sums.num(s, s), dtype=float)
        num_s_all = np.asarray(sums.num(s_all, s_all), dtype=float)
    u_lo, u_hi = sums.unit
    d_bar = max(float(np.mean(den)) if len(den) else 1.0, 1e-300)
    ratio = kind in ("max_delta_pct", "min_recovery")
    if ratio and not sums.log and not float(np.sum(num_s_all)) > 0:
        return "the source's level is 0: a ratio with it is undefined"
    if kind in ("max", "min"):
        ref = math.log(limit) if sums.log else limit
        if sums.log and limit <= 0:
            return "a floor at or below 0 on a log-scale metric"
        sign = 1.0 if kind == "max" else -1.0
        y = sign * (num_a - ref * den)
        ends = np.stack([sign * (u_lo - ref) * den_all, sign * (u_hi - ref) * den_all])

        def to_floor(u: float) -> float:
            value = ref + sign * u / d_bar
            return math.exp(value) if sums.log else value

    elif kind == "max_delta_pct" and sums.log:
        if sums.diff is None:
            return "the metric declares no range for its per-item change"
        k = math.log1p(limit / 100.0)
        y = num_a - num_s - k * den
        ends = np.stack([(sums.diff[0] - k) * den_all, (sums.diff[1] - k) * den_all])

        def to_floor(u: float) -> float:
            return 100.0 * math.expm1(k + u / d_bar)

    elif kind in ("max_delta_pct", "min_recovery") and not sums.log:
        r = 1.0 + limit / 100.0 if kind == "max_delta_pct" else limit
        sign = 1.0 if kind == "max_delta_pct" else -1.0
        y = sign * (num_a - r * num_s)
        ends = np.stack([sign * (u_lo * den_all - r * num_s_all), sign * (u_hi * den_all - r * num_s_all)])
        s_bar = max(float(np.mean(num_s)) if len(num_s) else 1.0, 1e-300)

        def to_floor(u: float) -> float:
            value = r + sign * u / s_bar
            return 100.0 * (value - 1.0) if kind == "max_delta_pct" else value

    else:
        return f"no sequential form for {kind} on this metric"
    lo, hi = float(np.min(ends)), float(np.max(ends))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "the metric declares no range for its per-item values"
    if not hi > lo or not np.all(np.isfinite(y)):
        return "per-item values are not finite or have no range"
    return Linear(y, lo, hi, to_floor, above=bool(np.any(y > hi)), below=bool(np.any(y < lo)))


def _exceedance(exceed, limit: float, a: dict, s_all: dict) -> Linear:
    """A pooled quantile floor ``q-quantile <= L`` as "at most 1 - q of the tokens exceed L":
    y = (values above L) - (1 - q) * count per item. An item that kept only its largest values,
    all above L, has between that many and all of its tokens above: all of them for the pass side,
    the kept ones for the fail side (``y_low``)."""
    q = exceed.q
    tails = a[exceed.values]
    count = np.asarray(a[exceed.count], dtype=float)
    above = np.array([float(np.sum(np.asarray(t, dtype=float) > limit)) for t in tails])
    kept = np.array([float(len(t)) for t in tails])
    truncated = (above >= kept) & (kept < count)
    y = np.where(truncated, count, above) - (1.0 - q) * count
    w = float(np.max(np.asarray(s_all[exceed.count], dtype=float)))
    d_bar = max(float(np.mean(count)) if len(count) else 1.0, 1e-300)
    return Linear(
        y,
        -(1.0 - q) * w,
        q * w,
        lambda u: (1.0 - q) + u / d_bar,
        y_low=above - (1.0 - q) * count,
        quantity=f"fraction of tokens above {limit:.6g}",
        limit=1.0 - q,
    )


def ordered_columns(suite, samples: list[dict]) -> dict[str, np.ndarray]:
    """Per-item records as numeric columns, in the order given (the evaluation order)."""
    rows = [suite.columns(r) for r in samples]
    names = list(rows[0]) if rows else []
    out: dict[str, np.ndarray] = {}
    for c in names:
        values = [r[c] for r in rows]
        if values and isinstance(values[0], (list, tuple)):
            column = np.empty(len(values), dtype=object)
            for i, v in enumerate(values):
                column[i] = np.asarray(v, dtype=float)
            out[c] = column
        else:
            out[c] = np.asarray(values, dtype=float)
    return out


def check(floor, suite, source: list[dict], samples: list[dict], confidence: float) -> Sequential | str:
    """One floor after the artifact's ``samples`` so far (in evaluation order), against the source's
    per-item records (``source``: of the same items and, for y's range, of every item): the
    always-valid decision at ``early_alpha(confidence)``. A string: why this floor has no
    sequential form."""
    measure = suite.metrics().get(floor.metric)
    if measure is None:
        return f"the suite has no metric {floor.metric}"
    by_item = {str(r["item"]): r for r in source}
    try:
        paired = [by_item[str(r["item"])] for r in samples]
        a, s = ordered_columns(suite, samples), ordered_columns(suite, paired)
        s_all = ordered_columns(suite, list(by_item.values()))
        lin = linearize(floor.kind, floor.value, measure, a, s, s_all)
    except KeyError as exc:  # an item not evaluated, a field missing: the fixed design reports it
        return f"per-item records lack {exc}"
    if isinstance(lin, str):
        return lin
    return decide(lin, early_alpha(confidence))
