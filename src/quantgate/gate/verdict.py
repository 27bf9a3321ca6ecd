"""The verdict: a pure function of (source results, artifact results, floors) -> decision.

Rules (each has a test in tests/unit/gate/):

- **Bounds.** Every floor compares the *conservative end* of a one-sided confidence bound with
  the floor: the upper bound for lower-is-better metrics, the lower bound for higher-is-better
  ones. The bound is a paired bootstrap over items (``scipy.stats.bootstrap``, ``paired=True``,
  percentile method, ``n_resamples`` resamples, fixed seed): source and artifact records of the
  same item are resampled together, so the interval is that of the paired comparison.
  The estimate is the same statistic on all items (it equals the suite's reported metric up to
  the float32 storage of per-item values; acceptance is the per-trace mean weighted by trace
  tokens). A metric without usable per-item records (``kld_p99``, ``agreement_at_depth``) uses
  the suite's reported value as both estimate and bound, and its reason says so.
- **Exact.** ``bound <= floor`` (max kinds) or ``bound >= floor`` (min kinds), on the floats
  as computed: nothing is rounded before comparing. Reasons print 6 significant digits, and
  full precision where that would hide the difference.
- **Missing fails.** A suite not evaluated (for the source or the artifact), a reported metric
  of None, no per-item records, records missing a field, or items that do not pair: the floor
  fails with a reason beginning "missing".
- **Zero bases are uninformative.** ``min_recovery`` and ``max_delta_pct`` divide by the
  source's level; when that is 0 the ratio is undefined (0/0 or x/0) and the floor is
  *uninformative*: it neither passes nor fails (``passed`` is None). Resamples whose source base
  is 0 count as the worst case; when they push the bound to infinity (more than 1 - confidence
  of resamples), the floor is uninformative too ("too few source successes for a bound").
- **Verdict.** An artifact passes a tenant only if no applicable floor fails or is missing and
  every suite the tenant names has at least one informative floor: a tenant whose GSM8K floors
  are all uninformative fails, so add a paired floor (``flip_rate``, ``flips_lost``) that is
  informative at any accuracy.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy.stats import bootstrap

from quantgate.gate.measures import Measure, SuiteInfo, item_columns, measures_for
from quantgate.gate.policy import Floor, Gates, Tenant

N_RESAMPLES = 2000
SEED = 0

Status = Literal["pass", "fail", "missing", "uninformative"]
_LABELS = {"max_delta_pct": " change vs source (%)", "min_recovery": " recovery (artifact/source)"}


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FloorResult(_Result):
    suite: str
    metric: str
    kind_of_floor: str  # max | min | max_delta_pct | min_recovery
    floor: float
    estimate: float | None
    bound: float | None  # the conservative end that was compared
    margin: float | None  # >= 0 when the bound is on the right side of the floor
    passed: bool | None  # None: uninformative
    informative: bool
    status: Status
    interval: Literal["paired-bootstrap", "point"] | None
    confidence: float
    items: int
    reason: str


class Verdict(_Result):
    artifact: str
    tenant: str
    verdict: Literal["pass", "fail"]
    reasons: list[str]
    floors: list[FloorResult]
    required: bool


def _fmt(x: float, other: float | None = None) -> str:
    short = f"{x:.6g}"
    if other is not None and x != other and short == f"{other:.6g}":
        return repr(float(x))
    return short


def _paired_columns(suite: SuiteInfo, source: dict, artifact: dict) -> tuple[dict, dict, int] | str:
    """Per-item columns of artifact and source, aligned by item; a string says what is missing."""
    src, art = source.get("samples") or [], artifact.get("samples") or []
    if not src or not art:
        return f"no per-item records ({'source' if not src else 'artifact'})"
    try:
        s_rows = {str(r["item"]): item_columns(suite, r) for r in src}
        a_rows = {str(r["item"]): item_columns(suite, r) for r in art}
    except KeyError as exc:
        return f"per-item records lack field {exc}"
    if s_rows.keys() != a_rows.keys():
        return f"items do not pair ({len(a_rows)} artifact, {len(s_rows)} source, {len(a_rows.keys() & s_rows.keys())} shared)"
    keys = sorted(a_rows)
    a = {c: np.array([a_rows[k][c] for k in keys]) for c in a_rows[keys[0]]}
    s = {c: np.array([s_rows[k][c] for k in keys]) for c in s_rows[keys[0]]}
    return a, s, len(keys)


def _statistic(measure: Measure, kind: str, names: list[str], worst: float):
    """A vectorized statistic of (artifact columns..., source columns...) for one floor kind."""
    n = len(names)

    def stat(*cols: np.ndarray, axis: int = -1) -> np.ndarray:
        a = dict(zip(names, cols[:n], strict=True))
        s = dict(zip(names, cols[n:], strict=True))
        with np.errstate(divide="ignore", invalid="ignore"):
            value = measure.fn(a, s, axis)
            if kind in ("max_delta_pct", "min_recovery"):
                base = measure.fn(s, s, axis)
                ratio = value / base
                value = 100.0 * (ratio - 1.0) if kind == "max_delta_pct" else ratio
                value = np.where(base == 0, worst, value)
        return np.where(np.isnan(value), worst, value)

    return stat


def evaluate_floor(
    floor: Floor,
    suite: SuiteInfo,
    source: dict[str, Any] | None,
    artifact: dict[str, Any] | None,
    *,
    confidence: float = 0.95,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> FloorResult:
    measure = measures_for(suite).get(floor.metric)
    kind, limit = floor.kind, floor.value
    upper = kind in ("max", "max_delta_pct")  # lower is better: compare the upper bound
    label = f"{suite.name} {floor.metric}" + _LABELS.get(kind, "")
    base = dict(suite=suite.name, metric=floor.metric, kind_of_floor=kind, floor=limit, confidence=confidence)

    def result(status: Status, reason: str, estimate=None, bound=None, interval=None, items=0) -> FloorResult:
        margin = None if bound is None or not math.isfinite(bound) else (limit - bound if upper else bound - limit)
        passed = {"pass": True, "fail": False, "missing": False, "uninformative": None}[status]
        return FloorResult(**base, estimate=estimate, bound=bound, margin=margin, passed=passed,
                           informative=status in ("pass", "fail"), status=status, interval=interval, items=items,
                           reason=f"{label}: {reason}")

    if measure is None:
        return result("missing", f"missing: the gate has no measure '{floor.metric}' for suite kind '{suite.kind}'")
    for who, res in (("source", source), ("artifact", artifact)):
        if res is None:
            return result("missing", f"missing: suite not evaluated for the {who}")
        reported = res.get("metrics") or {}
        if (floor.metric in reported or measure.point_only) and reported.get(floor.metric) is None:
            return result("missing", f"missing: the {who}'s reported {floor.metric} is None")
    side = "upper" if upper else "lower"
    pct = f"{confidence:.0%}"

    if measure.point_only:
        if kind in ("max_delta_pct", "min_recovery"):
            return result("missing", "missing: a ratio with the source needs per-item records")
        est = float(artifact["metrics"][floor.metric])
        ok = est <= limit if upper else est >= limit
        cmp = ("<=" if ok else ">") if upper else (">=" if ok else "<")
        return result("pass" if ok else "fail",
                      f"estimate {_fmt(est, limit)} {cmp} {kind} {_fmt(limit, est)}: {'pass' if ok else 'FAIL'} "
                      f"({measure.how}; point estimate only: no per-item records to bound it)",
                      estimate=est, bound=est, interval="point", items=len(artifact.get("samples") or []))

    paired = _paired_columns(suite, source, artifact)
    if isinstance(paired, str):
        return result("missing", f"missing: {paired}")
    a, s, n = paired
    names = list(a)
    worst = math.inf if upper else -math.inf
    stat = _statistic(measure, kind, names, worst)
    cols = [*(a[c] for c in names), *(s[c] for c in names)]
    if kind in ("max_delta_pct", "min_recovery"):
        src_level = float(measure.fn(s, s, -1))
        if src_level == 0:
            return result("uninformative",
                          f"uninformative: the source's {floor.metric} is 0, so the ratio is undefined (0/0 or x/0); "
                          "neither pass nor fail", items=n)
    est = float(stat(*cols))
    if n < 2:
        bound, interval, how = est, "point", "one item, so no interval: bound = estimate"
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ci = bootstrap(tuple(cols), stat, paired=True, vectorized=True, method="percentile",
                           confidence_level=confidence, alternative="less" if upper else "greater",
                           n_resamples=n_resamples, rng=np.random.default_rng(seed)).confidence_interval
        bound = float(ci.high if upper else ci.low)
        interval, how = "paired-bootstrap", f"one-sided, paired bootstrap over {n} items"
    if not math.isfinite(bound):
        return result("uninformative",
                      f"uninformative: estimate {_fmt(est)} but too few source successes for a {pct} bound "
                      f"(resamples with a zero source base); neither pass nor fail", estimate=est, bound=None,
                      interval=interval, items=n)
    ok = bound <= limit if upper else bound >= limit
    cmp = ("<=" if ok else ">") if upper else (">=" if ok else "<")
    margin = limit - bound if upper else bound - limit
    return result("pass" if ok else "fail",
                  f"estimate {_fmt(est)}, {pct} {side} bound {_fmt(bound, limit)} {cmp} {kind} {_fmt(limit, bound)}: "
                  f"{'pass' if ok else 'FAIL'} (margin {_fmt(margin)}; {how}; {measure.how})",
                  estimate=est, bound=bound, interval=interval, items=n)


Results = dict[str, dict[str, dict[str, Any]]]  # model ("source" or a target) -> suite -> result JSON


def judge(
    artifact: str,
    tenant_name: str,
    tenant: Tenant,
    results: Results,
    suites: dict[str, SuiteInfo],
    *,
    required: bool,
    n_resamples: int = N_RESAMPLES,
    seed: int = SEED,
) -> Verdict:
    """One artifact against one tenant's floors (those that apply to its target)."""
    floors = [
        evaluate_floor(f, suites.get(f.suite, SuiteInfo(f.suite, "")), results.get("source", {}).get(f.suite),
                       results.get(artifact, {}).get(f.suite), confidence=tenant.confidence,
                       n_resamples=n_resamples, seed=seed)
        for f in tenant.floors
        if f.applies(artifact)
    ]
    reasons = [f.reason for f in floors if f.status in ("fail", "missing")]
    for name in dict.fromkeys(f.suite for f in floors):
        if not any(f.informative or f.status == "missing" for f in floors if f.suite == name):
            reasons.append(f"{name}: no informative floor (every measure on this suite was uninformative), so the "
                           "suite cannot vouch for the artifact: FAIL")
    if not floors:
        reasons.append(f"no floor of tenant '{tenant_name}' applies to {artifact}: FAIL")
    passed = not reasons
    uninformative = [f.reason for f in floors if f.status == "uninformative"]
    if passed:
        informative = sum(f.informative for f in floors)
        extra = f"; {len(uninformative)} uninformative" if uninformative else ""
        reasons = [f"all {informative} informative floors pass{extra}"]
    return Verdict(artifact=artifact, tenant=tenant_name, verdict="pass" if passed else "fail",
                   reasons=reasons + uninformative, floors=floors, required=required)


def gate(
    results: Results,
    gates: Gates,
    suites: dict[str, SuiteInfo],
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
