"""The embedded default model end to end: conversion fidelity, then all four target builds."""

from __future__ import annotations

import json
import stat

import pytest
import torch
import yaml
from safetensors import safe_open

from quantgate.contracts.artifact import SUPPORT_FILES, read_manifest, verify_files
from quantgate.embedded.smollm2 import default_checkpoint, gguf_path

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "The three primary colours are"
ALL_TARGETS = ["hopper-fp8", "rocm-cdna3-fp8", "blackwell-nvfp4", "draft-int4"]  # built by default_artifacts


def _generate(model_dir, question: str, tokens: int):
    """The tokenizer, model and greedily generated new token ids of a one-turn chat."""
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
    return tokenizer, model, out[0, inputs["input_ids"].shape[1] :]


def _chat(model_dir, question="What is the capital of France?", tokens=16) -> str:
    tokenizer, _, new = _generate(model_dir, question, tokens)
    return tokenizer.decode(new, skip_special_tokens=True)


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


def test_chat_generation_stops_at_im_end(default_model):
    """EOS is <|im_end|> in the tokenizer and the generation config alike (the GGUF's own metadata),
    so a server stopping on either ends the answer where the chat template ends a turn."""
    tokenizer, model, new = _generate(default_model, "What is the capital of France?", tokens=64)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|im_end|>"
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id == model.config.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert tokenizer.decode(new).endswith("<|im_end|>"), tokenizer.decode(new)
    assert int((new == tokenizer.eos_token_id).sum()) == 1  # generation stopped at the first one


def test_a_cache_converted_by_older_code_is_converted_again(default_model):
    """The cache key carries the conversion's version: a checkpoint converted before EOS/pad were
    fixed (v1) is never returned."""
    stale = default_model.with_name(default_model.name.rsplit("-v", 1)[0] + "-v1")
    made = not stale.exists()
    try:
        if made:
            stale.mkdir()
            (stale / "config.json").write_text("{}")
        assert default_checkpoint(default_model.parent.parent) == default_model != stale
    finally:
        if made:
            (stale / "config.json").unlink()
            stale.rmdir()
    config = json.loads((default_model / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0


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

    # non-weight files are the source's, config keeps rope_theta, modes 0644/0755, safe loaders
    support = {n: default_model / n for n in SUPPORT_FILES if (default_model / n).is_file()}
    assert {"tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= support.keys()
    for target in ALL_TARGETS:
        artifact = out / target
        assert read_manifest(artifact).source_files.keys() == support.keys()
        for name, path in support.items():
            assert (artifact / name).read_bytes() == path.read_bytes(), f"{target}/{name}"
        assert json.loads((artifact / "config.json").read_text())["rope_theta"] == 100000.0
        assert stat.S_IMODE(artifact.stat().st_mode) == 0o755
        for path in artifact.rglob("*"):
            assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix in (".yaml", ".yml"):
                yaml.safe_load(path.read_text())

    again = run_cli(
        "build", "--checkpoint", str(default_model), "--targets", ",".join(ALL_TARGETS), "--out", str(out)
    )
    assert again.returncode == 0
    assert again.stdout.count("reused") == len(ALL_TARGETS)
