"""The layer groups of a built artifact that repair can keep at a higher precision.

A group is what vLLM loads as one layer: ``q_proj``/``k_proj``/``v_proj`` are shards of
``qkv_proj`` and ``gate_proj``/``up_proj`` of ``gate_up_proj``, and vLLM refuses a fused layer
whose shards carry different schemes; an MoE layer's experts run as one fused kernel. So the
serving check's own layout (``quantgate.serving.layout``) decides the groups, and a repaired
variant always keeps whole groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantgate.runtime.errors import InputError
from quantgate.serving import read_layout

_QUANTIZED = ("weight_scale", "weight_packed")


@dataclass(frozen=True)
class Unit:
    """One layer group: the vLLM layer's name and its modules on disk."""

    name: str
    modules: tuple[str, ...]


def quantized_units(artifact_dir: Path) -> list[Unit]:
    """Every group of ``artifact_dir`` holding quantized tensors, in the checkpoint's order."""
    layout = read_layout(Path(artifact_dir))
    units = []
    for name, layers in layout.by_fused().items():
        if not any(p in layer.tensors for layer in layers for p in _QUANTIZED):
            continue  # kept in the source's precision by the recipe (lm_head, routers)
        units.append(Unit(name, tuple(sorted(layer.name for layer in layers))))
    if not units:
        raise InputError(artifact_dir, "no quantized layer groups", "repair a built, quantized artifact")
    return units
