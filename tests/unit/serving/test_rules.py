"""Each serving rule, broken on its own in a small synthetic artifact; the intact artifacts load."""

from __future__ import annotations

import pytest
import torch
from serving_artifacts import TARGET_OF, group_config, linear, target_with

from quantgate.serving.check import check_artifact
from quantgate.serving.rules import RULES

pytestmark = pytest.mark.unit


def rules_refusing(table, tp: int = 1) -> set[str]:
    """Names of the rules that refuse ``tp`` at any release checked."""
    return {r.rule for d in table.refused if d.tp == tp for r in d.refusals}


@pytest.mark.parametrize("kind", ["fp8", "nvfp4", "w4a16"])
def test_intact_artifacts_load(kind, build, catalog):
    table = check_artifact(build(kind), target_with(catalog, TARGET_OF[kind], tp=(1, 2)))
    assert table.loadable_tp == [1, 2] and table.refused == []


def _drop(name):
    return lambda cfg, t: t.pop(name)


def _set(name, value):
    return lambda cfg, t: t.__setitem__(name, value)


def _quant(**changes):
    return lambda cfg, t: cfg["quantization_config"].update(changes)


def _weights(**changes):
    return lambda cfg, t: cfg["quantization_config"]["config_groups"]["group_0"]["weights"].update(changes)


def _both(*edits):
    def edit(cfg, t):
        for e in edits:
            e(cfg, t)

    return edit


Q0 = "model.layers.0.self_attn.q_proj"
K0 = "model.layers.0.self_attn.k_proj"
KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}


def _kv_scales(cfg, t):
    for i in range(cfg["num_hidden_layers"]):
        t[f"model.layers.{i}.self_attn.k_scale"] = torch.ones(1)
        t[f"model.layers.{i}.self_attn.v_scale"] = torch.ones(1)


def _ignore_k0(cfg, t):
    cfg["quantization_config"]["ignore"].append(K0)
    for key in [k for k in t if k.startswith(K0 + ".")]:
        del t[key]
    t |= linear(K0, None, 64, 128)


def _k0_in_its_own_group(cfg, t):
    quant = cfg["quantization_config"]
    quant["config_groups"]["group_1"] = group_config("w4a16", group=32, targets=(K0,))
    for key in [k for k in t if k.startswith(K0 + ".")]:
        del t[key]
    t |= linear(K0, "w4a16", 64, 128, group=32)


def _drop_layer(prefix):
    return lambda cfg, t: [t.pop(k) for k in [k for k in t if k.startswith(prefix + ".")]]


ARTIFACT_CASES = [
    ("quant-method", "fp8", _quant(quant_method="gptq")),
    ("sparsity", "fp8", _quant(sparsity_config={"format": "sparse-24-bitmask", "targets": ["Linear"]})),
    ("actorder", "w4a16", _weights(actorder="group")),
    (
        "scheme",
        "w4a16",
        _both(
            _quant(format="int-quantized"),
            lambda cfg, t: cfg["quantization_config"]["config_groups"]["group_0"].update(
                format="int-quantized"
            ),
        ),
    ),
    ("kv-cache-scheme", "fp8", _both(_quant(kv_cache_scheme={**KV_SCHEME, "type": "int"}), _kv_scales)),
    ("kv-scales", "fp8", _quant(kv_cache_scheme=KV_SCHEME)),
    ("fused-shards-ignore", "fp8", _ignore_k0),
    ("fused-shards-scheme", "w4a16", _k0_in_its_own_group),
    ("layers-complete", "fp8", _drop_layer("model.layers.1.mlp.up_proj")),
    ("tensors-present", "fp8", _drop(f"{Q0}.weight_scale")),
    ("tensors-unexpected", "w4a16", _set(f"{Q0}.weight_g_idx", torch.zeros(128, dtype=torch.int32))),
    ("tensor-dtype", "nvfp4", _set(f"{Q0}.weight_scale", torch.zeros(128, 8, dtype=torch.bfloat16))),
    ("tensor-shape", "w4a16", _set(f"{Q0}.weight_scale", torch.zeros(128, 4, dtype=torch.bfloat16))),
    ("nvfp4-global-scales", "nvfp4", _set(f"{K0}.weight_global_scale", torch.full((1,), 2.0))),
]


@pytest.mark.parametrize(("rule", "kind", "edit"), ARTIFACT_CASES, ids=[c[0] for c in ARTIFACT_CASES])
def test_an_artifact_breaking_one_rule_is_refused_by_that_rule_alone(rule, kind, edit, build, catalog):
    table = check_artifact(build(kind, edit=edit), target_with(catalog, TARGET_OF[kind], tp=(1,)))
    assert table.loadable_tp == []
    assert rules_refusing(table) == {rule}
    refusal = table.refused[0].refusals[0]
    assert refusal.source.startswith("vllm 0.") and refusal.layer and refusal.reason


def test_kv_scales_present_load(build, catalog):
    path = build("fp8", edit=_both(_quant(kv_cache_scheme=KV_SCHEME), _kv_scales))
    table = check_artifact(path, target_with(catalog, "hopper-fp8"))
    assert table.loadable_tp == [1] and table.kv_cache.startswith("fp8 e4m3 (tensor scales")


DEPLOYMENT_CASES = [
    # (rule, kind, dims, TP sizes that load, the TP size refused)
    ("attention-heads", "fp8", {}, [1, 2, 4], 8),
    ("kv-heads", "fp8", {"hidden": 192, "heads": 6, "kv_heads": 3, "inter": 192}, [1, 3], 2),
    ("row-parallel-split", "fp8", {"hidden": 192, "heads": 6, "kv_heads": 6, "inter": 256}, [1, 2], 3),
    ("column-parallel-split", "fp8", {"hidden": 192, "heads": 6, "kv_heads": 6, "inter": 256}, [1, 2], 3),
    ("moe-intermediate-split", "fp8", {"heads": 4, "kv_heads": 4, "experts": 2, "moe_inter": 66}, [1, 2], 4),
    ("group-divides-partition", "w4a16", {}, [1, 2], 4),
    ("group-divides-partition", "nvfp4", {"inter": 96}, [1, 2], 4),
]


@pytest.mark.parametrize(
    ("rule", "kind", "dims", "loads", "refused"),
    DEPLOYMENT_CASES,
    ids=[f"{c[0]}-{c[1]}" for c in DEPLOYMENT_CASES],
)
def test_a_tp_size_breaking_a_rule_is_refused_and_the_others_load(
    rule, kind, dims, loads, refused, build, catalog
):
    table = check_artifact(build(kind, **dims), target_with(catalog, TARGET_OF[kind], tp=(*loads, refused)))
    assert table.loadable_tp == loads
    assert table.refused_tp == [refused]
    assert rule in rules_refusing(table, refused)


def test_kv_heads_fewer_than_tp_are_replicated(build, catalog):
    # 4 heads, 2 KV heads at TP 4: each KV head is replicated on 2 ranks, as vLLM does
    table = check_artifact(build("fp8"), target_with(catalog, "hopper-fp8", tp=(4,)))
    assert table.loadable_tp == [4]


def test_moe_w4a16_group_must_divide_the_expert_intermediate_size_per_shard(build, catalog):
    path = build("w4a16", heads=4, kv_heads=4, experts=2, moe_inter=128)
    table = check_artifact(path, target_with(catalog, "draft-int4", tp=(1, 2, 4)))
    assert table.loadable_tp == [1, 2]  # 128 / 4 = 32 per shard: a group of 64 would straddle shards
    assert "group-divides-partition" in rules_refusing(table, 4)
    assert table.first_refusal(4)[1].layer == "model.layers.0.mlp.experts"


def test_no_w4a16_kernel_for_8_bit_groups_of_256(build, catalog):
    # Machete and Marlin take groups of -1/32/64/128 only, Triton W4A16 4-bit only, Exllama fp16 only
    path = build("w4a16", bits=8, group=256, hidden=256, inter=512)
    table = check_artifact(path, target_with(catalog, "draft-int4", tp=(1,)))
    assert rules_refusing(table) == {"wna16-kernel"}
    assert "no W4A16 kernel on nvidia-hopper" in table.refused[0].refusals[0].reason


def test_marlin_pads_from_0_24_0_and_0_23_0_refuses_the_shape(build, catalog):
    # 8-bit (Triton W4A16 cannot take it), K = 576: Machete needs N % 128, Marlin in 0.23.0 K % 128
    path = build("w4a16", bits=8, group=64, hidden=576, heads=9, kv_heads=3, inter=1536, layers=1)
    old = check_artifact(
        path, target_with(catalog, "draft-int4", tp=(1,), min_version="0.23.0", hardware="nvidia-hopper")
    )
    assert old.versions == ["0.23.0", "0.24.0", "0.33.0"]
    assert [(d.version, d.tp) for d in old.refused] == [("0.23.0", 1)]
    assert {r.rule for r in old.refused[0].refusals} == {"wna16-kernel"}
    assert "Marlin needs input features per shard % 128" in old.refused[0].refusals[0].reason
    new = check_artifact(
        path, target_with(catalog, "draft-int4", tp=(1,), min_version="0.24.0", hardware="nvidia-hopper")
    )
    assert new.versions == ["0.24.0", "0.33.0"] and new.loadable_tp == [1]


# ---------------------------------------------------------------------------- multi-head latent attention

A0 = "model.layers.0.self_attn"
MLA = {"mla": {}}  # build(kind, **MLA): the DeepSeek-V3-shaped artifact (serving_artifacts.MLA_DIMS)


@pytest.mark.parametrize(("kind", "tp"), [("fp8", (1, 2, 4)), ("nvfp4", (1, 2, 4)), ("w4a16", (1,))])
def test_intact_latent_attention_artifacts_load(kind, tp, build, catalog):
    """DeepSeek-V3's attention (q_a/q_b, kv_a_proj_with_mqa fused with q_a, kv_b, o) loads at every TP
    its 4 heads split over; the one latent KV head is replicated, never split. (W4A16 groups of 64
    would straddle o_proj's 64 inputs split over 2 ranks.)"""
    table = check_artifact(build(kind, **MLA), target_with(catalog, TARGET_OF[kind], tp=tp))
    assert table.loadable_tp == list(tp) and table.refused == []


def test_latent_attention_without_query_compression_loads(build, catalog):
    # q_lora_rank null (DeepSeek-V2-Lite): one q_proj, kv_a_proj_with_mqa unfused
    table = check_artifact(
        build("fp8", mla={"q_lora_rank": None}), target_with(catalog, "hopper-fp8", tp=(1, 2))
    )
    assert table.loadable_tp == [1, 2]


def _mla_cfg(**changes):
    return lambda cfg, t: cfg.update(changes)


def _mla_cfg_drop(key):
    return lambda cfg, t: cfg.pop(key)


def _mla_kv_b_quantized(global_scale: float):
    def edit(cfg, t):
        ignore = cfg["quantization_config"]["ignore"]  # layer 1's kv_b_proj quantized, layer 0's not
        ignore[ignore.index(r"re:.*\.kv_b_proj$")] = f"{A0}.kv_b_proj"
        for key in [k for k in t if k.startswith("model.layers.1.self_attn.kv_b_proj.")]:
            del t[key]
        t |= linear("model.layers.1.self_attn.kv_b_proj", "nvfp4", 128, 64, global_scale=global_scale)

    return edit


def _ignore_one_a_shard(cfg, t):
    name = f"{A0}.kv_a_proj_with_mqa"
    cfg["quantization_config"]["ignore"].append(name)
    for key in [k for k in t if k.startswith(name + ".")]:
        del t[key]
    t |= linear(name, None, 80, 128)


def _latent_kv_scales(values: int):
    def edit(cfg, t):
        cfg["quantization_config"]["kv_cache_scheme"] = {**KV_SCHEME, "strategy": "attn_head"}
        for i in range(cfg["num_hidden_layers"]):
            t[f"model.layers.{i}.self_attn.k_scale"] = torch.ones(values)
            t[f"model.layers.{i}.self_attn.v_scale"] = torch.ones(values)

    return edit


MLA_CASES = [
    ("layers-complete", "fp8", _drop_layer("model.layers.1.self_attn.kv_b_proj")),
    ("layers-complete", "fp8", _drop(f"{A0}.kv_a_layernorm.weight")),
    ("layers-complete", "fp8", _mla_cfg(q_lora_rank=None)),  # vLLM would build a q_proj nothing loads
    ("tensor-shape", "fp8", _mla_cfg(kv_lora_rank=32)),  # kv_a_proj_with_mqa and kv_b_proj hold 64
    ("tensor-shape", "w4a16", _mla_cfg(v_head_dim=32)),  # kv_b_proj and o_proj
    ("mla-config", "fp8", _mla_cfg_drop("v_head_dim")),
    ("mla-config", "nvfp4", _mla_cfg(kv_lora_rank="64")),
    ("fused-shards-ignore", "fp8", _ignore_one_a_shard),  # q_a_proj + kv_a_proj_with_mqa: fused_qkv_a_proj
    (
        "nvfp4-global-scales",
        "nvfp4",
        _set(f"{A0}.kv_a_proj_with_mqa.weight_global_scale", torch.full((1,), 2.0)),
    ),
    ("mla-kv-b-dequant", "nvfp4", _mla_kv_b_quantized(1.0)),
    ("kv-scales", "fp8", _latent_kv_scales(4)),  # one latent per token: one scale, not one per head
]


@pytest.mark.parametrize(
    ("rule", "kind", "edit"), MLA_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(MLA_CASES)]
)
def test_latent_attention_breaking_one_rule_is_refused_by_that_rule_alone(rule, kind, edit, build, catalog):
    table = check_artifact(build(kind, edit=edit, **MLA), target_with(catalog, TARGET_OF[kind], tp=(1,)))
    assert table.loadable_tp == []
    assert rules_refusing(table) == {rule}
    refusal = table.refused[0].refusals[0]
    assert refusal.source.startswith("vllm 0.") and refusal.layer and refusal.reason


def test_latent_kv_scales_are_one_head(build, catalog):
    """vLLM's MLAAttention has num_kv_heads = 1: an attn_head KV scheme loads one k_scale per layer."""
    table = check_artifact(
        build("fp8", edit=_latent_kv_scales(1), **MLA), target_with(catalog, "hopper-fp8", tp=(1, 8))
    )
    assert table.loadable_tp == [1] and table.refused_tp == [8]
    assert rules_refusing(table, 8) == {"attention-heads"}  # 4 heads at TP 8; the latent is replicated


def test_kv_b_dequant_names_the_factor_and_passes_an_exact_scale(build, catalog):
    """G = 384: the block scale of a lone 1.0 is e4m3(384 / 6) = 64 exactly and 1.0 comes back 1.0;
    G = 1: e4m3(1 / 6) = 0.171875, 1.0 comes back 6 x 0.171875 = 1.03125."""
    exact = check_artifact(
        build("nvfp4", edit=_mla_kv_b_quantized(384.0), **MLA), target_with(catalog, "blackwell-nvfp4")
    )
    assert exact.loadable_tp == [1]
    off = check_artifact(
        build("nvfp4", edit=_mla_kv_b_quantized(1.0), **MLA), target_with(catalog, "blackwell-nvfp4")
    )
    (refusal,) = off.refused[0].refusals
    assert refusal.layer == "model.layers.1.self_attn.kv_b_proj" and "1.0 as 1.03125" in refusal.reason


def test_every_rule_is_tested_and_cites_a_vllm_release():
    tested = {c[0] for c in ARTIFACT_CASES + MLA_CASES} | {c[0] for c in DEPLOYMENT_CASES} | {"wna16-kernel"}
    assert {r.name for r in RULES} == tested
    assert all(r.source.startswith("vllm 0.") and ".py:" in r.source for r in RULES)
