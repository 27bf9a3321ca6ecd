"""The arithmetic of quantgate's own calibration pass: float64, so its scales are the same bytes on
any machine (issue 27 item 4).

The data-free KV pass (``kv_calibration.calibrate``) runs the built W8A8 model layer by layer and
keeps the absmax of every layer's keys and values. In bf16 with float32 reductions, the result
followed the machine: a BLAS kernel, a thread count or an instruction set sums in another order,
the ~1e-7 differences cross an FP8 rounding boundary of the per-token activation quantization
somewhere, and from there the layers downstream see a different input (measured in issue 27: 2
vs 16 threads changed 2 of 60 KV scales, AVX2 vs AMX 22-42, by up to 5.5 %; CPU vs GPU likewise).

The canonical pass computes every step in float64: the decoded weights and the dequantized FP8
activations (exact in float64), the products and their sums, the norms, the rotary embedding and
attention. Summation order then moves a value by about 1e-16 of itself, 2^45 below the bf16 step
the scale is stored in and 2^49 below an FP8 step, so a stored byte changes only if some value
lies within 1e-16 of a rounding boundary: not seen on any machine or thread count tried, and the
tests run the pass under other thread counts and another summation order of every quantized
product and compare the bytes. The statistic is the exact arithmetic's absmax of what the bf16
model approximates; it differs from a bf16 pass's by that pass's rounding (well under 1 %).

Where a layer holds a module this file cannot put in float64 (fused MoE experts compute their own
float32 steps; a norm or rotary embedding that is not the Llama family's), the pass still runs
and ``Arithmetic.canonical`` is False with the reason: the manifest records it, and identity rests
on the artifact's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

DTYPE = torch.float64


@dataclass(frozen=True)
class Arithmetic:
    """How a calibration pass computed: canonical (float64 throughout) or with the reasons it is not."""

    canonical: bool
    notes: tuple[str, ...] = ()


class RMSNorm64(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` in float64 (Llama's RMSNorm forces float32)."""

    weight: Tensor

    def __init__(self, weight: Tensor, eps: float) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().to(DTYPE))
        self.eps = float(eps)

    def forward(self, x: Tensor) -> Tensor:
        """The normalized ``x`` in float64."""
        x = x.to(DTYPE)
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _norm_eps(module: nn.Module) -> float | None:
    for name in ("variance_epsilon", "eps"):
        value = getattr(module, name, None)
        if isinstance(value, float | int):
            return float(value)
    return None


def _same_function(original: nn.Module, replacement: nn.Module, width: int) -> bool:
    """Whether ``replacement`` computes what ``original`` does (to bf16 rounding) on a fixed input:
    a norm of another form (Gemma's ``1 + weight``) fails it."""
    device = next(original.parameters()).device
    x = torch.linspace(-4.0, 4.0, 4 * width, device=device).reshape(4, width)
    with torch.no_grad():
        expected = original(x.to(torch.bfloat16)).float()
        got = replacement(x).float()
    return bool(torch.allclose(got, expected, rtol=3e-2, atol=3e-2))


def layer_to_float64(layer: nn.Module) -> tuple[str, ...]:
    """Put ``layer`` (materialized, any device) in float64, norms replaced by ``RMSNorm64``; returns
    what could not be made float64, one note each (empty: the layer computes canonically).

    Quantized linears keep their decoded float32 weights and compute in float64."""
    from quantgate.numerics import EmulatedLinear

    notes: list[str] = []
    for name, module in list(layer.named_modules()):
        kind = type(module).__name__
        if kind.lower().endswith("rmsnorm") and not isinstance(module, RMSNorm64):
            eps = _norm_eps(module)
            weight = getattr(module, "weight", None)
            replacement = None if eps is None or not isinstance(weight, Tensor) else RMSNorm64(weight, eps)
            if (
                replacement is not None
                and weight is not None
                and _same_function(module, replacement, weight.numel())
            ):
                parent, _, child = name.rpartition(".")
                setattr(layer.get_submodule(parent) if parent else layer, child, replacement)
            else:
                notes.append(f"{kind} ({name}) is not a Llama-form RMSNorm: it computes in its own dtype")
        elif kind == "QuantizedExperts":
            notes.append(f"fused experts ({name}) compute their gate and up products in float32")
    for module in layer.modules():
        if isinstance(module, EmulatedLinear):
            # its float32 weights widen exactly, one product at a time (``matmul``): a float64
            # copy of the whole layer would add half again to the memory-bounded pass's peak
            module.compute_dtype = DTYPE
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_floating_point():
                setattr(module, name, nn.Parameter(param.detach().to(DTYPE), requires_grad=False))
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_floating_point():
                setattr(module, name, buffer.to(DTYPE))
    return tuple(notes)


def rotary_float64(rotary: Any, position_ids: Tensor | None, captured: Any) -> tuple[Tensor, Tensor] | None:
    """The decoder's ``(cos, sin)`` computed in float64 from its ``inv_freq`` (as Llama's rotary
    forward computes them in float32), or None where that would not reproduce ``captured`` (the
    model's own, in its dtype): another rotary form."""
    inv_freq = getattr(rotary, "inv_freq", None)
    scaling = getattr(rotary, "attention_scaling", 1.0)
    if not isinstance(inv_freq, Tensor) or position_ids is None:
        return None
    if not (isinstance(captured, tuple) and len(captured) == 2):
        return None
    freqs = position_ids.to(DTYPE)[..., None] * inv_freq.to(DTYPE, copy=True)[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * float(scaling), emb.sin() * float(scaling)
    for ours, theirs in zip((cos, sin), captured, strict=True):
        if ours.shape != theirs.shape or not torch.allclose(ours, theirs.to(DTYPE), rtol=2e-2, atol=2e-2):
            return None
    return cos, sin


def to_device(value: Any, device: torch.device | str, float64: bool) -> Any:
    """``value`` (tensors in tuples, lists and dicts) on ``device``; floating tensors in float64
    where ``float64``."""
    if isinstance(value, Tensor):
        if float64 and value.is_floating_point():
            return value.to(device=device, dtype=DTYPE)
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(to_device(v, device, float64) for v in value)
    if isinstance(value, list):
        return [to_device(v, device, float64) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device, float64) for k, v in value.items()}
    return value
