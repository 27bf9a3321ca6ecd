"""The gate on sequentially evaluated suites: early decisions by the confidence sequence, the
fixed design when items run out, and verdicts that agree with the fixed design's.

The stopping rule is ``evaluate.sequential.run`` itself, with a batch "scored" by reading
synthetic per-window records (gate_builders.text_result): no model.
"""

from __future__ import annotations

import numpy as np
import pytest
from gate_builders import REPO, TEXT, text_result

from quantgate.config.gates import Floor, load_gates
from quantgate.config.targets import Catalog
from quantgate.evaluate.sequential import order, run, watched
from quantgate.evaluate.suites import SuiteResult, load_suite
from quantgate.stats import sequence

pytestmark = pytest.mark.unit
from quantgate.gate.verdict import evaluate_floor

WIKITEXT = load_suite(REPO / "eval_suites" / "wikitext.yaml")
GATES = load_gates(REPO / "gates.yaml", Catalog(REPO))
KLD_FLOOR = Floor(suite="wikitext", metric="kld_mean", max=0.05)


def source(n: int) -> dict:
    return text_result(np.zeros(n), agree=np.ones(n))


def sequential(artifact: dict, src: dict, target: str = "hopper-fp8") -> dict:
    """The artifact's result as a sequential evaluation would record it (batches of 4)."""
    by_item = {r["item"]: r for r in artifact["samples"]}
    watches = watched(GATES, "wikitext", target)
    result = SuiteResult("wikitext", "text", src["metrics"], src["samples"])
    samples, design = run(
        WIKITEXT, result, watches, len(src["samples"]), lambda pos: [by_item[i] for i in pos], batch=4
    )
    return {**artifact, "samples": samples, "sequential": design}


def test_items_come_in_a_fixed_seeded_order():
    """The order is a permutation, the same on every run, and not the file's order."""
    first = order(WIKITEXT, 64)
    assert sorted(first) == list(range(64)) and first == order(WIKITEXT, 64) and first != list(range(64))


def test_a_broken_artifact_stops_early_and_fails_on_the_class_or_the_test():
    """KL 2 nats per window on 64 windows, beyond the stated class (10 tolerances, 0.5): the first
    batch fails every KL floor on wikitext, naming the window; KL 0.3 per window, within the class:
    the always-valid test fails it after a few batches, its lower end beyond the floor."""
    n = 64
    src = source(n)
    broken = text_result(np.full(n, 2.0), agree=np.full(n, 0.2), nll=np.full(n, 511 * 6.0))
    seq = sequential(broken, src)
    assert seq["sequential"]["stopped"] == "decided" and seq["sequential"]["items_used"] == 4
    floor = evaluate_floor(KLD_FLOOR, TEXT, src, seq, confidence=0.95)
    assert (
        floor.status == "fail"
        and "beyond the class" in floor.reason
        and "decided after 1 of 4" in floor.reason
    )
    # the report shows what was measured on the items used, as the fixed design would
    assert floor.estimate == pytest.approx(2.0)
    agreement = evaluate_floor(
        Floor(suite="wikitext", metric="top1_agreement", min=0.85), TEXT, src, seq, confidence=0.95
    )
    assert agreement.status == "fail" and agreement.estimate == pytest.approx(0.2)

    damaged = text_result(np.full(n, 0.3), agree=np.full(n, 0.95))
    seq = sequential(damaged, src)
    assert seq["sequential"]["stopped"] == "decided" and seq["sequential"]["items_used"] < n
    floor = evaluate_floor(KLD_FLOOR, TEXT, src, seq, confidence=0.95)
    assert floor.status == "fail" and floor.interval == "confidence-sequence" and floor.end == "lower"
    assert floor.items == seq["sequential"]["items_used"]
    assert "always-valid lower end" in floor.reason and "sequential:" in floor.reason
    # an early fail's bound is the end that establishes it (the lower end of a KL above its floor), so
    # its margin is measured from that end: within the spread of the floor it is marked marginal
    assert floor.bound is not None and KLD_FLOOR.max < floor.bound < floor.estimate
    assert floor.margin == pytest.approx(KLD_FLOOR.max - floor.bound)


def test_a_sound_artifact_runs_out_of_items_and_gets_the_fixed_design():
    """KL 0.005 on 48 windows cannot be decided early (early looks spend a tenth of the error rate:
    a perfect copy needs 66 windows): every window is scored and the fixed design decides, as it
    does without sequential evaluation, at the confidence the early looks left."""
    n = 48
    src = source(n)
    sound = text_result(np.full(n, 0.005) + 0.001 * np.sin(np.arange(n)), agree=np.full(n, 0.97))
    seq = sequential(sound, src)
    assert seq["sequential"]["stopped"] == "exhausted" and seq["sequential"]["items_used"] == n
    fixed = evaluate_floor(KLD_FLOOR, TEXT, src, sound, confidence=0.95)
    late = evaluate_floor(KLD_FLOOR, TEXT, src, seq, confidence=0.95)
    assert fixed.status == late.status == "pass"
    assert late.interval == "betting" and late.bound >= fixed.bound  # 95.5% vs 95%
    assert "stopped: exhausted" in late.reason


def test_the_final_fixed_bound_spends_what_early_looks_left():
    """Early decisions spend SHARE of 1 - c; the fixed bound at the end the rest: together 1 - c."""
    c = 0.95
    assert sequence.early_alpha(c) + (1 - sequence.final_confidence(c)) == pytest.approx(1 - c)
