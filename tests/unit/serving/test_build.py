"""The check on real artifacts: tiny models built by the pipeline load, their manifests record the
table, and a build that no declared configuration can load is refused with nothing installed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.contracts.artifact import read_manifest
from quantgate.intake import intake
from quantgate.runtime.errors import ServingError
from quantgate.serving.check import check_artifact
from support.builds import build_targets
from support.cli import quantgate

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _project(tmp_path: Path, repo_root: Path, **tp: list[int]) -> Path:
    """A project root whose targets are the repository's, with other TP sizes for some."""
    project = tmp_path / "project"
    shutil.copytree(repo_root / "targets", project / "targets")
    for name in ("recipes", "calibration_sets", "eval_suites", "gates.yaml"):
        (project / name).symlink_to(repo_root / name)
    for name, sizes in tp.items():
        path = project / "targets" / f"{name.replace('_', '-')}.yaml"
        data = yaml.safe_load(path.read_text())
        data["serving"]["tensor_parallel"] = sizes
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return project


def test_tiny_artifacts_built_by_the_pipeline_load_and_record_their_table(
    tiny_llama, tmp_path, catalog, repo_root
):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    targets = ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"]
    results = build_targets(record, targets, tmp_path / "out", catalog, calibration)
    # tiny Llama: hidden 64, 4 heads, 2 KV heads, intermediate 128
    loads = {
        "hopper-fp8": [1, 2, 4],
        "rocm-cdna3-fp8": [1, 2, 4],
        "blackwell-nvfp4": [1, 2, 4],
        "draft-int4": [1],
    }
    for r in results:
        table = read_manifest(r.path).serving
        assert table is not None and table.engine == "vllm" and table.min_version == "0.33.0"
        assert table.loadable_tp == loads[r.target], r.target
        assert table == check_artifact(
            r.path, catalog.target(r.target)
        )  # what the manifest says is the check
        every = {x.rule for d in table.refused for x in d.refusals}
        assert every <= {"attention-heads", "group-divides-partition"}, (r.target, every)  # TP rules only
    draft = read_manifest(tmp_path / "out" / "draft-int4").serving
    _, first = draft.first_refusal(2)
    assert (first.rule, first.layer) == ("group-divides-partition", "model.layers.0.self_attn.o_proj")


@pytest.mark.parametrize("fixture", ["tiny_mixtral", "tiny_qwen_moe"])
def test_tiny_moe_fp8_artifacts_load(fixture, request, tmp_path, catalog, repo_root):
    record = intake(request.getfixturevalue(fixture), load_gates(repo_root / "gates.yaml", catalog))
    # the FP8 KV scales are calibrated on it
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    result = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)[0]
    table = read_manifest(result.path).serving
    assert table.loadable_tp == [1, 2, 4]  # 4 heads: TP 8 cannot split them
    assert {r.rule for d in table.refused for r in d.refusals} == {"attention-heads"}


def test_a_build_no_declared_tp_size_can_load_is_refused_and_nothing_installed(
    tiny_llama, tmp_path, repo_root
):
    project = _project(tmp_path, repo_root, hopper_fp8=[8])  # 4 heads cannot split over 8 ranks
    catalog = Catalog(project)
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    out = tmp_path / "out"
    # the FP8 KV scales are calibrated on it
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    with pytest.raises(
        ServingError,
        match=r"^hopper-fp8: .* at TP 8 vllm 0.33.0 refuses model.layers.0.self_attn "
        r"by rule attention-heads: 4 attention heads are not divisible by TP 8",
    ):
        build_targets(record, ["hopper-fp8"], out, catalog, calibration)
    assert not out.exists()  # neither the artifact nor a temporary directory, nor the --out this build made


def test_a_changed_contract_rebuilds_and_records_the_new_table(tiny_llama, tmp_path, repo_root, catalog):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    out = tmp_path / "out"
    # the FP8 KV scales are calibrated on it
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    assert build_targets(record, ["hopper-fp8"], out, catalog, calibration)[0].status == "built"
    assert build_targets(record, ["hopper-fp8"], out, catalog, calibration)[0].status == "reused"
    narrower = Catalog(_project(tmp_path, repo_root, hopper_fp8=[1, 2]))
    again = build_targets(record, ["hopper-fp8"], out, narrower, calibration)[0]
    assert again.status == "built" and read_manifest(again.path).serving.refused == []


def test_quantgate_build_exits_1_when_the_group_size_breaks_every_tp_size(tiny_llama, tmp_path, repo_root):
    # tiny Llama's o_proj has K = 64: a group of 64 straddles the shards at TP 2, 4 and 8
    project = _project(tmp_path, repo_root, draft_int4=[2, 4, 8])
    out = tmp_path / "out"
    proc = quantgate(
        "build", "--checkpoint", str(tiny_llama), "--targets", "draft-int4", "--out", str(out),
        "--root", str(project), "--cache-dir", str(tmp_path / "cache"),
        env={"QUANTGATE_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(
        "error: draft-int4: no serving configuration in its contract can load this artifact"
    )
    assert (
        "at TP 2 vllm 0.33.0 refuses model.layers.0.self_attn.o_proj and 1 more by rule group-divides-partition: "
        "input features per shard 32 (K 64 at TP 2) are not a multiple of group size 64"
    ) in lines[0]
    assert not out.exists()  # nothing of the refused build, not even the --out directory it made
