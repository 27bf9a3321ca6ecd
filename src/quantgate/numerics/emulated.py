"""``EmulatedLinear``: a quantized Linear computed the way its serving kernel computes it.

It holds the decoded weight exactly (float32 grid values x local scales, see ``weights.py``),
quantizes its input with the target's activation format, multiplies in float32 and returns
the input's dtype. Float32 accumulation is Hopper's precise-accumulation path: measured on
an H200, ``torch._scaled_mm`` with precise accumulation differs from an exact float64
emulation only by the bf16 rounding of its output (BENCHMARKS.md, "Native FP8 against the emulation").
A kernel with fast accumulation drifts further at large K; ``load.py`` says so in the report.

``compute_dtype=torch.float64`` gives a reference: the same quantized operands, multiplied
without accumulation error. The float32 weight widens to float64 a block of rows at a time, and a
module may hold its on-disk tensors instead of the decoded weight (``defer_decode``), decoding at
each product: the memory-bounded KV pass (``quantize.kv_calibration``) holds one layer at a time, and
a decoded layer in float32 is four times its FP8 bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from quantgate.numerics.formats import ActivationFormat, work_dtype
from quantgate.numerics.weights import DecodedWeight

# a float32 weight widened to a wider compute dtype moves this many bytes at a time, so the transient
# is a block instead of the matrix. Each output column is its own dot product: the blocks differ from
# one whole product only in the BLAS's float64 rounding (1.5 % of a 512 x 6144 output in the last
# bits, measured), which the KV pass's scales never see (the 1.6 GB memory-cap build: the same bytes)
_WIDEN_BLOCK_BYTES = 8 << 20
_PACKED = "packed_"  # prefix of the on-disk tensors a deferred module holds as buffers


class EmulatedLinear(nn.Module):
    """A quantized Linear: decoded weights, the target's activation format, float32 (or float64) matmul."""

    native: ClassVar[bool] = False  # computed here, not on the hardware's kernel (``NativeFP8Linear``)
    weight: Tensor | None  # None while deferred: ``decoded_weight`` decodes the on-disk tensors
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
        self._decode: Callable[[dict[str, Tensor]], DecodedWeight] | None = None

    def defer_decode(
        self, tensors: dict[str, Tensor], decode: Callable[[dict[str, Tensor]], DecodedWeight]
    ) -> None:
        """Hold ``tensors`` (this module's on-disk tensors, as ``decode`` takes them) instead of the
        decoded weight, and decode them at each product. The same values, so the same results; the
        module holds its FP8 bytes (a quarter of the float32 weight) and pays a decode per product."""
        for name, tensor in tensors.items():
            self.register_buffer(_PACKED + name, tensor)
        self._decode = decode
        self.weight = None

    def decoded_weight(self) -> Tensor:
        """The decoded float32 weight: the resident one, or decoded now from the held tensors."""
        if self.weight is not None:
            return self.weight
        assert self._decode is not None, "a module without a weight was deferred"
        packed = {
            n.removeprefix(_PACKED): b for n, b in self.named_buffers(recurse=False) if n.startswith(_PACKED)
        }
        return self._decode(packed).values

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
        x, weight = self.quantize_input(x).to(dtype), self.decoded_weight()
        if weight.dtype == dtype:
            y = F.linear(x, weight)
        else:  # widened a block of output rows at a time (``_WIDEN_BLOCK_BYTES``)
            rows = max(1, _WIDEN_BLOCK_BYTES // (self.in_features * dtype.itemsize))
            y = torch.cat(
                [F.linear(x, weight[i : i + rows].to(dtype)) for i in range(0, self.out_features, rows)], -1
            )
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
