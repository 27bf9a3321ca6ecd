"""vLLM's load-time rules for compressed-tensors checkpoints, one function per rule.

Each rule is registered with the vLLM source it reproduces (file under ``vllm/`` and function,
as read in ``releases.RELEASES_READ``) and yields ``(layer, reason)`` for every layer that
breaks it; artifact rules read the checkpoint alone, deployment rules also a release and a TP
size. Some rules guard numerics rather than loading, because the gate's verdict holds only for
what was evaluated: a missing KV scale and fused shards' unequal global scales load in vLLM,
but with other numbers than the evaluation used; missing tensors would be uninitialized memory.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from quantgate.serving.kernels import PLATFORMS, Platform, Shard, choose
from quantgate.serving.layout import MLA_ROLES, Layer, Layout, expected_nk, is_latent_projection
from quantgate.serving.schemes import (
    Group,
    Scheme,
    Unsupported,
    expected_params,
    groups_of,
    logical_nk,
    scheme_of,
)

Finding = tuple[str, str]  # (layer, reason)
CT = "model_executor/layers/quantization/compressed_tensors"
V33 = "vllm 0.33.0"


@dataclass
class Artifact:
    """What the rules read: the layout, vLLM's config groups and each layer's scheme and [N, K]."""

    layout: Layout
    groups: list[Group] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    schemes: dict[str, Group | None] = field(
        default_factory=dict
    )  # layer -> matched group (None: unquantized)
    nk: dict[str, tuple[int, int] | None] = field(default_factory=dict)

    @classmethod
    def of(cls, layout: Layout) -> Artifact:
        """Resolve every layer's scheme and logical shape once."""
        quant = layout.quantization or {}
        art = cls(layout, groups_of(quant) if quant else [], list(quant.get("ignore") or []))
        for name, layer in layout.layers.items():
            group = scheme_of(layer, art.groups, art.ignore) if quant else None
            art.schemes[name] = group
            scheme = group.scheme if group is not None and isinstance(group.scheme, Scheme) else None
            art.nk[name] = logical_nk(layer, scheme, expected_nk(layer, layout.dims))
        return art

    def scheme(self, name: str) -> Scheme | None:
        """The modeled scheme of a layer (None: unquantized, or a scheme the rules refuse elsewhere)."""
        group = self.schemes.get(name)
        return group.scheme if group is not None and isinstance(group.scheme, Scheme) else None


@dataclass(frozen=True)
class Deployment:
    """One (release, TP size) of a target's contract, on the platforms the target runs on."""

    version: str
    tp: int
    platforms: tuple[Platform, ...]


@dataclass(frozen=True)
class Rule:
    """A registered rule: its name, the engine source it reproduces, and whether it takes a deployment."""

    name: str
    source: str
    fn: Callable[..., Iterator[Finding]]
    per_deployment: bool


RULES: list[Rule] = []


def rule(name: str, source: str, *, per_deployment: bool = False):
    """Register a rule: one function, the engine source it reproduces."""

    def register(fn: Callable[..., Iterator[Finding]]) -> Callable[..., Iterator[Finding]]:
        RULES.append(Rule(name, source, fn, per_deployment))
        return fn

    return register


def natural(name: str) -> list[object]:
    """Sort key that puts layers.2 before layers.10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _layers(art: Artifact) -> list[Layer]:
    return sorted(art.layout.layers.values(), key=lambda layer: natural(layer.name))


# ----------------------------------------------------------------------------- artifact rules


@rule("quant-method", f"{V33} config/model.py:ModelConfig._verify_quantization")
def quant_method(art: Artifact) -> Iterator[Finding]:
    """``quant_method`` is read unconditionally; only compressed-tensors is reproduced here."""
    quant = art.layout.quantization
    if quant is None:
        yield "config.json", "no quantization_config: vLLM would load the quantized tensors as plain weights"
    elif quant.get("quant_method") != "compressed-tensors":
        yield (
            "config.json",
            (
                f"quant_method {quant.get('quant_method')!r}: quantgate reproduces vLLM's "
                "compressed-tensors loader only"
            ),
        )


@rule("sparsity", f"{V33} {CT}/compressed_tensors.py:CompressedTensorsConfig._parse_sparsity_config")
def sparsity(art: Artifact) -> Iterator[Finding]:
    """A sparsity config with targets raises: sparsity support was removed."""
    sparse = (art.layout.quantization or {}).get("sparsity_config") or {}
    if isinstance(sparse, dict) and sparse.get("targets"):
        yield "config.json", "sparsity_config has targets: vLLM 0.33.0 raises (sparsity support removed)"


@rule(
    "actorder",
    f"{V33} {CT}/compressed_tensors.py:CompressedTensorsConfig._quantization_scheme_map_from_config",
)
def actorder(art: Artifact) -> Iterator[Finding]:
    """``actorder: group|dynamic`` is refused (static is accepted)."""
    for group in art.groups:
        if isinstance(group.scheme, Unsupported) and group.scheme.rule == "actorder":
            yield (
                f"config.json ({group.name})",
                (
                    f"{group.scheme.reason} is no longer supported by vLLM 0.33.0 (older releases load it through "
                    "g_idx, which quantgate does not reproduce); quantize with actorder static or none"
                ),
            )


@rule("scheme", f"{V33} {CT}/compressed_tensors.py:CompressedTensorsConfig._get_scheme_from_parts")
def scheme_accepted(art: Artifact) -> Iterator[Finding]:
    """Every quantized layer maps to a scheme vLLM builds (W4A16 needs format pack-quantized)."""
    for layer in _layers(art):
        group = art.schemes.get(layer.name)
        if group is not None and isinstance(group.scheme, Unsupported) and group.scheme.rule == "scheme":
            yield layer.name, f"config group {group.name}: {group.scheme.reason}"


@rule(
    "kv-cache-scheme",
    f"{V33} {CT}/compressed_tensors.py:CompressedTensorsKVCacheMethod.validate_kv_cache_scheme",
)
def kv_cache_scheme(art: Artifact) -> Iterator[Finding]:
    """A declared KV scheme must be 8-bit float, tensor or attn_head strategy, symmetric."""
    kv = (art.layout.quantization or {}).get("kv_cache_scheme")
    if not kv:
        return
    if kv.get("type") != "float" or kv.get("num_bits") != 8:
        yield (
            "config.json",
            f"kv_cache_scheme is {kv.get('num_bits')}-bit {kv.get('type')}: only 8-bit float loads",
        )
    elif kv.get("strategy") not in ("tensor", "attn_head"):
        yield "config.json", f"kv_cache_scheme strategy {kv.get('strategy')!r}: only tensor or attn_head load"
    elif not kv.get("symmetric"):
        yield "config.json", "kv_cache_scheme is asymmetric: only symmetric KV scales load"


@rule("kv-scales", f"{V33} {CT}/compressed_tensors.py:CompressedTensorsKVCacheMethod.create_weights")
def kv_scales(art: Artifact) -> Iterator[Finding]:
    """With a KV scheme, every attention layer needs its k_scale and v_scale (else vLLM uses 1.0)."""
    kv = (art.layout.quantization or {}).get("kv_cache_scheme")
    if not kv:
        return
    dims = art.layout.dims
    per_head = kv.get("strategy") == "attn_head"
    numel = dims.kv_heads if per_head else 1
    attention = {
        layer.block: layer.name.rsplit(".", 1)[0]
        for layer in _layers(art)
        if layer.role in ("q", "k", "v", "o", *MLA_ROLES) and layer.block is not None
    }
    for block, where in sorted(attention.items()):
        scales = art.layout.kv_scales.get(block, {})
        for param in ("k_scale", "v_scale"):
            t = scales.get(param)
            if t is None:
                yield (
                    where,
                    (
                        f"no {param}: the checkpoint declares an FP8 KV cache, and vLLM would serve it "
                        "with scale 1.0, not the calibrated scale the gate evaluated"
                    ),
                )
            elif numel is not None and t.numel != numel:
                yield where, f"{param} has {t.numel} values, the {kv.get('strategy')} KV scheme needs {numel}"


@rule("fused-shards-ignore", f"{V33} {CT}/utils.py:should_ignore_layer")
def fused_shards_ignore(art: Artifact) -> Iterator[Finding]:
    """The ignore list takes all shards of a fused layer (q/k/v, gate/up, an MoE's experts) or none."""
    for fused, shards in sorted(art.layout.by_fused().items(), key=lambda kv: natural(kv[0])):
        if len(shards) < 2:
            continue
        quantized = {s.name: art.schemes.get(s.name) is not None for s in shards}
        if any(quantized.values()) and not all(quantized.values()):
            left = sorted((n for n, q in quantized.items() if not q), key=natural)
            yield (
                fused,
                (
                    f"{len(left)} of {len(shards)} shards are unquantized (e.g. {left[0]}): vLLM requires "
                    "one scheme for all shards of a fused layer"
                ),
            )


@rule(
    "fused-shards-scheme",
    f"{V33} {CT}/compressed_tensors_moe/compressed_tensors_moe.py:get_moe_method; "
    f"{CT}/utils.py:find_matched_target",
)
def fused_shards_scheme(art: Artifact) -> Iterator[Finding]:
    """All quantized shards of a fused layer have one scheme: vLLM builds the fused layer from one shard's."""
    for fused, shards in sorted(art.layout.by_fused().items(), key=lambda kv: natural(kv[0])):
        found: dict[str, list[str]] = {}
        for shard in shards:
            group = art.schemes.get(shard.name)
            if group is not None and isinstance(group.scheme, Scheme):
                found.setdefault(_args_key(group.scheme), []).append(group.name)
        if len(found) > 1:
            names = sorted({name for names in found.values() for name in names})
            yield fused, f"its shards are quantized differently (config groups {', '.join(names)})"


def _args_key(scheme: Scheme) -> str:
    """What vLLM compares: the weight and input args and the format."""
    inputs = scheme.inputs.model_dump_json() if scheme.inputs is not None else "none"
    return f"{scheme.weights.model_dump_json()}|{inputs}|{scheme.format}"


@rule(
    "layers-complete", f"{V33} model_executor/model_loader/default_loader.py:DefaultModelLoader.load_weights"
)
def layers_complete(art: Artifact) -> Iterator[Finding]:
    """Every decoder layer has its attention (q/k/v/o, or MLA's) and a whole MLP (every expert);
    lm_head unless tied.

    For a quantized model vLLM does not check that every parameter came from the checkpoint
    (``load_weights`` tracks weights only for unquantized models): it would serve uninitialized
    memory. Multi-head latent attention (models/deepseek_v2.py ``DeepseekV2MLAAttention``) has
    q_a_proj, q_a_layernorm and q_b_proj (one q_proj when ``q_lora_rank`` is null),
    kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj and o_proj.
    """
    dims = art.layout.dims
    attention = ["q", "k", "v", "o"]
    norms: list[str] = []
    if dims.latent is not None:
        q_lora = dims.latent.q_lora_rank is not None
        attention = ["q_a", "q_b", "kv_a", "kv_b", "o"] if q_lora else ["q", "kv_a", "kv_b", "o"]
        norms = ["q_a_layernorm", "kv_a_layernorm"] if q_lora else ["kv_a_layernorm"]
    by_block: dict[int, list[Layer]] = {}
    for layer in art.layout.layers.values():
        if layer.block is not None:
            by_block.setdefault(layer.block, []).append(layer)
    if not by_block:
        return
    # the decoder layers' prefix ("model.layers"), from a layer inside one (lm_head sorts first)
    inside = next(layer.name for layer in art.layout.layers.values() if layer.block is not None)
    prefix = re.sub(r"\.layers\.\d+\..*$", ".layers", inside)
    for block in range(dims.layers or (max(by_block) + 1)):
        layers = by_block.get(block, [])
        roles = {layer.role for layer in layers}
        missing = [r for r in attention if r not in roles]
        missing += [n for n in norms if f"{prefix}.{block}.self_attn.{n}.weight" not in art.layout.others]
        experts = [layer for layer in layers if layer.expert is not None]
        if experts and dims.experts:
            for index in range(dims.experts):
                have = {layer.role for layer in experts if layer.expert == index}
                missing += [
                    f"expert {index} {r}" for r in ("gate", "up", "down") if f"expert-{r}" not in have
                ]
        elif not experts:
            missing += [r for r in ("gate", "up", "down") if r not in roles]
        if missing:
            yield (
                f"{prefix}.{block}",
                (
                    f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}: "
                    "vLLM would serve uninitialized memory for them"
                ),
            )
    if not dims.tied and not any(layer.role == "lm_head" for layer in art.layout.layers.values()):
        yield "lm_head", "no lm_head weight and tie_word_embeddings is false"


def _expected(art: Artifact, layer: Layer):
    """The parameters the engine creates for ``layer`` (None when its scheme or shape is unknown)."""
    group = art.schemes.get(layer.name)
    if group is not None and not isinstance(group.scheme, Scheme):
        return None
    nk = art.nk.get(layer.name)
    if nk is None:
        return None
    return expected_params(art.scheme(layer.name), *nk)


@rule("tensors-present", f"{V33} {CT}/schemes/*.py:create_weights (the parameters each scheme registers)")
def tensors_present(art: Artifact) -> Iterator[Finding]:
    """Every parameter the layer's scheme creates is in the checkpoint."""
    for layer in _layers(art):
        group = art.schemes.get(layer.name)
        if group is not None and not isinstance(group.scheme, Scheme):
            continue  # refused by the scheme rule
        if art.nk.get(layer.name) is None:
            scheme = art.scheme(layer.name)
            primary = "weight" if scheme is None or scheme.kind == "fp8" else "weight_packed"
            yield layer.name, f"no 2-D {primary}: the {_kind(art, layer)} layer has nothing to load"
            continue
        missing = sorted(set(_expected(art, layer) or {}) - set(layer.tensors))
        if missing:
            yield layer.name, f"{_kind(art, layer)} layer without {', '.join(missing)}"


@rule(
    "tensors-unexpected",
    f"{V33} model_executor/models/utils.py:AutoWeightsLoader._load_module "
    "('There is no module or parameter named')",
)
def tensors_unexpected(art: Artifact) -> Iterator[Finding]:
    """A tensor the layer's scheme has no parameter for cannot be loaded (bias is optional)."""
    for layer in _layers(art):
        expected = _expected(art, layer)
        if expected is None:
            continue
        extra = sorted(set(layer.tensors) - set(expected) - {"bias"})
        if extra:
            yield (
                layer.name,
                f"{_kind(art, layer)} layer carries {', '.join(extra)}, which it has no parameter for",
            )


@rule("tensor-dtype", f"{V33} {CT}/schemes/*.py:create_weights (parameter dtypes)")
def tensor_dtype(art: Artifact) -> Iterator[Finding]:
    """Each tensor has the dtype its parameter holds (scales: any float, which the loader casts)."""
    for layer in _layers(art):
        for param, want in (_expected(art, layer) or {}).items():
            t = layer.tensors.get(param)
            if t is not None and t.dtype not in want.dtypes:
                yield (
                    layer.name,
                    f"{param} is {t.dtype}, the {_kind(art, layer)} scheme loads {'/'.join(want.dtypes)}",
                )


@rule("tensor-shape", f"{V33} model_executor/parameter.py:BasevLLMParameter weight loaders (shape asserts)")
def tensor_shape(art: Artifact) -> Iterator[Finding]:
    """Each tensor has the shape the engine allocates from config.json and the scheme."""
    dims = art.layout.dims
    for layer in _layers(art):
        nk, want_nk = art.nk.get(layer.name), expected_nk(layer, dims)
        if nk is not None and any(w is not None and w != h for w, h in zip(want_nk, nk, strict=True)):
            yield layer.name, f"holds [N, K] = {list(nk)} but config.json makes it {list(want_nk)}"
            continue
        for param, want in (_expected(art, layer) or {}).items():
            t = layer.tensors.get(param)
            if t is None:
                continue
            if want.shape is not None and t.shape != want.shape:
                yield layer.name, f"{param} has shape {list(t.shape)}, the scheme needs {list(want.shape)}"
            elif want.shape is None and t.numel != want.numel:
                yield layer.name, f"{param} has {t.numel} values, the scheme needs {want.numel}"


@rule(
    "nvfp4-global-scales",
    f"{V33} {CT}/schemes/compressed_tensors_w4a4_nvfp4.py:process_weights_after_loading; "
    f"{CT}/compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py:process_weights_after_loading",
)
def nvfp4_global_scales(art: Artifact) -> Iterator[Finding]:
    """Fused NVFP4 shards share their global scales: vLLM serves one (the max; w1's for experts)."""
    for fused, shards in sorted(art.layout.by_fused().items(), key=lambda kv: natural(kv[0])):
        nvfp4 = [s for s in shards if (sch := art.scheme(s.name)) is not None and sch.kind == "nvfp4"]
        if len(nvfp4) < 2:
            continue
        units = (
            [nvfp4]
            if nvfp4[0].expert is None
            else [
                [s for s in nvfp4 if s.expert == e and s.role in ("expert-gate", "expert-up")]
                for e in sorted({s.expert for s in nvfp4 if s.expert is not None})
            ]
        )
        for unit in units:
            for param in ("weight_global_scale", "input_global_scale"):
                tensors = [s.tensors[param] for s in unit if param in s.tensors]
                if len(tensors) < 2 or any(t.dtype != "F32" or t.numel != 1 for t in tensors):
                    continue  # absent or malformed: other rules say so
                values = {t.scalars()[0] for t in tensors}
                if len(values) > 1:
                    where = fused if unit[0].expert is None else f"{fused}.{unit[0].expert}"
                    yield (
                        where,
                        (
                            f"shards' {param} differ ({', '.join(f'{v:.6g}' for v in sorted(values))}): vLLM "
                            "loads them with one shared scale, not the per-shard scales the gate evaluated"
                        ),
                    )


MLA_DIMS = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@rule(
    "mla-config",
    f"{V33} model_executor/models/deepseek_v2.py:DeepseekV2DecoderLayer.__init__ "
    "(getattr(config, ..., 0); use_mha); DeepseekV2MLAAttention.__init__",
)
def mla_config(art: Artifact) -> Iterator[Finding]:
    """A checkpoint with latent attention projections states the sizes vLLM builds them from.

    vLLM reads ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim``
    from the config (0 where absent, or transformers' class default), and with no positive head
    dims builds ordinary attention (``use_mha``: q/k/v_proj), which nothing in this checkpoint
    loads into. Without them quantgate cannot check the layers' shapes either.
    """
    latent = [layer for layer in _layers(art) if is_latent_projection(layer.name)]
    if not latent:
        return
    text = art.layout.config.get("text_config") or art.layout.config
    bad = [
        k
        for k in MLA_DIMS
        if not (isinstance(text.get(k), int) and not isinstance(text.get(k), bool) and text[k] > 0)
    ]
    if bad:
        yield (
            "config.json",
            (
                f"the checkpoint has latent attention ({latent[0].name}) but config.json does not give "
                f"{', '.join(bad)} as positive integers: vLLM would build its layers from other sizes"
            ),
        )


E4M3_MAX = 448.0
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _e4m3(x: float) -> float:
    """float32 -> e4m3fn, saturating at 448 (the conversions vLLM's quantization kernels use)."""
    import torch

    return float(torch.tensor(min(x, E4M3_MAX), dtype=torch.float32).to(torch.float8_e4m3fn).float())


def _e2m1(x: float) -> float:
    """Non-negative float -> e2m1, nearest, ties to the even code, saturating at 6."""
    x = min(x, 6.0)
    best = min(range(len(_E2M1)), key=lambda i: (abs(_E2M1[i] - x), i % 2))
    return _E2M1[best]


def identity_roundtrip(scheme: Scheme, layer: Layer) -> float | None:
    """What 1.0 comes back as through the layer's static input quantization (None: no static scale).

    NVFP4 (``scaled_fp4_quant``): a block holding one 1.0 gets the scale e4m3(G / 6) under the
    stored global scale G, the value e2m1(G / scale), dequantized by scale / G. FP8 with a static
    ``input_scale`` s: e4m3(1 / s) * s. Dynamic per-token FP8 maps a row's largest value to the
    top of the grid exactly, so it returns 1.0 up to float32 rounding and is not checked.
    """
    import torch

    if scheme.inputs is None:
        return None
    name = "input_global_scale" if scheme.kind == "nvfp4" else "input_scale"
    t = layer.tensors.get(name)
    if scheme.kind not in ("nvfp4", "fp8") or t is None or t.dtype != "F32" or t.numel != 1:
        return None  # no static scale, or a malformed one that other rules name
    value = torch.tensor(t.scalars()[0], dtype=torch.float32)
    if scheme.kind == "fp8":
        return _e4m3(float(1.0 / value)) * float(value)
    block = _e4m3(float(value * (1.0 / 6.0)))
    if block == 0.0 or not math.isfinite(float(value)):
        return 0.0
    q = _e2m1(float(1.0 / (torch.tensor(block) * (1.0 / value))))
    return q * block / float(value)


@rule(
    "mla-kv-b-dequant",
    f"{V33} model_executor/layers/attention/mla_attention.py:MLAAttention.process_weights_after_loading "
    "(split_kv_b_proj); model_executor/layers/quantization/utils/quant_utils.py:get_and_maybe_dequant_weights",
)
def mla_kv_b_dequant(art: Artifact) -> Iterator[Finding]:
    """A quantized ``kv_b_proj`` must give its weights back exactly when vLLM runs it on an identity.

    MLA decodes with W_UK and W_UV absorbed from ``kv_b_proj``; a compressed-tensors layer has no
    dequantization vLLM knows, so ``get_and_maybe_dequant_weights`` multiplies an identity matrix
    through the layer's own scheme ("quantizing 1.0 may lead to over/underflows"). With static
    input quantization (NVFP4 W4A4's input_global_scale on Blackwell, static FP8) 1.0 comes back
    as e4m3 rounding allows: every decode step would use weights scaled by that factor (the
    key's non-rotary logits and the values), which the gate, running the layer as prefill does,
    never evaluated. Unquantized, weight-only or dynamic per-token FP8 layers come back exact.
    """
    for layer in _layers(art):
        scheme = art.scheme(layer.name)
        if layer.role != "kv_b" or scheme is None:
            continue
        back = identity_roundtrip(scheme, layer)
        if back is not None and abs(back - 1.0) > 2.0**-20:
            yield (
                layer.name,
                (
                    f"its {scheme.kind} input quantization returns 1.0 as {back:.6g}: decoding would use "
                    f"kv_b_proj's weights x{back:.6g}, not those evaluated; keep kv_b_proj unquantized "
                    "(the recipe's ignore list) or quantize its inputs dynamically"
                ),
            )


def _kind(art: Artifact, layer: Layer) -> str:
    scheme = art.scheme(layer.name)
    return "unquantized" if scheme is None else scheme.kind


# --------------------------------------------------------------------------- deployment rules


def _attention_site(art: Artifact) -> str:
    first = next((layer for layer in _layers(art) if layer.role == "q"), None)
    return first.name.rsplit(".", 1)[0] if first else "config.json"


@rule(
    "attention-heads",
    "vllm 0.23.0-0.33.0 config/model.py:ModelConfig.verify_with_parallel_config",
    per_deployment=True,
)
def attention_heads(art: Artifact, d: Deployment) -> Iterator[Finding]:
    """The attention heads split evenly over the TP ranks."""
    heads = art.layout.dims.heads
    if heads and heads % d.tp:
        yield _attention_site(art), f"{heads} attention heads are not divisible by TP {d.tp}"


@rule(
    "kv-heads",
    "vllm 0.23.0-0.33.0 model_executor/models/llama.py:LlamaAttention.__init__; "
    "model_executor/layers/linear.py:QKVParallelLinear",
    per_deployment=True,
)
def kv_heads(art: Artifact, d: Deployment) -> Iterator[Finding]:
    """KV heads split over the ranks, or (fewer heads than ranks) each is replicated on TP/kv ranks."""
    kv = art.layout.dims.kv_heads
    if not kv:
        return
    if kv >= d.tp and kv % d.tp:
        yield _attention_site(art), f"{kv} KV heads are not divisible by TP {d.tp}"
    elif kv < d.tp and d.tp % kv:
        yield _attention_site(art), f"TP {d.tp} is not a multiple of the {kv} KV heads it would replicate"


def _shaped_layers(art: Artifact) -> Iterator[tuple[Layer, tuple[int, int]]]:
    """Each layer whose logical [N, K] is known, with it, in natural order."""
    for layer in _layers(art):
        nk = art.nk.get(layer.name)
        if nk is not None:
            yield layer, nk


@rule(
    "row-parallel-split",
    f"{V33} model_executor/layers/linear.py:RowParallelLinear.__init__ (divide)",
    per_deployment=True,
)
def row_parallel_split(art: Artifact, d: Deployment) -> Iterator[Finding]:
    """A row-parallel layer's (o_proj, down_proj) input features split evenly over the ranks."""
    for layer, (_, k) in _shaped_layers(art):
        if layer.parallel == "row" and k % d.tp:
            yield layer.name, f"input features {k} are not divisible by TP {d.tp}"


@rule(
    "column-parallel-split",
    f"{V33} model_executor/layers/linear.py:MergedColumnParallelLinear.__init__ (divide)",
    per_deployment=True,
)
def column_parallel_split(art: Artifact, d: Deployment) -> Iterator[Finding]:
    """A merged column-parallel layer's shards (gate/up) split their output features evenly (q/k/v: the head rules)."""
    for layer, (n, _) in _shaped_layers(art):
        if layer.parallel == "column" and layer.role not in ("q", "k", "v") and n % d.tp:
            yield layer.name, f"output features {n} are not divisible by TP {d.tp}"


@rule(
    "moe-intermediate-split",
    f"{V33} model_executor/layers/fused_moe/config.py:FusedMoEConfig (intermediate_size // tp_size)",
    per_deployment=True,
)
def moe_intermediate_split(art: Artifact, d: Deployment) -> Iterator[Finding]:
    """Each expert's intermediate size splits evenly over the ranks (tensor parallelism, no expert parallelism)."""
    for layer, (_, k) in _shaped_layers(art):
        if layer.role == "expert-down" and k % d.tp:
            yield layer.fused or layer.name, f"expert intermediate size {k} is not divisible by TP {d.tp}"


def _partition_k(layer: Layer, k: int, tp: int) -> int:
    return k // tp if layer.parallel == "row" else k


@rule(
    "group-divides-partition",
    "vllm 0.23.0-0.33.0 distributed/utils.py:verify_group_size_divides_partition "
    f"(from {CT}/schemes/compressed_tensors_wNa16.py:create_weights); schemes/compressed_tensors_w4a4_nvfp4.py:"
    "create_weights; compressed_tensors_moe/compressed_tensors_moe_wna16.py:create_weights",
    per_deployment=True,
)
def group_divides_partition(art: Artifact, d: Deployment) -> Iterator[Finding]:
    """A quantization group never straddles a TP shard: group size divides K per shard (experts: hidden, and
    the intermediate size per shard)."""
    for layer in _layers(art):
        scheme, nk = art.scheme(layer.name), art.nk.get(layer.name)
        if scheme is None or nk is None or scheme.kind == "fp8":
            continue
        group = 16 if scheme.kind == "nvfp4" else scheme.group_size
        if group == -1:
            continue
        if layer.parallel == "experts":
            if layer.role == "expert-down":  # [hidden, intermediate]: one check per expert
                hidden, inter = nk[0], nk[1] // d.tp
                if hidden % group or inter % group:
                    yield (
                        layer.fused or layer.name,
                        (
                            f"group size {group} must divide hidden size {hidden} and the expert intermediate size per "
                            f"shard {inter} at TP {d.tp}"
                        ),
                    )
            continue
        k = _partition_k(layer, nk[1], d.tp)
        if k % group:
            yield (
                layer.name,
                f"input features per shard {k} (K {nk[1]} at TP {d.tp}) are not a multiple of group size {group}",
            )


@rule(
    "wna16-kernel",
    "vllm 0.23.0-0.33.0 model_executor/kernels/linear/__init__.py:choose_mp_linear_kernel "
    "(Machete, Marlin, Exllama, Triton W4A16 can_implement; Marlin tile padding from 0.24.0)",
    per_deployment=True,
)
def wna16_kernel(art: Artifact, d: Deployment) -> Iterator[Finding]:
    """Some W4A16 kernel of every platform the target runs on implements each layer's TP shard.

    Shards whose K a group straddles are left to ``group_divides_partition``: no kernel takes them.
    """
    dims = art.layout.dims
    for fused, shards in sorted(art.layout.by_fused().items(), key=lambda kv: natural(kv[0])):
        head = shards[0]
        scheme = art.scheme(head.name)
        if scheme is None or scheme.kind != "wna16" or head.parallel in ("experts", "vocab"):
            continue
        found = [art.nk.get(s.name) for s in shards]
        nks = [nk for nk in found if nk is not None]
        if len(nks) != len(found):
            continue
        k_full = nks[0][1]
        if (
            head.role in ("q", "k", "v")
            and dims.latent is None
            and dims.heads
            and dims.kv_heads
            and dims.head_dim
        ):
            if dims.heads % d.tp or (dims.kv_heads % d.tp if dims.kv_heads >= d.tp else d.tp % dims.kv_heads):
                continue  # the head rules refuse this TP already
            n = (dims.heads // d.tp + 2 * max(1, dims.kv_heads // d.tp)) * dims.head_dim
        elif head.parallel == "column":
            n = sum(nk[0] for nk in nks) // d.tp
        elif head.parallel == "replicated":  # every rank holds all of it (MLA's fused_qkv_a_proj)
            n = sum(nk[0] for nk in nks)
        else:
            n = nks[0][0]
        k = _partition_k(head, k_full, d.tp)
        if scheme.group_size != -1 and k % scheme.group_size:
            continue  # the group-divides-partition rule names the cause; every kernel refuses it too
        shard = Shard(
            k_full=k_full,
            k=k,
            n=n,
            bits=scheme.weights.num_bits,
            group=scheme.group_size,
            zero_points=not scheme.weights.symmetric,
            act_dtype=art.layout.dims.dtype,
        )
        for platform in d.platforms:
            kernel, reasons = choose(shard, platform, d.version)
            if kernel is None:
                yield (
                    fused,
                    f"no W4A16 kernel on {platform.name} takes its shard [N {n}, K {k}]: {'; '.join(reasons)}",
                )


def platforms_for(hardware: str, native_on: list[str]) -> tuple[Platform, ...]:
    """The platforms a target runs on: its hardware, or (``any-gpu``) every platform it is native on."""
    names = [hardware] if hardware in PLATFORMS else [n for n in native_on if n in PLATFORMS]
    return tuple(PLATFORMS[n] for n in names)
