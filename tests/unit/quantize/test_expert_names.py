"""Expert tensors get the source's per-expert names back (quantize/expert_names.py).

Artifacts here are written the way llm-compressor's MoE linearization saves a Mixtral: every
expert projection under ``gate_proj``/``up_proj``/``down_proj`` with NVFP4's companions, in two
shards with an index, and a quantization_config naming expert modules; the source is a tiny
Mixtral saved by transformers (``w1``/``w2``/``w3`` on disk).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantgate.intake.safetensors_header import read_header
from quantgate.quantize import expert_names
from quantgate.runtime.errors import BuildError
from support.models import write_tiny_model

pytestmark = pytest.mark.unit

LINEARIZED = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}  # llm-compressor's names


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("src") / "mixtral", "mixtral")


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118  safe_open is not iterable
    return out


def _linearized_artifact(
    source: Path, out: Path, ignore: list[str], names=LINEARIZED
) -> dict[str, torch.Tensor]:
    """An NVFP4-like artifact of ``source`` under llm-compressor's expert names; returns its tensors."""
    out.mkdir()
    g = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    for key, weight in _tensors(source).items():
        module = key.removesuffix(".weight")
        match = re.match(r"^(.+\.experts\.\d+)\.(w[123])$", module)
        if match is None:
            tensors[key] = weight
            continue
        module = f"{match[1]}.{names[match[2]]}"
        rows, cols = weight.shape
        tensors[f"{module}.weight_packed"] = torch.randint(
            0, 256, (rows, cols // 2), dtype=torch.uint8, generator=g
        )
        tensors[f"{module}.weight_scale"] = torch.rand(rows, cols // 16, generator=g).to(torch.float8_e4m3fn)
        tensors[f"{module}.weight_global_scale"] = torch.rand(1, generator=g) + 1
        tensors[f"{module}.input_global_scale"] = torch.rand(1, generator=g) + 1
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for shard, names_in in shards.items():
        save_file({k: tensors[k] for k in names_in}, out / shard, metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {
        "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized"}},
        "ignore": ignore,
        "quant_method": "compressed-tensors",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return tensors


def test_the_mapping_is_learned_from_the_source_and_transformers_conversion(mixtral, tmp_path):
    assert expert_names.learned_names(mixtral) == {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    # a source already on llm-compressor's names maps each to itself; a dense one maps nothing
    qwen = write_tiny_model(tmp_path / "qwen", "qwen2_moe")
    assert expert_names.learned_names(qwen) == {n: n for n in ("gate_proj", "up_proj", "down_proj")}
    assert expert_names.learned_names(write_tiny_model(tmp_path / "llama", "llama")) == {}


def test_every_companion_index_entry_and_config_name_is_renamed_bytes_unchanged(mixtral, tmp_path):
    artifact = tmp_path / "artifact"
    ignore = [
        "lm_head",
        "re:.*\\.gate$",
        "model.layers.1.block_sparse_moe.experts.3.down_proj",
        "re:.*experts\\.0\\.up_proj$",
    ]
    before = _linearized_artifact(mixtral, artifact, ignore)
    assert expert_names.mismatches(mixtral, artifact)  # what the build wrote is not servable as Mixtral

    assert expert_names.restore(mixtral, artifact) == {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}

    inverse = {v: k for k, v in LINEARIZED.items()}
    after = _tensors(artifact)
    renamed = {
        re.sub(r"(experts\.\d+)\.(\w+_proj)\.", lambda m: f"{m[1]}.{inverse[m[2]]}.", k): k for k in before
    }
    assert set(after) == set(renamed)
    for new, old in renamed.items():  # same dtype, shape and bytes under the new name
        assert after[new].dtype == before[old].dtype
        assert torch.equal(after[new].view(torch.uint8), before[old].view(torch.uint8))
    for suffix in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
        assert f"model.layers.0.block_sparse_moe.experts.2.w3.{suffix}" in after
    assert not [k for k in after if re.search(r"experts\.\d+\.(gate|up|down)_proj", k)]
    for shard in artifact.glob("*.safetensors"):
        header = read_header(shard)  # a valid file: offsets tile the data, data 8-byte aligned
        assert header.metadata == {"format": "pt"} and header.data_offset % 8 == 0
    index = json.loads((artifact / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(after)
    assert all(k in _tensors_of(artifact / shard) for k, shard in index["weight_map"].items())
    config = json.loads((artifact / "config.json").read_text())["quantization_config"]
    assert config["ignore"] == [
        "lm_head",
        "re:.*\\.gate$",
        "model.layers.1.block_sparse_moe.experts.3.w2",
        "re:.*experts\\.0\\.w3$",
    ]
    assert config["config_groups"]["group_0"]["targets"] == ["Linear"]
    assert expert_names.mismatches(mixtral, artifact) == []
    assert expert_names.restore(mixtral, artifact) == {}  # already the source's: nothing rewritten


def _tensors_of(shard: Path) -> set[str]:
    return set(read_header(shard).tensors)


def test_a_regex_that_cannot_be_rewritten_exactly_is_refused_before_any_shard_changes(mixtral, tmp_path):
    artifact = tmp_path / "artifact"
    _linearized_artifact(mixtral, artifact, ["re:.*_proj$"])  # every projection: w1/w2/w3 would escape it
    shards = {p.name: p.read_bytes() for p in artifact.glob("*.safetensors")}
    with pytest.raises(BuildError, match=r"'re:\.\*_proj\$'.*cannot be rewritten exactly"):
        expert_names.restore(mixtral, artifact)
    assert {p.name: p.read_bytes() for p in artifact.glob("*.safetensors")} == shards


def test_experts_under_the_wrong_source_names_are_refused(mixtral, tmp_path):
    """Gate stored as w2 and down as w1: the names are the source's, the output sizes are not."""
    artifact = tmp_path / "artifact"
    _linearized_artifact(mixtral, artifact, [], names={"w1": "w2", "w3": "w3", "w2": "w1"})
    assert any("output rows" in p for p in expert_names.mismatches(mixtral, artifact))
    with pytest.raises(BuildError, match="output rows.*vLLM's MoE loader"):
        expert_names.restore(mixtral, artifact)
