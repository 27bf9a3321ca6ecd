"""The non-weight files of every artifact are the source's, readable by anyone, and load safely.

The source here is a tiny Llama whose config.json is written as transformers 4 wrote it (the
RoPE base in ``rope_theta``, ``rope_scaling``, ``torch_dtype``) and which carries a
``special_tokens_map.json``; the four targets are built under a umask of 077, so modes come
from the build and not from the environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.contracts.artifact import MANIFEST, SUPPORT_FILES, read_manifest, write_manifest
from quantgate.intake import intake
from quantgate.quantize import finalize
from quantgate.runtime.errors import BuildError
from support.builds import build_targets
from support.models import write_tiny_model

pytestmark = pytest.mark.unit

TARGETS = ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"]
ROPE_SCALING = {"type": "linear", "factor": 2.0}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    directory = write_tiny_model(tmp_path_factory.mktemp("files") / "tiny-llama-v4-config", "llama")
    config = json.loads((directory / "config.json").read_text())
    del config["rope_parameters"], config["dtype"]
    config.update(rope_theta=100000.0, rope_scaling=ROPE_SCALING, torch_dtype="bfloat16")
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    tokens = json.loads((directory / "tokenizer_config.json").read_text())
    specials = {k: tokens[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if k in tokens}
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    return directory


@pytest.fixture(scope="module")
def built(source, tmp_path_factory, repo_root, catalog) -> dict[str, Path]:
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    out = tmp_path_factory.mktemp("files-artifacts")
    umask = os.umask(0o077)
    try:
        results = build_targets(record, TARGETS, out, catalog, calibration)
    finally:
        os.umask(umask)
    return {r.target: r.path for r in results}


@pytest.mark.heavy
@pytest.mark.parametrize("target", TARGETS)
def test_support_files_are_the_sources_bytes_and_the_manifest_says_so(built, source, target):
    artifact = built[target]
    expected = {name: _sha(source / name) for name in SUPPORT_FILES if (source / name).is_file()}
    assert "special_tokens_map.json" in expected and "tokenizer.json" in expected
    for name in SUPPORT_FILES:
        assert (artifact / name).is_file() == (name in expected), name
    assert {name: _sha(artifact / name) for name in expected} == expected
    assert read_manifest(artifact).source_files == expected
    # the calibration's 512-token truncation that llm-compressor saved is gone with its copy
    assert json.loads((artifact / "tokenizer.json").read_text())["truncation"] is None


@pytest.mark.parametrize("target", TARGETS)
def test_config_keeps_the_source_fields_older_stacks_read(built, source, target):
    from transformers import AutoConfig

    config = json.loads((built[target] / "config.json").read_text())
    assert config["rope_theta"] == 100000.0 and config["rope_scaling"] == ROPE_SCALING
    assert config["torch_dtype"] == "bfloat16"
    assert "quantization_config" in config
    # transformers 5 reads the restored keys and its own rope_parameters as the same RoPE
    assert (
        AutoConfig.from_pretrained(built[target]).rope_parameters
        == AutoConfig.from_pretrained(source).rope_parameters
    )


@pytest.mark.parametrize("target", TARGETS)
def test_files_are_0644_and_directories_0755(built, target):
    artifact = built[target]
    assert stat.S_IMODE(artifact.stat().st_mode) == 0o755
    for path in artifact.rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path


@pytest.mark.parametrize("target", TARGETS)
def test_every_json_and_yaml_loads_with_safe_loaders(built, target):
    artifact = built[target]
    found = [p for p in artifact.rglob("*") if p.suffix in (".json", ".yaml", ".yml")]
    assert any(p.name == MANIFEST for p in found)
    for path in found:
        if path.suffix == ".json":
            json.loads(path.read_text())
        else:
            yaml.safe_load(path.read_text())


def test_the_gptq_recipe_is_kept_as_plain_data(built):
    recipe = yaml.safe_load((built["draft-int4"] / "recipe.yaml").read_text())
    gptq = recipe["quant_stage"]["quant_modifiers"]["GPTQModifier"]
    assert gptq["actorder"] == "static"  # an enum object in llm-compressor's own dump
    assert gptq["config_groups"]["group_0"]["weights"]["group_size"] == 64


def test_plain_yaml_constructs_nothing(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "recipe.yaml").write_text(
        "a: !!python/object/apply:compressed_tensors.quantization.quant_args.ActivationOrdering [static]\n"
        f"b: !!python/object/apply:os.system ['touch {marker}']\n"
        "c: !!python/tuple [1, 2]\n"
        "d: !!python/name:os.system ''\n"
    )
    assert finalize.plain_yaml(tmp_path) == ["recipe.yaml"]
    assert not marker.exists()
    assert yaml.safe_load((tmp_path / "recipe.yaml").read_text()) == {
        "a": "static",
        "b": f"touch {marker}",
        "c": [1, 2],
        "d": "os.system",
    }


def test_a_json_file_that_does_not_load_is_refused(tmp_path):
    (tmp_path / "extra.json").write_text("{not json")
    with pytest.raises(BuildError, match="extra.json"):
        finalize.check_safe_loading(tmp_path)


def test_a_support_file_that_differs_from_the_source_is_refused(built, source, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in SUPPORT_FILES:
        if (source / name).is_file():
            (copy / name).write_bytes((source / name).read_bytes())
    assert finalize.verify_support_files(source, copy) == read_manifest(built["hopper-fp8"]).source_files
    (copy / "tokenizer.json").write_text(json.dumps({"truncation": {"max_length": 512}}))
    with pytest.raises(BuildError, match="tokenizer.json"):
        finalize.verify_support_files(source, copy)
    (copy / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (copy / "vocab.json").write_text("{}")  # a support file the source does not have
    with pytest.raises(BuildError, match="vocab.json"):
        finalize.verify_support_files(source, copy)


def test_config_keys_come_back_nested_but_quantization_keys_do_not(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    (src / "config.json").write_text(
        json.dumps(
            {
                "rope_theta": 5e5,
                "quantization_config": {"quant_method": "fp8"},
                "text_config": {"rope_theta": 5e5, "hidden_size": 8},
            }
        )
    )
    (out / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 8}, "vocab_size": 4}))
    assert finalize.restore_config_keys(src, out) == ["rope_theta", "text_config.rope_theta"]
    assert json.loads((out / "config.json").read_text()) == {
        "rope_theta": 5e5,
        "text_config": {"hidden_size": 8, "rope_theta": 5e5},
        "vocab_size": 4,
    }
    before = (out / "config.json").read_bytes()
    assert finalize.restore_config_keys(src, out) == []
    assert (out / "config.json").read_bytes() == before  # nothing restored: not rewritten


@pytest.mark.heavy
def test_an_artifact_built_before_source_files_were_recorded_is_rebuilt(
    tiny_llama, tmp_path, catalog, repo_root
):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    # the FP8 KV scales are calibrated on it
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    first = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)[0]
    old = first.manifest.model_copy(update={"source_files": None})
    write_manifest(first.path, old)  # what the code before issue 13 wrote
    assert build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)[0].status == "built"
    again = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)[0]
    assert again.status == "reused" and again.manifest.source_files
