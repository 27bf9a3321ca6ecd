"""On a device whose generations are not bit-reproducible, suites that count lost answers score the
source twice, and the gate pairs an artifact's losses with the source's own (issue 43, finding 5).

A GPU cannot run here; the path is the same on the CPU when asked (``EvalContext.rerun_source``),
with a real tiny model, a real domain suite and the real gate. On the CPU the re-evaluation equals
the reference, so the paired floor sees no noise: what changes is the records and the bound's form.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import Floor, load_gates
from quantgate.declarations.metrics import RERUN
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate, reference_path
from quantgate.evaluate.suites import EvalContext, load_suite
from quantgate.gate.verdict import evaluate_floor
from quantgate.intake import intake
from support.builds import build_targets

pytestmark = pytest.mark.unit


def test_the_source_is_scored_again_and_the_gate_pairs_losses_with_its_own(
    tiny_llama, tmp_path, catalog, repo_root
):
    policy = load_gates(repo_root / "gates.yaml", catalog)
    record = intake(tiny_llama, policy)
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    build_targets(record, ["hopper-fp8"], tmp_path / "artifacts", catalog, calibration)
    suite_dir = tmp_path / "suites"
    suite_dir.mkdir()
    (suite_dir / "qa.jsonl").write_text(
        "\n".join(
            json.dumps({"prompt": f"Say {w}.", "reference": w})
            for w in ("yes", "no", "red", "blue", "one", "two")
        )
    )
    (suite_dir / "qa.yaml").write_text(
        "name: qa\nkind: domain\ndescription: t\ntenant: support\ndata: qa.jsonl\nmetric: contains\nprompt_format: raw\n"
        "profiles: {smoke: {items: 6, max_new_tokens: 4, batch_size: 3}}\n"
        "metrics: [accuracy, flips_lost, flips_gained, flip_rate]\n"
    )
    suite = load_suite(suite_dir / "qa.yaml")
    plain = EvalContext("smoke", DataDir((tmp_path,)), repo_root, tmp_path / "cache")
    again = EvalContext("smoke", DataDir((tmp_path,)), repo_root, tmp_path / "cache", rerun_source=True)
    # the re-evaluated reference is its own cache entry: a device's noise is not mixed into the CPU's
    assert reference_path(plain, suite, record.content_hash) != reference_path(
        again, suite, record.content_hash
    )
    evaluate(Path(record.path), record.content_hash, tmp_path / "artifacts", tmp_path / "E", [suite], again)
    source = json.loads((tmp_path / "E" / "source" / "qa.json").read_text())
    artifact = json.loads((tmp_path / "E" / "hopper-fp8" / "qa.json").read_text())
    assert all(RERUN in r and r[RERUN]["item"] == r["item"] for r in source["samples"])
    assert any("re-evaluated on this device" in n for n in source["notes"])
    assert all(RERUN not in r for r in artifact["samples"])
    # the CPU is bit-reproducible: the re-evaluation answers as the reference did
    assert all(r[RERUN]["correct"] == r["correct"] for r in source["samples"])
    floor = Floor(suite="qa", metric="flip_loss_rate", max=0.2)
    result = evaluate_floor(floor, suite.runner, source, artifact)
    if any(r["correct"] for r in source["samples"]):  # the tiny model solved something: a paired bound
        assert "re-evaluated on the same device" in result.coverage and result.interval == "betting"
