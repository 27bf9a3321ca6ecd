"""Builds on tiny random checkpoints: formats on disk, MoE handling, reuse, atomicity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.contracts.artifact import read_manifest, verify_files
from quantgate.intake import intake
from quantgate.runtime.errors import RecipeIncompatibleError
from support.builds import build_targets
from support.devices import CPU_AND_CUDA
from support.models import write_tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def calibration(repo_root):
    return build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))


@pytest.mark.heavy
def test_an_artifact_is_hashed_once_by_its_build_and_a_later_change_is_still_caught(
    tiny_llama, tmp_path, catalog, repo_root, calibration, monkeypatch
):
    """Issue 27: an 8B artifact took 9 s to verify in every evaluation after its build had hashed
    it. With the run's cache the evaluation finds the build's record (stat cache) and reads
    nothing; a file changed since, even at its old size and mtime, is hashed and refused."""
    import os

    from quantgate.runtime import hashing

    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    cache = tmp_path / "cache"
    (built,) = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration, cache=cache)
    manifest = read_manifest(built.path)
    hashed: list[str] = []
    real = hashing.sha256_file
    monkeypatch.setattr(hashing, "sha256_file", lambda path, *a: hashed.append(path.name) or real(path, *a))

    assert verify_files(built.path, manifest, cache) == [] and hashed == []
    shard = next(built.path.glob("*.safetensors"))
    before = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as they were
    assert verify_files(built.path, manifest, cache) == [f"{shard.name}: sha256 differs from the manifest"]
    assert hashed == [shard.name]  # the one changed file, read again; the others still known


def _tensors(artifact: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in artifact.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118  safe_open has keys() but is neither iterable nor a container
    return out


def _source_names(source: Path) -> set[str]:
    names: set[str] = set()
    for shard in source.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            names.update(f.keys())
    return names


@pytest.mark.heavy
def test_fp8_targets_share_bytes_and_have_per_channel_scales(
    tiny_llama, tmp_path, catalog, repo_root, calibration
):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    results = build_targets(record, ["hopper-fp8", "rocm-cdna3-fp8"], tmp_path / "out", catalog, calibration)
    assert [r.status for r in results] == ["built", "linked"]
    hopper, rocm = (r.path for r in results)

    tensors = _tensors(hopper)
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q.dtype == torch.float8_e4m3fn
    assert tensors["model.layers.0.self_attn.q_proj.weight_scale"].shape == (q.shape[0], 1)
    assert tensors["lm_head.weight"].dtype == torch.bfloat16  # lm_head is in the ignore list
    config = json.loads((hopper / "config.json").read_text())
    assert config["quantization_config"]["format"] == "float-quantized"
    assert (hopper / "tokenizer.json").exists()

    # same recipe, same bytes: rocm's weights are hard links to hopper's, its manifest its own
    shard = next(hopper.glob("*.safetensors")).name
    assert (hopper / shard).stat().st_ino == (rocm / shard).stat().st_ino
    assert read_manifest(rocm).target == "rocm-cdna3-fp8"
    assert read_manifest(rocm).numerics.weights == "fp8_e4m3fnuz"
    for artifact in (hopper, rocm):
        manifest = read_manifest(artifact)
        assert verify_files(artifact, manifest) == []
        assert manifest.source.content_hash == record.content_hash
        assert manifest.calibration.sha256 == calibration.sha256  # data-free weights; FP8 KV scales read it
        assert manifest.build.peak_rss_bytes > 0
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")], "temporary dirs left"


@pytest.mark.heavy
def test_rebuild_with_unchanged_inputs_reuses(tiny_llama, tmp_path, catalog, repo_root, calibration):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    first = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)[0]
    before = {p.name: p.stat().st_mtime_ns for p in first.path.iterdir()}
    again = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)[0]
    assert again.status == "reused"
    assert {p.name: p.stat().st_mtime_ns for p in again.path.iterdir()} == before


@pytest.mark.heavy
def test_changed_recipe_or_damaged_artifact_rebuilds(tiny_llama, tmp_path, catalog, repo_root, calibration):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    out = tmp_path / "out"
    built = build_targets(record, ["hopper-fp8"], out, catalog, calibration)[0]
    shard = next(built.path.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert build_targets(record, ["hopper-fp8"], out, catalog, calibration)[0].status == "built"

    project = tmp_path / "project"
    for part in ("targets", "recipes"):
        shutil.copytree(repo_root / part, project / part)
    recipe = project / "recipes" / "fp8-dynamic.yaml"
    # a comment says nothing: the key is the validated recipe's content (config.identity)
    recipe.write_text(recipe.read_text() + "\n# reviewed, unchanged\n")
    assert build_targets(record, ["hopper-fp8"], out, Catalog(project), calibration)[0].status == "reused"
    recipe.write_text(recipe.read_text().replace("num_samples: 16", "num_samples: 32"))
    rebuilt = build_targets(record, ["hopper-fp8"], out, Catalog(project), calibration)[0]
    assert rebuilt.status == "built"
    assert rebuilt.manifest.recipe.sha256 != built.manifest.recipe.sha256


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_moe_fp8_keeps_routers_and_quantizes_every_expert(kind, tmp_path, catalog, repo_root, calibration):
    source = write_tiny_model(tmp_path / kind, kind)
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    assert record.moe and record.model_class == "moe"
    artifact = build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, calibration)[0].path
    tensors = _tensors(artifact)
    routers = [n for n in tensors if n.endswith((".gate.weight", "shared_expert_gate.weight"))]
    experts = [n for n in tensors if ".experts." in n and n.endswith(".weight")]
    assert routers and all(tensors[n].dtype == torch.bfloat16 for n in routers)
    assert len(experts) == 2 * 4 * 3  # layers x experts x projections
    assert all(tensors[n].dtype == torch.float8_e4m3fn for n in experts)
    assert all(f"{n}_scale" in tensors for n in experts)
    # serving engines load the names transformers writes: every source weight keeps its name
    assert {n for n in _source_names(source) if n.endswith(".weight")} <= set(tensors)


@pytest.mark.heavy
def test_moe_nvfp4_calibrates_every_expert(tmp_path, catalog, repo_root, calibration):
    source = write_tiny_model(tmp_path / "mixtral", "mixtral")
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    artifact = build_targets(record, ["blackwell-nvfp4"], tmp_path / "out", catalog, calibration)[0].path
    tensors = _tensors(artifact)
    scales = {n: t for n, t in tensors.items() if ".experts." in n and n.endswith("input_global_scale")}
    assert len(scales) == 2 * 4 * 3
    # an expert that saw no calibration token would keep no finite, positive activation scale
    assert all(torch.isfinite(t).all() and (t > 0).all() for t in scales.values())
    assert all(
        tensors[n].dtype == torch.bfloat16 for n in tensors if n.endswith("block_sparse_moe.gate.weight")
    )
    assert read_manifest(artifact).calibration.sha256 == calibration.sha256
    # every source expert keeps its name (w1/w3/w2, as vLLM's Mixtral loader matches), not the
    # gate_proj/up_proj/down_proj llm-compressor's linearization saved it under
    experts = {n.removesuffix(".weight") for n in _source_names(source) if ".experts." in n}
    assert len(experts) == 2 * 4 * 3
    assert {
        n.removesuffix(".weight_packed") for n in tensors if n.endswith(".weight_packed") and ".experts." in n
    } == experts


@pytest.mark.heavy
def test_an_artifact_built_before_experts_got_the_source_names_is_rebuilt(
    tmp_path, catalog, repo_root, calibration
):
    """Same build key, intact files, but llm-compressor's expert names: not reused as it is."""
    from quantgate.contracts.artifact import hash_files, write_manifest
    from quantgate.quantize import expert_names

    source = write_tiny_model(tmp_path / "mixtral", "mixtral")
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    built = build_targets(record, ["blackwell-nvfp4"], tmp_path / "out", catalog, calibration)[0]
    expert_names.rename(built.path, {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"})
    write_manifest(built.path, built.manifest.model_copy(update={"files": hash_files(built.path)}))
    assert not verify_files(built.path, read_manifest(built.path))  # intact, as an older build left it
    again = build_targets(record, ["blackwell-nvfp4"], tmp_path / "out", catalog, calibration)[0]
    assert again.status == "built" and again.manifest.build_key == built.manifest.build_key
    assert expert_names.mismatches(source, again.path) == []


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_a_moe_calibration_load_leaves_later_intakes_as_it_found_them(kind, tmp_path, catalog, repo_root):
    """llm-compressor's MoE loader registers its per-expert layout for the model type process-wide
    (and leaves it there when the load fails): a later intake of the same kind in the same
    process then refused a sound checkpoint as lacking its fused expert tensors."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    from quantgate.quantize.engines.oneshot import OneshotEngine

    source = write_tiny_model(tmp_path / kind, kind)
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    before = repr(get_checkpoint_conversion_mapping(kind))
    try:
        OneshotEngine()._load(record)
    except Exception as exc:  # noqa: BLE001  a load that fails must not leave its mappings behind either
        print(f"the load failed: {exc!r}")
    assert repr(get_checkpoint_conversion_mapping(kind)) == before
    assert intake(source, load_gates(repo_root / "gates.yaml", catalog)).moe


# on a GPU llm-compressor leaves the calibrated model dispatched, and the cast to bf16 once
# missed its stored weights: the H200's draft-int4 was float32 and failed the serving check
@pytest.mark.heavy
@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_nvfp4_and_int4_formats(tiny_llama, tmp_path, catalog, repo_root, calibration, device):
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    results = build_targets(
        record, ["blackwell-nvfp4", "draft-int4"], tmp_path / "out", catalog, calibration, device=device
    )
    nvfp4, int4 = (_tensors(r.path) for r in results)

    packed = nvfp4["model.layers.0.mlp.down_proj.weight_packed"]
    assert packed.dtype == torch.uint8 and packed.shape == (64, 128 // 2)  # two E2M1 values a byte
    assert nvfp4["model.layers.0.mlp.down_proj.weight_scale"].dtype == torch.float8_e4m3fn
    assert nvfp4["model.layers.0.mlp.down_proj.weight_scale"].shape == (64, 128 // 16)
    assert nvfp4["model.layers.0.mlp.down_proj.weight_global_scale"].numel() == 1
    assert nvfp4["model.layers.0.mlp.down_proj.input_global_scale"].numel() == 1

    scale = int4["model.layers.0.mlp.down_proj.weight_scale"]
    assert scale.shape == (64, 128 // 64)  # groups of 64 along the input dimension
    assert int4["model.layers.0.mlp.down_proj.weight_packed"].dtype == torch.int32  # 8 int4 per int32
    # GPTQ calibrates in float32 (the recipe's compute_dtype); the artifact is stored in bf16 as the
    # source is, and serves as one (a float32 config would make vLLM load every layer in float32)
    assert scale.dtype == torch.bfloat16 and int4["model.embed_tokens.weight"].dtype == torch.bfloat16
    int4_config = json.loads((results[1].path / "config.json").read_text())
    assert int4_config["dtype"] == "bfloat16"
    config = int4_config["quantization_config"]
    assert config["format"] == "pack-quantized"
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 64
    for r in results:
        assert r.manifest.calibration.sha256 == calibration.sha256


def test_group_size_that_does_not_divide_a_layer_is_refused_before_work(
    tmp_path, catalog, repo_root, calibration
):
    source = write_tiny_model(tmp_path / "odd", "llama", hidden_size=96, intermediate_size=160)
    record = intake(source, load_gates(repo_root / "gates.yaml", catalog))
    with pytest.raises(RecipeIncompatibleError) as info:
        build_targets(record, ["draft-int4"], tmp_path / "out", catalog, calibration)
    message = str(info.value)
    assert "w4a16-gptq-g64.yaml" in message and "group size 64" in message and "ignore" in message
    assert not (tmp_path / "out").exists()


def _project_with(tmp_path, repo_root, recipe: str, old: str, new: str) -> Catalog:
    project = tmp_path / "project"
    for part in ("targets", "recipes"):
        shutil.copytree(repo_root / part, project / part)
    path = project / "recipes" / recipe
    path.write_text(path.read_text().replace(old, new))
    return Catalog(project)


def test_an_unknown_scheme_is_refused_at_preflight_naming_the_recipe(
    tiny_llama, tmp_path, catalog, repo_root
):
    from quantgate.runtime.errors import ConfigFileError

    bad = _project_with(tmp_path, repo_root, "fp8-dynamic.yaml", "scheme: FP8_DYNAMIC", "scheme: FP8_DYNAMC")
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    with pytest.raises(ConfigFileError, match="fp8-dynamic.yaml.*did you mean 'FP8_DYNAMIC'"):
        build_targets(record, ["hopper-fp8"], tmp_path / "out", bad, None)
    assert not (tmp_path / "out").exists()


def test_an_engine_failure_names_the_target_and_leaves_no_partial_artifact(
    tiny_llama, tmp_path, catalog, repo_root, calibration
):
    from quantgate.runtime.errors import BuildError

    bad = _project_with(
        tmp_path, repo_root, "w4a16-gptq-g64.yaml", "dampening_frac: 0.01", "dampening_frac: lots"
    )
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    with pytest.raises(BuildError, match="draft-int4: the llmcompressor.oneshot engine failed"):
        build_targets(record, ["draft-int4"], tmp_path / "out", bad, calibration)
    assert not (tmp_path / "out").exists()  # created by this build, so removed with its failure
