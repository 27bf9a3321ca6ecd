"""Reading an artifact's quantized modules from disk and matching them to the model.

The raw tensors come straight from the safetensors files (never from transformers'
decompression), grouped per module; each module is decoded by its weight format, checked
against a meta-device skeleton of the architecture, and turned into an ``EmulatedLinear``, or,
for per-expert modules on disk that transformers fuses in memory, grouped by layer into an
``QuantizedExperts`` (``moe.py``). Names on disk go through transformers' own key renamings
first. The artifact's own config.json must agree with the numerics being emulated.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from quantgate.numerics import moe
from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import ActivationFormat
from quantgate.numerics.weights import WeightDecodeError, WeightFormat
from quantgate.runtime import sharding
from quantgate.runtime.errors import InputError

if TYPE_CHECKING:
    from quantgate.runtime.sharding import Slicer

_QUANTIZED_MARKERS = (".weight_scale", ".weight_packed")


def quantization_config(artifact_dir: Path) -> dict[str, Any]:
    """The artifact's compressed-tensors ``quantization_config``."""
    path = artifact_dir / "config.json"
    try:
        config = json.loads(path.read_text())["quantization_config"]
    except (OSError, ValueError, KeyError):
        raise InputError(path, "no quantization_config", "evaluate a compressed-tensors artifact") from None
    return config


def kv_cache_scheme(artifact_dir: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The declared ``kv_cache_scheme``, refused unless it is what the emulation computes: 8-bit float,
    per-tensor, static, symmetric (the scheme quantgate writes; vLLM also loads ``attn_head``)."""
    kv = config.get("kv_cache_scheme")
    if not kv:
        return None
    found = {k: kv.get(k) for k in ("num_bits", "type", "strategy", "dynamic", "symmetric")}
    if found != {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}:
        raise InputError(
            artifact_dir / "config.json",
            f"kv_cache_scheme {found} is not the per-tensor static symmetric FP8 scheme the emulation computes",
            "rebuild the artifact with quantgate build, or add the scheme to quantgate.numerics",
        )
    return kv


def read_kv_scales(artifact_dir: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{attention module name on disk: (k_scale, v_scale)}`` as float32, from the safetensors files.

    A module with only one of the two is refused: vLLM would duplicate the one it found, which is
    not what a calibration that wrote both meant.
    """
    from safetensors import safe_open

    found: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for shard in sorted(artifact_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is no dict)
                module, _, param = key.rpartition(".")
                if param in ("k_scale", "v_scale"):
                    found[module][param] = f.get_tensor(key).float()
    half = sorted(m for m, t in found.items() if len(t) != 2)
    if half:
        raise InputError(artifact_dir, f"{half[0]} has only one of k_scale / v_scale", "rebuild the artifact")
    return {m: (t["k_scale"], t["v_scale"]) for m, t in sorted(found.items())}


def split_groups(config: dict[str, Any], kept: frozenset[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The quantization config as two: config groups for the target's own format, and those whose
    targets are all modules a repaired variant kept one precision up (``quantgate.repair``)."""
    groups = config.get("config_groups") or {}
    upgraded = {
        name: g for name, g in groups.items() if kept and g.get("targets") and set(g["targets"]) <= kept
    }
    rest = {name: g for name, g in groups.items() if name not in upgraded}
    return {**config, "config_groups": rest}, {**config, "config_groups": upgraded}


def check_config(
    path: Path, config: dict[str, Any], disk_format: str, expects: dict[str, Any] | None
) -> None:
    """The artifact's own description must agree with the numerics we are about to emulate."""
    for name, group in (config.get("config_groups") or {}).items():
        found = group.get("format") or config.get("format")
        if found != disk_format:
            raise InputError(
                path,
                f"config group {name} is {found}, the target's weights need {disk_format}",
                "check the target",
            )
        args = group.get("input_activations")
        if expects is None and args:
            raise InputError(
                path,
                f"config group {name} quantizes activations but the target says none",
                "check the target",
            )
        if expects is not None:
            wrong = {k: (args or {}).get(k) for k, v in expects.items() if (args or {}).get(k) != v}
            if wrong:
                raise InputError(
                    path,
                    f"config group {name} input_activations {wrong} do not match what the target emulates {expects}",
                    "rebuild the artifact with the target's recipe, or evaluate it under the target it was built for",
                )


QuantizedIndex = dict[str, list[tuple[Path, str]]]  # module -> [(shard, its tensor's local name)]


def quantized_index(artifact_dir: Path) -> QuantizedIndex:
    """Where each module with quantized tensors keeps them, from the shards' headers alone (no
    tensor is read): ``{module name: [(shard, local tensor name)]}``."""
    from safetensors import safe_open

    shards = sorted(artifact_dir.glob("*.safetensors"))
    if not shards:
        raise InputError(artifact_dir, "no .safetensors files", "point at an artifact directory")
    index: dict[str, Path] = {}
    for shard in shards:
        with safe_open(shard, "pt") as f:
            index.update(dict.fromkeys(f.keys(), shard))
    modules = {k[: -len(m)] for k in index for m in _QUANTIZED_MARKERS if k.endswith(m)}
    found: QuantizedIndex = defaultdict(list)
    for key, shard in index.items():
        module, _, local = key.rpartition(".")
        if module in modules:
            found[module].append((shard, local))
    return dict(found)


def read_modules(
    index: QuantizedIndex, device: str | torch.device = "cpu", slicer: Slicer | None = None
) -> dict[str, dict[str, torch.Tensor]]:
    """``{module name: {local tensor name: tensor}}`` for the modules of ``index``, read onto
    ``device``: on a GPU worker they are decoded there (an 8B artifact's float32 values are 28 GB,
    which the CPU decoded in seconds and then copied over). ``slicer``: the part of a tensor this
    process reads (``sharding.slicer``: a rank's slice), the rest never leaving the file. A load
    reads one decoder layer's modules at a time, so no more than a layer's bytes are held raw."""
    from safetensors import safe_open

    by_shard: dict[Path, list[tuple[str, str]]] = defaultdict(list)
    for module, entries in index.items():
        for shard, local in entries:
            by_shard[shard].append((module, local))
    found: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
    for shard, wanted in by_shard.items():
        with safe_open(shard, "pt", device=str(device)) as f:
            for module, local in wanted:
                key = f"{module}.{local}"
                view = f.get_slice(key)  # the header's shape; the bytes are read below, whole or in part
                part = slicer(module, tuple(view.get_shape())) if slicer is not None else None
                if part is None:
                    found[module][local] = f.get_tensor(key)
                else:
                    dim, start, length = part
                    found[module][local] = view[(slice(None),) * dim + (slice(start, start + length),)].to(
                        device
                    )
    return dict(found)


def read_quantized_tensors(
    artifact_dir: Path, device: str | torch.device = "cpu", slicer: Slicer | None = None
) -> dict[str, dict[str, torch.Tensor]]:
    """Every quantized module's tensors at once (``read_modules`` of the whole index)."""
    return read_modules(quantized_index(artifact_dir), device, slicer)


def disk_to_memory(skeleton: nn.Module) -> Callable[[str], str]:
    """Module name on disk -> module name in memory, through transformers' own key renamings
    (Mixtral's ``block_sparse_moe`` is ``mlp`` in memory); converters (expert fusion) are not applied."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(skeleton)  # type: ignore[arg-type]
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]

    def rename(name: str) -> str:
        return rename_source_key(f"{name}.weight", renamings, [])[0].removesuffix(".weight")

    return rename


def _check_tensors(where: str, tensors: dict[str, torch.Tensor], wfmt: WeightFormat) -> None:
    unknown = set(tensors) - wfmt.required - wfmt.optional - {"bias"}
    missing = wfmt.required - set(tensors)
    if unknown or missing:
        raise InputError(
            where,
            f"tensors {sorted(tensors)} do not fit weight format {wfmt.name} (unknown {sorted(unknown)}, "
            f"missing {sorted(missing)})",
            "evaluate the artifact under the target it was built for, or register the format",
        )


def emulated_modules(
    artifact_dir: Path,
    raw: dict[str, dict[str, torch.Tensor]],
    wfmt: WeightFormat,
    act: ActivationFormat | None,
    skeleton: nn.Module | None = None,
    rename: Callable[[str], str] | None = None,
    *,
    sliced: bool = False,
    deferred: bool = False,
) -> dict[str, nn.Module]:
    """The emulated module for every quantized module on disk, keyed by its name in memory: an
    ``EmulatedLinear`` per Linear, an ``QuantizedExperts`` per fused experts module (its per-expert
    modules on disk grouped). Refuses any mismatch, naming the module on disk. ``skeleton``: the
    architecture on the meta device (built from the artifact's config when not given); ``rename``:
    ``disk_to_memory(skeleton)`` when the caller has it (building it walks every module of the
    skeleton, which a layer-by-layer caller must not do once per layer). ``sliced``: ``raw`` was read
    with ``sharding.slicer``, so the modules the plan cuts hold this rank's slice already.
    ``deferred``: each ``EmulatedLinear`` holds its on-disk tensors and decodes them at each product
    (``EmulatedLinear.defer_decode``), for a caller that must bound the memory of a layer."""
    if deferred and sliced:
        raise ValueError("a deferred decode holds whole tensors; a sliced read cannot defer")
    skeleton = skeleton if skeleton is not None else meta_skeleton(artifact_dir)
    rename = rename or disk_to_memory(skeleton)
    built: dict[str, nn.Module] = {}
    layers: dict[str, dict[int, dict[str, dict[str, torch.Tensor]]]] = defaultdict(lambda: defaultdict(dict))
    disk_prefix: dict[str, str] = {}
    for name, tensors in sorted(raw.items()):
        where = f"{artifact_dir}: module {name}"
        _check_tensors(where, tensors, wfmt)
        memory = rename(name)
        key = moe.expert_key(memory)
        if key is not None and moe.is_fused_experts(_submodule(skeleton, key[0])):
            layers[key[0]][key[1]][key[2]] = tensors
            disk_prefix.setdefault(key[0], name.rsplit(".", 2)[0])
            continue
        module = _submodule(skeleton, memory)
        cut = read_style(skeleton, memory) if sliced else None
        if not isinstance(module, nn.Linear):
            raise InputError(
                where,
                f"quantized tensors on disk match no Linear of {type(skeleton).__name__} "
                f"(found {type(module).__name__} at {memory})",
                "the in-memory module names differ from the names on disk; this architecture cannot be emulated yet",
            )
        try:
            decoded = wfmt.decode(tensors)
        except WeightDecodeError as exc:
            raise InputError(where, str(exc), "rebuild the artifact") from None
        want = sharding.read_shape(module.out_features, module.in_features, cut)
        if tuple(decoded.values.shape) != want:
            raise InputError(
                where,
                f"decoded weight is {tuple(decoded.values.shape)}, the module is {want}"
                + (f" (this rank's slice of ({module.out_features}, {module.in_features}))" if cut else ""),
                "rebuild the artifact",
            )
        global_scale = (
            tensors.get("input_global_scale") if act is not None and act.needs_global_scale else None
        )
        if act is not None and act.needs_global_scale and global_scale is None:
            raise InputError(
                where, f"{act.name} needs a calibrated input_global_scale", "rebuild with calibration"
            )
        linear = EmulatedLinear(
            decoded, act, weight_format=wfmt.name, input_global_scale=global_scale, bias=tensors.get("bias")
        )
        if deferred:
            linear.defer_decode(dict(tensors), wfmt.decode)  # what it decoded from, as it was
        if cut is not None:
            sharding.read_cut(linear, cut)
        built[memory] = linear
    for prefix, experts in layers.items():
        where = f"{artifact_dir}: experts {disk_prefix[prefix]}"
        fused: Any = skeleton.get_submodule(prefix)  # transformers' experts module: its act_fn
        read_cut = sliced and sharding.cuts_experts(skeleton, prefix)
        try:
            weights, notes = moe.plan_layer(
                fused, experts, wfmt.decode, shards=sharding.processes() if read_cut else 1
            )
            scales = moe.shared_input_scales(experts) if act is not None and act.needs_global_scale else None
        except (moe.ExpertLayoutError, WeightDecodeError) as exc:
            raise InputError(where, str(exc), "rebuild the artifact") from None
        built[prefix] = moe.QuantizedExperts(
            weights, act, fused.act_fn, weight_format=wfmt.name, input_scales=scales, notes=tuple(notes)
        )
        if read_cut:
            sharding.mark_cut(built[prefix])
    return built


def read_style(skeleton: nn.Module, name: str) -> str | None:
    """How ``sharding.slicer`` cuts the tensors of module ``name`` (a memory name) in a group: the
    plan's column- or row-wise style of a linear; an expert's projection by its role, where the
    plan cuts its experts (gate and up column-wise, down row-wise); None: read whole."""
    key = moe.expert_key(name)
    if key is None:
        return sharding.linear_style(skeleton, name)
    if not sharding.cuts_experts(skeleton, key[0]):
        return None
    return "rowwise" if moe.role(key[2]) == "down" else "colwise"


def meta_skeleton(artifact_dir: Path) -> nn.Module:
    """The artifact's architecture on the meta device: its module names and shapes, no memory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(artifact_dir))


def _submodule(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None
