"""Classifying a model from its config.json alone: parameters counted on the meta device.

The counts are checked against arithmetic written out here from each family's layout, and
against intake's count from safetensors shapes on real (tiny) checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantgate.intake import intake
from quantgate.runtime.errors import CheckpointConfigError
from support.model_size import size_from_config

pytestmark = pytest.mark.unit

# DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3, the fields that shape its tensors)
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "first_k_dense_replace": 3, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "max_position_embeddings": 163840, "tie_word_embeddings": False,
}  # fmt: skip
# Qwen3-235B-A22B
QWEN3_235B = {
    "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": 4096,
    "intermediate_size": 12288, "moe_intermediate_size": 1536, "num_hidden_layers": 94, "num_attention_heads": 64,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "max_position_embeddings": 40960, "tie_word_embeddings": False,
}  # fmt: skip
# Mixtral-8x7B: a mixture of experts, but below the large-moe threshold
MIXTRAL_8X7B = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768, "tie_word_embeddings": False,
}  # fmt: skip


def _deepseek_v3_arithmetic(c: dict) -> int:
    h, heads, layers, dense = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_hidden_layers"],
        c["first_k_dense_replace"],
    )
    qk_head = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    attention = (
        h * c["q_lora_rank"] + c["q_lora_rank"]  # q_a_proj, q_a_layernorm
        + c["q_lora_rank"] * heads * qk_head  # q_b_proj
        + h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]  # kv_a_proj_with_mqa, kv_a_layernorm
        + c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"])  # kv_b_proj
        + heads * c["v_head_dim"] * h  # o_proj
    )  # fmt: skip
    experts, moe_i = c["n_routed_experts"], c["moe_intermediate_size"]
    moe = (
        experts * 3 * h * moe_i + 3 * h * moe_i * c["n_shared_experts"] + experts * h + experts
    )  # router + bias
    per_layer = attention + 2 * h
    return (
        layers * per_layer + dense * 3 * h * c["intermediate_size"] + (layers - dense) * moe
        + 2 * c["vocab_size"] * h + h
    )  # fmt: skip


def _qwen3_moe_arithmetic(c: dict) -> int:
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    attention = h * q + 2 * h * kv + q * h + 2 * hd  # q, k, v, o, q_norm, k_norm
    moe = c["num_experts"] * (3 * h * c["moe_intermediate_size"] + h)  # experts and router rows
    return c["num_hidden_layers"] * (attention + moe + 2 * h) + 2 * c["vocab_size"] * h + h


def _mixtral_arithmetic(c: dict) -> int:
    h = c["hidden_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    attention = 2 * h * h + 2 * h * kv
    moe = c["num_local_experts"] * (3 * h * c["intermediate_size"] + h)
    return c["num_hidden_layers"] * (attention + moe + 2 * h) + 2 * c["vocab_size"] * h + h


def _config_only(tmp_path: Path, config: dict) -> Path:
    directory = tmp_path / config["model_type"]
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    "config, arithmetic, expected_class",
    [
        (DEEPSEEK_V3, _deepseek_v3_arithmetic, "large-moe"),
        (QWEN3_235B, _qwen3_moe_arithmetic, "large-moe"),
        (MIXTRAL_8X7B, _mixtral_arithmetic, "moe"),
    ],
    ids=["deepseek-v3", "qwen3-235b", "mixtral-8x7b"],
)
def test_a_config_without_weights_is_classified_by_its_parameter_count(
    tmp_path, policy, config, arithmetic, expected_class
):
    directory = _config_only(tmp_path, config)
    assert [p.name for p in directory.iterdir()] == ["config.json"]  # no weights anywhere
    size = size_from_config(directory)
    assert size.params == arithmetic(config)
    experts = next(config[k] for k in ("n_routed_experts", "num_experts", "num_local_experts") if k in config)
    assert size.moe and size.num_experts == experts
    assert size.context == config["max_position_embeddings"]
    assert policy.classify(moe=size.moe, params=size.params, context=size.context) == expected_class


def test_deepseek_v3_counts_its_published_671b_and_gets_the_large_moe_targets(tmp_path, policy):
    size = size_from_config(_config_only(tmp_path, DEEPSEEK_V3) / "config.json")
    assert (
        670e9 < size.params < 672e9
    )  # "671B total parameters" (without the 14B multi-token-prediction module)
    model_class = policy.classify(moe=size.moe, params=size.params, context=size.context)
    assert set(policy.model_classes[model_class].targets.required) == {
        "hopper-fp8",
        "rocm-cdna3-fp8",
        "blackwell-nvfp4",
    }


def test_the_meta_count_is_intakes_count_from_safetensors_shapes(
    tiny_llama, tiny_mixtral, tiny_qwen_moe, policy
):
    for checkpoint in (tiny_llama, tiny_mixtral, tiny_qwen_moe):
        record = intake(checkpoint, policy)
        size = size_from_config(checkpoint)
        assert (size.params, size.moe, size.num_experts) == (record.params, record.moe, record.num_experts)


def test_a_config_transformers_cannot_build_is_refused_naming_the_file(tmp_path):
    broken = _config_only(tmp_path, {**MIXTRAL_8X7B, "num_attention_heads": 0})
    with pytest.raises(CheckpointConfigError) as info:
        size_from_config(broken)
    assert str(broken / "config.json") in str(info.value)
    with pytest.raises(CheckpointConfigError, match="no config.json"):
        size_from_config(tmp_path / "nowhere")
