"""Every tensor the architecture declares is in the checkpoint, and nothing it does not declare.

transformers loads a checkpoint that lacks a weight with a warning and a randomly initialised
tensor in its place, and drops a tensor it does not expect; either way the quantized artifact
and its evaluation describe a model nobody trained. So intake compares names the way
transformers' loader does: each name on disk goes through the model's own conversion mapping
(renamings such as Mixtral's ``block_sparse_moe`` -> ``mlp``, and converters that fuse the
per-expert tensors a checkpoint stores into one tensor in memory), and the result is compared
with the state dict of the meta-device skeleton that the shape check builds.

What is required: every parameter and every persistent buffer (DeepSeek-V3's router
``e_score_correction_bias`` is one, and it is trained state). Non-persistent buffers (rotary
``inv_freq``) are not in the state dict and not required; stale copies of them in old
checkpoints are accepted, as transformers ignores them. Tied weights (``tie_word_embeddings``)
need one member of each tied group on disk. A fused tensor needs every per-expert tensor that
feeds it: the expert count is checked per layer, and every expert must store the same tensors.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantgate.intake.safetensors_header import TensorInfo
from quantgate.runtime.errors import IncompleteCheckpointError

SHOWN = 3  # names listed per kind of problem; the count says how many there are
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")
# what transformers' loader drops without a word when the model has these buffers
# (modeling_utils.PreTrainedModel._adjust_missing_and_unexpected_keys)
_STALE_BUFFERS = {"rotary_emb.inv_freq": r"rotary_emb\.inv_freq", "position_ids": r"(^|\.)position_ids$"}

Tensors = dict[str, tuple[str, TensorInfo]]
Loaded = tuple[str, str | None]  # (name in memory, the converter pattern that matched, if any)


def loader_names(model: Any) -> Callable[[str], Loaded]:
    """Name on disk -> (name in ``model``'s state dict, converter pattern or None), as
    ``transformers.core_model_loading.convert_and_load_state_dict_in_model`` renames it."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    state = model.state_dict()
    prefix = model.base_model_prefix

    def rename(name: str) -> Loaded:
        memory, pattern = rename_source_key(name, renamings, converters, prefix, state)
        if memory not in state and name in state:  # the loader's own fallback: the name as stored
            memory, pattern = rename_source_key(name, [], [], prefix, state)
        return memory, pattern

    return rename


def memory_names(model: Any, tensors: Tensors) -> dict[str, Loaded]:
    """Every tensor on disk mapped to its name in memory, renamed in the loader's order."""
    try:
        from transformers.core_model_loading import dot_natural_key
    except ImportError:  # pragma: no cover  (older transformers: plain order)
        order = sorted(tensors)
    else:
        order = sorted(tensors, key=dot_natural_key)
    rename = loader_names(model)
    return {name: rename(name) for name in order}


def check_complete(root: Path, model: Any, tensors: Tensors, loaded: dict[str, Loaded]) -> None:
    """Refuse a checkpoint that lacks a tensor ``model`` declares or holds one it does not.

    ``loaded`` is ``memory_names(model, tensors)``. One IncompleteCheckpointError names the first
    few missing and unexpected tensors, how many there are, and the fix.
    """
    state = model.state_dict()
    covered: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    unexpected = []
    ignore_extra = _ignored(model, "_keys_to_ignore_on_load_unexpected", stale=True)
    for name, (memory, pattern) in loaded.items():
        if memory in state:
            covered[memory].append((name, pattern))
        elif not ignore_extra(name) and not ignore_extra(memory):
            unexpected.append(name)

    ignore_missing = _ignored(model, "_keys_to_ignore_on_load_missing")
    absent = {n for n in state if n not in covered and not ignore_missing(n)}
    for group in _tied_groups(model):
        if group - absent:  # one member on disk: transformers ties the rest to it
            absent -= group
    missing = sorted(absent) + _partial_converters(model, covered) + _uneven_experts(tensors)

    if missing or unexpected:
        arch = type(model).__name__
        parts = []
        if missing:
            parts.append(f"lacks {_count(missing)} that {arch} declares: {_names(missing)}")
        if unexpected:
            parts.append(
                f"holds {_count(unexpected)} that {arch} does not declare: {_names(sorted(unexpected))}"
            )
        raise IncompleteCheckpointError(
            _where(root, tensors),
            "the checkpoint " + " and ".join(parts),
            "re-export the checkpoint with save_pretrained from the model it was trained as "
            "(config.json's num_hidden_layers, tie_word_embeddings and expert counts must match the weights)"
            if missing
            else "remove the extra tensors, or use the config.json the weights were saved with",
        )


def _where(root: Path, tensors: Tensors) -> Path:
    files = sorted({rel for rel, _ in tensors.values()})
    return root / files[0] if len(files) == 1 else root


def _count(names: list[str]) -> str:
    return f"{len(names)} tensor" + ("s" if len(names) != 1 else "")


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" (and {len(names) - SHOWN} more)" if len(names) > SHOWN else "")


def _ignored(model: Any, attribute: str, stale: bool = False) -> Callable[[str], bool]:
    """Whether transformers' loader ignores a name: the class's own patterns, plus the stale
    copies of non-persistent buffers it drops when the model has such buffers."""
    patterns = set(getattr(model, attribute, None) or ())
    if stale:
        buffers = [n for n, _ in model.named_buffers()]
        patterns |= {rx for suffix, rx in _STALE_BUFFERS.items() if any(b.endswith(suffix) for b in buffers)}
    if not patterns:
        return lambda name: False
    regex = re.compile("|".join(f"({p})" for p in patterns))
    return lambda name: regex.search(name) is not None


def _tied_groups(model: Any) -> list[set[str]]:
    """Names tied to one tensor, grouped (``all_tied_weights_keys`` maps target -> source)."""
    groups: dict[str, set[str]] = defaultdict(set)
    for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
        groups[source] |= {source, target}
    return list(groups.values())


def _partial_converters(model: Any, covered: dict[str, list[tuple[str, str | None]]]) -> list[str]:
    """Fused tensors some of whose inputs are absent altogether (say, every expert's ``w3``)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter

    sources = {
        p: tuple(t.source_patterns)
        for t in get_model_conversion_mapping(model)
        if isinstance(t, WeightConverter)
        for p in t.source_patterns
    }
    missing = []
    for memory, found in sorted(covered.items()):
        matched = {pattern for _, pattern in found if pattern is not None}
        if matched:
            for pattern in sources.get(next(iter(matched)), ()):
                if pattern not in matched:
                    missing.append(f"{memory} (no tensor on disk matches '{pattern}')")
    return missing


def _uneven_experts(tensors: Tensors) -> list[str]:
    """Per-expert tensors that one expert lacks while its siblings in the same layer have them."""
    layers: dict[str, dict[int, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name in tensors:
        match = _EXPERT.match(name)
        if match:
            layers[match.group(1)][int(match.group(2))].add(match.group(3))
    missing: list[str] = []
    for prefix, experts in sorted(layers.items()):
        every = set().union(*experts.values())
        for index in sorted(experts):
            missing.extend(f"{prefix}.{index}.{rest}" for rest in sorted(every - experts[index]))
    return missing
