"""Checks that a recipe applies to a model as written, before any expensive work.

Group-wise schemes need a group size that divides every layer they quantize: W4A16 with
group 128 fails outright on SmolLM2-135M (hidden size 576), but only after loading the model
and calibrating. This check reads tensor shapes from the safetensors headers alone and names
the first layer that does not fit, the recipe, and the two ways out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quantgate.config import Recipe
from quantgate.intake import SourceRecord, read_header
from quantgate.runtime.errors import ConfigFileError, RecipeIncompatibleError
from quantgate.runtime.suggest import did_you_mean


def weight_group_size(modifier_args: dict[str, Any], recipe_file: str = "recipe") -> int | None:
    """The weight group size a modifier asks for (preset scheme or explicit config groups)."""
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    sizes: list[int | None] = []
    if "scheme" in modifier_args and isinstance(modifier_args["scheme"], str):
        scheme = modifier_args["scheme"]
        if scheme not in PRESET_SCHEMES:
            raise ConfigFileError(
                recipe_file, f"unknown preset scheme '{scheme}'", did_you_mean(scheme, PRESET_SCHEMES)
            )
        weights = preset_name_to_scheme(scheme, ["Linear"]).weights
        sizes.append(weights.group_size if weights else None)
    for group in (modifier_args.get("config_groups") or {}).values():
        sizes.append((group.get("weights") or {}).get("group_size"))
    given = [s for s in sizes if s]
    return max(given) if given else None


def quantized_weight_shapes(source: SourceRecord, ignore: list[str]) -> dict[str, tuple[int, ...]]:
    """2-D weights a Linear-targeting recipe would quantize, by module name.

    Embeddings are not Linear modules; they are skipped by name, as model_free_ptq does.
    """
    from compressed_tensors.utils.match import match_quantizable_tensors

    shapes: dict[str, tuple[int, ...]] = {}
    for rel in source.weight_files:  # the files every engine reads, no other *.safetensors
        for name, info in read_header(Path(source.path) / rel).tensors.items():
            if len(info.shape) == 2 and "embed" not in name:
                shapes[name] = tuple(info.shape)
    matched = dict(match_quantizable_tensors(dict.fromkeys(shapes), ignore=ignore, targets=["Linear"]))
    return {module: shapes[tensor] for module, tensor in matched.items()}


def check_group_sizes(source: SourceRecord, recipe: Recipe, ignore: list[str]) -> None:
    """Refuse a recipe whose weight group size does not divide a layer it quantizes, naming the layer."""
    _, args = recipe.modifier()
    group = weight_group_size(args, f"recipes/{recipe.name}.yaml")
    if not group:
        return
    for module, (_, in_features) in sorted(quantized_weight_shapes(source, ignore).items()):
        if in_features % group:
            raise RecipeIncompatibleError(
                f"recipes/{recipe.name}.yaml",
                f"group size {group} does not divide {module}'s input size {in_features}",
                f"choose a group size that divides every quantized layer (a divisor of {in_features}), "
                f"or add '{module}' to the modifier's ignore list with a stated reason",
            )
