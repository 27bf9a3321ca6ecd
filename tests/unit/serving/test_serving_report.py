"""The serving table travels from the manifest through the gate into report.json, .md and .html."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from serving_artifacts import model_config, model_tensors, quant_config, target_with, write_artifact

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.contracts.artifact import Manifest, read_manifest
from quantgate.contracts.report_schema import Report
from quantgate.gate.run import gate_results
from quantgate.intake import intake
from quantgate.report import render_html, render_markdown
from quantgate.serving.check import check_artifact
from support.builds import build_targets

pytestmark = pytest.mark.unit

E1 = Path(__file__).parents[1] / "gate" / "fixtures" / "e1"


@pytest.fixture
def draft_table(tmp_path, catalog):
    cfg = model_config(
        hidden=576, heads=9, kv_heads=3, inter=1536, layers=1, quant=quant_config("w4a16", group=64)
    )
    path = write_artifact(tmp_path / "draft-int4", cfg, model_tensors(cfg, "w4a16", group=64))
    return check_artifact(path, target_with(catalog, "draft-int4", tp=(1, 2, 3)))


def test_markdown_and_html_show_the_serving_table(draft_table):
    report = Report(model="m", approvals={"draft-int4": []}, exit_code=0, serving={"draft-int4": draft_table})
    md = render_markdown(report)
    assert "## Serving" in md
    row = next(line for line in md.splitlines() if line.startswith("| draft-int4 | vllm"))
    assert row.startswith(
        "| draft-int4 | vllm ≥ 0.33.0 on nvidia-hopper, nvidia-blackwell, amd-cdna3 | 1, 3 | TP 2: "
        "attention-heads at model.layers.0.self_attn: 9 attention heads are not divisible by TP 2"
    )
    html = render_html(report)
    assert '<table id="serving">' in html and "<td>1, 3</td>" in html
    assert "Serving" not in render_markdown(Report(model="m", approvals={}, exit_code=0))  # absent: not shown


def test_report_json_round_trips_the_table(draft_table):
    report = Report(model="m", approvals={}, exit_code=0, serving={"draft-int4": draft_table})
    assert Report.model_validate_json(report.model_dump_json()) == report


@pytest.mark.heavy
def test_a_manifest_without_serving_still_reads(tmp_path, tiny_llama, catalog, repo_root):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    artifacts = tmp_path / "artifacts"
    # the FP8 KV scales are calibrated on it
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    built = build_targets(record, ["hopper-fp8"], artifacts, catalog, calibration)[0]
    manifest = read_manifest(built.path)
    old = manifest.model_dump(exclude={"serving"})  # a manifest written before the serving check
    assert Manifest.model_validate(old).serving is None

    decision = gate_results(
        Path(shutil.copytree(E1, tmp_path / "e1")),
        repo_root / "gates.yaml",
        repo_root,
        artifacts_dir=artifacts,
    )
    assert decision.serving == {"hopper-fp8": manifest.serving}
    assert (
        "| hopper-fp8 | vllm ≥ 0.33.0 on nvidia-hopper | 1, 2, 4 | TP 8: attention-heads"
        in render_markdown(decision)
    )
