"""Power judged before the artifact is seen, and statuses monotone in damage (issue 24).

Power once came from the artifact's own interval, so more damage widened it and turned a violated
floor into "insufficient evidence", which an advisory floor ignores: an artifact losing 6-8 of the
20 HumanEval answers its source solved was ignored while losing 10 failed. Now a floor's power is
whether an artifact equal to the source would pass on these items (``floor.plan``, from the source's
records alone), and an estimate beyond the floor is a violation at every sample size.
"""

from __future__ import annotations

import numpy as np
import pytest
from gate_builders import CHAIN, GSM8K, TEXT, chain_result, gsm8k_result, text_result

from quantgate.config.gates import Floor
from quantgate.gate import floor as step
from quantgate.gate.verdict import _aligned, as_result, evaluate_floor

pytestmark = pytest.mark.unit

RANK = {"pass": 0, "insufficient_evidence": 1, "violation": 2, "fail": 2}


def _answers(solved: int, lost: int, items: int = 200):
    source = [True] * solved + [False] * (items - solved)
    artifact = [False] * lost + [True] * (solved - lost) + [False] * (items - solved)
    return gsm8k_result(source, source), gsm8k_result(artifact, source)


@pytest.mark.parametrize("solved", [20, 40, 100])
def test_losing_30_percent_of_the_solved_answers_fails_a_required_floor_and_shows_on_an_advisory_one(solved):
    src, art = _answers(solved, round(0.3 * solved))
    required = evaluate_floor(Floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, src, art)
    assert required.status == "fail" and required.estimate == pytest.approx(0.3)
    advisory = evaluate_floor(
        Floor(suite="gsm8k", metric="flip_loss_rate", max=0.25, advisory=True), GSM8K, src, art
    )
    assert advisory.status in ("fail", "violation") and advisory.status != "insufficient_evidence"
    assert "FAIL" in advisory.reason or "VIOLATION" in advisory.reason
    # the strict tenant's 5 % floor: 20 or 40 solved items cannot certify it (100 can), yet the loss
    # is established either way
    strict = evaluate_floor(
        Floor(suite="gsm8k", metric="flip_loss_rate", max=0.05, advisory=True), GSM8K, src, art
    )
    assert strict.status == "fail" and strict.powered == (solved == 100)
    assert ("even the lower end" in strict.reason) == (solved < 100)


def test_power_comes_from_the_source_alone():
    src, sound = _answers(20, 0)
    _, broken = _answers(20, 10)
    floor = Floor(suite="gsm8k", metric="flip_loss_rate", max=0.25)
    plans = []
    for art in (sound, broken):
        _, s, _, _ = _aligned(GSM8K, as_result(src), as_result(art), None)
        plans.append(step.plan(floor, GSM8K.metrics()[floor.metric], s, confidence=0.95))
    assert plans[0].powered == plans[1].powered is True and plans[0].mde == plans[1].mde
    assert plans[0].evidence == "20 items the source solved"


def _statuses(results, floor, suite, source) -> list[str]:
    return [evaluate_floor(floor, suite, source, art).status for art in results]


@pytest.mark.parametrize("advisory", [False, True])
@pytest.mark.parametrize("solved", [3, 8, 20, 60])
def test_lost_answers_status_is_monotone_in_damage(solved, advisory):
    floor = Floor(suite="gsm8k", metric="flip_loss_rate", max=0.25, advisory=advisory)
    src, _ = _answers(solved, 0, items=100)
    arts = [_answers(solved, lost, items=100)[1] for lost in range(solved + 1)]
    ranks = [RANK[s] for s in _statuses(arts, floor, GSM8K, src)]
    assert ranks == sorted(ranks), ranks
    assert ranks[-1] == 2  # losing every solved answer never hides as insufficient evidence


@pytest.mark.parametrize("advisory", [False, True])
@pytest.mark.parametrize("windows", [4, 16, 64])
@pytest.mark.parametrize(
    ("metric", "kind", "limit"),
    [("kld_mean", "max", 0.05), ("kld_p99", "max", 0.5), ("top1_agreement", "min", 0.85)],
)
def test_text_status_is_monotone_in_damage(windows, metric, kind, limit, advisory):
    rng = np.random.default_rng(windows)
    shape = rng.gamma(2.0, 0.5, windows)  # the same windows, damaged more and more
    src = text_result(np.zeros(windows), agree=np.ones(windows))
    arts = [
        text_result(scale * 0.05 * shape, agree=np.clip(1.0 - scale * 0.15 * shape, 0.0, 1.0))
        for scale in np.linspace(0.0, 4.0, 17)
    ]
    floor = Floor(suite="wikitext", metric=metric, advisory=advisory, **{kind: limit})
    ranks = [RANK[s] for s in _statuses(arts, floor, TEXT, src)]
    assert ranks == sorted(ranks), ranks
    assert ranks[-1] == 2


def test_agreement_at_depth_is_monotone_in_damage_over_traces():
    depths = [48] * 60 + [0] * 4
    src = chain_result(np.ones(64), depth_tokens=depths)
    floor = Floor(suite="long-chain", metric="agreement_at_depth", min=0.97)
    arts = [
        chain_result(1.0 - d * np.linspace(0.5, 1.5, 64), depth_tokens=depths)
        for d in np.linspace(0, 0.1, 11)
    ]
    ranks = [RANK[s] for s in _statuses(arts, floor, CHAIN, src)]
    assert ranks == sorted(ranks) and ranks[0] == 0 and ranks[-1] == 2


def test_a_suite_that_cannot_change_a_verdict_is_known_from_the_source():
    """The 135 M default's smoke GSM8K: the source solves 1 of 4 items. No artifact can pass an
    advisory loss floor there, nor establish a violation: the suite need not run on any artifact."""
    src, _ = _answers(1, 0, items=4)
    _, s, _, _ = _aligned(GSM8K, as_result(src), as_result(src), None)
    for value in (0.25, 0.05, 0.5):
        floor = Floor(suite="gsm8k", metric="flip_loss_rate", max=value, advisory=True)
        p = step.plan(floor, GSM8K.metrics()["flip_loss_rate"], s, confidence=0.95)
        assert not p.powered and not step.can_change_verdict(p, advisory=True)
        required = floor.model_copy(update={"advisory": False})
        assert not step.can_change_verdict(p, advisory=required.advisory)  # it blocks whatever happens
    # 3 solved items: losing all 3 would establish a loss above 25 %, so the suite must run
    src, _ = _answers(3, 0, items=4)
    _, s, _, _ = _aligned(GSM8K, as_result(src), as_result(src), None)
    p = step.plan(
        Floor(suite="gsm8k", metric="flip_loss_rate", max=0.25),
        GSM8K.metrics()["flip_loss_rate"],
        s,
        confidence=0.95,
    )
    assert not p.powered and step.can_change_verdict(p, advisory=True)
