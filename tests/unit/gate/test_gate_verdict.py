"""The pure verdict: conservative bounds, exact comparisons, missing and unevaluated items fail,
power before verdict (insufficient evidence), intervals on every metric, and a verdict that does
not flip when the same population is sampled twice."""

from __future__ import annotations

import numpy as np
import pytest
from gate_builders import CHAIN, GSM8K, TEXT, chain_result, gsm8k_result, text_result

from quantgate.config.gates import Floor, Tenant
from quantgate.declarations.metrics import detectable_rate
from quantgate.gate.verdict import evaluate_floor, judge

pytestmark = pytest.mark.unit


def floor(**kw) -> Floor:
    return Floor(**kw)


def test_upper_end_for_lower_is_better_and_lower_end_for_higher():
    rng = np.random.default_rng(1)
    art = text_result(rng.gamma(4, 0.005, 128), agree=rng.uniform(0.85, 0.95, 128))
    src = text_result(np.zeros(128), agree=np.ones(128))
    kld = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    agree = evaluate_floor(floor(suite="wikitext", metric="top1_agreement", min=0.8), TEXT, src, art)
    assert kld.bound > kld.estimate and kld.margin == 0.05 - kld.bound and kld.passed and kld.end == "upper"
    assert agree.bound < agree.estimate and agree.margin == agree.bound - 0.8 and agree.passed
    assert agree.end == "lower" and "95% lower end" in agree.reason and "95% upper end" in kld.reason
    assert kld.interval == "betting" and kld.items == 128 and "betting test over 128 items" in kld.reason
    # power, judged before the artifact is seen: an artifact equal to the source (KL 0 and agreement 1
    # in every window) passes on these items, from 40 of them; its end sits that far from no change
    assert kld.powered and 0 < kld.mde < kld.tolerance == 0.05 and kld.no_change == 0
    assert "an unchanged artifact passes from 40" in kld.reason
    assert agree.no_change == 1.0 and agree.tolerance == pytest.approx(0.2)
    # what the confidence covers: the class, stated
    assert "kld_mean <= 0.5" in kld.coverage and "assumed, and checked" in kld.coverage
    assert "its own range: no assumption" in agree.coverage


def test_exact_comparison_no_rounding():
    # the floor set exactly at the test's end: a pass there, and a hair below it a fail
    src, art = (
        text_result(np.zeros(64), tokens=np.ones(64)),
        text_result(np.full(64, 0.01), tokens=np.ones(64)),
    )
    first = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    end = first.bound
    assert first.passed and first.estimate == pytest.approx(0.01) and 0.01 < end < 0.05
    at = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=end * (1 + 1e-6)), TEXT, src, art)
    assert at.passed
    over = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.0125), TEXT, src, art)
    assert over.passed is False and over.margin < 0 and over.bound > 0.0125


def test_kld_p99_is_decided_over_windows_from_their_largest_values():
    rng = np.random.default_rng(5)
    values = [rng.gamma(0.5, 0.1 * (1 + i % 3), 511) for i in range(64)]
    art = text_result([v.mean() for v in values], per_token_kld=values)
    src = text_result(np.zeros(64))
    res = evaluate_floor(floor(suite="wikitext", metric="kld_p99", max=2.0), TEXT, src, art)
    # the estimate is the pooled p99 of every token (torch.quantile's interpolation), not a mean of windows
    assert res.estimate == pytest.approx(np.percentile(np.concatenate(values), 99), rel=1e-12)
    assert res.estimate == pytest.approx(art["metrics"]["kld_p99"], rel=1e-12)
    assert res.interval == "betting" and res.bound > res.estimate and res.status == "pass"
    assert "fraction of tokens above the floor" in res.coverage
    # records written before windows kept their largest values: missing, not a point estimate
    for s in art["samples"]:
        s.pop("kld_top")
    old = evaluate_floor(floor(suite="wikitext", metric="kld_p99", max=2.0), TEXT, src, art)
    assert old.status == "missing" and "kld_top" in old.reason and old.bound is None


def test_agreement_at_depth_is_decided_over_traces_and_counts_those_that_reach_the_bin():
    rng = np.random.default_rng(3)
    deep = list(1 - rng.uniform(0.0, 0.04, 63)) + [0.5]  # the last trace ends before the deepest bin
    depths = [48] * 63 + [0]
    src = chain_result(np.ones(64), depth_tokens=depths)
    art = chain_result(deep, depth_tokens=depths)
    res = evaluate_floor(floor(suite="long-chain", metric="agreement_at_depth", min=0.9), CHAIN, src, art)
    # weighted by each trace's tokens in the deepest bin: a trace that ends early weighs nothing
    assert res.estimate == pytest.approx(np.mean(deep[:63]))
    assert res.interval == "betting" and res.bound < res.estimate and res.status == "pass"
    assert res.items == 63 and "63 traces" not in res.reason or "63 items" in res.reason
    # 12 traces in the deepest bin: an unchanged artifact would need more to pass at 95 %
    few, src = (
        chain_result(deep[:12], depth_tokens=[48] * 12),
        chain_result(np.ones(12), depth_tokens=[48] * 12),
    )
    res = evaluate_floor(floor(suite="long-chain", metric="agreement_at_depth", min=0.9), CHAIN, src, few)
    assert res.status == "insufficient_evidence" and "an unchanged artifact passes from" in res.reason


def test_recovery_just_under_the_floor_fails():
    # 187 of 200 kept against a source with 200: recovery 0.935 must not round up to a 0.94 floor
    src = gsm8k_result([True] * 200, [True] * 200)
    art = gsm8k_result([True] * 187 + [False] * 13, [True] * 200)
    res = evaluate_floor(floor(suite="gsm8k", metric="accuracy", min_recovery=0.94), GSM8K, src, art)
    assert res.estimate == 0.935 and res.passed is False


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda src, art: art.update(samples=[]), "missing: no per-item records (artifact)"),
        (
            lambda src, art: art["metrics"].update(kld_mean=None),
            "missing: the artifact's reported kld_mean is None",
        ),
        (lambda src, art: art["samples"].pop(), "missing: items do not pair"),
        (
            lambda src, art: [s.pop("kld_mean") for s in art["samples"]],
            "missing: per-item records lack field",
        ),
    ],
)
def test_missing_data_fails(change, expected):
    src, art = text_result(np.zeros(8)), text_result(np.full(8, 0.01))
    change(src, art)
    res = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    assert res.passed is False and res.status == "missing" and expected in res.reason


def test_items_that_could_not_be_evaluated_make_the_floor_an_error_and_fail_the_tenant():
    # a code suite with no sandbox: source and artifact "fail" alike, so no answer is lost, yet
    # nothing ran; the suite records each such item with its reason
    src = gsm8k_result([True] * 20, [True] * 20)
    art = gsm8k_result([True] * 20, [True] * 20)
    for s in src["samples"][:3]:
        s["error"] = "no sandbox: user namespaces are not available and bubblewrap is not installed"
    res = evaluate_floor(floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, src, art)
    assert res.status == "error" and res.passed is False and res.bound is None
    assert "3 of 20 source items could not be evaluated" in res.reason and "no sandbox" in res.reason
    tenant = Tenant(description="t", floors=[floor(suite="gsm8k", metric="flip_loss_rate", max=0.25)])
    v = judge(
        "a", "t", tenant, {"source": {"gsm8k": src}, "a": {"gsm8k": art}}, {"gsm8k": GSM8K}, required=True
    )
    assert v.verdict == "fail" and "no sandbox" in v.reasons[0]
    # even an advisory floor: an error is not a lack of evidence, it is a harness that did not run
    advisory = Tenant(
        description="t", floors=[floor(suite="gsm8k", metric="flip_loss_rate", max=0.25, advisory=True)]
    )
    results = {"source": {"gsm8k": src}, "a": {"gsm8k": art}}
    assert judge("a", "t", advisory, results, {"gsm8k": GSM8K}, required=True).verdict == "fail"
    # a result that counts such items (SuiteResult.errors) errs even if its records were trimmed
    counted = {**gsm8k_result([True] * 20, [True] * 20), "errors": {"lm-eval returned no result": 2}}
    res = evaluate_floor(floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, counted, art)
    assert res.status == "error" and "2 × lm-eval returned no result" in res.reason


def test_suite_not_evaluated_fails_the_verdict():
    tenant = Tenant(description="t", floors=[floor(suite="wikitext", metric="kld_mean", max=0.05)])
    results = {"source": {"wikitext": text_result(np.zeros(8))}, "a": {}}
    v = judge("a", "t", tenant, results, {"wikitext": TEXT}, required=True)
    assert v.verdict == "fail" and "missing: suite not evaluated for the artifact" in v.reasons[0]


def test_a_source_that_solves_nothing_is_insufficient_evidence_never_a_pass():
    src = gsm8k_result([False] * 8, [False] * 8)
    art = gsm8k_result([False] * 8, [False] * 8)
    rec = evaluate_floor(floor(suite="gsm8k", metric="accuracy", min_recovery=0.95), GSM8K, src, art)
    lost = evaluate_floor(floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, src, art)
    for res in (rec, lost):
        assert res.status == "insufficient_evidence" and res.passed is None and not res.informative
    assert "0/0" in rec.reason and "no answer can be lost" in lost.reason
    assert (
        lost.evidence
        == "the source's flip_loss_rate base is 0 (it solves none of these items), so no answer can be lost"
    )
    # insufficient evidence fails the verdict, unless the floor is advisory
    ratio = floor(suite="gsm8k", metric="accuracy", min_recovery=0.95)
    results = {"source": {"gsm8k": src}, "a": {"gsm8k": art}}
    v = judge("a", "t", Tenant(description="t", floors=[ratio]), results, {"gsm8k": GSM8K}, required=True)
    assert v.verdict == "fail" and "insufficient evidence" in v.reasons[0]
    # advisory alone is no pass either: a pass needs a floor that passed with evidence
    advisory = ratio.model_copy(update={"advisory": True})
    v = judge("a", "t", Tenant(description="t", floors=[advisory]), results, {"gsm8k": GSM8K}, required=True)
    assert v.verdict == "fail" and "no floor passed with evidence" in v.reasons[0]
    # beside a floor with evidence, the advisory one is reported and does not decide
    results["source"]["wikitext"], results["a"]["wikitext"] = (
        text_result(np.zeros(64)),
        text_result(np.full(64, 0.01)),
    )
    both = Tenant(description="t", floors=[advisory, floor(suite="wikitext", metric="kld_mean", max=0.05)])
    v = judge("a", "t", both, results, {"gsm8k": GSM8K, "wikitext": TEXT}, required=True)
    assert v.verdict == "pass" and [f.status for f in v.floors] == ["insufficient_evidence", "pass"]
    assert "insufficient evidence 1" in v.reasons[0] and "advisory: does not fail" in v.reasons[1]


def test_a_lucky_answer_is_no_regression():
    # the case: the source solves none of 8 GSM8K items and the artifact one; flip_rate
    # counted that gain as a flip and failed the tenant on it; lost answers do not count it
    src = gsm8k_result([False] * 8, [False] * 8)
    art = gsm8k_result([True] + [False] * 7, [False] * 8)
    rate = evaluate_floor(floor(suite="gsm8k", metric="flip_rate", max=0.25), GSM8K, src, art)
    lost = evaluate_floor(floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, src, art)
    assert rate.estimate == 0.125 and rate.bound > 0.25  # would have failed, on noise
    assert rate.status == "insufficient_evidence"  # and its 8 items could not decide it anyway
    assert lost.status == "insufficient_evidence" and lost.estimate is None


@pytest.mark.parametrize(("solved", "status"), [(4, "insufficient_evidence"), (11, "pass")])
def test_loss_rate_power_follows_the_items_the_source_solved(solved, status):
    # none lost: with 4 solved items the exact bound at no loss is 0.53, so "none lost" cannot tell
    # 0.25 (the floor) from 0; with 11 it can (0.238)
    correct = [True] * solved + [False] * (16 - solved)
    src, art = gsm8k_result(correct, correct), gsm8k_result(correct, correct)
    res = evaluate_floor(floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, src, art)
    assert res.status == status and res.mde == pytest.approx(detectable_rate(solved, 0.95))
    assert res.interval == "exact" and res.powered == (status == "pass")
    assert res.evidence is None if status == "pass" else res.evidence == f"{solved} items the source solved"


def test_a_violation_the_items_establish_fails_even_without_power():
    # all 4 items the source solved are lost: too few items to certify, enough to fail (the whole
    # interval is beyond the floor)
    src = gsm8k_result([True] * 4 + [False] * 4, [True] * 4 + [False] * 4)
    art = gsm8k_result([False] * 8, [True] * 4 + [False] * 4)
    res = evaluate_floor(floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, src, art)
    assert res.status == "fail" and res.estimate == 1.0 and "even the lower end" in res.reason
    advisory = floor(suite="gsm8k", metric="flip_loss_rate", max=0.25, advisory=True)
    assert evaluate_floor(advisory, GSM8K, src, art).status == "fail"  # established: fails even advisory
    # 2 of 5 lost: the estimate itself is beyond the floor, on items too few to establish it. A
    # violation at every sample size: it fails a required floor and shows on an advisory one
    src = gsm8k_result([True] * 5 + [False] * 5, [True] * 5 + [False] * 5)
    art = gsm8k_result([True] * 3 + [False] * 7, [True] * 5 + [False] * 5)
    res = evaluate_floor(floor(suite="gsm8k", metric="flip_loss_rate", max=0.25), GSM8K, src, art)
    assert res.estimate == 0.4 and res.status == "fail" and "the estimate itself is beyond" in res.reason
    shown = evaluate_floor(advisory, GSM8K, src, art)
    assert shown.status == "violation" and "VIOLATION" in shown.reason and "does not fail" in shown.reason


def test_one_item_is_insufficient_evidence_not_a_point_estimate():
    res = evaluate_floor(
        floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, text_result([0.0]), text_result([0.01])
    )
    assert res.status == "insufficient_evidence" and res.bound is None and res.interval is None


def test_a_source_that_solves_one_item_cannot_certify_a_recovery():
    # the source solves 1 of 8 and the artifact keeps it: the exact bound on a loss rate over one item
    # is 0.95, so even an unchanged artifact could not show a recovery of 0.9
    src = gsm8k_result([True] + [False] * 7, [True] + [False] * 7)
    res = evaluate_floor(floor(suite="gsm8k", metric="accuracy", min_recovery=0.9), GSM8K, src, src)
    assert res.status == "insufficient_evidence" and res.estimate == 1.0 and res.bound == pytest.approx(0.05)
    assert res.evidence == "1 item the source solved"


def _simulated_passes(true_loss: float, solved: int, runs: int, seed: int) -> float:
    """Fraction of simulated suites (``solved`` of 2 * ``solved`` items solved by the source, each
    lost with probability ``true_loss``) on which a flip_loss_rate max 0.2 floor passes."""
    rng = np.random.default_rng(seed)
    f = floor(suite="gsm8k", metric="flip_loss_rate", max=0.2)
    correct = np.array([True] * solved + [False] * solved)
    src = gsm8k_result(correct, correct)
    passes = 0
    for _ in range(runs):
        art = gsm8k_result(correct & (rng.random(correct.size) >= true_loss), correct)
        passes += evaluate_floor(f, GSM8K, src, art).status == "pass"
    return passes / runs


def test_a_floor_with_power_keeps_its_promise_in_simulation():
    """With power (MDE within the tolerance), a violation of the floor's own size (a true loss
    rate of 0.4 against max 0.2) passes at most 1 - confidence of the time, while a sound artifact
    (nothing lost) passes; 400 simulated suites each, fixed seed."""
    solved = 40
    assert detectable_rate(solved, 0.95) <= 0.2  # powered
    assert _simulated_passes(0.4, solved, runs=400, seed=11) <= 0.05
    assert _simulated_passes(0.0, solved, runs=50, seed=12) == 1.0


def _verdict(kld: np.ndarray, correct: np.ndarray, src_correct: np.ndarray, items: np.ndarray) -> str:
    tenant = Tenant(
        description="t",
        floors=[
            floor(suite="wikitext", metric="kld_mean", max=0.05),
            floor(suite="gsm8k", metric="flip_loss_rate", max=0.1),
            floor(suite="gsm8k", metric="accuracy", min_recovery=0.9),
        ],
    )
    results = {
        "source": {
            "wikitext": text_result(np.zeros(len(items)), items=items),
            "gsm8k": gsm8k_result(src_correct[items], src_correct[items], items=items),
        },
        "a": {
            "wikitext": text_result(kld[items], items=items),
            "gsm8k": gsm8k_result(correct[items], src_correct[items], items=items),
        },
    }
    return judge("a", "t", tenant, results, {"wikitext": TEXT, "gsm8k": GSM8K}, required=True).verdict


@pytest.mark.parametrize(("kld_scale", "flip_p", "expected"), [(0.004, 0.005, "pass"), (0.02, 0.25, "fail")])
def test_verdict_does_not_flip_on_noise(kld_scale, flip_p, expected):
    rng = np.random.default_rng(7)
    n = 2000
    kld = rng.gamma(4.0, kld_scale, n)  # mean 0.016 (clearly under 0.05) or 0.08 (clearly over)
    src_correct = rng.random(n) < 0.6
    correct = np.where(rng.random(n) < flip_p, ~src_correct, src_correct)
    order = rng.permutation(n)
    first, second = np.sort(order[:400]), np.sort(order[400:800])  # disjoint, same size
    assert (
        _verdict(kld, correct, src_correct, first) == _verdict(kld, correct, src_correct, second) == expected
    )


def test_damaged_artifact_reasons_name_metric_estimate_bound_and_floor():
    src = text_result(np.zeros(64), agree=np.ones(64))
    art = text_result(np.full(64, 0.09) + np.linspace(0, 0.01, 64), agree=np.full(64, 0.4))
    res = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    assert res.passed is False
    assert res.reason.startswith("wikitext kld_mean: estimate 0.095, 95% upper end ")
    assert "> max 0.05: FAIL (margin -0.07" in res.reason
    # windows beyond the class: the upper end lies outside it, and the reason names the windows
    worse = text_result(np.full(64, 0.9) + np.linspace(0, 0.1, 64), agree=np.full(64, 0.4))
    res = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, worse)
    assert res.status == "fail" and "upper end beyond the class" in res.reason
    assert "item 0 at 0.9, item 1 at" in res.reason and "beyond the stated class" in res.reason


def _crossing(src: dict, art: dict) -> float:
    """The kld_mean floor at which the artifact's upper end sits exactly on it (between a pass and a
    fail), by bisection: the class is in tolerances of the floor, so the end moves with the floor."""
    lo, hi = 0.0001, 0.05
    for _ in range(40):
        mid = (lo + hi) / 2
        res = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=mid), TEXT, src, art)
        lo, hi = (lo, mid) if res.passed else (mid, hi)
    return hi


def test_a_bound_within_the_machine_to_machine_spread_of_its_floor_is_marginal():
    """The verdict keeps its side of the floor but says another machine may decide otherwise;
    a bound clear of the floor by more than the spread is not marked."""
    rng = np.random.default_rng(3)
    art = text_result(rng.gamma(4, 0.005, 128), agree=rng.uniform(0.85, 0.95, 128))
    src = text_result(np.zeros(128), agree=np.ones(128))
    unmarked = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    assert unmarked.passed and not unmarked.marginal and unmarked.spread is None
    crossing = _crossing(src, art)
    near = (
        crossing + 0.0004
    )  # passes by a few ten-thousandths (the class, and so the end, moves with the floor)
    close = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=near), TEXT, src, art, spread=0.001)
    assert close.passed and close.marginal and close.spread == 0.001 and 0 < close.margin < 0.001
    assert "MARGINAL" in close.reason and "another machine may decide otherwise" in close.reason
    failing = evaluate_floor(
        floor(suite="wikitext", metric="kld_mean", max=crossing - 0.0004), TEXT, src, art, spread=0.001
    )
    assert failing.passed is False and failing.marginal
    clear = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art, spread=0.001)
    assert clear.passed and not clear.marginal

    verdict = judge(
        "hopper-fp8",
        "chat",
        Tenant(description="t", floors=[floor(suite="wikitext", metric="kld_mean", max=near)]),
        {"source": {"wikitext": src}, "hopper-fp8": {"wikitext": art}},
        {"wikitext": TEXT},
        required=True,
        spread=lambda f: 0.001,
    )
    assert verdict.verdict == "pass" and verdict.marginal


def test_a_fail_is_marginal_only_when_every_floor_failing_it_is():
    """One floor failing clearly decides the verdict on any machine; a fail is marked marginal
    only when each floor that fails it is within the spread (another machine could pass it)."""
    rng = np.random.default_rng(3)
    art = text_result(rng.gamma(4, 0.005, 128), agree=rng.uniform(0.85, 0.95, 128))
    src = text_result(np.zeros(128), agree=np.ones(128))
    close = floor(suite="wikitext", metric="kld_mean", max=_crossing(src, art) - 0.0004)  # fails by a hair
    clear = floor(suite="wikitext", metric="top1_agreement", min=0.99)  # fails by far more

    def verdict(*floors):
        return judge(
            "hopper-fp8",
            "chat",
            Tenant(description="t", floors=list(floors)),
            {"source": {"wikitext": src}, "hopper-fp8": {"wikitext": art}},
            {"wikitext": TEXT},
            required=True,
            spread=lambda f: 0.001,
        )

    assert verdict(close).verdict == "fail" and verdict(close).marginal
    both = verdict(close, clear)
    assert both.verdict == "fail" and not both.marginal
    assert any(f.marginal for f in both.floors)  # the close floor still says so itself
