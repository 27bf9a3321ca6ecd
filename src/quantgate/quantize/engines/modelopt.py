"""NVFP4 through NVIDIA's modelopt, for GPU workers (optional extra ``quantgate[gpu]``).

modelopt's NVFP4 calibration runs only on CUDA, so this engine refuses at preflight where no
GPU is present, before anything is loaded; the CPU path for the same target is the
llm-compressor recipe ``nvfp4``. The output is modelopt's Hugging Face export
(``hf_quant_config.json``, quant_method ``modelopt``), which vLLM loads on Blackwell.
"""

from __future__ import annotations

from quantgate.config.targets import KVCache, Recipe
from quantgate.errors import MissingDependencyError
from quantgate.intake import SourceRecord
from quantgate.quantize.engines import BuildJob, register


@register("modelopt")
class ModeloptEngine:
    """NVIDIA modelopt's NVFP4, calibrated on a CUDA GPU, exported in Hugging Face layout."""

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
        """Calibrate and quantize the source on the GPU and export it into ``job.out_dir``."""
        import modelopt.torch.quantization as mtq
        import torch
        from modelopt.torch.export import export_hf_checkpoint
        from transformers import AutoModelForCausalLM, AutoTokenizer

        spec = job.recipe.recipe
        config = copy_config(getattr(mtq, spec["quant_cfg"]))
        for pattern in spec.get("disable", []):
            config["quant_cfg"][pattern] = {"enable": False}
        # the recipe names the KV config; the build's policy decides whether it applies
        if spec.get("kv_cache_quant_cfg") and job.kv_cache == KVCache.FP8_E4M3:
            config["quant_cfg"].update(getattr(mtq, spec["kv_cache_quant_cfg"])["quant_cfg"])

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
        export_hf_checkpoint(model, export_dir=job.out_dir)
        tokenizer.save_pretrained(job.out_dir)


def copy_config(config: dict) -> dict:
    """A deep-enough copy of a modelopt config dict (its presets are module-level globals)."""
    out = dict(config)
    out["quant_cfg"] = dict(config["quant_cfg"])
    return out
