"""Resource bounds on what config.json asks intake to build, checked before any model is built.

The shape check builds the model's skeleton on the meta device. Meta tensors cost nothing
whatever their size, but modules do: a config's counts are multiplied into Python objects, and
``num_hidden_layers: 1000000`` built a million decoder layers (4 GB and growing until killed)
before a single shape was compared. Config classes also do arithmetic with the counts
(``hidden_size % num_attention_heads``), and some build per-layer lists of them.

So every count is bounded by what the checkpoint actually stores, read from the safetensors
headers alone: a layer stores at least one tensor, so there are no more layers than tensors; a
head is at least one element along some tensor dimension; an expert stores at least one tensor
per MoE layer, unless the checkpoint keeps the experts fused in 3-D tensors whose leading
dimension counts them. Counts must be positive where a zero divides. The later shape and
completeness checks compare the exact numbers; these bounds only keep a hostile config from
getting that far at a cost.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantgate.intake.safetensors_header import TensorInfo
from quantgate.runtime.errors import CheckpointConfigError

LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
HEAD_KEYS = ("num_attention_heads", "num_key_value_heads", "n_head", "num_heads", "num_kv_heads")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# module count of a skeleton grows with layers x experts; experts stored per tensor on disk give
# at least two tensors per expert per MoE layer, so 8 x tensors leaves room for dense layers
_EXPERT_LAYER_FACTOR = 8

Tensors = dict[str, tuple[str, TensorInfo]]


def check(root: Path, raw: dict[str, Any], tensors: Tensors) -> None:
    """Refuse config.json (CheckpointConfigError, exit 2) when a count is not a plausible one
    for the tensors present; checked on the top level and on every ``*_config`` sub-config."""
    path = root / "config.json"
    n_tensors = len(tensors)
    widest = max((d for _, info in tensors.values() for d in info.shape), default=0)
    fused = max((info.shape[0] for _, info in tensors.values() if len(info.shape) == 3), default=0)
    for where, config in _configs(raw):
        layers = _count(path, where, config, LAYER_KEYS, minimum=0)
        for key in HEAD_KEYS:
            heads = _count(path, where, config, (key,), minimum=1)
            if heads is not None and heads > widest:
                raise CheckpointConfigError(
                    path,
                    f"config.json declares {where}{key} = {heads:,}, more than the widest tensor dimension "
                    f"in the checkpoint ({widest:,}): each head needs at least one",
                    f"set {key} to the model's head count",
                )
        if layers is not None and layers > n_tensors:
            key = next(k for k in LAYER_KEYS if config.get(k) is not None)
            raise CheckpointConfigError(
                path,
                f"config.json declares {where}{key} = {layers:,}, more layers than the checkpoint "
                f"stores tensors ({n_tensors:,}): refused before building the model",
                f"set {key} to the number of layers the weights hold",
            )
        experts = _count(path, where, config, EXPERT_KEYS, minimum=0)
        if experts is not None and experts > fused:  # experts stored one tensor each, not fused
            key = next(k for k in EXPERT_KEYS if config.get(k) is not None)
            if experts > n_tensors or experts * max(layers or 1, 1) > _EXPERT_LAYER_FACTOR * n_tensors:
                raise CheckpointConfigError(
                    path,
                    f"config.json declares {where}{key} = {experts:,} experts"
                    + (f" in each of {layers:,} layers" if layers else "")
                    + f", more than the checkpoint's {n_tensors:,} tensors can hold: refused before "
                    "building the model",
                    f"set {key} to the number of experts the weights hold",
                )


def _configs(raw: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The config and each sub-config (``text_config``, ``vision_config``, ...), with a prefix naming it."""
    yield "", raw
    for key, value in raw.items():
        if key.endswith("_config") and isinstance(value, dict):
            yield f"{key}.", value


def _count(path: Path, where: str, config: dict[str, Any], keys: tuple[str, ...], minimum: int) -> int | None:
    """The first of ``keys`` set (not null) in ``config``: an integer of at least ``minimum``."""
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            wanted = "a positive integer" if minimum == 1 else "a non-negative integer"
            raise CheckpointConfigError(
                path,
                f"config.json declares {where}{key} = {value!r}, not {wanted}",
                f"set {key} to the model's value",
            )
        return value
    return None
