"""The verdict: a pure function of (source results, artifact results, floors, approved version) -> decision.

Pure and exact, so that a verdict is reproducible byte for byte and each rule is tested without a
model (tests/unit/gate/): the conservative end of a paired bootstrap bound against the floor,
nothing rounded; missing data and items that could not be evaluated fail; a floor whose items
cannot detect a violation of its own size is *insufficient evidence*, never a pass.
``evaluate_floor`` states the rules for one floor, ``judge`` for a verdict.

Power (``mde``, the minimum detectable effect, in the floor's units): the smallest departure from
*no change* (the floor's quantity with the artifact equal to the source: KL 0, agreement 1, no
answer lost, perplexity +0 %, recovery 1) that the floor's test reports at the tenant's confidence
c with probability c. From the paired per-item spread it is twice the distance between the
estimate and its one-sided bound (the normal approximation (z_c + z_c) * SE, read off the
bootstrap's percentile so that skew counts); for measures of lost answers it is at least the
exact zero-event rate 1 - (1 - c)^(1/m) over the m items the source solved (a bootstrap over
items that hold no loss has no spread, and "none lost" is what a loss rate below that rate looks
like too), scaled to the floor's units. A floor detects a violation of its own size when
``mde <= tolerance``, the departure the floor allows (``|floor - no change|``; for
``max_regression``, the floor itself). Power is judged before the verdict: a floor without it is
*insufficient evidence* whichever side of the floor its bound fell, so noise in a suite that
cannot tell a good artifact from a broken one decides nothing (one lucky answer among 8 items
once failed an artifact).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from quantgate.config.gates import RATIO_KINDS, Floor, Gates, Tenant
from quantgate.evaluate.suites.metrics import Metric
from quantgate.gate import sequence
from quantgate.report_schema import STATUS_TEXT, BaselineRef, FloorResult, Status, Verdict

if TYPE_CHECKING:
    from quantgate.evaluate.suites import SuiteKind

N_RESAMPLES = 2000
SEED = 0

_LABELS = {
    "max_delta_pct": " change vs source (%)",
    "min_recovery": " recovery (artifact/source)",
    "max_regression": " regression vs the approved version",
}
BLOCKING: tuple[Status, ...] = ("fail", "missing", "error")


def _fmt(x: float, other: float | None = None) -> str:
    short = f"{x:.6g}"
    if other is not None and x != other and short == f"{other:.6g}":
        return repr(float(x))
    return short


@dataclass(frozen=True)
class Before:
    """A floor's quantity in the version the registry approves for the tenant today."""

    label: str  # e.g. "version 3 of m.hopper-fp8 (approved-chat)"
    value: float | None  # None: that version's report does not carry it
    problem: str | None = None  # why it cannot be compared (another profile); None: comparable


def _as_column(values: list[Any]) -> np.ndarray:
    """Per-item values as one column: numbers, or an object array of per-item lists (pooled statistics)."""
    if values and isinstance(values[0], (list, tuple, np.ndarray)):
        column = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            column[i] = np.asarray(v, dtype=float)
        return column
    return np.asarray(values, dtype=float)


def _paired_columns(suite: SuiteKind, source: dict, artifact: dict) -> tuple[dict, dict, int] | str:
    """Per-item columns of artifact and source, aligned by item; a string says what is missing."""
    src, art = source.get("samples") or [], artifact.get("samples") or []
    if not src or not art:
        return f"no per-item records ({'source' if not src else 'artifact'})"
    try:
        s_rows = {str(r["item"]): suite.columns(r) for r in src}
        a_rows = {str(r["item"]): suite.columns(r) for r in art}
        if s_rows.keys() != a_rows.keys():
            shared = len(a_rows.keys() & s_rows.keys())
            return f"items do not pair ({len(a_rows)} artifact, {len(s_rows)} source, {shared} shared)"
        keys = sorted(a_rows)
        names = [c for c in a_rows[keys[0]] if c in s_rows[keys[0]]]
        a = {c: _as_column([a_rows[k][c] for k in keys]) for c in names}
        s = {c: _as_column([s_rows[k][c] for k in keys]) for c in names}
    except KeyError as exc:
        return f"per-item records lack field {exc}"
    return a, s, len(keys)


def _errors(suite: SuiteKind, source: dict, artifact: dict) -> str | None:
    """Why items of this suite could not be evaluated (no sandbox, harness error, missing data), as
    the kind reads its records (``SuiteKind.item_error``) and its result counts them (``errors``);
    None: every item was."""
    found = []
    for who, res in (("source", source), ("artifact", artifact)):
        samples = res.get("samples") or []
        bad = [(r.get("item"), why) for r in samples if (why := suite.item_error(r)) is not None]
        if bad:
            found.append(
                f"{len(bad)} of {len(samples)} {who} items could not be evaluated (item {bad[0][0]}: {bad[0][1]})"
            )
        elif res.get("errors"):
            counts = "; ".join(f"{n} × {why}" for why, n in res["errors"].items())
            found.append(f"{who} items could not be evaluated: {counts}")
    return "; ".join(found) or None


def _statistic(measure: Metric, kind: str, names: list[str], worst: float):
    """A vectorized statistic of (artifact columns..., source columns...) for one floor kind."""
    n = len(names)
    fn = measure.statistic
    assert fn is not None  # every gated metric declares one (metrics.py)

    def stat(*cols: np.ndarray, axis: int = -1) -> np.ndarray:
        a = dict(zip(names, cols[:n], strict=True))
        s = dict(zip(names, cols[n:], strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.asarray(fn(a, s, axis), dtype=float)
            if kind in RATIO_KINDS:
                base = np.asarray(fn(s, s, axis), dtype=float)
                ratio = value / base
                value = 100.0 * (ratio - 1.0) if kind == "max_delta_pct" else ratio
                value = np.where(measure.informative(base), value, worst)
        return np.where(np.isnan(value), worst, value)

    return stat


def _bound(cols: list[np.ndarray], stat, *, upper: bool, confidence: float, n_resamples: int, seed: int):
    """The one-sided paired bootstrap bound (``scipy.stats.bootstrap``, percentile, fixed seed)."""
    from scipy.stats import bootstrap  # scipy.stats costs half a second: only where a bound is computed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ci = bootstrap(
            tuple(cols),
            stat,
            paired=True,
            vectorized=True,
            method="percentile",
            confidence_level=confidence,
            alternative="less" if upper else "greater",
            n_resamples=n_resamples,
            rng=np.random.default_rng(seed),
        ).confidence_interval
    return float(ci.high if upper else ci.low)


def evaluate_floor(
    floor: Floor,
    suite: SuiteKind | None,
    source: dict[str, Any] | None,
    artifact: dict[str, Any] | None,
    *,
    confidence: float = 0.95,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    before: Before | None = None,
    spread: float | None = None,
) -> FloorResult:
    """One floor for one artifact: the metric as the suite's kind declares it, bounded, powered, compared exactly.

    - Bounds: the conservative end of a one-sided bound (upper for lower-is-better quantities,
      lower for higher-is-better), from a paired bootstrap over items (``scipy.stats.bootstrap``,
      ``paired=True``, percentile method, ``n_resamples``, fixed seed): source and artifact
      records of an item are resampled together. Quantiles (``kld_p99``) are recomputed from
      each resample's pooled per-token values. The estimate is the same statistic on all items.
    - Exact: ``bound <= floor`` (max kinds) or ``bound >= floor`` (min kinds) on the floats as
      computed; reasons print 6 significant digits, full precision where that would hide the
      difference.
    - Missing fails: a suite not evaluated, a reported metric of None, no per-item records,
      records missing a field, or items that do not pair give a reason beginning "missing".
    - Errors fail: any item (source or artifact) recorded with ``"error": "<reason>"`` (it
      could not be evaluated: no sandbox, harness error, missing data) makes the floor ``error``.
    - Power before verdict: a quantity undefined on the source (a ratio over a source level of
      0; a loss rate when the source solves nothing), fewer than 2 items, or ``mde >
      tolerance`` (module docstring) is ``insufficient evidence``, whatever the bound says,
      unless the other end of the interval is beyond the floor too: a violation these items
      establish is a fail (a broken artifact's spread is large, its interval clear of the floor).
      Resamples with a zero source base count as the worst case; when more than 1 - confidence
      of them do, the bound is infinite and the floor is insufficient evidence too.
    - ``max_regression``: the metric (in its own units) against ``before``, the approved
      version's value: regression = this artifact's value minus it, in the worse direction,
      bounded by this evaluation's conservative end. With no approved version it is
      ``no_baseline`` (neither pass nor fail); with one that cannot be compared, insufficient.
    - Marginal: ``spread`` is how far this bound moves between machines (measured,
      ``gates.yaml`` ``numerics_spread``). A pass or fail whose bound is within it of the floor
      keeps its status and is marked ``marginal``, its reason saying so: it may be decided the
      other way on another machine, and must not flip there silently.
    """
    measure = suite.metrics().get(floor.metric) if suite is not None else None
    kind, limit = floor.kind, floor.value
    regression = kind == "max_regression"
    if regression:  # compare the metric itself, in its own direction
        upper = measure is None or not measure.higher_is_better
    else:
        upper = kind in ("max", "max_delta_pct")  # lower is better: compare the upper bound
    measured_upper = upper  # the direction of the quantity bootstrapped (a regression flips to upper)
    label = f"{floor.suite} {floor.metric}" + _LABELS.get(kind, "")
    base: dict[str, Any] = {
        "suite": floor.suite,
        "metric": floor.metric,
        "kind_of_floor": kind,
        "floor": limit,
        "confidence": confidence,
        "advisory": floor.advisory,
    }
    pct = f"{confidence:.0%}"

    def result(
        status: Status, reason: str, estimate=None, bound=None, items=0, interval=None, **power
    ) -> FloorResult:
        margin = None  # upper is read when called: a regression compares as lower-is-better
        if bound is not None and math.isfinite(bound) and status in ("pass", "fail"):
            margin = limit - bound if upper else bound - limit
        passed = {"pass": True, "fail": False, "missing": False, "error": False}.get(status)
        if status == "insufficient_evidence" and floor.advisory:
            reason += " (advisory: does not fail the verdict)"
        marginal = margin is not None and spread is not None and abs(margin) <= spread
        if marginal:
            assert margin is not None and spread is not None
            reason += (
                f" [MARGINAL: the bound is {_fmt(abs(margin))} from the floor, within the measured "
                f"machine-to-machine spread {_fmt(spread)}; another machine may decide otherwise]"
            )
        return FloorResult(
            **base,
            estimate=estimate,
            bound=bound if bound is not None and math.isfinite(bound) else None,
            margin=margin,
            passed=passed,
            informative=status in ("pass", "fail"),
            status=status,
            interval=interval or ("paired-bootstrap" if bound is not None and math.isfinite(bound) else None),
            items=items,
            reason=f"{label}: {reason}",
            spread=spread,
            marginal=marginal,
            **power,
        )

    if suite is None or measure is None or measure.statistic is None:
        kind_name = suite.spec.kind if suite is not None else "unknown: no such suite in the project"
        return result(
            "missing", f"missing: the gate has no measure '{floor.metric}' for suite kind '{kind_name}'"
        )
    if source is None or artifact is None:
        return result(
            "missing", f"missing: suite not evaluated for the {'source' if source is None else 'artifact'}"
        )
    errors = _errors(suite, source, artifact)
    if errors:
        return result("error", f"error: {errors}; a floor on items that were not evaluated cannot pass")
    for who, res in (("source", source), ("artifact", artifact)):
        reported = res.get("metrics") or {}
        if floor.metric in reported and reported.get(floor.metric) is None:
            return result("missing", f"missing: the {who}'s reported {floor.metric} is None")
    design = artifact.get("sequential") or {}
    used, early = "", None
    if design:  # evaluated sequentially (evaluate/sequential.py): its items, its confidence
        total = design.get("items_total")
        used = f"; sequential: {design.get('items_used')} of {total} items, stopped: {design.get('stopped')}"
        if design.get("stopped") == "decided":
            decided = sequence.check(floor, suite, source, artifact.get("samples") or [], confidence)
            if not isinstance(decided, str) and decided.decision != "undecided":
                early = decided  # reported with its estimate on the items used, found below
            else:
                used += f" (this floor on those items with the fixed design: {decided if isinstance(decided, str) else 'undecided'})"
            items = {str(r.get("item")) for r in artifact.get("samples") or []}
            source = {
                **source,
                "samples": [r for r in source.get("samples") or [] if str(r.get("item")) in items],
            }
        if early is None:
            confidence = sequence.final_confidence(confidence)
            pct = f"{confidence:.1%}"
    paired = _paired_columns(suite, source, artifact)
    if isinstance(paired, str):
        return result("missing", f"missing: {paired}")
    a, s, n = paired
    names = list(a)
    side = "upper" if upper else "lower"
    worst = math.inf if upper else -math.inf
    stat_kind = kind if kind in RATIO_KINDS else ("max" if upper else "min")
    stat = _statistic(measure, stat_kind, names, worst)
    cols = [*(a[c] for c in names), *(s[c] for c in names)]
    ratio = kind in RATIO_KINDS
    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            source_level = float(measure.statistic(s, s, -1))
        est = float(stat(*cols))
    except KeyError as exc:
        return result("missing", f"missing: per-item records lack field {exc}", items=n)
    if early is not None:
        return _sequential_result(result, floor, early, confidence, label_used=used, estimate=est)
    level = measure.detectable(s, confidence, ratio) if measure.detectable is not None else None
    note = f"; {level[1]}" if level else ""

    if regression and before is None:
        return result(
            "no_baseline",
            f"no approved version to compare with (a first release, or the approved version is this "
            f"artifact); this artifact's {floor.metric} is {_fmt(est)}: neither pass nor fail",
            items=n,
        )
    if not (measure.informative(np.asarray(source_level)) if ratio else math.isfinite(source_level)):
        why = f"the source's {floor.metric} {measure.uninformative}"
        return result(
            "insufficient_evidence",
            f"insufficient evidence: {why}{note}; nothing here can tell a good artifact from a broken one",
            items=n,
            evidence=level[1] if level else why,
        )
    no_change = {"max_delta_pct": 0.0, "min_recovery": 1.0}.get(kind, source_level)
    if n < 2:
        return result(
            "insufficient_evidence",
            f"insufficient evidence: estimate {_fmt(est)} on {n} item, which has no spread to bound",
            estimate=est,
            items=n,
            no_change=no_change,
            evidence=f"{n} item",
        )
    bound = _bound(cols, stat, upper=upper, confidence=confidence, n_resamples=n_resamples, seed=seed)
    if not math.isfinite(bound):
        return result(
            "insufficient_evidence",
            f"insufficient evidence: estimate {_fmt(est)} but too few source successes for a {pct} "
            f"bound (resamples with a zero source base){note}",
            estimate=est,
            items=n,
            no_change=no_change,
            evidence=level[1] if level else "too few source successes for a bound",
        )
    mde = max(2.0 * abs(bound - est), level[0] if level else 0.0)
    how = f"one-sided, paired bootstrap over {n} items; {measure.how}{used}"

    delta: float | None = None
    # the floor's quantity from the metric's value: itself, or its regression from the approved version
    sign, was = 1.0, 0.0
    if regression:
        assert before is not None
        if before.problem is not None or before.value is None:
            why = before.problem or f"its report carries no {floor.suite} {floor.metric}"
            return result(
                "insufficient_evidence",
                f"insufficient evidence: cannot compare with {before.label}: {why}",
                items=n,
                no_change=0.0,
                evidence=f"approved version not comparable: {why}",
            )
        now, now_bound = est, bound
        sign, was = (1.0 if upper else -1.0), before.value
        est, bound = sign * (now - was), sign * (now_bound - was)
        delta = now - was
        no_change, tolerance = 0.0, limit
        compare = f"{floor.metric} {_fmt(now)} against {_fmt(before.value)} in {before.label}"
        upper = True  # a regression is lower-is-better
        side = "upper"
    else:
        tolerance = abs(limit - no_change)
        compare = ""
        if before is not None and before.value is not None and before.problem is None:
            delta = est - before.value
    power: dict[str, Any] = {
        "mde": mde,
        "tolerance": tolerance,
        "no_change": no_change,
        "before": before.value if before is not None and before.problem is None else None,
        "delta": delta,
    }
    within = bound <= limit if upper else bound >= limit
    powered = mde <= tolerance
    shown_beyond = False
    if not within and not powered:  # a violation these items establish fails without power
        other = _bound(
            cols, stat, upper=not measured_upper, confidence=confidence, n_resamples=n_resamples, seed=seed
        )
        other = sign * (other - was)
        shown_beyond = other > limit if upper else other < limit
    cmp = ("<=" if within else ">") if upper else (">=" if within else "<")
    shown = f"estimate {_fmt(est)}, {pct} {side} bound {_fmt(bound, limit)} {cmp} {kind} {_fmt(limit, bound)}"
    if compare:
        shown = f"{compare}: regression {shown}"
    power_text = f"MDE {_fmt(mde)} vs tolerance {_fmt(tolerance)}"
    if within and powered:
        margin = limit - bound if upper else bound - limit
        return result(
            "pass",
            f"{shown}: pass (margin {_fmt(margin)}; {power_text}; {how})",
            estimate=est,
            bound=bound,
            items=n,
            **power,
        )
    if not within and (powered or shown_beyond):
        margin = limit - bound if upper else bound - limit
        why = "" if powered else f"; even the other end of the {pct} interval is beyond the floor"
        return result(
            "fail",
            f"{shown}: FAIL (margin {_fmt(margin)}; {power_text}{why}; {how})",
            estimate=est,
            bound=bound,
            items=n,
            **power,
        )
    return result(
        "insufficient_evidence",
        f"insufficient evidence: {shown}, but the minimum detectable effect {_fmt(mde)} exceeds the "
        f"floor's tolerance {_fmt(tolerance)} ({kind} {_fmt(limit)} against {_fmt(no_change)} with no "
        f"change){note}; these items cannot tell an artifact at the floor from the source ({how})",
        estimate=est,
        bound=bound,
        items=n,
        evidence=(f"{level[1]}: " if level else "")
        + f"MDE {_fmt(mde)} exceeds the tolerance {_fmt(tolerance)} on {n} items",
        **power,
    )


def _sequential_result(
    result, floor: Floor, decided: sequence.Sequential, confidence: float, *, label_used: str, estimate: float
):
    """A floor decided early by the confidence sequence: its decision, both ends, the items it took.

    A pass has the conservative end on the floor's side; a fail has even the other end beyond it.
    A quantile floor is bounded through the fraction of tokens above the floor (``quantity``): its
    ends are reported in the reason, not as the floor's bound. ``estimate``: the floor's statistic
    on the items used, as the fixed design would show it on them.
    """
    level = f"{1 - sequence.early_alpha(confidence):.1%}"
    upper = floor.kind in ("max", "max_delta_pct")
    passed = decided.decision == "pass"
    limit = decided.limit if decided.quantity and decided.limit is not None else floor.value
    worse, better = ("upper", "lower") if upper else ("lower", "upper")
    if passed:
        shown = (
            f"{level} always-valid {worse} end {_fmt(decided.upper)} {'<=' if upper else '>='} {_fmt(limit)}"
        )
    else:
        shown = (
            f"{level} always-valid {better} end {_fmt(decided.lower)} {'>' if upper else '<'} {_fmt(limit)}"
        )
    end = decided.upper if passed else decided.lower
    if not (end <= limit if upper == passed else end >= limit) if not decided.quantity else False:
        # the interval's ends are approximate where bets differ across m (sequence.bounds): the
        # decision is the exact test at the floor, so say that rather than show an end across it
        shown = (
            f"{level} always-valid test at the floor rejects '{'at or beyond' if passed else 'within'} the floor' "
            f"(interval ends {_fmt(decided.lower)} to {_fmt(decided.upper)})"
        )
        end = math.nan
    if decided.quantity:
        shown = f"{decided.quantity}: {shown} (at most {1 - limit:.0%} of tokens above {_fmt(floor.value)})"
    status: Status = "pass" if passed else "fail"
    return result(
        status,
        f"{shown}: {'pass' if passed else 'FAIL'} ({floor.kind} {_fmt(floor.value)}; betting confidence "
        f"sequence, decided after {decided.at} of {decided.items} items{label_used}"
        f"{'; ' + decided.note if decided.note else ''})",
        estimate=estimate,
        bound=None if decided.quantity or math.isnan(end) else decided.upper,
        items=decided.items,
        interval=None if decided.quantity or math.isnan(end) else "confidence-sequence",
    )


Results = dict[str, dict[str, dict[str, Any]]]  # model ("source" or a target) -> suite -> result JSON


def judge(
    artifact: str,
    tenant_name: str,
    tenant: Tenant,
    results: Results,
    suites: Mapping[str, SuiteKind],
    *,
    required: bool,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    baseline: tuple[BaselineRef, Callable[[Floor], Before]] | None = None,
    spread: Callable[[Floor], float | None] | None = None,
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
            n_resamples=n_resamples,
            seed=seed,
            before=lookup(f) if lookup is not None else None,
            spread=spread(f) if spread is not None else None,
        )
        for f in tenant.floors
        if f.applies(artifact)
    ]
    reasons = [
        f.reason
        for f in floors
        if f.status in BLOCKING or (f.status == "insufficient_evidence" and not f.advisory)
    ]
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
        marginal=any(f.marginal for f in floors),
    )


def no_evidence(verdicts: list[Verdict]) -> dict[str, list[str]]:
    """Suites on which no floor, in any verdict, was decided with evidence: each distinct reason,
    with the metrics it held for (e.g. "the source solves 0 of 8 items (accuracy, flip_loss_rate)")."""
    decided = {f.suite for v in verdicts for f in v.floors if f.status in ("pass", "fail")}
    why: dict[str, dict[str, list[str]]] = {}
    for v in verdicts:
        for f in v.floors:
            if f.status == "insufficient_evidence" and f.suite not in decided:
                metrics = why.setdefault(f.suite, {}).setdefault(f.evidence or "insufficient evidence", [])
                if f.metric not in metrics:
                    metrics.append(f.metric)
    return {suite: [f"{e} ({', '.join(m)})" for e, m in reasons.items()] for suite, reasons in why.items()}


Baselines = Mapping[tuple[str, str], tuple[BaselineRef, Callable[[Floor], Before]]]


def gate(
    results: Results,
    gates: Gates,
    suites: Mapping[str, SuiteKind],
    artifacts: list[str],
    required: set[str],
    *,
    tenants: list[str] | None = None,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
    baselines: Baselines | None = None,
) -> list[Verdict]:
    """Every (artifact, tenant) verdict; a tenant with ``applies_to`` gates only those targets.

    ``baselines``: the approved version per (artifact, tenant), where there is one.
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
            n_resamples=n_resamples,
            seed=seed,
            baseline=baselines.get((a, name)),
            spread=gates.spread,
        )
        for a in artifacts
        for name, t in gates.tenants.items()
        if (tenants is None or name in tenants) and (t.applies_to is None or a in t.applies_to)
    ]
