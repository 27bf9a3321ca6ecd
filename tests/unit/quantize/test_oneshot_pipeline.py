"""The nvfp4 recipe calibrates through llm-compressor's basic pipeline: the same artifact as the
sequential pipeline, bit for bit, because NVFP4 only observes (no weights change mid-pass)."""

from __future__ import annotations

import shutil

import pytest
import torch
import yaml
from safetensors import safe_open

from quantgate.calibration import build_set, load_spec
from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.intake import intake
from support.builds import build_targets

pytestmark = pytest.mark.unit


def _tensors(artifact) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(artifact.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118  safe_open has keys() but is neither iterable nor a container
    return out


def test_basic_and_sequential_pipelines_write_the_same_nvfp4_artifact(tiny_llama, tmp_path, repo_root):
    shipped = Catalog(repo_root)
    assert shipped.recipe("nvfp4").calibration.pipeline == "basic"

    # the same project, with the recipe's pipeline set to sequential
    project = tmp_path / "project"
    for part in ("targets", "recipes"):
        shutil.copytree(repo_root / part, project / part)
    recipe_file = project / "recipes" / "nvfp4.yaml"
    recipe = yaml.safe_load(recipe_file.read_text())
    recipe["calibration"]["pipeline"] = "sequential"
    recipe_file.write_text(yaml.safe_dump(recipe))
    sequential = Catalog(project)

    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", shipped))
    basic_out, seq_out = (
        build_targets(record, ["blackwell-nvfp4"], tmp_path / name, catalog, calibration)[0].path
        for name, catalog in (("basic", shipped), ("sequential", sequential))
    )
    basic, seq = _tensors(basic_out), _tensors(seq_out)
    assert basic.keys() == seq.keys()
    assert any(k.endswith("input_global_scale") for k in basic)  # calibrated, not data-free
    different = [k for k in basic if not torch.equal(basic[k], seq[k])]
    assert different == []
