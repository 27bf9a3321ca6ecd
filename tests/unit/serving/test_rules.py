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


def test_every_rule_is_tested_and_cites_a_vllm_release():
    tested = {c[0] for c in ARTIFACT_CASES} | {c[0] for c in DEPLOYMENT_CASES} | {"wna16-kernel"}
    assert {r.name for r in RULES} == tested
    assert all(r.source.startswith("vllm 0.") and ".py:" in r.source for r in RULES)
