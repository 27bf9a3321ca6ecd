"""Calibrated targets (NVFP4, GPTQ/AWQ INT4) through llm-compressor's ``oneshot``.

The recipe's ``recipe:`` block is handed to ``oneshot`` verbatim. One engine instance serves every
calibrated target of a build: the source is loaded and the calibration set tokenized once, and
each target quantizes its own copy, so N calibrated targets cost one load. MoE models load with
one Linear per expert (``load_quantizable_moe``) and calibrate every expert on every token: an
expert a small calibration set never routes to would otherwise get no activation statistics.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from quantgate.config.targets import KVCache, Recipe
from quantgate.errors import CalibrationError
from quantgate.intake import SourceRecord
from quantgate.quantize.engines import BuildJob, register
from quantgate.quantize.engines._logs import quiet
from quantgate.quantize.kv_calibration import with_kv_cache_scheme
from quantgate.quantize.preflight import check_group_sizes


@contextmanager
def _conversion_mappings_restored() -> Iterator[None]:
    """Put transformers' process-wide checkpoint conversion table back as it was.

    ``load_quantizable_moe`` registers its save mapping (one Linear per expert on disk) for the
    model type and leaves it there; every later load or intake check of that model type in the
    process would then read per-expert names as the in-memory layout. The loaded model keeps
    its own copy (``_weight_conversions``), which is what ``save_pretrained`` reverts through.
    A load that fails also leaves its module patch mapping registered: cleared here as well.
    """
    from transformers import conversion_mapping
    from transformers.monkey_patching import clear_patch_mapping

    conversion_mapping.get_checkpoint_conversion_mapping("llama")  # builds the table if not yet built
    saved = copy.deepcopy(conversion_mapping._checkpoint_conversion_mapping_cache)
    try:
        yield
    finally:
        conversion_mapping._checkpoint_conversion_mapping_cache = saved
        clear_patch_mapping()


@register("llmcompressor.oneshot")
class OneshotEngine:
    """llm-compressor's ``oneshot`` for calibrated recipes, one source load per build call."""

    calibrates_kv_cache = True  # an FP8 KV decision adds kv_cache_scheme to the recipe

    def __init__(self) -> None:
        self._loaded: dict[str, tuple[Any, Any]] = {}  # content hash -> (model, tokenizer)

    def preflight(self, source: SourceRecord, recipe: Recipe) -> None:
        """Refuse a recipe whose weight group size does not divide a layer it quantizes."""
        _, args = recipe.modifier()
        check_group_sizes(source, recipe, ignore=list(args.get("ignore", [])))

    def _load(self, source: SourceRecord) -> tuple[Any, Any]:
        if source.content_hash not in self._loaded:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            kwargs = {"dtype": torch.bfloat16}
            if source.moe:
                from llmcompressor.modeling.moe.linearize import load_quantizable_moe

                with load_quantizable_moe(), _conversion_mappings_restored():
                    model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
            else:
                model = AutoModelForCausalLM.from_pretrained(source.path, **kwargs)
            model.eval()
            tokenizer = AutoTokenizer.from_pretrained(source.path)
            self._loaded = {source.content_hash: (model, tokenizer)}  # one source at a time
        return self._loaded[source.content_hash]

    def _dataset(self, job: BuildJob, tokenizer: Any):
        from datasets import Dataset

        if job.calibration is None:
            raise CalibrationError(
                f"recipes/{job.recipe.name}.yaml",
                "this recipe needs calibration data but no calibration set was given",
                "pass --calibration SPEC.yaml (default: calibration_sets/default.yaml)",
            )
        texts = job.calibration.texts()[: job.recipe.calibration.num_samples]
        encoded = tokenizer(
            texts, truncation=True, max_length=job.recipe.calibration.max_seq_length, add_special_tokens=True
        )
        return Dataset.from_dict(
            {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
        )

    def build(self, job: BuildJob) -> None:
        """Calibrate a copy of the loaded source with the recipe and save it compressed."""
        import yaml

        quiet()
        from llmcompressor import oneshot

        base, tokenizer = self._load(job.source)
        dataset = self._dataset(job, tokenizer)
        # oneshot re-reads the config from the model's name_or_path (the source directory); a copy keeps it
        model = copy.deepcopy(base)
        # only a recipe that names a pipeline passes one: oneshot's own default stays the default
        extra: dict[str, Any] = {}
        if job.recipe.calibration.pipeline:
            extra["pipeline"] = job.recipe.calibration.pipeline
        recipe = job.recipe.recipe
        if job.kv_cache == KVCache.FP8_E4M3:  # llm-compressor calibrates the KV scales in the same pass
            recipe = with_kv_cache_scheme(recipe)
        with job.progress.task(f"{job.recipe.name}: calibrating on {len(dataset)} samples", total=None):
            oneshot(
                model=model,
                tokenizer=tokenizer,
                recipe=yaml.safe_dump(recipe),  # oneshot takes YAML text, not a dict
                dataset=dataset,
                num_calibration_samples=len(dataset),
                max_seq_length=job.recipe.calibration.max_seq_length,
                shuffle_calibration_samples=False,
                moe_calibrate_all_experts=True,
                **extra,
            )
        with job.progress.task(f"{job.recipe.name}: writing compressed checkpoint", total=None):
            model.save_pretrained(job.out_dir, save_compressed=True)
            tokenizer.save_pretrained(job.out_dir)
        del model
