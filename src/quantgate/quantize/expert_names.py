"""Expert tensors of an artifact under the source checkpoint's own names.

vLLM loads per-expert tensors by name: ``FusedMoE.make_expert_params_mapping``
(model_executor/layers/fused_moe/layer.py) matches ``experts.{e}.{ckpt_name}.`` in every key,
for the ``ckpt_gate_proj_name`` / ``ckpt_up_proj_name`` / ``ckpt_down_proj_name`` each model's
``get_expert_mapping`` passes (model_executor/models/mixtral.py: ``w1``, ``w3``, ``w2``; qwen2_moe,
qwen3_moe, deepseek_v2: ``gate_proj``, ``up_proj``, ``down_proj``). A key that matches no entry is
looked up as a plain parameter, which does not exist, and the load fails. Those names are the
ones the model's checkpoints use, so the source's names are the ones to serve.

llm-compressor's ``oneshot`` path does not keep them: ``linearize_moe`` splits transformers' fused
``gate_up_proj`` into ``gate_proj``/``up_proj`` Linears (``LinearExperts2D``: gate rows first) and
saves them under those names, so a Mixtral NVFP4 artifact stored ``experts.N.gate_proj`` where the
source (and our FP8 artifacts) have ``experts.N.w1``. Which source name is which half is learned,
not tabled here: transformers' checkpoint conversion for the source's ``model_type`` says which
on-disk per-expert names it concatenated into ``gate_up_proj`` (in order) and which became
``down_proj``; only names the source actually stores are used. The rename rewrites safetensors
headers (tensor bytes are copied untouched), the shard index, and module names in
``quantization_config`` (ignore lists, targets); the result is then checked against the source:
the same per-expert modules, with the same output sizes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantgate.intake import SafetensorsHeader, read_header
from quantgate.runtime.errors import BuildError

# a per-expert module: "<...>.experts.<index>.<projection>"
_EXPERT = re.compile(r"^(?P<experts>.+\.experts)\.(?P<index>\d+)\.(?P<proj>[A-Za-z0-9_]+)$")
# a per-expert source pattern of transformers' conversion table: "mlp.experts.*.w1.weight"
_PATTERN = re.compile(r"experts\.\*\.(?P<proj>[A-Za-z0-9_]+)\.weight$")
# llm-compressor's LinearExperts2D: the halves of a fused gate_up_proj, in row order
_HALVES = {"gate_up_proj": ("gate_proj", "up_proj")}
_INDEX = "model.safetensors.index.json"
_WEIGHTS = ("weight", "weight_packed")  # a module's stored weight: plain/FP8, or packed (NVFP4, INT4)


def restore(source: Path, out_dir: Path) -> dict[str, str]:
    """Rename ``out_dir``'s per-expert tensors to the source's projection names; returns the
    projection renames applied (``{}`` when the names already were the source's).

    BuildError when the artifact's experts still differ from the source's afterwards.
    """
    renames = {}
    if _expert_modules(_headers(out_dir)).keys() - _expert_modules(_headers(source)).keys():
        renames = {ours: theirs for ours, theirs in learned_names(source).items() if ours != theirs}
    if renames:
        rename(out_dir, renames)
    problems = mismatches(source, out_dir)
    if problems:
        raise BuildError(
            f"{out_dir}: expert tensors are not the source's ({'; '.join(problems[:3])}); vLLM's MoE loader "
            "matches the checkpoint's own per-expert names (experts.N.<name>.), so it could not load them"
        )
    return renames


def rename(out_dir: Path, renames: dict[str, str]) -> None:
    """Rename per-expert projections (``{old: new}``) in ``out_dir``'s shards, index and quantization
    config; the config first, since it refuses what it cannot rewrite before any shard changes."""
    renamer = _module_renamer(renames)
    _rename_config(out_dir, renamer)
    for shard in sorted(out_dir.glob("*.safetensors")):
        _rename_shard(shard, renamer)
    _rename_index(out_dir, renamer)


def learned_names(source: Path) -> dict[str, str]:
    """``{engine's projection name: the source's on-disk name}`` for the source's model type.

    From transformers' checkpoint conversion (``get_checkpoint_conversion_mapping``): a converter
    whose target is ``experts.gate_up_proj`` lists the on-disk gate and up names in concatenation
    order, one whose target is ``experts.down_proj`` the down name. Names the source does not
    store are left out, so a source already on the engine's names maps nothing.
    """
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    from transformers.core_model_loading import WeightConverter

    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    stored = {m.rsplit(".", 1)[1] for m in _expert_modules(_headers(source))}
    names: dict[str, str] = {}
    for transform in get_checkpoint_conversion_mapping(config.get("model_type")) or []:
        targets = transform.target_patterns if isinstance(transform, WeightConverter) else []
        found = [_PATTERN.search(p) for p in transform.source_patterns]
        if len(targets) != 1 or "experts." not in targets[0] or None in found:
            continue
        fused = targets[0].rsplit("experts.", 1)[1]
        ours = _HALVES.get(fused, (fused,))
        projections = [m["proj"] for m in found if m is not None]
        if len(ours) == len(projections):
            names.update({o: p for o, p in zip(ours, projections, strict=True) if p in stored})
    return names


def mismatches(source: Path, artifact: Path) -> list[str]:
    """Per-expert modules of the artifact that the source does not name so, or whose output size
    differs from the source's module of that name; ``[]`` when none, or when the source stores no
    per-expert tensors (nothing to compare with). Experts the artifact lacks are not this check's
    business: the serving check refuses an incomplete MoE layer, and a source may carry layers
    transformers does not load (DeepSeek-V3's multi-token-prediction layer)."""
    theirs = _expert_modules(_headers(source))
    if not theirs:
        return []
    ours = _expert_modules(_headers(artifact))
    problems = []
    if extra := sorted(ours.keys() - theirs.keys()):
        problems.append(f"{len(extra)} expert modules the source does not have, e.g. {extra[0]}")
    for module in sorted(theirs.keys() & ours.keys()):
        if ours[module] != theirs[module]:
            problems.append(f"{module} has {ours[module]} output rows, the source's {theirs[module]}")
            break
    return problems


def _headers(directory: Path) -> dict[str, SafetensorsHeader]:
    return {p.name: read_header(p) for p in sorted(directory.glob("*.safetensors"))}


def _expert_modules(headers: dict[str, SafetensorsHeader]) -> dict[str, int]:
    """``{per-expert module: output rows of its stored weight}`` over every shard."""
    modules: dict[str, int] = {}
    for header in headers.values():
        for key, info in header.tensors.items():
            module, _, param = key.rpartition(".")
            if param in _WEIGHTS and info.shape and _EXPERT.match(module):
                modules[module] = info.shape[0]
    return modules


def _module_renamer(renames: dict[str, str]) -> Callable[[str], str]:
    """A function from a module name to its name under the source's projection names."""

    def rename(module: str) -> str:
        match = _EXPERT.match(module)
        if match is None or match["proj"] not in renames:
            return module
        return f"{match['experts']}.{match['index']}.{renames[match['proj']]}"

    return rename


def _rename_key(key: str, rename: Callable[[str], str]) -> str:
    module, dot, param = key.rpartition(".")
    return rename(module) + dot + param if dot else key


def _rename_shard(shard: Path, rename: Callable[[str], str]) -> None:
    """Rewrite the header with renamed keys; the data section is copied byte for byte (offsets kept)."""
    header = read_header(shard)
    if all(_rename_key(k, rename) == k for k in header.tensors):
        return
    raw: dict[str, Any] = {"__metadata__": header.metadata} if header.metadata else {}
    for key, info in header.tensors.items():
        raw[_rename_key(key, rename)] = {
            "dtype": info.dtype,
            "shape": list(info.shape),
            "data_offsets": [info.begin, info.end],
        }
    encoded = json.dumps(raw, separators=(",", ":")).encode()
    encoded += b" " * (-(8 + len(encoded)) % 8)  # the data starts 8-byte aligned, as safetensors writes
    tmp = shard.with_name(f".{shard.name}.rename-tmp")
    try:
        with shard.open("rb") as src, tmp.open("wb") as dst:
            dst.write(struct.pack("<Q", len(encoded)) + encoded)
            src.seek(header.data_offset)
            shutil.copyfileobj(src, dst, 16 * 1024 * 1024)
        os.replace(tmp, shard)
    finally:
        tmp.unlink(missing_ok=True)


def _rename_index(out_dir: Path, rename: Callable[[str], str]) -> None:
    path = out_dir / _INDEX
    if not path.is_file():
        return
    index = json.loads(path.read_text(encoding="utf-8"))
    weight_map = {_rename_key(k, rename): v for k, v in index["weight_map"].items()}
    index["weight_map"] = dict(sorted(weight_map.items()))
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _rename_config(out_dir: Path, rename: Callable[[str], str]) -> None:
    """Module names in ``quantization_config``'s ``ignore`` and ``targets`` lists, wherever they are."""
    path = out_dir / "config.json"
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    before = sorted({k.rpartition(".")[0] for h in _headers(out_dir).values() for k in h.tensors})
    if _rewrite_lists(config.get("quantization_config"), before, rename):
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _rewrite_lists(node: Any, modules: list[str], rename: Callable[[str], str]) -> bool:
    changed = False
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("ignore", "targets") and isinstance(value, list):
                new = [_rewrite_entry(v, modules, rename) if isinstance(v, str) else v for v in value]
                changed |= new != value
                node[key] = new
            else:
                changed |= _rewrite_lists(value, modules, rename)
    elif isinstance(node, list):
        for item in node:
            changed |= _rewrite_lists(item, modules, rename)
    return changed


def _rewrite_entry(entry: str, modules: list[str], rename: Callable[[str], str]) -> str:
    """A module name renamed; a ``re:`` pattern (matched as compressed-tensors does, ``re.match``)
    with the projection names replaced, kept only if it then matches exactly the renamed modules
    it matched before (otherwise BuildError: a regex is not rewritten by guesswork)."""
    if not entry.startswith("re:"):
        return rename(entry)
    old = {rename(m) for m in modules if re.match(entry[3:], m)}
    projections = {m.rsplit(".", 1)[1]: rename(m).rsplit(".", 1)[1] for m in modules if rename(m) != m}
    if not projections:
        return entry
    word = "|".join(map(re.escape, sorted(projections, key=len, reverse=True)))
    candidate = re.sub(rf"(?<![A-Za-z0-9_])(?:{word})(?![A-Za-z0-9_])", lambda m: projections[m[0]], entry)
    if {m for m in map(rename, modules) if re.match(candidate[3:], m)} != old:
        raise BuildError(
            f"quantization_config entry {entry!r} matches expert modules renamed to the source's names "
            f"({', '.join(f'{a} -> {b}' for a, b in sorted(projections.items()))}) and cannot be rewritten "
            "exactly; list those modules by name in the recipe instead"
        )
    return candidate
