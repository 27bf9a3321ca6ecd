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
from quantgate.contracts.artifact import read_manifest, verify_files
from quantgate.intake import intake
from quantgate.quantize.engines import BuildJob
from quantgate.quantize.engines import oneshot as oneshot_engine
from quantgate.quantize.engines.oneshot import OneshotEngine, placement
from quantgate.runtime.progress import SILENT
from support.builds import build_targets
from support.cli import quantgate
from support.devices import CPU_AND_CUDA

pytestmark = [pytest.mark.unit, pytest.mark.heavy]


def _tensors(artifact) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(artifact.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118  safe_open has keys() but is neither iterable nor a container
    return out


# on the GPU the basic pipeline's model is moved there whole, the sequential one's onloaded
# a layer at a time by the library: both compute on the GPU, and still agree
@pytest.mark.parametrize("device", CPU_AND_CUDA)
def test_basic_and_sequential_pipelines_write_the_same_nvfp4_artifact(
    tiny_llama, tmp_path, repo_root, device
):
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
    peaks = {}
    outs = {}
    for name, catalog in (("basic", shipped), ("sequential", sequential)):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        outs[name] = build_targets(
            record, ["blackwell-nvfp4"], tmp_path / name, catalog, calibration, device=device
        )[0].path
        peaks[name] = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    if device == "cuda":  # the whole bf16 model was on the GPU, not calibrated on the CPU beside it
        assert peaks["basic"] >= sum(f.stat().st_size for f in tiny_llama.glob("*.safetensors"))
    basic_out, seq_out = outs["basic"], outs["sequential"]
    basic, seq = _tensors(basic_out), _tensors(seq_out)
    assert basic.keys() == seq.keys()
    assert any(k.endswith("input_global_scale") for k in basic)  # calibrated, not data-free
    different = [k for k in basic if not torch.equal(basic[k], seq[k])]
    assert different == []


def test_on_a_gpu_a_basic_pipeline_model_moves_there_when_it_fits_and_else_calibrates_sequentially():
    # the basic pipeline computes where the model is: on a GPU worker it once stayed on the CPU
    assert placement("basic", "cuda", model_bytes=10, room=80) == ("basic", True)
    assert placement("basic", "cuda", model_bytes=90, room=80) == ("sequential", False)
    # the sequential and data-free pipelines onload to the GPU themselves; the CPU stays the CPU
    assert placement("sequential", "cuda", model_bytes=10, room=80) == ("sequential", False)
    assert placement("basic", "cpu", model_bytes=10, room=None) == ("basic", False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_build_past_max_memory_calibrates_layer_by_layer_to_the_same_bytes(tiny_llama, tmp_path):
    said = {}
    for name, budget in (("whole", []), ("budget", ["--max-memory", "1KB"])):
        run = quantgate(
            "build", "--checkpoint", str(tiny_llama), "--targets", "blackwell-nvfp4", "--device", "cuda",
            "--out", str(tmp_path / name), "--cache-dir", str(tmp_path / f"cache-{name}"), *budget,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        said[name] = " ".join((run.stdout + run.stderr).split())
    assert "onloads one layer at a time" in said["budget"]
    assert "onloads one layer at a time" not in said["whole"]
    whole, budget = (_tensors(tmp_path / name / "blackwell-nvfp4") for name in ("whole", "budget"))
    assert whole.keys() == budget.keys()
    assert [k for k in whole if not torch.equal(whole[k], budget[k])] == []


def test_every_target_of_one_load_gets_the_sources_bytes_and_the_last_is_not_copied(
    tiny_llama, tmp_path, repo_root
):
    # the last build on a load calibrates the loaded source itself (no second copy in memory): the
    # ones before it must still get their own copies, or the next would quantize a quantized model
    catalog = Catalog(repo_root)
    recipe = catalog.recipe("nvfp4")
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))

    def built(engine: OneshotEngine, name: str) -> dict[str, torch.Tensor]:
        engine.build(BuildJob(record, recipe, calibration, tmp_path / name, SILENT))
        return _tensors(tmp_path / name)

    alone = OneshotEngine()
    alone.preflight(record, recipe)
    expected = built(alone, "alone")
    assert alone._loaded == {}  # nothing kept once the last target is built

    shared = OneshotEngine()
    for _ in range(3):
        shared.preflight(record, recipe)
    for i in range(3):
        got = built(shared, f"shared-{i}")
        assert got.keys() == expected.keys()
        assert [k for k in expected if not torch.equal(expected[k], got[k])] == [], f"build {i}"
        assert bool(shared._loaded) == (i < 2)


def test_a_calibrated_artifact_larger_than_a_shard_is_written_in_shards_that_the_manifest_covers(
    tiny_llama, tmp_path, repo_root, catalog, monkeypatch
):
    # llm-compressor's default wrote one file up to 20 GB, hashed on one core; the artifact is cut
    # as the hub's checkpoints are, and the pipeline (index, manifest, serving check) takes the shards
    calibration = build_set(load_spec(repo_root / "calibration_sets" / "default.yaml"))
    record = intake(tiny_llama, load_gates(repo_root / "gates.yaml", catalog))
    whole = build_targets(record, ["blackwell-nvfp4"], tmp_path / "whole", catalog, calibration)[0].path
    monkeypatch.setattr(oneshot_engine, "SHARD_SIZE", "100KB")
    cut = build_targets(record, ["blackwell-nvfp4"], tmp_path / "cut", catalog, calibration)[0].path

    shards = sorted(p.name for p in cut.glob("*.safetensors"))
    assert len(shards) > 1 and (cut / "model.safetensors.index.json").is_file()
    manifest = read_manifest(cut)
    assert set(shards) <= set(manifest.files)
    assert verify_files(cut, manifest, None) == []
    a, b = _tensors(whole), _tensors(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
