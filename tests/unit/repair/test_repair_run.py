"""Repair end to end on a tiny Llama: real builds, evaluations in each variant's numerics, the gate.

The tiny model's uniform NVFP4 artifact is gated against floors set from its own measured KLD
(half of it: the uniform artifact must fail), so the test does not depend on what a random model
happens to score. The search must find a variant smaller than every-group-FP8 that passes, keep
whole fused groups, record the repair in its manifest, load in transformers, and publish with its
lineage; a floor no variant can reach ends with a clear verdict and no alias.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.evaluate.data import DataDir
from quantgate.evaluate.runner import evaluate
from quantgate.evaluate.suites import EvalContext, load_suite
from quantgate.gate.run import gate_results, write_report_json
from quantgate.intake import intake
from quantgate.quantize.pipeline import build_planned, plan
from quantgate.repair.run import RepairInputs, repair
from quantgate.repair.units import quantized_units
from quantgate.serving.check import require_loadable
from support.repair_project import TARGET, write_gates

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


@pytest.fixture(scope="module")
def gated_run(tmp_path_factory, repo_root, _tiny_models):
    """The uniform NVFP4 artifact built, evaluated and gated with floors set from its own KLD, and
    repaired once (the tests below read what that repair did)."""
    import shutil

    from support.repair_project import make_project

    tmp_path = tmp_path_factory.mktemp("repair-run")
    project = make_project(tmp_path / "project", repo_root)
    tiny_llama = Path(shutil.copytree(_tiny_models["llama"], tmp_path / "tiny-llama"))
    catalog = Catalog(project)
    record = intake(tiny_llama, load_gates(project / "gates.yaml", catalog))
    calibration = build_set(load_spec(project / "calibration_sets" / "default.yaml"))
    planned = plan(catalog, [TARGET])
    build_planned(record, planned, tmp_path / "artifacts", calibration)
    suites = [load_suite(project / "eval_suites" / "tiny-text.yaml")]
    ctx = EvalContext("smoke", DataDir((project / "data",)), project, tmp_path / "cache")
    run = evaluate(
        Path(record.path), record.content_hash, tmp_path / "artifacts", tmp_path / "eval", suites, ctx
    )
    uniform_kld = run.summary[TARGET]["tiny-text.kld_mean"]
    assert uniform_kld is not None and uniform_kld > 0
    gates_path = write_gates(project, loose=uniform_kld / 2, impossible=uniform_kld / 1e6)
    report = gate_results(tmp_path / "eval", gates_path, project, artifacts_dir=tmp_path / "artifacts")
    write_report_json(report, tmp_path / "report")
    inputs = RepairInputs(
        source=record,
        planned={p.target.name: p for p in planned},
        calibration=calibration,
        suites=suites,
        ctx=ctx,
        gates_path=gates_path,
        project_root=project,
        model="tiny",
    )
    outcome = repair(report, tmp_path / "artifacts", tmp_path / "repair", inputs)
    return report, inputs, uniform_kld, outcome, tmp_path


def test_a_failed_tenant_gets_the_smallest_passing_variant_and_an_impossible_one_none(gated_run):
    report, inputs, uniform_kld, outcome, tmp_path = gated_run
    assert {v.tenant: v.verdict for v in report.verdicts} == {
        "loose": "fail",
        "impossible": "fail",
        "unrepaired": "fail",
    }
    assert outcome.skipped == {}
    (searched,) = outcome.targets
    units = quantized_units(tmp_path / "artifacts" / TARGET)
    assert searched.units == len(units) == 8  # 2 layers x (qkv, o, gate_up, down)
    by_tenant = {t.tenant: t for t in searched.tenants}
    assert set(by_tenant) == {"loose", "impossible"}  # 'unrepaired' is not marked repair: true

    # the ceiling (every group FP8) is tried first, then bisection, within the budget
    assert searched.probes[0].k == searched.units
    assert len(searched.probes) <= 6
    loose = by_tenant["loose"]
    assert loose.k is not None and 0 < loose.k < searched.units, loose
    assert "bracket closed" in loose.stopped
    chosen = next(p for p in searched.probes if p.k == loose.k)
    assert "loose" in chosen.passed
    assert chosen.quality["tiny-text.kld_mean"] < uniform_kld / 2
    fails_below = [p for p in searched.probes if p.k == loose.k - 1]
    assert not fails_below or "loose" not in fails_below[0].passed
    assert chosen.bytes < searched.probes[0].bytes  # smaller than keeping everything at FP8

    impossible = by_tenant["impossible"]
    assert impossible.k is None and impossible.variant is None
    assert f"even with all {searched.units} layer groups kept it fails" in impossible.stopped

    # the chosen variant: whole fused groups kept, recorded, loadable, approved only for 'loose'
    variant = Path(loose.variant) / "artifacts" / TARGET
    manifest = json.loads((variant / "manifest.json").read_text())
    kept = manifest["repair"]["kept_modules"]
    assert len(manifest["repair"]["kept_units"]) == loose.k
    for unit in units:
        assert set(unit.modules) <= set(kept) or not set(unit.modules) & set(kept)
    assert manifest["serving"] == require_loadable(
        variant, Catalog(inputs.project_root).target(TARGET)
    ).model_dump(mode="json")
    config = json.loads((variant / "config.json").read_text())["quantization_config"]
    formats = sorted(g["format"] for g in config["config_groups"].values())
    assert formats == ["float-quantized", "nvfp4-pack-quantized"]
    publishable = json.loads((Path(loose.variant) / "publish" / "report.json").read_text())
    assert publishable["approvals"] == {TARGET: ["loose"]}
    assert publishable["exit_code"] == 0
    # the gate's own decision (issue 26 item 6), not an edited report: its note says why
    assert any(n.startswith("repaired variant: ") for n in publishable["notes"])
    assert publishable["required"] == [] and publishable["optional"] == [TARGET]
    repair_json = json.loads((tmp_path / "repair" / "repair.json").read_text())
    assert repair_json["targets"][0]["tenants"] == [t.model_dump(mode="json") for t in searched.tenants]


def test_the_variant_loads_in_transformers_with_each_group_in_its_scheme(gated_run):
    import torch
    from transformers import AutoModelForCausalLM

    outcome = gated_run[3]
    (loose,) = [t for t in outcome.targets[0].tenants if t.tenant == "loose"]
    variant = Path(loose.variant) / "artifacts" / TARGET
    kept = set(json.loads((variant / "manifest.json").read_text())["repair"]["kept_modules"])
    model = AutoModelForCausalLM.from_pretrained(variant)
    bits = {
        name: m.quantization_scheme.weights.num_bits
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and getattr(m, "quantization_scheme", None) is not None
    }
    assert {bits[name] for name in kept} == {8}
    assert {b for name, b in bits.items() if name not in kept} == {4}
    logits = model(torch.tensor([[1, 5, 7]])).logits
    assert logits.shape[-1] == 512 and torch.isfinite(logits).all()


def test_a_published_variant_is_its_own_version_with_lineage_and_only_its_alias(gated_run, tmp_path):
    from quantgate.publish import RegistryConfig, publish_report, tracking
    from support.artifacts import write_report

    outcome, run = gated_run[3], gated_run[4]
    registry = RegistryConfig.local(tmp_path / "registry")
    # the uniform artifact, recorded (it passed nothing): the variant's parent in the registry
    uniform_report = write_report(tmp_path / "uniform-report", {TARGET: []}, tenants=("loose",), model="tiny")
    (uniform,) = publish_report(uniform_report, run / "artifacts", registry).artifacts
    (loose,) = [t for t in outcome.targets[0].tenants if t.tenant == "loose"]
    where = Path(loose.variant)
    (variant,) = publish_report(where / "publish" / "report.json", where / "artifacts", registry).artifacts

    assert variant.registered_model == uniform.registered_model == f"tiny.{TARGET}"
    assert variant.version != uniform.version
    assert variant.aliases == ["approved-loose"]
    client = tracking.client(registry)
    tags = client.get_model_version(variant.registered_model, variant.version).tags
    assert tags["quantgate.repair.upgrade"] == "FP8"
    assert tags["quantgate.repair.kept"] == f"{loose.k} of 8"
    assert tags["quantgate.repair.parent_version"] == uniform.version
    assert tags["quantgate.repair.parent_build_key"] == outcome.targets[0].parent_build_key
    assert len(tags["quantgate.repair.kept_units"].split(",")) == loose.k
    aliases = client.get_registered_model(variant.registered_model).aliases
    assert {alias: str(v) for alias, v in aliases.items()} == {"approved-loose": variant.version}
