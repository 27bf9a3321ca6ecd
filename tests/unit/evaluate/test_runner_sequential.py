"""Sequential evaluation on tiny artifacts: a suite stops once its floors are decided, and the
windows it scored, batch by batch in the seeded order, carry the same numbers as in the fixed
evaluation of every window (a window's record does not depend on its batch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import Floor, Tenant, load_gates
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate
from quantgate.evaluate.suites import EvalContext, load_suite
from quantgate.intake import intake
from support.builds import build_targets

pytestmark = pytest.mark.unit

WINDOWS = 96  # early looks spend a tenth of 1 - c: a copy passes early from 66 windows


@pytest.fixture
def setup(tiny_llama, tmp_path, catalog, repo_root):
    policy = load_gates(repo_root / "gates.yaml", catalog)
    record = intake(tiny_llama, policy)
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    build_targets(record, ["hopper-fp8"], tmp_path / "artifacts", catalog, calibration)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_text(
        " ".join(f"Item {i} comes after item {i - 1}." for i in range(2000))
    )
    spec = tmp_path / "suites" / "tiny-text.yaml"
    spec.parent.mkdir()
    spec.write_text(
        "name: tiny-text\nkind: text\ndescription: t\ndata: {local: corpus.txt}\n"
        f"profiles: {{smoke: {{tokens: {WINDOWS * 32}, seq_len: 32, batch_size: 2}}}}\n"
        "metrics: [perplexity, kld_mean, kld_p99, top1_agreement]\n"
    )
    # one tenant with a floor the tiny FP8 artifact clears by far: decided after a few windows
    floors = [Floor(suite="tiny-text", metric="kld_mean", max=0.9)]
    gates = policy.model_copy(update={"tenants": {"t": Tenant(description="t", floors=floors)}})
    ctx = EvalContext("smoke", DataDir((tmp_path / "data",)), repo_root, tmp_path / "cache")
    return record, [load_suite(spec)], ctx, gates


def test_a_decided_suite_stops_early_with_the_fixed_evaluations_numbers(setup, tmp_path):
    record, suites, ctx, gates = setup
    source, arts = Path(record.path), tmp_path / "artifacts"
    evaluate(source, record.content_hash, arts, tmp_path / "fixed", suites, ctx)
    run = evaluate(
        source, record.content_hash, arts, tmp_path / "seq", suites, ctx, sequential=True, gates=gates
    )
    design = run.sequential["hopper-fp8"]["tiny-text"]
    assert design["stopped"] == "decided" and design["items_used"] < design["items_total"] == WINDOWS
    assert design["seconds_saved_estimate"] > 0
    fixed = json.loads((tmp_path / "fixed" / "hopper-fp8" / "tiny-text.json").read_text())["samples"]
    seq = json.loads((tmp_path / "seq" / "hopper-fp8" / "tiny-text.json").read_text())
    assert seq["sequential"]["items_used"] == len(seq["samples"])
    by_item = {r["item"]: r for r in fixed}
    assert [r["item"] for r in seq["samples"]] != sorted(r["item"] for r in seq["samples"])  # seeded order
    for r in seq["samples"]:  # each window as the fixed evaluation scored it
        for key in ("nll_sum", "kld_mean", "top1_agreement"):
            assert r[key] == pytest.approx(by_item[r["item"]][key], rel=1e-5, abs=1e-7)
    run_json = json.loads((tmp_path / "seq" / "run.json").read_text())
    assert run_json["design"] == "sequential" and run_json["sequential"]["hopper-fp8"]["tiny-text"] == design


def test_without_floors_on_a_suite_it_runs_every_item(setup, tmp_path):
    """Sequential asked, but no floor reads the suite: nothing to decide, every window, no block."""
    record, suites, ctx, gates = setup
    others = gates.model_copy(
        update={
            "tenants": {
                "t": Tenant(description="t", floors=[Floor(suite="wikitext", metric="kld_mean", max=1)])
            }
        }
    )
    run = evaluate(
        Path(record.path),
        record.content_hash,
        tmp_path / "artifacts",
        tmp_path / "seq",
        suites,
        ctx,
        sequential=True,
        gates=others,
    )
    assert run.sequential == {}
    seq = json.loads((tmp_path / "seq" / "hopper-fp8" / "tiny-text.json").read_text())
    assert len(seq["samples"]) == WINDOWS and "sequential" not in seq
