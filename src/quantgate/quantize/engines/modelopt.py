"""NVFP4 through NVIDIA's modelopt, for GPU workers (optional extra ``quantgate[gpu]``).

modelopt's NVFP4 calibration runs only on CUDA, so this engine refuses at preflight where no
GPU is present, before anything is loaded; the CPU path for the same target is the
llm-compressor recipe ``nvfp4``.

Why convert the export: modelopt writes its own Hugging Face layout (``hf_quant_config.json``,
quant_method ``modelopt``: packed E2M1 in ``weight``, ``weight_scale_2`` and ``input_scale``
as multipliers, KV scales under ``k_proj.k_scale``), while the serving check, evaluation and
the manifest speak compressed-tensors ``nvfp4-pack-quantized``, which vLLM loads through the
same CUTLASS NVFP4 kernel. The two layouts hold the same numbers: the packed bytes and the E4M3
block scales are identical (both put the first of two values in the low nibble), and
compressed-tensors' global scales are the reciprocals of modelopt's (``weight_global_scale =
1 / weight_scale_2``, ``input_global_scale = 1 / input_scale``; vLLM's two loaders form the same
epilogue factor from them, up to one float32 rounding of the reciprocal). So the build writes
the compressed-tensors layout, and both NVFP4 artifacts go through one evaluation and one
serving check.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quantgate.config import KVCache, Recipe
from quantgate.intake import SourceRecord
from quantgate.quantize.engines.base import BuildJob, register
from quantgate.quantize.kv_calibration import KV_CACHE_SCHEME
from quantgate.runtime.errors import BuildError, MissingDependencyError

# compressed-tensors' NVFP4 preset as llm-compressor writes it into config.json (observers are
# calibration details, not read by any loader)
_NVFP4_ARGS: dict[str, Any] = {
    "num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16,
    "scale_dtype": "torch.float8_e4m3fn", "actorder": None, "block_structure": None, "zp_dtype": None,
    "observer_kwargs": {},
}  # fmt: skip


@register("modelopt")
class ModeloptEngine:
    """NVIDIA modelopt's NVFP4, calibrated on a CUDA GPU, written as compressed-tensors NVFP4."""

    calibrates_kv_cache = True  # modelopt's own KV calibration (kv_cache_quant_cfg), when the policy asks

    def preflight(self, source: SourceRecord, recipe: Recipe) -> None:
        """Refuse where no CUDA GPU is visible or modelopt is not installed."""
        import torch

        if not torch.cuda.is_available():
            raise MissingDependencyError(
                f"recipes/{recipe.name}.yaml",
                "modelopt NVFP4 calibration needs a CUDA GPU and none is visible",
                "run this target on a GPU worker, or use the llm-compressor recipe 'nvfp4' on CPU",
            )
        try:
            import modelopt.torch.quantization  # noqa: F401
        except ImportError:
            raise MissingDependencyError(
                "nvidia-modelopt", "modelopt is not installed", "pip install 'quantgate[gpu]'"
            ) from None

    def build(self, job: BuildJob) -> None:
        """Calibrate and quantize the source on the GPU, export it, and convert it to compressed-tensors."""
        import modelopt.torch.quantization as mtq
        import torch
        from modelopt.torch.export import export_hf_checkpoint
        from transformers import AutoModelForCausalLM, AutoTokenizer

        spec = job.recipe.recipe
        kv = getattr(mtq, spec["kv_cache_quant_cfg"]) if spec.get("kv_cache_quant_cfg") else None
        config = quant_config(
            getattr(mtq, spec["quant_cfg"]),
            disable=spec.get("disable", []),
            kv_cache=kv if job.kv_cache == KVCache.FP8_E4M3 else None,  # the build's policy decides
        )

        model = AutoModelForCausalLM.from_pretrained(job.source.path, dtype=torch.bfloat16, device_map="cuda")
        tokenizer = AutoTokenizer.from_pretrained(job.source.path)
        texts = job.calibration.texts()[: job.recipe.calibration.num_samples] if job.calibration else []
        max_len = job.recipe.calibration.max_seq_length

        def forward_loop(m):
            with job.progress.task(f"{job.recipe.name}: calibrating", total=len(texts)) as task:
                for text in texts:
                    ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_len).to("cuda")
                    m(**ids)
                    task.advance()

        with torch.inference_mode():
            mtq.quantize(model, config, forward_loop)
        linears = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
        export_hf_checkpoint(model, export_dir=job.out_dir)
        to_compressed_tensors(job.out_dir, linears)
        tokenizer.save_pretrained(job.out_dir)


def quant_config(preset: dict, *, disable: Iterable[str], kv_cache: dict | None) -> dict:
    """A copy of a modelopt preset with ``disable`` patterns switched off and the KV config merged.

    modelopt 0.47 writes ``quant_cfg`` as a list of entries (``{"quantizer_name": pattern, ...}``,
    later entries win); older releases as a dict keyed by pattern. Both shapes are accepted.
    """
    out = dict(preset)
    cfg = preset["quant_cfg"]
    kv_cfg = kv_cache["quant_cfg"] if kv_cache is not None else None
    if isinstance(cfg, list):
        entries = [dict(e) for e in cfg]
        entries += [dict(e) for e in kv_cfg or []]
        entries += [{"quantizer_name": pattern, "enable": False} for pattern in disable]
        out["quant_cfg"] = entries
        return out
    merged = dict(cfg)
    merged.update(kv_cfg or {})
    for pattern in disable:
        merged[pattern] = {"enable": False}
    out["quant_cfg"] = merged
    return out


def _read_shards(directory: Path) -> dict[str, dict[str, Any]]:
    from safetensors import safe_open

    shards: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            shards[path.name] = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not iterable)
    return shards


def _convert_tensors(tensors: dict[str, Any], where: Path) -> tuple[dict[str, Any], set[str], bool]:
    """One shard's tensors in compressed-tensors names: (tensors, quantized module names, has KV scales)."""
    import torch

    out: dict[str, Any] = {}
    quantized: set[str] = set()
    kv = False
    for key, value in tensors.items():
        module, _, local = key.rpartition(".")
        if local == "weight" and value.dtype == torch.uint8:
            if f"{module}.weight_scale_2" not in tensors or f"{module}.weight_scale" not in tensors:
                raise BuildError(
                    f"{where}: {module} has packed NVFP4 weights but no weight_scale / weight_scale_2. "
                    "Fix: re-export with modelopt's export_hf_checkpoint (NVFP4)"
                )
            out[f"{module}.weight_packed"] = value
            quantized.add(module)
        elif local == "weight_scale_2":
            out[f"{module}.weight_global_scale"] = (1.0 / value.float()).reshape(1)
        elif local == "input_scale":
            out[f"{module}.input_global_scale"] = (1.0 / value.float()).reshape(1)
        elif local in ("k_scale", "v_scale") and module.rpartition(".")[2] in ("k_proj", "v_proj"):
            # modelopt keeps the KV scales on the projections; vLLM and compressed-tensors on the attention
            out[f"{module.rpartition('.')[0]}.{local}"] = value.float().reshape(1)
            kv = True
        else:
            out[key] = value
    return out, quantized, kv


def compressed_tensors_config(ignore: list[str], kv_cache: bool) -> dict[str, Any]:
    """config.json's ``quantization_config`` for an NVFP4 W4A4 checkpoint, as llm-compressor writes it."""
    return {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": "nvfp4-pack-quantized",
                "weights": {**_NVFP4_ARGS, "dynamic": False, "observer": "minmax"},
                "input_activations": {**_NVFP4_ARGS, "dynamic": "local", "observer": "minmax"},
                "output_activations": None,
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": dict(KV_CACHE_SCHEME) if kv_cache else None,
        "global_compression_ratio": None,
        "sparsity_config": {},
        "transform_config": {},
    }


def to_compressed_tensors(directory: Path, linears: Iterable[str]) -> None:
    """Rewrite modelopt's NVFP4 export in ``directory`` as compressed-tensors ``nvfp4-pack-quantized``.

    ``linears``: every Linear module name of the model; those left unquantized go to ``ignore``
    (as llm-compressor lists them). Tensors keep their shards; the index is rewritten to match.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    shards = _read_shards(directory)
    if not shards:
        raise BuildError(f"{directory}: modelopt wrote no safetensors. Fix: check the export's log above")
    quantized: set[str] = set()
    kv = False
    converted: dict[str, dict[str, Any]] = {}
    for name, tensors in shards.items():
        converted[name], q, has_kv = _convert_tensors(tensors, directory / name)
        quantized |= q
        kv = kv or has_kv
    if not quantized:
        raise BuildError(
            f"{directory}: the modelopt export holds no packed NVFP4 weight. Fix: check the recipe's quant_cfg"
        )
    for name, tensors in converted.items():
        (directory / name).unlink()
        save_file(tensors, directory / name, metadata={"format": "pt"})
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: name for name, tensors in converted.items() for k in tensors}
        index.write_text(json.dumps(data, indent=2) + "\n")
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    ignore = sorted(name for name in linears if name not in quantized)
    if config.get("tie_word_embeddings") and "lm_head" not in ignore:
        ignore.append("lm_head")
    config["quantization_config"] = compressed_tensors_config(ignore, kv)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    (directory / "hf_quant_config.json").unlink(
        missing_ok=True
    )  # its quant_method would contradict config.json
