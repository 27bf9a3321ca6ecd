"""What the checkpoint claims to be (config.json), and whether its tensors agree.

The config decides everything downstream: which recipe layers are quantized, which model
class applies, what serving engines will allocate. A config that disagrees with the weights
(say, an intermediate size edited by hand, or a vocabulary resized without resizing the
embedding) fails late and confusingly inside a quantization engine, so intake builds the
model's skeleton on the meta device (no memory, no weights) and compares shapes up front.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from quantgate.intake import bounded_json
from quantgate.intake.completeness import Loaded
from quantgate.intake.safetensors_header import TensorInfo
from quantgate.runtime.errors import CheckpointConfigError, RemoteCodeError, ShapeMismatchError

MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.")


def read_json(path: Path, rel: str) -> dict[str, Any]:
    """A JSON object from ``path``, read within ``bounded_json``'s limits; CheckpointConfigError
    naming the file otherwise."""
    fix = f"repair or re-export {rel}"
    limit = bounded_json.CONFIG_BYTES if rel == "config.json" else bounded_json.SIDE_CONFIG_BYTES
    try:
        value = bounded_json.parse(bounded_json.read_bytes(path, limit).decode("utf-8"))
    except bounded_json.JsonRefused as exc:
        raise CheckpointConfigError(path, f"{rel} {exc.problem}", fix) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointConfigError(path, f"{rel} is not valid JSON ({exc})", fix) from None
    if not isinstance(value, dict):
        raise CheckpointConfigError(path, f"{rel} is not a JSON object", fix)
    return value


def refuse_auto_map(root: Path, files: list[str]) -> None:
    """``auto_map`` anywhere in a top-level *config.json means the model needs remote code.

    Nested ones count too: transformers builds ``text_config`` (and every other sub-config) with
    the same machinery as the top level, so an ``auto_map`` there asks for remote code as well.
    """
    for rel in files:
        if "/" in rel or not rel.endswith("config.json"):
            continue
        where = _auto_map_at(read_json(root / rel, rel))
        if where is not None:
            place = "" if not where else f" in {'.'.join(where)}"
            raise RemoteCodeError(
                root / rel,
                f"'auto_map'{place} points transformers at remote code, which quantgate refuses",
                f"use an architecture transformers supports natively and remove 'auto_map'{place}",
            )


def _auto_map_at(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The key path of the first object holding ``auto_map`` (``()`` for the top level), else None.

    Recursion is bounded: ``read_json`` refused anything nested deeper than ``bounded_json.MAX_DEPTH``.
    """
    if isinstance(value, dict):
        if "auto_map" in value:
            return path
        children = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        children = [(f"[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for key, child in children:
        found = _auto_map_at(child, (*path, key))
        if found is not None:
            return found
    return None


def load_config(root: Path, raw: dict[str, Any]):
    """Validate the raw config.json and build a transformers config from it (no remote code)."""
    path = root / "config.json"
    model_type = raw.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CheckpointConfigError(
            path, "config.json has no 'model_type'", 'add the model_type, e.g. "llama"'
        )
    arch = raw.get("architectures")
    if not (isinstance(arch, list) and arch and all(isinstance(a, str) and a for a in arch)):
        raise CheckpointConfigError(
            path,
            "config.json has no 'architectures' list",
            'add it, e.g. "architectures": ["LlamaForCausalLM"]',
        )
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(**raw)
    except Exception as exc:  # noqa: BLE001  a config class's own checks (say, x % 0) are the config's fault
        raise CheckpointConfigError(
            path,
            f"transformers cannot build a config for model_type '{model_type}' ({type(exc).__name__}: {exc})",
            "fix the field it names, or use a model_type that this transformers version supports",
        ) from None


def text_config(config):
    """The language model's config: the text part of a multimodal config, else the config itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def num_experts(config) -> int | None:
    """Routed experts per MoE layer when the config declares more than one, else None."""
    for cfg in (text_config(config), config):
        for key in MOE_KEYS:
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return value
    return None


def skeleton(root: Path, config):
    """The causal LM ``config`` describes, built on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001  any failure here is the config's: report it as such
        raise CheckpointConfigError(
            root / "config.json",
            f"transformers cannot build a causal LM from this config ({exc})",
            "check the config against the model family's documented fields",
        ) from None


def check_shapes(
    root: Path, config, model, tensors: dict[str, tuple[str, TensorInfo]], loaded: dict[str, Loaded]
) -> None:
    """Compare checkpoint tensor shapes with ``model``, the meta-device skeleton of ``config``.

    Each name on disk is compared with the tensor transformers' loader would load it into
    (``loaded``: ``completeness.memory_names``); per-expert tensors that the loader fuses into
    one are counted by ``check_expert_count`` instead. The embedding is also checked explicitly
    against vocab_size x hidden_size, because its name is the one most likely to differ between
    model families.
    """
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}

    fix = "re-export config.json together with the weights, or fix the size fields it declares"
    embedding = model.get_input_embeddings()
    embed_name = next(
        (n for n, p in model.named_parameters() if p is getattr(embedding, "weight", None)), None
    )
    if embed_name is not None:
        _check_embedding(root, config, tensors, embed_name, fix)

    for name, (rel, info) in tensors.items():
        memory, fused = loaded.get(name, (name, None))
        want = expected.get(memory) if fused is None else None
        if want is not None and want != info.shape:
            raise ShapeMismatchError(
                root / rel,
                f"tensor '{name}' has shape {list(info.shape)} but config.json implies {list(want)}",
                fix,
            )


def check_expert_count(root: Path, tensors: dict[str, tuple[str, TensorInfo]], experts: int | None) -> None:
    """Experts stored one per tensor (``...experts.N...``) must number what the config declares.

    Name-by-name comparison cannot see these: transformers fuses them in memory, so an
    expert count edited in config.json would otherwise pass unnoticed.
    """
    found: dict[str, tuple[str, set[int]]] = {}
    for name, (rel, _) in tensors.items():
        match = _EXPERT.match(name)
        if match:
            found.setdefault(match.group(1), (rel, set()))[1].add(int(match.group(2)))
    for prefix, (rel, indices) in sorted(found.items()):
        if indices != set(range(experts or 0)):
            declared = f"{experts} experts" if experts else "no experts (a dense model)"
            raise ShapeMismatchError(
                root / rel,
                f"'{prefix}' stores {len(indices)} experts (indices {min(indices)}..{max(indices)}) "
                f"but config.json declares {declared}",
                "re-export config.json together with the weights, or fix its expert count",
            )


def _check_embedding(
    root: Path, config, tensors: dict[str, tuple[str, TensorInfo]], embed_name: str, fix: str
) -> None:
    found = (
        embed_name
        if embed_name in tensors
        else next((n for n in tensors if n.endswith(_suffix(embed_name))), None)
    )
    if found is None:
        raise ShapeMismatchError(root, f"no embedding tensor '{embed_name}' in the checkpoint", fix)
    text = text_config(config)
    want = (getattr(text, "vocab_size", None), getattr(text, "hidden_size", None))
    rel, info = tensors[found]
    if None not in want and info.shape != want:
        raise ShapeMismatchError(
            root / rel,
            f"embedding tensor '{found}' has shape {list(info.shape)} but config.json declares "
            f"vocab_size x hidden_size = {list(want)}",
            fix,
        )


def _suffix(name: str) -> str:
    """``model.embed_tokens.weight`` -> ``.embed_tokens.weight``: the part families agree on."""
    return "." + ".".join(name.split(".")[-2:])
