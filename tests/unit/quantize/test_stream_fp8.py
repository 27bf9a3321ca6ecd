"""quantgate.stream_fp8 writes llm-compressor's FP8_DYNAMIC artifact, tensor for tensor.

The reference is the engine it replaces for the fp8-dynamic recipe (``llmcompressor.model_free``,
i.e. ``model_free_ptq``), run on the same checkpoints through the same pipeline. The contract
(issue 7): scales equal; FP8 codes equal on at least 99.9% of elements and never more than one
code apart; the same ``quantization_config``, tensor names, shapes, dtypes and shard names.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.intake import intake
from quantgate.quantize.engines.fp8_channel import FP8, quantize_rows
from quantgate.quantize.engines.stream_fp8 import plan
from quantgate.runtime.errors import ConfigFileError, RecipeIncompatibleError
from support.builds import build_targets
from support.models import write_large_llama

pytestmark = pytest.mark.unit

IGNORE = ["lm_head", "re:.*embed_tokens$", "re:.*\\.gate$", "re:.*shared_expert_gate$", "re:.*router$"]


def _catalog_with_engine(tmp_path: Path, repo_root: Path, engine: str) -> Catalog:
    project = tmp_path / f"project-{engine}"
    for part in ("targets", "recipes"):
        shutil.copytree(repo_root / part, project / part)
    recipe = project / "recipes" / "fp8-dynamic.yaml"
    text = recipe.read_text()
    current = next(line for line in text.splitlines() if line.startswith("engine:"))
    recipe.write_text(text.replace(current, f"engine: {engine}"))
    return Catalog(project)


def _build(source: Path, tmp_path: Path, repo_root: Path, engine: str) -> Path:
    catalog = _catalog_with_engine(tmp_path, repo_root, engine)
    record = intake(source, load_gates(repo_root / "gates.yaml", Catalog(repo_root)))
    # FP8 KV: both engines' artifacts get the same KV pass on the same calibration set
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    result = build_targets(record, ["hopper-fp8"], tmp_path / f"out-{engine}", catalog, calibration)[0]
    assert result.manifest.recipe.engine == engine
    return result.path


def _by_name(artifact: Path) -> dict[str, tuple[str, torch.Tensor]]:
    out = {}
    for shard in sorted(artifact.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out.update({k: (shard.name, f.get_tensor(k)) for k in f.keys()})  # noqa: SIM118 (safe_open is no dict)
    return out


def _ordinal(codes: torch.Tensor) -> torch.Tensor:
    """An fp8 value's position on the e4m3 grid: sign-magnitude bytes made monotonic."""
    raw = codes.view(torch.uint8).to(torch.int16)
    return torch.where(raw >= 128, -(raw - 128), raw)


def assert_same_artifact(ours: Path, reference: Path) -> None:
    a, b = _by_name(ours), _by_name(reference)
    assert a.keys() == b.keys()
    for name, (shard, tensor) in a.items():
        ref_shard, ref = b[name]
        assert (shard, tensor.dtype, tensor.shape) == (ref_shard, ref.dtype, ref.shape), name
        if tensor.dtype == FP8:
            assert (tensor.view(torch.uint8) == ref.view(torch.uint8)).float().mean() >= 0.999, name
            assert int((_ordinal(tensor) - _ordinal(ref)).abs().max()) <= 1, (
                f"{name}: codes more than one step apart"
            )
        else:
            assert torch.equal(tensor, ref), f"{name}: not equal (scales and kept tensors must be)"
    config = json.loads((ours / "config.json").read_text())
    ref_config = json.loads((reference / "config.json").read_text())
    assert config == ref_config  # quantization_config included, and nothing else changed
    index = json.loads((ours / "model.safetensors.index.json").read_text())
    assert index == json.loads((reference / "model.safetensors.index.json").read_text())


@pytest.mark.heavy
@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_mixtral", "tiny_qwen_moe"])
def test_same_artifact_as_model_free_ptq(fixture, request, tmp_path, repo_root):
    source = request.getfixturevalue(fixture)
    ours = _build(source, tmp_path, repo_root, "quantgate.stream_fp8")
    reference = _build(source, tmp_path, repo_root, "llmcompressor.model_free")
    assert_same_artifact(ours, reference)
    tensors = _by_name(ours)
    routers = [n for n in tensors if n.endswith((".gate.weight", "shared_expert_gate.weight"))]
    assert all(tensors[n][1].dtype == torch.bfloat16 for n in routers)


@pytest.mark.heavy
def test_multi_shard_checkpoint_keeps_its_shards_and_index(tmp_path, repo_root):
    source = write_large_llama(
        tmp_path / "sharded",
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        vocab_size=512,
        max_shard_bytes=400 * 1024,
    )
    assert len(list(source.glob("*.safetensors"))) >= 3
    ours = _build(source, tmp_path, repo_root, "quantgate.stream_fp8")
    assert_same_artifact(ours, _build(source, tmp_path, repo_root, "llmcompressor.model_free"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rows_quantize_exactly_as_compressed_tensors(dtype):
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    torch.manual_seed(0)
    weight = (torch.randn(48, 96) * 0.05).to(dtype)
    weight[3] = 0  # a zero row: the scale becomes eps, never a division by zero
    weight[4] = weight[4].abs()  # all positive, all negative: 0 must stay representable
    weight[5] = -weight[5].abs()
    weight[6, 7] = 1e4  # one outlier sets its row's scale
    args = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"]).weights
    ref_scale, _ = calculate_qparams(weight.amin(dim=1), weight.amax(dim=1), args)
    ref_scale = ref_scale.reshape(-1, 1)
    reference = quantize(weight, ref_scale, None, args, dtype=FP8)

    out = torch.empty(weight.shape, dtype=FP8)
    scale = quantize_rows(weight, torch.empty_like(weight), out)
    assert scale.dtype == dtype and torch.equal(scale, ref_scale)
    assert torch.equal(out.view(torch.uint8), reference.view(torch.uint8))
    assert float(scale[3]) == torch.finfo(dtype).eps


def test_other_schemes_are_refused_at_preflight(tiny_llama, tmp_path, repo_root):
    catalog = _catalog_with_engine(tmp_path, repo_root, "quantgate.stream_fp8")
    recipe = tmp_path / "project-quantgate.stream_fp8" / "recipes" / "fp8-dynamic.yaml"
    recipe.write_text(recipe.read_text().replace("scheme: FP8_DYNAMIC", "scheme: W8A16"))
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", Catalog(repo_root)))
    with pytest.raises(ConfigFileError, match="fp8-dynamic.yaml.*FP8_DYNAMIC.*llmcompressor.model_free"):
        build_targets(record, ["hopper-fp8"], tmp_path / "out", catalog, None)
    assert not (tmp_path / "out").exists()


def test_fused_experts_are_detected_and_odd_targets_refused(tmp_path):
    fused = tmp_path / "fused"
    fused.mkdir()
    save_file(
        {
            "model.layers.0.mlp.experts.gate_up_proj": torch.zeros(4, 32, 16, dtype=torch.bfloat16),
            "model.layers.0.self_attn.q_proj.weight": torch.zeros(16, 16, dtype=torch.bfloat16),
        },
        fused / "model.safetensors",
    )
    assert plan(fused, IGNORE)[2] is True  # handed to model_free_ptq, which splits experts

    odd = tmp_path / "odd"
    odd.mkdir()
    save_file(
        {"model.layers.0.conv.weight": torch.zeros(4, 4, 3, dtype=torch.bfloat16)}, odd / "model.safetensors"
    )
    with pytest.raises(RecipeIncompatibleError, match="conv.weight.*ignore list"):
        plan(odd, IGNORE)


def test_the_name_rule_is_compressed_tensors_rule(_tiny_models, tmp_path):
    from compressed_tensors.utils.match import match_quantizable_tensors

    from quantgate.quantize.engines.stream_fp8 import targeted

    names = {
        n for source in _tiny_models.values() for shard in source.glob("*.safetensors") for n in _names(shard)
    }
    names |= {"model.norm.weight", "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate_proj.weight"}
    names |= {
        "model.layers.0.self_attn.q_proj.bias",
        "lm_head.weight",
        "model.lm_head.weight",
        "weight",
        "x.router.weight",
    }
    ignores = [IGNORE, [], ["re:.*q_proj"], ["model.layers.0.mlp.gate_proj", "re:model\\.layers\\.1\\."]]
    for ignore in ignores:
        expected = {n for _, n in match_quantizable_tensors(dict.fromkeys(names), ignore, ["Linear"])}
        assert {n for n in names if targeted(n, ignore)} == expected, ignore


def _names(shard: Path) -> list[str]:
    with safe_open(shard, "pt") as f:
        return list(f.keys())


def test_the_cached_config_is_the_computed_one(tmp_path, monkeypatch):
    from quantgate.quantize.engines.fp8_config import build_config, quantization_config

    monkeypatch.setenv("QUANTGATE_CACHE", str(tmp_path / "cache"))
    first = quantization_config(IGNORE, True)
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1
    assert quantization_config(IGNORE, True) == first == build_config(IGNORE, True)
    assert quantization_config(IGNORE[:1], True)["ignore"] == IGNORE[:1]  # another key, another entry
    assert quantization_config(IGNORE, False)["format"] == "dense"
