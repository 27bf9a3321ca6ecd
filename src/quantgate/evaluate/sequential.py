"""Sequential evaluation: score a suite's items in a seeded random order, in batches, and stop
as soon as every floor reading the suite is decided for every tenant that uses it.

Why: most floors are decided long before the last item (a broken artifact's KL bound clears its
floor after a few windows), and a fixed-size design pays for every item anyway. The decisions
are the gate's always-valid ones (``quantgate.stats.sequence``): checked after every batch, they
keep the tenant's error rate. A suite stops with ``stopped: decided`` when every such floor is
decided, else runs out of items (``exhausted``: the fixed design's rules then decide, at the
confidence the early looks left). Floors with no sequential form (``max_regression``: the
approved version is the gate's to find) hold a suite to its last item, unless their tenant has
already failed here; a tenant that failed early holds nothing back.

Only suite kinds that can score a subset of their reference (``SuiteKind.subset``) run this
way; the others run all their items, as in the fixed design, and carry no ``sequential`` block.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quantgate.config import Floor, Gates
from quantgate.evaluate.suites import LoadedSuite, SuiteResult
from quantgate.stats import ItemRange

BATCH_MIN = 4  # items per batch at least (the suite's own batch size when larger)
# The design when neither --sequential nor --fixed is given. Sequential since its verdicts equalled
# the fixed design's on every run compared and its false-pass rate held in simulation (BENCHMARKS.md,
# "Sequential evaluation"); a passing artifact costs the same either way, a failing one less.
DEFAULT = True


@dataclass(frozen=True)
class Watch:
    """A floor to decide on this suite, the confidence of the tenant it belongs to, and the class
    its confidence covers (gates.yaml ``item_range``)."""

    tenant: str
    floor: Floor
    confidence: float
    item_range: ItemRange = field(default_factory=ItemRange)


def watched(gates: Gates, suite: str, artifact: str, tenants: list[str] | None = None) -> list[Watch]:
    """Every floor on ``suite`` that gates ``artifact``, for every tenant using it (``tenants``: only these)."""
    return [
        Watch(name, f, t.confidence, gates.item_range.stated())
        for name, t in gates.tenants.items()
        if (tenants is None or name in tenants) and (t.applies_to is None or artifact in t.applies_to)
        for f in t.floors
        if f.suite == suite and f.applies(artifact)
    ]


def order(suite: LoadedSuite, n: int) -> list[int]:
    """The suite's items in a fixed random order, seeded by the suite's seed and name."""
    digest = hashlib.sha256(f"{suite.spec.seed}|{suite.spec.name}".encode()).digest()
    return [int(i) for i in np.random.default_rng(int.from_bytes(digest[:8], "big")).permutation(n)]


def undecided(
    watches: Sequence[Watch], suite: LoadedSuite, source: SuiteResult, samples: list[dict]
) -> list[str]:
    """The floors that still need items after ``samples``, as "tenant: suite metric kind" (empty: stop).

    A floor decided by its confidence sequence needs no more. A floor with no sequential form (a
    ``max_regression``, whose approved version only the gate knows; a metric without declared
    ranges) needs every item, so that the gate never bounds it on a subset whose size depended on
    when the others were decided: unless its tenant has already failed on a floor decided here,
    when nothing it shows can change that tenant's verdict.
    """
    from quantgate.declarations.metrics import record_columns
    from quantgate.stats import sequence

    design = source.sampling or {}
    open_floors, failed = [], set()
    for w in watches:
        got = sequence.check(
            w.floor,
            suite.runner,
            source.samples,
            samples,
            w.confidence,
            item_range=w.item_range,
            population=design.get("population"),
            weights=design.get("weights"),
            ends=False,
            columns=record_columns,
        )
        if isinstance(got, str) or got.decision == "undecided":
            open_floors.append(w)
        elif got.decision == "fail":
            failed.add(w.tenant)
    return [
        f"{w.tenant}: {w.floor.suite} {w.floor.metric} {w.floor.kind} {w.floor.value:g}"
        for w in open_floors
        if w.tenant not in failed
    ]


def run(
    suite: LoadedSuite,
    source: SuiteResult,
    watches: Sequence[Watch],
    n: int,
    score: Callable[[list[int]], list[dict[str, Any]]],
    *,
    batch: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Score items in ``order`` ``batch`` at a time with ``score`` (positions -> per-item records,
    each with its ``item`` id) until ``undecided`` is empty or items run out.

    Returns the records in evaluation order and the ``sequential`` block the gate reads: order,
    items used and in all, why it stopped, seconds taken and the estimate for every item.
    """
    positions = order(suite, n)
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    left = ["no item scored yet"]
    used = 0
    while used < n:
        chunk = positions[used : used + batch]
        samples.extend(score(chunk))
        used += len(chunk)
        left = undecided(watches, suite, source, samples)
        if not left and watches:
            break
    seconds = time.perf_counter() - started
    stopped = "decided" if not left and watches else "exhausted"
    design = {
        "design": "sequential",
        "order_seed": f"{suite.spec.seed}|{suite.spec.name}",
        "batch": batch,
        "items_used": used,
        "items_total": n,
        "stopped": stopped,
        "undecided": [] if stopped == "decided" else left,
        "seconds": seconds,
        "seconds_all_estimate": seconds * n / max(used, 1),
        "seconds_saved_estimate": seconds * (n - used) / max(used, 1),
        "floors": len(watches),
    }
    return samples, design
