"""Bisection on k: the smallest passing variant within the budget, the ceiling first, shared probes.

The search is a pure function of an evaluator; here the evaluator is a known pass threshold per
tenant (what a real build, evaluation and gate decide), so every outcome can be checked exactly.
"""

from __future__ import annotations

import pytest

from quantgate.repair.search import Probe, bisect

pytestmark = pytest.mark.unit


def _evaluator(thresholds: dict[str, int], calls: list[int]):
    """Tenant t passes from k = thresholds[t] on (None in the dict: never)."""

    def evaluate(k: int) -> Probe:
        calls.append(k)
        passed = frozenset(t for t, first in thresholds.items() if first is not None and k >= first)
        return Probe(k, passed, bytes=1000 + k)

    return evaluate


@pytest.mark.parametrize("first", [1, 2, 37, 63, 64, 120])
def test_the_smallest_passing_k_is_found_with_log2_evaluations(first):
    calls: list[int] = []
    result = bisect(120, ["batch"], _evaluator({"batch": first}, calls), budget=9)
    (outcome,) = result.tenants
    assert outcome.k == first
    assert calls[0] == 120  # the ceiling first
    assert len(calls) <= 1 + 7  # ceil(log2(120)) bisection steps after it
    assert len(set(calls)) == len(calls)  # no variant built twice
    assert outcome.stopped == f"bracket closed: k={first} passes, k={first - 1} fails"


def test_a_ceiling_that_fails_stops_after_one_evaluation():
    calls: list[int] = []
    result = bisect(120, ["reasoning"], _evaluator({"reasoning": None}, calls), budget=6)
    assert calls == [120]
    (outcome,) = result.tenants
    assert outcome.k is None
    assert outcome.stopped == "no variant passes: even with all 120 layer groups kept it fails"


def test_a_spent_budget_keeps_the_smallest_variant_that_passed():
    calls: list[int] = []
    result = bisect(120, ["chat"], _evaluator({"chat": 7}, calls), budget=3)
    (outcome,) = result.tenants
    assert calls == [120, 60, 30]
    assert outcome.k == 30  # passes; smaller ones untried
    assert outcome.stopped == "budget of 3 evaluations spent: k=30 passes, k=0 fails, 29 untried between"


def test_tenants_share_probes():
    calls: list[int] = []
    result = bisect(16, ["batch", "chat"], _evaluator({"batch": 3, "chat": 9}, calls), budget=10)
    assert {o.tenant: o.k for o in result.tenants} == {"batch": 3, "chat": 9}
    # chat's search starts from what batch's probes already showed: no k is evaluated twice
    assert len(set(calls)) == len(calls)
    assert [p.k for p in result.probes] == calls


def test_nothing_to_search_is_refused():
    with pytest.raises(ValueError, match="at least one layer group"):
        bisect(0, ["batch"], _evaluator({}, []), budget=3)
