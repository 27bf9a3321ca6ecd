"""Run nothing that cannot change a verdict.

Two reasons to skip a suite for an artifact, both decided by the gate's own rules
(``quantgate.gate.floor``), so that a skipped suite is judged exactly as if it had run:

- **No floor on it can be decided.** Power is known from the source's reference before any
  artifact is scored (``floor.plan``): a required floor without power fails the verdict whatever
  the artifact does, and an advisory one cannot fail it unless the worst the items could show
  would establish a violation. A suite all of whose floors, for every tenant, are of those kinds
  is not run on any artifact (on the 135 M default: GSM8K and HumanEval, whose source solves
  almost none of the smoke items, about 3 of an artifact's 5 smoke minutes).
- **Every tenant has already failed.** Suites run cheapest first (``SuiteKind.cost``); after
  each, the floors decided so far are judged, and once every tenant gating the artifact has a
  floor that fails it, the rest are skipped (a damaged artifact once spent 23 minutes generating
  to the token limit after its text floors had failed every tenant).

A skipped suite is recorded with its reason (``"skipped"`` in its result), and the gate reports
its floors as the plan says (insufficient evidence) or ``not_run``, never as a pass.
Regression floors need the approved version, which evaluation does not know: they always count
as decidable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quantgate.contracts.results import SuiteResultFile
from quantgate.evaluate.sequential import Watch
from quantgate.evaluate.suites import LoadedSuite, SuiteResult


def decidable(watch: Watch, suite: LoadedSuite, source: SuiteResult) -> bool:
    """Whether scoring an artifact on ``suite`` could change ``watch``'s effect on its verdict."""
    from quantgate.declarations.metrics import record_columns
    from quantgate.gate import can_change_verdict, plan
    from quantgate.stats.sequence import ordered_columns

    floor = watch.floor
    measure = suite.runner.metrics().get(floor.metric)
    if measure is None or floor.kind == "max_regression":
        return True
    try:
        s = ordered_columns(suite.runner, source.samples, record_columns)
        p = plan(floor, measure, s, confidence=watch.confidence)
    except KeyError:  # items the source could not be evaluated on: the gate reports the error
        return True
    if isinstance(p, str):  # no bound at all (the source solves none of the items): the gate says
        return False  # insufficient evidence whatever the artifact does
    return can_change_verdict(p, advisory=floor.advisory)


def unneeded(watches: Sequence[Watch], suite: LoadedSuite, source: SuiteResult) -> str | None:
    """Why no floor on ``suite`` can change a verdict (None: some can, or none watches it)."""
    if not watches or any(decidable(w, suite, source) for w in watches):
        return None
    tenants = sorted({w.tenant for w in watches})
    return (
        f"no floor on it can change a verdict: every floor's power is known from the source's "
        f"reference and none has it ({', '.join(tenants)})"
    )


def every_tenant_failed(
    watches_by_suite: Mapping[str, Sequence[Watch]],
    suites: Mapping[str, LoadedSuite],
    source: Mapping[str, SuiteResultFile],
    done: Mapping[str, SuiteResultFile],
    tenants: set[str],
) -> str | None:
    """Why the rest of an artifact's suites cannot change its verdicts: every tenant in ``tenants``
    has a floor on a suite already scored (``done``) that fails it. None: some tenant has not."""
    from quantgate.gate import BLOCKING, evaluate_floor

    if not tenants:
        return None
    failed: dict[str, str] = {}
    for name, result in done.items():
        for w in watches_by_suite.get(name, ()):
            if w.tenant in failed or w.floor.kind == "max_regression":
                continue
            res = evaluate_floor(
                w.floor, suites[name].runner, source.get(name), result, confidence=w.confidence
            )
            if res.status in BLOCKING:
                failed[w.tenant] = f"{w.tenant}: {name} {w.floor.metric} {res.status}"
    if not tenants <= failed.keys():
        return None
    return (
        "every tenant had already failed on suites scored before it ("
        + "; ".join(failed[t] for t in sorted(tenants))
        + ")"
    )
