"""load_for_eval on tiny artifacts: the numerics the logits show, the report, and the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from quantgate.config.targets import ActivationNumerics
from quantgate.numerics import EmulatedLinear, load_for_eval, load_source_for_eval
from quantgate.runtime.errors import InputError

pytestmark = pytest.mark.unit

IDS = torch.randint(3, 512, (2, 24), generator=torch.Generator().manual_seed(0))


def _logits(artifact: Path, **kwargs) -> torch.Tensor:
    return load_for_eval(artifact, **kwargs).model(IDS).logits.float()


@pytest.fixture(scope="module")
def source_logits(tiny_source) -> torch.Tensor:
    return load_source_for_eval(tiny_source).model(IDS).logits.float()


def _rewrite(artifact: Path, dest: Path, edit) -> Path:
    """A copy of ``artifact`` whose tensors went through ``edit(dict) -> dict``."""
    copy = Path(shutil.copytree(artifact, dest))
    for shard in copy.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            names = f.keys()  # a safe_open handle is not iterable
            tensors, metadata = {k: f.get_tensor(k) for k in names}, f.metadata()
        shard.unlink()  # the copy may share an inode with the original (hard-linked builds)
        save_file(edit(tensors), shard, metadata=metadata)
    return copy


def test_w8a8_differs_from_w8a16_on_the_same_weights(artifacts, source_logits):
    hopper = artifacts["hopper-fp8"]
    w8a8 = _logits(hopper, kv_cache=False)
    w8a16 = _logits(hopper, activations=False, kv_cache=False)
    assert not torch.equal(w8a8, w8a16)
    assert (w8a8 - w8a16).abs().max() > 1e-3
    assert not torch.equal(w8a8, source_logits) and not torch.equal(w8a16, source_logits)


def test_fnuz_path_differs_from_ocp_path_on_the_same_bytes(artifacts):
    hopper, rocm = artifacts["hopper-fp8"], artifacts["rocm-cdna3-fp8"]
    for shard in hopper.glob("*.safetensors"):
        assert shard.read_bytes() == (rocm / shard.name).read_bytes()
    ocp, fnuz = load_for_eval(hopper), load_for_eval(rocm)
    assert (ocp.numerics.weights, fnuz.numerics.weights) == ("fp8_e4m3fn", "fp8_e4m3fnuz")
    assert (ocp.numerics.kv_cache_format, fnuz.numerics.kv_cache_format) == ("fp8_e4m3fn", "fp8_e4m3fnuz")
    assert not torch.equal(ocp.model(IDS).logits, fnuz.model(IDS).logits)
    # the fnuz weights are numerically the fn weights: the difference is activations and KV
    assert torch.equal(
        _logits(hopper, activations=False, kv_cache=False), _logits(rocm, activations=False, kv_cache=False)
    )


def test_weight_only_view_matches_transformers_decompression(artifacts):
    """Sanity: with activation quantization off, transformers' dequantized model differs from
    the emulation only by the bf16 rounding of w * scale."""
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    for target in ("hopper-fp8", "blackwell-nvfp4", "draft-int4"):
        with pytest.warns(UserWarning):  # transformers notes that the artifact has its own config
            hf = AutoModelForCausalLM.from_pretrained(
                artifacts[target],
                dtype=torch.bfloat16,
                quantization_config=CompressedTensorsConfig(dequantize=True),
            )
        for module in hf.modules():  # dequantized modules still fake-quantize inputs unless told not to
            module.quantization_enabled = False
        expected = hf(IDS).logits.float()
        emulated = _logits(artifacts[target], activations=False, kv_cache=False)
        torch.testing.assert_close(emulated, expected, atol=2e-2, rtol=0.05)


def test_fp8_kv_cache_changes_logits_and_generation_runs(artifacts):
    hopper = artifacts["hopper-fp8"]
    with_kv = load_for_eval(hopper)
    assert with_kv.numerics.kv_cache_layers == 2
    assert not torch.equal(with_kv.model(IDS).logits, _logits(hopper, kv_cache=False).bfloat16())
    generated = with_kv.model.generate(IDS[:1, :8], max_new_tokens=4, do_sample=False)
    assert generated.shape == (1, 12)


def test_nvfp4_uses_the_calibrated_input_global_scale(artifacts, tmp_path):
    nvfp4 = artifacts["blackwell-nvfp4"]

    # not a power of two: scaling the global scale by 2^k is absorbed exactly by the E4M3 group
    # scales (unless one under- or overflows), so x0.25 leaves the logits unchanged
    def perturb(tensors):
        return {k: (v * 0.3 if k.endswith("input_global_scale") else v) for k, v in tensors.items()}

    perturbed = _rewrite(nvfp4, tmp_path / "perturbed", perturb)
    assert not torch.equal(_logits(nvfp4), _logits(perturbed))
    # weight-only, the activation scale plays no part
    assert torch.equal(_logits(nvfp4, activations=False), _logits(perturbed, activations=False))


@pytest.mark.parametrize("target", ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"])
def test_report_says_emulated_and_what(artifacts, target):
    loaded = load_for_eval(artifacts[target])
    report = loaded.numerics
    assert report.mode == "emulated" and report.target == target and report.device == "cpu"
    assert report.modules_replaced == 14  # 2 layers x 7 projections
    assert sum(isinstance(m, EmulatedLinear) for m in loaded.model.modules()) == 14
    assert any("fp32 accumulation" in note for note in report.notes)
    expected = {
        "hopper-fp8": ("fp8_e4m3fn_per_token", "fp8_e4m3fn"),
        "rocm-cdna3-fp8": ("fp8_e4m3fnuz_per_token", "fp8_e4m3fnuz"),
        "blackwell-nvfp4": ("nvfp4_calibrated", "fp8_e4m3fn"),
        "draft-int4": ("none", "bf16"),
    }[target]
    assert (report.activations, report.kv_cache_format) == expected
    # the report's KV column: the format, and for FP8 that its scales are the calibrated ones
    assert report.kv_cache.startswith(expected[1])
    assert report.kv_cache_calibrated is (None if target == "draft-int4" else True)
    assert loaded.tokenizer is not None


def test_weight_only_view_is_reported_as_such(artifacts):
    report = load_for_eval(artifacts["hopper-fp8"], activations=False, kv_cache=False).numerics
    assert (report.activations, report.kv_cache, report.mode) == ("none", "bf16", "emulated")
    assert any("weight-only view" in note for note in report.notes)


def test_source_report(tiny_source):
    assert load_source_for_eval(tiny_source).numerics.mode == "source"


# ---------------------------------------------------------------------------- refusals


def test_no_manifest_and_no_target_is_refused(artifacts, tmp_path, catalog):
    copy = Path(shutil.copytree(artifacts["hopper-fp8"], tmp_path / "bare"))
    (copy / "manifest.json").unlink()
    with pytest.raises(InputError, match="manifest"):
        load_for_eval(copy)
    assert load_for_eval(copy, catalog.target("rocm-cdna3-fp8")).numerics.weights == "fp8_e4m3fnuz"


def test_target_of_another_format_is_refused(artifacts, catalog):
    with pytest.raises(InputError, match="expects pack-quantized"):
        load_for_eval(artifacts["hopper-fp8"], catalog.target("draft-int4"))


def test_w8a8_numerics_on_a_weight_only_artifact_are_refused(artifacts, catalog):
    int4 = catalog.target("draft-int4")
    w4a8 = int4.model_copy(
        update={
            "numerics": int4.numerics.model_copy(
                update={"activations": ActivationNumerics.FP8_E4M3FN_PER_TOKEN}
            )
        }
    )
    with pytest.raises(InputError, match="input_activations"):
        load_for_eval(artifacts["draft-int4"], w4a8)


def test_quantized_tensors_that_match_no_module_are_refused(artifacts, tmp_path):
    def rename(tensors):
        return {k.replace("layers.0.mlp.up_proj", "layers.0.mlp.upper_proj"): v for k, v in tensors.items()}

    renamed = _rewrite(artifacts["hopper-fp8"], tmp_path / "renamed", rename)
    with pytest.raises(InputError, match="upper_proj"):
        load_for_eval(renamed)


def test_a_quantized_module_without_its_scale_is_refused_not_run(artifacts, tmp_path):
    def drop(tensors):
        return {k: v for k, v in tensors.items() if k != "model.layers.1.self_attn.o_proj.weight_scale"}

    damaged = _rewrite(artifacts["hopper-fp8"], tmp_path / "damaged", drop)
    with pytest.raises(InputError, match="o_proj"):
        load_for_eval(damaged)


def test_quantized_tensors_matching_no_module_are_refused_not_skipped(artifacts, tmp_path):
    """(Per-expert modules of MoE layers are matched to transformers' fused experts: test_moe.py.)"""

    def rename(tensors):
        return {
            k.replace("layers.1.mlp.down_proj.", "layers.1.mlp.down_projection."): v
            for k, v in tensors.items()
        }

    renamed = _rewrite(artifacts["hopper-fp8"], tmp_path / "renamed", rename)
    with pytest.raises(
        InputError, match="model.layers.1.mlp.down_projection: quantized tensors on disk match no Linear"
    ):
        load_for_eval(renamed)
