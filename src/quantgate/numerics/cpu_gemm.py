"""bf16 linears on the CPU, computed as a GPU computes them: bf16 operands, float32 accumulation,
a bf16 result.

Why: ATen's bf16 GEMM on a CPU without AVX512-BF16 or AMX converts and multiplies in small
blocks, 8x slower than its float32 GEMM (12 against 99 GFLOPS for a 512x576 by 576x1536
product on this project's 2-core AMD EPYC, BENCHMARKS.md), and the source and every artifact's
unquantized linears (the lm_head is a fifth of the default model) ran at that speed. Widening a
bf16 operand to float32 is exact, so a float32 GEMM whose result is rounded to bf16 is the GPU's
arithmetic (cuBLAS: bf16 in, float32 accumulation, bf16 out) in another summation order, as
ATen's bf16 kernel is: against a float64 product, ATen's kernel leaves 8e-5 of the elements one
bf16 step from the correctly rounded value and the float32 GEMM 1.1e-4 (measured here).

Which of the two a CPU evaluation uses changes its numbers by bf16 rounding, so the choice is
an evaluation switch (``evaluate.environment.switches``: ``cpu_bf16_gemm``), part of every cached
reference's key. On a GPU nothing changes: its bf16 GEMM already is this arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantgate.runtime import sharding

CPU_BF16_GEMM = "float32"  # the value ``environment.switches`` records


class Float32GemmLinear(nn.Module):
    """A bf16 ``nn.Linear`` whose product is a float32 GEMM of its exactly widened operands,
    rounded to the input's dtype. Holds a float32 copy of the weight: twice the bf16 bytes,
    for a CPU evaluation's models (the memory-bounded KV pass does not use it)."""

    weight: Tensor
    bias: Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # a tensor-parallel linear's DTensor shard is gathered; ``sharding.replace`` cuts it again
        self.register_buffer("weight", sharding.full(linear.weight.detach()).float())
        bias = None if linear.bias is None else sharding.full(linear.bias.detach()).float()
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        """``x W^T + b`` accumulated in float32, stored in ``x``'s dtype.

        A caller may cast the whole model (GSM8K through lm-eval's HF wrapper met a bf16 weight
        here): the weight's values are bf16's, so widening them again is exact."""
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(x.dtype)

    def extra_repr(self) -> str:
        """Shape and arithmetic, for ``print(model)``."""
        return f"in_features={self.in_features}, out_features={self.out_features}, gemm=float32->bf16"


def use_float32_gemm(model: nn.Module, device: str | torch.device) -> int:
    """Replace every bf16 ``nn.Linear`` of ``model`` with a ``Float32GemmLinear`` when ``device`` is
    the CPU; returns how many were replaced (0 on a GPU). Quantized linears (``EmulatedLinear``)
    are not ``nn.Linear`` and keep their own arithmetic."""
    if torch.device(device).type != "cpu":
        return 0
    replaced = 0
    for name, module in list(model.named_modules()):
        if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16:
            sharding.replace(model, name, Float32GemmLinear(module))
            replaced += 1
    return replaced
