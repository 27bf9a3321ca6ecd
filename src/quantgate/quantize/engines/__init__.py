"""Build engines, one module each, found by the ``engine:`` name a recipe declares.

A new engine is one file with a class decorated by ``@register("name")``; nothing central is
edited. An engine instance lives for one ``build_targets`` call, so a calibrated engine can load
the source model and tokenize the calibration set once and reuse both for every target it
builds in that call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from quantgate.registry import Registry

if TYPE_CHECKING:
    from quantgate.calibration import CalibrationSet
    from quantgate.config.targets import Recipe
    from quantgate.intake import SourceRecord
    from quantgate.progress import Progress


@dataclass(frozen=True)
class BuildJob:
    """Everything one build needs; ``out_dir`` is a temporary directory the engine fills."""

    source: SourceRecord
    recipe: Recipe
    calibration: CalibrationSet | None
    out_dir: Path
    progress: Progress


class Engine(Protocol):
    def preflight(self, source: SourceRecord, recipe: Recipe) -> None:
        """Refuse, before any work, a recipe that cannot apply to this model as written."""

    def build(self, job: BuildJob) -> None:
        """Write a complete compressed-tensors checkpoint (with tokenizer) into job.out_dir."""


ENGINES: Registry[type] = Registry(
    "engine",
    # lazy: naming an engine imports its (heavy) library only when that engine is used
    lazy={
        "llmcompressor.model_free": "quantgate.quantize.engines.model_free",
        "llmcompressor.oneshot": "quantgate.quantize.engines.oneshot",
        "modelopt": "quantgate.quantize.engines.modelopt",
        "quantgate.stream_fp8": "quantgate.quantize.engines.stream_fp8",
    },
)
register = ENGINES.register


def engine_class(name: str, where: object = "recipe") -> type:
    return ENGINES.get(name, where)
