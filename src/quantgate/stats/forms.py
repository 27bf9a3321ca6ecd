"""Each floor kind as a bounded mean (``linear.Linear``): what an item's value is, what the floor and no
change are in its units, the quantity's natural range, and how an end maps back to the floor's units.

A ``Form`` is fixed before the artifact is seen, from the floor, the metric's declaration
(``Sums``: a ratio of per-item sums; ``Exceeds``: a pooled quantile read as the fraction of tokens
above a limit) and the source's records (and, for a regression, the approved version's): that fixes
the class's caps, so the same class holds for every artifact gated against this source. Then
``Form.linear(artifact columns)`` gives the items.

The metric declarations are read by attribute (``sums``, ``exceeds``), so that this module, like the
rest of ``quantgate.stats``, depends on numpy alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from quantgate.stats.linear import Caps, ItemRange, Linear, caps_for

Columns = dict[str, np.ndarray]
# (artifact, source, approved) columns -> (a limit in the floor's units -> per-item (u, w)): the columns
# are read once, and an interval's ends try many limits on them
Values = Callable[[Columns, Columns, "Columns | None"], Callable[[float], tuple[np.ndarray, np.ndarray]]]


@dataclass(frozen=True)
class Form:
    """A floor as a bounded mean, before the artifact is seen (module docstring)."""

    limit: float  # the floor, in its own units
    values: Values
    to_u: Callable[[float], float]  # a limit in the floor's units -> u
    to_quantity: Callable[[float], float]  # u -> the floor's units
    caps: Caps
    w_max: float
    bracket: tuple[float, float]  # the floor's quantity at the good and the bad cap
    what: str  # an item's value, in words
    population: int | None = None
    no_change: float = 0.0  # u of an artifact equal to the source (or the approved version)
    # where the bracket depends on the artifact's values (a quantile's largest kept value): it, from them
    bracket_of: Callable[[Columns], tuple[float, float]] | None = None
    sign: float = 1.0  # u = sign * an item's value as ``what`` names it
    unit: str = ""  # the item value's unit, for the report
    natural_bad: bool = False  # the worse cap is the quantity's own bound: no assumption made

    def linear(
        self, a: Columns, s: Columns, o: Columns | None = None, *, limit: float | None = None
    ) -> Linear:
        """The artifact's items against ``limit`` (default: the floor), in evaluation order."""
        at = self.values(a, s, o)
        bracket = self.bracket if self.bracket_of is None else self.bracket_of(a)

        def build(q: float) -> Linear:
            u, w = at(q)
            return Linear(
                u=np.asarray(u, dtype=float),
                w=np.asarray(w, dtype=float),
                w_max=self.w_max,
                limit=self.to_u(q),
                caps=self.caps,
                population=self.population,
                at=build,
                bracket=bracket,
                what=self.what,
                to_quantity=self.to_quantity,
                limit_free=getattr(self.values, "limit_free", False),
                to_u=self.to_u,
            )

        return build(self.limit if limit is None else limit)

    def class_text(self) -> str:
        """The class in words, for the report: the worse cap on an item's value, or that the
        quantity's own range is the class (no assumption)."""
        if self.natural_bad:
            return f"{self.what}: its own range (no assumption)"
        cmp = "<=" if self.sign > 0 else ">="
        q = self.to_quantity(self.caps.bad)
        q = q if math.isfinite(q) else self.sign * self.caps.bad
        return f"{self.what} {cmp} {q:.4g}{self.unit}"


def _num(fn, a: Columns, s: Columns) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(fn(a, s), dtype=float)


def _per_item(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den per item, 0 where the item has no weight (it then adds nothing to either sum)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def fixed(fn: Callable[[Columns, Columns, Columns | None], tuple[np.ndarray, np.ndarray]]) -> Values:
    """Values that do not depend on the limit tried (a window's KL is what it is): read once."""

    def prepare(a: Columns, s: Columns, o: Columns | None):
        uw = fn(a, s, o)
        return lambda q: uw

    prepare.limit_free = True  # type: ignore[attr-defined]
    return prepare


def _weight_bound(den_s: np.ndarray, declared: float | None) -> float:
    """The heaviest weight an item may have: the evaluation's declaration, else the heaviest evaluated."""
    seen = float(np.max(den_s)) if len(den_s) else 0.0
    return max(declared or 0.0, seen)


def sums_form(
    kind: str,
    limit: float,
    measure,
    s: Columns,
    cls: ItemRange,
    *,
    name: str = "value",
    w_declared: float | None = None,
    population: int | None = None,
    o: Columns | None = None,
    was: float | None = None,
) -> Form | str:
    """A floor on a ratio of per-item sums (``measure.sums``): ``max``/``min`` on the ratio (exp of it
    for a log metric), ``max_delta_pct``/``min_recovery`` against the source's level, and
    ``max_regression`` paired with the approved version's records ``o`` (its value ``was``).
    A string: why the floor has no such form."""
    sums = measure.sums
    den_s = _num(sums.den, s, s)
    num_s = _num(sums.num, s, s)
    total = float(np.sum(den_s))
    if not total > 0:
        return "no item carries weight"
    w_max = _weight_bound(den_s, w_declared)
    unit = tuple(float(x) for x in sums.unit)

    if kind in ("max", "min"):
        sign = 1.0 if kind == "max" else -1.0
        if sums.log and limit <= 0:
            return "a floor at or below 0 on a log-scale metric"

        def to_u(q: float) -> float:
            return sign * (math.log(q) if sums.log else q)

        def to_quantity(u: float) -> float:
            return _exp(sign * u) if sums.log else sign * u

        @fixed
        def values(a: Columns, s_: Columns, o_: Columns | None):
            den = _num(sums.den, a, s_)
            return sign * _per_item(_num(sums.num, a, s_), den), den

        natural = tuple(sorted((sign * unit[0], sign * unit[1])))
        no_change = sign * float(np.sum(num_s)) / total
        what = f"an item's {name}"
        return _form(
            limit, values, to_u, to_quantity, no_change, natural, cls, w_max, population, what, sign=sign
        )

    if kind == "max_delta_pct" and sums.log:

        @fixed
        def values_log(a: Columns, s_: Columns, o_: Columns | None):
            den = _num(sums.den, a, s_)
            return _per_item(_num(sums.num, a, s_) - _num(sums.num, s_, s_), den), den

        return _form(
            limit,
            values_log,
            lambda q: math.log1p(q / 100.0),
            lambda u: 100.0 * _expm1(u),
            0.0,
            (-math.inf, math.inf),
            cls,
            w_max,
            population,
            f"an item's {name} change against the source",
            unit="%",
        )

    if kind in ("max_delta_pct", "min_recovery"):
        if not float(np.sum(num_s)) > 0:
            return "the source's level is 0: a ratio with it is undefined"
        sign = 1.0 if kind == "max_delta_pct" else -1.0

        def ratio(q: float) -> float:
            return 1.0 + q / 100.0 if kind == "max_delta_pct" else q

        def values_ratio(a: Columns, s_: Columns, o_: Columns | None):
            den, num_a, num_s_ = _num(sums.den, a, s_), _num(sums.num, a, s_), _num(sums.num, s_, s_)
            return lambda q: (sign * _per_item(num_a - ratio(q) * num_s_, den), den)

        r = ratio(limit)
        ends = sorted((sign * (unit[0] - r * unit[1]), sign * (unit[1] - r * unit[0])))
        natural = (ends[0], ends[1])
        no_change = sign * (1.0 - r) * float(np.sum(num_s)) / total
        caps = caps_for(no_change, 0.0, natural, cls)
        if isinstance(caps, str):
            return caps
        top = unit[1] * total / float(np.sum(num_s))  # the largest ratio any artifact can reach
        # (strictest limit, most lenient): a recovery of ``top`` no artifact can show, 0 any can
        bracket = (top, 0.0) if kind == "min_recovery" else (-100.0, 100.0 * (top - 1.0))
        return Form(
            limit,
            values_ratio,
            lambda q: 0.0,
            lambda u: math.nan,  # the items' u is not the quantity here: ends come from ``at``
            caps,
            w_max,
            bracket,
            f"an item's {name} minus {r:g} x the source's (per unit of weight)",
            population,
            no_change,
            sign=sign,
            natural_bad=caps.bad >= natural[1],
        )

    if kind == "max_regression" and o is not None and was is not None:
        worse_up = not measure.higher_is_better
        sign = 1.0 if worse_up else -1.0
        if sums.log and not worse_up:
            return "no paired regression form for a higher-is-better log metric"

        @fixed
        def values_reg(a: Columns, s_: Columns, o_: Columns | None):
            assert o_ is not None
            den = _num(sums.den, s_, s_)
            return sign * _per_item(_num(sums.num, a, s_) - _num(sums.num, o_, s_), den), den

        if sums.log:
            if not was > 0:
                return "the approved version's level is not positive"

            def to_u_reg(q: float) -> float:
                return math.log1p(q / was) if q > -was else -math.inf

            def to_q_reg(u: float) -> float:
                return was * _expm1(u)

        else:

            def to_u_reg(q: float) -> float:
                return q

            def to_q_reg(u: float) -> float:
                return u

        span = unit[1] - unit[0]
        natural = (-span, span) if math.isfinite(span) else (-math.inf, math.inf)
        return _form(
            limit,
            values_reg,
            to_u_reg,
            to_q_reg,
            0.0,
            natural,
            cls,
            w_max,
            population,
            f"an item's {name} regression against the approved version",
            sign=1.0,
        )
    return f"no bounded-mean form for {kind} on this metric"


def exceedance_form(
    limit: float,
    exceeds,
    s: Columns,
    cls: ItemRange,
    *,
    w_declared: float | None = None,
    population: int | None = None,
    shift: float = 0.0,
) -> Form | str:
    """A pooled quantile floor ``q-quantile <= limit`` as "at most 1 - q of the tokens exceed it": an
    item's value is its fraction of tokens above the limit (``shift`` added: a regression's approved
    value), weighted by its tokens. A window that kept only its largest values, all above the limit,
    counts every one of its tokens as above (the pass side's worst case)."""
    count_s = np.asarray(s[exceeds.count], dtype=float)
    if not float(np.sum(count_s)) > 0:
        return "no item carries tokens"
    top = 1.0 - exceeds.q

    def values(a: Columns, s_: Columns, o_: Columns | None):
        tails = [np.asarray(t, dtype=float) for t in a[exceeds.values]]
        count = np.asarray(a[exceeds.count], dtype=float)
        kept = np.array([float(len(t)) for t in tails])
        flat = np.concatenate(tails) if tails else np.zeros(0)
        window = np.repeat(np.arange(len(tails)), [len(t) for t in tails])

        def at(q: float):
            above = np.bincount(window[flat > q + shift], minlength=len(tails)).astype(float)
            above = np.where((above >= kept) & (kept < count), count, above)
            return _per_item(above, count), count

        return at

    caps = caps_for(0.0, top, (0.0, 1.0), cls)
    if isinstance(caps, str):
        return caps

    def bracket_of(a: Columns) -> tuple[float, float]:
        largest = max((float(np.max(t)) for t in a[exceeds.values] if len(t)), default=0.0)
        return (-shift, max(largest - shift, limit) * (1.0 + 1e-9) + 1e-12)  # above it, no token exceeds

    return Form(
        limit,
        values,
        lambda q: top,
        lambda u: u,
        caps,
        _weight_bound(count_s, w_declared),
        (-shift, limit),
        f"an item's fraction of tokens above the floor (the floor allows {top:.0%} pooled)",
        population,
        0.0,
        bracket_of,
        natural_bad=caps.bad >= 1.0,
    )


def _form(
    limit, values, to_u, to_quantity, no_change, natural, cls, w_max, population, what, *, sign=1.0, unit=""
) -> Form | str:
    u_limit = to_u(limit)
    caps = caps_for(no_change, u_limit, natural, cls)
    if isinstance(caps, str):
        return caps
    return Form(
        limit,
        values,
        to_u,
        to_quantity,
        caps,
        w_max,
        (to_quantity(caps.good), to_quantity(caps.bad)),
        what,
        population,
        no_change,
        sign=sign,
        unit=unit,
        natural_bad=caps.bad >= natural[1],
    )


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _expm1(x: float) -> float:
    try:
        return math.expm1(x)
    except OverflowError:
        return math.inf


def floor_events(measure, kind: str):
    """The 0/1 events (``metrics.Events``) a floor of ``kind`` on ``measure`` is decided by, or None:
    a recovery through lost answers for ``min_recovery``, the metric's own events for ``max``/``min``."""
    if kind == "min_recovery":
        return measure.recovery
    return measure.events if kind in ("max", "min") else None


def has_rerun(s: Columns) -> bool:
    """Whether the source's columns carry its own re-evaluation (``*_rerun``: a device that flips)."""
    return any(name.endswith("_rerun") for name in s)


def events_form(events, kind: str, limit: float, s: Columns, *, population: int | None = None) -> Form | str:
    """A rate of 0/1 events among the items the source makes eligible (``metrics.Events``: lost
    answers, a recovery counting them) as a bounded mean within the events' own range [0, 1]: no
    class is assumed, an event is never "beyond" it. Where the source's columns carry its own
    re-evaluation (``*_rerun``, a device that flips answers), an item's value is its loss minus the
    re-evaluation's, in [-1, 1], mean 0 for an identical copy.

    ``population``: the items the sample was drawn from; the eligible ones among them are known only
    when the sample is the whole population (then their count), else the test is the with-replacement
    one. A string: why the floor has no such form (a count of events; a floor on gains)."""
    if events.count:
        return "a count of events is bounded by the fixed design's exact interval"
    if (events.sign > 0) != (kind == "max"):
        return "a bound on lost answers decides a floor on losses only"
    eligible = np.asarray(events.eligible(s), dtype=bool)
    m = int(eligible.sum())
    if m == 0:
        return f"no {events.what}"
    noisy = events.noise is not None and has_rerun(s)

    @fixed
    def values(a: Columns, s_: Columns, o_: Columns | None):
        ok = np.asarray(events.eligible(s_), dtype=bool)
        lost = np.asarray(events.bad(a, s_), dtype=float)
        if noisy:
            lost = lost - np.asarray(events.noise(s_), dtype=float)
        return np.where(ok, lost, 0.0), ok.astype(float)

    def to_u(q: float) -> float:
        return (q - events.offset) / events.sign

    def to_quantity(u: float) -> float:
        return events.offset + events.sign * u

    caps = Caps(-1.0, 1.0) if noisy else Caps(0.0, 1.0)
    return Form(
        limit,
        values,
        to_u,
        to_quantity,
        caps,
        1.0,
        (to_quantity(caps.good), to_quantity(caps.bad)),
        "an item's loss minus the source's own re-evaluation loss"
        if noisy
        else f"a lost answer among the {events.what}",
        population=m if population is not None and population == len(eligible) else None,
        sign=1.0,
        natural_bad=True,
    )


def floor_form(
    kind: str,
    limit: float,
    measure,
    s: Columns,
    cls: ItemRange,
    *,
    name: str,
    weights=None,
    population: int | None = None,
) -> Form | str:
    """The bounded-mean form of a floor that is not a regression: a pooled quantile's exceedance for
    ``max`` on a metric that declares one, else its ratio of sums. ``weights``: the heaviest weight
    per column the evaluation declares (a mapping), if any."""
    weights = weights or {}
    events = floor_events(measure, kind)
    if events is not None:
        return events_form(events, kind, limit, s, population=population)
    if measure.exceeds is not None and kind == "max":
        return exceedance_form(
            limit,
            measure.exceeds,
            s,
            cls,
            w_declared=weights.get(measure.exceeds.count),
            population=population,
        )
    if measure.sums is None:
        return "the metric declares no per-item sums"
    return sums_form(
        kind,
        limit,
        measure,
        s,
        cls,
        name=name,
        w_declared=weights.get(getattr(measure.sums, "weight", None)),
        population=population,
    )


def items_to_fail(kind: str, limit: float, measure, cls: ItemRange, alpha: float) -> int | None:
    """The fewest items on which *some* artifact could fail this floor at level ``alpha``, known from
    the floor alone (None: not known before the source is evaluated, or no number does): an advisory
    floor that its suite's size can never fail is refused when gates.yaml is loaded.

    - A rate of events (exact bounds): every eligible item bad must put the lower end above the
      floor, alpha^(1/m) > the floor's rate (a count floor: m alpha^(1/m) above the count).
    - A mean within a stated class: an item beyond the class fails the floor, so one item can.
    - A mean within its own range (agreement): the worst items must reject "within the floor".
    - A regression, or a level's ratio with the source: known only from the records (None).
    """
    if kind == "max_regression":
        return None
    events = floor_events(measure, kind)
    if events is not None:
        for m in range(1, 1 << 16):
            low = alpha ** (1.0 / m)  # Clopper-Pearson's lower end with all m items bad
            bound = events.offset + events.sign * (m if events.count else 1.0) * low
            if (bound > limit) if (events.sign > 0) == (kind == "max") else (bound < limit):
                return m
        return None
    if measure.sums is None or getattr(measure, "level", True) or kind not in ("max", "min"):
        return None
    sign = 1.0 if kind == "max" else -1.0
    lo, hi = sorted((sign * float(measure.sums.unit[0]), sign * float(measure.sums.unit[1])))
    best = lo  # a comparison with the source is at its best at no change: KL 0, agreement 1
    caps = caps_for(best, sign * limit, (lo, hi), cls)
    if isinstance(caps, str):
        return None
    if caps.bad < hi:  # the class is an assumption, checked item by item: one item beyond fails
        return 1
    t0 = (sign * limit - caps.good) / (caps.bad - caps.good)
    from quantgate.stats import betting

    return betting.items_needed(1.0, t0, alpha, below=False)
