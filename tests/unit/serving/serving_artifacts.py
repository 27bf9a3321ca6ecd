"""Small synthetic artifacts for the serving rules: a config.json and a safetensors file whose
names, shapes and dtypes are what a compressed-tensors build writes (the values are zeros:
the rules read headers only, and the few global scales they compare are set explicitly)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from quantgate.config.targets import Catalog, Serving, Target

SCHEMES: dict[str, dict[str, Any]] = {
    "fp8": {
        "format": "float-quantized",
        "weights": {
            "num_bits": 8,
            "type": "float",
            "strategy": "channel",
            "symmetric": True,
            "dynamic": False,
        },
        "input_activations": {
            "num_bits": 8,
            "type": "float",
            "strategy": "token",
            "symmetric": True,
            "dynamic": True,
        },
    },
    "nvfp4": {
        "format": "nvfp4-pack-quantized",
        "weights": {
            "num_bits": 4,
            "type": "float",
            "strategy": "tensor_group",
            "group_size": 16,
            "symmetric": True,
            "dynamic": False,
        },
        "input_activations": {
            "num_bits": 4,
            "type": "float",
            "strategy": "tensor_group",
            "group_size": 16,
            "symmetric": True,
            "dynamic": "local",
        },
    },
    "w4a16": {
        "format": "pack-quantized",
        "weights": {
            "num_bits": 4,
            "type": "int",
            "strategy": "group",
            "group_size": 64,
            "symmetric": True,
            "dynamic": False,
            "actorder": "static",
        },
        "input_activations": None,
    },
}
TARGET_OF = {"fp8": "hopper-fp8", "nvfp4": "blackwell-nvfp4", "w4a16": "draft-int4"}


def group_config(
    kind: str, *, group: int | None = None, bits: int | None = None, targets=("Linear",)
) -> dict:
    """One config group of ``kind`` (W4A16 with its group size and bits adjustable)."""
    g = json.loads(json.dumps(SCHEMES[kind]))
    if kind == "w4a16":
        g["weights"]["group_size"] = group or g["weights"]["group_size"]
        g["weights"]["num_bits"] = bits or g["weights"]["num_bits"]
    return {"targets": list(targets), **g}


def quant_config(
    kind: str,
    *,
    group: int | None = None,
    bits: int | None = None,
    ignore=("lm_head",),
    kv: dict | None = None,
) -> dict:
    """A quantization_config as llm-compressor writes it, one config group."""
    g = group_config(kind, group=group, bits=bits)
    return {
        "quant_method": "compressed-tensors",
        "format": g["format"],
        "config_groups": {"group_0": g},
        "ignore": list(ignore),
        "kv_cache_scheme": kv,
        "quantization_status": "compressed",
    }


# DeepSeek-V3's latent attention, scaled down: 4 heads of 16+16 (query/key), 16 (value), latent 64
MLA_DIMS = {
    "q_lora_rank": 64,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
}


def model_config(
    *,
    hidden=128,
    heads=4,
    kv_heads=2,
    inter=256,
    layers=2,
    vocab=128,
    head_dim=None,
    experts=None,
    moe_inter=None,
    quant=None,
    mla: dict | None = None,
) -> dict:
    """A Llama-shaped config.json (Qwen-MoE-shaped with ``experts``; DeepSeek-V3-shaped, multi-head
    latent attention, with ``mla``: its q_lora_rank, kv_lora_rank and head dims)."""
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2MoeForCausalLM" if experts else "LlamaForCausalLM"],
        "model_type": "qwen2_moe" if experts else "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim or hidden // heads,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
    }
    if experts:
        cfg.update(num_experts=experts, moe_intermediate_size=moe_inter, num_experts_per_tok=2)
    if mla is not None:
        cfg.update(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", **{**MLA_DIMS, **mla})
    if quant is not None:
        cfg["quantization_config"] = quant
    return cfg


def linear(
    name: str, kind: str | None, n: int, k: int, *, group: int = 64, bits: int = 4, global_scale: float = 1.0
) -> dict[str, torch.Tensor]:
    """The tensors one layer of shape [n, k] carries under ``kind`` (None: unquantized bf16)."""
    if kind is None:
        return {f"{name}.weight": torch.zeros(n, k, dtype=torch.bfloat16)}
    if kind == "fp8":
        return {
            f"{name}.weight": torch.zeros(n, k, dtype=torch.float8_e4m3fn),
            f"{name}.weight_scale": torch.ones(n, 1, dtype=torch.bfloat16),
        }
    if kind == "nvfp4":
        return {
            f"{name}.weight_packed": torch.zeros(n, k // 2, dtype=torch.uint8),
            f"{name}.weight_scale": torch.zeros(n, k // 16, dtype=torch.float8_e4m3fn),
            f"{name}.weight_global_scale": torch.full((1,), global_scale, dtype=torch.float32),
            f"{name}.input_global_scale": torch.full((1,), global_scale, dtype=torch.float32),
        }
    groups = 1 if group == -1 else k // group
    return {
        f"{name}.weight_packed": torch.zeros(n, math.ceil(k * bits / 32), dtype=torch.int32),
        f"{name}.weight_scale": torch.ones(n, groups, dtype=torch.bfloat16),
        f"{name}.weight_shape": torch.tensor([n, k], dtype=torch.int64),
    }


def model_tensors(cfg: dict, kind: str | None, *, group: int = 64, bits: int = 4) -> dict[str, torch.Tensor]:
    """Every tensor of the model ``cfg`` describes, its linear layers under ``kind``."""
    h, heads, kv, hd = (
        cfg["hidden_size"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
        cfg["head_dim"],
    )
    out = {
        "model.embed_tokens.weight": torch.zeros(cfg["vocab_size"], h, dtype=torch.bfloat16),
        "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        out[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        if "kv_lora_rank" in cfg:
            out |= latent_attention(cfg, f"{p}.self_attn", kind, group=group, bits=bits)
        else:
            for proj, n, k in (
                ("q", heads * hd, h),
                ("k", kv * hd, h),
                ("v", kv * hd, h),
                ("o", h, heads * hd),
            ):
                out |= linear(f"{p}.self_attn.{proj}_proj", kind, n, k, group=group, bits=bits)
        if cfg.get("num_experts"):
            m = cfg["moe_intermediate_size"]
            out |= linear(f"{p}.mlp.gate", None, cfg["num_experts"], h)  # the router stays bf16
            for e in range(cfg["num_experts"]):
                for proj, n, k in (("gate", m, h), ("up", m, h), ("down", h, m)):
                    out |= linear(f"{p}.mlp.experts.{e}.{proj}_proj", kind, n, k, group=group, bits=bits)
        else:
            inter = cfg["intermediate_size"]
            for proj, n, k in (("gate", inter, h), ("up", inter, h), ("down", h, inter)):
                out |= linear(f"{p}.mlp.{proj}_proj", kind, n, k, group=group, bits=bits)
    return out


def latent_attention(cfg: dict, prefix: str, kind: str | None, **args) -> dict[str, torch.Tensor]:
    """One DeepSeek-V3 attention block's tensors (vLLM deepseek_v2.py DeepseekV2MLAAttention's shapes):
    kv_b_proj unquantized under NVFP4, as the recipe keeps it."""
    h, heads, q_lora, kv_lora = (
        cfg[k] for k in ("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank")
    )
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    shapes = {"kv_a_proj_with_mqa": (kv_lora + rope, h), "kv_b_proj": (heads * (nope + v), kv_lora)}
    shapes["o_proj"] = (h, heads * v)
    if q_lora is None:
        shapes["q_proj"] = (heads * (nope + rope), h)
    else:
        shapes |= {"q_a_proj": (q_lora, h), "q_b_proj": (heads * (nope + rope), q_lora)}
    out = {f"{prefix}.kv_a_layernorm.weight": torch.ones(kv_lora, dtype=torch.bfloat16)}
    if q_lora is not None:
        out[f"{prefix}.q_a_layernorm.weight"] = torch.ones(q_lora, dtype=torch.bfloat16)
    for proj, (n, k) in shapes.items():
        quantized = None if proj == "kv_b_proj" and kind == "nvfp4" else kind
        out |= linear(f"{prefix}.{proj}", quantized, n, k, **args)
    return out


def write_artifact(directory: Path, cfg: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """config.json and model.safetensors in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({k: v.contiguous() for k, v in tensors.items()}, directory / "model.safetensors")
    return directory


def target_with(catalog: Catalog, name: str, *, tp=(1,), min_version: str = "0.33.0", **changes) -> Target:
    """A target of the repository's catalog with another serving contract (and other fields changed)."""
    target = catalog.target(name)
    serving = Serving(engine="vllm", min_version=min_version, tensor_parallel=list(tp))
    return target.model_copy(update={"serving": serving, **changes})
