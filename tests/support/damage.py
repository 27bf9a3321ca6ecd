"""Deliberately damaged copies of a built FP8 artifact, for the tests that show the gate catches them.

Each damage maps (tensor name, tensor, generator) to the damaged tensor, or None to leave it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from quantgate.contracts.artifact import hash_files, read_manifest, write_manifest

Damage = Callable[[str, torch.Tensor, torch.Generator], torch.Tensor | None]
LAYER = 15  # of the default model's 30: the middle of the stack


def _noisy_weights(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if t.dtype != torch.float8_e4m3fn:
        return None
    noisy = t.float() * (1 + 0.5 * torch.randn(t.shape, generator=g))
    return noisy.clamp(-448, 448).to(t.dtype)


def _perturbed_scales(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if not name.endswith("weight_scale"):
        return None
    return (t.float() * (1 + 0.6 * (2 * torch.rand(t.shape, generator=g) - 1))).to(t.dtype)


def _one_layer(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if not name.startswith(f"model.layers.{LAYER}.") or t.dtype != torch.float8_e4m3fn:
        return None
    return t[torch.randperm(t.shape[0], generator=g)]  # its output channels scrambled


def _clipping_kv_scales(name: str, t: torch.Tensor, g: torch.Generator) -> torch.Tensor | None:
    if not name.endswith(("k_scale", "v_scale")):
        return None
    return (t.float() / 16).to(t.dtype)  # keys and values saturate at 1/16 of their range


DAMAGES: dict[str, Damage] = {
    "weights": _noisy_weights,
    "scales": _perturbed_scales,
    "one-layer": _one_layer,
    "kv-scales": _clipping_kv_scales,
}


def damaged_copy(artifact: Path, dest: Path, damage: Damage) -> None:
    """A copy of ``artifact`` with ``damage`` applied to its tensors (seeded), internally consistent:
    its manifest is rewritten over the damaged bytes, so only an evaluation can catch it."""
    shutil.copytree(artifact, dest)
    generator = torch.Generator().manual_seed(0)
    changed = 0
    for shard in sorted(dest.glob("*.safetensors")):
        tensors = load_file(shard)
        for name in sorted(tensors):
            damaged = damage(name, tensors[name], generator)
            if damaged is not None:
                tensors[name], changed = damaged, changed + 1
        shard.unlink()
        save_file(tensors, shard, metadata={"format": "pt"})
    assert changed, f"{dest.name}: the damage touched no tensor"
    write_manifest(dest, read_manifest(dest).model_copy(update={"files": hash_files(dest)}))
