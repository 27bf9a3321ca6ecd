"""Numerics: evaluate an artifact in the arithmetic of the hardware it is built for.

An artifact on disk says what its weights are; it does not say what a serving kernel does
with its activations or its KV cache. This package loads an artifact with the target's weight,
activation and KV cache numerics applied explicitly (emulated on CPU), so an evaluation never
measures W8A16 where the hardware runs W8A8, and reports which numerics it used.

- ``formats``: activation and KV cache formats (pure tensor functions, one registry);
- ``weights``: how each on-disk weight format decodes, exactly;
- ``emulated``: ``EmulatedLinear``, a quantized Linear computed as its kernel computes it;
- ``cpu_gemm``: ``Float32GemmLinear``, a bf16 Linear on the CPU computed as a GPU's bf16 GEMM;
- ``moe``: ``QuantizedExperts``, a mixture-of-experts layer's per-expert weights in place of
  transformers' fused experts, computed as vLLM's fused-MoE kernels compute them;
- ``kvcache``: FP8 KV cache emulation after RoPE, through transformers' attention dispatch;
- ``load``: ``load_for_eval`` / ``load_source_for_eval`` and the ``NumericsReport``.
"""

from typing import TYPE_CHECKING

from quantgate.numerics.cpu_gemm import CPU_BF16_GEMM, Float32GemmLinear
from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import (
    activation_format,
    activation_formats,
    kv_cache_format,
    kv_cache_formats,
    register_activation,
    register_kv_cache,
)
from quantgate.numerics.load import EvalModel, NumericsReport, load_for_eval, load_source_for_eval
from quantgate.numerics.moe import QuantizedExperts, RoutedExperts
from quantgate.numerics.weights import DecodedWeight, register_weights, weight_format, weight_formats
from quantgate.runtime.exports import lazy_exports

if TYPE_CHECKING:
    from quantgate.numerics.artifact import disk_to_memory, emulated_modules
    from quantgate.numerics.attention import register as register_tiled_attention
    from quantgate.numerics.kvcache import STORED as KV_STORED
    from quantgate.numerics.kvcache import (
        KVHook,
        ObserveKV,
        attention_modules,
        install_kv_hooks,
        is_latent,
        stored_hooks,
    )
    from quantgate.numerics.moe import expert_key

__all__ = [
    "CPU_BF16_GEMM",
    "KV_STORED",
    "DecodedWeight",
    "EmulatedLinear",
    "EvalModel",
    "Float32GemmLinear",
    "KVHook",
    "NumericsReport",
    "ObserveKV",
    "QuantizedExperts",
    "RoutedExperts",
    "activation_format",
    "activation_formats",
    "attention_modules",
    "disk_to_memory",
    "emulated_modules",
    "expert_key",
    "install_kv_hooks",
    "is_latent",
    "kv_cache_format",
    "kv_cache_formats",
    "load_for_eval",
    "load_source_for_eval",
    "register_activation",
    "register_kv_cache",
    "register_tiled_attention",
    "register_weights",
    "stored_hooks",
    "weight_format",
    "weight_formats",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "register_tiled_attention": "attention:register",
        "expert_key": "moe",
        "ObserveKV": "kvcache",
        "attention_modules": "kvcache",
        "disk_to_memory": "artifact",
        "emulated_modules": "artifact",
        "install_kv_hooks": "kvcache",
        "is_latent": "kvcache",
        "KVHook": "kvcache",
        "KV_STORED": "kvcache:STORED",
        "stored_hooks": "kvcache",
    },
)
