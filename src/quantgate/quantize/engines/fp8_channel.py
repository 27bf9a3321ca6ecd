"""FP8 E4M3 per-output-channel weight quantization, op for op as compressed-tensors does it.

llm-compressor's FP8_DYNAMIC weights (``model_free_ptq`` and ``oneshot`` alike) come from
compressed-tensors 0.19:

- observer (memoryless min/max over each row): ``min = min(amin(w), 0)``, ``max = max(amax(w), 0)``;
  ``calculate_qparams``: ``scale = max(|min|, |max|) / (bit_range.to(w.dtype) / 2)`` with
  ``bit_range = 448 - (-448)``, computed in the weight's own dtype (bf16 for a bf16 checkpoint);
  a zero scale becomes that dtype's eps (a row of zeros would otherwise divide by zero);
- ``_quantize``: ``w / scale`` in the weight's dtype (the scale is *not* widened to float32:
  dividing by the float32 scale instead moves about 3% of the codes by one step), then
  ``round_to_quantized_type_args``: clamp to ±448 and cast to ``float8_e4m3fn``.

Doing the same torch ops in the same dtypes gives the same bits, so this module does exactly
that, writing into caller-owned buffers so a streaming engine allocates nothing per tensor.
``test_stream_fp8.py`` compares it bit for bit with llm-compressor's output.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448.0
# dtypes a source weight may have; the scale is stored in the same dtype, as llm-compressor does
SOURCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def quantize_rows(weight: torch.Tensor, scratch: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Quantize a 2-D weight per output row into ``out`` (fp8); return the (rows, 1) scale.

    ``scratch`` is a tensor of ``weight``'s dtype and shape that is overwritten.
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
