"""One floor for one artifact in three steps that pass immutable values: plan, measure, decide.

- ``plan`` reads the floor, the metric's declaration, the source's records and, for a
  regression, the approved version's: never the artifact's. It fixes what is bounded and the
  **class its confidence covers** (``quantgate.stats``): a rate of events among eligible items,
  bounded exactly (Clopper-Pearson: items independent draws), or a mean of per-item values within
  a stated range, bounded by betting (``stats.betting``, ``stats.forms``: valid for every
  distribution in the range, the range's worse side checked item by item). It also fixes the
  floor's **power**: whether an artifact equal to the source (for a regression, to the approved
  version) would pass on these items. Power is known before the artifact is seen, so evaluation
  can skip a suite no floor can be decided on (``quantgate.evaluate.skip``), and more damage can
  never buy a floor "insufficient evidence".
- ``measure`` tests the artifact's items at the floor and, for the report, finds both ends.
- ``decide`` applies the rules, in this order:
    1. the test passes at the floor, on a powered floor: **pass**;
    2. the estimate beyond the floor, or an item beyond the class: a violation at every sample
       size. It **fails** a required floor; an advisory floor fails too when powered or when even
       the other end is beyond the floor (an item beyond the class establishes it), and otherwise
       shows it as a **violation** (reported, does not fail the verdict);
    3. the test does not pass on a powered floor: **fail** (a pass needs evidence);
    4. otherwise **insufficient evidence** (fails the verdict unless advisory).
  Every test is monotone in each item's value (``stats.betting``), so the status is monotone in
  damage at every sample size: pass, then insufficient evidence or fail, then fail.

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
from quantgate.contracts.results import SampleDesign
from quantgate.declarations.metrics import Events, Metric
from quantgate.stats import betting, bounds, forms
from quantgate.stats.bounds import Interval
from quantgate.stats.linear import ItemRange

Family = Literal["events", "mean"]
Columns = dict[str, np.ndarray]
INTERVAL_NAME = {"events": "exact", "mean": "betting"}


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
    # events: how the artifact's columns become the bounded rate: (artifact, source, approved) -> Interval
    bound: Callable[[Columns, Columns, Columns | None], Interval] | None = None
    form: forms.Form | None = None  # mean: the floor as a bounded mean
    estimate_of: Callable[[Columns, Columns, Columns | None], float] | None = None  # mean: the statistic
    items: int = 0  # the items it rests on (eligible items, windows, traces reaching the bin)
    powered: bool = False
    mde: float | None = None  # how far an unchanged artifact's conservative end sits from no change
    evidence: str = ""  # what the items can show, in words
    coverage: str = ""  # what the confidence covers: the population and the assumption, in words
    rate_limit: float | None = None  # events: the rate of bad events at the floor
    compare: str = ""  # a regression: what it is compared with, in words
    before_value: float | None = None  # a regression: the approved version's metric
    can_fail: bool = True  # whether any artifact's items could establish a violation
    # a regression against a reported value: (sign, value), the quantity is sign * (metric - value)
    shift: tuple[float, float | None] = (1.0, None)
    # the evaluation itself varies (a device that flips answers): an artifact not shown within is
    # not shown worse, since an identical copy misses too; it fails only where the floor is crossed
    noisy: bool = False

    @property
    def tolerance(self) -> float:
        """The departure from no change the floor allows."""
        return abs(self.limit - self.no_change)


@dataclass(frozen=True)
class Measured:
    """The artifact's quantity against its plan: the estimate, whether the test passes at the floor
    and whether even the other end is beyond it; ``beyond``: items outside the class, as (item
    position, value in the floor's terms); ``interval``, the ends for the report (None when not
    asked for: a simulation needs only the decision)."""

    estimate: float
    within: bool
    established: bool
    interval: Interval | None
    beyond: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Decision:
    """A floor's status from a plan and a measured interval (``decide``), before it is described."""

    status: str  # pass | fail | violation | insufficient_evidence
    within: bool
    beyond: bool  # the estimate itself is beyond the floor, or an item beyond the class
    established: bool  # even the other end is beyond the floor


def _mapped(iv: Interval, f: Callable[[float], float]) -> Interval:
    """``iv`` through a monotone ``f`` (either direction), ends kept in order."""

    def safe(x: float) -> float:
        try:
            return f(x)
        except OverflowError:
            return math.inf

    ends = sorted((safe(iv.low), safe(iv.high)))
    return Interval(safe(iv.estimate), ends[0], ends[1], iv.items, iv.method)


def plan(
    floor: Floor,
    measure: Metric,
    source: Columns,
    *,
    confidence: float,
    before: Before | None = None,
    old: Columns | None = None,
    item_range: ItemRange | None = None,
    sampling: SampleDesign | None = None,
    describe: bool = True,
) -> Plan | str:
    """The floor's plan from the source's columns (and, for a regression, the approved version's:
    ``old`` when its records pair item by item, else ``before.value``), the stated class
    (``item_range``, gates.yaml) and how the items were drawn (``sampling``). A string: why no
    bound exists (the caller reports it as missing or insufficient). ``describe=False`` leaves out
    what only the report reads (an unchanged artifact's end, the items it needs): simulations."""
    alpha = 1.0 - confidence
    kind = floor.kind
    cls = item_range or ItemRange()
    sampling = sampling or SampleDesign(population=None)
    if kind == "max_regression":
        assert before is not None
        return _regression(floor, measure, source, alpha, before, old, cls, sampling, describe)
    events = forms.floor_events(measure, kind)
    if events is not None:
        if not np.any(events.eligible(source)):  # no answer can be lost where none was right
            return f"the source's {floor.metric} {measure.uninformative}"
        if events.noise is not None and forms.has_rerun(source) and not events.count:
            return _noisy_plan(events, floor, measure, source, alpha, sampling, describe)
        return _events_plan(
            events, source, floor.value, upper=kind == "max", alpha=alpha, recovery=kind == "min_recovery"
        )
    if measure.exceeds is None and measure.sums is None:
        return f"the metric declares no per-item form the gate can bound for {kind}"
    form = forms.floor_form(
        kind,
        floor.value,
        measure,
        source,
        cls,
        name=floor.metric,
        weights=sampling.weights,
        population=sampling.population,
    )
    quantile = measure.exceeds is not None and kind == "max"
    upper = kind in ("max", "max_delta_pct")
    estimate_of = _statistic(measure) if quantile else _level_ratio(kind, measure)
    return _mean_plan(form, floor.value, upper, measure, source, None, alpha, sampling, estimate_of, describe)


def _level_ratio(kind: str, measure: Metric) -> Callable[[Columns, Columns, Columns | None], float] | None:
    """A level's ratio with the source's (``min_recovery``; ``max_delta_pct`` in %): the sums' ratio,
    for floors whose items are not the quantity itself (None for the others)."""
    sums = measure.sums
    if kind not in ("max_delta_pct", "min_recovery") or sums is None or sums.log:
        return None

    def estimate(a: Columns, s: Columns, o: Columns | None) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            r = float(
                np.sum(np.asarray(sums.num(a, s), dtype=float))
                / np.sum(np.asarray(sums.num(s, s), dtype=float))
            )
        return r if kind == "min_recovery" else 100.0 * (r - 1.0)

    return estimate


def _statistic(measure: Metric, shift: float = 0.0) -> Callable[[Columns, Columns, Columns | None], float]:
    """The metric's own statistic on the artifact's columns (a pooled quantile's estimate), ``shift`` off."""

    def estimate(a: Columns, s: Columns, o: Columns | None) -> float:
        if measure.statistic is None:
            return math.nan
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.asarray(measure.statistic(a, s, -1))) - shift

    return estimate


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
    worst = bounds.proportion(m, m, alpha).low if m else 0.0  # every eligible item bad
    rate_limit = (limit - offset) / (sign * scale) if m else None
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
        coverage=f"the {what} as independent draws: an exact binomial (Clopper-Pearson) bound, no other assumption",
        rate_limit=rate_limit,
        can_fail=m > 0
        and rate_limit is not None
        and worst > rate_limit
        and not math.isclose(worst, rate_limit, rel_tol=1e-9),
    )


def _noisy_plan(
    ev: Events,
    floor: Floor,
    measure: Metric,
    s: Columns,
    alpha: float,
    sampling: SampleDesign,
    describe: bool,
) -> Plan | str:
    """Lost answers on a device that flips answers (the source's records carry its own re-evaluation
    there): the artifact's losses in excess of the source's own, paired item by item. Per eligible
    item, (artifact lost) - (re-evaluation lost) lies in [-1, 1] with mean 0 for an identical copy,
    so the betting test bounds its mean against the floor's rate with no assumption beyond it."""
    form = forms.events_form(ev, floor.kind, floor.value, s)
    if isinstance(form, str):
        return form
    eligible = np.asarray(ev.eligible(s), dtype=bool)
    m = int(eligible.sum())
    assert ev.noise is not None
    noise = np.asarray(ev.noise(s), dtype=float)
    flips = int(np.sum(noise[eligible]))
    p = _mean_plan(
        form,
        floor.value,
        floor.kind == "max",
        measure,
        s,
        None,
        alpha,
        sampling,
        None,
        describe,
        copy=_flipping_copy(s, eligible),
    )
    if isinstance(p, str):
        return p
    return replace(
        p,
        noisy=True,
        quantity=f"lost answers beyond the source's own re-evaluation ({flips} of its {m} solved flipped)",
        coverage=(
            f"the {ev.what} as independent draws; paired with the source re-evaluated on the same device "
            f"(it flipped {flips} of {m}); a betting bound on the difference, no other assumption"
        ),
    )


def _flipping_copy(s: Columns, eligible: np.ndarray) -> Columns:
    """An identical copy as a device that flips answers shows it, for the power check: each column
    the source re-evaluated (``x`` and ``x_rerun``) takes the re-evaluation's values, the eligible
    items' rolled by half their number, so the copy flips as many answers as the re-evaluation did
    but on other items (the source against itself would flip none and look certain)."""
    copy = dict(s)
    where = np.flatnonzero(eligible)
    for name in [c for c in s if c.endswith("_rerun")]:
        again = np.array(s[name], copy=True)
        again[where] = np.roll(again[where], len(where) // 2)
        copy[name.removesuffix("_rerun")] = again
    return copy


def _mean_plan(
    form: forms.Form | str,
    limit: float,
    upper: bool,
    measure: Metric,
    s: Columns,
    old: Columns | None,
    alpha: float,
    sampling: SampleDesign,
    estimate_of: Callable[[Columns, Columns, Columns | None], float] | None,
    describe: bool = True,
    copy: Columns | None = None,
) -> Plan | str:
    """A floor as a bounded mean (``stats.forms``): its class, and its power, from the source (or the
    approved version; ``copy``: an identical copy's columns where the source against itself is
    not one) taken as the artifact."""
    if isinstance(form, str):
        return form
    as_artifact = copy if copy is not None else old if old is not None else s
    unchanged = form.linear(as_artifact, s, old)
    items = int(np.sum(unchanged.w > 0))
    no_change = estimate_of(as_artifact, s, old) if estimate_of is not None else _weighted(unchanged, form)
    powered = unchanged.first_pass(alpha) is not None
    end = unchanged.ends(alpha)[0] if powered and describe else math.nan
    z, t0 = unchanged.scaled()
    worst = betting.rejects(np.ones(max(items, 1)), t0, alpha, below=False)
    needed = (
        betting.items_needed(float(np.mean(z)) if len(z) else 0.0, t0, alpha, below=True)
        if describe
        else None
    )
    unit = sampling.unit
    resolution = (
        f"an unchanged artifact passes from {needed} {unit}"
        if needed
        else "no number of items passes an unchanged artifact"
    )
    evidence = f"{items} {unit} ({resolution})"
    drawn = (
        f"{unit} drawn at random from {sampling.population}"
        if sampling.population
        else f"{unit} as evaluated, taken as independent draws"
    )
    assumption = (
        f"{form.what} within its own range: no assumption"
        if form.natural_bad
        else f"class: {form.class_text()} (assumed, and checked: an item beyond fails the floor)"
    )
    coverage = (
        f"{drawn}; {assumption}; betting test (Waudby-Smith & Ramdas), valid for every distribution in it"
    )
    return Plan(
        "mean",
        upper,
        limit,
        no_change,
        measure.how,
        alpha,
        form=form,
        estimate_of=estimate_of,
        items=items,
        powered=powered,
        mde=abs(end - no_change)
        if math.isfinite(end) and math.isfinite(no_change) and end != no_change
        else None,
        evidence=evidence,
        coverage=coverage,
        can_fail=bool(worst),
    )


def _weighted(lin, form: forms.Form) -> float:
    total = float(np.sum(lin.w))
    return form.to_quantity(float(np.sum(lin.u * lin.w)) / total) if total > 0 else math.nan


def _regression(
    floor: Floor,
    measure: Metric,
    s: Columns,
    alpha: float,
    before: Before,
    old: Columns | None,
    cls: ItemRange,
    sampling: SampleDesign,
    describe: bool = True,
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
        base = plan(
            shifted, measure, s, confidence=1.0 - alpha, item_range=cls, sampling=sampling, describe=describe
        )
        if isinstance(base, str):
            return base
        sign = 1.0 if worse_up else -1.0
        was = before.value
        powered, evidence = base.powered, base.evidence
        if base.form is not None:  # power at the approved level: every item at its reported value
            form = base.form
            span = form.caps.bad - form.caps.good
            at_was = (form.to_u(was) - form.caps.good) / span
            t0 = (form.to_u(shifted.value) - form.caps.good) / span
            need = betting.items_needed(at_was, t0, alpha, below=True)
            powered = need is not None and base.items >= need
            evidence = f"{base.items} {sampling.unit} (an artifact at the approved value passes from {need or 'no number of'} {sampling.unit})"
        return _with_compare(
            replace(
                base,
                upper=True,
                limit=limit,
                no_change=sign * (base.no_change - was),
                shift=(sign, was),
                powered=powered,
                evidence=evidence,
                mde=None,
            ),
            f"{floor.metric} against {was:.6g} in {before.label}",
            was,
        )
    if measure.events is not None:
        ev = measure.events
        # the items that got worse than in the approved version (a gain elsewhere does not offset them)

        def got_worse(a: Columns, o: Columns) -> np.ndarray:
            return np.asarray(ev.bad(a, s), dtype=bool) & ~np.asarray(ev.bad(o, s), dtype=bool)

        p = _events_plan(ev, s, limit, upper=True, alpha=alpha, regression=got_worse, old=old)
        return _with_compare(p, f"items worse than in {before.label}, paired", before.value)
    if measure.exceeds is not None:
        was = float(np.asarray(measure.statistic(old, s, -1))) if measure.statistic else math.nan
        quantile_form = forms.exceedance_form(
            limit,
            measure.exceeds,
            s,
            cls,
            w_declared=sampling.weight(measure.exceeds.count),
            population=sampling.population,
            shift=was,
        )
        quantile = _mean_plan(
            quantile_form, limit, True, measure, s, old, alpha, sampling, _statistic(measure, was), describe
        )
        if isinstance(quantile, str):
            return quantile
        return _with_compare(quantile, f"{floor.metric} {was:.6g} in {before.label}", was)
    sums = measure.sums
    if sums is None:
        return "the metric declares no per-item form the gate can bound for max_regression"
    den_s = np.asarray(sums.den(s, s), dtype=float)
    old_den = np.asarray(sums.den(old, s), dtype=float)
    if not np.array_equal(old_den, den_s):
        return f"{before.label}'s records weigh the items differently (another tokenization or profile)"
    r_old = float(np.sum(np.asarray(sums.num(old, s), dtype=float)) / np.sum(old_den))
    was = math.exp(r_old) if sums.log else r_old
    paired_form = forms.sums_form(
        "max_regression",
        limit,
        measure,
        s,
        cls,
        name=floor.metric,
        w_declared=sampling.weight(getattr(sums, "weight", None)),
        population=sampling.population,
        o=old,
        was=was,
    )
    paired = _mean_plan(paired_form, limit, True, measure, s, old, alpha, sampling, None, describe)
    if isinstance(paired, str):
        return paired
    return _with_compare(
        replace(paired, no_change=0.0), f"{floor.metric} {was:.6g} in {before.label}, paired", was
    )


def _with_compare(p: Plan, compare: str, was: float | None) -> Plan:
    return replace(p, compare=compare, before_value=was)


def measure(p: Plan, a: Columns, s: Columns, o: Columns | None, *, ends: bool = True) -> Measured:
    """Test the artifact's quantity (``a``; ``s`` the source's columns, ``o`` the approved version's)
    at the floor, and find the reported ends unless ``ends=False`` (a simulation needs the decision only)."""
    if p.family == "events":
        assert p.bound is not None
        iv = p.bound(a, s, o)
        end, other = iv.end(p.upper), iv.other(p.upper)
        within = math.isfinite(end) and not _beyond(p, end)
        return Measured(iv.estimate, within, _clearly_beyond(p, other), iv)
    assert p.form is not None
    lin = p.form.linear(a, s, o)
    estimate = p.estimate_of(a, s, o) if p.estimate_of is not None else _weighted(lin, p.form)
    sign, was = p.shift
    estimate = sign * (estimate - was) if was is not None else estimate
    beyond = tuple((int(i), float(lin.u[i])) for i in lin.beyond[:3])
    within = lin.first_pass(p.alpha) is not None
    established = lin.first_fail(p.alpha) is not None
    interval = None
    if ends:
        conservative, other = lin.ends(p.alpha)
        if was is not None:
            conservative, other = sign * (conservative - was), sign * (other - was)
        low, high = (other, conservative) if p.upper else (conservative, other)
        if low > high:
            low, high = high, low
        method = (
            f"betting test over {int(np.sum(lin.w > 0))} items (constant bets mixed; valid for every "
            f"distribution in the class)"
        )
        interval = Interval(estimate, low, high, int(np.sum(lin.w > 0)), method)
    return Measured(estimate, within, established, interval, beyond)


def _beyond(p: Plan, x: float) -> bool:
    return (x > p.limit if p.upper else x < p.limit) if not math.isnan(x) else False


def _clearly_beyond(p: Plan, x: float) -> bool:
    """Beyond the floor by more than floating-point noise: an interval end *at* the floor does not
    establish a violation (one lost answer of one solved, at a 5 % floor and c = 0.95, sits exactly
    there; ``scipy``'s beta quantile lands a few ulps either side)."""
    return _beyond(p, x) and not math.isclose(x, p.limit, rel_tol=1e-9, abs_tol=1e-12)


def decide(p: Plan, m: Measured, *, advisory: bool) -> Decision:
    """The status of a measured quantity against its plan (module docstring, rules 1-4)."""
    within, established = m.within, m.established
    # on a noisy evaluation an estimate past the floor may be the device's flips: only the other end
    beyond = (established if p.noisy else _beyond(p, m.estimate)) or bool(m.beyond)
    if within and p.powered:
        status = "pass"
    elif beyond:
        status = "fail" if (not advisory or p.powered or established) else "violation"
    elif p.powered and not p.noisy:
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
    return advisory and p.can_fail
