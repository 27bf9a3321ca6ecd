"""One look at a canary: the evidence since the last look, tested against every floor, and the action.

Each floor is two one-sided anytime-valid tests kept between looks (``wealth``): *fail* rejects
"the floor holds" (then the canary is rolled back at once), *pass* rejects "the floor fails".
A canary is promoted when every floor's pass test has rejected and the minimum evidence is in;
at the maximum duration it is held or rolled back, per policy. The tenant's level ``alpha = 1 -
confidence`` is split evenly over the floors (an equal canary is rolled back with probability at
most alpha over all floors and all looks); within a floor, half goes to the stable version's own
confidence sequence that sets the null, half to the canary's test.

- latency (``latency``): the canary's p99 against stable's (1 + delta) and the SLO, on bucket counts;
- errors: the canary's error rate against stable's + delta (absolute), on counts;
- replay: the mean top-1 agreement and exact-match rate at least their floors, the mean KL (clipped
  at ``kl_cap``, scaled to [0, 1]) at most its floor, on the pairs new since the last look.

Pure: state in, state out (``LookState``); the watcher stores it in the registry.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np

from quantgate.config import RolloutPolicy
from quantgate.rollout import latency
from quantgate.rollout.evidence import LatencyHistogram, LiveEvidence, ReplayEvidence, VersionTelemetry
from quantgate.rollout.wealth import Wealth, rate_bound

Action = Literal["continue", "promote", "rollback", "hold"]
Status = Literal["open", "pass", "fail"]
MAX_HISTORY = 200  # looks kept for the report (the tag stays small)


@dataclass
class LookState:
    """What a look leaves for the next: the evidence totals it tested, every test's capital, history."""

    canary_version: str
    stable_version: str
    started_at: str
    look: int = 0
    prev: dict = field(default_factory=dict)  # {"stable"/"canary": {requests, errors, latency}, "pairs": n}
    tests: dict[str, dict[str, Wealth]] = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON form."""
        return {
            "canary_version": self.canary_version,
            "stable_version": self.stable_version,
            "started_at": self.started_at,
            "look": self.look,
            "prev": self.prev,
            "tests": {f: {d: w.to_dict() for d, w in t.items()} for f, t in self.tests.items()},
            "history": self.history,
        }

    @classmethod
    def from_dict(cls, d: dict) -> LookState:
        """Back from ``to_dict``."""
        return cls(
            canary_version=d["canary_version"],
            stable_version=d["stable_version"],
            started_at=d["started_at"],
            look=int(d["look"]),
            prev=d.get("prev") or {},
            tests={
                f: {k: Wealth.from_dict(w) for k, w in t.items()} for f, t in (d.get("tests") or {}).items()
            },
            history=list(d.get("history") or []),
        )


@dataclass(frozen=True)
class FloorResult:
    """One floor at this look: open, passed or failed, with the figures behind it."""

    name: str
    status: Status
    detail: str
    fail_log_capital: float
    pass_log_capital: float


@dataclass(frozen=True)
class Decision:
    """A look's outcome: the action, why, the floors, and the digest of the evidence it read."""

    look: int
    action: Action
    reason: str
    floors: tuple[FloorResult, ...]
    evidence_sha256: str
    canary_requests: int
    replay_pairs: int

    def to_dict(self) -> dict:
        """JSON form (the rollout report, ``rollout status``)."""
        return {
            "look": self.look,
            "action": self.action,
            "reason": self.reason,
            "evidence_sha256": self.evidence_sha256,
            "canary_requests": self.canary_requests,
            "replay_pairs": self.replay_pairs,
            "floors": [f.__dict__ for f in self.floors],
        }


def evidence_digest(live: LiveEvidence, replay: ReplayEvidence | None, look: int) -> str:
    """What the look's record carries as its evidence: the readers' digests and the look number."""
    text = json.dumps(
        {"live": live.digest, "replay": None if replay is None else replay.digest, "look": look}
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _hist(t: VersionTelemetry, metric: str) -> LatencyHistogram | None:
    return next((h for h in t.latency if h.metric == metric), None)


def _totals(t: VersionTelemetry) -> dict:
    return {
        "requests": t.requests,
        "errors": t.errors,
        "latency": {h.metric: list(h.cumulative_counts) for h in t.latency},
        "bounds": {h.metric: [str(b) for b in h.upper_bounds] for h in t.latency},
    }


def _tests(state: LookState, name: str, fail_below: bool) -> dict[str, Wealth]:
    """The floor's two tests (created at its first look)."""
    return state.tests.setdefault(
        name, {"fail": Wealth(below=fail_below), "pass": Wealth(below=not fail_below)}
    )


def _result(name: str, tests: dict[str, Wealth], alpha: float, detail: str) -> FloorResult:
    failed, passed = tests["fail"].check(alpha), tests["pass"].check(alpha)
    status: Status = "fail" if failed else "pass" if passed else "open"
    return FloorResult(name, status, detail, tests["fail"].log_mixture(), tests["pass"].log_mixture())


def _latency_floor(
    policy: RolloutPolicy, metric: str, live: LiveEvidence, state: LookState, alpha: float
) -> FloorResult | None:
    stable, canary = _hist(live.stable, metric), _hist(live.canary, metric)
    if stable is None or canary is None:
        return None
    if stable.upper_bounds != canary.upper_bounds:
        raise ValueError(f"{metric}: stable and canary histograms have different buckets")
    slo = {"ttft": policy.live.slo_ttft_p99_s, "itl": policy.live.slo_itl_p99_s}.get(metric)
    cut = latency.thresholds(stable, policy.live.max_p99_increase, slo, alpha / 2)
    before = state.prev.get("canary", {}).get("latency", {}).get(metric) or [0] * len(
        canary.cumulative_counts
    )
    new_total = canary.cumulative_counts[-1] - before[-1]
    tests = _tests(state, f"p99 {metric}", fail_below=False)
    for direction, bound in (("fail", cut.fail_at), ("pass", cut.pass_at)):
        if bound is None or new_total <= 0:
            continue
        i = canary.upper_bounds.index(bound)
        above = new_total - (canary.cumulative_counts[i] - before[i])
        tests[direction].add_counts(above, new_total, latency.TAIL)
    detail = (
        f"canary p99 ~{latency.p99_estimate(canary)} s, stable p99 in [{cut.stable_p99_lo}, {cut.stable_p99_hi}] s; "
        f"fail test above {cut.fail_at} s, pass test above {cut.pass_at} s (1 % of requests)"
    )
    return _result(f"p99 {metric}", tests, alpha / 2, detail)


def _error_floor(
    policy: RolloutPolicy, live: LiveEvidence, state: LookState, alpha: float
) -> FloorResult | None:
    delta = policy.live.max_error_rate_increase
    if delta is None:
        return None
    s, c = live.stable, live.canary
    prev = state.prev.get("canary", {})
    new_requests = c.requests - prev.get("requests", 0)
    new_errors = c.errors - prev.get("errors", 0)
    if new_requests < 0 or new_errors < 0 or new_errors > new_requests:
        raise ValueError("the canary's counts went down since the last look (a restarted counter)")
    hi = rate_bound(s.errors, s.requests, alpha / 4, upper=True)
    lo = rate_bound(s.errors, s.requests, alpha / 4, upper=False)
    tests = _tests(state, "error rate", fail_below=False)
    tests["fail"].add_counts(new_errors, new_requests, hi + delta)
    tests["pass"].add_counts(new_errors, new_requests, lo + delta)
    rate = c.errors / c.requests if c.requests else 0.0
    detail = f"canary {rate:.4%} ({c.errors}/{c.requests}), stable in [{lo:.4%}, {hi:.4%}], delta {delta:g}"
    return _result("error rate", tests, alpha / 2, detail)


def _replay_floors(
    policy: RolloutPolicy, replay: ReplayEvidence | None, state: LookState, alpha: float
) -> list[FloorResult]:
    floors = policy.replay
    pairs = replay.pairs if replay is not None else ()
    seen = state.prev.get("pairs", 0)
    cap = floors.kl_cap
    specs = [
        ("replay top-1 agreement", floors.min_top1_agreement, [p.top1_agreement for p in pairs], True),
        ("replay exact match", floors.min_exact_match, [float(p.exact_match) for p in pairs], True),
        (
            "replay KL",
            None if floors.max_kl is None else floors.max_kl / cap,
            [min(p.kl, cap) / cap for p in pairs],
            False,
        ),
    ]
    out = []
    for name, floor, values, higher_is_better in specs:
        if floor is None:
            continue
        tests = _tests(state, name, fail_below=higher_is_better)
        for direction in ("fail", "pass"):
            tests[direction].add_values(np.asarray(values[seen:]), floor)
        mean = f", mean {float(np.mean(values)):.4f}" if values else ""
        out.append(_result(name, tests, alpha, f"{len(values)} pairs{mean}, floor {floor:g}"))
    return out


def floor_count(policy: RolloutPolicy) -> int:
    """How many floors share the level."""
    r = policy.replay
    return (
        len(policy.live.latency_metrics)
        + (policy.live.max_error_rate_increase is not None)
        + sum(v is not None for v in (r.min_top1_agreement, r.min_exact_match, r.max_kl))
    )


def decide(
    policy: RolloutPolicy,
    confidence: float,
    live: LiveEvidence,
    replay: ReplayEvidence | None,
    state: LookState,
    now: datetime,
) -> Decision:
    """Test the evidence new since ``state``'s look, update ``state`` in place, and say what to do."""
    alpha = (1.0 - confidence) / max(1, floor_count(policy))
    look = state.look + 1
    floors = [f for m in policy.live.latency_metrics if (f := _latency_floor(policy, m, live, state, alpha))]
    if (errors := _error_floor(policy, live, state, alpha)) is not None:
        floors.append(errors)
    floors.extend(_replay_floors(policy, replay, state, alpha))
    pairs = len(replay.pairs) if replay is not None else 0
    failed = [f for f in floors if f.status == "fail"]
    enough = live.canary.requests >= policy.minimum.requests and (
        not policy.replay.any or pairs >= policy.minimum.replay_pairs
    )
    hours = (now - datetime.fromisoformat(state.started_at)).total_seconds() / 3600
    action: Action
    if failed:
        action, reason = "rollback", "; ".join(f"{f.name} fails its floor ({f.detail})" for f in failed)
    elif floors and all(f.status == "pass" for f in floors) and enough and floor_count(policy) == len(floors):
        action, reason = (
            "promote",
            f"every floor passes at confidence {confidence:g} on {live.canary.requests} requests",
        )
    elif hours >= policy.max_duration_hours:
        action = "hold" if policy.at_max_duration == "hold" else "rollback"
        still = [f.name for f in floors if f.status != "pass"] or ["minimum evidence"]
        reason = f"maximum duration {policy.max_duration_hours:g} h reached undecided ({', '.join(still)})"
    else:
        action = "continue"
        reason = f"undecided: {', '.join(f.name for f in floors if f.status != 'pass') or 'minimum evidence'}"
    state.look = look
    state.prev = {"stable": _totals(live.stable), "canary": _totals(live.canary), "pairs": pairs}
    state.history = [
        *state.history,
        {
            "look": look,
            "at": live.read_at,
            "canary_requests": live.canary.requests,
            "pairs": pairs,
            "floors": {f.name: [f.fail_log_capital, f.pass_log_capital, f.status] for f in floors},
        },
    ][-MAX_HISTORY:]
    return Decision(
        look, action, reason, tuple(floors), evidence_digest(live, replay, look), live.canary.requests, pairs
    )
