"""Cutting the evaluation's modules to a rank's slice (issue 29): the slices compute the whole.

A column-wise slice computes its rank's output features, so the ranks' outputs side by side are
the whole output; a row-wise slice computes a partial product over its rank's input features, so
the ranks' outputs summed are the whole output, the bias added once. Here in one process, over
the slices ``sharding._cut`` makes for each rank; the collectives that join them are
transformers' (tests/integration/test_sharded_eval.py runs them over gloo).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from quantgate.numerics.cpu_gemm import Float32GemmLinear
from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import activation_format
from quantgate.numerics.weights import DecodedWeight
from quantgate.runtime import sharding
from quantgate.runtime.errors import InputError, UsageError

pytestmark = pytest.mark.unit

OUT, IN, GROUP = 64, 128, 16


def _grouped(activation: str | None) -> EmulatedLinear:
    """A W4-style linear: values on a grid times per-group scales, one scale per 16 inputs."""
    g = torch.Generator().manual_seed(0)
    scales = torch.rand(OUT, IN // GROUP, generator=g) + 0.5
    grid = torch.randint(-7, 8, (OUT, IN), generator=g).float()
    values = grid * scales.repeat_interleave(GROUP, dim=1)
    fmt = activation_format(activation) if activation else None
    global_scale = torch.tensor(448.0 * 6.0) if fmt is not None and fmt.needs_global_scale else None
    return EmulatedLinear(
        DecodedWeight(values, scales),
        fmt,
        weight_format="test",
        input_global_scale=global_scale,
        bias=torch.randn(OUT, generator=g),
    )


def _slices(module: nn.Module, style: str, world: int = 2) -> list[nn.Module]:
    slices = []
    for rank in range(world):
        piece = copy.deepcopy(module)
        sharding._cut(piece, "model.layers.0.mlp.down_proj", style, sharding.Shards(world, rank, rank))
        slices.append(piece)
    return slices


@pytest.mark.parametrize("activation", [None, "nvfp4_calibrated"])
def test_column_slices_side_by_side_are_the_whole_output(activation):
    module = _grouped(activation)
    x = torch.randn(3, 5, IN, dtype=torch.float32)
    whole = module.matmul(x)
    parts = [piece.matmul(x) for piece in _slices(module, "colwise")]
    assert [p.shape[-1] for p in parts] == [OUT // 2, OUT // 2]
    torch.testing.assert_close(torch.cat(parts, dim=-1), whole)


@pytest.mark.parametrize("activation", [None, "nvfp4_calibrated"])
def test_row_slices_summed_are_the_whole_output_with_the_bias_once(activation):
    """Weight-only and NVFP4 activations (per-16 groups, which the cut keeps whole) sum exactly
    to the whole, up to float summation order."""
    module = _grouped(activation)
    x = torch.randn(3, 5, IN, dtype=torch.float32)
    whole = module.matmul(x)
    pieces = _slices(module, "rowwise")
    assert [p.bias is not None for p in pieces] == [True, False]  # rank 0 adds it
    assert [p.weight_scale.shape for p in pieces] == [(OUT, IN // GROUP // 2)] * 2
    summed = sum(piece.matmul(x[..., r * IN // 2 : (r + 1) * IN // 2]) for r, piece in enumerate(pieces))
    torch.testing.assert_close(summed, whole, rtol=1e-5, atol=1e-4)


def test_a_bf16_linear_widened_on_the_cpu_is_cut_the_same_way():
    linear = nn.Linear(IN, OUT, bias=True).to(torch.bfloat16)
    module = Float32GemmLinear(linear)
    x = torch.randn(4, IN).to(torch.bfloat16)
    whole = module(x).float()
    parts = [piece(x).float() for piece in _slices(module, "colwise_gather_output")]
    torch.testing.assert_close(torch.cat(parts, dim=-1), whole)


def test_groups_that_would_straddle_two_ranks_are_refused():
    """12 groups of 16 (192 inputs) over 8 ranks would put a group's halves on two ranks: refused,
    naming the module, rather than computed with scales that are no longer the artifact's."""
    g = torch.Generator().manual_seed(1)
    scales = torch.rand(8, 12, generator=g) + 0.5
    module = EmulatedLinear(
        DecodedWeight(scales.repeat_interleave(16, dim=1), scales), None, weight_format="test"
    )
    with pytest.raises(InputError, match="down_proj.*groups"):
        sharding._cut(module, "model.layers.0.mlp.down_proj", "rowwise", sharding.Shards(8, 0, 0))


def test_a_style_the_emulation_cannot_take_is_refused_with_the_way_out():
    module = _grouped(None)
    with pytest.raises(InputError, match="--devices 1"):
        sharding._cut(module, "model.layers.0.mlp.experts", "grouped_gemm", sharding.Shards(2, 0, 0))


def _experts(hidden: int = 32, intermediate: int = 64, count: int = 4):
    """A MoE layer's experts as the evaluation holds them: per-channel FP8-style weights, W8A8."""
    from quantgate.numerics.moe import ExpertWeights, QuantizedExperts

    g = torch.Generator().manual_seed(3)

    def weight(out_features: int, in_features: int) -> DecodedWeight:
        scales = torch.rand(out_features, 1, generator=g) * 1e-2 + 1e-3
        return DecodedWeight(
            torch.randint(-100, 100, (out_features, in_features), generator=g) * scales, scales
        )

    experts = [
        ExpertWeights(
            weight(intermediate, hidden), weight(intermediate, hidden), weight(hidden, intermediate)
        )
        for _ in range(count)
    ]
    return QuantizedExperts(
        experts, activation_format("fp8_e4m3fn_per_token"), torch.nn.functional.silu, weight_format="test"
    )


def test_expert_slices_summed_are_the_whole_moe_layer():
    """Each rank holds every expert's gate/up slice and the matching down slice (vLLM's TP fused
    MoE): the ranks' outputs summed are the layer's output, up to the bf16 stores of each part and
    the per-token FP8 scale of the down input, which a rank takes over its slice."""
    module = _experts()
    tokens = torch.randn(16, 32).to(torch.bfloat16)
    index = torch.randint(0, 4, (16, 2), generator=torch.Generator().manual_seed(4))
    weights = torch.softmax(torch.randn(16, 2), dim=-1).to(torch.bfloat16)
    whole = module(tokens, index, weights).float()
    parts = []
    for rank in range(2):
        piece = copy.deepcopy(module)
        sharding._cut_experts(piece, "model.layers.0.mlp.experts", sharding.Shards(2, rank, rank))
        assert [piece.gate[0].out_features, piece.down[0].in_features] == [32, 32]
        parts.append(piece(tokens, index, weights).float())
    relative = (parts[0] + parts[1] - whole).norm() / whole.norm()
    assert relative < 5e-2  # 1.4e-2 here; a wrong cut (a rank's down slice swapped) is off by 1.4


def test_experts_without_expert_lists_are_refused_with_the_way_out():
    with pytest.raises(InputError, match="--devices 1"):
        sharding._cut_experts(nn.Linear(4, 4), "model.layers.0.mlp.experts", sharding.Shards(2, 0, 0))


def test_devices_option_reads_all_or_a_count():
    assert sharding.count("all", "cpu") == 1  # one process on the CPU unless a count is given
    assert sharding.count("2", "cpu") == 2
    with pytest.raises(UsageError, match="not a number of devices"):
        sharding.count("two", "cpu")
    with pytest.raises(UsageError):
        sharding.count("0", "cpu")


def test_alone_nothing_is_spread(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert sharding.current() is None and sharding.writer() and sharding.processes() == 1
    assert sharding.agree("rank 0's value") == "rank 0's value"
    assert sharding.notes() == ()


@pytest.mark.parametrize(("heads", "kv_heads", "expected"), [(9, 3, 3), (32, 8, 8), (12, 4, 4), (7, 7, 7)])
def test_all_devices_is_the_most_gpus_the_heads_split_over_gpu_count_mocked(
    monkeypatch, tmp_path, heads, kv_heads, expected
):
    """On an 8-GPU worker the default model (9 heads, 3 KV heads) runs over 3 GPUs rather than
    being refused; without a config.json to read, ``all`` stays on one."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    config = tmp_path / "config.json"
    config.write_text(f'{{"num_attention_heads": {heads}, "num_key_value_heads": {kv_heads}}}')
    assert sharding.count("all", "cuda", config) == expected
    assert sharding.count("all", "cuda", None) == 1
    assert sharding.count("all", "cuda", tmp_path / "absent.json") == 1
    with pytest.raises(UsageError, match="torch sees 8"):
        sharding.count("16", "cuda", config)


class _Plan(nn.Module):
    """A skeleton with nothing but a tensor-parallel plan, as ``sharding.slicer`` reads it."""

    tp_plan = {"model.layers.*.mlp.up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise"}


@pytest.mark.parametrize("name, style", [("up_proj", "colwise"), ("down_proj", "rowwise")])
def test_a_module_read_as_its_slice_is_the_slice_cut_after_the_whole_read(monkeypatch, name, style):
    """Each rank reading its part of the tensors on disk (``slicer``) and marking the module cut
    (``read_cut``) gives what decoding the whole and cutting it (``_cut``) gives: weights, per-group
    scales, bias (column-wise: each rank's features; row-wise: rank 0 alone adds it)."""
    module = _grouped(None)
    disk = {"weight": module.weight, "weight_scale": module.weight_scale, "bias": module.bias}
    full = f"model.layers.0.mlp.{name}"
    expected_slices = _slices(module, style)
    for rank, expected in enumerate(expected_slices):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        where = sharding.slicer(
            lambda name: sharding.linear_style(_Plan(), name), lambda disk_name: disk_name
        )
        assert where is not None and sharding.linear_style(_Plan(), full) == style
        read = {}
        for key, tensor in disk.items():
            part = where(full, tuple(tensor.shape))
            read[key] = tensor if part is None else tensor.narrow(part[0], part[1], part[2])
        built = EmulatedLinear(
            DecodedWeight(read["weight"], read["weight_scale"]), None, weight_format="test", bias=read["bias"]
        )
        sharding.read_cut(built, style)
        assert sharding.is_cut(built)
        assert (built.out_features, built.in_features) == sharding.read_shape(OUT, IN, style)
        assert torch.equal(built.weight, expected.weight) and torch.equal(
            built.weight_scale, expected.weight_scale
        )
        assert (built.bias is None) == (expected.bias is None)
        if expected.bias is not None:
            assert torch.equal(built.bias, expected.bias)
    assert style == "colwise" or expected_slices[1].bias is None  # row-wise: the bias once, on rank 0
