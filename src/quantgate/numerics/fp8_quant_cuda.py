"""Per-token FP8 activation quantization on CUDA in two fused Triton passes, bit for bit the eager one.

Why: an 8B hopper-fp8 scoring pass on the H200 spent 56 % of its GPU time in the eager
quantization around each ``torch._scaled_mm`` (widen to float32, abs, amax, multiply, clamp,
cast: six kernels, each reading and most writing a float32 copy of the input) against 26 % in
the FP8 GEMMs (BENCHMARKS.md, "The MoE evaluation after its fix, and the scoring passes kernel
by kernel"). Here a row's absmax is one read of the bf16 input, and its quantized values one
more read and an FP8 write.

Same bits as ``native.quantize_per_token_eager``, so native and emulated evaluations are fed the
same FP8 values: the absmax is exact in any order (NaN propagating, as ``torch.amax``); the scale
and its reciprocal are computed from it by the same torch function on the [M, 1] column
(``native.per_token_scale``);
``x * (1 / scale)`` is one IEEE float32 multiply; the clamp is exact; the cast to e4m3fn rounds
to nearest even, as torch's does. ``tests/unit/numerics/test_native_fp8.py`` checks it on the GPU
(``gpu`` mark), over rows of every magnitude, a zero row, a NaN and a ragged tail.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _row_absmax(x_ptr, out_ptr, k, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, k, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        v = tl.load(base + cols, mask=cols < k, other=0.0).to(tl.float32)
        acc = tl.maximum(acc, tl.abs(v), propagate_nan=tl.PropagateNan.ALL)
    # a NaN anywhere in the row is the row's absmax, as torch.amax has it
    nan = tl.sum((acc != acc).to(tl.int32), axis=0) > 0  # noqa: PLR0124 (NaN is the one value unequal to itself)
    tl.store(out_ptr + row, tl.where(nan, float("nan"), tl.max(acc, axis=0)))


@triton.jit
def _quantize_rows(x_ptr, inv_ptr, q_ptr, k, stride_x, stride_q, FMAX: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    inv = tl.load(inv_ptr + row)
    x_base = x_ptr + row.to(tl.int64) * stride_x
    q_base = q_ptr + row.to(tl.int64) * stride_q
    for start in range(0, k, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < k
        v = tl.load(x_base + cols, mask=mask, other=0.0).to(tl.float32) * inv
        v = tl.minimum(
            tl.maximum(v, -FMAX, propagate_nan=tl.PropagateNan.ALL), FMAX, propagate_nan=tl.PropagateNan.ALL
        )
        tl.store(q_base + cols, v.to(tl.float8e4nv, fp_downcast_rounding="rtne"), mask=mask)


def quantize_per_token(
    x: torch.Tensor, fmax: float, scale_of: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, K] float8_e4m3fn, scale [M, 1] float32) of a CUDA ``x`` [M, K], as the eager path computes
    them; ``scale_of``: a row's scale from its absmax, the eager path's own function."""
    x = x.contiguous()
    rows, k = x.shape
    amax = torch.empty((rows, 1), device=x.device, dtype=torch.float32)
    _row_absmax[(rows,)](x, amax, k, x.stride(0), BLOCK=_BLOCK)
    scale = scale_of(amax)  # torch operations on the [M, 1] column alone
    inv = scale.reciprocal()
    q = torch.empty((rows, k), device=x.device, dtype=torch.float8_e4m3fn)
    _quantize_rows[(rows,)](x, inv, q, k, x.stride(0), q.stride(0), FMAX=fmax, BLOCK=_BLOCK)
    return q, scale
