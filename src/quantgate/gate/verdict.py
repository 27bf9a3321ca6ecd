"""The verdict: a pure function of (source results, artifact results, floors) -> decision.

Pure and exact, so that a verdict is reproducible byte for byte and each rule is tested without a
model (tests/unit/gate/): the conservative end of a paired bootstrap bound against the floor,
nothing rounded; missing data fails; a ratio over a zero source base is uninformative; a
verdict needs an informative floor on every suite it rests on. ``evaluate_floor`` states the
rules for one floor, ``judge`` for a verdict.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from quantgate.config.gates import RATIO_KINDS, Floor, Gates, Tenant
from quantgate.evaluate.suites.metrics import Metric
from quantgate.report_schema import FloorResult, Status, Verdict

if TYPE_CHECKING:
    from quantgate.evaluate.suites import SuiteKind

N_RESAMPLES = 2000
SEED = 0

_LABELS = {"max_delta_pct": " change vs source (%)", "min_recovery": " recovery (artifact/source)"}


def _fmt(x: float, other: float | None = None) -> str:
    short = f"{x:.6g}"
    if other is not None and x != other and short == f"{other:.6g}":
        return repr(float(x))
    return short


def _paired_columns(suite: SuiteKind, source: dict, artifact: dict) -> tuple[dict, dict, int] | str:
    """Per-item columns of artifact and source, aligned by item; a string says what is missing."""
    src, art = source.get("samples") or [], artifact.get("samples") or []
    if not src or not art:
        return f"no per-item records ({'source' if not src else 'artifact'})"
    try:
        s_rows = {str(r["item"]): suite.columns(r) for r in src}
        a_rows = {str(r["item"]): suite.columns(r) for r in art}
    except KeyError as exc:
        return f"per-item records lack field {exc}"
    if s_rows.keys() != a_rows.keys():
        return f"items do not pair ({len(a_rows)} artifact, {len(s_rows)} source, {len(a_rows.keys() & s_rows.keys())} shared)"
    keys = sorted(a_rows)
    a = {c: np.array([a_rows[k][c] for k in keys]) for c in a_rows[keys[0]]}
    s = {c: np.array([s_rows[k][c] for k in keys]) for c in s_rows[keys[0]]}
    return a, s, len(keys)


def _statistic(measure: Metric, kind: str, names: list[str], worst: float):
    """A vectorized statistic of (artifact columns..., source columns...) for one floor kind."""
    n = len(names)
    fn = measure.statistic
    assert fn is not None  # point-only metrics never reach the bootstrap

    def stat(*cols: np.ndarray, axis: int = -1) -> np.ndarray:
        a = dict(zip(names, cols[:n], strict=True))
        s = dict(zip(names, cols[n:], strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            value = fn(a, s, axis)
            if kind in RATIO_KINDS:
                base = fn(s, s, axis)
                ratio = value / base
                value = 100.0 * (ratio - 1.0) if kind == "max_delta_pct" else ratio
                value = np.where(measure.informative(base), value, worst)
        return np.where(np.isnan(value), worst, value)

    return stat


def evaluate_floor(
    floor: Floor,
    suite: SuiteKind | None,
    source: dict[str, Any] | None,
    artifact: dict[str, Any] | None,
    *,
    confidence: float = 0.95,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> FloorResult:
    """One floor for one artifact: the metric as the suite's kind declares it, bounded and compared exactly.

    - Bounds: the conservative end of a one-sided bound (upper for lower-is-better metrics,
      lower for higher-is-better), from a paired bootstrap over items (``scipy.stats.bootstrap``,
      ``paired=True``, percentile method, ``n_resamples``, fixed seed): source and artifact
      records of an item are resampled together. The estimate is the same statistic on all
      items (the suite's reported metric up to the float32 storage of per-item values). A
      point-only metric (``kld_p99``, ``agreement_at_depth``) uses the suite's reported value as
      estimate and bound, and its reason says so.
    - Exact: ``bound <= floor`` (max kinds) or ``bound >= floor`` (min kinds) on the floats as
      computed; reasons print 6 significant digits, full precision where that would hide the
      difference.
    - Missing fails: a suite not evaluated, a reported metric of None, no per-item records,
      records missing a field, or items that do not pair give a reason beginning "missing".
    - Zero bases are uninformative: ``min_recovery`` and ``max_delta_pct`` divide by the
      source's level; where the suite kind's ``Metric.informative`` rejects it (default: 0) the
      floor neither passes nor fails (``passed`` None). Resamples with such a base count as the
      worst case; when more than 1 - confidence of them do, the bound is infinite and the floor
      is uninformative too ("too few source successes for a bound").
    """
    from scipy.stats import bootstrap  # scipy.stats costs half a second: only where a bound is computed

    measure = suite.metrics().get(floor.metric) if suite is not None else None
    kind, limit = floor.kind, floor.value
    upper = kind in ("max", "max_delta_pct")  # lower is better: compare the upper bound
    label = f"{floor.suite} {floor.metric}" + _LABELS.get(kind, "")
    base: dict[str, Any] = {
        "suite": floor.suite,
        "metric": floor.metric,
        "kind_of_floor": kind,
        "floor": limit,
        "confidence": confidence,
    }

    def result(status: Status, reason: str, estimate=None, bound=None, interval=None, items=0) -> FloorResult:
        margin = (
            None if bound is None or not math.isfinite(bound) else (limit - bound if upper else bound - limit)
        )
        passed = {"pass": True, "fail": False, "missing": False, "uninformative": None}[status]
        return FloorResult(
            **base,
            estimate=estimate,
            bound=bound,
            margin=margin,
            passed=passed,
            informative=status in ("pass", "fail"),
            status=status,
            interval=interval,
            items=items,
            reason=f"{label}: {reason}",
        )

    if suite is None or measure is None:
        kind_name = suite.spec.kind if suite is not None else "unknown: no such suite in the project"
        return result(
            "missing", f"missing: the gate has no measure '{floor.metric}' for suite kind '{kind_name}'"
        )
    if source is None or artifact is None:
        return result(
            "missing", f"missing: suite not evaluated for the {'source' if source is None else 'artifact'}"
        )
    for who, res in (("source", source), ("artifact", artifact)):
        reported = res.get("metrics") or {}
        if (floor.metric in reported or measure.point_only) and reported.get(floor.metric) is None:
            return result("missing", f"missing: the {who}'s reported {floor.metric} is None")
    side = "upper" if upper else "lower"
    pct = f"{confidence:.0%}"

    if measure.point_only:
        if kind in RATIO_KINDS:
            return result("missing", "missing: a ratio with the source needs per-item records")
        est = float(artifact["metrics"][floor.metric])
        ok = est <= limit if upper else est >= limit
        cmp = ("<=" if ok else ">") if upper else (">=" if ok else "<")
        return result(
            "pass" if ok else "fail",
            f"estimate {_fmt(est, limit)} {cmp} {kind} {_fmt(limit, est)}: {'pass' if ok else 'FAIL'} "
            f"({measure.how}; point estimate only: no per-item records to bound it)",
            estimate=est,
            bound=est,
            interval="point",
            items=len(artifact.get("samples") or []),
        )

    paired = _paired_columns(suite, source, artifact)
    if isinstance(paired, str):
        return result("missing", f"missing: {paired}")
    a, s, n = paired
    names = list(a)
    worst = math.inf if upper else -math.inf
    stat = _statistic(measure, kind, names, worst)
    cols = [*(a[c] for c in names), *(s[c] for c in names)]
    if kind in RATIO_KINDS:
        assert measure.statistic is not None
        src_level = float(measure.statistic(s, s, -1))
        if not measure.informative(np.asarray(src_level)):
            return result(
                "uninformative",
                f"uninformative: the source's {floor.metric} {measure.uninformative}; neither pass nor fail",
                items=n,
            )
    est = float(stat(*cols))
    if n < 2:
        bound, interval, how = est, "point", "one item, so no interval: bound = estimate"
    else:
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
        bound = float(ci.high if upper else ci.low)
        interval, how = "paired-bootstrap", f"one-sided, paired bootstrap over {n} items"
    if not math.isfinite(bound):
        return result(
            "uninformative",
            f"uninformative: estimate {_fmt(est)} but too few source successes for a {pct} bound "
            f"(resamples with a zero source base); neither pass nor fail",
            estimate=est,
            bound=None,
            interval=interval,
            items=n,
        )
    ok = bound <= limit if upper else bound >= limit
    cmp = ("<=" if ok else ">") if upper else (">=" if ok else "<")
    margin = limit - bound if upper else bound - limit
    return result(
        "pass" if ok else "fail",
        f"estimate {_fmt(est)}, {pct} {side} bound {_fmt(bound, limit)} {cmp} {kind} {_fmt(limit, bound)}: "
        f"{'pass' if ok else 'FAIL'} (margin {_fmt(margin)}; {how}; {measure.how})",
        estimate=est,
        bound=bound,
        interval=interval,
        items=n,
    )


Results = dict[str, dict[str, dict[str, Any]]]  # model ("source" or a target) -> suite -> result JSON


def judge(
    artifact: str,
    tenant_name: str,
    tenant: Tenant,
    results: Results,
    suites: dict[str, SuiteKind],
    *,
    required: bool,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> Verdict:
    """One artifact against one tenant's floors (those that apply to its target).

    It passes only if no floor fails or is missing and every suite those floors name has at
    least one informative floor: a tenant whose GSM8K floors are all uninformative fails, so
    add a paired floor (``flip_rate``, ``flips_lost``) that is informative at any accuracy.
    """
    floors = [
        evaluate_floor(
            f,
            suites.get(f.suite),
            results.get("source", {}).get(f.suite),
            results.get(artifact, {}).get(f.suite),
            confidence=tenant.confidence,
            n_resamples=n_resamples,
            seed=seed,
        )
        for f in tenant.floors
        if f.applies(artifact)
    ]
    reasons = [f.reason for f in floors if f.status in ("fail", "missing")]
    for name in dict.fromkeys(f.suite for f in floors):
        if not any(f.informative or f.status == "missing" for f in floors if f.suite == name):
            reasons.append(
                f"{name}: no informative floor (every measure on this suite was uninformative), so the "
                "suite cannot vouch for the artifact: FAIL"
            )
    if not floors:
        reasons.append(f"no floor of tenant '{tenant_name}' applies to {artifact}: FAIL")
    passed = not reasons
    uninformative = [f.reason for f in floors if f.status == "uninformative"]
    if passed:
        informative = sum(f.informative for f in floors)
        extra = f"; {len(uninformative)} uninformative" if uninformative else ""
        reasons = [f"all {informative} informative floors pass{extra}"]
    return Verdict(
        artifact=artifact,
        tenant=tenant_name,
        verdict="pass" if passed else "fail",
        reasons=reasons + uninformative,
        floors=floors,
        required=required,
    )


def gate(
    results: Results,
    gates: Gates,
    suites: dict[str, SuiteKind],
    artifacts: list[str],
    required: set[str],
    *,
    tenants: list[str] | None = None,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> list[Verdict]:
    """Every (artifact, tenant) verdict; a tenant with ``applies_to`` gates only those targets."""
    return [
        judge(a, name, t, results, suites, required=a in required, n_resamples=n_resamples, seed=seed)
        for a in artifacts
        for name, t in gates.tenants.items()
        if (tenants is None or name in tenants) and (t.applies_to is None or a in t.applies_to)
    ]
