"""The modelopt engine: its config handling and its conversion to compressed-tensors run on CPU;
the build itself (CUDA calibration) is marked ``gpu`` and runs only where a GPU and modelopt are.

The conversion is checked the way a user would notice a mistake: llm-compressor's NVFP4 artifact
of a tiny model is rewritten by hand into modelopt's export layout (packed bytes in ``weight``,
``weight_scale_2`` and ``input_scale`` as the reciprocals of the global scales, KV scales on
``k_proj`` / ``v_proj``), converted back, and must pass the serving check and evaluate to the
same logits as the original.
"""

from __future__ import annotations

import importlib.util
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
from quantgate.numerics import load_for_eval
from quantgate.quantize.engines.modelopt import quant_config, to_compressed_tensors
from quantgate.serving.check import check_artifact
from support.builds import build_targets
from support.models import write_tiny_model

pytestmark = pytest.mark.unit
IDS = torch.randint(3, 512, (2, 16), generator=torch.Generator().manual_seed(1))


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118
    return out


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("modelopt-src") / "tiny-llama", "llama")


@pytest.fixture(scope="module")
def nvfp4(tiny_source, tmp_path_factory, repo_root, catalog) -> Path:
    """llm-compressor's blackwell-nvfp4 of the tiny model, with its FP8 KV cache scales."""
    record = intake(tiny_source, load_gates(repo_root / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    out = tmp_path_factory.mktemp("modelopt-ref")
    (result,) = build_targets(record, ["blackwell-nvfp4"], out, catalog, calibration)
    return result.path


def _as_modelopt_export(artifact: Path, dest: Path) -> Path:
    """The same numbers in modelopt's HF export layout, as export_hf_checkpoint writes NVFP4."""
    dest.mkdir()
    for path in artifact.iterdir():
        if path.suffix != ".safetensors" and path.name != "manifest.json":
            shutil.copy(path, dest / path.name)
    out = {}
    for key, value in _tensors(artifact).items():
        module, _, local = key.rpartition(".")
        if local == "weight_packed":
            out[f"{module}.weight"] = value
        elif local == "weight_global_scale":
            out[f"{module}.weight_scale_2"] = (1.0 / value.float()).reshape(())
        elif local == "input_global_scale":
            out[f"{module}.input_scale"] = (1.0 / value.float()).reshape(())
        elif local in ("k_scale", "v_scale"):
            out[f"{module}.{local[0]}_proj.{local}"] = value.float().reshape(())
        else:
            out[key] = value
    save_file(out, dest / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((dest / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_quant_algo": "FP8",
    }
    (dest / "config.json").write_text(json.dumps(config))
    (dest / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    return dest


def _linears(artifact: Path) -> list[str]:
    config = json.loads((artifact / "config.json").read_text())
    names = ["lm_head"]
    for i in range(config["num_hidden_layers"]):
        names += [f"model.layers.{i}.self_attn.{p}_proj" for p in "qkvo"]
        names += [f"model.layers.{i}.mlp.{p}_proj" for p in ("gate", "up", "down")]
    return names


@pytest.mark.heavy
def test_converted_export_has_llm_compressors_tensors_and_config(nvfp4, tmp_path):
    export = _as_modelopt_export(nvfp4, tmp_path / "export")
    to_compressed_tensors(export, _linears(nvfp4))
    original, converted = _tensors(nvfp4), _tensors(export)
    assert set(converted) == set(original)
    for key, value in original.items():
        if key.endswith(("weight_packed", "weight_scale")) and value.dtype != torch.float32:
            assert torch.equal(converted[key].view(torch.uint8), value.view(torch.uint8)), key
        elif key.endswith("global_scale"):
            torch.testing.assert_close(converted[key], value.float(), rtol=2e-7, atol=0)
    qc = json.loads((export / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "nvfp4-pack-quantized"
    assert qc["ignore"] == ["lm_head"] and qc["kv_cache_scheme"]["num_bits"] == 8
    assert not (export / "hf_quant_config.json").exists()


def test_converted_export_serves_and_evaluates_like_llm_compressors(nvfp4, tmp_path, catalog):
    export = _as_modelopt_export(nvfp4, tmp_path / "export")
    to_compressed_tensors(export, _linears(nvfp4))
    target = catalog.target("blackwell-nvfp4")
    table = check_artifact(export, target)
    assert table == check_artifact(nvfp4, target)
    with torch.no_grad():
        ours = load_for_eval(export, target).model(IDS).logits.float()
        theirs = load_for_eval(nvfp4, target).model(IDS).logits.float()
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-3)


def test_an_export_without_nvfp4_weights_is_refused(nvfp4, tmp_path):
    from quantgate.runtime.errors import BuildError

    export = tmp_path / "plain"
    export.mkdir()
    save_file({"model.norm.weight": torch.ones(4)}, export / "model.safetensors")
    (export / "config.json").write_text("{}")
    with pytest.raises(BuildError, match="no packed NVFP4 weight"):
        to_compressed_tensors(export, [])


def test_quant_config_accepts_both_modelopt_config_shapes():
    listed = {
        "algorithm": "max",
        "quant_cfg": [{"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 4}}],
    }
    kv = {"quant_cfg": [{"quantizer_name": "*[kv]_bmm_quantizer", "cfg": {"num_bits": (4, 3)}}]}
    out = quant_config(listed, disable=["*lm_head*"], kv_cache=kv)
    assert [e["quantizer_name"] for e in out["quant_cfg"]] == [
        "*weight_quantizer",
        "*[kv]_bmm_quantizer",
        "*lm_head*",
    ]
    assert (
        out["quant_cfg"][-1]["enable"] is False and len(listed["quant_cfg"]) == 1
    )  # the preset is untouched
    keyed = {"algorithm": "max", "quant_cfg": {"*weight_quantizer": {"num_bits": 4}}}
    out = quant_config(keyed, disable=["*router*"], kv_cache=None)
    assert out["quant_cfg"]["*router*"] == {"enable": False} and "*router*" not in keyed["quant_cfg"]


def _modelopt_catalog(repo_root: Path, dest: Path) -> Catalog:
    """The project's catalog with blackwell-nvfp4 built by the recipe nvfp4-modelopt (as a GPU worker)."""
    for part in ("targets", "recipes", "calibration_sets", "eval_suites"):
        shutil.copytree(repo_root / part, dest / part)
    shutil.copy(repo_root / "gates.yaml", dest / "gates.yaml")
    target = dest / "targets" / "blackwell-nvfp4.yaml"
    target.write_text(target.read_text().replace("recipe: nvfp4\n", "recipe: nvfp4-modelopt\n"))
    return Catalog(dest)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("modelopt") is None,
    reason="needs CUDA and nvidia-modelopt",
)
def test_gpu_modelopt_build_serves_and_evaluates(tiny_source, tmp_path, repo_root):
    catalog = _modelopt_catalog(repo_root, tmp_path / "root")
    record = intake(tiny_source, load_gates(tmp_path / "root" / "gates.yaml", catalog))
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    (result,) = build_targets(record, ["blackwell-nvfp4"], tmp_path / "out", catalog, calibration)
    qc = json.loads((result.path / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "nvfp4-pack-quantized"
    loaded = load_for_eval(result.path)
    assert loaded.numerics.weights == "nvfp4" and loaded.numerics.mode == "emulated"  # no FP4 cores on Hopper
    assert torch.isfinite(loaded.model(IDS).logits).all()
