"""Suites ready to run: each YAML validated by configuration (``quantgate.config.declare_suites``)
with its kind's runner, found here by the kind's name (``KINDS``) by the evaluation stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantgate.config import content_digest, declare_suite, declare_suites
from quantgate.declarations import ENTRY_POINTS, SuiteSpec
from quantgate.evaluate.suites.kind import SuiteKind
from quantgate.runtime.extensions import PluginRegistry


@dataclass(frozen=True)
class LoadedSuite:
    """One suite YAML, validated by its kind's declaration, with the kind's runner for it."""

    spec: SuiteSpec
    path: Path
    runner: SuiteKind
    spec_hash: str  # sha256 of the validated spec and what it reads: the reference cache key's suite part


KINDS: PluginRegistry[type[SuiteKind]] = PluginRegistry(
    "suite kind",
    ENTRY_POINTS,
    __name__.rpartition(".")[0],
    "register",
    "quantgate.evaluate.suites.kind:SuiteKind",
)


def load_suite(path: Path) -> LoadedSuite:
    """One suite YAML validated by configuration, with its kind's runner from ``KINDS``."""
    return _runnable(declare_suite(path).spec, path)


def load_suites(directory: Path, names: list[str] | None = None) -> list[LoadedSuite]:
    """The named suites (every suite when ``names`` is None), validated, each with its runner."""
    return [_runnable(d.spec, d.path) for d in declare_suites(directory, names)]


def _runnable(spec: SuiteSpec, path: Path) -> LoadedSuite:
    runner = KINDS.get(spec.kind, path)(spec, path)
    return LoadedSuite(spec, path, runner, content_digest([spec, runner.inputs()]))
