"""Intake refuses a checkpoint that lacks a tensor its architecture declares or holds one it does not.

Names are compared as transformers' loader compares them (its renamings and expert fusion), so
the tiny Mixtral, Qwen2-MoE and DeepSeek-V3 checkpoints pass as saved, and each damage below is
named in the one-line message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantgate.intake import intake
from quantgate.runtime.errors import IncompleteCheckpointError
from support.cli import quantgate
from support.models import write_tiny_model, write_tiny_tokenizer

pytestmark = pytest.mark.unit


def _edit_weights(checkpoint: Path, drop=(), add=None) -> None:
    path = checkpoint / "model.safetensors"
    tensors = {k: v for k, v in load_file(path).items() if not any(d in k for d in drop)}
    tensors.update(add or {})
    save_file(tensors, path, metadata={"format": "pt"})


def test_a_missing_tensor_is_named(tiny_llama, refuse):
    _edit_weights(tiny_llama, drop=["model.layers.1.mlp.down_proj.weight"])
    err = refuse(
        tiny_llama,
        IncompleteCheckpointError,
        "model.safetensors",
        "lacks 1 tensor that LlamaForCausalLM declares: model.layers.1.mlp.down_proj.weight",
        "save_pretrained",
    )
    assert "\n" not in str(err)


def test_many_missing_tensors_show_the_first_few_and_the_count(tiny_llama, refuse):
    """A config that declares a layer the weights do not have: 9 tensors of layer 2 missing."""
    config = json.loads((tiny_llama / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tiny_llama / "config.json").write_text(json.dumps(config))
    err = refuse(tiny_llama, IncompleteCheckpointError, "lacks 9 tensors", "model.layers.2.", "(and 6 more)")
    assert "num_hidden_layers" in err.fix


def test_an_extra_tensor_is_named(tiny_llama, refuse):
    _edit_weights(tiny_llama, add={"model.layers.2.mlp.down_proj.weight": torch.zeros(64, 128)})
    refuse(
        tiny_llama,
        IncompleteCheckpointError,
        "holds 1 tensor that LlamaForCausalLM does not declare: model.layers.2.mlp.down_proj.weight",
        "remove the extra tensors",
    )


def test_missing_and_extra_are_reported_together(tiny_llama, refuse):
    _edit_weights(
        tiny_llama,
        drop=["model.norm.weight"],
        add={"model.final_norm.weight": torch.ones(64, dtype=torch.bfloat16)},
    )
    refuse(
        tiny_llama,
        IncompleteCheckpointError,
        "lacks 1 tensor",
        "model.norm.weight",
        "model.final_norm.weight",
    )


def test_tied_embeddings_need_no_lm_head(tmp_path, policy):
    source = write_tiny_model(tmp_path / "tied", "llama", tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(source / "model.safetensors")  # save_pretrained drops it
    assert intake(source, policy).tie_word_embeddings


def test_untied_embeddings_need_their_lm_head(tiny_llama, refuse):
    _edit_weights(tiny_llama, drop=["lm_head.weight"])
    refuse(tiny_llama, IncompleteCheckpointError, "lm_head.weight")


def test_stale_rotary_buffers_of_old_checkpoints_are_accepted(tiny_llama, policy):
    """transformers made ``inv_freq`` non-persistent and drops old copies on load: so does intake."""
    _edit_weights(tiny_llama, add={"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)})
    intake(tiny_llama, policy)


@pytest.mark.parametrize("fixture", ["tiny_mixtral", "tiny_qwen_moe"])
def test_moe_checkpoints_with_per_expert_tensors_pass(fixture, request, policy):
    """On disk one tensor per expert, in memory one fused tensor: the loader's converters map them."""
    assert intake(request.getfixturevalue(fixture), policy).moe


def test_one_experts_missing_tensor_is_named(tiny_mixtral, refuse):
    _edit_weights(tiny_mixtral, drop=["model.layers.1.block_sparse_moe.experts.2.w3.weight"])
    refuse(tiny_mixtral, IncompleteCheckpointError, "model.layers.1.block_sparse_moe.experts.2.w3.weight")


def test_a_projection_missing_from_every_expert_is_named(tiny_qwen_moe, refuse):
    _edit_weights(tiny_qwen_moe, drop=[f"model.layers.0.mlp.experts.{i}.up_proj.weight" for i in range(4)])
    refuse(tiny_qwen_moe, IncompleteCheckpointError, "model.layers.0.mlp.experts.gate_up_proj", "up_proj")


def _tiny_deepseek(directory: Path) -> Path:
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    config = DeepseekV3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False, moe_intermediate_size=64,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=64, qk_rope_head_dim=16, qk_nope_head_dim=16,
        v_head_dim=16,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(directory)
    write_tiny_tokenizer(directory)
    return directory


def test_a_persistent_buffer_is_required(tmp_path, policy, refuse):
    """DeepSeek-V3's router correction bias is a buffer, and trained state: a checkpoint needs it."""
    source = _tiny_deepseek(tmp_path / "deepseek")
    assert intake(source, policy).moe
    _edit_weights(source, drop=["model.layers.1.mlp.gate.e_score_correction_bias"])
    refuse(source, IncompleteCheckpointError, "model.layers.1.mlp.gate.e_score_correction_bias")


@pytest.mark.heavy
def test_cli_build_refuses_an_incomplete_checkpoint_in_one_line(tiny_llama, tmp_path):
    _edit_weights(tiny_llama, drop=["model.layers.1.self_attn.o_proj.weight"])
    out = tmp_path / "out"
    run = quantgate("build", "--checkpoint", str(tiny_llama), "--targets", "hopper-fp8", "--out", str(out))
    assert run.returncode == 2, run.stderr
    lines = [line for line in run.stderr.splitlines() if "model.layers.1.self_attn.o_proj.weight" in line]
    assert len(lines) == 1 and "Fix:" in lines[0] and "Traceback" not in run.stderr
    assert not out.exists()
