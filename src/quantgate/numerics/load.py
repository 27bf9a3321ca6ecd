"""Load an artifact for evaluation with its target's numerics applied explicitly.

Why not just ``from_pretrained``: what it returns decides what is measured, and it varies.
Seen here (transformers 5.17, compressed-tensors 0.19): by default the modules stay
compressed and a pre-hook decompresses them on the first forward; with ``dequantize=True``
the weights come back as bf16 (``w * scale`` rounded to bf16) and compressed-tensors still
fake-quantizes activations, in bf16 arithmetic, which rounds the dynamic scale and the scaled
value to bf16 before the FP8 cast and so lands one FP8 step away from the kernel's float32
result in places. Other process states give plain bf16 ``Linear`` modules with no activation
quantization at all: W8A16 measured for W8A8. So:

1. every module with quantized tensors on disk (``weight_scale``/``weight_packed``) becomes an
   ``EmulatedLinear`` decoded from those raw tensors, read with safetensors, never from a
   bf16 decompression (bf16 rounding of ``w * scale`` is not what the kernel computes);
   they are decoded and matched against a meta-device skeleton before anything is loaded;
   per-expert modules of a mixture-of-experts layer, which transformers fuses in memory,
   become one ``QuantizedExperts`` per layer (``moe.py``);
2. the rest (embeddings, norms, lm_head) comes from ``from_pretrained`` in bf16, on its
   default route, which leaves quantized modules compressed (nothing is dequantized only to
   be thrown away: transformers' NVFP4 decompression alone took ~25 s for the 135M model);
   the quantized modules are swapped out, and the model is checked for anything left
   compressed or carrying a quantization scheme;
3. the KV cache is what the artifact declares: with a ``kv_cache_scheme`` in config.json, FP8
   after RoPE at exactly the ``k_scale`` / ``v_scale`` stored per layer (``kvcache.py``; on
   ROCm in e4m3fnuz at the stored scale, as vLLM 0.33 loads compressed-tensors KV scales);
   without one, bf16, or scale 1.0 for an older artifact whose manifest says FP8 (vLLM with
   ``--kv-cache-dtype fp8`` and no scales). transformers is given the config without the KV
   scheme, so compressed-tensors does not quantize K and V a second time. Multi-head latent
   attention (DeepSeek) caches a latent instead, which a prefill does not read back: said in
   the report;
4. anything that does not line up (a format not registered, tensors that match no module,
   a quantized module left unreplaced, a weight-only artifact under W8A8 numerics) is an
   error naming the artifact, never a silent fallback.
"""

from __future__ import annotations

import re
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from quantgate.config import ActivationNumerics, KVCache, Target, WeightNumerics
from quantgate.contracts.artifact import read_manifest
from quantgate.numerics import attention as tiled_attention
from quantgate.numerics.artifact import (
    check_config,
    disk_to_memory,
    emulated_modules,
    kv_cache_scheme,
    meta_skeleton,
    quantization_config,
    quantized_index,
    read_kv_scales,
    read_modules,
    read_style,
    split_groups,
)
from quantgate.numerics.cpu_gemm import use_float32_gemm
from quantgate.numerics.emulated import EmulatedLinear
from quantgate.numerics.formats import ActivationFormat, activation_format, kv_cache_format
from quantgate.numerics.kvcache import attention_modules, install_kv_cache, latent_attention
from quantgate.numerics.moe import RoutedExperts
from quantgate.numerics.native import NativeFP8Linear, NativeResult, apply_native, to_kernel
from quantgate.numerics.weights import WeightFormat, weight_format
from quantgate.runtime import offload, sharding
from quantgate.runtime.errors import InputError, UsageError
from quantgate.runtime.greedy import pin_greedy

_ACCUMULATION_NOTE = (
    "emulated: precise fp32 accumulation of exactly decoded operands; a serving kernel with fast "
    "accumulation may differ by up to ~5e-3 relative at large K (BENCHMARKS.md, native FP8 against the emulation)"
)


class NumericsReport(BaseModel):
    """What an evaluation actually computed; the gate report quotes it (native or emulated)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    hardware: str
    weights: str
    activations: str
    kv_cache: str  # what the report's KV column shows: format, calibrated or not, scale range
    mode: Literal["emulated", "native", "source"]
    device: str
    native_on: tuple[str, ...] = ()
    # every quantized module by name: "native" (the hardware's kernel) or "emulated" (on ``device``)
    linears: dict[str, Literal["native", "emulated"]] = {}
    modules_replaced: int = 0
    moe_layers: int = 0  # fused experts modules replaced by QuantizedExperts
    kv_cache_layers: int = 0
    kv_cache_format: str = "bf16"  # the KV format alone: bf16, fp8_e4m3fn, fp8_e4m3fnuz
    kv_cache_scheme: str | None = (
        None  # the artifact's kv_cache_scheme strategy ("tensor"), None: none declared
    )
    kv_cache_calibrated: bool | None = None  # FP8 KV at calibrated scales (False: scale 1.0); None for bf16
    k_scale_range: tuple[float, float] | None = None  # smallest and largest stored k_scale
    v_scale_range: tuple[float, float] | None = None
    tensor_parallel: int = 1  # processes the model was spread over (``sharding``)
    offloaded_layers: int = 0  # decoder layers held off the device past --max-memory (``offload``)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvalModel:
    """A model ready to score, its tokenizer, and what its numerics are."""

    model: nn.Module
    tokenizer: Any
    numerics: NumericsReport


@dataclass(frozen=True)
class _Numerics:
    target: str
    hardware: str
    format: str
    weights: str  # a WEIGHT_FORMATS name (WeightNumerics for quantgate's own)
    activations: str  # an ACTIVATION_FORMATS name, or ActivationNumerics.NONE
    kv_cache: KVCache
    native_on: tuple[str, ...]
    kv_from_manifest: bool  # the build's KV decision (the class's policy), not the target's default


def _resolve(artifact_dir: Path, target: Target | None) -> _Numerics:
    manifest = read_manifest(artifact_dir)
    if target is not None:
        if manifest is not None and manifest.format != target.format:
            raise InputError(
                artifact_dir,
                f"the artifact is {manifest.format} (built for {manifest.target}) but target {target.name} "
                f"expects {target.format}",
                "evaluate the artifact built for this target",
            )
        name, hardware, fmt, n = target.name, target.hardware, str(target.format), target.numerics
        kv_cache = manifest.kv_cache if manifest is not None else target.kv_cache
    elif manifest is not None:
        name, hardware, fmt, n = manifest.target, manifest.hardware, manifest.format, manifest.numerics
        kv_cache = manifest.kv_cache
    else:
        raise InputError(
            artifact_dir,
            "no valid manifest.json, so the target's numerics are unknown",
            "build the artifact with `quantgate build`, or pass the Target explicitly",
        )
    return _Numerics(
        name, hardware, fmt, n.weights, n.activations, kv_cache, tuple(n.native_on), manifest is not None
    )


def _kv_format_name(n: _Numerics) -> str | None:
    if n.kv_cache == KVCache.BF16:
        return None
    fnuz = (
        n.weights == WeightNumerics.FP8_E4M3FNUZ or n.activations == ActivationNumerics.FP8_E4M3FNUZ_PER_TOKEN
    )
    return "fp8_e4m3fnuz" if fnuz else "fp8_e4m3fn"


def _load_hf(directory: Path, device: str | torch.device = "cpu", **kwargs) -> tuple[Any, Any, list[str]]:
    """Model (bf16, eval) on ``device``, tokenizer, and the parameter names transformers found no
    tensor for. A GPU worker's model is loaded onto the GPU directly (``device_map``), not built on
    the CPU and copied: the same values, without a host copy of the checkpoint. In a group of
    processes (``sharding``) each loads its slice by the model's tensor-parallel plan."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    # long prefills (every scored window) run tiled; decoding and short prompts stay on sdpa
    kwargs.setdefault("attn_implementation", tiled_attention.register())
    config = AutoConfig.from_pretrained(directory)
    sharded = sharding.load_kwargs(directory, config, torch.device(device).type)
    if sharded:  # this process's slice, by the model's tensor-parallel plan
        kwargs.update(sharded)
    elif torch.device(device).type != "cpu":
        kwargs.setdefault("device_map", str(device))
    quantization = getattr(config, "quantization_config", None)
    if isinstance(quantization, dict) and quantization.get("kv_cache_scheme"):
        # the KV cache is emulated here at the stored scales; compressed-tensors would otherwise
        # hook the attention modules and quantize K and V itself (k_scale/v_scale stay unloaded)
        config.quantization_config = {k: v for k, v in quantization.items() if k != "kv_cache_scheme"}
        kwargs["config"] = config
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantization_config.*")
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.bfloat16, output_loading_info=True, **kwargs
        )
    model, info = loaded
    model.eval().requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(directory), list(info["missing_keys"])


def _refuse_missing(artifact_dir: Path, missing: list[str], emulated: dict[str, nn.Module]) -> None:
    """A parameter transformers found no tensor for is initialized randomly: only the ones inside a
    module about to be replaced (fused experts rebuilt from per-expert tensors) may be missing."""
    left = [key for key in missing if not any(key.startswith(f"{name}.") for name in emulated)]
    if left:
        raise InputError(
            artifact_dir,
            f"the artifact holds no tensor for {left[:5]}{' ...' if len(left) > 5 else ''}, which transformers "
            "would initialize randomly",
            "rebuild the artifact; if its tensors are stored under other names, their format needs support here",
        )


def _drop_decompression_hook(model: nn.Module) -> None:
    # compressed-tensors leaves a forward pre-hook that decompresses the model on its first
    # forward (ModelCompressor.add_decompress_hook); with every quantized module replaced it
    # has nothing left to do, and no forward should depend on it
    hook = getattr(model, "ct_decompress_hook", None)
    if hook is not None:
        hook.remove()
        del model.ct_decompress_hook


def _refuse_leftovers(artifact_dir: Path, model: nn.Module) -> None:
    """Nothing may still be compressed or quantized outside the modules quantgate built (emulated,
    or in a kernel's form: ``NativeFP8Linear``, ``NativeFP8Experts``)."""
    narrow = {torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.uint8, torch.int32}
    left = []
    for name, module in model.named_modules():
        if isinstance(module, EmulatedLinear | NativeFP8Linear | RoutedExperts):
            continue
        if getattr(module, "quantization_scheme", None) is not None:
            left.append(name)
        tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        left += [f"{name}.{t}" for t, value in tensors if value is not None and value.dtype in narrow]
    if left:
        raise InputError(
            artifact_dir,
            f"{left[:5]} are still quantized or compressed after every module with quantized tensors "
            "on disk was replaced",
            "rebuild the artifact; if it is intact, its format needs a weight decoder in quantgate.numerics",
        )


def _kv_scales_in_memory(
    artifact_dir: Path, model: nn.Module, on_disk: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The stored scales keyed by attention module name in memory; every attention module needs its pair."""
    rename = disk_to_memory(model)
    scales = {rename(name): pair for name, pair in on_disk.items()}
    modules = attention_modules(model, latent=True)
    missing = sorted(set(modules) - set(scales))
    if missing:
        raise InputError(
            artifact_dir,
            f"config.json declares a kv_cache_scheme but {missing[0]} has no k_scale/v_scale "
            f"({len(missing)} of {len(modules)} attention modules); vLLM would serve them at scale 1.0",
            "rebuild the artifact",
        )
    return {name: scales[name] for name in modules}


def _range(values: list[torch.Tensor]) -> tuple[float, float]:
    flat = torch.cat([v.reshape(-1) for v in values])
    return float(flat.min()), float(flat.max())


def _moe_notes(experts: list[RoutedExperts]) -> tuple[str, ...]:
    if not experts:
        return ()
    first = experts[0]
    native = sum(m.native for m in experts)
    computed = (
        "emulated per expert"
        if not native
        else "on the FP8 kernel, stacked (one grouped GEMM per projection on Hopper)"
        if native == len(experts)
        else f"{native} of them on the FP8 kernel and the others emulated per expert"
    )
    notes = [
        (
            f"experts: {len(experts)} MoE layers of {first.num_experts} experts {computed} "
            "(numerics/moe.py: vLLM fused-MoE order of roundings; routers bf16, as the source runs them)"
        )
    ]
    if sharding.is_cut(first):
        notes.append(
            f"experts: tensor parallel over {sharding.processes()} processes, each holding every expert's "
            f"slice of {first.intermediate} intermediate features, the layer's output summed in bf16"
        )
    if first.activation is not None and first.activation.needs_global_scale:
        notes.append(
            "experts: one NVFP4 input global scale per layer for gate/up and one for down (the smallest "
            "calibrated), as vLLM's FlashInfer NVFP4 MoE backends share them"
        )
    return (*notes, *dict.fromkeys(n for m in experts for n in m.notes))


@dataclass(frozen=True)
class _Kept:
    """A repaired variant's kept modules and how they compute (``weights`` None: unquantized)."""

    modules: frozenset[str]
    weights: WeightFormat | None
    activations: ActivationFormat | None
    declared_expects: dict[str, Any] | None
    note: str


def _kept_numerics(artifact_dir: Path, activations: bool) -> _Kept | None:
    """What a repaired variant's manifest says its kept layer groups compute in; None for a uniform artifact."""
    manifest = read_manifest(artifact_dir)
    repair = manifest.repair if manifest is not None else None
    if repair is None:
        return None
    note = (
        f"repair: {len(repair.kept_units)} of {repair.units_total} layer groups kept at {repair.upgrade} "
        f"({len(repair.kept_modules)} modules), each emulated in its own format"
    )
    if repair.numerics is None:
        return _Kept(frozenset(repair.kept_modules), None, None, None, note)
    declared = (
        None
        if repair.numerics.activations == ActivationNumerics.NONE
        else activation_format(repair.numerics.activations)
    )
    return _Kept(
        frozenset(repair.kept_modules),
        weight_format(repair.numerics.weights),
        declared if activations else None,
        declared.expects if declared is not None else None,
        note,
    )


KVScales = dict[str, tuple[torch.Tensor, torch.Tensor]]  # attention module -> (k_scale, v_scale)
ScaleRanges = tuple[tuple[float, float], tuple[float, float]]  # (smallest, largest) k_scale, then v_scale


@dataclass(frozen=True)
class _LoadPlan:
    """What an artifact is loaded as, checked against its config.json before a tensor is read:
    its numerics, the formats its modules are decoded in, and its KV cache."""

    artifact_dir: Path
    numerics: _Numerics
    weights: WeightFormat
    declared_activations: ActivationFormat | None  # what the target computes
    activations: ActivationFormat | None  # what is emulated (None: unquantized, on request or weight-only)
    kept: _Kept | None  # a repaired variant's modules in another format
    kv_scheme: dict[str, Any] | None  # config.json's kv_cache_scheme
    kv_name: str | None  # the FP8 KV format emulated; None: bf16
    kv_scales_on_disk: KVScales  # by the tensor names on disk


@dataclass(frozen=True)
class _Loaded:
    """The model as ``_apply`` left it, and what the description of its numerics needs."""

    model: nn.Module
    tokenizer: Any
    modules_replaced: int
    experts: tuple[RoutedExperts, ...]  # as the model holds them: emulated, or on the kernel
    generation_note: str
    kv_scales: KVScales | None  # by attention module in memory; None: none stored
    latent: bool  # multi-head latent attention: its FP8 cache is not emulated on prefill
    kv_layers: int
    native: NativeResult | None
    placement: offload.Placement | None  # layers held off the device (--max-memory); None: all on it


def load_for_eval(
    artifact_dir: Path,
    target: Target | None = None,
    *,
    activations: bool = True,
    kv_cache: bool = True,
    device: str | torch.device = "cpu",
    native: bool = True,
    max_memory: int | None = None,
) -> EvalModel:
    """The artifact as its target computes it (emulated). ``activations=False`` keeps the same
    weights with unquantized activations (the W*A16 view, for comparison); ``kv_cache=False``
    keeps the KV cache in bf16. On a CUDA device with FP8 tensor cores, FP8 W8A8 linears run on
    the hardware's kernel (``native.py``, mode ``native``) unless ``native=False``. ``max_memory``
    (bytes): the model is assembled on the CPU and the decoder layers past that budget on
    ``device`` are held off it (``offload``), with the same numbers.

    Three steps, each a value in and a value out: plan (what the artifact is, checked against
    its config), apply (decode, load, swap modules, install the KV cache, place on the device),
    describe (the report's account of what was computed)."""
    plan = _plan_load(Path(artifact_dir), target, activations=activations, kv_cache=kv_cache)
    with offload.said_when_too_large(plan.artifact_dir, device):
        loaded = _apply(plan, device, native=native, max_memory=max_memory)
    return EvalModel(model=loaded.model, tokenizer=loaded.tokenizer, numerics=_describe(plan, loaded, device))


def _plan_load(artifact_dir: Path, target: Target | None, *, activations: bool, kv_cache: bool) -> _LoadPlan:
    """The artifact's numerics and formats, refused where its config.json disagrees with them."""
    n = _resolve(artifact_dir, target)
    wfmt = weight_format(n.weights)
    declared_act = None if n.activations == ActivationNumerics.NONE else activation_format(n.activations)
    config_path = artifact_dir / "config.json"
    qconfig = quantization_config(artifact_dir)
    kept = _kept_numerics(artifact_dir, activations)
    primary_groups, kept_groups = split_groups(qconfig, kept.modules if kept is not None else frozenset())
    check_config(
        config_path,
        primary_groups,
        wfmt.disk_format,
        declared_act.expects if declared_act is not None else None,
    )
    if kept_groups.get("config_groups"):
        if kept is None or kept.weights is None:
            raise InputError(
                config_path,
                "config groups name modules a repair kept in the source's precision",
                "rebuild the variant with quantgate repair",
            )
        check_config(config_path, kept_groups, kept.weights.disk_format, kept.declared_expects)
    kv_scheme = kv_cache_scheme(artifact_dir, qconfig)
    if kv_scheme is not None and n.kv_cache == KVCache.BF16 and not n.kv_from_manifest:
        n = replace(n, kv_cache=KVCache.FP8_E4M3)  # no manifest: what the artifact declares is what it is
    if kv_scheme is not None and n.kv_cache == KVCache.BF16:
        raise InputError(
            config_path,
            f"config.json declares an FP8 KV cache but {n.target} is built with a bf16 KV cache",
            "rebuild the artifact: its KV cache and its manifest disagree",
        )
    stored = read_kv_scales(artifact_dir) if kv_scheme is not None else {}
    if kv_scheme is not None and not stored:
        raise InputError(
            config_path,
            "config.json declares a kv_cache_scheme but no k_scale/v_scale tensors are stored; vLLM would "
            "serve the FP8 KV cache at scale 1.0",
            "rebuild the artifact",
        )
    return _LoadPlan(
        artifact_dir=artifact_dir,
        numerics=n,
        weights=wfmt,
        declared_activations=declared_act,
        activations=declared_act if activations else None,
        kept=kept,
        kv_scheme=kv_scheme,
        kv_name=_kv_format_name(n) if kv_cache else None,
        kv_scales_on_disk=stored,
    )


_LAYER = re.compile(r"^(.*?\.\d+)\.")  # a module's decoder layer: the name up to its first index


def _by_layer(names: Iterable[str]) -> list[list[str]]:
    """Module names grouped by decoder layer (a MoE layer's experts together), in name order."""
    groups: dict[str, list[str]] = defaultdict(list)
    for name in sorted(names):
        match = _LAYER.match(name)
        groups[match[1] if match else name].append(name)
    return list(groups.values())


def _decode_layer(
    plan: _LoadPlan,
    raw: dict[str, dict[str, torch.Tensor]],
    skeleton: nn.Module,
    rename: Callable[[str], str],
    sliced: bool,
    native: bool,
    device: str | torch.device,
) -> dict[str, nn.Module]:
    """One layer's quantized modules (``raw``: its tensors), each in the target's format (a repaired
    variant's kept modules in theirs) and, on a device with the kernel, in the kernel's form. A
    function of its own so that the layer's raw tensors and float32 decode are freed on return."""
    kept = plan.kept
    formats = [(plan.weights, plan.activations, [m for m in raw if kept is None or m not in kept.modules])]
    if kept is not None and kept.weights is not None:
        formats.append((kept.weights, kept.activations, [m for m in raw if m in kept.modules]))
    modules: dict[str, nn.Module] = {}
    for weights, activations, chosen in formats:
        built = emulated_modules(
            plan.artifact_dir,
            {m: raw[m] for m in chosen},
            weights,
            activations,
            skeleton,
            rename,
            sliced=sliced,
        )
        modules.update(to_kernel(built, device) if native else built)
    return modules


def _apply(plan: _LoadPlan, device: str | torch.device, *, native: bool, max_memory: int | None) -> _Loaded:
    """The model with every quantized module decoded and swapped in, its KV cache emulated and
    placed on ``device`` (FP8 W8A8 linears on the hardware's kernel where it has one). Under a
    ``max_memory`` budget every module is built on the CPU first and placed last (``_place``)."""
    artifact_dir = plan.artifact_dir
    build_on = "cpu" if max_memory is not None else device
    skeleton = meta_skeleton(artifact_dir)
    rename = disk_to_memory(skeleton)
    # in a group, each rank reads its slice of every module the plan cuts (a 70B decoded whole, or
    # a 235B MoE's experts, is more than one GPU holds)
    slicer = sharding.slicer(lambda name: read_style(skeleton, name), rename)
    index = quantized_index(artifact_dir)
    if not index:
        raise InputError(
            artifact_dir,
            "no quantized tensors (weight_scale / weight_packed) found",
            "evaluate a built artifact",
        )
    # everything is decoded and matched against a meta-device skeleton first, so a mismatch is
    # reported as such rather than as whatever transformers makes of unexpected tensors; layer by
    # layer, each layer read, decoded and put in its kernel's form where the device has one
    # (``to_kernel``) before the next is read: neither the raw bytes nor the float32 decode of the
    # whole model is ever held at once
    sliced = slicer is not None
    emulated: dict[str, nn.Module] = {}
    for names in _by_layer(index):
        raw = read_modules({name: index[name] for name in names}, build_on, slicer)
        emulated.update(_decode_layer(plan, raw, skeleton, rename, sliced, native, device))
        del raw  # before the next layer is read, not after
    model, tokenizer, missing = _load_hf(artifact_dir, build_on)
    generation_note = pin_greedy(model)
    _refuse_missing(artifact_dir, missing, emulated)
    for name, module in emulated.items():
        sharding.replace(model, name, module)
    _drop_decompression_hook(model)
    _refuse_leftovers(artifact_dir, model)
    stored = plan.kv_scales_on_disk
    scales = _kv_scales_in_memory(artifact_dir, model, stored) if stored else None
    latent = plan.kv_name is not None and latent_attention(model)
    kv_layers = _install_kv(plan, model, scales, device) if plan.kv_name is not None and not latent else 0
    model.to(build_on)
    use_float32_gemm(model, device)
    ran_native = apply_native(model, device) if native else None
    return _Loaded(
        model=model,
        tokenizer=tokenizer,
        modules_replaced=len(index),
        # from the model, not ``emulated``: an expert layer on the kernel replaced its emulated one,
        # whose float32 weights must not stay referenced
        experts=tuple(m for m in model.modules() if isinstance(m, RoutedExperts)),
        generation_note=generation_note,
        kv_scales=scales,
        latent=latent,
        kv_layers=kv_layers,
        native=ran_native,
        placement=_place(model, device, max_memory),
    )


def _place(model: nn.Module, device: str | torch.device, max_memory: int | None) -> offload.Placement | None:
    """A model assembled on the CPU under a ``max_memory`` budget, dispatched onto ``device``: the
    placement, or None where everything fits (then it is simply moved there)."""
    if max_memory is None:
        return None
    if sharding.current() is not None:
        raise UsageError(
            "--max-memory", "offloading is not combined with --devices above 1", "pass one of the two"
        )
    placement = offload.plan(model, device, max_memory)
    if placement is None:
        model.to(device)
    else:
        offload.place(model, placement, device)
    return placement


def _install_kv(
    plan: _LoadPlan, model: nn.Module, scales: KVScales | None, device: str | torch.device
) -> int:
    """The FP8 KV cache's hooks on every attention layer, at the stored scales; the layers hooked."""
    assert plan.kv_name is not None
    try:
        # the hooks hold the scales outside the module tree, so model.to(device) would not move them
        on_device = {k: (a.to(device), b.to(device)) for k, (a, b) in scales.items()} if scales else scales
        return install_kv_cache(model, kv_cache_format(plan.kv_name), on_device)
    except ValueError as exc:
        raise InputError(
            plan.artifact_dir, f"cannot emulate the FP8 KV cache: {exc}", "pass kv_cache=False"
        ) from None


def _kv_description(plan: _LoadPlan, loaded: _Loaded, ranges: ScaleRanges | None) -> tuple[str, str]:
    """The report's KV column (format, calibrated or not, the stored scales' ``ranges``) and its note."""
    kv_name, scales, n = plan.kv_name, loaded.kv_scales, plan.numerics
    if kv_name is None:
        note = (
            f"KV cache: bf16 on request (the target stores {n.kv_cache.value})"
            if n.kv_cache != KVCache.BF16
            else "KV cache: bf16"
        )
        return "bf16", note
    if ranges is not None:
        k_range, v_range = ranges
        report = (
            f"{kv_name}, calibrated per-tensor scales (k {k_range[0]:.3g}-{k_range[1]:.3g}, "
            f"v {v_range[0]:.3g}-{v_range[1]:.3g})"
        )
    else:
        report = f"{kv_name}, scale 1.0 (uncalibrated: no kv_cache_scheme in the artifact)"
    if loaded.latent:
        # vLLM's MLA caches one latent (kv_c_normed, k_pe) per token; its prefill expands the new
        # tokens' fresh latents and reads the FP8 cache only for context already cached (decode,
        # prefix hits): attention/backends/mla/common.py, _forward_prefill
        return f"{report}; latent (MLA): read only when decoding, not emulated", (
            f"KV cache: multi-head latent attention stores its latent in {kv_name}; teacher-forced "
            "scoring is a prefill, which attends over the fresh bf16 latents as vLLM's MLA prefill does, "
            "but decoding steps of generation suites read bf16 latents here, not the FP8 cache"
        )
    note = kv_cache_format(kv_name).note + (
        "; applied after RoPE to K and V at each layer's stored k_scale / v_scale"
        if scales
        else "; applied after RoPE to K and V at scale 1.0: the artifact declares no calibrated scales"
    )
    return report, note


def _ranges(scales: KVScales) -> ScaleRanges:
    return _range([k for k, _ in scales.values()]), _range([v for _, v in scales.values()])


def _activation_note(plan: _LoadPlan) -> str:
    if plan.activations is not None:
        return plan.activations.note
    if plan.declared_activations is not None:
        return (
            f"activations: left unquantized on request; this is the weight-only view of the artifact, "
            f"not what {plan.numerics.hardware} computes ({plan.declared_activations.name})"
        )
    return "activations: none (weight-only format), bf16 inputs multiplied in fp32"


def _describe(plan: _LoadPlan, loaded: _Loaded, device: str | torch.device) -> NumericsReport:
    """What the loaded model computes, module by module, for the report."""
    n, kv_name, ran_native = plan.numerics, plan.kv_name, loaded.native
    ranges = _ranges(loaded.kv_scales) if kv_name is not None and loaded.kv_scales else None
    kv_report, kv_note = _kv_description(plan, loaded, ranges)
    k_range, v_range = ranges if ranges is not None else (None, None)
    linears: dict[str, Literal["native", "emulated"]] = {
        name: "native" if m.native else "emulated"
        for name, m in loaded.model.named_modules()
        if isinstance(m, NativeFP8Linear | EmulatedLinear | RoutedExperts)
    }
    return NumericsReport(
        target=n.target,
        hardware=n.hardware,
        weights=plan.weights.name,
        activations=plan.activations.name if plan.activations is not None else "none",
        kv_cache=kv_report,
        mode="native" if ran_native is not None and ran_native.whole else "emulated",
        device=str(device),
        native_on=n.native_on,
        linears=linears,
        modules_replaced=loaded.modules_replaced,
        moe_layers=len(loaded.experts),
        kv_cache_layers=loaded.kv_layers,
        kv_cache_format=kv_name or "bf16",
        kv_cache_scheme=plan.kv_scheme.get("strategy") if plan.kv_scheme is not None else None,
        kv_cache_calibrated=(loaded.kv_scales is not None) if kv_name is not None else None,
        k_scale_range=k_range,
        v_scale_range=v_range,
        tensor_parallel=sharding.processes(),
        offloaded_layers=loaded.placement.offloaded if loaded.placement is not None else 0,
        notes=(
            *sharding.notes(),
            *((loaded.placement.note,) if loaded.placement is not None else ()),
            ran_native.note if ran_native is not None else _ACCUMULATION_NOTE,
            plan.weights.note,
            _activation_note(plan),
            kv_note
            + ("; its FP8 rounding stays emulated" if ran_native is not None and loaded.kv_layers else ""),
            *_moe_notes(list(loaded.experts)),
            *((plan.kept.note,) if plan.kept is not None else ()),
            loaded.generation_note,
        ),
    )


def load_source_for_eval(
    checkpoint_dir: Path, *, device: str | torch.device = "cpu", max_memory: int | None = None
) -> EvalModel:
    """The source checkpoint in bf16, as the reference every artifact is compared with
    (``max_memory``: as ``load_for_eval``'s)."""
    build_on = "cpu" if max_memory is not None else device
    with offload.said_when_too_large(Path(checkpoint_dir), device):
        model, tokenizer, _ = _load_hf(Path(checkpoint_dir), build_on)  # intake checked its tensors
        generation_note = pin_greedy(model)
        model.to(build_on)
        widened = use_float32_gemm(model, device)
        placement = _place(model, device, max_memory)
    return EvalModel(
        model=model,
        tokenizer=tokenizer,
        numerics=NumericsReport(
            target="source",
            hardware="any",
            weights="bf16",
            activations="bf16",
            kv_cache="bf16",
            mode="source",
            device=str(device),
            tensor_parallel=sharding.processes(),
            offloaded_layers=placement.offloaded if placement is not None else 0,
            notes=(
                *sharding.notes(),
                *((placement.note,) if placement is not None else ()),
                "source: bf16 weights and activations, transformers' own modules"
                + (f"; {widened} linears' bf16 GEMMs accumulate in float32 on the CPU" if widened else ""),
                generation_note,
            ),
        ),
    )
