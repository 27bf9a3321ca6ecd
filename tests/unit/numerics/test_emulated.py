"""EmulatedLinear: the quantized matmul against float64, and against compressed-tensors' own."""

from __future__ import annotations

import json

import pytest
import torch

from quantgate.numerics import EmulatedLinear, activation_format, weight_format
from quantgate.numerics.artifact import read_quantized_tensors

pytestmark = pytest.mark.unit

MODULE = "model.layers.0.mlp.down_proj"  # 128 -> 64
CASES = [  # target, weight format, activation format
    ("hopper-fp8", "fp8_e4m3fn", "fp8_e4m3fn_per_token"),
    ("rocm-cdna3-fp8", "fp8_e4m3fnuz", "fp8_e4m3fnuz_per_token"),
    ("blackwell-nvfp4", "nvfp4", "nvfp4_calibrated"),
    ("draft-int4", "int4", None),
]


def _layer(artifacts, target, wname, aname, **kwargs) -> EmulatedLinear:
    tensors = read_quantized_tensors(artifacts[target])[MODULE]
    act = activation_format(aname) if aname else None
    return EmulatedLinear(
        weight_format(wname).decode(tensors),
        act,
        weight_format=wname,
        input_global_scale=tensors.get("input_global_scale") if act and act.needs_global_scale else None,
        **kwargs,
    )


def _inputs() -> torch.Tensor:
    x = torch.randn(2, 7, 128, generator=torch.Generator().manual_seed(0))
    x[0, 0, 3] = 40.0  # an outlier channel, as real activations have
    x[1, 2] = 0.0  # an all-zero token
    return x.bfloat16()


def _bf16_ulp(y: torch.Tensor) -> torch.Tensor:
    exponent = torch.floor(torch.log2(y.abs().clamp(min=2.0**-100)))
    return torch.pow(2.0, exponent - 7)


@pytest.mark.parametrize("target, wname, aname", CASES)
def test_output_equals_float64_quantized_matmul_to_bf16_rounding(artifacts, target, wname, aname):
    layer = _layer(artifacts, target, wname, aname)
    x = _inputs()
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 7, 64)

    xq = layer.quantize_input(x).double()
    y64 = xq @ layer.weight.double().T
    if layer.weight_global_scale is not None:
        y64 = y64 / layer.weight_global_scale.double()
    error = (out.double() - y64).abs()
    assert (error <= _bf16_ulp(y64)).all(), error.max()
    assert (out == y64.to(torch.bfloat16)).float().mean() > 0.98  # nearly always the same rounding

    reference = _layer(artifacts, target, wname, aname, compute_dtype=torch.float64)
    assert torch.equal(reference(x), y64.to(torch.bfloat16))


@pytest.mark.parametrize("target, wname, aname", CASES[:3])
def test_activations_are_quantized_and_weight_only_is_not(artifacts, target, wname, aname):
    x = _inputs()
    w8a8 = _layer(artifacts, target, wname, aname)
    w8a16 = _layer(artifacts, target, wname, None)
    assert not torch.equal(w8a8.quantize_input(x), x.float())
    assert torch.equal(w8a16.quantize_input(x), x.float())
    assert not torch.equal(w8a8(x), w8a16(x))


@pytest.mark.parametrize("target", ["hopper-fp8", "blackwell-nvfp4"])
def test_agrees_with_compressed_tensors_on_float32_inputs(artifacts, target):
    """compressed-tensors defines these schemes (llm-compressor calibrates with it). On float32
    inputs our activation quantization is its own; in bf16 it rounds the scale and the scaled
    value to bf16 first, which the kernels (float32 inside) do not."""
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import compute_dynamic_scales_and_zp

    config = json.loads((artifacts[target] / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    args = QuantizationArgs.model_validate(group["input_activations"])
    wname, aname = {
        "hopper-fp8": ("fp8_e4m3fn", "fp8_e4m3fn_per_token"),
        "blackwell-nvfp4": ("nvfp4", "nvfp4_calibrated"),
    }[target]
    layer = _layer(artifacts, target, wname, aname)
    x = _inputs().float()
    x[1, 2] = 1.0  # compressed-tensors guards all-zero tokens differently (scale eps); not the point here
    scale, zp = compute_dynamic_scales_and_zp(x, args, module=None, global_scale=layer.input_global_scale)
    theirs = fake_quantize(x, scale, zp, args, global_scale=layer.input_global_scale)
    assert torch.equal(layer.quantize_input(x), theirs)


def _held_bytes(module: torch.nn.Module) -> int:
    return sum(b.numel() * b.element_size() for b in module.buffers())


@pytest.mark.parametrize("target, wname, aname", CASES)
def test_a_deferred_decode_gives_the_resident_results_bit_for_bit_holding_less(
    artifacts, target, wname, aname, monkeypatch
):
    """The memory-bounded KV pass holds each layer's on-disk bytes, not its float32 decode: the
    product must not change by a bit, in the float32 numerics and in the float64 reference; the
    float64 widening a few rows at a time gives what widening the whole weight gives, to float64's
    rounding."""
    from quantgate.numerics import emulated

    x = _inputs()
    tensors = read_quantized_tensors(artifacts[target])[MODULE]
    for dtype in (torch.float32, torch.float64):
        resident = _layer(artifacts, target, wname, aname, compute_dtype=dtype)
        deferred = _layer(artifacts, target, wname, aname, compute_dtype=dtype)
        deferred.defer_decode(dict(tensors), weight_format(wname).decode)
        assert deferred.weight is None
        assert _held_bytes(deferred) < _held_bytes(resident) / 2
        assert torch.equal(deferred(x), resident(x))
        assert torch.equal(deferred.decoded_weight(), resident.decoded_weight())

    whole = resident.matmul(x)  # float64: 64 rows of 128 inputs in one block
    monkeypatch.setattr(emulated, "_WIDEN_BLOCK_BYTES", 5 * 128 * 8)  # 13 blocks, the last of 4 rows
    assert torch.allclose(resident.matmul(x), whole, rtol=1e-12, atol=0)
