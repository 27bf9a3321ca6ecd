"""The embedded default model end to end: conversion fidelity, then all four target builds."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from quantgate.artifact import read_manifest, verify_files
from quantgate.embedded.smollm2 import gguf_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "The three primary colours are"
ALL_TARGETS = ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"]  # built by default_artifacts


def _chat(model_dir, question="What is the capital of France?", tokens=16) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def test_converted_checkpoint_reproduces_gguf_logits(default_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(default_model)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        reference = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
        )
        converted = AutoModelForCausalLM.from_pretrained(default_model, dtype=torch.bfloat16)
        expected, got = reference(ids).logits, converted(ids).logits
    assert torch.equal(expected, got)
    assert (
        tokenizer(PROMPT).input_ids
        == AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)(PROMPT).input_ids
    )


def test_default_model_answers_a_chat_prompt(default_model):
    answer = _chat(default_model)
    assert answer.strip(), "greedy chat answer is empty"
    assert "Paris" in answer


def _tensor(artifact, name):
    for shard in artifact.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            if name in f.keys():  # noqa: SIM118  safe_open has keys() but is neither iterable nor a container
                return f.get_tensor(name)
    raise KeyError(name)


def test_build_all_four_targets_from_the_cli(default_model, default_artifacts, run_cli):
    out, run = default_artifacts
    for target in ALL_TARGETS:
        manifest = read_manifest(out / target)
        assert manifest is not None and verify_files(out / target, manifest) == []
        assert manifest.target == target and target in run.stdout
        assert manifest.source.model_class == "draft"  # the 135M model is classified honestly

    w = "model.layers.3.mlp.down_proj"
    fp8 = _tensor(out / "hopper-fp8", f"{w}.weight")
    assert fp8.dtype == torch.float8_e4m3fn
    assert _tensor(out / "hopper-fp8", f"{w}.weight_scale").shape == (576, 1)  # per output channel

    assert _tensor(out / "blackwell-nvfp4", f"{w}.weight_packed").dtype == torch.uint8
    assert _tensor(out / "blackwell-nvfp4", f"{w}.weight_scale").dtype == torch.float8_e4m3fn
    assert _tensor(out / "blackwell-nvfp4", f"{w}.weight_scale").shape == (576, 1536 // 16)
    assert _tensor(out / "blackwell-nvfp4", f"{w}.weight_global_scale").numel() == 1
    assert _tensor(out / "blackwell-nvfp4", f"{w}.input_global_scale").numel() == 1

    group = json.loads((out / "draft-int4" / "config.json").read_text())["quantization_config"]
    group = group["config_groups"]["group_0"]["weights"]
    assert group["num_bits"] == 4 and 576 % group["group_size"] == 0 and 1536 % group["group_size"] == 0
    assert _tensor(out / "draft-int4", f"{w}.weight_packed").dtype == torch.int32
    assert _tensor(out / "draft-int4", f"{w}.weight_scale").shape == (576, 1536 // group["group_size"])

    for target in ("hopper-fp8", "blackwell-nvfp4", "draft-int4"):
        assert _chat(out / target, tokens=8).strip(), f"{target} generated no text"

    again = run_cli(
        "build", "--checkpoint", str(default_model), "--targets", ",".join(ALL_TARGETS), "--out", str(out)
    )
    assert again.returncode == 0
    assert again.stdout.count("reused") == len(ALL_TARGETS)
