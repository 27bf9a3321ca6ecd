"""An artifact as the engine's loader meets it: config dims, and its tensors grouped into layers.

Read from ``config.json`` and the safetensors headers only (names, shapes, dtypes); the data
is never read, except the 4-byte NVFP4 global scales the ``nvfp4-global-scales`` rule compares.
Layer names keep the checkpoint's (Hugging Face) spelling; each linear layer also gets what
vLLM makes of it: its role, the fused layer it becomes a shard of (``qkv_proj``,
``gate_up_proj``, an MoE layer's experts) and how tensor parallelism splits it.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from quantgate.intake import read_header
from quantgate.runtime.errors import InputError

Parallel = Literal["column", "row", "replicated", "vocab", "experts", "unknown"]

# parameter names a linear layer (or attention's KV cache) may carry in a compressed-tensors checkpoint
PARAMS = (
    "weight",
    "bias",
    "weight_scale",
    "weight_packed",
    "weight_shape",
    "weight_zero_point",
    "weight_g_idx",
    "weight_global_scale",
    "input_global_scale",
    "input_scale",
    "input_zero_point",
)
KV_PARAMS = ("k_scale", "v_scale", "q_scale", "k_zero_point", "v_zero_point", "q_zero_point")

_ATTN = re.compile(r"^(?P<block>.*\.layers\.(?P<layer>\d+))\.self_attn\.(?P<proj>[qkvo])_proj$")
# multi-head latent attention (DeepSeek-V2/V3): the projections vLLM's deepseek_v2.py builds
_MLA = re.compile(
    r"^(?P<block>.*\.layers\.(?P<layer>\d+))\.self_attn\.(?P<proj>q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj)$"
)
_MLA_ROLE = {"q_a_proj": "q_a", "q_b_proj": "q_b", "kv_a_proj_with_mqa": "kv_a", "kv_b_proj": "kv_b"}
MLA_ROLES = ("q_a", "q_b", "kv_a", "kv_b")
_MLP = re.compile(
    r"^(?P<mlp>.*\.layers\.(?P<layer>\d+)\.mlp(?:\.shared_experts?)?)\.(?P<proj>gate|up|down)_proj$"
)
_EXPERT = re.compile(
    r"^(?P<moe>.*\.layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe))\.experts\.(?P<expert>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)$"
)
_ROUTER = re.compile(
    r"^.*\.layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe)\.(?:gate|router|shared_expert_gate)$"
)
_EXPERT_ROLE = {
    "gate_proj": "gate",
    "w1": "gate",
    "up_proj": "up",
    "w3": "up",
    "down_proj": "down",
    "w2": "down",
}


@dataclass(frozen=True)
class Tensor:
    """One tensor's header entry and where its bytes are (for the few scalars that are read)."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in ``file``

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def scalars(self) -> list[float]:
        """The values of a small F32 tensor (a scale: a few bytes, never a weight)."""
        if self.dtype != "F32" or self.numel > 4096:
            raise ValueError(f"{self.name}: only small F32 tensors are read")
        with open(self.file, "rb") as f:
            f.seek(self.offset)
            return list(struct.unpack(f"<{self.numel}f", f.read(4 * self.numel)))


@dataclass
class Layer:
    """A linear layer of the checkpoint and what vLLM makes of it."""

    name: str
    tensors: dict[str, Tensor] = field(default_factory=dict)  # parameter name -> tensor
    role: str = "other"  # q k v o gate up down, expert-gate expert-up expert-down, router, lm_head, other
    block: int | None = None  # decoder layer index
    expert: int | None = None
    fused: str | None = None  # the vLLM layer this is a shard of
    parallel: Parallel = "unknown"


@dataclass(frozen=True)
class Latent:
    """Multi-head latent attention's sizes (DeepSeek-V2/V3), as vLLM's deepseek_v2.py reads them.

    ``DeepseekV2DecoderLayer.__init__`` takes each with ``getattr(config, name, 0)`` (None here:
    absent or not an integer); ``q_lora_rank`` None means no query compression (one ``q_proj``).
    """

    q_lora_rank: int | None
    kv_lora_rank: int | None
    qk_nope_head_dim: int | None
    qk_rope_head_dim: int | None
    v_head_dim: int | None

    @property
    def qk_head_dim(self) -> int | None:
        """A query head: the part without rotary embedding and the rotary part."""
        n, r = self.qk_nope_head_dim, self.qk_rope_head_dim
        return n + r if n is not None and r is not None else None


@dataclass(frozen=True)
class Dims:
    """The architecture sizes the engine allocates from (text config of multimodal models)."""

    hidden: int | None
    heads: int | None
    kv_heads: int | None
    head_dim: int | None
    intermediate: int | None
    moe_intermediate: int | None
    shared_intermediate: int | None
    layers: int | None
    experts: int | None
    tied: bool
    dtype: str  # the activations' dtype: the config's dtype, as vLLM's --dtype auto takes it
    latent: Latent | None = None  # MLA models: config.json has kv_lora_rank (vLLM caches one latent)


@dataclass
class Layout:
    """An artifact directory: its config, its quantization config, its layers and other tensors."""

    path: Path
    config: dict[str, Any]
    quantization: dict[str, Any] | None
    dims: Dims
    layers: dict[str, Layer]
    kv_scales: dict[int, dict[str, Tensor]]  # decoder layer -> k_scale/v_scale/... tensors
    others: dict[str, Tensor]  # embeddings, norms: not linear layers

    def by_fused(self) -> dict[str, list[Layer]]:
        """Layers grouped by the vLLM layer they are shards of (unfused layers stand alone)."""
        groups: dict[str, list[Layer]] = {}
        for layer in self.layers.values():
            groups.setdefault(layer.fused or layer.name, []).append(layer)
        return groups


def is_latent_projection(name: str) -> bool:
    """A module named as one of multi-head latent attention's projections (q_a, q_b, kv_a, kv_b)."""
    return _MLA.match(name) is not None


def _int(cfg: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def dims_of(config: dict[str, Any]) -> Dims:
    """The sizes vLLM reads from config.json (``text_config`` for multimodal models)."""
    text: dict[str, Any] = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    hidden, heads = _int(text, "hidden_size"), _int(text, "num_attention_heads")
    moe = _int(text, "moe_intermediate_size")
    shared = _int(text, "shared_expert_intermediate_size")
    n_shared = _int(text, "n_shared_experts")
    if shared is None and moe is not None and n_shared:
        shared = moe * n_shared  # DeepSeek-style
    experts = _int(text, "num_local_experts", "num_experts", "n_routed_experts")
    dtype = (
        text.get("dtype")
        or text.get("torch_dtype")
        or config.get("dtype")
        or config.get("torch_dtype")
        or "bfloat16"
    )
    latent = None
    if "kv_lora_rank" in text and text["kv_lora_rank"] is not None:
        # vLLM's MLAAttention caches one latent per token: num_kv_heads = 1 (mla_attention.py)
        names = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        latent = Latent(*(_int(text, name) for name in names))
    return Dims(
        hidden=hidden,
        heads=heads,
        kv_heads=1 if latent else (_int(text, "num_key_value_heads") or heads),
        head_dim=_int(text, "head_dim") or (hidden // heads if hidden and heads else None),
        intermediate=_int(text, "intermediate_size"),
        moe_intermediate=moe if moe is not None else (_int(text, "intermediate_size") if experts else None),
        shared_intermediate=shared,
        layers=_int(text, "num_hidden_layers"),
        experts=experts if experts and experts > 1 else None,
        tied=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        dtype=str(dtype).removeprefix("torch."),
        latent=latent,
    )


def _classify(layer: Layer, dims: Dims) -> None:
    name = layer.name
    if dims.latent is not None and (m := _MLA.match(name)):
        # deepseek_v2.py DeepseekV2MLAAttention: with q_lora_rank, q_a_proj and kv_a_proj_with_mqa
        # are the two shards of fused_qkv_a_proj (MergedColumnParallelLinear, disable_tp: every rank
        # holds all of it); without, kv_a_proj_with_mqa is a ReplicatedLinear. q_b_proj and
        # kv_b_proj are ColumnParallelLinear (split by heads).
        layer.block, layer.role = int(m["layer"]), _MLA_ROLE[m["proj"]]
        if layer.role in ("q_a", "kv_a"):
            layer.parallel = "replicated"
            if dims.latent.q_lora_rank is not None:
                layer.fused = f"{m['block']}.self_attn.fused_qkv_a_proj"
        else:
            layer.parallel = "column"
    elif m := _ATTN.match(name):
        layer.block, proj = int(m["layer"]), m["proj"]
        layer.role = proj
        layer.parallel = "row" if proj == "o" else "column"
        if dims.latent is None:
            layer.fused = None if proj == "o" else f"{m['block']}.self_attn.qkv_proj"
        # MLA without q_lora_rank: q_proj is a ColumnParallelLinear of its own; o_proj as usual
    elif m := _EXPERT.match(name):
        layer.block, layer.expert = int(m["layer"]), int(m["expert"])
        layer.role = "expert-" + _EXPERT_ROLE[m["proj"]]
        layer.fused = f"{m['moe']}.experts"
        layer.parallel = "experts"
    elif m := _MLP.match(name):
        layer.block, proj = int(m["layer"]), m["proj"]
        layer.role = proj
        layer.fused = None if proj == "down" else f"{m['mlp']}.gate_up_proj"
        layer.parallel = "row" if proj == "down" else "column"
        if ".shared_expert" in name:
            layer.role = "shared-" + proj
    elif m := _ROUTER.match(name):
        layer.block, layer.role, layer.parallel = int(m["layer"]), "router", "replicated"
    elif name == "lm_head" or name.endswith(".lm_head"):
        layer.role, layer.parallel = "lm_head", "vocab"


def _is_linear(name: str, params: dict[str, Tensor]) -> bool:
    """A module is a linear layer when it carries a 2-D weight or any quantization parameter."""
    if name.endswith(("embed_tokens", "wte", "embeddings", "word_embeddings")):
        return False
    weight = params.get("weight")
    return (weight is not None and len(weight.shape) == 2) or any(
        p != "weight" and p != "bias" for p in params
    )


def read_layout(directory: Path) -> Layout:
    """Read ``directory``'s config.json and every shard's header into a ``Layout``."""
    directory = Path(directory)
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(
            path, f"the artifact's config.json cannot be read ({exc})", "rebuild the artifact"
        ) from None
    if not isinstance(config, dict):
        raise InputError(path, "the artifact's config.json is not a JSON object", "rebuild the artifact")
    quant = config.get("quantization_config")
    if quant is None and isinstance(config.get("text_config"), dict):
        quant = config["text_config"].get("quantization_config")

    modules: dict[str, dict[str, Tensor]] = {}
    kv_scales: dict[int, dict[str, Tensor]] = {}
    others: dict[str, Tensor] = {}
    for shard in sorted(directory.glob("*.safetensors")):
        header = read_header(shard)
        for name, info in header.tensors.items():
            tensor = Tensor(name, shard, info.dtype, info.shape, header.data_offset + info.begin)
            module, _, param = name.rpartition(".")
            if param in KV_PARAMS and (m := re.match(r"^.*\.layers\.(\d+)\.self_attn$", module)):
                kv_scales.setdefault(int(m.group(1)), {})[param] = tensor
            elif param in PARAMS and module:
                modules.setdefault(module, {})[param] = tensor
            else:
                others[name] = tensor
    dims = dims_of(config)
    layers: dict[str, Layer] = {}
    for module, params in sorted(modules.items()):
        if _is_linear(module, params):
            layer = Layer(module, params)
            _classify(layer, dims)
            layers[module] = layer
        else:
            others.update({f"{module}.{p}": t for p, t in params.items()})
    return Layout(
        directory,
        config,
        quant if isinstance(quant, dict) else None,
        dims,
        layers,
        kv_scales,
        others,
    )


def expected_nk(layer: Layer, dims: Dims) -> tuple[int | None, int | None]:
    """(output, input) features the engine allocates for ``layer`` from the config, where known."""
    d, role = dims, layer.role
    if d.latent is not None and role in ("q", "o", *MLA_ROLES):
        return _latent_nk(role, d, d.latent)
    q = d.heads * d.head_dim if d.heads and d.head_dim else None
    kv = d.kv_heads * d.head_dim if d.kv_heads and d.head_dim else None
    inter = d.intermediate
    table: dict[str, tuple[int | None, int | None]] = {
        "q": (q, d.hidden),
        "k": (kv, d.hidden),
        "v": (kv, d.hidden),
        "o": (d.hidden, q),
        "gate": (inter, d.hidden),
        "up": (inter, d.hidden),
        "down": (d.hidden, inter),
        "shared-gate": (d.shared_intermediate, d.hidden),
        "shared-up": (d.shared_intermediate, d.hidden),
        "shared-down": (d.hidden, d.shared_intermediate),
        "expert-gate": (d.moe_intermediate, d.hidden),
        "expert-up": (d.moe_intermediate, d.hidden),
        "expert-down": (d.hidden, d.moe_intermediate),
    }
    return table.get(role, (None, None))


def _mul(*values: int | None) -> int | None:
    out = 1
    for v in values:
        if v is None:
            return None
        out *= v
    return out


def _latent_nk(role: str, d: Dims, lat: Latent) -> tuple[int | None, int | None]:
    """MLA's [N, K] as deepseek_v2.py ``DeepseekV2MLAAttention.__init__`` allocates them."""
    kv_a = lat.kv_lora_rank + lat.qk_rope_head_dim if lat.kv_lora_rank and lat.qk_rope_head_dim else None
    kv_b = _mul(
        d.heads, lat.qk_nope_head_dim + lat.v_head_dim if lat.qk_nope_head_dim and lat.v_head_dim else None
    )
    table: dict[str, tuple[int | None, int | None]] = {
        "q": (_mul(d.heads, lat.qk_head_dim), d.hidden),  # no q_lora_rank: one q_proj
        "q_a": (lat.q_lora_rank, d.hidden),
        "q_b": (_mul(d.heads, lat.qk_head_dim), lat.q_lora_rank),
        "kv_a": (kv_a, d.hidden),  # the latent and the shared rotary key
        "kv_b": (kv_b, lat.kv_lora_rank),  # per head: the key without rotary, and the value
        "o": (d.hidden, _mul(d.heads, lat.v_head_dim)),
    }
    return table[role]
