"""Build engines, one module each, found by the ``engine:`` name a recipe declares.

A new engine is one file with a class decorated by ``@register("name")``; nothing central is
edited. An engine instance lives for one ``build_targets`` call, so a calibrated engine can load
the source model and tokenize the calibration set once and reuse both for every target it
builds in that call.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from quantgate.config.loader import nearest
from quantgate.errors import ConfigFileError

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


_ENGINES: dict[str, type] = {}
# lazy "module" entries: importing an engine imports its (heavy) library only when used
_MODULES = {
    "llmcompressor.model_free": "quantgate.build.engines.model_free",
    "llmcompressor.oneshot": "quantgate.build.engines.oneshot",
    "modelopt": "quantgate.build.engines.modelopt",
}


def register(name: str):
    def decorate(cls: type) -> type:
        if name in _ENGINES and _ENGINES[name] is not cls:
            raise ValueError(f"engine {name!r} registered twice ({_ENGINES[name].__name__}, {cls.__name__})")
        _ENGINES[name] = cls
        return cls

    return decorate


def engine_class(name: str) -> type:
    if name not in _ENGINES and name in _MODULES:
        importlib.import_module(_MODULES[name])
    if name not in _ENGINES:
        hint = nearest(name, list(_MODULES))
        raise ConfigFileError("recipe", f"unknown engine '{name}'", f"did you mean '{hint}'?" if hint else "")
    return _ENGINES[name]
