"""FP8 E4M3 per-output-channel weight quantization, op for op as compressed-tensors does it.

An artifact built here must hold the codes llm-compressor's FP8_DYNAMIC would write
(``model_free_ptq`` and ``oneshot`` alike), and the same torch ops in the same dtypes give the
same bits; so this module does exactly those ops, writing into caller-owned buffers so that a
streaming engine allocates nothing per tensor. ``test_stream_fp8.py`` compares it bit for bit
with compressed-tensors' own functions.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448.0
# dtypes a source weight may have; the scale is stored in the same dtype, as llm-compressor does
SOURCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def quantize_rows(weight: torch.Tensor, scratch: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Quantize a 2-D weight per output row into ``out`` (fp8); return the (rows, 1) scale.

    ``scratch`` is a tensor of ``weight``'s dtype and shape that is overwritten. The ops are
    compressed-tensors 0.19's: per row ``min = min(amin(w), 0)``, ``max = max(amax(w), 0)``;
    ``scale = max(|min|, |max|) / (bit_range.to(w.dtype) / 2)`` with ``bit_range = 448 - (-448)``,
    in the weight's own dtype, a zero scale replaced by that dtype's eps; then ``w / scale`` in
    the weight's dtype (never the scale widened to float32: BENCHMARKS.md), clamped to ±448 and
    cast to ``float8_e4m3fn``.
    """
    if weight.dtype not in SOURCE_DTYPES:
        raise TypeError(f"cannot quantize a {weight.dtype} weight to FP8; expected one of {SOURCE_DTYPES}")
    half_range = torch.tensor(2 * FP8_MAX).to(weight.dtype) / 2
    absmax = torch.amax(weight, dim=1, keepdim=True).abs_()
    absmax = torch.maximum(absmax, torch.amin(weight, dim=1, keepdim=True).abs_())
    scale = absmax / half_range
    scale = torch.where(scale == 0, torch.tensor(torch.finfo(weight.dtype).eps, dtype=weight.dtype), scale)
    torch.div(weight, scale, out=scratch)
    scratch.clamp_(-FP8_MAX, FP8_MAX)
    out.copy_(scratch)
    return scale
