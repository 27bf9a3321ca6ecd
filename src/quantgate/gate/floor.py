"""One floor for one artifact in three steps that pass immutable values: plan, measure, decide.

- ``plan`` reads the floor, the metric's declaration, the source's records and, for a
  regression, the approved version's: never the artifact's. It fixes what is bounded (a rate of
  events, a ratio of per-item sums, a pooled quantile: ``quantgate.stats``), its direction, the
  limit in its units, and the floor's **power**: whether an artifact equal to the source (for a
  regression, to the approved version) would pass on these items. Power is known before the
  artifact is seen, so evaluation can skip a suite no floor can be decided on
  (``quantgate.evaluate.skip``), and more damage can never buy a floor "insufficient evidence".
- ``measure`` bounds the artifact's quantity: the estimate and both one-sided ends at the
  tenant's confidence.
- ``decide`` applies the rules, in this order:
    1. the conservative end within the floor, on a powered floor: **pass**;
    2. the estimate beyond the floor: a violation at every sample size. It **fails** a required
       floor; an advisory floor fails too when powered or when even the other end is beyond the
       floor, and otherwise shows it as a **violation** (reported, does not fail the verdict);
    3. the conservative end beyond the floor on a powered floor: **fail** (a pass needs evidence);
    4. otherwise **insufficient evidence** (fails the verdict unless advisory).
  Status is monotone in damage: pass, then insufficient evidence or fail, then fail.

Regression floors compare with what is served, paired: the approved version's per-item records
(published with it) on the same items, the paired difference bounded; a version published
without them is compared with its metric's value (never with a floor's delta), fixed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from quantgate.config import Floor
from quantgate.metrics import Events, Metric
from quantgate.stats import bounds
from quantgate.stats.bounds import Interval

Family = Literal["events", "ratio", "quantile"]
Columns = dict[str, np.ndarray]
INTERVAL_NAME = {"events": "exact", "ratio": "bootstrap-t", "quantile": "exceedance-inversion"}


@dataclass(frozen=True)
class Before:
    """The floor's metric in the version the registry approves for the tenant today.

    ``value``: its reported metric (None: that version's report does not carry it); ``records``:
    its per-item result for the suite (None: published without records, or not comparable);
    ``problem``: why it cannot be compared at all (another profile), None when it can.
    """

    label: str  # e.g. "version 3 of m.hopper-fp8 (approved-chat)"
    value: float | None
    problem: str | None = None
    records: Mapping[str, Any] | None = None  # a SuiteResultFile, or its JSON object


@dataclass(frozen=True)
class Plan:
    """What one floor bounds, known before the artifact is seen (module docstring)."""

    family: Family
    upper: bool  # lower-is-better quantity: its upper end is the conservative one
    limit: float  # the floor, in the quantity's units
    no_change: float  # the quantity with the artifact equal to the source (or the approved version)
    quantity: str  # what is bounded, in words
    alpha: float
    # how the artifact's columns become the bounded quantity: (artifact, source, approved) -> Interval
    bound: Callable[[Columns, Columns, Columns | None], Interval]
    items: int = 0  # the items it rests on (eligible items, windows, traces reaching the bin)
    powered: bool = False
    mde: float | None = None  # how far the unchanged artifact's bound sits from no change
    evidence: str = ""  # what the items can show, in words
    rate_limit: float | None = None  # events: the rate of bad events at the floor
    compare: str = ""  # a regression: what it is compared with, in words
    before_value: float | None = None  # a regression: the approved version's metric
    # where the decision is a test at the floor rather than a comparison of an end with it (a pooled
    # quantile: the fraction of tokens above the floor): (artifact, source, approved) ->
    # (estimate, within, established); the reported ends are the test inverted
    test: Callable[[Columns, Columns, Columns | None], tuple[float, bool, bool]] | None = None

    @property
    def tolerance(self) -> float:
        """The departure from no change the floor allows."""
        return abs(self.limit - self.no_change)


@dataclass(frozen=True)
class Measured:
    """The artifact's quantity against its plan: the estimate, whether the conservative end is within
    the floor and whether even the other end is beyond it; ``interval``, the ends for the report
    (None when not asked for: a simulation needs only the decision)."""

    estimate: float
    within: bool
    established: bool
    interval: Interval | None


@dataclass(frozen=True)
class Decision:
    """A floor's status from a plan and a measured interval (``decide``), before it is described."""

    status: str  # pass | fail | violation | insufficient_evidence
    within: bool
    beyond: bool  # the estimate itself is beyond the floor
    established: bool  # even the other end is beyond the floor


def _transform(kind: str, log: bool) -> Callable[[float], float]:
    """The floor's quantity from a ratio of sums R (a token-weighted mean; a mean NLL when ``log``)."""
    if kind == "max_delta_pct":
        return (lambda r: 100.0 * math.expm1(r)) if log else (lambda r: 100.0 * (r - 1.0))
    return math.exp if log else (lambda r: r)


def _mapped(iv: Interval, f: Callable[[float], float]) -> Interval:
    """``iv`` through a monotone ``f`` (either direction), ends kept in order."""

    def safe(x: float) -> float:
        try:
            return f(x)
        except OverflowError:
            return math.inf

    ends = sorted((safe(iv.low), safe(iv.high)))
    return Interval(safe(iv.estimate), ends[0], ends[1], iv.items, iv.method)


def _sum(fn, a: Columns, s: Columns) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(fn(a, s), dtype=float)


def plan(
    floor: Floor,
    measure: Metric,
    source: Columns,
    *,
    confidence: float,
    before: Before | None = None,
    old: Columns | None = None,
) -> Plan | str:
    """The floor's plan from the source's columns (and, for a regression, the approved version's:
    ``old`` when its records pair item by item, else ``before.value``). A string: why no bound
    exists (the caller reports it as missing or insufficient)."""
    alpha = 1.0 - confidence
    kind = floor.kind
    if kind == "max_regression":
        assert before is not None
        return _regression(floor, measure, source, alpha, before, old)
    events = (
        measure.recovery if kind == "min_recovery" else measure.events if kind in ("max", "min") else None
    )
    if events is not None:
        if not np.any(events.eligible(source)):  # no answer can be lost where none was right
            return f"the source's {floor.metric} {measure.uninformative}"
        return _events_plan(
            events, source, floor.value, upper=kind == "max", alpha=alpha, recovery=kind == "min_recovery"
        )
    if measure.exceeds is not None and kind == "max":
        return _powered(_quantile_plan(measure, source, floor.value, alpha), source)
    if measure.sums is not None:
        raw = _ratio_plan(kind, measure, source, floor.value, alpha)
        return raw if isinstance(raw, str) else _powered(raw, source)
    return f"the metric declares no per-item form the gate can bound for {kind}"


def _events_plan(
    ev: Events,
    s: Columns,
    limit: float,
    *,
    upper: bool,
    alpha: float,
    recovery: bool = False,
    regression: Callable[[Columns, Columns], np.ndarray] | None = None,
    old: Columns | None = None,
) -> Plan:
    """A rate of events among the items the source makes eligible, bounded exactly (Clopper-Pearson)."""
    eligible = np.asarray(ev.eligible(s), dtype=bool)
    m = int(eligible.sum())
    scale = float(m) if ev.count else 1.0
    offset, sign = (0.0, 1.0) if regression is not None else (ev.offset, ev.sign)

    def bad(a: Columns, s: Columns, o: Columns | None) -> np.ndarray:
        if regression is not None:
            return regression(a, o if o is not None else s)
        return np.asarray(ev.bad(a, s), dtype=bool)

    def bound(a: Columns, s_: Columns, o: Columns | None) -> Interval:
        k = int(np.sum(bad(a, s_, o) & eligible))
        return _mapped(bounds.proportion(k, m, alpha), lambda r: offset + sign * scale * r)

    unchanged = bound(old if regression is not None and old is not None else s, s, old)
    what = ev.what if not ev.count else "items"
    if m == 1:  # "1 item the source solved"
        what = what.replace("items", "item", 1)
    no_change = unchanged.estimate if m else offset
    end = unchanged.end(upper)
    within = end <= limit if upper else end >= limit
    name = "recovery counting lost answers only (gains do not offset losses)" if recovery else "rate"
    return Plan(
        "events",
        upper,
        limit,
        no_change,
        name,
        alpha,
        bound,
        items=m,
        powered=m > 0 and within,
        mde=abs(end - no_change) if m else None,
        evidence=f"{m} {what}" if m else f"no {what}",
        rate_limit=(limit - offset) / (sign * scale) if m else None,
    )


def _ratio_plan(kind: str, measure: Metric, s: Columns, limit: float, alpha: float) -> Plan | str:
    """A ratio of per-item sums (``Metric.sums``), bounded by the calibrated bootstrap-t."""
    sums = measure.sums
    assert sums is not None
    den_s = _sum(sums.den, s, s)
    num_s = _sum(sums.num, s, s)
    f = _transform(kind, sums.log)
    if kind in ("max_delta_pct", "min_recovery"):
        if not sums.log and not float(np.sum(num_s)) > 0:
            return f"the source's {measure.how} is 0: a ratio with it is undefined"
        if sums.log:  # the change of mean NLL: (num_a - num_s) / den

            def parts(a: Columns, s_: Columns) -> tuple[np.ndarray, np.ndarray]:
                return _sum(sums.num, a, s_) - _sum(sums.num, s_, s_), _sum(sums.den, a, s_)
        else:  # a level's ratio with the source's: sum num_a / sum num_s (the shared weight cancels)

            def parts(a: Columns, s_: Columns) -> tuple[np.ndarray, np.ndarray]:
                return _sum(sums.num, a, s_), _sum(sums.num, s_, s_)
    else:

        def parts(a: Columns, s_: Columns) -> tuple[np.ndarray, np.ndarray]:
            return _sum(sums.num, a, s_), _sum(sums.den, a, s_)

    def bound(a: Columns, s_: Columns, o: Columns | None) -> Interval:
        num, den = parts(a, s_)
        return _mapped(bounds.ratio(num, den, alpha), f)

    upper = kind in ("max", "max_delta_pct")
    return Plan("ratio", upper, limit, math.nan, measure.how, alpha, bound, items=int(np.sum(den_s > 0)))


def _quantile_plan(measure: Metric, s: Columns, limit: float, alpha: float, shift: float = 0.0) -> Plan:
    """A pooled quantile (``Metric.exceeds``): the fraction of tokens above L, bounded per window."""
    ex = measure.exceeds
    assert ex is not None

    def estimate(a: Columns, s_: Columns) -> float:
        return float(np.asarray(measure.statistic(a, s_, -1))) if measure.statistic else math.nan

    def bound(a: Columns, s_: Columns, o: Columns | None) -> Interval:
        tails = [np.asarray(t, dtype=float) for t in a[ex.values]]
        iv = bounds.quantile(tails, np.asarray(a[ex.count], dtype=float), ex.q, alpha, estimate(a, s_))
        return _mapped(iv, lambda v: v - shift)

    def test(a: Columns, s_: Columns, o: Columns | None) -> tuple[float, bool, bool]:
        tails = [np.asarray(t, dtype=float) for t in a[ex.values]]
        counts = np.asarray(a[ex.count], dtype=float)
        at = bounds.exceedance(tails, counts, limit + shift, alpha)
        return estimate(a, s_) - shift, at.high <= 1.0 - ex.q, at.low > 1.0 - ex.q

    items = len(s[ex.count])
    return Plan("quantile", True, limit, math.nan, measure.how, alpha, bound, items=items, test=test)


def _powered(p: Plan, s: Columns, old: Columns | None = None) -> Plan:
    """A resampled bound's power: enough items for it to hold its level (``bounds.MIN_ITEMS``), and an
    artifact equal to the source (or to the approved version) passing on them."""
    unchanged = measure(p, old if old is not None else s, s, old)
    assert unchanged.interval is not None
    no_change = unchanged.estimate
    end = unchanged.interval.end(p.upper)
    enough = p.items >= bounds.MIN_ITEMS
    within = unchanged.within
    unit = "traces" if "trace" in p.quantity or "bin" in p.quantity else "items"
    if not enough:
        evidence = (
            f"{p.items} {unit}, fewer than the {bounds.MIN_ITEMS} a resampled bound needs to hold its level"
        )
    else:
        evidence = f"{p.items} {unit}"
    return replace(
        p,
        no_change=no_change,
        powered=enough and within,
        mde=abs(end - no_change) if math.isfinite(end) else None,
        evidence=evidence,
    )


def _regression(
    floor: Floor, measure: Metric, s: Columns, alpha: float, before: Before, old: Columns | None
) -> Plan | str:
    """How much worse than the approved version, in the metric's units: paired on the same items when
    its records are here (``old``), else against its reported value taken as fixed."""
    limit = floor.value
    worse_up = not measure.higher_is_better  # the metric's own direction
    if old is None:
        if before.value is None:
            return f"its report carries no {floor.suite} {floor.metric} and no per-item records"
        # the metric itself against the approved value: regression = sign * (metric - value)
        bound_at: dict[str, Any] = {
            "suite": floor.suite,
            "metric": floor.metric,
            ("max" if worse_up else "min"): before.value + (limit if worse_up else -limit),
        }
        shifted = Floor.model_construct(**bound_at)
        base = plan(shifted, measure, s, confidence=1.0 - alpha)
        if isinstance(base, str):
            return base
        sign = 1.0 if worse_up else -1.0
        was = before.value

        def against_value(a: Columns, s_: Columns, o: Columns | None) -> Interval:
            return _mapped(base.bound(a, s_, o), lambda v: sign * (v - was))

        against = replace(base, upper=True, limit=limit, no_change=0.0, bound=against_value)
        return _with_compare(against, f"{floor.metric} against {was:.6g} in {before.label}", was)
    if measure.events is not None:
        ev = measure.events
        # the items that got worse than in the approved version (a gain elsewhere does not offset them)

        def got_worse(a: Columns, o: Columns) -> np.ndarray:
            return np.asarray(ev.bad(a, s), dtype=bool) & ~np.asarray(ev.bad(o, s), dtype=bool)

        p = _events_plan(ev, s, limit, upper=True, alpha=alpha, regression=got_worse, old=old)
        return _with_compare(p, f"items worse than in {before.label}, paired", before.value)
    if measure.exceeds is not None:
        was = float(np.asarray(measure.statistic(old, s, -1))) if measure.statistic else math.nan
        p = _quantile_plan(measure, s, limit, alpha, shift=was)
        return _with_compare(_powered(p, s, old), f"{floor.metric} {was:.6g} in {before.label}", was)
    sums = measure.sums
    if sums is None:
        return "the metric declares no per-item form the gate can bound for max_regression"
    den_s = _sum(sums.den, s, s)
    old_num, old_den = _sum(sums.num, old, s), _sum(sums.den, old, s)
    if not np.array_equal(old_den, den_s):
        return f"{before.label}'s records weigh the items differently (another tokenization or profile)"
    r_old = float(np.sum(old_num) / np.sum(old_den))
    t = math.exp if sums.log else (lambda r: r)
    sign = 1.0 if worse_up else -1.0
    was = t(r_old)

    def paired(a: Columns, s_: Columns, o: Columns | None) -> Interval:
        diff = _sum(sums.num, a, s_) - old_num  # same items, same weights: the paired difference
        return _mapped(bounds.ratio(diff, den_s, alpha), lambda d: sign * (t(r_old + d) - was))

    p = Plan("ratio", True, limit, 0.0, measure.how, alpha, paired, items=int(np.sum(den_s > 0)))
    return _with_compare(_powered(p, s, old), f"{floor.metric} {was:.6g} in {before.label}, paired", was)


def _with_compare(p: Plan, compare: str, was: float | None) -> Plan:
    return replace(p, compare=compare, before_value=was)


def measure(p: Plan, a: Columns, s: Columns, o: Columns | None, *, ends: bool = True) -> Measured:
    """Bound the artifact's quantity (``a``; ``s`` the source's columns, ``o`` the approved version's)
    and place it against the floor; ``ends=False`` skips the reported ends where the decision does
    not need them (a test at the floor)."""
    if p.test is not None:
        estimate, within, established = p.test(a, s, o)
        return Measured(estimate, within, _trusted(p) and established, p.bound(a, s, o) if ends else None)
    iv = p.bound(a, s, o)
    end, other = iv.end(p.upper), iv.other(p.upper)
    within = math.isfinite(end) and not _beyond(p, end)
    return Measured(iv.estimate, within, _trusted(p) and _clearly_beyond(p, other), iv)


def _beyond(p: Plan, x: float) -> bool:
    return (x > p.limit if p.upper else x < p.limit) if not math.isnan(x) else False


def _clearly_beyond(p: Plan, x: float) -> bool:
    """Beyond the floor by more than floating-point noise: an interval end *at* the floor does not
    establish a violation (one lost answer of one solved, at a 5 % floor and c = 0.95, sits exactly
    there; ``scipy``'s beta quantile lands a few ulps either side)."""
    return _beyond(p, x) and not math.isclose(x, p.limit, rel_tol=1e-9, abs_tol=1e-12)


def _trusted(p: Plan) -> bool:
    """An exact bound always; a resampled one on enough items to hold its level."""
    return p.family == "events" or p.items >= bounds.MIN_ITEMS


def decide(p: Plan, m: Measured, *, advisory: bool) -> Decision:
    """The status of a measured quantity against its plan (module docstring, rules 1-4)."""
    within, established = m.within, m.established
    beyond = _beyond(p, m.estimate)
    if within and p.powered:
        status = "pass"
    elif beyond:
        status = "fail" if (not advisory or p.powered or established) else "violation"
    elif p.powered:
        status = "fail"
    else:
        status = "insufficient_evidence"
    return Decision(status, within, beyond, established)


def can_change_verdict(p: Plan, *, advisory: bool) -> bool:
    """Whether an artifact's records could change this floor's effect on its verdict, known from the
    plan alone: a powered floor, yes; a required floor without power blocks the verdict whatever
    the artifact does (insufficient evidence or fail); an advisory one without power fails it only
    where the worst the items could show would establish a violation."""
    if p.powered:
        return True
    if not advisory:
        return False
    if p.family == "events":
        worst = bounds.proportion(p.items, p.items, p.alpha).low  # every eligible item bad
        limit = p.rate_limit
        return (
            p.items > 0
            and limit is not None
            and worst > limit
            and not math.isclose(worst, limit, rel_tol=1e-9)
        )
    return p.items >= bounds.MIN_ITEMS  # a trusted bound can establish a violation
