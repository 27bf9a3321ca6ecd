"""Run nothing that cannot change a verdict (issue 24): a suite no floor can decide is not run on
the artifacts, and once every tenant has failed on the suites scored so far (cheapest first), the
rest are skipped; the gate reports their floors from the source alone, never as a pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import Floor, Tenant, load_gates
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate
from quantgate.evaluate.suites import EvalContext, load_suite
from quantgate.gate.verdict import evaluate_floor
from quantgate.intake import intake
from support.builds import build_targets

pytestmark = pytest.mark.unit

TEXT = """name: tiny-text
kind: text
description: t
data: {local: corpus.txt}
profiles: {smoke: {tokens: 2048, seq_len: 32, batch_size: 16}}
metrics: [perplexity, kld_mean, kld_p99, top1_agreement]
"""
DOMAIN = """name: tiny-{metric}
kind: domain
description: questions a tiny random model answers none of
tenant: t
data: questions.jsonl
metric: {metric}
prompt_format: raw
profiles: {{smoke: {{items: {items}, max_new_tokens: 16, batch_size: 4}}}}
metrics: [{metrics}]
"""


@pytest.fixture
def world(tiny_llama, tmp_path, catalog, repo_root):
    policy = load_gates(repo_root / "gates.yaml", catalog)
    record = intake(tiny_llama, policy)
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    build_targets(record, ["hopper-fp8"], tmp_path / "artifacts", catalog, calibration)
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.txt").write_text(" ".join(f"Item {i} comes after item {i - 1}." for i in range(1200)))
    suites = tmp_path / "eval_suites"
    suites.mkdir()
    (suites / "tiny-text.yaml").write_text(TEXT)
    # 64 items for perplexity: the betting test's floor of 50 % needs about 44 before a copy can pass
    for metric, metrics, items in (("contains", "accuracy, flip_rate", 8), ("perplexity", "perplexity", 64)):
        (suites / f"tiny-{metric}.yaml").write_text(
            DOMAIN.format(metric=metric, metrics=metrics, items=items)
        )
    (suites / "questions.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"Name the {i}th prime.", "reference": f"zq{i}x"}) + "\n" for i in range(64)
        )
    )
    ctx = EvalContext("smoke", DataDir((data,)), repo_root, tmp_path / "cache")
    loaded = [
        load_suite(suites / f"{name}.yaml") for name in ("tiny-text", "tiny-contains", "tiny-perplexity")
    ]
    return record, loaded, ctx, policy, tmp_path


def _run(world, floors: list[Floor], out: str):
    record, suites, ctx, policy, tmp = world
    gates = policy.model_copy(update={"tenants": {"t": Tenant(description="t", floors=floors)}})
    run = evaluate(
        Path(record.path), record.content_hash, tmp / "artifacts", tmp / out, suites, ctx, gates=gates
    )
    return run, gates


def test_a_suite_no_floor_can_decide_is_not_run_and_the_gate_says_why(world, repo_root):
    floors = [
        Floor(suite="tiny-text", metric="kld_mean", max=0.9),
        # the source answers none of the 8 questions: no answer can be lost, no floor decided
        Floor(suite="tiny-contains", metric="flip_loss_rate", max=0.2, advisory=True),
    ]
    run, _ = _run(world, floors, "E")
    tmp = world[4]
    assert set(run.skipped["hopper-fp8"]) == {"tiny-contains"}
    assert "no floor on it can change a verdict" in run.skipped["hopper-fp8"]["tiny-contains"]
    recorded = json.loads((tmp / "E" / "hopper-fp8" / "tiny-contains.json").read_text())
    assert recorded["samples"] == [] and recorded["skipped"] == run.skipped["hopper-fp8"]["tiny-contains"]
    assert json.loads((tmp / "E" / "source" / "tiny-contains.json").read_text())["samples"]  # the source ran
    assert json.loads((tmp / "E" / "run.json").read_text())["skipped"] == run.skipped
    # the gate judges the floor from the source alone: insufficient evidence, advisory, said why
    source = json.loads((tmp / "E" / "source" / "tiny-contains.json").read_text())
    res = evaluate_floor(floors[1], world[1][1].runner, source, recorded)
    assert res.status == "insufficient_evidence" and "not run" in res.reason and res.passed is None


def test_once_every_tenant_failed_the_costlier_suites_are_skipped(world):
    floors = [
        Floor(suite="tiny-text", metric="kld_mean", max=1e-12),  # fails: any quantization moves the KL
        Floor(suite="tiny-perplexity", metric="perplexity", max_delta_pct=50),  # could decide: 64 items
    ]
    run, _ = _run(world, floors, "F")
    why = run.skipped["hopper-fp8"]["tiny-perplexity"]
    assert why.startswith("every tenant had already failed") and "tiny-text kld_mean fail" in why
    # the cheapest suite ran first: the text windows were scored
    assert json.loads((world[4] / "F" / "hopper-fp8" / "tiny-text.json").read_text())["samples"]
    # a floor that could have been decided, on a suite skipped: not run, which fails like missing data
    source = json.loads((world[4] / "F" / "source" / "tiny-perplexity.json").read_text())
    skipped = json.loads((world[4] / "F" / "hopper-fp8" / "tiny-perplexity.json").read_text())
    res = evaluate_floor(floors[1], world[1][2].runner, source, skipped)
    assert res.status == "not_run" and res.passed is False
