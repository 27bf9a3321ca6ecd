"""Parameters counted from a config alone, for classifying a model whose weights are not at hand.

Intake counts parameters from the safetensors headers (``intake.weights.count_params``): the
shapes of what is stored. Before the weights are downloaded (planning a 671B DeepSeek-V3 or a
235B Qwen3-MoE: which model class, which targets, how much disk) only config.json is there,
so the same count comes from the architecture itself: transformers builds the model on the
meta device (shapes, no memory, no initialization) and what a checkpoint stores is summed:
parameters, each shared tensor once (a tied embedding is stored once), and persistent buffers. Arithmetic per family would have to
follow every family's layout (fused experts, MLA projections, dense first layers); the meta
model is transformers' own layout, the one intake's shape check compares a checkpoint with.

Not counted: what transformers does not build (DeepSeek-V3's multi-token-prediction layer,
about 14B of its 685B on disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantgate.runtime.errors import CheckpointConfigError


@dataclass(frozen=True)
class ConfigSize:
    """What a config.json implies: parameters, whether it is a mixture of experts, context length."""

    params: int
    moe: bool
    num_experts: int | None
    context: int | None


def count_params(config) -> int:
    """Tensor elements a checkpoint of ``config`` stores, counted on the meta device: every parameter
    (a tied one once) and every persistent buffer (DeepSeek's router score correction bias)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
    buffers = sum(
        b.numel()
        for module in model.modules()
        for name, b in module.named_buffers(recurse=False)
        if b is not None and name not in module._non_persistent_buffers_set
    )
    return params + buffers


def size_from_config(path: Path) -> ConfigSize:
    """Read ``config.json`` (a file or the directory holding it) and size the model it describes."""
    from quantgate.intake import architecture

    path = Path(path)
    root = path if path.is_dir() else path.parent
    file = root / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise CheckpointConfigError(file, "no config.json", "point at a model's config.json or its directory")
    raw = architecture.read_json(file, file.name)
    config = architecture.load_config(root, raw)
    try:
        params = count_params(config)
    except Exception as exc:  # noqa: BLE001 - the config's problem, whatever transformers raised
        raise CheckpointConfigError(
            file,
            f"transformers cannot build a causal LM from this config ({type(exc).__name__}: {exc})",
            "check the config against the model family's documented fields",
        ) from None
    experts = architecture.num_experts(config)
    context = getattr(architecture.text_config(config), "max_position_embeddings", None)
    return ConfigSize(
        params=params,
        moe=experts is not None,
        num_experts=experts,
        context=context if isinstance(context, int) and not isinstance(context, bool) else None,
    )
