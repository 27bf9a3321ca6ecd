"""FP8 KV cache emulation (and KV calibration), placed where the serving engine quantizes: after RoPE.

vLLM writes each layer's keys after the rotary embedding (and values) into an FP8 cache and
attends over what it reads back, current tokens included. Quantizing the outputs of
``k_proj`` would be simpler (a forward hook) but wrong for keys: rounding does not commute
with the rotation. So the hook sits in transformers' attention dispatch instead: every model
that calls ``ALL_ATTENTION_FUNCTIONS`` (Llama, Mistral, Qwen, Mixtral, ...) receives the
post-RoPE keys and the values of all positions, past and current, exactly what a cache holds.

How: one wrapper is registered per underlying implementation (``quantgate_kv+sdpa`` wraps
``sdpa``, with sdpa's mask function); what it does with K and V lives on each attention module
(a ``KVHook``: quantize at the layer's calibrated scales, or observe absmax for calibration),
not in a global, and a module without one fails loudly rather than attending unquantized.
Re-quantizing the whole cache at each step of ``generate`` gives the same numbers as
quantizing once at write time, because FP8 values at a fixed scale are fixed points of the
fake quantization.

Not emulated: some attention backends (FlashAttention 3 with an FP8 cache) also cast the
query to FP8; attention itself runs in the model's dtype here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from quantgate.numerics.formats import KVCacheFormat

_ATTR = "_quantgate_kv_cache"
_PREFIX = "quantgate_kv+"
# attention keyword a forward passes when its cache stored K and V through the hooks at write
# (``stored_hooks``): the wrapper then attends to them as they are
STORED = "quantgate_kv_stored"


class KVHook(Protocol):
    """What one attention module does with its post-RoPE keys and values before attending."""

    def __call__(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values attention reads."""
        ...


@dataclass(frozen=True)
class QuantizeKV:
    """The cache's FP8 storage at this layer's per-tensor scales (1.0 where none were calibrated)."""

    fmt: KVCacheFormat
    k_scale: Tensor | float = 1.0
    v_scale: Tensor | float = 1.0

    def __call__(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values as written to and read back from the cache."""
        return self.fmt.quantize(key, self.k_scale), self.fmt.quantize(value, self.v_scale)


@dataclass
class ObserveKV:
    """Records the absolute maximum of every key and value attention sees; changes nothing.

    ``rope_dims``: for multi-head latent attention only the last ``rope_dims`` of each key are
    cached (the rotary part, ``k_pe``); the latent itself is observed by a forward hook.
    """

    k_absmax: Tensor = field(default_factory=lambda: torch.zeros(()))
    v_absmax: Tensor = field(default_factory=lambda: torch.zeros(()))
    rope_dims: int | None = None

    def __call__(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Update the maxima; return K and V untouched (calibration runs unquantized, as llm-compressor's)."""
        cached = key if self.rope_dims is None else key[..., -self.rope_dims :]
        self.k_absmax = torch.maximum(self.k_absmax, cached.detach().abs().amax().float())
        if self.rope_dims is None:
            self.v_absmax = torch.maximum(self.v_absmax, value.detach().abs().amax().float())
        return key, value

    def observe_latent(self, latent: Tensor) -> None:
        """MLA: the normalized latent (``kv_c_normed``) shares the cache, and the scale, with ``k_pe``."""
        self.k_absmax = torch.maximum(self.k_absmax, latent.detach().abs().amax().float())


@dataclass(frozen=True)
class _State:
    hook: KVHook
    inner: str


def _wrapped_attention(module: nn.Module, query, key, value, attention_mask, **kwargs):
    state = getattr(module, _ATTR, None)
    if state is None:
        raise RuntimeError(
            f"{type(module).__name__} runs under {_PREFIX}* attention but carries no KV cache hook; "
            "load the model with quantgate.numerics.load_for_eval"
        )
    if not kwargs.pop(STORED, False):
        key, value = state.hook(key, value)
    return _inner_attention(module, state.inner)(module, query, key, value, attention_mask, **kwargs)


def stored_hooks(model: nn.Module) -> dict[int, QuantizeKV]:
    """Each layer's FP8 storage by ``layer_idx``, for a cache that stores K and V as written
    (empty when attention is not quantized, or some layer's hook is not a fixed storage).

    Why: the wrapper quantizes the whole cache at every decoding step, which gives the storage's
    numbers (FP8 values at a fixed scale are fixed points) but not its cost: six elementwise
    passes in float32 over every layer's K and V, each step. At 8B on an H200 an FP8-KV
    artifact's recorded decoding step took 43 ms against its source's 11 ms (BENCHMARKS.md). A
    cache that stores each new token quantized, once, gives attention the same values."""
    hooks: dict[int, KVHook] = {
        int(getattr(m, "layer_idx")): getattr(m, _ATTR).hook  # noqa: B009 - an nn.Module attribute mypy cannot type
        for m in attention_modules(model).values()
        if hasattr(m, _ATTR)
    }
    stored = {layer: h for layer, h in hooks.items() if isinstance(h, QuantizeKV)}
    return stored if len(stored) == len(hooks) else {}


def _inner_attention(module: nn.Module, inner: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if inner == "eager":  # each modeling file defines its own eager function
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[inner]


def is_latent(module: nn.Module) -> bool:
    """Multi-head latent attention (DeepSeek-V2/V3): one cached latent per token, no k_proj/v_proj."""
    return hasattr(module, "kv_a_proj_with_mqa") and hasattr(module, "kv_b_proj")


def attention_modules(model: nn.Module, *, latent: bool = False) -> dict[str, nn.Module]:
    """``{name: module}`` of the modules that project keys and values (the ones transformers passes
    to attention functions); with ``latent``, multi-head latent attention modules too."""
    return {
        name: m
        for name, m in model.named_modules()
        if hasattr(m, "layer_idx")
        and ((hasattr(m, "k_proj") and hasattr(m, "v_proj")) or (latent and is_latent(m)))
    }


def latent_attention(model: nn.Module) -> bool:
    """Whether ``model`` uses multi-head latent attention anywhere."""
    return any(is_latent(m) for m in model.modules())


def install_kv_hooks(model: Any, hooks: Mapping[str, KVHook]) -> int:
    """Route ``model``'s attention through ``hooks`` (by attention module name; every module listed
    must exist); returns the number of modules hooked."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    inner = model.config._attn_implementation or "eager"
    if inner.startswith(_PREFIX):
        raise ValueError("this model's KV cache numerics are already installed")
    if inner not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise ValueError(f"attention implementation {inner!r} has no mask function to reuse")
    modules = dict(model.named_modules())
    unknown = sorted(set(hooks) - set(modules))
    if unknown:
        raise ValueError(f"no attention module {unknown[:3]} in {type(model).__name__}")
    if not hooks:
        raise ValueError(f"{type(model).__name__} has no attention module with k_proj/v_proj/layer_idx")
    name = _PREFIX + inner
    # transformers' registries are process-wide; this entry is the same for every model and
    # holds no per-model state (that lives on the modules), so registering again is harmless
    AttentionInterface.register(name, _wrapped_attention)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[inner])
    for module_name, hook in hooks.items():
        setattr(modules[module_name], _ATTR, _State(hook, inner))
    model.set_attn_implementation(name)
    if model.config._attn_implementation != name:
        raise ValueError(f"{type(model).__name__} refused attention implementation {name!r}")
    return len(hooks)


def install_kv_cache(
    model: Any, fmt: KVCacheFormat, scales: Mapping[str, tuple[Tensor, Tensor]] | None = None
) -> int:
    """Route ``model``'s attention through FP8 fake quantization of K and V; returns the layer count.

    ``scales``: ``{attention module name: (k_scale, v_scale)}`` for every attention module (the
    artifact's calibrated scales); None stores at scale 1.0 (no calibrated scales, as vLLM does).
    """
    modules = attention_modules(model)
    if scales is not None:
        missing = sorted(set(modules) - set(scales))
        if missing:
            raise ValueError(f"no k_scale/v_scale for attention modules {missing[:3]}")
        hooks: dict[str, KVHook] = {n: QuantizeKV(fmt, *scales[n]) for n in modules}
    else:
        hooks = {n: QuantizeKV(fmt) for n in modules}
    return install_kv_hooks(model, hooks)
