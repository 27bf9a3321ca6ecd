"""A variant's recipe: the target's own recipe, the kept groups one step up, as llm-compressor reads it."""

from __future__ import annotations

import pytest

from quantgate.repair.variants import variant_recipe, variant_sha256
from quantgate.runtime.errors import ConfigFileError

pytestmark = pytest.mark.unit

KEPT = ["model.layers.3.mlp.down_proj", "model.layers.0.self_attn.q_proj"]


def _modifier(recipe):
    (stage,) = recipe.recipe.values()
    (group,) = stage.values()
    return group["QuantizationModifier"]


def test_nvfp4_keeps_groups_at_fp8_in_a_second_config_group(catalog):
    base = catalog.recipe("nvfp4")
    target = catalog.target("blackwell-nvfp4")
    variant = variant_recipe(base, target.repair, KEPT, "nvfp4+repair2")
    args = _modifier(variant)
    assert args["scheme"] == {"NVFP4": ["Linear"], "FP8_DYNAMIC": KEPT}
    assert "targets" not in args
    assert args["ignore"] == _modifier(base)["ignore"]  # lm_head, routers, kv_b_proj stay bf16
    assert variant.name == "nvfp4+repair2" and variant.engine == base.engine
    assert _modifier(base)["scheme"] == "NVFP4"  # the catalog's recipe is not touched


def test_fp8_keeps_groups_in_bf16_through_ignore(catalog):
    base = catalog.recipe("fp8-dynamic")
    variant = variant_recipe(base, catalog.target("hopper-fp8").repair, KEPT, "fp8-dynamic+repair2")
    args = _modifier(variant)
    assert args["scheme"] == "FP8_DYNAMIC"
    assert args["ignore"] == [*_modifier(base)["ignore"], *KEPT]


def test_a_recipe_with_config_groups_is_refused_by_name(catalog):
    base = catalog.recipe("nvfp4")
    groups = base.model_copy(
        update={
            "recipe": {"s": {"m": {"QuantizationModifier": {"config_groups": {"g": {}}, "scheme": "NVFP4"}}}}
        }
    )
    with pytest.raises(ConfigFileError, match="recipes/nvfp4.yaml.*single preset scheme"):
        variant_recipe(groups, catalog.target("blackwell-nvfp4").repair, KEPT, "x")


def test_every_kept_set_has_its_own_build_key_part(catalog):
    upgrade = catalog.target("blackwell-nvfp4").repair
    keys = {variant_sha256("base", upgrade, KEPT[:n]) for n in range(3)}
    assert len(keys) == 3
    assert variant_sha256("base", upgrade, KEPT) != variant_sha256("other", upgrade, KEPT)
