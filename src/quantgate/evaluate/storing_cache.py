"""A static KV cache that stores keys and values as an FP8 KV cache does: once, at write.

Why: the FP8 KV-cache emulation (``numerics.kvcache``) quantizes everything attention reads, the
whole cache at every decoding step. That is the storage's numbers but not its cost, and on a
static cache, whose every step reads its full length, the cost is a pass over all of it per layer
and step. ``evaluate.decode`` stores each new token through its layer's storage instead, and
tells the emulation (``numerics.KV_STORED``) that what attention reads is stored already.
"""

from __future__ import annotations

from collections.abc import Mapping

from transformers import StaticCache

from quantgate.numerics import KVHook


class StoringCache(StaticCache):
    """``StaticCache`` whose ``update`` passes each layer's new K and V through ``hooks[layer]``."""

    def __init__(self, hooks: Mapping[int, KVHook], **kwargs) -> None:
        super().__init__(**kwargs)
        self.hooks = hooks

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Store the new tokens' keys and values as the cache holds them; return the whole cache."""
        key_states, value_states = self.hooks[layer_idx](key_states, value_states)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)
