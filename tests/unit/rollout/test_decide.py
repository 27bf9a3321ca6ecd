"""One look's decision on simulated telemetry (the decision's input as the readers return it)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from quantgate.config import RolloutPolicy
from quantgate.rollout import LookState, decide
from quantgate.rollout import simulate as sim
from quantgate.rollout.evidence import LatencyHistogram

pytestmark = pytest.mark.unit

BUCKETS = sim.geometric_buckets(0.005, 30.0, 1.02)
SHAPE = sim.Shape("lognormal", 0.5)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _run(policy, *, slower=1.0, errors=0.01, agreement=0.97, looks=30, seed=0, hours_per_look=0.0):
    rng = np.random.default_rng(seed)
    state = LookState("2", "1", NOW.isoformat())
    stable = canary = None
    for look in range(looks):
        stable = sim.accumulate(stable, sim.telemetry(rng, "1", 400_000, SHAPE, BUCKETS, 0.01))
        canary = sim.accumulate(canary, sim.telemetry(rng, "2", 20_000, SHAPE, BUCKETS, errors, slower))
        replay = sim.replay(np.random.default_rng(seed), 60 * (look + 1), agreement, 0.8, 0.01)
        now = NOW + timedelta(hours=hours_per_look * (look + 1))
        d = decide(policy, 0.95, sim.live(stable, canary, str(look)), replay, state, now)
        if d.action != "continue":
            return d, state
    return d, state


POLICY = RolloutPolicy(
    strategy="canary",
    live={"max_p99_increase": 0.05, "max_error_rate_increase": 0.005},
    replay={"min_top1_agreement": 0.9},
    minimum={"requests": 20_000, "replay_pairs": 100},
)


def test_an_equal_canary_is_promoted_once_every_floor_passes():
    d, state = _run(POLICY, seed=1)
    assert d.action == "promote", d.reason
    assert all(f.status == "pass" for f in d.floors)
    assert state.look == d.look and len(state.history) == d.look


@pytest.mark.parametrize(
    ("change", "floor"),
    [({"slower": 1.15}, "p99 ttft"), ({"errors": 0.02}, "error rate"), ({"agreement": 0.8}, "replay top-1")],
)
def test_a_worse_canary_is_rolled_back_naming_the_floor(change, floor):
    d, _ = _run(POLICY, seed=2, **change)
    assert d.action == "rollback" and floor in d.reason, d.reason


def test_nothing_is_promoted_below_the_minimum_evidence():
    policy = POLICY.model_copy(update={"minimum": POLICY.minimum.model_copy(update={"requests": 10**9})})
    d, _ = _run(policy, looks=12, seed=3)
    assert d.action == "continue" and "minimum evidence" in d.reason


@pytest.mark.parametrize("at_max", ["hold", "rollback"])
def test_at_the_maximum_duration_the_policy_holds_or_rolls_back(at_max):
    policy = POLICY.model_copy(
        update={
            "minimum": POLICY.minimum.model_copy(update={"requests": 10**9}),
            "max_duration_hours": 2.0,
            "at_max_duration": at_max,
        }
    )
    d, _ = _run(policy, looks=5, seed=4, hours_per_look=1.0)
    assert d.action == at_max and d.look == 2 and "maximum duration" in d.reason


def test_the_state_between_looks_round_trips_and_one_look_equals_two():
    """Looks test increments: one look at the total gives the capital of two looks at halves."""
    rng = np.random.default_rng(5)
    s1 = sim.telemetry(rng, "1", 100_000, SHAPE, BUCKETS, 0.01)
    c1 = sim.telemetry(rng, "2", 10_000, SHAPE, BUCKETS, 0.01)
    c2 = sim.accumulate(c1, sim.telemetry(rng, "2", 10_000, SHAPE, BUCKETS, 0.01))
    two = LookState("2", "1", NOW.isoformat())
    decide(POLICY, 0.95, sim.live(s1, c1, "a"), None, two, NOW)
    two = LookState.from_dict(two.to_dict())
    d2 = decide(POLICY, 0.95, sim.live(s1, c2, "b"), None, two, NOW)
    one = LookState("2", "1", NOW.isoformat())
    d1 = decide(POLICY, 0.95, sim.live(s1, c2, "b"), None, one, NOW)
    errors = {f.name: f for f in d1.floors}["error rate"]
    assert math.isclose(
        errors.fail_log_capital, {f.name: f for f in d2.floors}["error rate"].fail_log_capital
    )


def test_histograms_of_different_buckets_are_refused():
    rng = np.random.default_rng(6)
    s = sim.telemetry(rng, "1", 1000, SHAPE, BUCKETS, 0.01)
    other = sim.telemetry(rng, "2", 1000, SHAPE, sim.geometric_buckets(0.005, 30.0, 1.05), 0.01)
    with pytest.raises(ValueError, match="different buckets"):
        decide(POLICY, 0.95, sim.live(s, other, "a"), None, LookState("2", "1", NOW.isoformat()), NOW)


def test_p99_thresholds_bracket_stables_true_p99():
    from quantgate.rollout.latency import stable_p99_bounds

    hist = sim.histogram(np.random.default_rng(7), SHAPE, BUCKETS, 2_000_000, "ttft")
    lo, hi = stable_p99_bounds(hist, 0.05)
    assert isinstance(hist, LatencyHistogram)
    assert lo < SHAPE.p99() <= hi and hi / lo < 1.02**3
