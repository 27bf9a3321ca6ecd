"""Reading an artifact's quantized modules from disk and matching them to the model.

The raw tensors come straight from the safetensors files (never from transformers'
decompression), grouped per module; each module is decoded by its weight format, checked
against a meta-device skeleton of the architecture, and turned into an ``EmulatedLinear``.
The artifact's own config.json must agree with the numerics being emulated.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantgate.errors import InputError
from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import ActivationFormat
from quantgate.numerics.weights import WeightDecodeError, WeightFormat

_QUANTIZED_MARKERS = (".weight_scale", ".weight_packed")


def quantization_config(artifact_dir: Path) -> dict[str, Any]:
    path = artifact_dir / "config.json"
    try:
        config = json.loads(path.read_text())["quantization_config"]
    except (OSError, ValueError, KeyError):
        raise InputError(path, "no quantization_config", "evaluate a compressed-tensors artifact") from None
    if config.get("kv_cache_scheme"):
        raise InputError(
            path, "the artifact has calibrated KV cache scales, which are not emulated yet", "report it"
        )
    return config


def check_config(
    path: Path, config: dict[str, Any], disk_format: str, expects: dict[str, Any] | None
) -> None:
    """The artifact's own description must agree with the numerics we are about to emulate."""
    for name, group in (config.get("config_groups") or {}).items():
        found = group.get("format") or config.get("format")
        if found != disk_format:
            raise InputError(
                path,
                f"config group {name} is {found}, the target's weights need {disk_format}",
                "check the target",
            )
        args = group.get("input_activations")
        if expects is None and args:
            raise InputError(
                path,
                f"config group {name} quantizes activations but the target says none",
                "check the target",
            )
        if expects is not None:
            wrong = {k: (args or {}).get(k) for k, v in expects.items() if (args or {}).get(k) != v}
            if wrong:
                raise InputError(
                    path,
                    f"config group {name} input_activations {wrong} do not match what the target emulates {expects}",
                    "rebuild the artifact with the target's recipe, or evaluate it under the target it was built for",
                )


def read_quantized_tensors(artifact_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    """``{module name: {local tensor name: tensor}}`` for every module with quantized tensors."""
    from safetensors import safe_open

    shards = sorted(artifact_dir.glob("*.safetensors"))
    if not shards:
        raise InputError(artifact_dir, "no .safetensors files", "point at an artifact directory")
    index: dict[str, Path] = {}
    for shard in shards:
        with safe_open(shard, "pt") as f:
            index.update(dict.fromkeys(f.keys(), shard))
    modules = {k[: -len(m)] for k in index for m in _QUANTIZED_MARKERS if k.endswith(m)}
    by_shard: dict[Path, list[tuple[str, str]]] = defaultdict(list)
    for key, shard in index.items():
        module, _, local = key.rpartition(".")
        if module in modules:
            by_shard[shard].append((module, local))
    found: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for shard, entries in by_shard.items():
        with safe_open(shard, "pt") as f:
            for module, local in entries:
                found[module][local] = f.get_tensor(f"{module}.{local}")
    return dict(found)


def emulated_modules(
    artifact_dir: Path,
    raw: dict[str, dict[str, torch.Tensor]],
    wfmt: WeightFormat,
    act: ActivationFormat | None,
) -> dict[str, EmulatedLinear]:
    """An ``EmulatedLinear`` per quantized module, keyed by module name; refuses any mismatch."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(artifact_dir))
    built = {}
    for name, tensors in sorted(raw.items()):
        where = f"{artifact_dir}: module {name}"
        unknown = set(tensors) - wfmt.required - wfmt.optional - {"bias"}
        missing = wfmt.required - set(tensors)
        if unknown or missing:
            raise InputError(
                where,
                f"tensors {sorted(tensors)} do not fit weight format {wfmt.name} (unknown {sorted(unknown)}, "
                f"missing {sorted(missing)})",
                "evaluate the artifact under the target it was built for, or register the format",
            )
        try:
            module = skeleton.get_submodule(name)
        except AttributeError:
            module = None
        if not isinstance(module, nn.Linear):
            raise InputError(
                where,
                f"quantized tensors on disk match no Linear of {type(skeleton).__name__} (found {type(module).__name__})",
                "the in-memory module names differ from the names on disk (fused MoE experts?); "
                "this architecture cannot be emulated yet",
            )
        try:
            decoded = wfmt.decode(tensors)
        except WeightDecodeError as exc:
            raise InputError(where, str(exc), "rebuild the artifact") from None
        if tuple(decoded.values.shape) != (module.out_features, module.in_features):
            raise InputError(
                where,
                f"decoded weight is {tuple(decoded.values.shape)}, the module is "
                f"({module.out_features}, {module.in_features})",
                "rebuild the artifact",
            )
        global_scale = (
            tensors.get("input_global_scale") if act is not None and act.needs_global_scale else None
        )
        if act is not None and act.needs_global_scale and global_scale is None:
            raise InputError(
                where, f"{act.name} needs a calibrated input_global_scale", "rebuild with calibration"
            )
        built[name] = EmulatedLinear(
            decoded, act, weight_format=wfmt.name, input_global_scale=global_scale, bias=tensors.get("bias")
        )
    return built
