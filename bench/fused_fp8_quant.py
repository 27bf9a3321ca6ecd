"""Issue 27, prepared and not yet run: per-token FP8 activation quantization in two fused Triton passes.

Why: an 8B hopper-fp8 scoring pass on the H200 spent 56 % of its GPU time in the eager
quantization around each ``torch._scaled_mm`` (``native.quantize_per_token``: widen to float32,
abs, amax, multiply, clamp, cast, six kernels each reading and most writing a float32 copy of the
input) against 26 % in the FP8 GEMMs (BENCHMARKS.md, "The MoE evaluation after its fix, and the
scoring passes kernel by kernel"). Here a row's absmax is one read of the bf16 input, and its
quantized values one more read and an FP8 write.

It must give the eager path's bits (native and emulated evaluations are fed the same FP8
values): the absmax is exact in any order; the scale and its reciprocal are computed from it by
the same torch operations on the [M, 1] column; ``x * (1 / scale)`` is one IEEE float32 multiply;
the clamp is exact and NaN-propagating as torch's; the cast to e4m3fn asks for round-to-nearest-
even, as torch's rounds. Whether Triton's cast and multiply really give those bits on Hopper is
what this script checks, before ``native.quantize_per_token`` may use it. The device time of the
session that wrote it ran out before it could run.

Usage on a GPU (prints the comparison and the timings; exit 1 if any byte differs):
    python3 bench/fused_fp8_quant.py
and ``bench/gpu_profile_scoring.py --fused-too`` scores an artifact with it, against the eager pass.
"""

from __future__ import annotations

import sys
import time

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


def quantize_per_token(x: torch.Tensor, fmax: float, min_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [M, K] float8_e4m3fn, scale [M, 1] float32) of a CUDA ``x`` [M, K], as the eager path computes them."""
    x = x.contiguous()
    rows, k = x.shape
    amax = torch.empty((rows, 1), device=x.device, dtype=torch.float32)
    _row_absmax[(rows,)](x, amax, k, x.stride(0), BLOCK=_BLOCK)
    scale = (amax / fmax).clamp(min=min_scale)  # the eager path's operations, on the column alone
    inv = scale.reciprocal()
    q = torch.empty((rows, k), device=x.device, dtype=torch.float8_e4m3fn)
    _quantize_rows[(rows,)](x, inv, q, k, x.stride(0), q.stride(0), FMAX=fmax, BLOCK=_BLOCK)
    return q, scale


def _check(k: int, rows: int = 257) -> bool:
    """The fused result against the eager one, bit for bit, on rows of every magnitude, an all-zero
    row (the floor scale) and a row holding a NaN."""
    from quantgate.numerics.formats import FP8_E4M3FN_MAX
    from quantgate.numerics.native import quantize_per_token as eager

    g = torch.Generator().manual_seed(k)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-8, 4, rows).reshape(rows, 1)
    x[5] = 0
    x[9, k // 2] = float("nan")
    x = x.to(torch.bfloat16).to("cuda")
    q, scale = quantize_per_token(x, FP8_E4M3FN_MAX, 1.0 / (FP8_E4M3FN_MAX * 512.0))
    eq, escale = eager(x)
    same_q = torch.equal(q.view(torch.uint8), eq.view(torch.uint8))
    same_scale = torch.equal(scale.nan_to_num(-1.0), escale.nan_to_num(-1.0))
    print(f"K={k}: FP8 bytes equal {same_q}, scales equal {same_scale}")
    return same_q and same_scale


def _time(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats


def main() -> None:
    from quantgate.numerics.formats import FP8_E4M3FN_MAX
    from quantgate.numerics.native import quantize_per_token as eager

    ok = all(_check(k) for k in (64, 4096, 14336 + 7))  # one block, several, a ragged tail
    for k in (4096, 14336):  # an 8B layer's two input widths, a batch of 8 windows of 2,048 tokens
        x = torch.randn(16384, k, device="cuda", dtype=torch.bfloat16)
        fused = _time(lambda x=x: quantize_per_token(x, FP8_E4M3FN_MAX, 1.0 / (FP8_E4M3FN_MAX * 512.0)))
        plain = _time(lambda x=x: eager(x))
        print(f"[16384, {k}]: eager {plain * 1e3:.2f} ms, fused {fused * 1e3:.2f} ms ({plain / fused:.1f}x)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
