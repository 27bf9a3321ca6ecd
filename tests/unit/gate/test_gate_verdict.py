"""The pure verdict: conservative bounds, exact comparisons, missing fails, 0/0 is uninformative,
and a verdict that does not flip when the same population is sampled twice."""

from __future__ import annotations

import numpy as np
import pytest
from gate_builders import GSM8K, TEXT, gsm8k_result, text_result

from quantgate.config.gates import Floor, Tenant
from quantgate.gate.verdict import evaluate_floor, judge

pytestmark = pytest.mark.unit


def floor(**kw) -> Floor:
    return Floor(**kw)


def test_upper_bound_for_lower_is_better_and_lower_bound_for_higher():
    rng = np.random.default_rng(1)
    art = text_result(rng.gamma(4, 0.005, 40), agree=rng.uniform(0.85, 0.95, 40))
    src = text_result(np.zeros(40), agree=np.ones(40))
    kld = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    agree = evaluate_floor(floor(suite="wikitext", metric="top1_agreement", min=0.8), TEXT, src, art)
    assert kld.bound > kld.estimate and kld.margin == 0.05 - kld.bound and kld.passed
    assert agree.bound < agree.estimate and agree.margin == agree.bound - 0.8 and agree.passed
    assert kld.interval == "paired-bootstrap" and kld.items == 40


def test_exact_comparison_no_rounding():
    # constant windows: every resample gives the same float, so the bound equals the estimate
    src, art = text_result(np.zeros(8), tokens=np.ones(8)), text_result(np.full(8, 0.05), tokens=np.ones(8))
    at = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    assert at.bound == at.estimate == 0.05 and at.passed and at.margin == 0.0
    over = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05 - 1e-12), TEXT, src, art)
    assert over.passed is False and over.margin < 0
    # reasons show full precision where 6 digits would print the same number on both sides
    assert "0.05 >" in over.reason and "0.049999999999" in over.reason
    # the point-only path (kld_p99) compares exactly too
    art["metrics"]["kld_p99"] = 0.3 + 1e-12
    p99 = evaluate_floor(floor(suite="wikitext", metric="kld_p99", max=0.3), TEXT, src, art)
    assert p99.passed is False and p99.interval == "point" and "point estimate only" in p99.reason
    art["metrics"]["kld_p99"] = 0.3
    assert evaluate_floor(floor(suite="wikitext", metric="kld_p99", max=0.3), TEXT, src, art).passed


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


def test_suite_not_evaluated_fails_the_verdict():
    tenant = Tenant(description="t", floors=[floor(suite="wikitext", metric="kld_mean", max=0.05)])
    results = {"source": {"wikitext": text_result(np.zeros(8))}, "a": {}}
    v = judge("a", "t", tenant, results, {"wikitext": TEXT}, required=True)
    assert v.verdict == "fail" and "missing: suite not evaluated for the artifact" in v.reasons[0]


def test_zero_source_base_is_uninformative_not_pass():
    src = gsm8k_result([False] * 8, [False] * 8)
    art = gsm8k_result([False] * 8, [False] * 8)
    rec = evaluate_floor(floor(suite="gsm8k", metric="accuracy", min_recovery=0.95), GSM8K, src, art)
    assert (
        rec.passed is None and not rec.informative and rec.status == "uninformative" and "0/0" in rec.reason
    )
    # a suite whose only floors are uninformative cannot vouch for the artifact
    only_ratio = Tenant(description="t", floors=[floor(suite="gsm8k", metric="accuracy", min_recovery=0.95)])
    results = {"source": {"gsm8k": src}, "a": {"gsm8k": art}}
    v = judge("a", "t", only_ratio, results, {"gsm8k": GSM8K}, required=True)
    assert v.verdict == "fail" and any("no informative floor" in r for r in v.reasons)
    # with a paired floor next to it (informative at any accuracy) the verdict rests on that one
    with_flips = Tenant(
        description="t", floors=[*only_ratio.floors, floor(suite="gsm8k", metric="flip_rate", max=0.25)]
    )
    v = judge("a", "t", with_flips, results, {"gsm8k": GSM8K}, required=True)
    assert v.verdict == "pass" and [f.status for f in v.floors] == ["uninformative", "pass"]


def test_tiny_source_base_gives_no_bound_rather_than_a_guess():
    # the source solves 1 of 8: most resamples hold no source success, so no 95% bound exists
    src = gsm8k_result([True] + [False] * 7, [True] + [False] * 7)
    res = evaluate_floor(floor(suite="gsm8k", metric="accuracy", min_recovery=0.9), GSM8K, src, src)
    assert res.status == "uninformative" and res.bound is None and "too few source successes" in res.reason


def _verdict(kld: np.ndarray, correct: np.ndarray, src_correct: np.ndarray, items: np.ndarray) -> str:
    tenant = Tenant(
        description="t",
        floors=[
            floor(suite="wikitext", metric="kld_mean", max=0.05),
            floor(suite="gsm8k", metric="flip_rate", max=0.1),
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


@pytest.mark.parametrize(("kld_scale", "flip_p", "expected"), [(0.004, 0.01, "pass"), (0.02, 0.25, "fail")])
def test_verdict_does_not_flip_on_noise(kld_scale, flip_p, expected):
    rng = np.random.default_rng(7)
    n = 2000
    kld = rng.gamma(4.0, kld_scale, n)  # mean 0.016 (clearly under 0.05) or 0.08 (clearly over)
    src_correct = rng.random(n) < 0.6
    correct = np.where(rng.random(n) < flip_p, ~src_correct, src_correct)
    order = rng.permutation(n)
    first, second = np.sort(order[:200]), np.sort(order[200:400])  # disjoint, same size
    assert (
        _verdict(kld, correct, src_correct, first) == _verdict(kld, correct, src_correct, second) == expected
    )


def test_damaged_artifact_reasons_name_metric_estimate_bound_and_floor():
    src = text_result(np.zeros(8), agree=np.ones(8))
    art = text_result(np.full(8, 0.9) + np.linspace(0, 0.1, 8), agree=np.full(8, 0.4))
    res = evaluate_floor(floor(suite="wikitext", metric="kld_mean", max=0.05), TEXT, src, art)
    assert res.passed is False
    assert res.reason.startswith("wikitext kld_mean: estimate 0.95, 95% upper bound ")
    assert "> max 0.05: FAIL" in res.reason
