"""``EmulatedLinear``: a quantized Linear computed the way its serving kernel computes it.

It holds the decoded weight exactly (float32 grid values x local scales, see ``weights.py``),
quantizes its input with the target's activation format, multiplies in float32 and returns
the input's dtype. Float32 accumulation is Hopper's precise-accumulation path: measured on
an H200, ``torch._scaled_mm`` with precise accumulation differs from an exact float64
emulation only by the bf16 rounding of its output (BENCHMARKS.md, "Native FP8 against the emulation").
A kernel with fast accumulation drifts further at large K; ``load.py`` says so in the report.

``compute_dtype=torch.float64`` gives a reference: the same quantized operands, multiplied
without accumulation error.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantgate.numerics.formats import ActivationFormat, work_dtype
from quantgate.numerics.weights import DecodedWeight


class EmulatedLinear(nn.Module):
    """A quantized Linear: decoded weights, the target's activation format, float32 (or float64) matmul."""

    native: ClassVar[bool] = False  # computed here, not on the hardware's kernel (``NativeFP8Linear``)
    weight: Tensor
    weight_scale: Tensor
    weight_global_scale: Tensor | None
    input_global_scale: Tensor | None
    bias: Tensor | None

    def __init__(
        self,
        decoded: DecodedWeight,
        activation: ActivationFormat | None,
        *,
        weight_format: str,
        input_global_scale: Tensor | None = None,
        bias: Tensor | None = None,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if activation is not None and activation.needs_global_scale and input_global_scale is None:
            raise ValueError(f"activation format {activation.name} needs an input_global_scale")
        self.out_features, self.in_features = decoded.values.shape
        self.weight_format = weight_format
        self.activation = activation
        self.compute_dtype = compute_dtype
        self.register_buffer("weight", decoded.values.float())
        self.register_buffer("weight_scale", decoded.scales.float())
        self.register_buffer(
            "weight_global_scale", None if decoded.global_scale is None else decoded.global_scale.float()
        )
        self.register_buffer(
            "input_global_scale",
            None if input_global_scale is None else input_global_scale.float().reshape(()),
        )
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def quantize_input(self, x: Tensor) -> Tensor:
        """The activations the kernel multiplies, dequantized to float32 (x itself if weight-only;
        float64 for a float64 input: the canonical pass, ``formats.work_dtype``)."""
        if self.activation is None:
            return x.to(work_dtype(x))
        return self.activation.quantize(x, self.input_global_scale)

    @torch.no_grad()
    def matmul(self, x: Tensor) -> Tensor:
        """The GEMM's result before the kernel stores it, in ``compute_dtype`` (MoE kernels scale it first)."""
        dtype = self.compute_dtype
        y = F.linear(self.quantize_input(x).to(dtype), self.weight.to(dtype))
        if self.weight_global_scale is not None:
            y = y / self.weight_global_scale.to(dtype)
        if self.bias is not None:
            y = y + self.bias.to(dtype)
        return y

    def weighted(self, x: Tensor, row_weight: Tensor) -> Tensor:
        """The GEMM's result times ``row_weight`` [M, 1] (a MoE token's routing weight), multiplied in
        ``compute_dtype`` before the store, as vLLM's fused MoE kernel does in its accumulator."""
        return (self.matmul(x) * row_weight.to(self.compute_dtype)).to(x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        """The layer's output, stored in the input's dtype as the kernel stores it."""
        return self.matmul(x).to(x.dtype)  # serving kernels write bf16 outputs

    def extra_repr(self) -> str:
        """Formats and compute dtype, for ``print(model)``."""
        activation = self.activation.name if self.activation is not None else "none"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, weights={self.weight_format}, "
            f"activations={activation}, compute={str(self.compute_dtype).removeprefix('torch.')}"
        )
