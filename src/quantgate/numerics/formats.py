"""Activation and KV-cache number formats: one registry, one function per format.

Each format is a pure tensor function, registered under the name a target YAML uses
(``numerics.activations``) or under the name of a KV-cache element type. A new format is one
function plus ``@register_activation(name)`` or ``@register_kv_cache(name)``, in a module of
this package or, from outside, in a module that an installed distribution names under the
``quantgate.activation_formats`` / ``quantgate.kv_cache_formats`` entry point; nothing central is
edited (the registries are this module's, of the type ``quantgate.runtime.extensions.PluginRegistry`` that
engines and suite kinds share).
Weight formats (how bytes on disk decode) live in ``weights.py`` under the same pattern.

Arithmetic is float32, because that is what the serving kernels do: the dynamic scale, its
reciprocal and the scaled value are float32 before the cast to the narrow type. A float64 input
is the exception (``work_dtype``): the build's canonical KV pass (``quantize/canonical.py``) needs
the same bits on any device, and float32 steps do not give them (measured on the H200: a per-token
FP8 quantization of float64 inputs 1 ulp apart gave outputs 3e-7 apart in 3,840 of 5,888 values,
and the KV scales followed; in float64 the CPU's and the GPU's scales are the same bits). The cast
itself is torch's round-to-nearest-even, after an explicit clamp (torch's float8
casts do not saturate: an e4m3fnuz value beyond +-240 becomes NaN).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from quantgate.runtime.extensions import PluginRegistry

FP8_E4M3FN_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_E4M3FNUZ_MAX = 240.0  # torch.finfo(torch.float8_e4m3fnuz).max
# vLLM on ROCm clamps dynamic fnuz activations at 224, not 240: "using the default value (240.0)
# from pytorch will cause accuracy issue on dynamic quantization models" (input_quant_fp8.py).
FP8_E4M3FNUZ_DYNAMIC_MAX = 224.0


@dataclass(frozen=True)
class ActivationFormat:
    """Fake quantization of a linear layer's input: returns the dequantized values in float32.

    ``needs_global_scale``: the format takes a calibrated per-tensor scale from the artifact
    (NVFP4's ``input_global_scale``); loading fails if a module has none. ``expects``: what
    the artifact's ``input_activations`` in config.json must say for this format to apply
    (a target declaring W8A8 numerics for a weight-only artifact is refused, not emulated).
    """

    name: str
    quantize: Callable[[Tensor, Tensor | None], Tensor]
    needs_global_scale: bool
    expects: dict[str, Any]
    note: str


@dataclass(frozen=True)
class KVCacheFormat:
    """Fake quantization of keys and values as the KV cache stores them; returns x's dtype.

    ``quantize(x, scale)``: the per-tensor scale the engine loaded (the artifact's calibrated
    ``k_scale`` / ``v_scale``; 1.0 when it has none).
    """

    name: str
    fn: Callable[[Tensor, Tensor | float], Tensor]
    note: str

    def quantize(self, x: Tensor, scale: Tensor | float = 1.0) -> Tensor:
        """``x`` as written to and read back from the cache at ``scale``."""
        return self.fn(x, scale)


ACTIVATION_FORMATS: PluginRegistry[ActivationFormat] = PluginRegistry(
    "activation format",
    "quantgate.activation_formats",
    __name__.rpartition(".")[0],
    "register_activation",
    f"{__name__}:ActivationFormat",
)
KV_CACHE_FORMATS: PluginRegistry[KVCacheFormat] = PluginRegistry(
    "KV cache format",
    "quantgate.kv_cache_formats",
    __name__.rpartition(".")[0],
    "register_kv_cache",
    f"{__name__}:KVCacheFormat",
)


def register_activation(
    name: str, *, expects: dict[str, Any], needs_global_scale: bool = False, note: str = ""
):
    """Decorator: register a function ``(x, global_scale) -> dequantized x`` as activation format ``name``."""

    def decorator(fn: Callable[[Tensor, Tensor | None], Tensor]):
        ACTIVATION_FORMATS.add(name, ActivationFormat(name, fn, needs_global_scale, dict(expects), note))
        return fn

    return decorator


def register_kv_cache(name: str, *, note: str = ""):
    """Decorator: register a function ``(x, scale) -> x as the KV cache stores it`` as KV cache format ``name``."""

    def decorator(fn: Callable[[Tensor, Tensor | float], Tensor]):
        KV_CACHE_FORMATS.add(name, KVCacheFormat(name, fn, note))
        return fn

    return decorator


def activation_format(name: str) -> ActivationFormat:
    """The registered activation format ``name`` (an unknown name suggests the nearest)."""
    return ACTIVATION_FORMATS.get(name, "quantgate.numerics")


def kv_cache_format(name: str) -> KVCacheFormat:
    """The registered KV cache format ``name`` (an unknown name suggests the nearest)."""
    return KV_CACHE_FORMATS.get(name, "quantgate.numerics")


def activation_formats() -> list[str]:
    """Names of the registered activation formats."""
    return ACTIVATION_FORMATS.names()


def kv_cache_formats() -> list[str]:
    """Names of the registered KV cache formats."""
    return KV_CACHE_FORMATS.names()


# ---------------------------------------------------------------------------- FP8 per token

_FP8_DYNAMIC = {"type": "float", "num_bits": 8, "strategy": "token", "dynamic": True}


def work_dtype(x: Tensor) -> torch.dtype:
    """float32, as the kernels compute; float64 for a float64 input (the canonical pass)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def fp8_per_token(x: Tensor, dtype: torch.dtype, qmax: float) -> Tensor:
    """Dynamic per-token FP8 fake quantization, as vLLM's ``QuantFP8`` reference does it.

    scale = max(amax(|x|) / qmax, 1 / (qmax * 512)) per row (the floor guards all-zero rows
    exactly as vLLM does), q = cast(clamp(x * (1 / scale), +-qmax)), result q * scale.
    """
    work = work_dtype(x)
    x = x.to(work)
    # max(|x|) as max(max x, -min x) and the clamp and rescale in place: the same values, with one
    # activation-sized temporary instead of three (the memory-bounded KV pass's largest moment is a
    # float64 down_proj input, 25 MB at 512 tokens)
    amax = torch.maximum(x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True).neg_())
    scale = (amax / qmax).clamp(min=1.0 / (qmax * 512.0))
    q = (x * scale.reciprocal()).clamp_(-qmax, qmax).to(dtype)
    return q.to(work).mul_(scale)


@register_activation(
    "fp8_e4m3fn_per_token",
    expects=_FP8_DYNAMIC,
    note="activations: dynamic per-token OCP e4m3fn (max 448), scale amax/448, as vLLM on Hopper",
)
def fp8_e4m3fn_per_token(x: Tensor, global_scale: Tensor | None = None) -> Tensor:
    """Hopper's dynamic per-token OCP FP8 (max 448)."""
    return fp8_per_token(x, torch.float8_e4m3fn, FP8_E4M3FN_MAX)


@register_activation(
    "fp8_e4m3fnuz_per_token",
    expects=_FP8_DYNAMIC,
    note="activations: dynamic per-token e4m3fnuz clamped at +-224 (vLLM on MI300), scale amax/224",
)
def fp8_e4m3fnuz_per_token(x: Tensor, global_scale: Tensor | None = None) -> Tensor:
    """MI300's dynamic per-token fnuz FP8, clamped at 224 as vLLM does on ROCm."""
    return fp8_per_token(x, torch.float8_e4m3fnuz, FP8_E4M3FNUZ_DYNAMIC_MAX)


# ---------------------------------------------------------------------------- NVFP4


def _nvfp4_args():
    # compressed-tensors' own NVFP4 preset: groups of 16, E2M1 values, E4M3 group scales,
    # dynamic ("local") group scales under a static global scale.
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    return PRESET_SCHEMES["NVFP4"]["input_activations"]


@register_activation(
    "nvfp4_calibrated",
    needs_global_scale=True,
    expects={"type": "float", "num_bits": 4, "strategy": "tensor_group", "group_size": 16},
    note=(
        "activations: NVFP4 per 16 values, E4M3 group scale = round_e4m3(input_global_scale * amax/6), "
        "E2M1 round-to-nearest-even, using compressed-tensors' own fake quantization"
    ),
)
def nvfp4_calibrated(x: Tensor, global_scale: Tensor | None = None) -> Tensor:
    """NVFP4 activations exactly as compressed-tensors defines them (llm-compressor calibrates with it).

    Group scale s = e4m3(global * amax_16 / 6) (0 replaced by 0.125), value
    e2m1(clamp(x / (s / global), +-6)) * (s / global). Blackwell's kernel computes the same
    quantities (its GEMM applies 1/(input_global * weight_global) after accumulation).
    The input is promoted to float32 first: the kernel computes amax/6 in float32, and
    compressed-tensors computes in the input's dtype, which for bf16 would round the group
    scale twice.
    """
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize

    if global_scale is None:
        raise ValueError("nvfp4_calibrated needs the module's calibrated input_global_scale")
    x = x.to(work_dtype(x))
    global_scale = global_scale.to(x.dtype)
    args = _nvfp4_args()
    scale = nvfp4_group_scales(x, global_scale)
    zero_point = torch.zeros(scale.shape, dtype=args.zp_dtype, device=scale.device)
    return fake_quantize(x=x, scale=scale, zero_point=zero_point, args=args, global_scale=global_scale)


NVFP4_ZERO_SCALE = 0.125  # compressed-tensors' stand-in for a group scale that rounds to 0 (E4M3's eps)


def nvfp4_group_scales(x: Tensor, global_scale: Tensor) -> Tensor:
    """The dynamic NVFP4 group scales of ``x`` (groups of 16 along its last dimension), the values
    compressed-tensors' ``compute_dynamic_scales_and_zp`` gives, bit for bit (a test holds it so).

    Computed here rather than by that function because it builds its zero stand-in with
    ``torch.tensor(eps, device=...)`` on every call: a host-to-device copy, which a CUDA graph
    cannot record, so an NVFP4 artifact's decoding step could not be replayed
    (``evaluate/decode.py``). The stand-in here is a scalar fill.
    """
    amax = x.unflatten(-1, (-1, 16)).abs().amax(dim=-1)
    e4m3 = torch.finfo(torch.float8_e4m3fn)
    # E2M1's largest value as a tensor on x's device, as the library divides by it: on CUDA a
    # Python scalar divisor becomes a multiplication by its reciprocal, which rounds differently
    e2m1_max = torch.full((), 6.0, dtype=amax.dtype, device=amax.device)
    scales = global_scale * (amax / e2m1_max)
    scales = scales.clamp(e4m3.min, e4m3.max).to(torch.float8_e4m3fn).to(scales.dtype)
    return scales.masked_fill(scales == 0, NVFP4_ZERO_SCALE)


# ---------------------------------------------------------------------------- KV cache


def fp8_kv(x: Tensor, scale: Tensor | float, dtype: torch.dtype, qmax: float) -> Tensor:
    """Per-tensor static FP8 storage as vLLM's cache-write kernels do it: ``x / scale`` in float32,
    saturated at the type's maximum, rounded to nearest even; read back as ``fp8 * scale``.

    (``reshape_and_cache_flash``: ``key / k_scale`` then a saturating cast; attention
    dequantizes with the same scale.) Returns x's dtype: attention here runs in the model's dtype.
    """
    work = work_dtype(x)
    s = scale.to(work) if isinstance(scale, Tensor) else torch.tensor(float(scale), dtype=work)
    q = (x.to(work) / s).clamp(-qmax, qmax).to(dtype)
    return (q.to(work) * s).to(x.dtype)


@register_kv_cache(
    "fp8_e4m3fn",
    note="KV cache: e4m3fn (max 448), per-tensor static scale, x / scale saturated, as vLLM's cache write",
)
def kv_fp8_e4m3fn(x: Tensor, scale: Tensor | float = 1.0) -> Tensor:
    """Keys or values stored as OCP FP8 at ``scale``."""
    return fp8_kv(x, scale, torch.float8_e4m3fn, FP8_E4M3FN_MAX)


@register_kv_cache(
    "fp8_e4m3fnuz",
    note=(
        "KV cache: e4m3fnuz (MI300), per-tensor static scale as stored (vLLM 0.33's compressed-tensors "
        "KV path does not double it), saturating at +-240"
    ),
)
def kv_fp8_e4m3fnuz(x: Tensor, scale: Tensor | float = 1.0) -> Tensor:
    """Keys or values stored as fnuz FP8 at ``scale``."""
    return fp8_kv(x, scale, torch.float8_e4m3fnuz, FP8_E4M3FNUZ_MAX)
