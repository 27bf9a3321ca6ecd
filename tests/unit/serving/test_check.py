"""The check as a whole: the default model's shape, the refusal's one line, the contract in targets/*.yaml."""

from __future__ import annotations

import pytest
import yaml
from serving_artifacts import model_config, model_tensors, quant_config, target_with, write_artifact

from quantgate.config.targets import Catalog
from quantgate.runtime.errors import ConfigFileError, ServingError
from quantgate.serving.check import check_artifact, require_loadable

pytestmark = pytest.mark.unit


@pytest.fixture
def default_w4a16(tmp_path):
    """SmolLM2-135M's shapes (9 heads, 3 KV heads, hidden 576, intermediate 1536) as W4A16 g64 headers."""
    cfg = model_config(
        hidden=576, heads=9, kv_heads=3, inter=1536, layers=2, quant=quant_config("w4a16", group=64)
    )
    return write_artifact(tmp_path / "draft-int4", cfg, model_tensors(cfg, "w4a16", group=64))


def test_the_default_models_draft_loads_only_at_tp_1_and_3(default_w4a16, catalog):
    table = check_artifact(default_w4a16, target_with(catalog, "draft-int4", tp=(1, 2, 3, 4, 8)))
    assert table.loadable_tp == [1, 3]
    assert table.refused_tp == [2, 4, 8]
    assert table.hardware == ["nvidia-hopper", "nvidia-blackwell", "amd-cdna3"]  # any-gpu: where it is native
    for tp in (2, 4, 8):
        rules = {r.rule for d in table.refused if d.tp == tp for r in d.refusals}
        assert {"attention-heads", "group-divides-partition"} <= rules
    version, first = table.first_refusal(2)
    assert (version, first.rule, first.layer) == ("0.33.0", "attention-heads", "model.layers.0.self_attn")


def test_no_loadable_tp_size_is_refused_in_one_line_naming_layer_tp_and_rule(default_w4a16, catalog):
    target = target_with(catalog, "draft-int4", tp=(2, 4, 8))
    with pytest.raises(ServingError) as caught:
        require_loadable(default_w4a16, target)
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code == 1
    assert message.startswith("draft-int4: no serving configuration in its contract can load this artifact")
    assert "at TP 2 vllm 0.33.0 refuses model.layers.0.self_attn by rule attention-heads" in message
    assert "[vllm 0.23.0-0.33.0 config/model.py:ModelConfig.verify_with_parallel_config]" in message
    assert message.endswith("TP 4, 8 refused as well")
    assert caught.value.table.loadable_tp == []


def test_the_repositorys_targets_declare_a_contract(catalog):
    for name in catalog.target_names():
        serving = catalog.target(name).serving
        assert serving.engine == "vllm" and serving.min_version == "0.33.0"
        assert serving.tensor_parallel == [1, 2, 4, 8]


def _project(tmp_path, repo_root, name: str, serving: dict) -> Catalog:
    (tmp_path / "targets").mkdir()
    data = yaml.safe_load((repo_root / "targets" / f"{name}.yaml").read_text())
    data["serving"] = serving
    (tmp_path / "targets" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "recipes").symlink_to(repo_root / "recipes")
    return Catalog(tmp_path)


@pytest.mark.parametrize(
    ("serving", "problem"),
    [
        (
            {"engine": "vllm", "min_version": "0.32.0", "tensor_parallel": [1]},
            "not a release whose load rules",
        ),
        ({"engine": "sglang", "min_version": "0.33.0", "tensor_parallel": [1]}, "engine"),
        ({"engine": "vllm", "min_version": "0.33.0", "tensor_parallel": []}, "tensor_parallel"),
        ({"engine": "vllm", "min_version": "0.33.0", "tensor_parallel": [1, 1]}, "lists a size twice"),
        ({"engine": "vllm", "min_version": "0.33.0", "tensor_parallel": [0]}, "tensor_parallel"),
        ({"engine": "vllm", "min_version": "0.33.0", "tp": [1]}, "tp"),
    ],
)
def test_a_malformed_contract_is_refused_naming_the_file(serving, problem, tmp_path, repo_root):
    catalog = _project(tmp_path, repo_root, "hopper-fp8", serving)
    with pytest.raises(ConfigFileError) as caught:
        catalog.target("hopper-fp8")
    assert "hopper-fp8.yaml" in str(caught.value) and problem in str(caught.value)
    assert caught.value.exit_code == 2


def test_a_hardware_without_a_kernel_model_is_a_config_error(default_w4a16, catalog):
    target = target_with(catalog, "draft-int4", hardware="intel-gaudi3").model_copy(
        update={
            "numerics": catalog.target("draft-int4").numerics.model_copy(
                update={"native_on": ["intel-gaudi3"]}
            )
        }
    )
    with pytest.raises(ConfigFileError, match="names no platform"):
        check_artifact(default_w4a16, target)
