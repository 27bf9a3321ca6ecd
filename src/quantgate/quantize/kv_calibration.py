"""The KV cache an artifact is built with: the policy's decision, and FP8 KV scales calibrated for it.

The decision: a model class (gates.yaml ``model_classes.<c>.kv_cache``) says FP8 or bf16 for
every target it gets, and the class wins over a target YAML that says otherwise: the class is
the fleet's memory plan for that kind of model. ``--targets`` overrides the class, so each named
target's own ``kv_cache`` (targets/*.yaml) decides. The decision is part of the build key, the
manifest's ``kv_cache`` and the run's plan.

FP8 is written the way llm-compressor and compressed-tensors write it, so vLLM loads it:
``quantization_config.kv_cache_scheme`` in config.json (8-bit float, per tensor, static,
symmetric) and one ``k_scale`` and ``v_scale`` per attention layer (shape ``[1]``, the model's
dtype; vLLM 0.33 ``CompressedTensorsKVCacheMethod`` loads them into float32). A scale is
absmax / 448 over the calibration set: llm-compressor's ``static_minmax`` observer, which this
module names in the recipe rather than the default moving average (whose first sample weighs
99%), so that calibrated and data-free builds compute the same statistic. Calibrated recipes
get the scheme added to what llm-compressor runs (``with_kv_cache_scheme``; it observes K and V
with quantization still disabled, as its QuantizationMixin calibrates); data-free builds (which
read no data otherwise) get a KV pass over the built artifact (``calibrate``). Multi-head latent
attention caches one latent per token (``kv_c_normed`` and the rotary ``k_pe``), which is what
its ``k_scale`` covers there.

Why through the built artifact, not a KV-only llm-compressor recipe: the scales must cover the
keys and values the served model produces, which are the W8A8 model's, and the data-free path
must keep its memory bound: the pass runs the calibration set layer by layer (one decoded layer
in memory at a time, the artifact's own bytes decoded by ``quantgate.numerics``), where
llm-compressor would load the whole bf16 source. hopper-fp8 and rocm-cdna3-fp8 share bytes, so
the pass runs in the numerics the bytes declare (OCP e4m3fn weights and per-token activations),
whichever of the two is built first.

The pass computes in float64 (``canonical.py``), on the CPU or the build's GPU: its scales are the
same bytes on any machine, thread count or device, so equal build keys mean equal bytes. Where a
layer holds something it cannot put in float64 (fused MoE experts), the manifest's
``build.kv_calibration`` says so (``canonical: false`` and why).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantgate.config import ActivationNumerics, KVCache, Target, WeightNumerics
from quantgate.quantize.canonical import Arithmetic
from quantgate.runtime.errors import BuildError, CalibrationError

if TYPE_CHECKING:
    import torch

    from quantgate.calibration import CalibrationSet
    from quantgate.config import Gates
    from quantgate.runtime.progress import Progress

# what the recipe passes to llm-compressor and what config.json declares
KV_CACHE_SCHEME: dict[str, Any] = {
    "num_bits": 8,
    "type": "float",
    "strategy": "tensor",
    "dynamic": False,
    "symmetric": True,
    "observer": "static_minmax",
}
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max: calculate_qparams' range / 2
SCALES_FILE = "kv_cache_scales.safetensors"  # beside the shards of a sharded artifact
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_OCP: dict[str, str] = {
    WeightNumerics.FP8_E4M3FNUZ: WeightNumerics.FP8_E4M3FN,
    ActivationNumerics.FP8_E4M3FNUZ_PER_TOKEN: ActivationNumerics.FP8_E4M3FN_PER_TOKEN,
}


# ---------------------------------------------------------------------------- the decision


def kv_decisions(
    gates: Gates, model_class: str, override: Sequence[str] | None, targets: Sequence[Target]
) -> dict[str, KVCache]:
    """``{target: KV cache}``: the class's ``kv_cache`` for every target, unless ``--targets``
    overrode the class (then each target's own ``kv_cache``)."""
    if override:
        return {t.name: t.kv_cache for t in targets}
    kv = gates.model_classes[model_class].kv_cache
    return {t.name: kv for t in targets}


def key_part(kv: KVCache) -> dict[str, Any] | None:
    """What the decision adds to a build key (None for bf16, which leaves older keys unchanged)."""
    return {"kv_cache": kv.value, "scheme": KV_CACHE_SCHEME} if kv == KVCache.FP8_E4M3 else None


def with_kv_cache_scheme(recipe: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of an llm-compressor recipe whose quantization modifiers calibrate the FP8 KV scheme."""
    out = json.loads(json.dumps(recipe))
    found = 0
    for stage in out.values():
        for group in stage.values():
            for kind, args in group.items():
                if kind in ("QuantizationModifier", "GPTQModifier", "AWQModifier"):
                    args["kv_cache_scheme"] = dict(KV_CACHE_SCHEME)
                    found += 1
    if not found:
        raise BuildError("the recipe has no quantization modifier to calibrate the FP8 KV cache with")
    return out


# ---------------------------------------------------------------------------- data-free KV pass


def calibrate(
    artifact_dir: Path,
    target: Target,
    calibration: CalibrationSet,
    num_samples: int,
    max_seq_length: int,
    progress: Progress | None = None,
    device: str = "cpu",
) -> KVCalibration:
    """``{attention module: (k absmax, v absmax)}`` of the built artifact run on the calibration set,
    and how it was computed (``KVCalibration``).

    In float64 (``canonical``): the same bytes whatever the machine, thread count or ``device``
    ("cpu" or "cuda"; the decoded layer and its inputs move there, one layer at a time).

    Layer by layer: the inputs of the first decoder layer are captured from the model's own
    forward (embeddings, rotary, masks as the architecture makes them), then each layer is
    decoded from the artifact, run on every sample, observed and dropped. Every layer gets the
    first layer's mask: architectures that mix sliding-window layers see the same keys while the
    samples are no longer than the window (``max_seq_length`` 512 here).

    A layer's work is bounded by what the layer holds: its tensors are grouped once
    (``_by_layer``), the name mapping is built once, and the garbage collection after each layer
    skips the objects that existed before the loop (``gc.freeze``), so no step walks every tensor,
    module or object of the model again. (They did: a 1,400-layer artifact in 10,000 shards, 30 MB
    in all, spent 3.3 s a layer, about 77 minutes, matching tensor names, rebuilding transformers'
    conversion mapping and collecting garbage.)
    """
    import gc

    import torch

    from quantgate.numerics import ObserveKV, attention_modules, install_kv_hooks, is_latent
    from quantgate.quantize import canonical

    texts = calibration.texts()[:num_samples]
    if not texts:
        raise CalibrationError(calibration.name, "the calibration set is empty", "sample a non-empty set")
    model, layers, layers_name, tensors, rename = _skeleton(artifact_dir)
    observers: dict[str, ObserveKV] = {}
    handles = []
    module: Any
    for name, module in attention_modules(model, latent=True).items():
        if is_latent(module):
            obs = ObserveKV(rope_dims=int(module.qk_rope_head_dim))
            handles.append(
                module.kv_a_layernorm.register_forward_hook(lambda _m, _i, out, o=obs: o.observe_latent(out))
            )
        else:
            obs = ObserveKV()
        observers[name] = obs
    install_kv_hooks(model, observers)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(artifact_dir)
    # as the oneshot engine tokenizes: truncated to the recipe's length, special tokens added
    ids = [
        torch.tensor([row])
        for row in tokenizer(texts, truncation=True, max_length=max_seq_length, add_special_tokens=True)[
            "input_ids"
        ]
    ]
    inputs, notes = _canonical_inputs(model, _first_layer_inputs(model, layers, ids), device)
    wfmt, act = _ocp_numerics(target)
    per_layer = _by_layer(tensors, layers_name, len(layers))
    # what exists now (the skeleton's modules and names) is left out of every collection below, so
    # collecting after a layer costs what that layer made, not what the model holds
    gc.collect()
    gc.freeze()
    try:
        with torch.inference_mode():
            for i in range(len(layers)):
                if progress is not None:
                    progress.log(f"KV calibration: layer {i + 1}/{len(layers)}")
                layer = _materialize(
                    artifact_dir, model, layers, layers_name, i, per_layer[i], wfmt, act, rename, device
                )
                notes.extend(n for n in canonical.layer_to_float64(layer) if n not in notes)
                layer.to(device)
                for n, (hidden, args, kwargs) in enumerate(inputs):
                    out = layer(hidden, *args, **kwargs)
                    inputs[n] = (out[0] if isinstance(out, tuple) else out, args, kwargs)
                layers[i] = layer.to("meta")  # drop the decoded weights
                del layer
                _release_memory()
    finally:
        gc.unfreeze()
    for handle in handles:
        handle.remove()
    if any(is_latent(m) for m in model.modules()):
        notes.append("multi-head latent attention: its latent norm is observed in the model's own arithmetic")
    # MLA caches one latent per token, quantized with k_scale; v_scale mirrors it
    absmax = {
        name: (float(o.k_absmax), float(o.k_absmax if o.rope_dims is not None else o.v_absmax))
        for name, o in observers.items()
    }
    return KVCalibration(absmax, canonical.Arithmetic(canonical=not notes, notes=tuple(notes)), device)


@dataclass(frozen=True)
class KVCalibration:
    """What the data-free pass found: ``{attention module: (k absmax, v absmax)}``, how it computed
    (``canonical``: float64 throughout, the same bytes on any machine; else why not) and where."""

    absmax: dict[str, tuple[float, float]]
    arithmetic: Arithmetic
    device: str


def _canonical_inputs(model: Any, captured: list, device: str) -> tuple[list, list[str]]:
    """The first layer's inputs on ``device`` in float64, the rotary embedding recomputed in float64
    (the model computes it in float32); the notes say what could not be (``canonical.py``)."""
    from quantgate.quantize import canonical

    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    notes: list[str] = []
    out = []
    for hidden, args, kwargs in captured:
        kwargs = dict(kwargs)
        if "position_embeddings" in kwargs:
            exact = canonical.rotary_float64(
                rotary, kwargs.get("position_ids"), kwargs["position_embeddings"]
            )
            if exact is None:
                note = "the rotary embedding is not the Llama family's: computed in float32 by transformers"
                if note not in notes:
                    notes.append(note)
            else:
                kwargs["position_embeddings"] = exact
        out.append(canonical.to_device((hidden, args, kwargs), device, float64=True))
    return out, notes


def _ocp_numerics(target: Target):
    from quantgate.numerics import activation_format, weight_format

    weights = _OCP.get(target.numerics.weights, target.numerics.weights)
    acts = _OCP.get(target.numerics.activations, target.numerics.activations)
    return weight_format(weights), (None if acts == ActivationNumerics.NONE else activation_format(acts))


def _skeleton(artifact_dir: Path):
    """The architecture on the meta device, its decoder layers (and their name),
    ``{memory name: (shard, disk name)}`` and the disk -> memory name mapping (``disk_to_memory``)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    from quantgate.numerics import disk_to_memory

    config = AutoConfig.from_pretrained(artifact_dir)
    quantization = getattr(config, "quantization_config", None)
    if isinstance(quantization, dict):  # a skeleton only: no quantizer, no KV hooks of compressed-tensors
        config.quantization_config = {k: v for k, v in quantization.items() if k != "kv_cache_scheme"}
    # sdpa computes in its inputs' dtype (float64 here, on any device); the tiled CPU attention
    # evaluation runs takes its softmax in float32
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise BuildError(
            f"{artifact_dir}: {type(model).__name__} has no decoder layer list to calibrate the KV cache on"
        )
    layers_name = next(n for n, m in model.named_modules() if m is layers)
    rename = disk_to_memory(model)
    tensors: dict[str, tuple[Path, str]] = {}
    for shard in sorted(artifact_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is no dict)
                module, _, param = key.rpartition(".")
                tensors[f"{rename(module)}.{param}" if module else key] = (shard, key)
    _materialize_outside_layers(artifact_dir, model, layers, tensors)
    return model, layers, layers_name, tensors, rename


def _load(
    tensors: Mapping[str, tuple[Path, str]], names: Sequence[str], device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """``names`` read from their shards onto ``device`` (the pass's: an 8B layer's FP8 weights were
    decoded on the host, 15 s of CPU over 32 layers, before going to the GPU; decoding is exact, so
    the values are the same wherever it runs)."""
    from safetensors import safe_open

    by_shard: dict[Path, list[str]] = {}
    for name in names:
        by_shard.setdefault(tensors[name][0], []).append(name)
    out = {}
    for shard, wanted in by_shard.items():
        with safe_open(shard, "pt", device=device) as f:
            for name in wanted:
                out[name] = f.get_tensor(tensors[name][1])
    return out


def _fill(
    artifact_dir: Path,
    module: torch.nn.Module,
    prefix: str,
    tensors: Mapping[str, tuple[Path, str]],
    skip=(),
    device: str = "cpu",
) -> None:
    """Every parameter and persistent buffer of ``module`` (on meta) set from the artifact's tensors,
    except under ``skip`` (the modules about to be replaced): nothing is allocated twice."""
    import torch

    def skipped(name: str) -> bool:
        return any(name == s or name.startswith(f"{s}.") for s in skip)

    wanted = {n: t for n, t in module.state_dict(keep_vars=True).items() if not skipped(n)}
    missing = sorted(f"{prefix}{n}" for n in wanted if f"{prefix}{n}" not in tensors)
    if missing:
        raise BuildError(
            f"{artifact_dir}: no tensor for {missing[:3]} ({len(missing)} missing): the KV calibration pass "
            "cannot run this layer"
        )
    loaded = _load(tensors, [f"{prefix}{n}" for n in sorted(wanted)], device)
    for name, old in wanted.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        value = loaded[f"{prefix}{name}"].to(old.dtype)
        if leaf in owner._parameters:
            owner._parameters[leaf] = torch.nn.Parameter(value, requires_grad=False)
        else:
            owner._buffers[leaf] = value
    for sub_name, sub in module.named_modules():
        stale = [
            b for b in getattr(sub, "_non_persistent_buffers_set", ()) if getattr(sub, b, None) is not None
        ]
        if stale and not skipped(sub_name):
            raise BuildError(
                f"{artifact_dir}: {prefix}{sub_name} has computed buffers {stale}, which the KV calibration "
                "pass cannot rebuild layer by layer"
            )


def _release_memory() -> None:
    """Give the freed layer back to the system: glibc keeps freed arenas otherwise, and the RSS of a
    streamed pass would grow layer by layer (measured: +330 MB over 20 layers of a 1.6 GB model)."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _materialize_outside_layers(artifact_dir: Path, model: Any, layers: torch.nn.ModuleList, tensors) -> None:
    """Embeddings, norms and rotary embeddings of the decoder (never the output head)."""
    decoder = model.get_decoder()
    prefix = next(n for n, m in model.named_modules() if m is decoder)
    for name, child in decoder.named_children():
        if child is layers:
            continue
        if getattr(child, "_non_persistent_buffers_set", None) and not any(True for _ in child.parameters()):
            # rotary embeddings: buffers computed from the config, rebuilt on the CPU
            setattr(decoder, name, type(child)(config=child.config))
            continue
        _fill(artifact_dir, child, f"{prefix}.{name}.", tensors)


class _Captured(Exception):
    def __init__(self, hidden, args, kwargs) -> None:
        super().__init__("first decoder layer reached")
        self.inputs = (hidden, args, kwargs)


def _catcher(layer: torch.nn.Module) -> torch.nn.Module:
    """Stands in for the first decoder layer: records what the model's forward passes it, then stops."""
    from torch import nn

    class Catcher(nn.Module):
        def forward(self, hidden, *args, **kwargs):
            raise _Captured(hidden, args, kwargs)

    catcher = Catcher()
    for name in ("attention_type", "layer_idx"):  # read by some decoders' loops (mask per layer type)
        if hasattr(layer, name):
            setattr(catcher, name, getattr(layer, name))
    return catcher


def _first_layer_inputs(model, layers, ids) -> list[tuple[Any, tuple, dict]]:
    import torch

    first = layers[0]
    inputs = []
    decoder = model.get_decoder()
    layers[0] = _catcher(first)
    try:
        with torch.inference_mode():
            for row in ids:
                try:
                    decoder(input_ids=row, use_cache=False)
                except _Captured as captured:
                    inputs.append(captured.inputs)
                else:
                    raise BuildError("the decoder never reached its first layer")
    finally:
        layers[0] = first
    return inputs


def _by_layer(
    tensors: Mapping[str, tuple[Path, str]], layers_name: str, count: int
) -> list[dict[str, tuple[Path, str]]]:
    """The artifact's tensors of each decoder layer (``{memory name: (shard, disk name)}``), in one pass."""
    per_layer: list[dict[str, tuple[Path, str]]] = [{} for _ in range(count)]
    prefix = f"{layers_name}."
    for memory, where in tensors.items():
        index = memory[len(prefix) :].partition(".")[0] if memory.startswith(prefix) else ""
        if index.isdigit() and int(index) < count:
            per_layer[int(index)][memory] = where
    return per_layer


# a layer whose linears decode to more float32 than this holds its on-disk bytes instead and decodes
# each weight at its product (``EmulatedLinear.defer_decode``); see ``_defers``
RESIDENT_LAYER_BYTES = 64 << 20


def _defers(layer: torch.nn.Module) -> bool:
    """Whether decoder ``layer`` (the skeleton's, on the meta device) is too large to hold decoded.

    A decoded FP8 layer is four times its bytes: 151 MB against 38 MB a layer in the 1.6 GB
    memory-cap build, whose pass peaked at 1.08 GB resident and 0.87 GB deferred (the cap is 1.21
    GB); an 8B model's layer is 0.87 GB against 0.22 GB. The decode costs about a third of a
    512-token float64 product on 2 CPU cores (30 against 100 ms for a 6144 x 1536 weight,
    measured), once per sample: the memory-cap build took 188 s deferred against 140 s. Small layers
    (the default model's: 14 MB) stay resident, where the saving is small and the time is not."""
    import torch

    decoded = sum(4 * m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))
    return decoded > RESIDENT_LAYER_BYTES


def _materialize(
    artifact_dir, model, layers, layers_name: str, i: int, tensors, wfmt, act, rename, device: str = "cpu"
):
    """Decoder layer ``i`` on ``device``: quantized modules emulated from the artifact's bytes, the
    rest loaded. ``tensors``: the layer's own (``_by_layer``); ``rename``: ``disk_to_memory(model)``."""
    from quantgate.numerics import emulated_modules

    prefix = f"{layers_name}.{i}."
    quantized = {}
    markers = (".weight_scale", ".weight_packed")
    by_module: dict[str, list[str]] = {}
    for memory, (_, disk) in tensors.items():
        by_module.setdefault(disk.rpartition(".")[0], []).append(memory)
    for disk_module, names in sorted(by_module.items()):
        if any(tensors[m][1].endswith(markers) for m in names):
            loaded = _load(tensors, names, device)
            quantized[disk_module] = {tensors[m][1].rpartition(".")[2]: t for m, t in loaded.items()}
    emulated = emulated_modules(
        artifact_dir, quantized, wfmt, act, skeleton=model, rename=rename, deferred=_defers(layers[i])
    )
    layer = layers[i]
    skip = [name.removeprefix(prefix) for name in emulated]
    _fill(artifact_dir, layer, prefix, tensors, skip=skip, device=device)
    for name, module in emulated.items():
        parent, _, child = name.removeprefix(prefix).rpartition(".")
        setattr(layer.get_submodule(parent) if parent else layer, child, module)
    return layer


# ---------------------------------------------------------------------------- writing and checking


def write_kv_scales(artifact_dir: Path, absmax: Mapping[str, tuple[float, float]]) -> None:
    """Store ``k_scale``/``v_scale`` = absmax / 448 per attention module and declare the scheme.

    Scales are the model's dtype, shape ``[1]``, 0 replaced by the dtype's eps, as compressed-tensors'
    ``calculate_qparams`` writes them. A ``model.safetensors`` gets them appended (transformers
    reads that file alone when it exists, index or not); a sharded artifact gets one more file in
    its index.
    """
    import torch
    from safetensors.torch import save_file

    config_path = artifact_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    dtype = getattr(torch, str(config.get("dtype") or config.get("torch_dtype") or "bfloat16"))
    eps = torch.finfo(dtype).eps
    scales: dict[str, torch.Tensor] = {}
    for module, (k, v) in sorted(absmax.items()):
        for param, value in (("k_scale", k), ("v_scale", v)):
            scale = torch.tensor([value], dtype=torch.float32) / FP8_MAX
            scale = scale.to(dtype)
            scales[f"{module}.{param}"] = torch.where(scale == 0, torch.tensor(eps, dtype=dtype), scale)
    single = artifact_dir / _SINGLE
    if single.is_file():  # transformers reads it alone, index or not: the scales go into it
        append_tensors(single, scales)
        if (artifact_dir / _INDEX).is_file():
            _index_add(artifact_dir, scales, _SINGLE)
    elif (artifact_dir / _INDEX).is_file():
        save_file(dict(scales), artifact_dir / SCALES_FILE, metadata={"format": "pt"})
        _index_add(artifact_dir, scales, SCALES_FILE)
    else:
        raise BuildError(f"{artifact_dir}: neither {_SINGLE} nor {_INDEX}: nowhere to add the KV scales")
    config["quantization_config"]["kv_cache_scheme"] = kv_cache_scheme_config()
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def kv_cache_scheme_config() -> dict[str, Any]:
    """The ``kv_cache_scheme`` entry exactly as compressed-tensors serializes ``KV_CACHE_SCHEME``."""
    from compressed_tensors.quantization import QuantizationArgs

    return QuantizationArgs.model_validate(KV_CACHE_SCHEME).model_dump(mode="json")


def _index_add(artifact_dir: Path, tensors: Mapping[str, torch.Tensor], shard: str) -> None:
    index_path = artifact_dir / _INDEX
    index = json.loads(index_path.read_text(encoding="utf-8"))
    index["weight_map"].update(dict.fromkeys(tensors, shard))
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    if "total_size" in index.get("metadata", {}):
        index["metadata"]["total_size"] += sum(t.numel() * t.element_size() for t in tensors.values())
    index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")


_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def append_tensors(shard: Path, tensors: Mapping[str, torch.Tensor]) -> None:
    """Add ``tensors`` after the data of ``shard`` without reading it into memory (a new header, the
    old data copied by the kernel, the new bytes): offsets of the tensors already there are unchanged."""
    import struct

    import torch

    with shard.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    data_start = 8 + length
    data_len = shard.stat().st_size - data_start
    blobs = []
    offset = data_len
    for name, tensor in tensors.items():
        if name in header:
            raise BuildError(f"{shard}: already holds {name}")
        blob = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {
            "dtype": _DTYPES[str(tensor.dtype).removeprefix("torch.")],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-(8 + len(encoded)) % 8)  # the data starts 8-byte aligned, as safetensors writes
    tmp = shard.with_name(f".{shard.name}.kv-tmp")
    with shard.open("rb") as src, tmp.open("wb") as dst:
        dst.write(struct.pack("<Q", len(encoded)) + encoded)
        dst.flush()
        _copy_range(src, dst, data_start, data_len)
        for blob in blobs:
            dst.write(blob)
    os.replace(tmp, shard)


def _copy_range(src, dst, start: int, length: int) -> None:
    """``length`` bytes of ``src`` from ``start`` appended to ``dst``, copied by the kernel
    (``copy_file_range``: no trip through this process, a reflink where the filesystem shares
    extents), else through user space. An 8B artifact's 9 GB shard was copied here in 16 MB reads
    and writes after its KV pass."""
    out_at = dst.tell()
    done = 0
    try:
        while done < length:
            n = os.copy_file_range(src.fileno(), dst.fileno(), length - done, start + done, out_at + done)
            if n == 0:
                raise OSError("copy_file_range copied nothing")
            done += n
    except (AttributeError, OSError):  # no such call here, or not between these files
        src.seek(start + done)
        dst.seek(out_at + done)
        remaining = length - done
        while remaining:
            chunk = src.read(min(16 * 1024 * 1024, remaining))
            if not chunk:
                raise BuildError(
                    f"{src.name}: ended {remaining} bytes early while adding the KV scales"
                ) from None
            dst.write(chunk)
            remaining -= len(chunk)
        return
    dst.seek(out_at + done)


def declared(artifact_dir: Path) -> tuple[dict[str, Any] | None, set[str]]:
    """The artifact's ``kv_cache_scheme`` (None if none) and the names of its k_scale/v_scale tensors."""
    from safetensors import safe_open

    config = json.loads((artifact_dir / "config.json").read_text(encoding="utf-8"))
    quantization = config.get("quantization_config") or {}
    scheme = quantization.get("kv_cache_scheme")
    if scheme is None and str(quantization.get("kv_cache_quant_algo", "")).upper() == "FP8":
        scheme = {**KV_CACHE_SCHEME, "declared_by": "modelopt"}  # modelopt's export declares it its way
    names = set()
    for shard in sorted(artifact_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            names |= {k for k in f.keys() if k.endswith((".k_scale", ".v_scale"))}  # noqa: SIM118
    return scheme, names


def check_declared(artifact_dir: Path, target: str, kv: KVCache) -> None:
    """BuildError unless the artifact declares an FP8 KV cache with scales exactly when ``kv`` says FP8."""
    scheme, names = declared(artifact_dir)
    if kv == KVCache.FP8_E4M3:
        if not scheme or not names:
            raise BuildError(
                f"{target}: the policy asks for an FP8 KV cache but the artifact has "
                f"{'no kv_cache_scheme' if not scheme else 'no k_scale/v_scale tensors'}"
            )
        wrong = {
            k: scheme.get(k) for k, v in KV_CACHE_SCHEME.items() if k != "observer" and scheme.get(k) != v
        }
        if wrong:
            raise BuildError(f"{target}: kv_cache_scheme {wrong} is not the scheme quantgate declares")
    elif scheme or names:
        raise BuildError(
            f"{target}: the policy keeps the KV cache in bf16 but the artifact declares an FP8 KV cache"
        )
