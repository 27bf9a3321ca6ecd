"""A repaired variant's recipe: the target's own recipe with k layer groups kept one step up.

Through llm-compressor's own non-uniform recipes, so the variant stays one compressed-tensors
checkpoint that the target's serving check and vLLM load:

- a quantized upgrade (NVFP4 -> FP8) turns ``scheme: NVFP4`` into the preset dict
  ``{NVFP4: <targets>, FP8_DYNAMIC: [<kept modules>]}``: two config groups. Both compressed-tensors
  (``match_targets``: exact names before regexes before classes) and vLLM 0.33
  (``_find_first_match`` on names before class names) give a module named exactly in the second
  group that group's scheme, although ``Linear`` in the first matches it too;
- an unquantized upgrade (FP8 -> bf16) adds the kept modules to ``ignore``.

The variant's recipe hash covers the base recipe file and the kept modules, so its build key
differs from the uniform artifact's and from every other k.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from quantgate.config import Recipe, RepairUpgrade
from quantgate.contracts.artifact import RepairRef
from quantgate.quantize import PlannedBuild
from quantgate.repair.units import Unit
from quantgate.runtime.errors import ConfigFileError

_MODIFIERS = ("QuantizationModifier", "GPTQModifier", "AWQModifier")


def variant_recipe(recipe: Recipe, upgrade: RepairUpgrade, modules: list[str], name: str) -> Recipe:
    """``recipe`` with ``modules`` kept at ``upgrade``, called ``name``; refused for a recipe it
    cannot rewrite."""
    body = json.loads(json.dumps(recipe.recipe))
    rewritten = 0
    for stage in body.values():
        for group in stage.values():
            for kind, args in group.items():
                if kind not in _MODIFIERS:
                    continue
                if upgrade.scheme is None:
                    args["ignore"] = [*args.get("ignore", []), *modules]
                else:
                    scheme = args.get("scheme")
                    if not isinstance(scheme, str) or "config_groups" in args:
                        raise ConfigFileError(
                            f"recipes/{recipe.name}.yaml",
                            f"{kind} names no single preset scheme, so repair cannot add a second one",
                            "write the recipe with `scheme: <PRESET>` and `targets:`, or drop the target's repair",
                        )
                    args["scheme"] = {
                        scheme: list(args.pop("targets", ["Linear"])),
                        upgrade.scheme: list(modules),
                    }
                rewritten += 1
    if rewritten != 1:
        raise ConfigFileError(
            f"recipes/{recipe.name}.yaml",
            f"repair rewrites exactly one quantization modifier, the recipe has {rewritten}",
            "give the recipe one QuantizationModifier (or GPTQ/AWQ modifier)",
        )
    return recipe.model_copy(update={"name": name, "recipe": body})


def variant_sha256(base_sha256: str, upgrade: RepairUpgrade, modules: list[str]) -> str:
    """The variant's recipe hash: the base recipe file's bytes and what it keeps, at which precision."""
    payload = json.dumps({"base": base_sha256, "upgrade": upgrade.model_dump(mode="json"), "keep": modules})
    return hashlib.sha256(payload.encode()).hexdigest()


def planned_variant(
    base: PlannedBuild, kept: list[Unit], units_total: int, parent_build_key: str
) -> PlannedBuild:
    """The build of ``base``'s target with ``kept`` (most sensitive first) one precision up."""
    upgrade = base.target.repair
    if upgrade is None:
        raise ConfigFileError(
            f"targets/{base.target.name}.yaml", "declares no repair", "add a repair: section to the target"
        )
    modules = [m for unit in kept for m in unit.modules]
    ref = RepairRef(
        parent_build_key=parent_build_key,
        upgrade=upgrade.label,
        units_total=units_total,
        kept_units=[u.name for u in kept],
        kept_modules=modules,
        numerics=upgrade.numerics,
    )
    fields: dict[str, Any] = {
        "recipe": variant_recipe(base.recipe, upgrade, modules, f"{base.recipe.name}+repair{len(kept)}"),
        "recipe_sha256": variant_sha256(base.recipe_sha256, upgrade, modules),
        "repair": ref,
    }
    return base.model_copy(update=fields)
