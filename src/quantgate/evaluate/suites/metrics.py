"""What a suite kind declares about its metrics, so that the gate needs no code per kind.

Each kind says, for every metric a gate floor may name: which way is better; whether it is a
*level* (a property of one model, such as perplexity or accuracy, so a ratio with the source's
level means something) or already a *comparison* with the source (KL divergence, agreement,
flips); the per-item statistic, paired item by item with the source (none: the suite's
reported value is all there is, a point estimate); and when the source's level is a base a
ratio can be taken against. Per-item records become numeric columns through the kind's
``columns``. numpy only: the gate imports this without torch.

Items that could not be evaluated (no sandbox for a program, a harness that returned nothing
for an item, a generation that crashed) are never scored as wrong answers: the per-item record
carries ``"error": "<reason>"`` (key ``ERROR``) and no value, ``item_error`` reads it, every
kind's ``columns`` raises ``ItemError`` for such a record, and ``SuiteResult.errors`` counts
them by reason. A floor on a suite with any such item has no evidence on those items: the gate
reports it as ``error`` (with the reasons), never as a pass or a fail.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Columns = dict[str, np.ndarray]
# (artifact columns, source columns, axis) -> the statistic along axis (vectorized over resamples)
Statistic = Callable[[Columns, Columns, int], np.ndarray]


ERROR = "error"  # per-item record key: why the item could not be evaluated (absent when it was)


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
class Metric:
    """One metric a floor may name: direction, level or comparison, statistic, when informative."""

    higher_is_better: bool
    level: bool  # True: ratio floors (max_delta_pct, min_recovery) apply; False: only max / min
    how: str  # how the estimate is computed, for the reason sentence
    statistic: Statistic | None = None  # None: point only, the suite's reported value
    informative: Callable[[np.ndarray], np.ndarray] = nonzero  # on the source's level, for ratio floors
    uninformative: str = "is 0, so the ratio is undefined (0/0 or x/0)"  # why, after "the source's <metric>"

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


def correctness(accuracy: str) -> dict[str, Metric]:
    """The metrics of a suite scored right/wrong per item (column ``correct``), paired with the source."""
    return {
        accuracy: Metric(True, True, "fraction of items correct", mean("correct")),
        "flip_rate": Metric(
            False,
            False,
            "fraction of items whose correctness changed against the source",
            lambda a, s, axis: np.mean(a["correct"] != s["correct"], axis=axis),
        ),
        "flips_lost": Metric(
            False,
            False,
            "items the source got right and the artifact got wrong",
            lambda a, s, axis: np.sum((s["correct"] > 0) & (a["correct"] == 0), axis=axis).astype(float),
        ),
        f"{accuracy}_delta": Metric(
            True,
            False,
            "paired accuracy difference, artifact minus source",
            lambda a, s, axis: np.mean(a["correct"], axis=axis) - np.mean(s["correct"], axis=axis),
        ),
    }
