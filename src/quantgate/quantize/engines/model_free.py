"""Data-free targets (FP8 dynamic, RTN schemes), streamed shard by shard.

llm-compressor's ``model_free_ptq`` works on the safetensors files directly, one shard at a
time, without a model definition, so a checkpoint larger than memory builds and no
transformers model class is needed. The recipe's single ``QuantizationModifier`` supplies the
scheme and the ignore list, so the recipe file stays exactly what ``oneshot`` would read.
"""

from __future__ import annotations

from quantgate.config.targets import Recipe
from quantgate.errors import ConfigFileError
from quantgate.intake import SourceRecord
from quantgate.quantize.engines import BuildJob, register
from quantgate.quantize.engines._logs import quiet
from quantgate.quantize.preflight import check_group_sizes


def _scheme_and_ignore(recipe: Recipe) -> tuple[str, list[str]]:
    kind, args = recipe.modifier()
    if kind != "QuantizationModifier" or "scheme" not in args:
        raise ConfigFileError(
            f"recipes/{recipe.name}.yaml",
            f"engine llmcompressor.model_free needs a QuantizationModifier with a preset scheme, got {kind}",
            "use engine llmcompressor.oneshot for calibrated modifiers",
        )
    return args["scheme"], list(args.get("ignore", []))


@register("llmcompressor.model_free")
class ModelFreeEngine:
    """llm-compressor's ``model_free_ptq``: data-free schemes, one shard at a time."""

    def preflight(self, source: SourceRecord, recipe: Recipe) -> None:
        """Refuse a recipe that is not one preset-scheme QuantizationModifier, or whose groups do not fit."""
        _, ignore = _scheme_and_ignore(recipe)
        check_group_sizes(source, recipe, ignore=ignore)

    def build(self, job: BuildJob) -> None:
        """Quantize the source shard by shard into ``job.out_dir``."""
        quiet()
        from llmcompressor import model_free_ptq

        scheme, ignore = _scheme_and_ignore(job.recipe)
        with job.progress.task(f"{job.recipe.name}: quantizing shard by shard", total=None):
            model_free_ptq(
                model_stub=job.source.path,
                save_directory=job.out_dir,
                scheme=scheme,
                ignore=ignore,
                max_workers=1,
                device="cpu",
            )
