"""Build engines, one module each, found by the ``engine:`` name a recipe declares.

A new engine is one module in this package with a class decorated by ``@register("name")``;
nothing central is edited. The registry (``ENGINES``; configuration checks a recipe's engine
against ``quantgate.declarations.ENGINES``, which names the same engines) learns the names by reading the modules'
decorators (``ast``, nothing imported), so a recipe's engine is validated without importing any
engine's heavy library, and an engine's module is imported only when a build uses it.

An engine instance lives for one build call, so a calibrated engine can load the source model
and tokenize the calibration set once and reuse both for every target it builds in that call.
"""

from __future__ import annotations

from pathlib import Path

from quantgate.quantize.engines.base import BuildJob, Engine, register
from quantgate.runtime.extensions import PluginRegistry, declared

__all__ = ["ENGINES", "BuildJob", "Engine", "declared_engines", "engine_class", "register"]


def declared_engines(directory: Path, package: str) -> dict[str, str]:
    """``name -> module`` for every ``@register("name")`` in ``directory``'s modules, read without importing."""
    return declared(directory, package)


ENGINES: PluginRegistry[type] = PluginRegistry(
    "engine", "quantgate.engines", __name__, "register", "quantgate.quantize.engines.base:Engine"
)


def engine_class(name: str, where: object = "recipe") -> type:
    """The engine class registered as ``name``, importing its module on first use."""
    return ENGINES.get(name, where)
