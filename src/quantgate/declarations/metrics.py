"""What a suite kind declares about its metrics, so that the gate needs no code per kind.

Each kind says, for every metric a gate floor may name: which way is better; whether it is a
*level* (a property of one model, such as perplexity or accuracy, so a ratio with the source's
level means something) or already a *comparison* with the source (KL divergence, agreement,
flips); the per-item statistic, paired item by item with the source (none: the suite's
reported value is all there is, a point estimate); and when the source's level is a base a
ratio can be taken against; and, for metrics that count events (answers lost), the smallest
effect the source's level lets the items show (``detectable``), which the gate needs because a
bootstrap over items that hold no event has no spread. Per-item records become columns through
the kind's ``columns`` (a number per item, or a list of numbers per item for a pooled quantile).
numpy only: the gate imports this without torch.

Items that could not be evaluated (no sandbox for a program, a harness that returned nothing
for an item, a generation that crashed) are never scored as wrong answers: the per-item record
carries ``"error": "<reason>"`` (key ``ERROR``) and no value, ``item_error`` reads it, every
kind's ``columns`` raises ``ItemError`` for such a record, and ``SuiteResult.errors`` counts
them by reason. A floor on a suite with any such item has no evidence on those items: the gate
reports it as ``error`` (with the reasons), never as a pass or a fail.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Columns = dict[str, np.ndarray]
# (artifact columns, source columns, axis) -> the statistic along axis (vectorized over resamples)
Statistic = Callable[[Columns, Columns, int], np.ndarray]
# (source columns over all items, confidence, ratio floor?) -> (smallest departure from no change the
# items can show, in the floor's units; a few words on the source's level, e.g. "source solves 3 of 8")
Detectable = Callable[[Columns, float, bool], tuple[float, str]]


ERROR = "error"  # per-item record key: why the item could not be evaluated (absent when it was)
# a source record's key: the source's own re-evaluation of the item on the device the artifacts ran on
# (a device whose generations are not bit-reproducible flips some answers of an identical model)
RERUN = "rerun"


class ItemError(KeyError):
    """A per-item record that could not be evaluated, raised by ``SuiteKind.columns``.

    A ``KeyError``, because such a record has no value to give: code that treats an absent
    field as missing data fails closed on it too. ``item`` and ``reason`` say which and why.
    """

    def __init__(self, item: Any, reason: str) -> None:
        super().__init__(item, reason)
        self.item, self.reason = item, reason

    def __str__(self) -> str:
        return f"item {self.item} could not be evaluated: {self.reason}"


def item_error(sample: Mapping[str, Any]) -> str | None:
    """Why the per-item record ``sample`` could not be evaluated; None when it was."""
    reason = sample.get(ERROR)
    return str(reason) if reason else None


def require_evaluated(sample: Mapping[str, Any]) -> None:
    """Raise ``ItemError`` for a record that could not be evaluated: the first line of every ``columns``."""
    reason = item_error(sample)
    if reason is not None:
        raise ItemError(sample.get("item"), reason)


def item_errors(samples: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many records could not be evaluated, by reason (empty when every item was)."""
    return dict(Counter(r for r in map(item_error, samples) if r is not None))


def nonzero(base: np.ndarray) -> np.ndarray:
    """The default: a ratio with the source's level is defined unless that level is 0."""
    return np.asarray(base) != 0


@dataclass(frozen=True)
class Sums:
    """The metric as a ratio of per-item sums, sum(num) / sum(den) (``log``: exp of it, as
    perplexity), so that a confidence sequence can bound it while items arrive (stats/sequence.py).

    ``num``, ``den``: per item, from (artifact columns, source columns); ``den`` is a weight both
    models share (the tokens of the same window, 1 per item, the items the source solved).
    ``unit``: the natural range of num/den on one item (infinite where the quantity has no bound:
    KL divergence, NLL); the floor's stated class narrows it (``quantgate.stats.linear``).
    """

    num: Callable[[Columns, Columns], np.ndarray]
    den: Callable[[Columns, Columns], np.ndarray]
    unit: tuple[float, float]
    log: bool = False
    weight: str | None = None  # the column ``den`` reads, where it is one (its bound is declared per suite)


@dataclass(frozen=True)
class Exceeds:
    """A pooled ``q`` quantile of per-token ``values`` (``count`` tokens per item): "the quantile is
    at most L" read as "at most 1 - q of the tokens exceed L", a ratio of sums in [0, 1]."""

    values: str
    count: str
    q: float


def weighted_sums(value: str, weight: str, unit: tuple[float, float]) -> Sums:
    """``weighted_mean(value, weight)`` as sums, with the declared range of ``value``."""
    return Sums(
        lambda a, s: a[value] * a[weight],
        lambda a, s: np.asarray(a[weight], dtype=float),
        unit,
        weight=weight,
    )


def mean_sums(value: str, unit: tuple[float, float] = (-math.inf, math.inf)) -> Sums:
    """A plain mean of ``value`` as sums (a weight of 1 per item) in its natural range ``unit``."""
    return Sums(lambda a, s: a[value], ones, unit)


def ones(a: Columns, s: Columns) -> np.ndarray:
    """A weight of 1 per item (plain means)."""
    return np.ones(len(next(iter(a.values()))))


@dataclass(frozen=True)
class Events:
    """The metric as a rate of per-item events among eligible items, so the gate bounds it exactly
    (Clopper-Pearson, ``quantgate.stats.bounds.proportion``) rather than by resampling 0/1 values.

    ``bad(a, s)``: per item, 1 where the event that makes the metric worse happened (a lost
    answer, a wrong one, a flip); ``eligible(s)``: per item, 1 where it counts, from the source's
    records alone (known before any artifact item is scored, so power is too). The metric, or the
    conservative form the gate holds it to, is ``offset + sign * rate``, times the number of eligible
    items when ``count``. Gains never offset losses: a bound on lost answers ignores gained ones.
    """

    bad: Callable[[Columns, Columns], np.ndarray]
    eligible: Callable[[Columns], np.ndarray]
    offset: float = 0.0
    sign: float = 1.0
    count: bool = False
    what: str = "items"  # the eligible items, in words ("items the source solved")
    # the same events between the source and its own re-evaluation (``RERUN``), where the source's
    # columns carry it: on a device that flips answers, an artifact's losses are compared with these
    noise: Callable[[Columns], np.ndarray] | None = None


@dataclass(frozen=True)
class Metric:
    """One metric a floor may name: direction, level or comparison, statistic, when informative."""

    higher_is_better: bool
    level: bool  # True: ratio floors (max_delta_pct, min_recovery) apply; False: only max / min
    how: str  # how the estimate is computed, for the reason sentence
    statistic: Statistic | None = None  # None: point only, the suite's reported value
    informative: Callable[[np.ndarray], np.ndarray] = nonzero  # on the source's level, for ratio floors
    uninformative: str = "is 0, so the ratio is undefined (0/0 or x/0)"  # why, after "the source's <metric>"
    detectable: Detectable | None = None  # event metrics: the resolution the source's level allows
    sums: Sums | None = None  # the statistic as a ratio of per-item sums: sequential evaluation can bound it
    exceeds: Exceeds | None = None  # a pooled quantile: sequential evaluation bounds its exceedance
    events: Events | None = None  # a rate of 0/1 events: bounded exactly
    recovery: Events | None = None  # a level's recovery bounded through its lost answers (min_recovery)

    @property
    def point_only(self) -> bool:
        """No per-item statistic: the gate can only compare the suite's reported value."""
        return self.statistic is None

    @property
    def direction(self) -> str:
        """'higher is better' or 'lower is better', for reports."""
        return "higher is better" if self.higher_is_better else "lower is better"


def weighted_mean(value: str, weight: str) -> Statistic:
    """Mean of per-item ``value`` weighted by ``weight`` (e.g. tokens per window)."""
    return lambda a, s, axis: np.sum(a[value] * a[weight], axis=axis) / np.sum(a[weight], axis=axis)


def mean(value: str) -> Statistic:
    """Unweighted mean of per-item ``value``."""
    return lambda a, s, axis: np.mean(a[value], axis=axis)


def perplexity(nll: str, tokens: str = "tokens") -> Statistic:
    """exp(sum of NLL / sum of tokens) over items."""
    return lambda a, s, axis: np.exp(np.sum(a[nll], axis=axis) / np.sum(a[tokens], axis=axis))


def pooled_quantile(q: float, values: str, count: str) -> Statistic:
    """The ``q`` quantile of every item's values pooled (linear interpolation, as ``torch.quantile``).

    Each item's ``values`` column holds only its largest values (``tail_size`` of them, in any
    order) and ``count`` how many it has in all: the pooled quantile of any resample of the items
    lies among those largest values, so the quantile is exact without storing every value.
    """

    def stat(a: Columns, s: Columns, axis: int) -> np.ndarray:
        tails, counts = np.asarray(a[values], dtype=object), np.asarray(a[count], dtype=float)
        rows = tails.reshape(-1, tails.shape[-1])
        totals = counts.reshape(-1, counts.shape[-1]).sum(-1)
        out = np.full(len(rows), np.nan)
        for r, (items, n) in enumerate(zip(rows, totals, strict=True)):
            pooled = np.concatenate([np.asarray(v, dtype=float) for v in items])
            h = (int(n) - 1) * q  # ascending position of the quantile among all n values
            lo = math.floor(h)
            hi = min(lo + 1, int(n) - 1)
            # the values at those positions, counted from the top, among the kept largest values
            low_at, high_at = len(pooled) - int(n) + lo, len(pooled) - int(n) + hi
            if n >= 1 and low_at >= 0:  # else: fewer values kept than the quantile's rank needs
                part = np.partition(pooled, [low_at, high_at])
                out[r] = part[low_at] + (h - lo) * (part[high_at] - part[low_at])
        return out.reshape(tails.shape[:-1]) if tails.ndim > 1 else out[0]

    return stat


def tail_size(q: float, items: int, largest: int) -> int:
    """How many of an item's largest values ``pooled_quantile`` needs for ``items`` items of at most
    ``largest`` values each: enough for the pooled ``q`` quantile of any resample of them."""
    return math.ceil((1 - q) * (items * largest - 1)) + 2


def detectable_rate(eligible: int, confidence: float) -> float:
    """The smallest true event rate among ``eligible`` items that shows at least one event with
    probability ``confidence`` (infinite with no eligible item): below it, "no event observed"
    is what a real effect looks like too (the exact form of the rule of three)."""
    return math.inf if eligible <= 0 else 1.0 - (1.0 - confidence) ** (1.0 / eligible)


def _losses(scale: str) -> Detectable:
    """The resolution of a loss measure: the smallest loss rate among the items the source solved
    that their number can show, in the floor's units (``scale``: rate of the solved items, a count,
    or a fraction of all items; a ratio floor is always a rate of the source's level)."""

    def detectable(s: Columns, confidence: float, ratio: bool) -> tuple[float, str]:
        correct = np.asarray(s["correct"])
        solved, n = int(np.sum(correct > 0)), int(correct.size)
        rate = detectable_rate(solved, confidence)
        if solved and not ratio and scale == "count":
            rate *= solved
        elif solved and not ratio and scale == "fraction":
            rate *= solved / n
        return rate, f"the source solves {solved} of {n} items"

    return detectable


def _any_flip(s: Columns, confidence: float, ratio: bool) -> tuple[float, str]:
    n = int(np.asarray(s["correct"]).size)
    return detectable_rate(n, confidence), f"any of {n} items may flip"


def correctness(accuracy: str) -> dict[str, Metric]:
    """The metrics of a suite scored right/wrong per item (column ``correct``), paired with the source.

    A lost answer (the source right, the artifact wrong) is a regression; a gained one is not, so
    floors that mean "no regression" bound ``flip_loss_rate`` (or ``flips_lost``), never
    ``flip_rate``, which counts a lucky answer as much as a lost one.
    """
    solved = Events(_lost, _solved, what="items the source solved", noise=_lost_on_rerun)
    return {
        accuracy: Metric(
            True,
            True,
            "fraction of items correct",
            mean("correct"),
            detectable=_losses("fraction"),
            sums=Sums(lambda a, s: a["correct"], ones, (0.0, 1.0)),
            events=Events(_wrong, _every, offset=1.0, sign=-1.0),
            recovery=Events(
                _lost, _solved, offset=1.0, sign=-1.0, what="items the source solved", noise=_lost_on_rerun
            ),
        ),
        "flip_rate": Metric(
            False,
            False,
            "fraction of items whose correctness changed against the source, either way",
            lambda a, s, axis: np.mean(a["correct"] != s["correct"], axis=axis),
            detectable=_any_flip,
            sums=Sums(lambda a, s: (a["correct"] != s["correct"]).astype(float), ones, (0.0, 1.0)),
            events=Events(lambda a, s: a["correct"] != s["correct"], _every),
        ),
        "flips_lost": Metric(
            False,
            False,
            "items the source got right and the artifact got wrong",
            lambda a, s, axis: np.sum((s["correct"] > 0) & (a["correct"] == 0), axis=axis).astype(float),
            detectable=_losses("count"),
            events=Events(_lost, _every, count=True),
        ),
        "flip_loss_rate": Metric(
            False,
            False,
            "fraction of the items the source got right that the artifact got wrong",
            lambda a, s, axis: (
                np.sum((s["correct"] > 0) & (a["correct"] == 0), axis=axis)
                / np.sum(s["correct"] > 0, axis=axis)
            ),
            uninformative="base is 0 (it solves none of these items), so no answer can be lost",
            detectable=_losses("rate"),
            sums=Sums(
                lambda a, s: ((s["correct"] > 0) & (a["correct"] == 0)).astype(float),
                lambda a, s: (s["correct"] > 0).astype(float),
                (0.0, 1.0),
            ),
            events=solved,
        ),
        f"{accuracy}_delta": Metric(
            True,
            False,
            "paired accuracy difference, artifact minus source (the gate holds it to lost answers only)",
            lambda a, s, axis: np.mean(a["correct"], axis=axis) - np.mean(s["correct"], axis=axis),
            detectable=_losses("fraction"),
            sums=Sums(lambda a, s: a["correct"] - s["correct"], ones, (-1.0, 1.0)),
            events=Events(_lost, _every, sign=-1.0),
        ),
    }


def _lost(a: Columns, s: Columns) -> np.ndarray:
    """An answer the source got right and the artifact got wrong."""
    return (np.asarray(s["correct"]) > 0) & (np.asarray(a["correct"]) == 0)


def _lost_on_rerun(s: Columns) -> np.ndarray:
    """An answer the source got right and its own re-evaluation got wrong (``RERUN``)."""
    return (np.asarray(s["correct"]) > 0) & (np.asarray(s[f"correct_{RERUN}"]) == 0)


def record_columns(suite, sample: Mapping[str, Any]) -> dict[str, Any]:
    """A record's columns as its kind reads them (``SuiteKind.columns``), and, for a source record
    that carries its re-evaluation (``RERUN``), that record's columns suffixed ``_rerun``."""
    cols = dict(suite.columns(sample))
    again = sample.get(RERUN)
    if isinstance(again, Mapping):
        cols.update({f"{k}_{RERUN}": v for k, v in suite.columns(again).items()})
    return cols


def _wrong(a: Columns, s: Columns) -> np.ndarray:
    """An answer the artifact got wrong."""
    return np.asarray(a["correct"]) == 0


def _solved(s: Columns) -> np.ndarray:
    """The items the source solved: those an answer can be lost on."""
    return np.asarray(s["correct"]) > 0


def _every(s: Columns) -> np.ndarray:
    """Every item."""
    return np.ones(len(np.asarray(s["correct"])), dtype=bool)
