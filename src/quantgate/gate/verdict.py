"""The verdict: a pure function of (source results, artifact results, floors, approved version) -> decision.

Pure and exact, so that a verdict is reproducible byte for byte and each rule is tested without a
model (tests/unit/gate/): each floor is planned, measured and decided by ``gate/floor.py`` (the
bound that fits its per-item statistic, ``quantgate.stats``; power judged before the artifact is
seen; an estimate beyond its floor is a violation at every sample size), nothing rounded; missing
data and items that could not be evaluated fail. ``evaluate_floor`` reads one floor's records and
describes its result, ``judge`` makes a verdict of a tenant's floors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from quantgate.config import Floor, Gates, Tenant
from quantgate.contracts.report_schema import STATUS_TEXT, BaselineRef, FloorResult, Status, Verdict
from quantgate.contracts.results import SuiteResultFile
from quantgate.declarations.metrics import Metric, record_columns
from quantgate.gate import floor as floor_step
from quantgate.gate.floor import INTERVAL_NAME, Before
from quantgate.stats import ItemRange, sequence

if TYPE_CHECKING:
    from quantgate.declarations import SuiteDeclaration

__all__ = ["Before", "evaluate_floor", "gate", "judge", "no_evidence"]

_LABELS = {
    "max_delta_pct": " change vs source (%)",
    "min_recovery": " recovery (artifact/source)",
    "max_regression": " regression vs the approved version",
}
BLOCKING: tuple[Status, ...] = ("fail", "missing", "error", "not_run")


def _fmt(x: float, other: float | None = None) -> str:
    short = f"{x:.6g}"
    if other is not None and x != other and short == f"{other:.6g}":
        return repr(float(x))
    return short


def _as_column(values: list[Any]) -> np.ndarray:
    """Per-item values as one column: numbers, or an object array of per-item lists (pooled statistics)."""
    if values and isinstance(values[0], (list, tuple, np.ndarray)):
        column = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            column[i] = np.asarray(v, dtype=float)
        return column
    return np.asarray(values, dtype=float)


def _rows(suite: SuiteDeclaration, result: SuiteResultFile) -> dict[str, Mapping[str, Any]]:
    return {str(r["item"]): record_columns(suite, r) for r in result.samples}


def _aligned(
    suite: SuiteDeclaration, source: SuiteResultFile, artifact: SuiteResultFile, old: SuiteResultFile | None
) -> tuple[dict, dict, dict | None, int] | str:
    """Per-item columns of artifact, source and (a regression's) approved version, aligned by item;
    a string says what is missing or does not pair."""
    src, art = source.samples, artifact.samples
    if not src or not art:
        return f"no per-item records ({'source' if not src else 'artifact'})"
    try:
        s_rows, a_rows = _rows(suite, source), _rows(suite, artifact)
        o_rows = _rows(suite, old) if old is not None else None
    except KeyError as exc:
        return f"per-item records lack field {exc}"
    if s_rows.keys() != a_rows.keys():
        shared = len(a_rows.keys() & s_rows.keys())
        return f"items do not pair ({len(a_rows)} artifact, {len(s_rows)} source, {shared} shared)"
    keys = sorted(a_rows, key=_item_order)
    names = [c for c in a_rows[keys[0]] if c in s_rows[keys[0]]]
    # the source's own re-evaluation, where every source record carries it (a device that flips answers)
    names += [c for c in s_rows[keys[0]] if c.endswith("_rerun") and all(c in s_rows[k] for k in keys)]

    def columns(rows: dict[str, Mapping[str, Any]]) -> dict:
        return {c: _as_column([rows[k][c] for k in keys]) for c in names if c in rows[keys[0]]}

    o = None
    if o_rows is not None:
        if o_rows.keys() != a_rows.keys():
            return (
                f"the approved version's records hold other items ({len(o_rows)} there, {len(a_rows)} here)"
            )
        o = columns(o_rows)
    return columns(a_rows), columns(s_rows), o, len(keys)


def _item_order(key: str) -> tuple[int, int | str]:
    """Items in the order they were drawn: numeric ids as numbers (a draw's order), others by name."""
    return (0, int(key)) if key.lstrip("-").isdigit() else (1, key)


def _errors(suite: SuiteDeclaration, source: SuiteResultFile, artifact: SuiteResultFile) -> str | None:
    """Why items of this suite could not be evaluated (no sandbox, harness error, missing data), as
    the kind reads its records (``SuiteDeclaration.item_error``) and its result counts them (``errors``);
    None: every item was."""
    found = []
    for who, res in (("source", source), ("artifact", artifact)):
        samples = res.samples
        bad = [(r.get("item"), why) for r in samples if (why := suite.item_error(r)) is not None]
        if bad:
            found.append(
                f"{len(bad)} of {len(samples)} {who} items could not be evaluated (item {bad[0][0]}: {bad[0][1]})"
            )
        elif res.errors:
            counts = "; ".join(f"{n} × {why}" for why, n in res.errors.items())
            found.append(f"{who} items could not be evaluated: {counts}")
    return "; ".join(found) or None


def as_result(result: SuiteResultFile | Mapping[str, Any]) -> SuiteResultFile:
    """A suite result as the contract types it (a dict, as tests and hand-made results give one,
    validated here; ``read_evaluation`` gives the model already)."""
    return result if isinstance(result, SuiteResultFile) else SuiteResultFile.model_validate(result)


def _quantity(to_quantity: Callable[[float], float], u: float) -> float:
    """An item's value in the floor's units where the form maps it there, else as the test sees it."""
    q = to_quantity(u)
    return q if math.isfinite(q) else u


def _percent(confidence: float) -> str:
    return f"{confidence:.1%}" if round(confidence * 100) != confidence * 100 else f"{confidence:.0%}"


def _describe(
    floor: Floor,
    p: floor_step.Plan,
    m: floor_step.Measured,
    d: floor_step.Decision,
    *,
    confidence: float,
    used: str,
    result: Callable[..., FloorResult],
    was: float | None,
    measure_how: str,
) -> FloorResult:
    """The reason sentence and the report's fields for a decided floor: every end shown names which
    end it is, every confidence what it covers."""
    iv = m.interval
    assert iv is not None
    kind, limit = floor.kind, p.limit
    side = "upper" if p.upper else "lower"
    other_side = "lower" if p.upper else "upper"
    pct = _percent(confidence)
    end, other = iv.end(p.upper), iv.other(p.upper)
    cmp = ("<=" if d.within else ">") if p.upper else (">=" if d.within else "<")
    quantity = "regression " if kind == "max_regression" else ""
    end_text = _fmt(end, limit) if math.isfinite(end) else "beyond the class"
    shown = (
        f"{quantity}estimate {_fmt(iv.estimate)}, {pct} {side} end {end_text} {cmp} {kind} {_fmt(limit, end)}"
    )
    if p.compare:
        shown = f"{p.compare}: {shown}"
    if "gains do not offset" in p.quantity:
        shown = f"{p.quantity}: {shown}"
    resolution = (
        f", an unchanged artifact's {side} end {_fmt(p.mde)} from no change (tolerance {_fmt(p.tolerance)})"
        if p.mde is not None
        else ""
    )
    power = f"power: {p.evidence}{resolution}"
    how = f"{iv.method}; {measure_how}{used}; covers: {p.coverage}"
    margin = (limit - end if p.upper else end - limit) if math.isfinite(end) else None
    status = d.status
    if status == "pass":
        reason = f"{shown}: pass (margin {_fmt(margin or 0.0)}; {power}; {how})"
    elif m.beyond and status in ("fail", "violation"):
        shown_at = p.form.to_quantity if p.form is not None else (lambda u: u)
        items = ", ".join(f"item {i} at {_fmt(_quantity(shown_at, v))}" for i, v in m.beyond)
        why = f"{items} beyond the stated class ({p.form.class_text() if p.form else 'its range'}): damage a mean must not hide"
        reason = f"{shown}: FAIL ({why}; {power}; {how})"
    elif status == "fail" and d.beyond and not (p.powered and not d.within):
        why = (
            f"even the {other_side} end {_fmt(other)} is beyond it"
            if d.established
            else "the estimate itself is beyond the floor"
        )
        reason = f"{shown}: FAIL ({why}; {power}; {how})"
    elif status == "fail":
        reason = f"{shown}: FAIL (margin {_fmt(margin) if margin is not None else '-inf'}; {power}; {how})"
    elif status == "violation":
        reason = (
            f"{shown}: VIOLATION (the estimate is beyond the floor, but {p.evidence} cannot establish it "
            f"at {pct}; {how})"
        )
    elif p.noisy and p.powered:
        reason = (
            f"insufficient evidence: {shown}; the evaluation flips answers by itself, and on these items "
            f"the artifact is neither shown within the floor nor beyond it ({power}; {how})"
        )
    else:
        reason = (
            f"insufficient evidence: {shown}; an artifact equal to the source would not pass on these "
            f"items ({power}; {how})"
        )
    delta = None
    if was is not None and kind != "max_regression":
        delta = iv.estimate - was
    elif kind == "max_regression":
        delta = iv.estimate
    return result(
        status,
        reason,
        estimate=iv.estimate,
        bound=end if math.isfinite(end) else None,
        items=iv.items,
        interval=INTERVAL_NAME[p.family] if math.isfinite(end) else None,
        mde=p.mde,
        tolerance=p.tolerance,
        no_change=p.no_change,
        before=p.before_value if kind == "max_regression" else was,
        delta=delta,
        evidence=p.evidence if status in ("insufficient_evidence", "violation") else None,
        other=other if math.isfinite(other) else None,
        method=iv.method,
        powered=p.powered,
        paired_with=p.compare or None,
        upper=p.upper,
        limit=limit,
        end=side if math.isfinite(end) else None,
        coverage=p.coverage or None,
    )


@dataclass(frozen=True)
class _FloorContext:
    """What every result of one floor carries: the floor, the confidence the tenant asked for (a
    sequential evaluation's early looks spend part of it, the result still names it) and the
    bound's measured machine-to-machine spread."""

    floor: Floor
    confidence: float
    spread: float | None
    item_range: ItemRange = field(default_factory=ItemRange)

    @property
    def label(self) -> str:
        return f"{self.floor.suite} {self.floor.metric}" + _LABELS.get(self.floor.kind, "")

    def result(
        self, status: Status, reason: str, *, upper: bool = True, limit: float | None = None, **fields: Any
    ) -> FloorResult:
        """The report's record of this floor: its margin and, within the spread, the marginal mark;
        undefined numbers absent, never NaN."""
        floor, spread = self.floor, self.spread
        bound = fields.pop("bound", None)
        at = floor.value if limit is None else limit
        margin = None
        if bound is not None and math.isfinite(bound) and status in ("pass", "fail"):
            margin = at - bound if upper else bound - at
        if status in ("insufficient_evidence", "violation") and floor.advisory:
            reason += " (advisory: does not fail the verdict)"
        marginal = margin is not None and spread is not None and abs(margin) <= spread
        if margin is not None and spread is not None and marginal:
            reason += (
                f" [MARGINAL: the bound is {_fmt(abs(margin))} from the floor, within the measured "
                f"machine-to-machine spread {_fmt(spread)}; another machine may decide otherwise]"
            )
        finite = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in fields.items()
        }
        return FloorResult(
            suite=floor.suite,
            metric=floor.metric,
            kind_of_floor=floor.kind,
            floor=floor.value,
            confidence=self.confidence,
            advisory=floor.advisory,
            bound=bound if bound is not None and math.isfinite(bound) else None,
            margin=margin,
            passed=_PASSED.get(status),
            informative=status in ("pass", "fail"),
            status=status,
            reason=f"{self.label}: {reason}",
            spread=spread,
            marginal=marginal,
            **({"items": 0, "interval": None, "estimate": None} | finite),
        )


_PASSED: dict[str, bool] = {"pass": True, "fail": False, "missing": False, "error": False, "not_run": False}


@dataclass(frozen=True)
class _Records:
    """One floor's checked records, as the next step decides on them: the suite's measure, the
    paired records, the confidence left for this floor and what the sequential design used."""

    suite: SuiteDeclaration
    measure: Metric
    source: SuiteResultFile
    artifact: SuiteResultFile
    confidence: float
    used: str = ""

    def statistic(self, artifact: dict, source: dict) -> float:
        """The floor's statistic on paired columns (``_checked`` admits only measures that have one)."""
        assert self.measure.statistic is not None
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(self.measure.statistic(artifact, source, -1))


def evaluate_floor(
    floor: Floor,
    suite: SuiteDeclaration | None,
    source: SuiteResultFile | Mapping[str, Any] | None,
    artifact: SuiteResultFile | Mapping[str, Any] | None,
    *,
    confidence: float = 0.95,
    before: Before | None = None,
    spread: float | None = None,
    item_range: ItemRange | None = None,
) -> FloorResult:
    """One floor for one artifact: its records read and checked, planned, measured, decided, described.

    - Missing fails: a suite not evaluated, a reported metric of None, no per-item records,
      records missing a field, or items that do not pair give a reason beginning "missing".
    - Errors fail: any item (source or artifact) recorded with ``"error": "<reason>"`` (it
      could not be evaluated: no sandbox, harness error, missing data) makes the floor ``error``.
    - Sequential evaluation: a floor its confidence sequence decided early reports that decision;
      the others are bounded at the confidence the early looks left (``sequence.final_confidence``).
    - ``max_regression``: with no approved version it is ``no_baseline`` (neither pass nor fail);
      with one that cannot be compared (another profile; records on other items), insufficient.
    - Marginal: ``spread`` is how far this bound moves between machines (measured, ``gates.yaml``
      ``numerics_spread``). A pass or fail whose bound is within it of the floor keeps its status
      and is marked ``marginal``, its reason saying so.

    Three steps, each a value in and a value out, any of which may end with the floor's result:
    ``_checked`` (the records exist and every item was evaluated), ``_after_early_looks`` (what a
    sequential evaluation decided or left), ``_decided`` (the fixed design's bound).
    """
    context = _FloorContext(floor, confidence, spread, item_range or ItemRange())
    checked = _checked(context, suite, source, artifact)
    if isinstance(checked, FloorResult):
        return checked
    records = _after_early_looks(context, checked)
    if isinstance(records, FloorResult):
        return records
    return _decided(context, records, before)


def _checked(
    context: _FloorContext,
    suite: SuiteDeclaration | None,
    source: SuiteResultFile | Mapping[str, Any] | None,
    artifact: SuiteResultFile | Mapping[str, Any] | None,
) -> _Records | FloorResult:
    """The floor's measure and both records, or why the floor cannot be measured: missing, an
    error, or not run."""
    floor, result = context.floor, context.result
    measure = suite.metrics().get(floor.metric) if suite is not None else None
    if suite is None or measure is None or measure.statistic is None:
        kind_name = suite.spec.kind if suite is not None else "unknown: no such suite in the project"
        return result(
            "missing", f"missing: the gate has no measure '{floor.metric}' for suite kind '{kind_name}'"
        )
    if source is None:
        return result("missing", "missing: suite not evaluated for the source")
    if artifact is None:
        return result("missing", "missing: suite not evaluated for the artifact")
    src, art = as_result(source), as_result(artifact)
    errors = _errors(suite, src, art)
    if errors:  # before a skipped suite: the source's own items not evaluated are an error either way
        return result("error", f"error: {errors}; a floor on items that were not evaluated cannot pass")
    if art.skipped:
        return _not_run(context, measure, suite, src, art.skipped)
    for who, res in (("source", src), ("artifact", art)):
        if floor.metric in res.metrics and res.metrics.get(floor.metric) is None:
            return result("missing", f"missing: the {who}'s reported {floor.metric} is None")
    return _Records(suite, measure, src, art, context.confidence)


def _after_early_looks(context: _FloorContext, records: _Records) -> _Records | FloorResult:
    """A sequentially evaluated artifact (evaluate/sequential.py): the floor its confidence
    sequence decided, or the records the fixed design bounds at the confidence left after the
    early looks (the source trimmed to the items the artifact used)."""
    design = records.artifact.sequential
    if design is None:
        return records
    used = f"; sequential: {design.items_used} of {design.items_total} items, stopped: {design.stopped}"
    final = sequence.final_confidence(records.confidence)
    if design.stopped != "decided":
        return replace(records, confidence=final, used=used)
    floor, suite, artifact = context.floor, records.suite, records.artifact
    drawn = records.source.sampling
    decided = sequence.check(
        floor,
        suite,
        records.source.samples,
        artifact.samples,
        records.confidence,
        item_range=context.item_range,
        population=drawn.population if drawn else None,
        weights=drawn.weights if drawn else None,
    )
    items = {str(r.get("item")) for r in artifact.samples}
    source = records.source.model_copy(
        update={"samples": [r for r in records.source.samples if str(r.get("item")) in items]}
    )
    if isinstance(decided, str) or decided.decision == "undecided":
        note = decided if isinstance(decided, str) else "undecided"
        used += f" (this floor on those items with the fixed design: {note})"
        return replace(records, source=source, confidence=final, used=used)
    aligned = _aligned(suite, source, artifact, None)
    estimate = None if isinstance(aligned, str) else records.statistic(aligned[0], aligned[1])
    return _sequential_result(
        context.result, floor, decided, records.confidence, label_used=used, estimate=estimate
    )


def _regression_refused(
    context: _FloorContext, records: _Records, before: Before | None
) -> FloorResult | None:
    """A ``max_regression`` floor with nothing to regress from: no approved version (neither pass
    nor fail), or one that cannot be compared (insufficient evidence); None when it can be."""
    if before is None:
        aligned = _aligned(records.suite, records.source, records.artifact, None)
        value = (
            ""
            if isinstance(aligned, str)
            else f"; this artifact's {context.floor.metric} is {_fmt(records.statistic(aligned[0], aligned[1]))}"
        )
        return context.result(
            "no_baseline",
            f"no approved version to compare with (a first release, or the approved version is this "
            f"artifact){value}: neither pass nor fail",
        )
    if before.problem is not None:
        return context.result(
            "insufficient_evidence",
            f"insufficient evidence: cannot compare with {before.label}: {before.problem}",
            evidence=f"approved version not comparable: {before.problem}",
        )
    return None


def _decided(context: _FloorContext, records: _Records, before: Before | None) -> FloorResult:
    """The fixed design: the records paired by item (with the approved version's, when there are
    any), the floor planned on the source, measured on the artifact, decided and described."""
    floor, result, measure = context.floor, context.result, records.measure
    kind = floor.kind
    if kind == "max_regression" and (refused := _regression_refused(context, records, before)):
        return refused
    comparable = before is not None and before.problem is None
    old = as_result(before.records) if before is not None and comparable and before.records else None
    aligned = _aligned(records.suite, records.source, records.artifact, old)
    if isinstance(aligned, str) and old is not None and aligned.startswith("the approved version"):
        if kind == "max_regression":
            return result(
                "insufficient_evidence",
                f"insufficient evidence: cannot compare with {before.label if before else 'it'}: {aligned}",
                evidence=f"approved version not comparable: {aligned}",
            )
        aligned = _aligned(records.suite, records.source, records.artifact, None)  # by its reported value
    if isinstance(aligned, str):
        return result("missing", f"missing: {aligned}")
    a, s, o, n = aligned
    was = before.value if before is not None and comparable else None
    if o is not None and kind != "max_regression":  # the same statistic on its records: exact before/after
        was = records.statistic(o, s)
    try:
        p = floor_step.plan(
            floor,
            measure,
            s,
            confidence=records.confidence,
            before=before,
            old=o,
            item_range=context.item_range,
            sampling=records.source.sampling,
        )
        if isinstance(p, str):
            return result(
                "insufficient_evidence",
                f"insufficient evidence: {p}; nothing here can tell a good artifact from a broken one",
                items=n,
                evidence=p,
            )
        m = floor_step.measure(p, a, s, o)
    except KeyError as exc:
        return result("missing", f"missing: per-item records lack field {exc}", items=n)
    d = floor_step.decide(p, m, advisory=floor.advisory)
    return _describe(
        floor,
        p,
        m,
        d,
        confidence=records.confidence,
        used=records.used,
        result=result,
        was=was,
        measure_how=measure.how,
    )


def _not_run(
    context: _FloorContext, measure: Metric, suite: SuiteDeclaration, source: SuiteResultFile, why: str
) -> FloorResult:
    """A floor on a suite evaluation skipped: what its plan says where its power was known from the
    source alone (it could not change the verdict), else ``not_run``, which fails as missing data would."""
    floor, result = context.floor, context.result
    if floor.kind != "max_regression":
        try:
            s = _as_columns(suite, source)
            p = floor_step.plan(
                floor,
                measure,
                s,
                confidence=context.confidence,
                item_range=context.item_range,
                sampling=source.sampling,
            )
        except KeyError:
            return result("not_run", f"not run: {why}")
        if isinstance(p, str):  # no bound exists on these items whatever the artifact does
            return result(
                "insufficient_evidence",
                f"insufficient evidence: not run ({why}); {p}",
                evidence=f"{p} (known from the source: not run)",
                powered=False,
            )
        if not floor_step.can_change_verdict(p, advisory=floor.advisory):
            return result(
                "insufficient_evidence",
                f"insufficient evidence: not run ({why}); power: {p.evidence}, an artifact equal to the "
                f"source would not pass on these items",
                items=p.items,
                mde=p.mde,
                tolerance=p.tolerance,
                no_change=p.no_change,
                evidence=f"{p.evidence} (known from the source: not run)",
                powered=False,
                coverage=p.coverage,
            )
    return result("not_run", f"not run: {why}")


def _as_columns(suite: SuiteDeclaration, result: SuiteResultFile) -> dict:
    rows = _rows(suite, result)
    keys = sorted(rows, key=_item_order)
    names = list(rows[keys[0]]) if keys else []
    return {c: _as_column([rows[k][c] for k in keys]) for c in names}


def _sequential_result(
    result: Callable[..., FloorResult],
    floor: Floor,
    decided: sequence.Sequential,
    confidence: float,
    *,
    label_used: str,
    estimate: float | None,
) -> FloorResult:
    """A floor decided early: its decision, the end that decided it (named), the items it took.

    A pass shows the conservative end on the floor's side; a fail the other end beyond it (or the
    item beyond the class). ``estimate``: the floor's statistic on the items used, as the fixed
    design would show it on them.
    """
    level = _percent(1 - sequence.early_alpha(confidence))
    upper = floor.kind in ("max", "max_delta_pct")
    passed = decided.decision == "pass"
    worse, better = ("upper", "lower") if upper else ("lower", "upper")
    if passed:
        end, name = decided.upper, worse
        shown = f"{level} always-valid {name} end {_fmt(end)} {'<=' if upper else '>='} {floor.kind} {_fmt(floor.value)}"
    else:
        end, name = decided.lower, better
        shown = f"{level} always-valid {name} end {_fmt(end)} {'>' if upper else '<'} {floor.kind} {_fmt(floor.value)}"
        if decided.note:  # an item beyond the class decided it, whatever the ends say
            shown = f"{decided.note}; {level} always-valid {name} end {_fmt(end)}"
    if estimate is not None:
        shown = f"estimate {_fmt(estimate)}, {shown}"
    status: Status = "pass" if passed else "fail"
    return result(
        status,
        f"{shown}: {'pass' if passed else 'FAIL'} (betting test looked at after every batch, decided "
        f"after {decided.at} of {decided.items} items{label_used})",
        estimate=estimate,
        # a fail's bound is the end that establishes it (the other end), so its margin and marginal
        # mark come from the side that decided it
        bound=end if math.isfinite(end) else None,
        items=decided.items,
        interval="confidence-sequence" if math.isfinite(end) else None,
        upper=upper,
        method="betting test, always valid (looked at after every batch)",
        end=name if math.isfinite(end) else None,
    )


Results = Mapping[str, Mapping[str, SuiteResultFile]]  # model ("source" or a target) -> suite -> result


def judge(
    artifact: str,
    tenant_name: str,
    tenant: Tenant,
    results: Results,
    suites: Mapping[str, SuiteDeclaration],
    *,
    required: bool,
    baseline: tuple[BaselineRef, Callable[[Floor], Before]] | None = None,
    spread: Callable[[Floor], float | None] | None = None,
    item_range: ItemRange | None = None,
) -> Verdict:
    """One artifact against one tenant's floors (those that apply to its target).

    It passes only if no floor fails, is missing, errs or lacks evidence (unless that floor is
    advisory), and at least one floor passed with evidence: a pass always rests on some.
    ``baseline``: the approved version's reference and a floor's value in it; None: no approved
    version (max_regression floors report it, deltas are absent).
    """
    ref, lookup = baseline if baseline is not None else (None, None)
    floors = [
        evaluate_floor(
            f,
            suites.get(f.suite),
            results.get("source", {}).get(f.suite),
            results.get(artifact, {}).get(f.suite),
            confidence=tenant.confidence,
            before=lookup(f) if lookup is not None else None,
            spread=spread(f) if spread is not None else None,
            item_range=item_range,
        )
        for f in tenant.floors
        if f.applies(artifact)
    ]
    blocking = [
        f for f in floors if f.status in BLOCKING or (f.status == "insufficient_evidence" and not f.advisory)
    ]
    reasons = [f.reason for f in blocking]
    decided = [f for f in floors if f.status == "pass"]
    if not floors:
        reasons.append(f"no floor of tenant '{tenant_name}' applies to {artifact}: FAIL")
    elif not reasons and not decided:
        reasons.append("no floor passed with evidence (every one lacked it or had nothing to compare): FAIL")
    passed = not reasons
    quiet = [
        f for f in floors if f.status in ("insufficient_evidence", "no_baseline") and f.reason not in reasons
    ]
    if passed:
        extra = ""
        if quiet:
            counts: dict[str, int] = {}
            for f in quiet:
                counts[STATUS_TEXT[f.status]] = counts.get(STATUS_TEXT[f.status], 0) + 1
            extra = "; " + ", ".join(f"{k} {v}" for k, v in counts.items())
        reasons = [f"all {len(decided)} floors with evidence pass{extra}"] + [f.reason for f in quiet]
    return Verdict(
        artifact=artifact,
        tenant=tenant_name,
        verdict="pass" if passed else "fail",
        reasons=reasons,
        floors=floors,
        required=required,
        baseline=ref,
        # another machine may decide the verdict otherwise: a pass when any floor it rests on is
        # within the spread; a fail only when every floor failing it is (one clear failure holds)
        marginal=any(f.marginal for f in decided)
        if passed
        else bool(blocking) and all(f.marginal for f in blocking),
    )


def no_evidence(verdicts: list[Verdict]) -> dict[str, list[str]]:
    """Suites on which no floor, in any verdict, was decided with evidence: each distinct reason,
    with the metrics it held for (e.g. "1 item the source solved (flip_loss_rate, accuracy)"); a
    violation shown on too few items to establish it counts as no evidence too."""
    decided = {f.suite for v in verdicts for f in v.floors if f.status in ("pass", "fail")}
    why: dict[str, dict[str, list[str]]] = {}
    for v in verdicts:
        for f in v.floors:
            if f.status in ("insufficient_evidence", "violation") and f.suite not in decided:
                metrics = why.setdefault(f.suite, {}).setdefault(f.evidence or "insufficient evidence", [])
                if f.metric not in metrics:
                    metrics.append(f.metric)
    return {suite: [f"{e} ({', '.join(m)})" for e, m in reasons.items()] for suite, reasons in why.items()}


Baselines = Mapping[tuple[str, str], tuple[BaselineRef, Callable[[Floor], Before]]]


def gate(
    results: Results,
    gates: Gates,
    suites: Mapping[str, SuiteDeclaration],
    artifacts: list[str],
    required: set[str],
    *,
    tenants: list[str] | None = None,
    baselines: Baselines | None = None,
    profile: str | None = None,
) -> list[Verdict]:
    """Every (artifact, tenant) verdict; a tenant with ``applies_to`` gates only those targets.

    ``baselines``: the approved version per (artifact, tenant), where there is one. ``profile``:
    the evaluation's, whose measured numerics spreads mark marginal floors (None: the largest).
    """
    baselines = baselines or {}
    return [
        judge(
            a,
            name,
            t,
            results,
            suites,
            required=a in required,
            baseline=baselines.get((a, name)),
            spread=lambda f: gates.spread(f, profile),
            item_range=gates.item_range.stated(),
        )
        for a in artifacts
        for name, t in gates.tenants.items()
        if (tenants is None or name in tenants) and (t.applies_to is None or a in t.applies_to)
    ]
