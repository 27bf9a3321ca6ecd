"""Items that could not be evaluated are recorded as errors with their reason, never as wrong.

The HumanEval tests build no sandbox for real (``QUANTGATE_SANDBOX=none`` forbids it, as a
machine may) and go through the suite kind itself: nothing is generated, every problem of the
source and of the artifact alike carries the reason, no metric counts them, and the gate's
API (``item_error``, ``columns`` raising ``ItemError``) says which items they are.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from quantgate.declarations.metrics import ERROR, ItemError, item_error, item_errors
from quantgate.evaluate import sandbox
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate, reference_path
from quantgate.evaluate.suites import EvalContext, SuiteResult, load_suite
from quantgate.evaluate.suites.gsm8k import item_records

pytestmark = pytest.mark.unit


@pytest.fixture
def no_sandbox(monkeypatch):
    monkeypatch.setenv(sandbox.ENV, "none")
    reason = sandbox.unavailable()
    assert reason is not None and "QUANTGATE_SANDBOX=none" in reason
    return reason


def _humaneval(repo_root: Path, tmp_path: Path):
    suite = load_suite(repo_root / "eval_suites" / "humaneval.yaml")
    ctx = EvalContext("smoke", DataDir((tmp_path,)), repo_root, tmp_path / "cache")
    return suite, ctx


def test_humaneval_no_sandbox_items_carry_the_error_for_source_and_artifact(no_sandbox, repo_root, tmp_path):
    suite, ctx = _humaneval(repo_root, tmp_path)
    kind = suite.runner
    # no model is needed: where no sandbox can be built nothing is generated
    reference, source = kind.reference(ctx, None)
    artifact = kind.score(ctx, None, reference)
    items = suite.spec.sizes("smoke").items
    for result in (source, artifact):
        assert len(result.samples) == items
        reason = f"not run: no sandbox can be built on this machine ({no_sandbox})"
        assert result.errors == {reason: items}
        assert all(kind.item_error(s) == reason and s["passed"] is None for s in result.samples)
        # a failed program would count as 0 here; an error counts in no metric at all
        assert result.metrics["pass_at_1"] is None and result.metrics["flips_lost"] is None
        assert result.metrics["errors"] == float(items)
        assert any(
            note.startswith(f"{items} of {items} items could not be evaluated") for note in result.notes
        )
        with pytest.raises(ItemError) as info:
            kind.columns(result.samples[0])
        assert info.value.reason == reason and isinstance(info.value, KeyError)
        assert reason in str(info.value)
        on_disk = json.loads(json.dumps(asdict(result)))
        assert on_disk["errors"] == {reason: items} and on_disk["samples"][0][ERROR] == reason


def test_humaneval_counts_only_evaluated_items_and_pairs_only_those(repo_root, tmp_path):
    kind = _humaneval(repo_root, tmp_path)[0].runner

    def rec(i, passed, error=None):
        return {
            "item": f"HumanEval/{i}",
            "passed": passed,
            "status": "x",
            **({ERROR: error} if error else {}),
        }

    source = [rec(0, True), rec(1, True), rec(2, None, "not run: the sandbox failed (x)"), rec(3, False)]
    artifact = [rec(0, False), rec(1, None, "not run: the sandbox failed (y)"), rec(2, True), rec(3, True)]
    result = kind._result(artifact, source)
    assert result.metrics["pass_at_1"] == pytest.approx(2 / 3)  # HumanEval/1 is not a failure
    assert result.metrics["errors"] == 1.0
    # only items 0 and 3 are evaluated on both sides: one lost, one gained
    assert (result.metrics["flips_lost"], result.metrics["flips_gained"]) == (1.0, 1.0)
    assert result.metrics["flip_rate"] == 1.0
    assert result.errors == {"not run: the sandbox failed (y)": 1}
    assert [kind.columns(s)["correct"] for s in artifact if kind.item_error(s) is None] == [0.0, 1.0, 1.0]


def test_gsm8k_items_lm_eval_returned_nothing_for_are_errors_not_wrong():
    # lm-eval logs the test split's index as doc_id (its evaluator maps positions through `samples`)
    def log(doc_id, filter_, answer):
        return {
            "doc_id": doc_id,
            "filter": filter_,
            "exact_match": 1.0,
            "filtered_resps": [answer],
            "resps": [[answer]],
        }

    logs = [log(1, "strict-match", "4"), log(1, "flexible-extract", "4"), log(30, "flexible-extract", "5")]
    records = item_records(logs, [1, 20, 30])
    assert [r["item"] for r in records] == [1, 20, 30]
    assert item_error(records[0]) is None and records[0]["correct_flexible-extract"] is True
    assert item_error(records[1]) == "lm-eval returned no strict-match or flexible-extract result for it"
    assert item_error(records[2]) == "lm-eval returned no strict-match result for it"
    assert item_errors(records) == {
        "lm-eval returned no strict-match or flexible-extract result for it": 1,
        "lm-eval returned no strict-match result for it": 1,
    }


def test_gsm8k_metrics_leave_error_items_out(repo_root):
    kind = load_suite(repo_root / "eval_suites" / "gsm8k.yaml").runner
    ok = {"correct_strict-match": True, "correct_flexible-extract": True}
    wrong = {"correct_strict-match": False, "correct_flexible-extract": False}
    source = [{"item": 0, **ok}, {"item": 1, **ok}, {"item": 2, **wrong}]
    artifact = [{"item": 0, **ok}, {"item": 1, ERROR: "lm-eval returned no result"}, {"item": 2, **wrong}]
    result = kind._result(artifact, source)
    assert result.metrics["accuracy"] == 0.5 and result.metrics["errors"] == 1.0
    assert result.metrics["flips_lost"] == 0.0  # item 1 is not a lost answer
    assert result.errors == {"lm-eval returned no result": 1}
    with pytest.raises(ItemError):
        kind.columns(artifact[1])


def test_every_kind_refuses_columns_of_an_error_record(repo_root):
    record = {"item": 7, ERROR: "generation crashed: CUDA out of memory"}
    for name in ("wikitext", "gsm8k", "humaneval", "long-chain", "support-domain"):
        kind = load_suite(repo_root / "eval_suites" / f"{name}.yaml").runner
        with pytest.raises(ItemError, match="item 7 could not be evaluated: generation crashed"):
            kind.columns(record)
        assert kind.item_error(record) == "generation crashed: CUDA out of memory"
        assert kind.item_error({"item": 7}) is None


def test_a_suite_result_counts_its_errors_by_reason_and_says_so():
    samples = [{"item": 0}, {"item": 1, ERROR: "a"}, {"item": 2, ERROR: "a"}, {"item": 3, ERROR: "b"}]
    result = SuiteResult("s", "k", {}, samples)
    assert result.errors == {"a": 2, "b": 1}
    assert result.notes == ["3 of 4 items could not be evaluated and count in no metric: 2 × a; 1 × b"]
    again = SuiteResult(**json.loads(json.dumps(asdict(result))))  # as cached and read back
    assert again.errors == result.errors and again.notes == result.notes
    assert SuiteResult("s", "k", {}, [{"item": 0}]).errors == {}


def test_a_source_reference_with_errors_is_not_cached(no_sandbox, repo_root, tiny_llama, tmp_path):
    """Where no sandbox could be built, the next run (on a machine with one) evaluates again."""
    from quantgate.runtime.hashing import sha256_file

    suite, ctx = _humaneval(repo_root, tmp_path)
    source_hash = sha256_file(tiny_llama / "config.json").sha256
    run = evaluate(
        tiny_llama, source_hash, tmp_path / "none", tmp_path / "e", [suite], ctx, reference_only=True
    )
    assert run.reference_misses == ["humaneval"]
    assert not reference_path(ctx, suite, source_hash).exists()
    written = json.loads((tmp_path / "e" / "source" / "humaneval.json").read_text())
    assert sum(written["errors"].values()) == suite.spec.sizes("smoke").items
    assert run.summary["source"]["humaneval.pass_at_1"] is None
