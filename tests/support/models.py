"""Synthetic checkpoints: tiny random models for tests, large multi-shard ones for benchmarks.

No model hub is reachable where quantgate is tested, so tests build their own checkpoints:
a tiny Llama or a tiny mixture-of-experts (Mixtral- or Qwen-MoE-shaped) saved by
transformers itself, with a small BPE tokenizer trained on the spot. Large checkpoints are
written tensor by tensor, shard by shard, so that making a checkpoint bigger than a memory cap
does not itself need that memory.

Test support, not product: benchmarks and tests import it as ``support.models``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from quantgate.runtime.units import MB

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Question: what is 12 plus 30? Answer: 42.",
    "<|im_start|>user\nHello, who are you?<|im_end|>\n<|im_start|>assistant\nI am a model.<|im_end|>",
    '{"tool": "get_weather", "arguments": {"city": "Paris"}}',
    "Quantization maps high precision weights to a small set of values.",
]
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_tokenizer(directory: Path, vocab_size: int = 512) -> None:
    """Train a byte-level BPE on a few lines and save it as a transformers tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = _CHAT_TEMPLATE
    fast.save_pretrained(directory)


def tiny_config(kind: str = "llama", **overrides: Any):
    """A transformers config for a tiny model of the given family.

    Sizes are multiples of 64 so that every grouped recipe (NVFP4's 16, INT4's 64) applies.
    """
    from transformers import LlamaConfig, MixtralConfig, Qwen2MoeConfig

    common: dict[str, Any] = {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    if kind == "llama":
        cfg = LlamaConfig(**{**common, **overrides})
    elif kind == "mixtral":
        cfg = MixtralConfig(**{**common, "num_local_experts": 4, "num_experts_per_tok": 2, **overrides})
    elif kind == "qwen2_moe":
        cfg = Qwen2MoeConfig(
            **{
                **common,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 64,
                "shared_expert_intermediate_size": 128,
                "decoder_sparse_step": 1,
                **overrides,
            }
        )
    else:
        raise ValueError(f"unknown tiny model kind {kind!r}: use llama, mixtral or qwen2_moe")
    return cfg


def write_tiny_model(directory: Path, kind: str = "llama", seed: int = 0, **overrides: Any) -> Path:
    """Save a tiny random model of ``kind`` with its tokenizer to ``directory`` (bf16)."""
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind, **overrides), dtype=torch.bfloat16)
    model.save_pretrained(directory)
    write_tiny_tokenizer(directory)
    return directory


def write_large_llama(
    directory: Path,
    *,
    hidden_size: int = 2048,
    intermediate_size: int = 5632,
    num_hidden_layers: int = 16,
    vocab_size: int = 32000,
    max_shard_bytes: int = 800 * MB,
    seed: int = 0,
) -> Path:
    """A multi-shard random bf16 Llama, written one tensor at a time.

    Peak memory is about one shard, whatever the checkpoint's total size.
    """
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    heads = max(1, hidden_size // 64)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        tie_word_embeddings=False,
        dtype="bfloat16",
        architectures=["LlamaForCausalLM"],
    )
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    generator = torch.Generator().manual_seed(seed)

    sizes = [0]
    plan: list[list[str]] = [[]]
    for name, shape in shapes.items():
        nbytes = 2 * int(torch.Size(shape).numel())
        if sizes[-1] and sizes[-1] + nbytes > max_shard_bytes:
            plan.append([])
            sizes.append(0)
        plan[-1].append(name)
        sizes[-1] += nbytes

    weight_map: dict[str, str] = {}
    total = 0
    for index, names in enumerate(plan, start=1):
        file = f"model-{index:05d}-of-{len(plan):05d}.safetensors"
        tensors = {}
        for name in names:
            shape = shapes[name]
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
            weight_map[name] = file
        save_file(tensors, directory / file, metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        del tensors
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    config.save_pretrained(directory)
    write_tiny_tokenizer(directory)
    return directory
