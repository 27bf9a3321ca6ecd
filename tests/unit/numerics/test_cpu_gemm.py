"""bf16 linears on the CPU compute as a GPU's bf16 GEMM does: bf16 operands, float32 accumulation,
a bf16 result (``numerics.cpu_gemm``); quantized linears keep their own arithmetic."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quantgate.evaluate import environment
from quantgate.numerics import EmulatedLinear, Float32GemmLinear, load_for_eval, load_source_for_eval
from quantgate.numerics.cpu_gemm import use_float32_gemm

pytestmark = pytest.mark.unit


def test_a_bf16_linear_is_a_float32_gemm_rounded_once_to_bf16():
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(1536, 576, bias=True).to(torch.bfloat16)
    x = torch.randn(2, 64, 1536, generator=generator).to(torch.bfloat16)
    got = Float32GemmLinear(linear)(x)
    assert got.dtype == torch.bfloat16
    expected = F.linear(x.float(), linear.weight.float(), linear.bias.float()).to(torch.bfloat16)
    assert torch.equal(got, expected)
    # against the exact product: almost every element is the correctly rounded bf16 value
    exact = F.linear(x.double(), linear.weight.double(), linear.bias.double())
    assert (got != exact.to(torch.bfloat16)).float().mean() < 1e-3


def test_a_model_cast_to_bf16_afterwards_computes_the_same():
    """GSM8K through lm-eval's HF wrapper met this module's weight in bf16 (stop 33's CI clone run)."""
    linear = nn.Linear(64, 32).to(torch.bfloat16)
    x = torch.randn(3, 64).to(torch.bfloat16)
    widened = Float32GemmLinear(linear)
    before = widened(x)
    widened.to(torch.bfloat16)
    assert widened.weight.dtype == torch.bfloat16
    assert torch.equal(widened(x), before)


def test_the_source_on_the_cpu_has_no_bf16_linear_left_and_says_so(tiny_source):
    loaded = load_source_for_eval(tiny_source)
    kinds = {type(m) for m in loaded.model.modules()}
    assert Float32GemmLinear in kinds and nn.Linear not in kinds
    assert "accumulate in float32 on the CPU" in loaded.numerics.notes[0]


@pytest.mark.heavy
def test_an_artifact_keeps_its_quantized_linears_and_widens_the_rest(artifacts):
    model = load_for_eval(artifacts["hopper-fp8"]).model
    assert isinstance(model.get_output_embeddings(), Float32GemmLinear)  # the lm_head is not quantized
    assert sum(isinstance(m, EmulatedLinear) for m in model.modules()) > 0
    assert not any(type(m) is nn.Linear for m in model.modules())


def test_a_gpu_keeps_its_own_bf16_gemm():
    model = nn.Sequential(nn.Linear(8, 8).to(torch.bfloat16))
    assert use_float32_gemm(model, "cuda") == 0
    assert type(model[0]) is nn.Linear
    assert use_float32_gemm(model, "cpu") == 1


def test_the_arithmetic_is_an_evaluation_switch_so_it_keys_every_cached_reference():
    assert environment.switches()["cpu_bf16_gemm"] == "float32"
