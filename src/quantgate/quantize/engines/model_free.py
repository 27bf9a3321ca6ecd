"""Data-free targets (FP8 dynamic, RTN schemes), streamed shard by shard.

llm-compressor's ``model_free_ptq`` works on the safetensors files directly, one shard at a
time, without a model definition, so a checkpoint larger than memory builds and no
transformers model class is needed. The recipe's single ``QuantizationModifier`` supplies the
scheme and the ignore list, so the recipe file stays exactly what ``oneshot`` would read.

``model_free_ptq`` converts every ``*.safetensors`` file under the directory it is given, so it
is given a view of the source: links to the files intake recorded, with the model's weight
files (``SourceRecord.weight_files``) and no other weight file. What it converts is then what
intake checked.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from quantgate.config import Recipe
from quantgate.intake import SourceRecord
from quantgate.quantize.engines._logs import quiet
from quantgate.quantize.engines.base import BuildJob, register
from quantgate.quantize.preflight import check_group_sizes
from quantgate.runtime.errors import ConfigFileError


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
        with (
            job.progress.task(f"{job.recipe.name}: quantizing shard by shard", total=None),
            source_view(job.source) as view,
        ):
            model_free_ptq(
                model_stub=str(view),
                save_directory=job.out_dir,
                scheme=scheme,
                ignore=ignore,
                max_workers=1,
                device="cpu",
            )


@contextmanager
def source_view(source: SourceRecord) -> Iterator[Path]:
    """A temporary directory of symlinks to the source's recorded files, weight files limited to
    ``source.weight_files`` (a weight file intake did not scan is left out, wherever it lies)."""
    root = Path(source.path)
    weights = set(source.weight_files)
    with tempfile.TemporaryDirectory(prefix="quantgate-source-") as tmp:
        view = Path(tmp)
        for rel in source.files:
            if rel.endswith(".safetensors") and rel not in weights:
                continue
            (view / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(root / rel, view / rel)
        yield view
