"""Sequential evaluation's early decisions: the gate's own test (``forms``, ``betting``), looked at
after every batch.

Why: a suite evaluated in batches and stopped as soon as its floors are decided looks at its data
many times. The betting test's capital is a supermartingale under "the floor does not hold", so by
Ville's inequality it ever reaches 1 / alpha with probability at most alpha: looking after every
batch and stopping at the first decision does not inflate the error (Waudby-Smith & Ramdas 2023).
It is the same test the fixed design reads once at the end, on the same class (``linear``).

Assumptions (say them where the gate is documented): the class the floor states (per-item values
within its range; an item beyond it fails the floor at once), and items in a uniformly random
order: the suite's items were drawn at random from their population and are evaluated in a fixed
seeded random order, so each next item is a uniform draw from those left. Regression floors
(``max_regression``, whose approved version the evaluation does not know) are never decided early:
their suite runs all its items, and the fixed design decides them.

Budget: the sequential design spends ``SHARE`` of the tenant's error rate 1 - c on early
decisions and the rest on the fixed design's test when a suite runs out of items, so a false
pass has probability at most (1 - c) by the union bound (tests/unit/gate/test_sequential_simulation.py).
numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from quantgate.stats import forms
from quantgate.stats.linear import ItemRange

SHARE = 0.1  # of 1 - confidence, spent on early (sequential) decisions; the rest on the final fixed test
Decision = Literal["pass", "fail", "undecided"]


def early_alpha(confidence: float) -> float:
    """The error rate early decisions may spend: ``SHARE`` of 1 - confidence."""
    return SHARE * (1.0 - confidence)


def final_confidence(confidence: float) -> float:
    """The fixed design's confidence when a sequential suite ran out of items: 1 - (1 - SHARE)(1 - c)."""
    return 1.0 - (1.0 - SHARE) * (1.0 - confidence)


@dataclass(frozen=True)
class Sequential:
    """One floor's sequential state after the items seen: decision, when, estimate, ends."""

    decision: Decision
    items: int  # items seen
    at: int | None  # after how many items it was decided
    upper: float  # the conservative end (the side a pass needs), in the floor's units
    lower: float  # the other end
    note: str = ""


def decide(form: forms.Form, a: dict, s: dict, alpha: float, *, ends: bool = True) -> Sequential:
    """The floor's items so far (``a``, ``s``: artifact and source columns in evaluation order) tested
    at ``alpha``: pass when "the floor does not hold" is rejected, fail when "it holds" is or an item
    lies beyond the class, whichever came first; ``ends=False`` skips the interval (simulations)."""
    lin = form.linear(a, s)
    n = len(lin.u)
    if n == 0:
        return Sequential("undecided", 0, None, math.inf, -math.inf, "no items yet")
    passed, failed = lin.first_pass(alpha), lin.first_fail(alpha)
    conservative, other = lin.ends(alpha) if ends else (math.inf, -math.inf)
    note = f"item {int(lin.beyond[0])} lies beyond the class ({form.class_text()})" if lin.beyond.size else ""
    if passed is not None and (failed is None or passed <= failed):
        return Sequential("pass", n, passed, conservative, other, note)
    if failed is not None:
        return Sequential("fail", n, failed, conservative, other, note)
    return Sequential("undecided", n, None, conservative, other, note)


def ordered_columns(suite, samples: list[dict], columns=None) -> dict[str, np.ndarray]:
    """Per-item records as numeric columns, in the order given (the evaluation order). ``columns``:
    (suite, record) -> its columns (default: the suite kind's own; ``metrics.record_columns`` adds a
    source's re-evaluation, which this module does not know about)."""
    rows = [columns(suite, r) if columns is not None else suite.columns(r) for r in samples]
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


def check(
    floor,
    suite,
    source: list[dict],
    samples: list[dict],
    confidence: float,
    *,
    item_range: ItemRange | None = None,
    population: int | None = None,
    weights=None,
    ends: bool = True,
    columns=None,
) -> Sequential | str:
    """One floor after the artifact's ``samples`` so far (in evaluation order), against the source's
    per-item records (``source``: of the same items and, for the class, of every item): the
    always-valid decision at ``early_alpha(confidence)``. A string: why this floor has no
    sequential form."""
    measure = suite.metrics().get(floor.metric)
    if measure is None:
        return f"the suite has no metric {floor.metric}"
    if floor.kind == "max_regression":
        return "a regression floor needs the approved version, which evaluation does not know"
    by_item = {str(r["item"]): r for r in source}
    try:
        paired = [by_item[str(r["item"])] for r in samples]
        a, s = ordered_columns(suite, samples, columns), ordered_columns(suite, paired, columns)
        s_all = ordered_columns(suite, list(by_item.values()), columns)
        form = forms.floor_form(
            floor.kind,
            floor.value,
            measure,
            s_all,
            item_range or ItemRange(),
            name=floor.metric,
            weights=weights,
            population=population,
        )
    except KeyError as exc:  # an item not evaluated, a field missing: the fixed design reports it
        return f"per-item records lack {exc}"
    if isinstance(form, str):
        return form
    return decide(form, a, s, early_alpha(confidence), ends=ends)
