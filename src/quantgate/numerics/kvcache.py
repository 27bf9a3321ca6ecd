"""FP8 KV cache emulation, placed where the serving engine quantizes: after RoPE.

vLLM writes each layer's keys after the rotary embedding (and values) into an FP8 cache and
attends over what it reads back, current tokens included. Quantizing the outputs of
``k_proj`` would be simpler (a forward hook) but wrong for keys: rounding does not commute
with the rotation. So the hook sits in transformers' attention dispatch instead: every model
that calls ``ALL_ATTENTION_FUNCTIONS`` (Llama, Mistral, Qwen, Mixtral, ...) receives the
post-RoPE keys and the values of all positions, past and current, exactly what a cache holds.

How: one wrapper is registered per underlying implementation (``quantgate_kv+sdpa`` wraps
``sdpa``, with sdpa's mask function); the format lives on each attention module, not in a
global, and a module without it fails loudly rather than attending unquantized. Re-quantizing
the whole cache at each step of ``generate`` gives the same numbers as quantizing once at
write time, because FP8 values are fixed points of the fake quantization (and exact in bf16).

Not emulated: some attention backends (FlashAttention 3 with an FP8 cache) also cast the
query to FP8; attention itself runs in the model's dtype here.
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn

from quantgate.numerics.formats import KVCacheFormat

_ATTR = "_quantgate_kv_cache"
_PREFIX = "quantgate_kv+"


def _wrapped_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    state = getattr(module, _ATTR, None)
    if state is None:
        raise RuntimeError(
            f"{type(module).__name__} runs under {_PREFIX}* attention but carries no KV cache format; "
            "load the model with quantgate.numerics.load_for_eval"
        )
    fmt, inner = state
    return _inner_attention(module, inner)(
        module, query, fmt.quantize(key), fmt.quantize(value), attention_mask, **kwargs
    )


def _inner_attention(module: nn.Module, inner: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if inner == "eager":  # each modeling file defines its own eager function
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[inner]


def _attention_modules(model: nn.Module) -> list[nn.Module]:
    """Modules that project keys and values (the ones transformers passes to attention functions)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "k_proj") and hasattr(m, "v_proj") and hasattr(m, "layer_idx")
    ]


def latent_attention(model: nn.Module) -> bool:
    """Multi-head latent attention (DeepSeek-V2/V3): one cached latent per token, no k_proj/v_proj."""
    return any(hasattr(m, "kv_a_proj_with_mqa") and hasattr(m, "kv_b_proj") for m in model.modules())


def install_kv_cache(model: Any, fmt: KVCacheFormat) -> int:
    """Route ``model``'s attention through FP8 fake quantization of K and V; returns the layer count."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    inner = model.config._attn_implementation or "eager"
    if inner.startswith(_PREFIX):
        raise ValueError("this model's KV cache numerics are already installed")
    if inner not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(f"attention implementation {inner!r} has no mask function to reuse")
    modules = _attention_modules(model)
    if not modules:
        raise ValueError(f"{type(model).__name__} has no attention module with k_proj/v_proj/layer_idx")
    name = _PREFIX + inner
    # transformers' registries are process-wide; this entry is the same for every model and
    # holds no per-model state (that lives on the modules), so registering again is harmless
    AttentionInterface.register(name, _wrapped_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    for module in modules:
        setattr(module, _ATTR, (fmt, inner))
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise ValueError(f"{type(model).__name__} refused attention implementation {name!r}")
    return len(modules)
